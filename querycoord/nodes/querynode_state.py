"""What a reference query node holds, and the rules that change it: no I/O, no await.

Kept free of gRPC and asyncio on purpose: every check and change of one
request runs as one synchronous step, so two concurrent calls on the node's
event loop can never interleave between "the fence is fine / the memory
fits" and "apply it" (a newer leader's call cannot slip in between).

Rules (see proto/querynode.proto):

- **Addressing.** A request names its target ``node_id``. A mutating request
  for another node (a stale address now used by a restarted node) or with no
  node id is refused with ILLEGAL_ARGUMENT: a coordinator must say whom it
  means before the node changes anything. Reads accept 0 (a tool may ask
  whoever listens there) but refuse another node's id.
- **Fencing.** The node keeps the highest ``CoordFence.leader_revision`` it
  has seen. A mutating request with a lower revision is refused with
  STALE_LEADER; equal or higher is accepted, and higher raises the mark. A
  request without a fence counts as revision 0, so it is accepted only while
  no fence has been seen: once any coordinator has fenced this node, unfenced
  mutating calls are refused. Reads are never refused for their fence, but a
  higher fence on a read raises the mark too (only a real leader holds that
  revision; fencing a deposed leader earlier is always safe).
- **Idempotence.** Loading a held segment, watching a watched channel and
  releasing something absent are SUCCESS, so a new leader can re-send what
  an old one may or may not have sent.
- **Memory.** Held segments are accounted by ``mem_size`` against the
  capacity; a load that does not fit is refused whole (all-or-nothing per
  request) with NO_AVAILABLE_NODE, the code that tells the coordinator to
  place the work on another node rather than retry here.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

from proto import common_pb2, data_pb2, querynode_pb2
from querycoord.common.errors import CoordError
from querycoord.common.messages import LoadItem, load_items

EC = common_pb2.ErrorCode
OUT_OF_MEMORY_CODE = EC.NO_AVAILABLE_NODE


class NodeRefusal(CoordError):
    """A request the node answers with an error status (never a transport error); ``status()`` is that answer."""

    def __init__(self, code: common_pb2.ErrorCode, reason: str):
        super().__init__(reason, code)


def ok_status() -> common_pb2.Status:
    return common_pb2.Status(error_code=EC.SUCCESS)


class HeldSegment(NamedTuple):
    """A loaded sealed segment; binlog and index file paths are not kept (nothing reads them).

    A tuple, not a dataclass: a load of ten thousand segments builds them in C (``_held_segment``) rather than
    through ten thousand ``__init__`` calls. The SegmentInfo reads answer with is cached by the state
    (``QueryNodeState._protos``), not here: a tuple has no room for it.
    """

    segment_id: int
    collection_id: int
    partition_id: int
    num_rows: int
    mem_size: int
    insert_channel: str = ""
    compaction_from: tuple[int, ...] = ()
    index_infos: tuple[data_pb2.IndexInfo, ...] = ()

    def to_proto(self, node_id: int) -> data_pb2.SegmentInfo:
        """The segment as reads report it (a new message each call)."""
        return data_pb2.SegmentInfo(
            segment_id=self.segment_id,
            collection_id=self.collection_id,
            partition_id=self.partition_id,
            node_id=node_id,
            mem_size=self.mem_size,
            num_rows=self.num_rows,
            index_infos=list(self.index_infos),
            state=data_pb2.SEGMENT_STATE_SEALED,
            compaction_from=list(self.compaction_from),
            dm_channel=self.insert_channel,
        )


# ``HeldSegment(*row)`` without the Python-level ``__new__``: ``row`` must have all eight fields.
_held_segment = partial(tuple.__new__, HeldSegment)

# What a load reads of every SegmentLoadInfo, a C call per field and info (``LoadColumns``).
_LOAD_FIELDS = tuple(map(attrgetter, ("segment_id", "collection_id", "partition_id", "num_rows", "mem_size",
                                       "insert_channel")))
_COMPACTION_FROM = attrgetter("compaction_from")
_INDEX_INFOS = attrgetter("index_infos")
_MEM_SIZE = attrgetter("mem_size")


@dataclass(frozen=True)
class LoadColumns:
    """The scalar fields of a LoadSegmentsRequest's segments (``load_items``), one tuple per field in order.

    Reading a field of a protobuf message is the bulk of what a node spends per segment, so a request's infos
    are read once, column-wise in C, and the columns are shared: the bounds checks (``querynode_checks``) and
    ``QueryNodeState.load_segments`` both test the common case on them with min/set over a column, and look at
    the infos one by one only when something is off (to refuse with the same message as ever). ``plain``: no
    info has ``compaction_from`` or ``index_infos`` (both read per info only then).
    """

    infos: list[LoadItem]
    segment_ids: tuple[int, ...]
    collection_ids: tuple[int, ...]
    partition_ids: tuple[int, ...]
    num_rows: tuple[int, ...]
    mem_sizes: tuple[int, ...]
    insert_channels: tuple[str, ...]
    plain: bool
    nonnegative: bool  # every segment id > 0, every partition id, collection id, row count and size >= 0

    @classmethod
    def of(cls, infos: Sequence[LoadItem]) -> LoadColumns:
        """The columns of ``infos`` (a request's, not changed until they are used)."""
        if not infos:
            return cls([], (), (), (), (), (), (), True, False)
        items = list(infos)  # one Python object per info, made once for every pass below (and the checks')
        # A pass per field: no tuple per info to build and transpose (each a garbage collector's object).
        sids, cids, pids, rows, mems, chans = (tuple(map(getter, items)) for getter in _LOAD_FIELDS)
        # An unset repeated field is costly to read: each is read once here and let go at once (``any``).
        plain = not any(map(_COMPACTION_FROM, items)) and not any(map(_INDEX_INFOS, items))
        nonnegative = min(sids) > 0 and min(pids) >= 0 and min(cids) >= 0 and min(rows) >= 0 and min(mems) >= 0
        return cls(items, sids, cids, pids, rows, mems, chans, plain, nonnegative)

    def __len__(self) -> int:
        return len(self.segment_ids)


@dataclass
class DmWatch:
    """A watched DM channel; empty ``partition_ids`` means the whole collection."""

    collection_id: int
    channel_name: str
    partition_ids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class FenceMark:
    """The highest fence seen, and from which coordinator (for the refusal message)."""

    leader_revision: int = 0
    coordinator_id: int = 0


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{name} must be a positive id, got {value}")


def _ids(name: str, values: Iterable[int], *, required: bool) -> list[int]:
    ids = list(values)
    if required and not ids:
        raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{name} is empty: name at least one")
    bad = [v for v in ids if v < 0]
    if bad:
        raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{name} contains negative ids {bad[:5]}")
    return ids


class QueryNodeState:
    """Segments, channels, memory and the fence mark of one query node (see module docstring)."""

    def __init__(self, capacity_bytes: int, node_id: int = 0):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity must be a positive number of bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.node_id = node_id
        self.segments: dict[int, HeldSegment] = {}
        # The SegmentInfo reads answer with, per held segment (with the segment it was built from), built once: a
        # held segment never changes, every distribution the coordinator's checker asks for lists every held
        # segment, and building them anew was most of its cost.
        self._protos: dict[int, tuple[HeldSegment, data_pb2.SegmentInfo]] = {}
        self._protos_node = node_id  # the node id the cached messages carry
        self.dm_channels: dict[str, DmWatch] = {}
        self.delta_channels: dict[str, int] = {}
        # collection -> (query channel, query result channel)
        self.query_channels: dict[int, tuple[str, str]] = {}
        self.fence = FenceMark()
        self.memory_used = 0
        # Distribution versions (``GetDataDistribution``): a random id of this run of the node, and per collection
        # the tick of its last change here (segments loaded or dropped, DM channels watched or unwatched). A
        # checker that has a collection's version skips it when it did not move; a restarted node has another
        # incarnation, so its versions never match what its last run reported.
        self.incarnation = random.getrandbits(63) or 1
        self.versions: dict[int, int] = {}
        self._tick = 0

    def touched(self, collection_id: int) -> None:
        """The collection's part of the distribution changed (or may have): its version moves."""
        self._tick += 1
        self.versions[collection_id] = self._tick

    # ----- admission -----------------------------------------------------------
    def admit(self, kind: str, request: object, *, mutating: bool) -> None:
        """Check addressing and fence of ``request`` (fields 1..3 of every node request); raise the mark.

        Raises ``NodeRefusal``; the caller turns it into the response status.
        """
        node_id = int(getattr(request, "node_id", 0))
        if node_id != self.node_id and (mutating or node_id != 0):
            if node_id == 0:
                raise NodeRefusal(
                    EC.ILLEGAL_ARGUMENT,
                    f"{kind}: node_id is not set; a mutating request must name its target node "
                    f"(this is query node {self.node_id})",
                )
            raise NodeRefusal(
                EC.ILLEGAL_ARGUMENT,
                f"{kind}: request is meant for node {node_id} but this is query node {self.node_id} "
                f"(stale address? re-read the node's session)",
            )
        fence = request.fence if request.HasField("fence") else None  # type: ignore[attr-defined]
        revision = fence.leader_revision if fence is not None else 0
        coordinator = fence.coordinator_id if fence is not None else 0
        if revision < 0:
            raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{kind}: fence revision must be >= 0, got {revision}")
        mark = self.fence
        if revision < mark.leader_revision:
            if mutating:
                unset = " (the request carried no fence)" if fence is None else ""
                raise NodeRefusal(
                    EC.STALE_LEADER,
                    f"stale coordinator: fence revision {revision} < {mark.leader_revision} already seen from "
                    f"coordinator {mark.coordinator_id}{unset}; {kind} refused, a newer leader is in charge",
                )
            return
        if revision > mark.leader_revision:
            self.fence = FenceMark(revision, coordinator)

    # ----- segments ------------------------------------------------------------
    def load_segments(self, request: querynode_pb2.LoadSegmentsRequest, columns: LoadColumns | None = None) -> None:
        """Hold every segment of the request, or none of them.

        ``columns``: ``LoadColumns.of(load_items(request))`` when the caller has read them already (the node's
        checks have): not read again.
        """
        coll = request.collection_id
        _positive("collection_id", coll)
        infos = load_items(request)
        if not infos:
            raise NodeRefusal(EC.ILLEGAL_ARGUMENT, "LoadSegments without segments: infos and binlogs are empty")
        if columns is None or len(columns) != len(infos):
            columns = LoadColumns.of(infos)
        new = self._plain_new_segments(coll, columns)
        if new is None:
            new = self._new_segments(self._segment_from_info(coll, info) for info in infos)
        need = sum(map(_MEM_SIZE, new.values()))
        if self.memory_used + need > self.capacity_bytes:
            raise NodeRefusal(
                OUT_OF_MEMORY_CODE,
                f"out of memory: need {need} bytes, {self.memory_used} of {self.capacity_bytes} used "
                f"(query node {self.node_id}, {len(new)} segment(s) of collection {coll}); nothing loaded, "
                f"place them on another node",
            )
        self.segments.update(new)
        self.memory_used += need
        self.touched(coll)

    def _plain_new_segments(self, coll: int, columns: LoadColumns) -> dict[int, HeldSegment] | None:
        """The new segments of the usual load, built from the columns in C; None when any info needs a closer
        look (``_segment_from_info``): a refusal, compaction sources or indexes to copy.

        Accepts only what the info by info path accepts, building the same segments: every id positive, every
        number >= 0, every collection id this one or 0.
        """
        sids = columns.segment_ids
        if not (columns.plain and columns.nonnegative and set(columns.collection_ids).issubset((0, coll))):
            return None
        rows = zip(sids, repeat(coll), columns.partition_ids, columns.num_rows, columns.mem_sizes,
                   columns.insert_channels, repeat(()), repeat(()))
        segments = map(_held_segment, rows)
        if len(set(sids)) == len(sids) and self.segments.keys().isdisjoint(sids):
            return dict(zip(sids, segments, strict=True))
        return self._new_segments(segments)  # some held already or given twice: do they agree?

    def _new_segments(self, segments: Iterable[HeldSegment]) -> dict[int, HeldSegment]:
        """The segments not held yet, in order; refuses the first one held (or given before) in another collection
        or partition. ``segments`` may be built as they are asked for and refuse an info there: the first refusal,
        in info order, is the answer."""
        new: dict[int, HeldSegment] = {}
        for seg in segments:
            held = self.segments.get(seg.segment_id) or new.get(seg.segment_id)
            if held is not None:
                if (held.collection_id, held.partition_id) != (seg.collection_id, seg.partition_id):
                    raise NodeRefusal(
                        EC.CONFLICT,
                        f"segment {seg.segment_id} is held as collection {held.collection_id} partition "
                        f"{held.partition_id}, but the request says collection {seg.collection_id} partition "
                        f"{seg.partition_id}; nothing loaded",
                    )
                continue  # already held (or twice in this request): idempotent
            new[seg.segment_id] = seg
        return new

    @staticmethod
    def _segment_from_info(coll: int, info: LoadItem) -> HeldSegment:
        sid = info.segment_id
        _positive("segment_id", sid)
        if info.collection_id not in (0, coll):
            raise NodeRefusal(
                EC.ILLEGAL_ARGUMENT,
                f"segment {sid} says collection {info.collection_id} in a request for collection {coll}",
            )
        partition_id, num_rows, mem_size = info.partition_id, info.num_rows, info.mem_size
        if partition_id < 0 or num_rows < 0 or mem_size < 0:
            for name, value in (("partition_id", partition_id), ("num_rows", num_rows), ("mem_size", mem_size)):
                if value < 0:
                    raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"segment {sid}: {name} must be >= 0, got {value}")
        indexes = []
        for idx in info.index_infos:
            slim = data_pb2.IndexInfo()
            slim.CopyFrom(idx)
            del slim.index_file_paths[:]
            indexes.append(slim)
        return HeldSegment(sid, coll, partition_id, num_rows, mem_size, info.insert_channel,
                           tuple(info.compaction_from) if info.compaction_from else (), tuple(indexes))

    def _drop_segments(self, seg_ids: Iterable[int]) -> int:
        dropped = 0
        for sid in list(seg_ids):
            seg = self.segments.pop(sid, None)
            if seg is not None:
                self.touched(seg.collection_id)
                self._protos.pop(sid, None)
                self.memory_used -= seg.mem_size
                dropped += 1
        return dropped

    def release_segments(self, request: querynode_pb2.ReleaseSegmentsRequest) -> int:
        """Drop the named segments (of the collection and partitions when given); absent ones are fine."""
        ids = _ids("segment_ids", request.segment_ids, required=True)
        parts = set(_ids("partition_ids", request.partition_ids, required=False))
        coll = request.collection_id
        if coll < 0:
            raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"collection_id must be >= 0, got {coll}")
        chosen = [
            sid
            for sid in ids
            if (seg := self.segments.get(sid)) is not None
            and (coll == 0 or seg.collection_id == coll)
            and (not parts or seg.partition_id in parts)
        ]
        return self._drop_segments(chosen)

    # ----- channels ------------------------------------------------------------
    @staticmethod
    def _channel_names(coll: int, infos: Iterable[data_pb2.VChannelInfo], kind: str) -> list[str]:
        names = []
        for info in infos:
            if not info.channel_name:
                raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{kind}: a channel has no channel_name")
            if info.collection_id not in (0, coll):
                raise NodeRefusal(
                    EC.ILLEGAL_ARGUMENT,
                    f"{kind}: channel {info.channel_name} says collection {info.collection_id} in a request "
                    f"for collection {coll}",
                )
            names.append(info.channel_name)
        if not names:
            raise NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{kind} without channels: infos is empty")
        return names

    def watch_dm_channels(self, request: querynode_pb2.WatchDmChannelsRequest) -> None:
        coll = request.collection_id
        _positive("collection_id", coll)
        names = self._channel_names(coll, request.infos, "WatchDmChannels")
        parts = set(_ids("partition_ids", request.partition_ids, required=False))
        for name in names:
            held = self.dm_channels.get(name)
            if held is not None and held.collection_id != coll:
                raise NodeRefusal(
                    EC.CONFLICT,
                    f"DM channel {name} is watched for collection {held.collection_id}, not {coll}; nothing watched",
                )
        self.touched(coll)
        for name in names:
            held = self.dm_channels.get(name)
            if held is None:
                self.dm_channels[name] = DmWatch(coll, name, set(parts))
            elif held.partition_ids and parts:
                held.partition_ids |= parts
            else:
                # Either side serves the whole collection: so does the watch.
                held.partition_ids = set()

    def release_dm_channels(self, request: querynode_pb2.ReleaseDmChannelsRequest) -> int:
        """Stop watching the named DM channels of the collection; one not watched, or watched for another
        collection (not this request's to drop), is fine. Returns how many watches were dropped."""
        coll = request.collection_id
        _positive("collection_id", coll)
        names = list(request.channel_names)
        if not names or not all(names):
            raise NodeRefusal(EC.ILLEGAL_ARGUMENT, "ReleaseDmChannels: name at least one channel, none empty")
        dropped = 0
        for name in names:
            held = self.dm_channels.get(name)
            if held is not None and held.collection_id == coll:
                del self.dm_channels[name]
                dropped += 1
                self.touched(coll)
        return dropped

    def watch_delta_channels(self, request: querynode_pb2.WatchDeltaChannelsRequest) -> None:
        coll = request.collection_id
        _positive("collection_id", coll)
        names = self._channel_names(coll, request.infos, "WatchDeltaChannels")
        for name in names:
            owner = self.delta_channels.get(name)
            if owner is not None and owner != coll:
                raise NodeRefusal(
                    EC.CONFLICT, f"delta channel {name} is watched for collection {owner}, not {coll}; nothing watched"
                )
        for name in names:
            self.delta_channels[name] = coll

    def add_query_channel(self, request: querynode_pb2.AddQueryChannelRequest) -> None:
        """Subscribe the collection's query channels; a different name replaces the old (one per collection)."""
        coll = request.collection_id
        _positive("collection_id", coll)
        if not request.query_channel:
            raise NodeRefusal(EC.ILLEGAL_ARGUMENT, "AddQueryChannel: query_channel is empty")
        self.query_channels[coll] = (request.query_channel, request.query_result_channel)

    # ----- releases ------------------------------------------------------------
    def release_collection(self, request: querynode_pb2.ReleaseCollectionRequest) -> None:
        coll = request.collection_id
        _positive("collection_id", coll)
        self.touched(coll)
        self._drop_segments([sid for sid, s in self.segments.items() if s.collection_id == coll])
        for name in [n for n, w in self.dm_channels.items() if w.collection_id == coll]:
            del self.dm_channels[name]
        for name in [n for n, c in self.delta_channels.items() if c == coll]:
            del self.delta_channels[name]
        self.query_channels.pop(coll, None)

    def release_partitions(self, request: querynode_pb2.ReleasePartitionsRequest) -> None:
        """Drop the partitions' segments and their share of DM watches.

        A DM watch serving only released partitions is dropped; one serving
        the whole collection stays. Delta and query channels belong to the
        collection and stay until ReleaseCollection.
        """
        coll = request.collection_id
        _positive("collection_id", coll)
        parts = set(_ids("partition_ids", request.partition_ids, required=True))
        self.touched(coll)
        self._drop_segments(
            [sid for sid, s in self.segments.items() if s.collection_id == coll and s.partition_id in parts]
        )
        for name, watch in list(self.dm_channels.items()):
            if watch.collection_id == coll and watch.partition_ids:
                watch.partition_ids -= parts
                if not watch.partition_ids:
                    del self.dm_channels[name]

    # ----- reads ---------------------------------------------------------------
    def segment_infos(self, segment_ids: Iterable[int], collection_id: int) -> list[data_pb2.SegmentInfo]:
        """The held segments asked for (all when ``segment_ids`` is empty), by id; shared messages (see
        ``_protos_of``): the answer copies them."""
        ids = list(segment_ids)
        held = self.segments
        if not ids:  # every held segment (a distribution): the keys are the ids, sorted in C
            in_order = [held[sid] for sid in sorted(held)]
            return self._protos_of(
                in_order if not collection_id else [s for s in in_order if s.collection_id == collection_id])
        chosen = [held[s] for s in ids if s in held]
        if collection_id:
            chosen = [s for s in chosen if s.collection_id == collection_id]
        return self._protos_of(sorted(chosen, key=lambda s: s.segment_id))

    def _protos_of(self, segments: Iterable[HeldSegment]) -> list[data_pb2.SegmentInfo]:
        """``segments`` as reads report them, each built once per held segment and node id; shared between reads
        (they copy them into their answers): not to be changed by the caller."""
        node = self.node_id
        if node != self._protos_node:  # a restarted node registering under a new id answers with it
            self._protos.clear()
            self._protos_node = node
        cache = self._protos
        out = []
        for seg in segments:
            cached = cache.get(seg.segment_id)
            if cached is None or cached[0] is not seg:  # not built yet, or for a segment held before under that id
                cached = cache[seg.segment_id] = (seg, seg.to_proto(node))
            out.append(cached[1])
        return out

    def channels(self) -> list[querynode_pb2.WatchedChannel]:
        out = [
            querynode_pb2.WatchedChannel(
                collection_id=w.collection_id,
                channel_name=name,
                kind=querynode_pb2.CHANNEL_KIND_DM,
                partition_ids=sorted(w.partition_ids),
            )
            for name, w in sorted(self.dm_channels.items())
        ]
        out += [
            querynode_pb2.WatchedChannel(collection_id=c, channel_name=name, kind=querynode_pb2.CHANNEL_KIND_DELTA)
            for name, c in sorted(self.delta_channels.items())
        ]
        out += [
            querynode_pb2.WatchedChannel(collection_id=c, channel_name=q, kind=querynode_pb2.CHANNEL_KIND_QUERY)
            for c, (q, _result) in sorted(self.query_channels.items())
        ]
        return out

    def segment_groups(self, left_out: Iterable[int] = ()) -> list[querynode_pb2.SegmentIdGroup]:
        """Held segment ids by (collection, partition), sorted (``GetDataDistribution`` with ``segment_ids_only``),
        but for the collections ``left_out``."""
        groups: dict[tuple[int, int], list[int]] = {}
        skip = set(left_out)
        if skip and skip.issuperset(self.versions):  # every collection held here is left out: no loop over them
            return []
        for sid, seg in self.segments.items():
            if skip and seg.collection_id in skip:
                continue
            groups.setdefault((seg.collection_id, seg.partition_id), []).append(sid)
        return [querynode_pb2.SegmentIdGroup(collection_id=c, partition_id=p, segment_ids=sorted(ids))
                for (c, p), ids in sorted(groups.items())]

    def unchanged(self, incarnation: int, known: Mapping[int, int]) -> set[int]:
        """The collections of ``known`` (collection -> version, from this node's ``incarnation``) whose version has
        not moved since: their segment groups may be left out of a distribution. None from another incarnation."""
        if incarnation != self.incarnation:
            return set()
        versions = self.versions
        return {cid for cid, version in known.items() if version and versions.get(cid) == version}

    def distribution(self, *, ids_only: bool = False, incarnation: int = 0,
                     known: Mapping[int, int] | None = None,
                     skip: Iterable[int] = ()) -> querynode_pb2.GetDataDistributionResponse:
        """What the node holds; with ``ids_only``, the groups of the ``known`` collections whose version did not
        move leave out (``unchanged``), and those of the ``skip`` collections (the asker does not compare them).
        Versions and channels are always answered in full."""
        left_out = self.unchanged(incarnation, known) if ids_only and known else set()
        if ids_only:
            left_out.update(skip)
        return querynode_pb2.GetDataDistributionResponse(
            status=ok_status(),
            node_id=self.node_id,
            segments=[] if ids_only else self.segment_infos([], 0),
            segment_groups=self.segment_groups(left_out) if ids_only else [],
            incarnation=self.incarnation,
            versions=[querynode_pb2.CollectionVersion(collection_id=c, version=v)
                      for c, v in sorted(self.versions.items())],
            channels=self.channels(),
            memory_used=self.memory_used,
            memory_capacity=self.capacity_bytes,
            highest_fence=querynode_pb2.CoordFence(
                leader_revision=self.fence.leader_revision, coordinator_id=self.fence.coordinator_id
            ),
        )
