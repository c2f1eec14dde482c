"""Adding sealed segments to the catalog: checked against the catalog, then written in as few txns as etcd allows.

A segment is only added to a collection that still exists, its id is free in its collection (``segment_ids``),
and the compaction sources it replaces are deleted in the same txn, guarded by compares that they still exist
(see ``catalog.store`` for the whole set of rules). Segments sharing a compaction source form one unit that is
never split across txns; txns go out several at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from meta.kv import Batch
from meta.txn import Compare, Op, Put, Unit, created_at, delete, put
from proto import catalog_pb2, data_pb2
from querycoord.catalog import segment_ids
from querycoord.catalog.access import CatalogAccess
from querycoord.catalog.checks import short_list
from querycoord.catalog.errors import (
    AddSegmentsIncomplete,
    CollectionNotFound,
    Conflict,
    InvalidArgument,
    NotFound,
    PartitionNotFound,
    SegmentIdTaken,
)
from querycoord.catalog.keys import collection_key, parse_segment_key, segment_key, segment_prefix


@dataclass(slots=True)
class _Unit:
    """Segments that must be written in one txn: they share compaction sources (usually just one segment)."""

    segments: list[data_pb2.SegmentBinlogs] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)  # source key -> create revision read at validation


def _segment_ids(batch: Batch) -> list[int]:
    """Ids of the segments one txn of ``add_segments`` adds."""
    return [seg.segment_id for unit in batch.payloads for seg in unit.segments]


def _segment_puts(batch: Batch) -> dict[str, bytes]:
    """Key -> value of every segment one txn of ``add_segments`` writes."""
    return {op.key: op.value for op in batch.ops if isinstance(op, Put)}


def _collections(batch: Batch) -> list[int]:
    """Collections whose segments one txn of ``add_segments`` adds."""
    return sorted({seg.collection_id for unit in batch.payloads for seg in unit.segments})


class SegmentWriter:
    """``add_segments`` of one ``CatalogStore``: its reads and txns go through the store's own access methods."""

    def __init__(self, access: CatalogAccess):
        self._access = access
        self._indexed: set[tuple[int, int]] = set()  # (collection, create revision) whose id index is complete

    async def add_segments(self, segments: Sequence[data_pb2.SegmentBinlogs], collection_id: int = 0) -> list[int]:
        """Add sealed segments; returns their ids in request order.

        ``segment_id`` 0 is allocated; ``collection_id`` 0 takes the argument;
        ``insert_channel`` empty is assigned round-robin (by segment id) over
        the collection's DM channels. ``compaction_from`` names segments of the
        same partition that the new one replaces: they are removed in the txn
        that adds it. Everything is validated before anything is written; the
        segments are then written in as few txns as etcd's limits allow (many
        segments per txn, a compaction group never split), several at once.
        A txn failing after others were written raises ``AddSegmentsIncomplete``.

        A segment id is unique within its collection, across partitions (``segment_ids``): an explicit id
        held already raises ``SegmentIdTaken`` (ALREADY_EXISTS, naming the partition that holds it) before
        anything is written; one held with exactly the binlogs sent (a re-sent request) is left as it is.
        Two concurrent requests adding one id: one wins, the other is refused the same way.
        """
        if not segments:
            raise InvalidArgument("no segments to add")
        segs = [data_pb2.SegmentBinlogs() for _ in segments]
        for seg, given in zip(segs, segments, strict=True):
            seg.CopyFrom(given)
        colls = await self._validate_segments(segs, collection_id)
        for cid, (_, rev) in colls.items():
            await self._ensure_index(cid, rev)
        requested = segs  # the ids are returned in this order (those to allocate are set on these very messages)
        explicit = {s.segment_id for s in segs if s.segment_id}
        missing = len(segs) - len(explicit)
        new_ids = iter(await self._access.allocate_ids(missing) if missing else ())
        for seg in segs:
            if seg.segment_id == 0:
                seg.segment_id = next(new_ids)
            if not seg.insert_channel:
                channels = colls[seg.collection_id][0].dm_channels
                seg.insert_channel = channels[seg.segment_id % len(channels)]

        segs = await self._without_resent(segs, explicit)  # after the channels are assigned: compared as stored
        if not segs:
            return [s.segment_id for s in requested]  # every segment is stored already, exactly as sent
        sources = await self._read_sources(segs)
        units = self._units(segs, sources)
        coll_revs = {cid: rev for cid, (_, rev) in colls.items()}
        chunks = self._access.kv.pack([self._txn_unit(u, coll_revs) for u in units])
        await self._write_chunks(chunks, len(segs), coll_revs)
        return [s.segment_id for s in requested]

    async def _ensure_index(self, collection_id: int, revision: int) -> None:
        """``segment_ids.ensure_index`` once per collection and process (a marker never goes while its
        collection stays: a drop removes both, and ids are never reused)."""
        if (collection_id, revision) in self._indexed:
            return
        await segment_ids.ensure_index(self._access.kv, collection_id, collection_key=collection_key(collection_id),
                                       collection_revision=revision, segment_prefix=segment_prefix(collection_id))
        if len(self._indexed) >= 1 << 16:
            self._indexed.clear()
        self._indexed.add((collection_id, revision))

    async def _without_resent(self, segs: list[data_pb2.SegmentBinlogs],
                              explicit_ids: set[int]) -> list[data_pb2.SegmentBinlogs]:
        """``segs`` less those stored already exactly as sent; ``SegmentIdTaken`` if an id the request names
        (``explicit_ids``) is held otherwise (another partition, or other binlogs). Read before anything is
        written, so a clash refuses the whole request, however many txns it would take. Allocated ids are
        fresh and not read: the txn's compares still guard them."""
        explicit = [s for s in segs if s.segment_id in explicit_ids]
        if not explicit:
            return segs
        held: dict[tuple[int, int], int] = {}
        for cid in sorted({s.collection_id for s in explicit}):
            ids = [s.segment_id for s in explicit if s.collection_id == cid]
            found = await segment_ids.held(self._access.kv, cid, ids, read_keys=self._access.read_many)
            held.update(((cid, sid), pid) for sid, pid in found.items())
        if not held:
            return segs
        mine = [s for s in explicit if held.get((s.collection_id, s.segment_id)) == s.partition_id]
        stored = await self._access.read_many(
            [segment_key(s.collection_id, s.partition_id, s.segment_id) for s in mine])
        resent = {(s.collection_id, s.segment_id) for s in mine
                  if stored.get(segment_key(s.collection_id, s.partition_id, s.segment_id), (b"", 0))[0]
                  == s.SerializeToString()}
        clashes: dict[int, list[tuple[int, int, int]]] = {}
        for s in explicit:
            where = held.get((s.collection_id, s.segment_id))
            if where is not None and (s.collection_id, s.segment_id) not in resent:
                clashes.setdefault(s.collection_id, []).append((s.segment_id, s.partition_id, where))
        if clashes:
            raise SegmentIdTaken("; ".join(segment_ids.taken_reason(cid, items) for cid, items in
                                           sorted(clashes.items())) + "; nothing of this request was written")
        return [s for s in segs if (s.collection_id, s.segment_id) not in resent]

    async def _validate_segments(
        self, segs: list[data_pb2.SegmentBinlogs], collection_id: int
    ) -> dict[int, tuple[catalog_pb2.CollectionDescription, int]]:
        """Check every segment against the request and the catalog; returns the collections involved."""
        _fill_collection_ids(segs, collection_id)
        colls: dict[int, tuple[catalog_pb2.CollectionDescription, int]] = {}
        for cid in sorted({s.collection_id for s in segs}):
            colls[cid] = await self._access.collection_and_revision(cid)
        # Once per collection, not per segment: segments x partitions was quadratic in the request.
        partitions = {cid: {p.partition_id for p in desc.partitions} for cid, (desc, _) in colls.items()}
        channels = {cid: set(desc.dm_channels) for cid, (desc, _) in colls.items()}

        seen: set[int] = set()
        for i, seg in enumerate(segs):
            _check_segment(i, seg, colls[seg.collection_id][0], partitions[seg.collection_id],
                           channels[seg.collection_id], seen)
        _check_sources_not_added_here(segs)
        return colls

    async def _read_sources(self, segs: list[data_pb2.SegmentBinlogs]) -> dict[str, int]:
        """Create revisions of every compaction source, which must be in the new segment's partition."""
        keys = sorted({segment_key(s.collection_id, s.partition_id, src) for s in segs for src in s.compaction_from})
        if not keys:
            return {}
        found = await self._access.read_many(keys)
        for seg in segs:
            missing = [
                src for src in seg.compaction_from if segment_key(seg.collection_id, seg.partition_id, src) not in found
            ]
            if missing:
                raise NotFound(
                    f"segment {seg.segment_id}: compaction sources {short_list(missing)} are not in partition "
                    f"{seg.partition_id} of collection {seg.collection_id} (already compacted away, dropped, never "
                    f"added, or in another partition: compaction stays within a partition)"
                )
        return {k: rev for k, (_, rev) in found.items()}

    @staticmethod
    def _units(segs: list[data_pb2.SegmentBinlogs], sources: dict[str, int]) -> list[_Unit]:
        """Group segments sharing a compaction source (union-find): each group must land in one txn."""
        parent = list(range(len(segs)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[str, int] = {}
        for i, seg in enumerate(segs):
            for src in seg.compaction_from:
                key = segment_key(seg.collection_id, seg.partition_id, src)
                if key in owner:
                    parent[find(i)] = find(owner[key])
                else:
                    owner[key] = i
        groups: dict[int, _Unit] = {}
        for i, seg in enumerate(segs):
            unit = groups.setdefault(find(i), _Unit())
            unit.segments.append(seg)
            for src in seg.compaction_from:
                key = segment_key(seg.collection_id, seg.partition_id, src)
                unit.sources[key] = sources[key]
        return list(groups.values())

    @staticmethod
    def _txn_unit(unit: _Unit, coll_revs: dict[int, int]) -> Unit:
        """The ops and compares of one group: its segments' puts and its sources' deletes (each with its id's
        index key), guarded by the sources still being the ones read, every id being free in its collection
        (its index key absent) and (once per txn) its collections existing."""
        ops: list[Op] = []
        compares: list[Compare] = []
        for seg in unit.segments:
            ops.append(put(segment_key(seg.collection_id, seg.partition_id, seg.segment_id), seg.SerializeToString()))
            index_put, free = segment_ids.add_ops(seg.collection_id, seg.partition_id, seg.segment_id)
            ops.append(index_put)
            compares.append(free)
        for key, rev in unit.sources.items():
            src = parse_segment_key(key)
            ops += [delete(key), segment_ids.remove_op(src.collection_id, src.segment_id)]
            compares.append(created_at(key, rev))
        cids = sorted({s.collection_id for s in unit.segments})
        shared = [created_at(collection_key(cid), coll_revs[cid]) for cid in cids]
        return Unit(ops, compares, shared, payload=unit)

    async def _write_chunks(self, chunks: list[Batch], total: int, coll_revs: dict[int, int]) -> None:
        """The txns of one ``add_segments``, several at once (independent: each holds whole groups)."""
        sem = asyncio.Semaphore(self._access.write_concurrency)

        async def write(chunk: Batch) -> None:
            async with sem:
                operation = f"add {len(_segment_ids(chunk))} segments"
                if not await self._access.guarded_txn(operation, chunk.compares, chunk.ops):
                    await self._explain_failed_chunk(chunk, coll_revs)

        results = await asyncio.gather(*(write(c) for c in chunks), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return
        written = [
            sid
            for c, r in zip(chunks, results, strict=True)
            if not isinstance(r, BaseException)
            for sid in _segment_ids(c)
        ]
        if not written:
            raise failures[0]
        raise AddSegmentsIncomplete(failures[0], written, total) from failures[0]

    async def _explain_failed_chunk(self, chunk: Batch, coll_revs: dict[int, int]) -> None:
        """A chunk's compares failed: return if it was our own retried txn, else raise why."""
        puts = _segment_puts(chunk)
        current = await self._access.read_many(list(puts))
        if len(current) == len(puts) and all(current[k][0] == v for k, v in puts.items()):
            return  # applied by an earlier attempt whose answer was lost
        for cid in _collections(chunk):
            kvx = await self._access.kv.get_kv(collection_key(cid))
            if kvx is None or kvx.create_revision != coll_revs[cid]:
                raise CollectionNotFound(f"collection {cid} was dropped while its segments were being added")
        clashes: dict[int, list[tuple[int, int, int]]] = {}
        same: list[int] = []  # added meanwhile by another request, exactly as this one sends them
        for seg in (seg for unit in chunk.payloads for seg in unit.segments):
            held = current.get(segment_ids.index_key(seg.collection_id, seg.segment_id))
            if held is None:
                continue
            where = segment_ids.holder(held[0])
            skey = segment_key(seg.collection_id, seg.partition_id, seg.segment_id)
            if where == seg.partition_id and skey in current and current[skey][0] == puts[skey]:
                same.append(seg.segment_id)
            else:
                clashes.setdefault(seg.collection_id, []).append((seg.segment_id, seg.partition_id, where))
        if clashes:
            raise SegmentIdTaken("; ".join(segment_ids.taken_reason(cid, items) for cid, items in
                                           sorted(clashes.items())) + "; nothing of this txn was written")
        if same:
            raise Conflict(f"segments {short_list(sorted(same))} were added meanwhile by another request, with the "
                           f"same binlogs; nothing of this txn was written: re-send the request (what is stored "
                           f"stays)")
        raise Conflict(
            "compaction sources of this request were removed concurrently (another compaction replaced them); "
            "nothing of this txn was written"
        )


def _fill_collection_ids(segs: list[data_pb2.SegmentBinlogs], collection_id: int) -> None:
    """Give each segment without a collection the request's; a segment of another collection is refused."""
    if collection_id < 0:
        raise InvalidArgument(f"collection_id must be >= 0, got {collection_id}")
    for i, seg in enumerate(segs):
        if seg.collection_id == 0:
            if not collection_id:
                raise InvalidArgument(f"segment #{i}: collection_id is 0 and the request names no collection")
            seg.collection_id = collection_id
        elif collection_id and seg.collection_id != collection_id:
            raise InvalidArgument(
                f"segment #{i} belongs to collection {seg.collection_id}, but the request is for collection "
                f"{collection_id}"
            )


def _check_segment(i: int, seg: data_pb2.SegmentBinlogs, desc: catalog_pb2.CollectionDescription,
                   partitions: set[int], channels: set[str], seen: set[int]) -> None:
    """Check segment #``i`` of a request against its collection ``desc`` (its ``partitions`` and DM ``channels``);
    ``seen``: the segment ids of the request so far (this one's is added)."""
    what = f"segment #{i}" + (f" (id {seg.segment_id})" if seg.segment_id else "")
    if seg.segment_id < 0:
        raise InvalidArgument(f"{what}: segment_id must be >= 0 (0 = allocate), got {seg.segment_id}")
    if seg.segment_id:
        if seg.segment_id in seen:
            raise InvalidArgument(f"{what}: segment id {seg.segment_id} appears twice in the request")
        seen.add(seg.segment_id)
    if seg.partition_id not in partitions:
        raise PartitionNotFound(
            f"{what}: partition {seg.partition_id} does not exist in collection {desc.collection_id} "
            f"(its partitions: {short_list(p.partition_id for p in desc.partitions)})"
        )
    if seg.num_rows < 0 or seg.mem_size < 0:
        raise InvalidArgument(
            f"{what}: num_rows and mem_size must be >= 0, got {seg.num_rows} and {seg.mem_size}"
        )
    if seg.insert_channel and seg.insert_channel not in channels:
        raise InvalidArgument(
            f"{what}: insert channel {seg.insert_channel!r} is not a DM channel of collection "
            f"{desc.collection_id} ({', '.join(desc.dm_channels)}); leave it empty to have one assigned"
        )
    if any(not p for p in seg.binlog_paths):
        raise InvalidArgument(f"{what}: a binlog path is empty")
    srcs = list(seg.compaction_from)
    if len(set(srcs)) != len(srcs) or any(s <= 0 for s in srcs):
        raise InvalidArgument(f"{what}: compaction_from must list distinct positive ids, got {srcs}")
    if seg.segment_id and seg.segment_id in srcs:
        raise InvalidArgument(f"{what}: a segment cannot replace itself")


def _check_sources_not_added_here(segs: list[data_pb2.SegmentBinlogs]) -> None:
    """No segment's compaction source is added by the same request (sources first, then what replaces them)."""
    new_ids = {s.segment_id for s in segs if s.segment_id}
    for i, seg in enumerate(segs):
        both = new_ids.intersection(seg.compaction_from)
        if both:
            raise InvalidArgument(
                f"segment #{i}: compaction sources {short_list(sorted(both))} are added by this same request; "
                f"add sources first, then what replaces them"
            )
