"""Where the catalog lives in etcd: its prefixes and the key of each record (layout in ``catalog.store``).

Segment ids are zero-padded in keys so that etcd's key order is id order: paging by segment id is then one
range read.
"""

from __future__ import annotations

from dataclasses import dataclass

CATALOG_PREFIX = "catalog/"
COLLECTIONS_PREFIX = "catalog/collections/"
NAMES_PREFIX = "catalog/collection-names/"
SEGMENTS_PREFIX = "catalog/segments/"
ID_KEY = "catalog/idalloc/id"


def collection_key(collection_id: int) -> str:
    return f"{COLLECTIONS_PREFIX}{collection_id}"


def name_key(name: str) -> str:
    return f"{NAMES_PREFIX}{name}"


def segment_prefix(collection_id: int, partition_id: int | None = None) -> str:
    """Prefix of a collection's segments, or of one partition's."""
    if partition_id is None:
        return f"{SEGMENTS_PREFIX}{collection_id}/"
    return f"{SEGMENTS_PREFIX}{collection_id}/{partition_id}/"


def segment_key(collection_id: int, partition_id: int, segment_id: int) -> str:
    return f"{SEGMENTS_PREFIX}{collection_id}/{partition_id}/{segment_id:019d}"


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Where a segment lives; all a removal event can tell (the value is gone)."""

    collection_id: int
    partition_id: int
    segment_id: int


def parse_segment_key(key: str) -> SegmentRef:
    """Inverse of ``segment_key`` (``key`` relative to the root path)."""
    cid, pid, sid = key[len(SEGMENTS_PREFIX) :].split("/")
    return SegmentRef(int(cid), int(pid), int(sid))
