"""The chaos drill's pure parts: the seeded plan of phases, and the oracle of admissible final states.

**The plan** (``make_plan``) is drawn up front from ``random.Random(seed)``,
for the same reason as the failover drill's schedule (``schedule``): a
failing seed must replay the same operations, so no choice may depend on
answers or process timing. A plan is a list of *phases*; each phase has one
sequence of items per concurrent client and one or two faults injected while
those items run. An item is one request, or several started at once on
different clients: the same request twice (a duplicate), two requests that
conflict (load vs release of one collection, partitions loaded vs released),
or one request abandoned by its client after a few milliseconds and sent
again, twice (a retry). Catalog changes (new sealed segments, a compaction of
two segments into one) become handoffs in the coordinator. With ``--capacity
tight`` the plan also has compaction chains (two segments compacted into one,
which is at once compacted with a third: its handoff names a source that was
itself a compaction result), query nodes restarted under their fixed ids and
whole-cluster restarts.

**The oracle** (``admissible_states``): with concurrent clients there is no
single expected final state. Every request that took effect did so at one
moment between its sending and its answer (its linearization point), so the
admissible final states of a collection are those of every order of its
requests that respects real time (A before B when A was answered before B
was sent). A request answered SUCCESS took effect; one refused with a clear
"no" (CONFLICT, NOT_FOUND...) did not; one whose answer leaves it open
(TIMEOUT, META_UNAVAILABLE, no answer, abandoned by its client) may have
taken effect at any moment after it was sent, or not at all. The drill then
checks that the state it finds is one of those; the invariants checker does
the rest.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from querycoord.tooling.drill.options import ChaosOptions
from querycoord.tooling.drill.schedule import Request

# ----- the plan ---------------------------------------------------------------------------------------------------
OpKind = Literal["load", "release", "load_partitions", "release_partitions", "balance", "add_segments", "compact",
                 "compact_chain"]
Pattern = Literal["plain", "duplicate", "retry", "conflict"]
FaultKind = Literal[
    "none", "leader_kill", "leader_pause", "leader_etcd_cut", "leader_etcd_stall", "standby_etcd_cut",
    "node_kill", "node_add", "node_etcd_cut", "node_link_cut", "node_link_stall", "node_restart", "cluster_restart",
]
#: Faults that partition a link through a proxy (the JSON line's ``partitions``).
PARTITION_FAULTS: frozenset[str] = frozenset({"leader_etcd_cut", "leader_etcd_stall", "standby_etcd_cut",
                                              "node_etcd_cut", "node_link_cut", "node_link_stall"})
#: QueryCoord requests the oracle models (the others change no load state).
LOAD_STATE_KINDS: frozenset[str] = frozenset({"load", "release", "load_partitions", "release_partitions"})


@dataclass(frozen=True)
class ChaosOp(Request[OpKind]):
    """One request of the plan."""

    count: int = 1  # segments added by add_segments


@dataclass(frozen=True)
class Item:
    """``ops`` started together on different clients, ``wait_s`` after the worker's previous item."""

    wait_s: float
    ops: tuple[ChaosOp, ...]
    pattern: Pattern = "plain"
    abandon_s: float = 0.0  # retry: the first send is abandoned by its client after this long


@dataclass(frozen=True)
class Fault:
    """A fault injected ``at_s`` after the phase starts and healed (or resumed) ``hold_s`` later."""

    kind: FaultKind
    at_s: float = 0.0
    hold_s: float = 0.0
    slot: int = 0  # which node / standby, modulo the live ones
    blackhole: bool = False  # a cut that holds new connections silently instead of resetting them


@dataclass(frozen=True)
class Phase:
    index: int
    workers: tuple[tuple[Item, ...], ...]
    faults: tuple[Fault, ...]

    @property
    def ops(self) -> int:
        return sum(len(item.ops) for items in self.workers for item in items)


@dataclass
class ChaosPlan:
    seed: int
    phases: list[Phase] = field(default_factory=list)

    @property
    def ops(self) -> int:
        return sum(p.ops for p in self.phases)

    def count(self, *kinds: str) -> int:
        return sum(f.kind in kinds for p in self.phases for f in p.faults)

    def digest(self) -> str:
        """A short hash of the whole plan: equal seeds and options print equal digests."""
        return hashlib.sha256(repr(self.phases).encode()).hexdigest()[:12]


# The first phases cover the faults that matter most, so that a short run (pytest's) drills each of them:
# above all a leader cut off from etcd that still reaches the nodes (what fencing exists for).
_FIRST_FAULTS: tuple[FaultKind, ...] = ("leader_etcd_cut", "leader_kill", "node_link_cut", "leader_pause",
                                        "node_kill", "leader_etcd_stall", "node_etcd_cut", "node_add")
_FAULTS: tuple[FaultKind, ...] = ("leader_kill", "leader_pause", "leader_etcd_cut", "leader_etcd_stall",
                                  "standby_etcd_cut", "node_kill", "node_add", "node_etcd_cut", "node_link_cut",
                                  "node_link_stall", "none")
_FAULT_WEIGHTS = (12, 8, 14, 8, 4, 8, 8, 8, 10, 6, 4)
_SECOND_FAULTS: tuple[FaultKind, ...] = ("node_kill", "node_add", "node_link_cut", "node_etcd_cut", "leader_kill")
# ``--capacity tight``: nodes restarted under their fixed ids and whole-cluster restarts join the faults, first of
# all (a short run drills each), and compaction chains the catalog changes.
_TIGHT_FIRST: tuple[FaultKind, ...] = ("node_kill", "node_restart", "cluster_restart", "leader_etcd_cut", "node_add",
                                       "leader_kill", "node_restart", "node_link_cut")
_TIGHT_FAULTS: tuple[FaultKind, ...] = (*_FAULTS, "node_restart", "cluster_restart")
_TIGHT_WEIGHTS = (*_FAULT_WEIGHTS, 12, 3)
_TIGHT_SECOND: tuple[FaultKind, ...] = (*_SECOND_FAULTS, "node_restart")


def make_plan(seed: int, opts: ChaosOptions) -> ChaosPlan:
    """The plan of ``seed`` (see module docstring); a pure function of its arguments."""
    if opts.collections < 1 or opts.partitions < 1 or opts.clients < 1 or opts.ops < 1:
        raise ValueError("need at least one op, collection, partition and client")
    rng = random.Random(seed)
    gen = _OpGen(rng, opts)
    plan = ChaosPlan(seed)
    first, kinds, weights, second = ((_TIGHT_FIRST, _TIGHT_FAULTS, _TIGHT_WEIGHTS, _TIGHT_SECOND) if opts.tight
                                     else (_FIRST_FAULTS, _FAULTS, _FAULT_WEIGHTS, _SECOND_FAULTS))
    left = opts.ops
    while left > 0:
        index = len(plan.phases)
        budget = min(left, rng.randint(opts.min_phase_ops, opts.max_phase_ops))
        workers: list[list[Item]] = [[] for _ in range(opts.clients)]
        n = 0
        while n < budget:
            item = gen.item(budget - n)
            workers[rng.randrange(opts.clients)].append(item)
            n += len(item.ops)
        kind = first[index] if index < len(first) else rng.choices(kinds, weights)[0]
        faults = [_fault(rng, kind, opts.ttl)]
        if index >= len(first) and rng.random() < 0.25:
            faults.append(_fault(rng, rng.choice(second), opts.ttl))
        plan.phases.append(Phase(index, tuple(tuple(w) for w in workers), tuple(f for f in faults
                                                                                 if f.kind != "none")))
        left -= n
    return plan


def _fault(rng: random.Random, kind: FaultKind, ttl: float) -> Fault:
    """Timing of one fault: injected while the phase's first requests are in flight; most partitions and
    pauses outlast the session TTL (a takeover), some are shorter blips that must change nothing."""
    at = round(rng.uniform(0.1, 1.2), 3)
    slot = rng.randrange(16)
    if kind in ("leader_etcd_cut", "leader_etcd_stall", "standby_etcd_cut", "node_etcd_cut"):
        hold = rng.uniform(0.3, 0.6 * ttl) if rng.random() < 0.2 else rng.uniform(ttl + 0.5, ttl + 3.0)
        return Fault(kind, at, round(hold, 3), slot, blackhole=kind.endswith("_cut") and rng.random() < 0.3)
    if kind == "leader_pause":
        return Fault(kind, at, round(rng.uniform(ttl + 0.5, ttl + 2.5), 3), slot)
    if kind in ("node_link_cut", "node_link_stall"):
        return Fault(kind, at, round(rng.uniform(1.0, 5.0), 3), slot, blackhole=kind == "node_link_cut"
                     and rng.random() < 0.3)
    if kind == "node_restart":  # down for a moment or past its session TTL, then back under its id
        return Fault(kind, at, round(rng.choice((0.0, rng.uniform(0.2, ttl + 1.0))), 3), slot)
    if kind == "cluster_restart":  # everything down (etcd too) for a moment, then back on its data dirs
        return Fault(kind, at, round(rng.uniform(0.5, 2.0), 3), slot)
    return Fault(kind, at, 0.0, slot)


class _OpGen:
    """Requests that make sense for a *predicted* load state (as if every request succeeded), so that most
    are not CONFLICTs; the real state comes from the answers."""

    def __init__(self, rng: random.Random, opts: ChaosOptions):
        self.rng = rng
        self.opts = opts
        self.every = frozenset(range(opts.partitions))
        self.predicted: dict[int, frozenset[int] | None] = {c: None for c in range(opts.collections)}

    def wait(self) -> float:
        return round(self.rng.uniform(0.0, self.opts.max_wait_s), 3)

    def item(self, room: int) -> Item:
        r = self.rng.random()
        if room >= 2 and r < 0.13:
            op = self._state_op()
            return Item(self.wait(), (op, op), "duplicate")
        if room >= 2 and r < 0.27:
            return Item(self.wait(), self._conflict(), "conflict")
        if r < 0.40:
            return Item(self.wait(), (self._state_op(),), "retry", round(self.rng.uniform(0.005, 0.25), 3))
        if r < 0.48:
            return Item(self.wait(), (self._catalog_op(),))
        if r < 0.54:
            return Item(self.wait(), (ChaosOp("balance", node_slot=self.rng.randrange(16)),))
        return Item(self.wait(), (self._state_op(),))

    def _subset(self, items: Iterable[int]) -> tuple[int, ...]:
        pool = sorted(items)
        return tuple(sorted(self.rng.sample(pool, self.rng.randint(1, len(pool)))))

    def _state_op(self) -> ChaosOp:
        """Like the failover schedule's ``_next_op``: loads of released collections, releases of loaded ones."""
        rng, every = self.rng, self.every
        coll = rng.randrange(self.opts.collections)
        state = self.predicted[coll]
        r = rng.random()
        if state is None:
            if r < 0.55 or self.opts.partitions == 1:
                self.predicted[coll] = every
                return ChaosOp("load", coll)
            parts = self._subset(every)
            self.predicted[coll] = frozenset(parts)
            return ChaosOp("load_partitions", coll, parts)
        if state == every and r < 0.6:
            self.predicted[coll] = None
            return ChaosOp("release", coll)
        missing = sorted(every - state)
        if missing and r < 0.45:
            parts = self._subset(missing)
            self.predicted[coll] = state | frozenset(parts)
            return ChaosOp("load_partitions", coll, parts)
        if state != every and r < 0.85:
            parts = self._subset(state)
            self.predicted[coll] = (state - frozenset(parts)) or None
            return ChaosOp("release_partitions", coll, parts)
        self.predicted[coll] = None
        return ChaosOp("release", coll)

    def _conflict(self) -> tuple[ChaosOp, ChaosOp]:
        """Two requests about one collection whose outcome depends on which the coordinator takes first."""
        rng, every = self.rng, self.every
        coll = rng.randrange(self.opts.collections)
        parts = sorted(every)
        a = self._subset(parts)
        b = self._subset(parts)
        pairs = [
            (ChaosOp("load", coll), ChaosOp("release", coll)),
            (ChaosOp("load_partitions", coll, a), ChaosOp("release_partitions", coll, b)),
            (ChaosOp("load", coll), ChaosOp("load_partitions", coll, a)),
            (ChaosOp("load_partitions", coll, a), ChaosOp("load_partitions", coll, b)),
            (ChaosOp("release_partitions", coll, a), ChaosOp("release", coll)),
        ]
        pair = rng.choice(pairs)
        if rng.random() < 0.5:
            pair = (pair[1], pair[0])
        # Either may win: predict the second (the generator only needs plausible requests afterwards).
        last = pair[1]
        if last.kind == "load":
            self.predicted[coll] = every
        elif last.kind == "load_partitions":
            self.predicted[coll] = frozenset(last.parts) | (self.predicted[coll] or frozenset())
        else:
            self.predicted[coll] = None
        return pair

    def _catalog_op(self) -> ChaosOp:
        """New sealed segments or a compaction, mostly in a collection predicted loaded (a handoff)."""
        rng = self.rng
        loaded = [c for c, s in self.predicted.items() if s is not None]
        coll = rng.choice(loaded) if loaded and rng.random() < 0.75 else rng.randrange(self.opts.collections)
        part = rng.randrange(self.opts.partitions)
        if rng.random() < 0.5:
            return ChaosOp("add_segments", coll, (part,), count=rng.randint(1, 3))
        if self.opts.tight and rng.random() < 0.5:
            return ChaosOp("compact_chain", coll, (part,))
        return ChaosOp("compact", coll, (part,))


def describe_op(op: ChaosOp) -> str:
    if op.kind == "balance":
        return f"balance node-slot {op.node_slot}"
    parts = f" partitions#{list(op.parts)}" if op.parts else ""
    extra = f" x{op.count}" if op.kind == "add_segments" else ""
    return f"{op.kind} coll#{op.coll}{parts}{extra}"


def describe_fault(f: Fault) -> str:
    hold = f" for {f.hold_s:.2f}s" if f.hold_s else ""
    bh = " (blackhole)" if f.blackhole else ""
    return f"{f.kind}{bh} at +{f.at_s:.2f}s{hold}"


# ----- the oracle -------------------------------------------------------------------------------------------------
StateKind = Literal["released", "collection", "partitions"]
State = tuple[StateKind, frozenset[int]]
RELEASED: State = ("released", frozenset())
Effect = Literal["yes", "no", "maybe"]
INF = float("inf")

#: Answers that say a request changed nothing, per kind of request.
NO_EFFECT_ANY = frozenset({"CONFLICT", "NOT_FOUND", "ILLEGAL_ARGUMENT", "REQUEST_TOO_LARGE", "NOT_READY",
                           "ALREADY_EXISTS"})
# RESOURCE_EXHAUSTED: refused by load admission (not enough query node memory), before anything is written.
NO_EFFECT_LOAD = NO_EFFECT_ANY | {"NO_AVAILABLE_NODE", "CANCELLED", "RESOURCE_EXHAUSTED"}


def effect_of(kind: str, outcome: str, code: str) -> Effect:
    """Whether a request took effect, from its answer (``outcome``: success / error / unanswered / abandoned)."""
    if outcome == "success":
        return "yes"
    if outcome == "error":
        no = NO_EFFECT_LOAD if kind in ("load", "load_partitions") else NO_EFFECT_ANY
        if code in no:
            return "no"
    return "maybe"


@dataclass(frozen=True)
class Attempt:
    """One request about a collection's load state, as the oracle sees it."""

    seq: int
    kind: str
    partitions: frozenset[int]  # partition ids (empty for load / release)
    sent: float
    answered: float  # INF when the answer leaves the effect open (see ``effect_of``)
    effect: Effect
    label: str = ""


def apply(state: State, kind: str, parts: frozenset[int], every: frozenset[int]) -> State:
    """The load state after a request that took effect in ``state``.

    Requests the coordinator would refuse in that state (LoadPartitions of a
    collection loaded as a whole, ReleasePartitions of one) change nothing.
    """
    st, held = state
    if kind == "load":
        return ("collection", every) if st != "partitions" else state
    if kind == "release":
        return RELEASED
    if kind == "load_partitions":
        return state if st == "collection" else ("partitions", held | parts)
    if kind == "release_partitions":
        if st != "partitions":
            return state
        left = held - parts
        return ("partitions", left) if left else RELEASED
    return state


def admissible_states(start: Iterable[State], attempts: Sequence[Attempt], every: frozenset[int],
                      limit: int = 200_000) -> set[State] | None:
    """Every final state some real-time-respecting order of ``attempts`` explains (see module docstring).

    None when the search exceeds ``limit`` (too many overlapping requests to enumerate): then any state is
    accepted and the drill says so.
    """
    todo = [a for a in attempts if a.effect != "no"]
    n = len(todo)
    # must[i]: attempts that precede i in real time (answered before i was sent) and take effect for sure.
    before = [frozenset(j for j in range(n) if todo[j].answered < todo[i].sent) for i in range(n)]
    full = frozenset(range(n))
    seen: set[tuple[frozenset[int], State]] = set()
    out: set[State] = set()
    stack = [(frozenset[int](), s) for s in set(start)]
    while stack:
        done, state = stack.pop()
        if (done, state) in seen:
            continue
        seen.add((done, state))
        if len(seen) > limit:
            return None
        if done == full:
            out.add(state)
            continue
        for i in range(n):
            if i in done or not before[i] <= done:
                continue
            a = todo[i]
            stack.append((done | {i}, apply(state, a.kind, a.partitions, every)))
            if a.effect == "maybe":
                stack.append((done | {i}, state))
    return out


def state_name(state: State) -> str:
    kind, parts = state
    return kind if kind != "partitions" else f"partitions {sorted(parts)}"


__all__ = [
    "INF",
    "LOAD_STATE_KINDS",
    "PARTITION_FAULTS",
    "RELEASED",
    "Attempt",
    "ChaosOp",
    "ChaosPlan",
    "Fault",
    "FaultKind",
    "Item",
    "Phase",
    "State",
    "admissible_states",
    "apply",
    "describe_fault",
    "describe_op",
    "effect_of",
    "make_plan",
    "state_name",
]
