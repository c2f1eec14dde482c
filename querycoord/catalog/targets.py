"""The catalog's segments and channels as checker targets, kept in memory by one watch (a local catalog).

Why: every checker pass needs, for each loaded collection, the ids of its
sealed segments and its DM channels. Reading them from the catalog on every
pass re-read and re-parsed every SegmentBinlogs (binlog paths included:
about 150 MB at a million segments) every few seconds, and made the first
pass after a takeover as slow as a full catalog read. The catalog changes
rarely (handoff, compaction, drops), so the coordinator reads it once, then
follows one watch over ``catalog/collections/`` through ``catalog/segments/``
and keeps only what a target needs: segment id, partition, compaction
sources, and each collection's partitions and DM channels.

A pass first ``catch_up``s (one revision read and a watch progress request:
milliseconds), so it sees the catalog as of the moment it starts, as a read
would. A remote catalog (``--catalog-address``) has no such copy; the
checker reads it through the broker as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from types import MappingProxyType

from google.protobuf.message import DecodeError
from loguru import logger

from meta.follow import RangeFollower
from meta.kv import MetaKV
from meta.watch import EventType, WatchBatch
from proto import catalog_pb2, data_pb2
from querycoord.catalog.store import COLLECTIONS_PREFIX, SEGMENTS_PREFIX
from querycoord.common import memory
from querycoord.common.target import Target, TargetSegment
from querycoord.common.yielding import every_few


class CatalogTargets(RangeFollower):
    """Segments by collection and partition, and each collection's partitions and channels (see module doc)."""

    name = "the catalog (checker targets)"

    def __init__(self, kv: MetaKV):
        super().__init__(kv, COLLECTIONS_PREFIX, SEGMENTS_PREFIX)
        self._segments: dict[int, dict[int, dict[int, TargetSegment]]] = {}
        self._collections: dict[int, tuple[frozenset[int], tuple[str, ...]]] = {}
        self._unreadable: set[str] = set()
        # Bumped by every change to a collection's part of the copy (``generation``: by every full read): readers
        # that derive something costly from a target (``querycoord.served``) recompute only when it moved.
        self._changes: dict[int, int] = {}
        self._generation = 0

    def change_mark(self, collection_id: int) -> tuple[int, int]:
        return self._generation, self._changes.get(collection_id, 0)

    def partition_segment_ids(self, collection_id: int, partition_id: int) -> Set[int] | None:
        """Ids of the partition's sealed segments, read-only and not copied; None when the copy lacks the
        collection or the partition (not known to the catalog, or the copy is not read yet)."""
        known = self._collections.get(collection_id)
        if known is None or partition_id not in known[0]:
            return None
        return self._segments.get(collection_id, {}).get(partition_id, {}).keys()

    def partition_segments(self, collection_id: int, partition_id: int) -> Mapping[int, TargetSegment] | None:
        """The partition's sealed segments by id, read-only and not copied; None as ``partition_segment_ids``."""
        known = self._collections.get(collection_id)
        if known is None or partition_id not in known[0]:
            return None
        return MappingProxyType(self._segments.get(collection_id, {}).get(partition_id, {}))

    def dm_channels(self, collection_id: int) -> tuple[str, ...] | None:
        known = self._collections.get(collection_id)
        return None if known is None else known[1]

    def target(self, collection_id: int, partition_ids: list[int]) -> Target | None:
        """The collection's target over ``partition_ids``; None when the catalog lacks it or one of them.

        The dict is the caller's own (copied): a checker pass may yield while the watch changes the copy.
        """
        known = self._collections.get(collection_id)
        if known is None or not known[0].issuperset(partition_ids):
            return None
        parts = self._segments.get(collection_id, {})
        segments: dict[int, TargetSegment] = {}
        by_partition: dict[int, dict[int, TargetSegment]] = {}
        for pid in partition_ids:
            part = by_partition[pid] = dict(parts.get(pid, {}))
            segments.update(part)
        return Target(segments=segments, channels=set(known[1]), partitions=by_partition)

    def drop(self) -> None:
        self._segments = {}
        self._collections = {}
        self._unreadable = set()
        self._generation += 1

    async def replace(self, items: Iterable[tuple[str, bytes]], revision: int) -> None:
        # Built aside and swapped in at once: a checker pass reading targets during the turns below must see the
        # old copy whole, never half of the new one (it would release what the missing half holds).
        fresh_segments: dict[int, dict[int, dict[int, TargetSegment]]] = {}
        fresh_collections: dict[int, tuple[frozenset[int], tuple[str, ...]]] = {}
        async for key, value in every_few(items):
            self._put(key, value, fresh_segments, fresh_collections)
        self._segments, self._collections, self._unreadable = fresh_segments, fresh_collections, set()
        self._generation += 1
        logger.info("checker targets: catalog copied at revision {} ({} collections, {} segments)", revision,
                    len(self._collections), sum(len(s) for p in self._segments.values() for s in p.values()))

    def after_read(self, keys: int) -> None:
        if keys >= memory.LARGE_TASK_SEGMENTS:
            memory.trim()  # the raw read is freed: hand its pages back (a million records: hundreds of MB)

    def apply(self, batch: WatchBatch) -> None:
        for ev in batch.events:
            if ev.type is EventType.PUT:
                self._put(ev.key, ev.value)
            else:
                self._delete(ev.key)

    def _put(self, key: str, value: bytes,
             segments: dict[int, dict[int, dict[int, TargetSegment]]] | None = None,
             collections: dict[int, tuple[frozenset[int], tuple[str, ...]]] | None = None) -> None:
        segments = self._segments if segments is None else segments
        collections = self._collections if collections is None else collections
        try:
            if key.startswith(SEGMENTS_PREFIX):
                ids = _segment_ids(key)
                if ids is None:
                    return
                b = data_pb2.SegmentBinlogs()
                b.ParseFromString(value)
                cid, pid, sid = ids
                self._changes[cid] = self._changes.get(cid, 0) + 1
                segments.setdefault(cid, {}).setdefault(pid, {})[sid] = TargetSegment(
                    sid, pid, tuple(b.compaction_from), _shared_size(b.mem_size))
            elif key.startswith(COLLECTIONS_PREFIX):
                rest = key[len(COLLECTIONS_PREFIX):]
                if not rest.isdigit():
                    return
                desc = catalog_pb2.CollectionDescription()
                desc.ParseFromString(value)
                self._changes[int(rest)] = self._changes.get(int(rest), 0) + 1
                collections[int(rest)] = (frozenset(p.partition_id for p in desc.partitions),
                                                tuple(desc.dm_channels))
        except DecodeError as exc:
            if key not in self._unreadable:
                self._unreadable.add(key)
                logger.error("checker targets: catalog record {} is unreadable ({}); it is left out", key, exc)
            self._delete(key)

    def _delete(self, key: str) -> None:
        if key.startswith(SEGMENTS_PREFIX):
            ids = _segment_ids(key)
            if ids is None:
                return
            cid, pid, sid = ids
            self._changes[cid] = self._changes.get(cid, 0) + 1
            parts = self._segments.get(cid)
            if parts is None or pid not in parts:
                return
            parts[pid].pop(sid, None)
            if not parts[pid]:
                del parts[pid]
                if not parts:
                    del self._segments[cid]
        elif key.startswith(COLLECTIONS_PREFIX):
            rest = key[len(COLLECTIONS_PREFIX):]
            if rest.isdigit():
                self._changes[int(rest)] = self._changes.get(int(rest), 0) + 1
                self._collections.pop(int(rest), None)


# Segment sizes seen, each held once: a million targets share a few thousand size objects, not a million ints.
_SIZES: dict[int, int] = {}


def _shared_size(size: int) -> int:
    if len(_SIZES) >= 1 << 16:
        return size
    return _SIZES.setdefault(size, size)


def _segment_ids(key: str) -> tuple[int, int, int] | None:
    """(collection, partition, segment) of a catalog segment key; None for anything else."""
    parts = key[len(SEGMENTS_PREFIX):].split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    cid, pid, sid = (int(p) for p in parts)
    return cid, pid, sid
