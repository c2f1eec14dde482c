"""How much of each loaded collection online query nodes serve, per partition and per replica.

A copy counts only when query meta records it on a node that is online now (and, for a node that was online when
this leader took over, has answered it: ``cluster.nodes``) and serves that copy's replica (any node for a
collection loaded before replicas). Meta records a copy once its node answered the load, and a lost
node's copies stop counting the moment its session is gone (the node is offline at once, before any write), so
what is derived here is what nodes hold, give or take a reply in flight. The target is the catalog's: every
sealed segment of the loaded partitions and every DM channel of the collection (the followed catalog copy,
``catalog.targets``); without that copy, meta's own records stand in for it, and the persisted percentages (which
the checker counts against the catalog) keep the shown value honest (``shown_collection`` takes the lower).

Why cached and not kept up to date write by write: a load's save path is the hottest code of the coordinator
(bench_load), and a count per (partition, replica) on it would cost every load for the benefit of a few reads.
A collection's figures are recomputed when its records, its target or the set of online nodes changed; each
recomputation counts records by their shared placement (``SegmentTable`` keeps one tuple per distinct place), so
a million segments cost one pass in C over their ids, not a Python step per segment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from proto import data_pb2
from querycoord.common.partition_state import IN_MEMORY, PARTIAL
from querycoord.common.replica_number import joining_replica_ids
from querycoord.querymeta.copies import copy_message
from querycoord.querymeta.records import collection_percentage

if TYPE_CHECKING:
    from querycoord.catalog.targets import CatalogTargets
    from querycoord.querymeta import QueryMeta


GREEN, YELLOW, RED = "green", "yellow", "red"
# The name of ``placed``'s counts among the segment records' views (``QueryMeta.segment_view``).
PLACED = "served.placed"
Place = tuple[int, int, tuple[int, ...]]
HEALTH_STATES = (GREEN, YELLOW, RED)


def _percentage(held: int, wanted: int, whole: bool) -> int:
    """Floor of held/wanted in percent; 100 only when everything (channels included) is held."""
    pct = 100 if wanted == 0 else held * 100 // wanted
    return 99 if pct == 100 and not whole else pct


@dataclass(frozen=True, slots=True)
class ReplicaServed:
    """One replica: target segments and DM channels held by its online nodes."""

    replica_id: int
    held: int
    segments: int
    channels_held: int
    channels: int
    nodes: tuple[int, ...]  # its online nodes
    offline_nodes: tuple[int, ...]  # members that are not online

    @property
    def whole(self) -> bool:
        return self.held == self.segments and self.channels_held == self.channels

    @property
    def percentage(self) -> int:
        return _percentage(self.held, self.segments, self.whole)

    @property
    def missing_segments(self) -> int:
        return self.segments - self.held

    @property
    def missing_channels(self) -> int:
        return self.channels - self.channels_held


@dataclass(frozen=True, slots=True)
class CollectionServed:
    """A loaded collection as online nodes serve it (see module docstring)."""

    collection_id: int
    partitions: dict[int, tuple[int, int]]  # partition -> (copies held, copies wanted: segments x replicas)
    replicas: dict[int, ReplicaServed]
    segments: int  # target segments
    unserved_segments: int  # target segments held by no replica
    channels: int
    unserved_channels: int  # target DM channels watched in no replica
    target_from_catalog: bool  # False: meta's records stood in for the catalog's target
    # Replicas a grow is still adding (``replica_number.joining_replica_ids``): listed with their progress, not
    # counted in the collection's figures nor its health until the resize records them.
    joining: frozenset[int] = frozenset()

    def counted(self) -> list[ReplicaServed]:
        """The replicas the collection's figures count: all but the joining ones."""
        return [r for rid, r in self.replicas.items() if rid not in self.joining]

    @property
    def channels_whole(self) -> bool:
        return all(r.channels_held == r.channels for r in self.counted())

    def partition_percentage(self, partition_id: int) -> int:
        held, wanted = self.partitions.get(partition_id, (0, 0))
        return _percentage(held, wanted, self.channels_whole)

    @property
    def percentage(self) -> int:
        """The floor of the partitions' mean, as ``collection_percentage`` derives the persisted one."""
        if not self.partitions:
            return 0
        return sum(self.partition_percentage(p) for p in self.partitions) // len(self.partitions)

    @property
    def health(self) -> str:
        """green: every replica whole; red: some target segment or channel is held by no replica; else yellow."""
        if all(r.whole for r in self.counted()):
            return GREEN
        if self.unserved_segments or self.unserved_channels:
            return RED
        return YELLOW


class Nodes(Protocol):
    """What the view needs of the node manager: the nodes whose copies count (online, and heard from by this
    leader: ``cluster.nodes``) and a counter of their changes."""

    version: int

    def serving_ids(self) -> set[int]: ...


@dataclass(frozen=True, slots=True)
class Judge:
    """Which replicas a recorded copy counts for: those whose copy is on an online node serving that replica
    (any online node for a collection loaded before replicas). Shared by the figures here and by what
    ``served.missing`` lists, so both count alike."""

    members: dict[int, frozenset[int]]  # replica -> its nodes
    replica_ids: list[int]  # [0] for a collection loaded before replicas
    online: Set[int]

    @classmethod
    def of(cls, info: data_pb2.CollectionLoadInfo, online: Set[int]) -> Judge:
        members = {r.replica_id: frozenset(r.node_ids) for r in info.replicas}
        return cls(members, sorted(members) or [0], online)

    def good(self, flat: tuple[int, ...]) -> tuple[int, ...]:
        """Replicas whose copy in ``flat`` (replica, node, ...) counts."""
        legacy = not self.members
        return tuple(r for r, n in zip(flat[::2], flat[1::2], strict=True)
                     if r in self.replica_ids and n in self.online and (legacy or n in self.members[r]))


def placed(meta: QueryMeta, collection_id: int, partition_id: int,
           targets: CatalogTargets | None = None) -> tuple[Counter[Place | None], bool]:
    """How many of the partition's target segments share each place (collection, partition, copies) of their
    records (None: no record), and whether the target is the catalog copy's (else meta's records stand in).

    Counted by shared place, in C (see module docstring): ids of one place share one tuple object. The count
    depends on the partition's segment records and the target only, not on which nodes are online nor on the
    replicas' members: it is kept with those records (``QueryMeta.partition_view``) under the target's change mark,
    so a node coming or going, a forget (which rewrites no segment record) or a save into another partition costs
    a pass over the places, not over every segment; and a warm standby counts while it follows (``served.warm``),
    for the leader it becomes. A target segment whose record is in another partition (a catalog fix not yet
    applied) counts as unplaced: the count reads no other partition's records, and says less, never more."""
    ids: Set[int] | None = targets.partition_segment_ids(collection_id, partition_id) if targets else None
    if ids is None:
        return meta.partition_view(PLACED, collection_id, partition_id, None,
                                   lambda: Counter(map(meta.segment_places().get,
                                                       meta.partition_segment_ids(collection_id, partition_id)))), False
    assert targets is not None
    return meta.partition_view(PLACED, collection_id, partition_id, targets.change_mark(collection_id),
                               lambda: _in_partition(Counter(map(meta.segment_places().get, ids)), collection_id,
                                                     partition_id)), True


def _in_partition(counts: Counter[Place | None], collection_id: int, partition_id: int) -> Counter[Place | None]:
    """``counts`` with the places of other partitions' records counted as no place (None)."""
    for place in [p for p in counts if p is not None and (p[0] != collection_id or p[1] != partition_id)]:
        counts[None] += counts.pop(place)
    return counts


def collection_served(meta: QueryMeta, collection_id: int, online: Set[int],
                      targets: CatalogTargets | None = None) -> CollectionServed | None:
    """What online nodes serve of the collection now (see module docstring); None when it is not loaded."""
    info = meta.get_collection(collection_id)
    if info is None:
        return None
    judge = Judge.of(info, online)
    members, replica_ids, good = judge.members, judge.replica_ids, judge.good
    joining = frozenset(joining_replica_ids(info))
    counted = [r for r in replica_ids if r not in joining]
    from_catalog = targets is not None
    partitions: dict[int, tuple[int, int]] = {}
    held_by: Counter[int] = Counter()
    segments = unserved = 0
    verdicts: dict[tuple[int, ...], tuple[int, ...]] = {}
    for p in info.partitions:
        pid = p.partition_id
        by_place, catalog = placed(meta, collection_id, pid, targets)
        from_catalog = from_catalog and catalog
        count = sum(by_place.values())
        held = 0
        for place, k in by_place.items():
            if place is None:
                unserved += k
                continue
            flat = place[2]
            verdict = verdicts.get(flat)
            if verdict is None:
                verdict = verdicts[flat] = good(flat)
            for r in verdict:
                held_by[r] += k
            serving = len(verdict) if not joining else sum(1 for r in verdict if r not in joining)
            if not serving:
                unserved += k
                continue
            held += k * serving
        segments += count
        partitions[pid] = (held, count * len(counted))
    names: Iterable[str] | None = targets.dm_channels(collection_id) if targets else None
    if names is None:
        from_catalog = False
        names = sorted(meta.dm_channel_copies(collection_id))
    watches = meta.dm_channel_copies(collection_id)
    channel_held: Counter[int] = Counter()
    channels = unserved_channels = 0
    for name in names:
        channels += 1
        flat = tuple(x for r, n in sorted(watches.get(name, {}).items()) for x in (r, n))
        verdict = good(flat)
        if not any(r not in joining for r in verdict):
            unserved_channels += 1
        for r in verdict:
            channel_held[r] += 1
    replicas = {
        r: ReplicaServed(r, held_by[r], segments, channel_held[r], channels,
                         nodes=tuple(sorted(n for n in members.get(r, ()) if n in online)),
                         offline_nodes=tuple(sorted(n for n in members.get(r, ()) if n not in online)))
        for r in replica_ids
    }
    return CollectionServed(collection_id, partitions, replicas, segments, unserved, channels, unserved_channels,
                            from_catalog, joining)


def shown_collection(info: data_pb2.CollectionLoadInfo,
                     served: CollectionServed | None) -> data_pb2.CollectionLoadInfo:
    """``info`` (a persisted record) as users may see it: every percentage the lower of the persisted one and
    what online nodes serve, states to match. A copy; ``info`` is untouched."""
    out = copy_message(info)
    if served is None:
        return out
    for p in out.partitions:
        live = served.partition_percentage(p.partition_id)
        if live < p.in_memory_percentage:
            p.in_memory_percentage = live
            if p.state == IN_MEMORY:
                p.state = PARTIAL
    out.in_memory_percentage = collection_percentage(out)
    for r in out.replicas:
        live_r = served.replicas.get(r.replica_id)
        if live_r is not None:
            r.in_memory_percentage = min(r.in_memory_percentage, live_r.percentage)
    return out


class ServedView:
    """``collection_served`` of every loaded collection, cached until the collection's records, its target or
    the online nodes change (see module docstring). One per leadership."""

    def __init__(self, meta: QueryMeta, nodes: Nodes, targets: CatalogTargets | None = None):
        self.meta = meta
        self.nodes = nodes
        self.targets = targets
        self._cache: dict[int, tuple[tuple[object, ...], CollectionServed | None]] = {}
        self.computed = 0  # recomputations (tests check the cache works)

    def collection(self, collection_id: int) -> CollectionServed | None:
        key = (self.meta.change_mark(collection_id), self.nodes.version,
               self.targets.change_mark(collection_id) if self.targets is not None else None)
        hit = self._cache.get(collection_id)
        if hit is not None and hit[0] == key:
            return hit[1]
        served = collection_served(self.meta, collection_id, self.nodes.serving_ids(), self.targets)
        self.computed += 1
        if served is None:
            self._cache.pop(collection_id, None)
        else:
            self._cache[collection_id] = (key, served)
        return served

    def collections(self) -> list[CollectionServed]:
        """Every loaded collection, by id."""
        out = [self.collection(cid) for cid in self.meta.collection_ids()]
        for gone in set(self._cache) - set(self.meta.collection_ids()):
            del self._cache[gone]
        return [s for s in out if s is not None]

    def shown(self, info: data_pb2.CollectionLoadInfo) -> data_pb2.CollectionLoadInfo:
        return shown_collection(info, self.collection(info.collection_id))

    def shown_replicas(self, replicas: list[data_pb2.ReplicaInfo]) -> list[data_pb2.ReplicaInfo]:
        """``QueryMeta.replicas_of`` answers with each replica's percentage lowered to what it serves, and the
        watcher of a DM channel shown as 0 when that node does not serve now (its watch no longer counts)."""
        serving = self.nodes.serving_ids()
        for r in replicas:
            r.dm_channel_nodes[:] = [n if n in serving else 0 for n in r.dm_channel_nodes]
            served = self.collection(r.collection_id)
            live = served.replicas.get(r.replica_id) if served is not None else None
            if live is not None:
                r.in_memory_percentage = min(r.in_memory_percentage, live.percentage)
        return replicas

