"""Segment distribution: one ``SegmentInfo`` per loaded segment, listing every copy (replica, node) of it.

Records are facts about which node holds what, saved by many writers at once (a load's children, handoff,
balance), so saves of distinct segments run side by side (shared collection lock, segment ids claimed: rule 2 of
``core``) and may take several txns (rule 5). They are stored stripped (rule 6: ``records.stored_segment``). The
saves of segments with no record yet, every segment of every load, take paths of their own that serialize each
record once (``_put_new_segments``, ``_put_loaded``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from operator import attrgetter
from types import MappingProxyType
from typing import NamedTuple

from meta.txn import MAX_TXN_OPS, Put
from querycoord.common.messages import LoadItem
from querycoord.common.yielding import TURN_EVERY

from . import keys
from .batch import Mutation
from .copies import copies, view_of, with_copy, without_node
from .core import MetaCore, check_id, unique_ids
from .index import PLACES_ON_NODE, NewSegment
from .records import SEALED, SegmentInfo, loaded_record, stored_segment
from .replicas import replica_of_node, sole_replica, with_replica


def _checked_segment_ids(segs: Sequence[SegmentInfo | LoadItem]) -> set[int]:
    """The segment ids of a save, each checked with its collection and partition ids, and none twice.

    Protobuf ids are ints, so a save of valid records (every load) needs three ``min``s and a set; only a bad
    one takes the loop that finds the first offender and names it.
    """
    sids = [s.segment_id for s in segs]
    seen = set(sids)
    if segs and len(seen) == len(sids) and min(sids) > 0:
        if min(s.collection_id for s in segs) > 0 and min(s.partition_id for s in segs) > 0:
            return seen
    seen = set()
    for seg in segs:
        check_id("segment", seg.segment_id)
        check_id("collection", seg.collection_id)
        check_id("partition", seg.partition_id)
        if seg.segment_id in seen:
            raise ValueError(f"segment {seg.segment_id} appears twice in one save")
        seen.add(seg.segment_id)
    return seen


#: Records built per chunk of a streamed save (``save_loaded``): one txn's worth.
_STREAM_CHUNK = MAX_TXN_OPS
#: A channel name longer than this takes the save that checks every record against the limits before writing.
_LONG_CHANNEL = 4096
_COMPACTION_FROM = attrgetter("compaction_from")
_INSERT_CHANNEL = attrgetter("insert_channel")


def _small_records(infos: Sequence[LoadItem]) -> bool:
    """Whether no record of ``infos`` can be near a txn's byte limit, so their save may be streamed: none has
    compaction sources (a list of any length) or a long channel name; the rest of a record is ids and sizes."""
    if any(map(_COMPACTION_FROM, infos)):
        return False
    return max(map(len, map(_INSERT_CHANNEL, infos)), default=0) <= _LONG_CHANNEL


def _copies_tail(replica_id: int, node_id: int) -> bytes:
    """The serialized copy lists of a one-copy record, to append to the rest of it serialized.

    Why: appending the two lists to every record of a load costs more than serializing it. Protobuf
    serializes fields in number order and the lists are the record's last fields (12, 13), so the rest
    serialized, then this, are the bytes of the whole record serialized (test_querymeta checks it).
    """
    return SegmentInfo(node_ids=[node_id], replica_ids=[replica_id]).SerializeToString()


def _sole_copy_of(place: tuple[int, int, tuple[int, ...]] | None, collection_id: int, partition_id: int,
                  replica_id: int) -> bool:
    """Whether a record placed at ``place`` is of that partition and its one copy is ``replica_id``'s."""
    return (place is not None and place[0] == collection_id and place[1] == partition_id
            and len(place[2]) == 2 and place[2][0] == replica_id)


class SegmentSize(NamedTuple):
    """A copy's segment id and size: what weighing a move needs, without a view of its record."""

    segment_id: int
    mem_size: int


class Segments:
    """Reads and writes of the segment records."""

    def __init__(self, core: MetaCore):
        self._core = core

    # ===== reads =======================================================================
    def get_segment(self, segment_id: int) -> SegmentInfo | None:
        """The segment's record (the caller's own copy): every copy in ``node_ids``/``replica_ids`` (``node_id``:
        the lowest replica's)."""
        return self._core.index.segments.get(segment_id)

    def segment_copies(self, segment_id: int) -> dict[int, int]:
        """replica id -> node id of every recorded copy of the segment ({} when it has none)."""
        place = self._core.index.segments.place(segment_id)
        if place is None:
            return {}
        flat = place[2]
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def segments_of(self, collection_id: int, partition_id: int | None = None) -> list[SegmentInfo]:
        """Segments of a collection (or of one partition), by segment id (the caller's own copies)."""
        index = self._core.index
        ids = index.segment_ids_of(collection_id, partition_id)
        return [index.segments[s] for s in ids]

    def segment_ids_of(self, collection_id: int, partition_id: int | None = None) -> list[int]:
        """Ids only, sorted: no copies, for hot paths such as progress (``segments_of`` copies every record)."""
        return self._core.index.segment_ids_of(collection_id, partition_id)

    def segment_id_set(self, collection_id: int) -> set[int]:
        """Ids of the collection's segments as a new set, unsorted: ``segment_ids_of`` without the sort, for set
        arithmetic over a million ids (the checker's diff)."""
        return set().union(*self._core.index.segments_by_partition.get(collection_id, {}).values())

    def segment_count(self, collection_id: int) -> int:
        """How many segment records the collection has (every partition), without copying their ids."""
        return sum(map(len, self._core.index.segments_by_partition.get(collection_id, {}).values()))

    def partition_segment_ids(self, collection_id: int, partition_id: int) -> Set[int]:
        """Ids of the partition's recorded segments, read-only and not copied (a million-segment partition is
        counted, not copied, by ``querycoord.served``); empty when it has none."""
        return self._core.index.segments_by_partition.get(collection_id, {}).get(partition_id, frozenset())

    def segment_places(self) -> Mapping[int, tuple[int, int, tuple[int, ...]]]:
        """Every segment's (collection, partition, copies as replica, node, replica, node...) by id, read-only and
        without parsing a record: for loops over many segments (the checker's diff, once per pass).

        The view is of the index this instance has now: after a ``reload`` it still shows the places of before
        (a fresh call shows the new ones).
        """
        return MappingProxyType(self._core.index.segments.places())

    def segments_on_node(self, node_id: int) -> list[SegmentInfo]:
        """The copies recorded on the node, by segment id (node 0, "no node", has none).

        Views of one copy each: ``node_id`` is this node, ``replica_id`` the copy's replica.
        """
        index = self._core.index
        out = []
        for sid in sorted(index.segments_by_node.get(node_id, ())):
            seg = index.segments[sid]
            replica = next((r for r, n in copies(seg).items() if n == node_id), 0)
            out.append(view_of(seg, replica))
        return out

    async def read_segments_on_node(self, node_id: int, collection_id: int = 0) -> list[SegmentInfo]:
        """``segments_on_node`` (only ``collection_id``'s copies when not 0), a turn of the event loop every
        ``TURN_EVERY`` copies.

        Why: a view costs microseconds (parse, copy, strip); a node holding a hundred thousand copies took most
        of a second in one stretch, and callers that run on every checker pass (a drain, a balance's plan) held
        the loop for seconds at a million segments. The ids are taken first; a copy that left the node during a
        turn is left out, so every view is one the node still holds when it is built.
        """
        index = self._core.index
        ids = self.segment_ids_on_node_of(node_id, collection_id) if collection_id else \
            self.segment_ids_on_node(node_id)
        out = []
        for start in range(0, len(ids), TURN_EVERY):
            on_node = index.segments_by_node.get(node_id, ())
            for sid in ids[start:start + TURN_EVERY]:
                if sid not in on_node:
                    continue
                seg = index.segments[sid]
                replica = next((r for r, n in copies(seg).items() if n == node_id), 0)
                out.append(view_of(seg, replica))
            if start + TURN_EVERY < len(ids):
                await asyncio.sleep(0)
        return out

    def segment_ids_on_node_of(self, node_id: int, collection_id: int) -> list[int]:
        """Ids of the collection's copies recorded on the node, sorted, from the places (no record parsed)."""
        places = self._core.index.segments.places()
        return sorted(sid for sid in self._core.index.segments_by_node.get(node_id, ())
                      if places[sid][0] == collection_id)

    def segment_ids_by_collection_on_node(self, node_id: int) -> dict[int, list[int]]:
        """Ids of the copies recorded on the node by collection, each list sorted, from the places (no record
        parsed): what a drain weighs at every pass without a view per copy."""
        places = self._core.index.segments.places()
        out: dict[int, list[int]] = {}
        for sid in sorted(self._core.index.segments_by_node.get(node_id, ())):
            out.setdefault(places[sid][0], []).append(sid)
        return out

    def segment_sizes_on_node(self, node_id: int, collection_id: int) -> list[tuple[int, int]]:
        """(segment id, mem_size) of the collection's copies recorded on the node, by id: each record parsed for
        its size, no view built (a tenth of ``segments_on_node``'s cost per copy)."""
        segments = self._core.index.segments
        return [(sid, segments[sid].mem_size) for sid in self.segment_ids_on_node_of(node_id, collection_id)]

    async def read_segment_sizes_on_node(self, node_id: int, collection_id: int) -> list[SegmentSize]:
        """``segment_sizes_on_node`` with a turn of the event loop every ``TURN_EVERY`` copies: a drain weighs
        its next move from these, where views of each copy (``read_segments_on_node``) were a tenth of the
        leader's CPU in a drain of 143,000 copies. A copy that left the node during a turn is left out."""
        index = self._core.index
        ids = self.segment_ids_on_node_of(node_id, collection_id)
        out: list[SegmentSize] = []
        for start in range(0, len(ids), TURN_EVERY):
            on_node, segments = index.segments_by_node.get(node_id, ()), index.segments
            out += [SegmentSize(sid, segments[sid].mem_size) for sid in ids[start:start + TURN_EVERY] if sid in on_node]
            if start + TURN_EVERY < len(ids):
                await asyncio.sleep(0)
        return out

    def segment_ids_on_node(self, node_id: int) -> list[int]:
        """Ids of the copies recorded on the node, sorted: ``segments_on_node`` without a view per copy (a lost
        node's repair reads each copy's place from ``segment_places``)."""
        return sorted(self._core.index.segments_by_node.get(node_id, ()))

    def segment_count_on_node(self, node_id: int) -> int:
        """How many copies are recorded on the node: ``len(segments_on_node(...))`` without the views (ShowNodes
        counts every node's, and an operator polls it through a drain)."""
        return len(self._core.index.segments_by_node.get(node_id, ()))

    def collections_on_node(self, node_id: int) -> set[int]:
        """The collections with a copy recorded on the node (a node lost with a hundred thousand copies is weighed
        at once, by each forget of it: kept counted, ``MetaIndex.copies_by_node``)."""
        return set(self._core.index.copies_by_node.get(node_id, ()))

    def places_on_node(self, node_id: int, collection_id: int) -> Mapping[tuple[int, int, tuple[int, ...]], list[int]]:
        """The ids of the collection's copies recorded on the node, sorted, by their records' place (collection,
        partition, copies): a lost node's repair decides once per place. Kept with the collection's segment
        records (``MetaIndex.segment_view``): a forget rewrites none, so the place groups a warm standby made
        while it followed (``served.warm``) are what its takeover's repair of the lost nodes starts from, instead
        of a walk over their copies (two nodes' at a million segments: most of the 0.3 s the repair took to be
        queued). Read-only to the caller."""
        index = self._core.index

        def group() -> dict[tuple[int, int, tuple[int, ...]], list[int]]:
            places = index.segments.places()
            out: dict[tuple[int, int, tuple[int, ...]], list[int]] = {}
            for sid in sorted(index.segments_by_node.get(node_id, ())):
                place = places.get(sid)
                if place is not None and place[0] == collection_id:
                    ids = out.get(place)
                    if ids is None:
                        out[place] = [sid]
                    else:
                        ids.append(sid)
            return out

        return index.segment_view(PLACES_ON_NODE, collection_id, node_id, None, group)

    def copy_count_on_node(self, node_id: int, collection_id: int) -> int:
        """How many of the collection's segments are recorded on the node (kept counted: O(1))."""
        return self._core.index.copies_by_node.get(node_id, {}).get(collection_id, 0)

    def node_memory_usage(self, node_id: int) -> int:
        """Sum of ``mem_size`` of the segments on the node (kept incrementally: O(1))."""
        return self._core.index.memory_by_node.get(node_id, 0)

    def segment_count_by_node(self) -> dict[int, int]:
        """Number of segments per node, for nodes that hold at least one."""
        return {n: len(s) for n, s in self._core.index.segments_by_node.items()}

    # ===== writes ======================================================================
    async def save_segments(self, segments: Iterable[SegmentInfo]) -> int:
        """Insert or replace segment records (by segment id); return the number of txns used.

        Each segment's collection and partition must be loaded
        (``CollectionNotLoaded`` / ``PartitionNotLoaded`` otherwise, nothing
        written), so no write can leave records of a released collection.
        A segment whose partition changed has its old key deleted in the
        same txn. The batch is packed into txns of at most 128 operations
        and ~1.5 MiB: a big batch is NOT atomic (see rule 5 of ``core``
        for why that is acceptable here); memory follows each txn.
        A load's copies take ``save_loaded``.
        """
        return await self.save_segments_and_remove(segments, ())

    async def save_segments_and_remove(self, saves: Iterable[SegmentInfo], removals: Iterable[int]) -> int:
        """Save segments and remove others: one txn when it fits (a balance move, a handoff).

        When it does not fit, the saves go first and the removals after, so
        a crash in between never loses a segment without its replacement
        (a handoff saves the new segment before releasing its compaction
        sources). A segment both saved and removed is refused
        (``ValueError``); removing an unknown id is a no-op. Returns the
        number of txns used.
        """
        to_save = [stored_segment(s) for s in saves]
        remove_ids = unique_ids("segment", removals)
        seen = _checked_segment_ids(to_save)
        both = seen.intersection(remove_ids)
        if both:
            raise ValueError(f"segments {sorted(both)} are both saved and removed in one call")
        pairs = {(seg.collection_id, seg.partition_id) for seg in to_save}
        touched = seen.union(remove_ids)
        core = self._core

        def cids() -> set[int]:
            places = core.index.segments.places()
            return {cid for cid, _ in pairs} | {places[sid][0] for sid in places.keys() & touched}

        async def body() -> int:
            for cid, pid in pairs:
                core.require_partition(cid, pid)
            replicas: dict[tuple[int, int], int] = {}  # (collection, node) -> replica, resolved once per call
            places = core.index.segments.places()
            new = [seg for seg in to_save if seg.node_id and seg.segment_id not in places]
            mutations = self._put_new_segments(new, replicas) if new else []
            if len(new) < len(to_save):
                mutations += [
                    core.put_segment(self._merged_segment(seg, replicas))
                    for seg in to_save
                    if not (seg.node_id and seg.segment_id not in places)
                ]
            for sid in remove_ids:
                old = core.index.segments.get(sid)
                if old is not None:
                    mutations.append(core.drop_segment(old))
            return await core.commit("save_segments", mutations, atomic=False)

        return await core.guarded(cids, body, claims=touched)

    async def save_loaded(self, infos: Sequence[LoadItem], node_id: int, replica_id: int) -> int:
        """``save_segments`` of the copies on ``node_id`` that a LoadSegments call of replica ``replica_id`` (0: the
        node's replica) has just loaded from ``infos``, the load infos it was sent; returns the txns used.

        The records are ``loaded_record``'s. Why a method of its own: making that message per segment, then
        reading it back to key, serialize and index it, costs more than etcd's write of it, and every segment of
        every load comes here. A segment with no record yet is serialized from one message, its fields set per
        segment (``_put_loaded``); one recorded already (another replica's copy) is merged as ``save_segments``
        merges it.
        """
        check_id("node", node_id)
        infos = list(infos)
        seen = _checked_segment_ids(infos)
        pairs = {(info.collection_id, info.partition_id) for info in infos}
        core = self._core

        async def body() -> int:
            for cid, pid in pairs:
                core.require_partition(cid, pid)
            replicas: dict[tuple[int, int], int] = {}
            places = core.index.segments.places()
            new = [info for info in infos if info.segment_id not in places]
            if len(new) < len(infos):
                # A record whose one copy is this replica's (on a lost node: a repair moving it) becomes the
                # loaded record as it is, like a new one: the merge would give the same bytes, per segment slower.
                own = {cid: replica_id or self._replica_of_copy(cid, node_id, replicas) for cid, _ in pairs}
                moved = {info.segment_id for info in infos
                         if _sole_copy_of(places.get(info.segment_id), info.collection_id, info.partition_id,
                                          own[info.collection_id])}
                new = [info for info in infos if info.segment_id not in places or info.segment_id in moved]
            if len(new) == len(infos) and _small_records(infos):
                chunks = self._loaded_chunks(infos, node_id, replica_id, replicas, _STREAM_CHUNK)
                return await core.writer.commit_streamed("save_segments", chunks, lambda: core.index)
            mutations = self._put_loaded(new, node_id, replica_id, replicas) if new else []
            if len(new) < len(infos):
                done = {info.segment_id for info in new}
                mutations += [
                    core.put_segment(self._merged_segment(loaded_record(info, node_id, replica_id), replicas))
                    for info in infos
                    if info.segment_id not in done
                ]
            return await core.commit("save_segments", mutations, atomic=False)

        return await core.guarded(lambda: {cid for cid, _ in pairs}, body, claims=seen)

    async def remove_segments(self, segment_ids: Iterable[int]) -> int:
        """Remove segment records by id, every copy (unknown ids ignored), in as few txns as the limits allow."""
        return await self.save_segments_and_remove((), segment_ids)

    async def remove_segment_copies(self, node_id: int, segment_ids: Iterable[int]) -> int:
        """Forget the copies of ``segment_ids`` on ``node_id`` (a release on that node); other replicas' copies
        stay, and a record left with no copy is removed. Ids with no copy on the node are ignored."""
        check_id("node", node_id)
        ids = unique_ids("segment", segment_ids)
        core = self._core

        def cids() -> set[int]:
            places = core.index.segments.places()
            return {places[s][0] for s in ids if s in places}

        async def body() -> int:
            mutations = []
            for sid in ids:
                seg = core.index.segments.get(sid)
                if seg is None or node_id not in copies(seg).values():
                    continue
                rest = without_node(seg, node_id)
                mutations.append(core.put_segment(rest) if rest is not None else core.drop_segment(seg))
            return await core.commit("remove_segment_copies", mutations, atomic=False)

        return await core.guarded(cids, body)

    # ===== building records ============================================================
    def _merged_segment(self, view: SegmentInfo, replicas: dict[tuple[int, int], int]) -> SegmentInfo:
        """The stored record once the copy ``view`` describes is added (its replica resolved from its node).

        ``view`` is the caller's private copy (``stored_segment``). A segment with no record yet becomes its
        record in place: ``with_copy`` would copy the message twice more, per segment.
        """
        index = self._core.index
        place = index.segments.place(view.segment_id)
        current = None
        if place is not None and place[:2] == (view.collection_id, view.partition_id):
            current = index.segments.get(view.segment_id)
        # else: new, or moved to another partition (a catalog fix): the old copies went with the old key
        if current is None and view.node_id:
            if not view.replica_id:
                view.replica_id = self._replica_of_copy(view.collection_id, view.node_id, replicas)
            # set_copies(view, {replica: node}) for one copy, written out (once per segment of every load)
            if view.replica_ids or view.node_ids:
                del view.replica_ids[:]
                del view.node_ids[:]
            view.replica_ids.append(view.replica_id)
            view.node_ids.append(view.node_id)
            return view
        return with_copy(current, with_replica(index, view))

    def _replica_of_copy(self, collection_id: int, node_id: int, replicas: dict[tuple[int, int], int]) -> int:
        """The replica a copy on ``node_id`` belongs to, resolved once per (collection, node) of a save."""
        replica = replicas.get((collection_id, node_id))
        if replica is None:
            index = self._core.index
            replica = replicas[collection_id, node_id] = replica_of_node(
                index, collection_id, node_id) or sole_replica(index, collection_id)
        return replica

    def _put_new_segments(self, views: list[SegmentInfo], replicas: dict[tuple[int, int], int]) -> list[Mutation]:
        """The records of segments with no record yet, each with the one copy its view describes: the views
        (the caller's private copies) become the records, written in as few mutations as txns.

        Why a path of its own: the general path (``_merged_segment``, ``put_segment``, a mutation each) costs
        more per segment than etcd's write of it, for saves of many new segments (an adoption by ``repair``; a
        load's own copies take ``_put_loaded``, which does not even make the messages).
        """
        rows: list[NewSegment] = []
        puts: list[Put] = []
        segment_key = keys.segment_key
        tails: dict[tuple[int, int], bytes] = {}
        for view in views:
            sid, cid, pid, node = view.segment_id, view.collection_id, view.partition_id, view.node_id
            replica = view.replica_id
            if not replica:
                view.replica_id = replica = self._replica_of_copy(cid, node, replicas)
            if view.replica_ids or view.node_ids:
                del view.replica_ids[:]
                del view.node_ids[:]
            tail = tails.get((replica, node))
            if tail is None:
                tail = tails[replica, node] = _copies_tail(replica, node)
            raw = view.SerializeToString() + tail  # the record with its one copy, byte for byte (see _copies_tail)
            puts.append(Put(segment_key(cid, pid, sid), raw))
            rows.append((sid, cid, pid, replica, node, view.mem_size, raw))
        return self._core.writer.independent_puts(puts, lambda index, a, b: index.put_new_segments(rows, a, b))

    def _put_loaded(self, infos: list[LoadItem], node_id: int, replica_id: int,
                    replicas: dict[tuple[int, int], int]) -> list[Mutation]:
        """``_put_new_segments`` of the ``loaded_record``s of ``infos`` (segments with no record yet), serialized
        from one message whose per-segment fields are set in turn: the bytes ``loaded_record`` serializes to."""
        return [m for chunk in self._loaded_chunks(infos, node_id, replica_id, replicas, len(infos)) for m in chunk]

    def _loaded_chunks(self, infos: list[LoadItem], node_id: int, replica_id: int,
                       replicas: dict[tuple[int, int], int], size: int) -> Iterator[list[Mutation]]:
        """``_put_loaded``'s mutations, built ``size`` records at a time (``TxnWriter.commit_streamed`` sends each
        chunk while the next is built)."""
        seg = SegmentInfo(node_id=node_id, state=SEALED)
        serialize = seg.SerializeToString
        sources = seg.compaction_from
        collection = replica = partition = -1
        tail = b""
        prefix = ""
        for start in range(0, len(infos), size):
            rows: list[NewSegment] = []
            puts: list[Put] = []
            for info in infos[start:start + size]:
                sid, cid, pid, mem = info.segment_id, info.collection_id, info.partition_id, info.mem_size
                if cid != collection:  # a load's infos are of one collection: resolved once
                    collection = seg.collection_id = cid
                    replica = seg.replica_id = replica_id or self._replica_of_copy(cid, node_id, replicas)
                    tail = _copies_tail(replica, node_id)
                    partition = -1
                if pid != partition:  # they come by partition: the key's prefix made once per run
                    partition = seg.partition_id = pid
                    prefix = keys.segment_partition_prefix(cid, pid)
                seg.segment_id = sid
                seg.mem_size = mem
                seg.num_rows = info.num_rows
                seg.dm_channel = info.insert_channel
                if info.compaction_from:
                    del sources[:]
                    sources.extend(info.compaction_from)
                elif sources:
                    del sources[:]
                raw = serialize() + tail  # the record with its one copy, byte for byte (see _copies_tail)
                puts.append(Put(prefix + str(sid), raw))  # keys.segment_key, its prefix made once per partition
                rows.append((sid, cid, pid, replica, node_id, mem, raw))
            yield self._core.writer.independent_puts(
                puts, lambda index, a, b, rows=rows: index.put_new_segments(rows, a, b))  # type: ignore[misc]
