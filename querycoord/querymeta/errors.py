"""Errors of the query meta: each says what was wrong and what to do.

They are refusals of a request against the current load state, raised before
anything is sent to etcd (so nothing was written). etcd-side failures keep
their ``meta.errors`` classes (``NotLeader``, ``MetaUnavailable``,
``RequestTooLarge``) so callers handle them in one place.

Each carries the ``common.ErrorCode`` its caller sees (``CoordError``): a
refusal raised deep inside a trigger still reaches the client as a
NOT_FOUND or CONFLICT it can act on, not as an internal error.
"""

from __future__ import annotations

from proto import common_pb2, data_pb2
from querycoord.common.errors import CoordError


class QueryMetaError(CoordError):
    """Base class of the query meta's own refusals; nothing was written."""

    code = common_pb2.CONFLICT


class CollectionNotLoaded(QueryMetaError):
    """The collection has no load record (Milvus: "collection %d has not been loaded")."""

    code = common_pb2.NOT_FOUND

    def __init__(self, collection_id: int):
        self.collection_id = collection_id
        super().__init__(f"collection {collection_id} has not been loaded; load it first")


class PartitionNotLoaded(QueryMetaError):
    """The collection is loaded but this partition is not (never loaded, or released)."""

    code = common_pb2.NOT_FOUND

    def __init__(self, collection_id: int, partition_id: int):
        self.collection_id, self.partition_id = collection_id, partition_id
        super().__init__(
            f"partition {partition_id} of collection {collection_id} has not been loaded; load the partition first"
        )


class LoadTypeConflict(QueryMetaError):
    """A collection loaded as a whole cannot be loaded by partitions, and vice versa."""

    def __init__(self, collection_id: int, loaded_as: int, requested: int):
        self.collection_id, self.loaded_as, self.requested = collection_id, loaded_as, requested
        super().__init__(
            f"collection {collection_id} is loaded as {data_pb2.LoadType.Name(loaded_as)} and cannot be "
            f"loaded as {data_pb2.LoadType.Name(requested)}; release it first"
        )


class CorruptRecord(QueryMetaError):
    """A persisted record cannot be parsed or does not match its key (raised by ``reload(strict=True)``).

    ``reason`` is the record's fault alone (listed in ``corrupt_keys``); ``str()`` adds what to do.
    """

    code = common_pb2.UNEXPECTED_ERROR

    def __init__(self, key: str, reason: str):
        super().__init__(
            f"corrupt query meta record {key!r}: {reason}; inspect it with etcdctl, then delete it "
            f"(QueryMeta.purge_corrupt) or restore it"
        )
        self.key, self.reason = key, reason
