"""The catalog's refusals: each is also the ``querycoord.common.errors`` class of the code its caller sees.

Kept apart from ``store`` so that the store's helpers (``segment_ids``) raise the same classes without
importing the store.
"""

from __future__ import annotations

from querycoord.common import errors
from querycoord.common.errors import CoordError, status_for

# How the catalog is named in reasons of errors without context of their own (etcd failures, bugs).
STATUS_SOURCE = "the catalog"


class CatalogError(CoordError):
    """A refused catalog request; ``code`` is the common.ErrorCode a caller sees, ``reason`` says what was wrong."""


# Each refusal is also the ``querycoord.common.errors`` class of its code (ILLEGAL_ARGUMENT, NOT_FOUND, CONFLICT).
class InvalidArgument(CatalogError, errors.IllegalArgument):
    """The request itself is malformed (bad name, negative size, unknown channel, ...)."""


class NotFound(CatalogError, errors.NotFound):
    """A collection, partition or segment named by the request is not in the catalog."""


class CollectionNotFound(NotFound):
    pass


class PartitionNotFound(NotFound):
    pass


class Conflict(CatalogError, errors.Conflict):
    """The request conflicts with the catalog's current state (name taken, source already compacted, ...)."""


class CollectionExists(Conflict):
    pass


class AddSegmentsIncomplete(CatalogError):
    """A multi-txn ``add_segments`` failed after some of its txns were written.

    Each txn is atomic (and holds whole compaction groups), so the catalog is
    consistent, but only ``written_ids`` were added. ``code`` is the cause's.
    """

    def __init__(self, cause: BaseException, written_ids: list[int], total: int):
        status = status_of(cause)
        shown = ", ".join(map(str, written_ids[:20])) + (" ..." if len(written_ids) > 20 else "")
        super().__init__(
            f"only {len(written_ids)} of {total} segments were added (ids {shown}) before a txn failed: "
            f"{status.reason}. The added segments stay; re-send only the others.",
            code=status.error_code,
        )
        self.cause = cause
        self.written_ids = written_ids


# The Status a caller should see for an exception (``querycoord.common.errors.status_of``, naming the catalog).
status_of = status_for(STATUS_SOURCE)


class SegmentIdTaken(CatalogError, errors.AlreadyExists):
    """A segment id of the request is held already in its collection (another partition, or other binlogs in
    the same one): ``catalog.segment_ids``."""


__all__ = [
    "STATUS_SOURCE",
    "AddSegmentsIncomplete",
    "CatalogError",
    "CollectionExists",
    "CollectionNotFound",
    "Conflict",
    "InvalidArgument",
    "NotFound",
    "PartitionNotFound",
    "SegmentIdTaken",
    "status_of",
]
