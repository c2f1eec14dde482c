"""Where query meta lives in etcd: key layout, key builders and derived channel names.

The names are Milvus 2.0's (``meta.go``) so that anyone who knows Milvus can
read a dump of our etcd. Every key is relative to the ``MetaKV`` root path.
Per-collection prefixes end with ``/`` so that a range delete of collection 1
can never touch collection 12.
"""

from __future__ import annotations

COLLECTION_PREFIX = "queryCoord-collectionMeta/"
SEGMENT_PREFIX = "queryCoord-segmentMeta/"
DM_CHANNEL_PREFIX = "queryCoord-dmChannelWatchInfo/"
DELTA_CHANNEL_PREFIX = "queryCoord-deltaChannel/"

#: The four prefixes ``QueryMeta.reload`` reads, in the order it reads them.
ALL_PREFIXES = (COLLECTION_PREFIX, SEGMENT_PREFIX, DM_CHANNEL_PREFIX, DELTA_CHANNEL_PREFIX)


def collection_key(collection_id: int) -> str:
    return f"{COLLECTION_PREFIX}{collection_id}"


def segment_key(collection_id: int, partition_id: int, segment_id: int) -> str:
    return f"{SEGMENT_PREFIX}{collection_id}/{partition_id}/{segment_id}"


def segment_collection_prefix(collection_id: int) -> str:
    return f"{SEGMENT_PREFIX}{collection_id}/"


def segment_partition_prefix(collection_id: int, partition_id: int) -> str:
    return f"{SEGMENT_PREFIX}{collection_id}/{partition_id}/"


def dm_channel_key(collection_id: int, channel: str) -> str:
    return f"{DM_CHANNEL_PREFIX}{collection_id}/{channel}"


def dm_channel_prefix(collection_id: int) -> str:
    return f"{DM_CHANNEL_PREFIX}{collection_id}/"


def delta_channel_key(collection_id: int, channel: str) -> str:
    return f"{DELTA_CHANNEL_PREFIX}{collection_id}/{channel}"


def delta_channel_prefix(collection_id: int) -> str:
    return f"{DELTA_CHANNEL_PREFIX}{collection_id}/"


def query_channels(collection_id: int) -> tuple[str, str]:
    """The query channel and the query result channel of a collection: derived from its id, so nothing is stored."""
    return f"query-{collection_id}", f"query-result-{collection_id}"
