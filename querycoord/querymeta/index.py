"""The in-memory mirror of the query meta, with the indexes readers need.

``MetaIndex`` is plain synchronous data: it is changed only after etcd has
accepted a write (``QueryMeta`` applies a txn's effects here once the txn
returned), and built from scratch by ``reload``. Keeping it free of I/O is
what makes "memory never shows what etcd does not have" checkable: every
method here corresponds to one kind of etcd operation.

Indexes kept up to date on every change, so that readers on hot paths
(allocation, balance, progress) never scan all segments:
segments by id, by (collection, partition), by node, memory per node;
DM channel watches by collection and by node; delta channels by collection.
Node id 0 means "on no node" and is not indexed by node.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from proto import data_pb2

from . import keys
from .copies import copies

CollectionLoadInfo = data_pb2.CollectionLoadInfo
SegmentInfo = data_pb2.SegmentInfo
DmChannelWatchInfo = data_pb2.DmChannelWatchInfo
VChannelInfo = data_pb2.VChannelInfo


Place = tuple[int, int, tuple[int, ...]]  # (collection, partition, flat copies: replica, node, replica, node...)
#: A new one-copy segment record as a load built it: (segment, collection, partition, replica, node, mem_size,
#: the record serialized).
NewSegment = tuple[int, int, int, int, int, int, bytes]


def flat_copies(seg: SegmentInfo) -> tuple[int, ...]:
    """The record's copies as (replica, node, ...) by replica: what the checker's fast path compares."""
    node_ids = seg.node_ids
    if len(node_ids) == 1:  # one copy (most records): no dict, no sort
        replica_ids = seg.replica_ids
        return (replica_ids[0], node_ids[0]) if replica_ids else ()
    by_replica = copies(seg)
    return tuple(x for r in sorted(by_replica) for x in (r, by_replica[r]))


class SegmentTable(Mapping[int, SegmentInfo]):
    """Segment records by id, kept serialized; each read parses a fresh message (the caller's own).

    Why: a parsed protobuf record costs about 500 bytes (the message object and its arena) for 40 bytes of data,
    and a coordinator holds one per loaded segment: a million segments would be half a GB. Serialized, a record is
    about 70 bytes; what the hot paths need without parsing (collection, partition, copies) is kept beside it in
    a tuple shared by every segment with the same values (few distinct ones: partitions x copy placements).
    """

    __slots__ = ("_places", "_rows", "_shared")

    def __init__(self) -> None:
        self._rows: dict[int, bytes] = {}
        self._places: dict[int, Place] = {}
        self._shared: dict[Place, Place] = {}

    def __getitem__(self, segment_id: int) -> SegmentInfo:
        seg = SegmentInfo()
        seg.ParseFromString(self._rows[segment_id])
        return seg

    def get(self, segment_id: int, default: SegmentInfo | None = None) -> SegmentInfo | None:  # type: ignore[override]
        raw = self._rows.get(segment_id)
        if raw is None:
            return default
        seg = SegmentInfo()
        seg.ParseFromString(raw)
        return seg

    def __contains__(self, segment_id: object) -> bool:
        return segment_id in self._rows

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    @property
    def distinct_places(self) -> int:
        """Distinct places the records share now (bounded: places of released collections are forgotten)."""
        return len(self._shared)

    def __len__(self) -> int:
        return len(self._rows)

    def put(self, seg: SegmentInfo, raw: bytes | None = None) -> Place:
        """Store ``seg`` (``raw``: its serialized form when the caller has it already: the etcd write's value)."""
        place = (seg.collection_id, seg.partition_id, flat_copies(seg))
        if len(self._shared) > max(4096, len(self._rows)):
            self._shared = {}  # places of released collections: forget them (records keep the tuples they use)
        place = self._shared.setdefault(place, place)
        self._rows[seg.segment_id] = raw if raw is not None else seg.SerializeToString()
        self._places[seg.segment_id] = place
        return place

    def put_rows(self, rows: Iterable[NewSegment]) -> None:
        """Store new one-copy records already serialized (a load's: no parse, no ``flat_copies``); rows of one
        place come in runs (a load's are by partition and node), so a place is looked up once per run."""
        if len(self._shared) > max(4096, len(self._rows)):
            self._shared = {}
        shared, records, places = self._shared, self._rows, self._places
        place: Place = (0, 0, ())
        for segment_id, cid, pid, replica, node, _mem, raw in rows:
            if place[0] != cid or place[1] != pid or place[2] != (replica, node):
                place = (cid, pid, (replica, node))
                place = shared.setdefault(place, place)
            records[segment_id] = raw
            places[segment_id] = place

    def pop(self, segment_id: int) -> tuple[Place, SegmentInfo] | None:
        """Remove a record: its place and the record itself (None when there is none)."""
        raw = self._rows.pop(segment_id, None)
        if raw is None:
            return None
        seg = SegmentInfo()
        seg.ParseFromString(raw)
        return self._places.pop(segment_id), seg

    def place(self, segment_id: int) -> Place | None:
        """(collection, partition, flat copies) without parsing the record."""
        return self._places.get(segment_id)

    def places(self) -> Mapping[int, Place]:
        """Every segment's place by id (read-only use: loops over a million segments)."""
        return self._places


# ``segment_view`` name of a node's copies of a collection grouped by place (``Segments.places_on_node``): dropped
# with the node's last copy of the collection, so that lost nodes' groups do not pile up.
PLACES_ON_NODE = "places-on-node"


class MetaIndex:
    """Collections, segments and channels as etcd has them, indexed (see module docstring)."""

    def __init__(self) -> None:
        self.collections: dict[int, CollectionLoadInfo] = {}
        self.segments = SegmentTable()
        self.segments_by_partition: dict[int, dict[int, set[int]]] = {}
        self.segments_by_node: dict[int, set[int]] = {}
        self.memory_by_node: dict[int, int] = {}
        # node -> collection -> its segments recorded on the node: which collections a node serves, and how many
        # copies a lost node still holds of one (asked at each forget and each part of its repair), without a
        # walk over the node's copies (a hundred thousand at a million segments)
        self.copies_by_node: dict[int, dict[int, int]] = {}
        self.dm_channels: dict[int, dict[str, DmChannelWatchInfo]] = {}
        self.dm_channels_by_node: dict[int, set[tuple[int, str]]] = {}
        self.delta_channels: dict[int, dict[str, VChannelInfo]] = {}
        # collection -> a counter bumped by every change to its records: readers that derive something costly
        # from a collection (what online nodes serve of it, ``querycoord.served``) recompute only when it moved.
        self.changes: dict[int, int] = {}
        # collection -> (its ``changes`` mark, a view derived from its records): a view that walks every segment
        # of a collection (GetReplicas' ``replicas.Replicas.replicas_of``) is derived once per change, not per
        # call. Owned by the managers' readers, dropped with the index.
        self.views: dict[tuple[str, int], tuple[int, Any]] = {}
        # collection -> a counter bumped only by changes to its segment records (each also bumps ``changes``), and
        # views derived from those records alone (``segment_view``): a node's forget, which rewrites its replicas
        # and DM channel watches but no segment record (``remove_node(keep_segments=True)``), keeps them.
        self.segment_changes: dict[int, int] = {}
        self.segment_views: dict[tuple[str, int, Hashable], tuple[tuple[int, Hashable], Any]] = {}
        # (collection, partition) -> a counter bumped only by changes to that partition's segment records (never
        # reset: a view kept from before a release cannot match a later count), for views of one partition's
        # records (``partition_view``): a repair's or a load's saves into some partitions keep the others' views.
        self.partition_changes: dict[tuple[int, int], int] = {}

    def view(self, name: str, collection_id: int, derive: Callable[[], Any]) -> Any:
        """``derive()``, or what it returned while the collection's records were as they are now."""
        mark = self.changes.get(collection_id, 0)
        cached = self.views.get((name, collection_id))
        if cached is not None and cached[0] == mark:
            return cached[1]
        value = derive()
        self.views[(name, collection_id)] = (mark, value)
        return value

    def segment_view(self, name: str, collection_id: int, part: Hashable, key: Hashable,
                     derive: Callable[[], Any]) -> Any:
        """``derive()``, or what it returned for ``key`` while the collection's segment records were as they are
        now: for views of the segment records alone (and of what ``key`` names: a target's change mark), which
        outlive a change to the collection's other records. One view is kept per ``part`` (a partition): a new
        ``key`` replaces it. Read-only to the caller: it is shared."""
        return self._kept((name, collection_id, part), (self.segment_changes.get(collection_id, 0), key), derive)

    def has_segment_view(self, name: str, collection_id: int, part: Hashable, key: Hashable) -> bool:
        """Whether ``segment_view`` would answer without deriving."""
        cached = self.segment_views.get((name, collection_id, part))
        return cached is not None and cached[0] == (self.segment_changes.get(collection_id, 0), key)

    def partition_view(self, name: str, collection_id: int, partition_id: int, key: Hashable,
                       derive: Callable[[], Any]) -> Any:
        """``segment_view`` of one partition's segment records alone: kept while that partition's records are as
        they are now, whatever happens to the collection's other partitions. ``derive`` must read no other
        partition's records. Why: ShowCollections recounted every partition of a million-segment collection (0.1 s
        of the leader's CPU per call) after each save of a repair that touched a few of its 16 partitions."""
        mark = (self.partition_changes.get((collection_id, partition_id), 0), key)
        return self._kept((name, collection_id, partition_id), mark, derive)

    def _kept(self, slot: tuple[str, int, Hashable], mark: tuple[int, Hashable], derive: Callable[[], Any]) -> Any:
        """The view kept in ``slot`` while its ``mark`` holds, else ``derive()`` kept there under it."""
        cached = self.segment_views.get(slot)
        if cached is not None and cached[0] == mark:
            return cached[1]
        value = derive()
        self.segment_views[slot] = (mark, value)
        return value

    def has_partition_view(self, name: str, collection_id: int, partition_id: int, key: Hashable) -> bool:
        """Whether ``partition_view`` would answer without deriving."""
        cached = self.segment_views.get((name, collection_id, partition_id))
        return cached is not None and cached[0] == (self.partition_changes.get((collection_id, partition_id), 0), key)

    def changed(self, collection_id: int) -> None:
        self.changes[collection_id] = self.changes.get(collection_id, 0) + 1

    def segments_changed(self, collection_id: int, partition_id: int) -> None:
        """A segment record of the collection's partition changed (``changed`` too)."""
        self.changed(collection_id)
        self.segment_changes[collection_id] = self.segment_changes.get(collection_id, 0) + 1
        key = (collection_id, partition_id)
        self.partition_changes[key] = self.partition_changes.get(key, 0) + 1

    # ----- collections ------------------------------------------------------
    def put_collection(self, info: CollectionLoadInfo) -> None:
        self.collections[info.collection_id] = info
        self.changed(info.collection_id)

    def drop_collection(self, collection_id: int) -> None:
        self.collections.pop(collection_id, None)
        self.changed(collection_id)
        for key in [k for k in self.views if k[1] == collection_id]:
            del self.views[key]
        for skey in [k for k in self.segment_views if k[1] == collection_id]:
            del self.segment_views[skey]

    def drop_everything_of(self, collection_id: int) -> None:
        """The memory side of ``release_collection``'s txn: record and all three range deletes."""
        self.drop_collection(collection_id)
        self.drop_collection_segments(collection_id)
        for channel in list(self.dm_channels.get(collection_id, {})):
            self.drop_dm_channel(collection_id, channel)
        self.delta_channels.pop(collection_id, None)

    # ----- segments -----------------------------------------------------------
    def put_segment(self, seg: SegmentInfo, raw: bytes | None = None) -> None:
        """Insert or replace by segment id (a replaced record may have moved node or partition).

        The record is stored serialized (``SegmentTable``; ``raw``: ``seg`` serialized, when the caller has it):
        changing ``seg`` afterwards changes nothing here.
        """
        sid = seg.segment_id
        self.drop_segment(sid)
        cid, pid, flat = self.segments.put(seg, raw)
        self.segments_changed(cid, pid)
        self.segments_by_partition.setdefault(cid, {}).setdefault(pid, set()).add(sid)
        mem = seg.mem_size
        for node in flat[1::2]:
            on_node = self.segments_by_node.setdefault(node, set())
            if sid not in on_node:
                on_node.add(sid)
                counts = self.copies_by_node.setdefault(node, {})
                counts[cid] = counts.get(cid, 0) + 1
            self.memory_by_node[node] = self.memory_by_node.get(node, 0) + mem

    def put_new_segments(self, rows: Sequence[NewSegment], start: int, end: int) -> None:
        """``put_segment`` of ``rows[start:end]``: one-copy records a load built, applied without a call per
        record or a parse (a segment already recorded is replaced, as ``put_segment`` does)."""
        table, chunk = self.segments, rows[start:end]
        self._unindex_replaced(chunk)
        table.put_rows(chunk)
        by_partition, by_node, memory = self.segments_by_partition, self.segments_by_node, self.memory_by_node
        # Sets looked up once per run of one partition and node (a load's rows come so), not per row.
        last: tuple[int, int, int] | None = None
        in_partition: set[int] = set()
        on_node: set[int] = set()
        runs: dict[tuple[int, int], int] = {}  # (node, collection) -> rows
        for sid, cid, pid, _replica, node, mem, _raw in chunk:
            if last is None or last[0] != cid or last[1] != pid or last[2] != node:
                if last is None or last[0] != cid or last[1] != pid:
                    self.segments_changed(cid, pid)
                last = (cid, pid, node)
                in_partition = by_partition.setdefault(cid, {}).setdefault(pid, set())
                on_node = by_node.setdefault(node, set())
            in_partition.add(sid)
            if sid not in on_node:
                on_node.add(sid)
                runs[node, cid] = runs.get((node, cid), 0) + 1
            memory[node] = memory.get(node, 0) + mem
        for (node, cid), n in runs.items():
            counts = self.copies_by_node.setdefault(node, {})
            counts[cid] = counts.get(cid, 0) + n

    def _unindex_replaced(self, chunk: Sequence[NewSegment]) -> None:
        """``drop_segment`` of the rows' segments that have a record, but for the record and its place, which the
        rows overwrite, and a partition set the segment stays in: by the old record's place, a set operation per
        place and node rather than a call per segment. Why: a lost node's repair replaces every record it saves (the
        copy on the lost node), 26,000 a part, and ``drop_segment`` each was a tenth of the leader's CPU there."""
        places = self.segments.places()
        by_place: dict[Place, list[NewSegment]] = {}
        for row in chunk:
            place = places.get(row[0])
            if place is not None:
                by_place.setdefault(place, []).append(row)
        if not by_place:
            return
        table = self.segments
        for (cid, pid, flat), rows in by_place.items():
            self.segments_changed(cid, pid)
            left = [r[0] for r in rows if r[1] != cid or r[2] != pid]  # moved to another partition (a catalog fix)
            parts = self.segments_by_partition.get(cid)
            if left and parts is not None:
                sids = parts.get(pid)
                if sids is not None:
                    sids.difference_update(left)
                    if not sids:
                        del parts[pid]
                if not parts:
                    del self.segments_by_partition[cid]
            nodes = flat[1::2]
            if not nodes:
                continue
            ids = list(dict.fromkeys(r[0] for r in rows))
            mem = sum(table[sid].mem_size for sid in ids)  # the old records' sizes: what the nodes were charged
            for node in dict.fromkeys(nodes):
                self._uncount_on_node(node, cid, ids, mem * nodes.count(node))

    def _uncount_on_node(self, node: int, cid: int, ids: list[int], mem: int) -> None:
        """Node ``node`` no longer holds copies ``ids`` of collection ``cid``, which were charged ``mem`` bytes."""
        on_node = self.segments_by_node.get(node)
        held = len(on_node) if on_node is not None else 0
        if on_node is not None:
            on_node.difference_update(ids)
        if on_node:
            self.memory_by_node[node] -= mem
        else:
            self.segments_by_node.pop(node, None)
            self.memory_by_node.pop(node, None)
        held -= len(on_node) if on_node else 0
        counts = self.copies_by_node.get(node)
        if held and counts is not None and cid in counts:
            counts[cid] -= held
            if not counts[cid]:
                del counts[cid]
                self.segment_views.pop((PLACES_ON_NODE, cid, node), None)
                if not counts:
                    del self.copies_by_node[node]

    def drop_segment(self, segment_id: int) -> None:
        popped = self.segments.pop(segment_id)
        if popped is None:
            return
        _place, seg = popped
        self.segments_changed(seg.collection_id, seg.partition_id)
        parts = self.segments_by_partition.get(seg.collection_id)
        if parts is not None:
            sids = parts.get(seg.partition_id)
            if sids is not None:
                sids.discard(segment_id)
                if not sids:
                    del parts[seg.partition_id]
            if not parts:
                del self.segments_by_partition[seg.collection_id]
        cid = seg.collection_id
        for node in copies(seg).values():
            on_node = self.segments_by_node.get(node, set())
            held = segment_id in on_node
            on_node.discard(segment_id)
            if on_node:
                self.memory_by_node[node] -= seg.mem_size
            else:
                # Drop the entries rather than keep zeros: "nodes with segments" stays exact.
                self.segments_by_node.pop(node, None)
                self.memory_by_node.pop(node, None)
            counts = self.copies_by_node.get(node)
            if held and counts is not None and cid in counts:
                counts[cid] -= 1
                if not counts[cid]:
                    del counts[cid]
                    # the node's place groups of the collection (``places_on_node``): nothing to group any more
                    self.segment_views.pop((PLACES_ON_NODE, cid, node), None)
                    if not counts:
                        del self.copies_by_node[node]

    def drop_partition_segments(self, collection_id: int, partition_id: int) -> None:
        for sid in list(self.segments_by_partition.get(collection_id, {}).get(partition_id, ())):
            self.drop_segment(sid)

    def drop_collection_segments(self, collection_id: int) -> None:
        for sids in list(self.segments_by_partition.get(collection_id, {}).values()):
            for sid in list(sids):
                self.drop_segment(sid)

    def segment_ids_of(self, collection_id: int, partition_id: int | None = None) -> list[int]:
        parts = self.segments_by_partition.get(collection_id, {})
        if partition_id is not None:
            return sorted(parts.get(partition_id, ()))
        return sorted(sid for sids in parts.values() for sid in sids)

    # ----- DM channels --------------------------------------------------------
    def put_dm_channel(self, watch: DmChannelWatchInfo) -> None:
        self.drop_dm_channel(watch.collection_id, watch.dm_channel)
        self.dm_channels.setdefault(watch.collection_id, {})[watch.dm_channel] = watch
        self.changed(watch.collection_id)
        for node in copies(watch).values():
            self.dm_channels_by_node.setdefault(node, set()).add((watch.collection_id, watch.dm_channel))

    def drop_dm_channel(self, collection_id: int, channel: str) -> None:
        channels = self.dm_channels.get(collection_id)
        if channels is None or channel not in channels:
            return
        watch = channels.pop(channel)
        self.changed(collection_id)
        if not channels:
            del self.dm_channels[collection_id]
        for node in copies(watch).values():
            on_node = self.dm_channels_by_node.get(node)
            if on_node is not None:
                on_node.discard((collection_id, channel))
                if not on_node:
                    del self.dm_channels_by_node[node]

    # ----- delta channels -----------------------------------------------------
    def put_delta_channel(self, info: VChannelInfo) -> None:
        self.delta_channels.setdefault(info.collection_id, {})[info.channel_name] = info

    def drop_delta_channel(self, collection_id: int, channel: str) -> None:
        channels = self.delta_channels.get(collection_id)
        if channels is not None:
            channels.pop(channel, None)
            if not channels:
                del self.delta_channels[collection_id]

    # ----- whole view ---------------------------------------------------------
    def records(self) -> Iterator[tuple[str, CollectionLoadInfo | SegmentInfo | DmChannelWatchInfo | VChannelInfo]]:
        """Every record with the key it is stored under: what etcd must hold, exactly."""
        for cid, info in self.collections.items():
            yield keys.collection_key(cid), info
        for seg in self.segments.values():  # parsed one by one: a fresh message each
            yield keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id), seg
        for cid, watches in self.dm_channels.items():
            for channel, watch in watches.items():
                yield keys.dm_channel_key(cid, channel), watch
        for cid, deltas in self.delta_channels.items():
            for channel, delta in deltas.items():
                yield keys.delta_channel_key(cid, channel), delta
