"""What each (collection, replica) unit lacks, by the nodes' own reports, and whether it could be placed.

The drills judge the coordinator's parking (DESIGN rule 9) from outside: a unit that lacks copies while it could
be placed must be held again soon (``samples.UnitClock``), and one that cannot be placed is excused from the
"every segment once in each replica" check, provided nothing shows it whole (``samples.false_full``). Both need
an answer to "could it be placed?" that does not come from the coordinator under test, so it is computed here
from plain data: the catalog's target with sizes, the replicas' node lists, what each online node reports
holding, and each node's reported memory use and capacity.

The rule is the coordinator's (``querycoord.task.units.place_unit`` over ``cluster.allocator``), written out
again on purpose: a unit goes on its replica's online nodes, else on those plus every spare (an online node in no
replica of the collection); segments largest first, each on the candidate whose memory rate after it is lowest
and stays under the memory limit; channels need only a candidate; all or nothing per unit. Units are weighed in
(collection, replica) order with shared usage, as one checker pass weighs them, so two units are not both given
the same free room. Being a re-statement, it is checked against the allocator in tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from querycoord.tooling.drill.invariants import NodeView

PLACEABLE = "placeable"
NO_NODE = "no_node"
NO_ROOM = "no_room"
#: The coordinator's default share of a node's capacity that segments may use (``SchedulerConfig.memory_limit``).
MEMORY_LIMIT = 0.9


@dataclass(frozen=True)
class TargetView:
    """What a loaded collection must hold in each replica: segment id -> accounted size, and its DM channels."""

    segments: Mapping[int, int]
    channels: frozenset[str]


@dataclass(frozen=True)
class Lack:
    """What one replica's online nodes do not hold of the target."""

    segments: Mapping[int, int] = field(default_factory=dict)  # segment id -> size
    channels: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.segments or self.channels)

    def describe(self) -> str:
        return f"{len(self.segments)} segments ({sum(self.segments.values()) / (1 << 20):.1f} MiB), " \
               f"{len(self.channels)} DM channels"


@dataclass(frozen=True)
class Room:
    """A node's memory as it reports it (``GetDataDistribution``: memory_used, memory_capacity)."""

    used: int
    capacity: int


def lack_of(cid: int, target: TargetView, nodes: AbstractSet[int], views: Mapping[int, NodeView | None]
            ) -> Lack | None:
    """What the online ``nodes`` of one replica do not hold of ``target``; None when one of them did not report
    (what it holds is unknown, so nothing can be said of the replica)."""
    segs: set[int] = set()
    chans: set[str] = set()
    for n in nodes:
        v = views.get(n)
        if v is None:
            return None
        segs.update(sid for sid, (c, _p) in v.segments.items() if c == cid)
        chans.update(ch for c, ch in v.dm_channels if c == cid)
    return Lack({sid: size for sid, size in target.segments.items() if sid not in segs},
                frozenset(target.channels - chans))


@dataclass(frozen=True)
class Unit:
    """One (collection, replica) that lacks something, with where it may go."""

    collection_id: int
    replica_id: int
    lack: Lack
    own: tuple[int, ...]  # the replica's online nodes
    spares: tuple[int, ...]  # online nodes in no replica of the collection

    @property
    def key(self) -> tuple[int, int]:
        return (self.collection_id, self.replica_id)


def units_of(cid: int, target: TargetView, replicas: Mapping[int, AbstractSet[int]], online: AbstractSet[int],
             views: Mapping[int, NodeView | None]) -> tuple[list[Unit], list[int]]:
    """The units of one collection that lack something, and the replicas that cannot be judged (a node of theirs
    did not report). ``online``: the nodes whose session is registered now."""
    members = {n for ns in replicas.values() for n in ns}
    spares = tuple(sorted(n for n in online if n not in members))
    out: list[Unit] = []
    unknown: list[int] = []
    for rid, nodes in sorted(replicas.items()):
        own = frozenset(n for n in nodes if n in online)
        lack = lack_of(cid, target, own, views)
        if lack is None:
            unknown.append(rid)
        elif lack:
            out.append(Unit(cid, rid, lack, tuple(sorted(own)), spares))
    return out, unknown


def _fits(sizes: Sequence[tuple[int, int]], candidates: Sequence[int], rooms: Mapping[int, Room],
          used: dict[int, int], limit: float) -> bool:
    """The allocator's rule (module docstring) on ``candidates``; ``used`` is updated only when all fit."""
    trial = {n: used.get(n, rooms[n].used) for n in candidates if n in rooms}
    cands = [n for n in candidates if n in rooms and rooms[n].capacity > 0]
    if not cands:
        return False
    for _sid, size in sorted(sizes, key=lambda s: s[1], reverse=True):
        best, best_rate = 0, 2.0
        for n in cands:
            cap = rooms[n].capacity
            if trial[n] / cap >= limit:
                continue
            rate = (trial[n] + size) / cap
            if rate < limit and rate < best_rate:
                best, best_rate = n, rate
        if not best:
            return False
        trial[best] += size
    used.update(trial)
    return True


def weigh(units: Sequence[Unit], rooms: Mapping[int, Room], *, limit: float = MEMORY_LIMIT
          ) -> dict[tuple[int, int], str]:
    """Per unit: ``PLACEABLE``, ``NO_NODE`` (no online node of its replica and no spare) or ``NO_ROOM``, weighed
    in (collection, replica) order with shared usage (module docstring). A node missing from ``rooms`` (it did
    not report) takes nothing."""
    used: dict[int, int] = {}
    out: dict[tuple[int, int], str] = {}
    for u in sorted(units, key=lambda u: u.key):
        sizes = sorted(u.lack.segments.items())
        wider = tuple(sorted({*u.own, *u.spares}))
        if not wider:
            out[u.key] = NO_NODE
        elif (u.own and _fits(sizes, u.own, rooms, used, limit)) or _fits(sizes, wider, rooms, used, limit):
            out[u.key] = PLACEABLE
        else:
            out[u.key] = NO_ROOM
    return out


__all__ = ["MEMORY_LIMIT", "NO_NODE", "NO_ROOM", "PLACEABLE", "Lack", "Room", "TargetView", "Unit", "lack_of",
           "units_of", "weigh"]
