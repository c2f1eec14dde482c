"""The invariants the chaos drill samples continuously, judged over plain data. All must stay 0.

* ``false_full_samples``: a sample in which the leader shows a collection at 100 %, or a replica at 100 %,
  while a copy of its target (a sealed segment of a loaded partition, a DM channel) is held by no online node
  of that replica, as the nodes themselves report (``false_full``). Online means: its session is registered,
  or went away less than ``SESSION_GRACE`` before the leader answered (the leader learns of a lost session from
  a watch, which may take that long). A replica with a node that is online but whose holdings are unknown (its
  process was killed and its session has not lapsed yet, or it did not answer) is not judged: what the dead
  process held is not knowable, and the leader cannot know better before the session lapses.
* ``blocked_units``: a (collection, replica) unit that could be placed (``placement.weigh``) and lacked copies
  for ``UNIT_WINDOW`` seconds in a row of calm (``UnitClock``). Calm: no fault window open (``Disturbances``),
  since the last one closed; a unit that waits through a leader change, a cut link or a restart is the fault's
  doing, not a blocked unit.
* ``blocked_releases``: a ReleaseCollection / ReleasePartitions call answered TIMEOUT, or not answered within
  ``RELEASE_BOUND`` seconds beyond the fault windows it overlapped, while some unit waited for room
  (``blocked_releases``): a release must never wait on a unit that waits for memory (DESIGN rule 9).

The drill's sampler (``sampler``) collects the data; the model test (tests/test_model_chaos.py) and
tests/truth.py use the same judgements.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from proto import data_pb2
from querycoord.tooling.drill.invariants import NodeView
from querycoord.tooling.drill.placement import PLACEABLE, TargetView, lack_of

#: Seconds a lost session may go unseen by the leader.
SESSION_GRACE = 1.0
#: Seconds of calm within which a unit that can be placed must be held again.
UNIT_WINDOW = 10.0
#: Seconds (beyond fault windows) within which a release must be answered.
RELEASE_BOUND = 10.0


# ----- false full ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShownReplica:
    replica_id: int
    percentage: int
    node_ids: frozenset[int]


@dataclass(frozen=True)
class Shown:
    """One loaded collection as one answer of the leader shows it (``surface``: the RPC that answered)."""

    collection_id: int
    percentage: int
    partitions: frozenset[int]
    replicas: tuple[ShownReplica, ...]
    surface: str = "ShowCollections"


def false_full(shown: Shown, target: TargetView, views: Mapping[int, NodeView | None],
               online: AbstractSet[int]) -> list[str]:
    """What ``shown`` claims whole that the nodes do not hold (empty: nothing false).

    ``target``: what every replica must hold; ``views``: what each node reports (None: unknown); ``online``: the
    nodes that count as online at the answer (module docstring). A replica shown at 100 % must lack nothing;
    a collection shown at 100 % must have no judged replica that lacks something.
    """
    out: list[str] = []
    lacking: dict[int, str] = {}
    for r in shown.replicas:
        lack = lack_of(shown.collection_id, target, r.node_ids & online, views)
        if lack is None or not lack:
            continue
        lacking[r.replica_id] = lack.describe()
        if r.percentage >= 100:
            out.append(f"{shown.surface}: replica {r.replica_id} of collection {shown.collection_id} shown at "
                       f"{r.percentage} % while its online nodes {sorted(r.node_ids & online)} lack "
                       f"{lack.describe()}: e.g. segments {sorted(lack.segments)[:4]}, channels "
                       f"{sorted(lack.channels)[:2]}")
    if shown.percentage >= 100 and lacking:
        out.append(f"{shown.surface}: collection {shown.collection_id} shown at {shown.percentage} % while "
                   + "; ".join(f"replica {r} lacks {what}" for r, what in sorted(lacking.items())))
    return out


class Sessions:
    """When each query node's session was last seen registered and first seen gone (drill seconds), to tell
    which nodes count as online at a given moment (``online_at``)."""

    def __init__(self, grace: float = SESSION_GRACE):
        self.grace = grace
        self.present: dict[int, int] = {}  # node -> create revision of its session, as last read
        self.gone_since: dict[int, float] = {}  # node -> when its session was first read as gone
        self.reborn_since: dict[int, float] = {}  # node -> when a new incarnation (create revision) was first read

    def observe(self, t: float, registered: Mapping[int, int]) -> None:
        """A read of the registered sessions at ``t``: node -> create revision."""
        for n in set(self.present) - set(registered):
            self.gone_since.setdefault(n, t)
        for n, revision in registered.items():
            was = self.present.get(n)
            if (was is not None and was != revision) or n in self.gone_since:
                self.reborn_since[n] = t  # back under its id: the old incarnation's session was lost meanwhile
            self.gone_since.pop(n, None)
        self.present = dict(registered)

    def online_at(self, t: float) -> set[int]:
        """Registered at the last read, or read as gone less than ``grace`` before ``t``."""
        return set(self.present) | {n for n, since in self.gone_since.items() if t - since < self.grace}

    def unsure_at(self, t: float) -> set[int]:
        """Nodes back under their id less than ``grace`` before ``t``: the leader may not have seen the old
        incarnation go yet, and what that one held is not knowable, so nothing of theirs is judged."""
        return {n for n, since in self.reborn_since.items() if t - since < self.grace}


# ----- blocked units -----------------------------------------------------------------------------------------------
class Disturbances:
    """Fault windows (drill seconds): a unit's or a release's wait is not counted while one is open."""

    def __init__(self) -> None:
        self.windows: list[tuple[float, float | None]] = []  # (start, end); end None while open

    def open(self, t: float) -> int:
        self.windows.append((t, None))
        return len(self.windows) - 1

    def close(self, index: int, t: float) -> None:
        start, _ = self.windows[index]
        self.windows[index] = (start, max(start, t))

    def add(self, start: float, end: float) -> None:
        self.windows.append((start, max(start, end)))

    def calm_since(self, t: float) -> float | None:
        """None while a window holds ``t``; else when the last window before ``t`` closed (0: none)."""
        last = 0.0
        for start, end in self.windows:
            if start <= t and (end is None or t <= end):
                return None
            if end is not None and end <= t:
                last = max(last, end)
        return last

    def overlap(self, start: float, end: float) -> float:
        """Seconds of [start, end] inside some window (open windows run to ``end``)."""
        spans = sorted((max(s, start), min(e if e is not None else end, end)) for s, e in self.windows)
        total, reach = 0.0, start
        for s, e in spans:
            s = max(s, reach)
            if e > s:
                total += e - s
                reach = e
        return total


@dataclass
class _Episode:
    since: float
    reported: bool = False


class UnitClock:
    """Counts units that stay placeable and unheld for ``window`` seconds of calm (module docstring); each such
    episode of a unit once."""

    def __init__(self, window: float = UNIT_WINDOW):
        self.window = window
        self.episodes: dict[tuple[int, int], _Episode] = {}
        self.blocked: list[str] = []

    def observe(self, t: float, verdicts: Mapping[tuple[int, int], str], calm_since: float | None,
                what: Mapping[tuple[int, int], str] | None = None) -> list[str]:
        """One sample at ``t``: per lacking unit its ``placement.weigh`` verdict (units not listed lack nothing
        or were not judged). Returns the units newly found blocked."""
        new: list[str] = []
        for key in [k for k in self.episodes if verdicts.get(k) != PLACEABLE]:
            del self.episodes[key]
        if calm_since is None:  # a fault window is open: no wait counts
            self.episodes.clear()
            return new
        for key, verdict in sorted(verdicts.items()):
            if verdict != PLACEABLE:
                continue
            ep = self.episodes.setdefault(key, _Episode(t))
            start = max(ep.since, calm_since)
            if not ep.reported and t - start >= self.window:
                ep.reported = True
                cid, rid = key
                detail = (f"replica {rid} of collection {cid} could be placed and lacked copies for "
                          f"{t - start:.1f}s of calm (since {start:.1f}s)"
                          + (f": {what[key]}" if what and key in what else ""))
                self.blocked.append(detail)
                new.append(detail)
        return new


# ----- blocked releases ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReleaseCall:
    label: str
    sent: float
    answered: float | None  # None: no answer
    code: str = ""


@dataclass
class RoomWaits:
    """Sample times at which some unit waited for room (a ``NO_ROOM`` verdict), with what it was."""

    times: list[float] = field(default_factory=list)
    what: list[str] = field(default_factory=list)

    def add(self, t: float, what: str) -> None:
        self.times.append(t)
        self.what.append(what)

    def during(self, start: float, end: float) -> str | None:
        for t, w in zip(self.times, self.what, strict=True):
            if start <= t <= end:
                return w
        return None


def blocked_releases(calls: Iterable[ReleaseCall], waits: RoomWaits, disturbances: Disturbances, *,
                     bound: float = RELEASE_BOUND, now: float = float("inf")) -> list[str]:
    """The release calls that waited (module docstring): TIMEOUT, or slower than ``bound`` beyond the fault
    windows they overlapped (unanswered ones up to ``now``), while a unit waited for room."""
    out: list[str] = []
    for c in calls:
        end = c.answered if c.answered is not None else now
        slow = (end - c.sent) - disturbances.overlap(c.sent, end)
        if c.code != "TIMEOUT" and slow <= bound:
            continue
        room = waits.during(c.sent, end)
        if room is None:
            continue
        answer = f"answered {c.code}" if c.answered is not None else "unanswered"
        out.append(f"release {c.label} {answer} after {end - c.sent:.1f}s ({slow:.1f}s outside fault windows) "
                   f"while a unit waited for room: {room}")
    return out


def shown_from(info: data_pb2.CollectionLoadInfo, surface: str = "ShowCollections") -> Shown:
    """A ``CollectionLoadInfo`` (ShowCollections) as ``Shown``."""
    return Shown(info.collection_id, info.in_memory_percentage, frozenset(p.partition_id for p in info.partitions),
                 replicas_from(info.replicas), surface)


def replicas_from(replicas: Iterable[data_pb2.ReplicaInfo]) -> tuple[ShownReplica, ...]:
    """``ReplicaInfo`` messages (ShowCollections, GetReplicas) as ``ShownReplica``s."""
    return tuple(ShownReplica(r.replica_id, r.in_memory_percentage, frozenset(r.node_ids)) for r in replicas)


__all__ = ["RELEASE_BOUND", "SESSION_GRACE", "UNIT_WINDOW", "Disturbances", "ReleaseCall", "RoomWaits", "Sessions",
           "Shown", "ShownReplica", "UnitClock", "blocked_releases", "false_full", "replicas_from", "shown_from"]
