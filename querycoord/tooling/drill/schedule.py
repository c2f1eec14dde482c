"""The drill's schedule: every operation, kill and pause, drawn up front from ``random.Random(seed)``.

Why up front: the schedule must be a function of the seed alone, so that a
failing seed can be replayed. If the next operation were chosen from the
answers of the previous ones, process timing (which coordinator won, how
fast a load went) would leak into the choice and the same seed would drift
into another run. The generator therefore keeps its own *predicted* load
state (as if every request succeeded) to pick sensible operations; the
runner keeps the *actual* state from the real answers.

What the seed fixes: the sequence of steps (operation kinds, collections and
partitions by index, node slots, the wait before each step), where each
leader kill happens and how (idle, right after a LoadCollection answer, or
while a LoadCollection is in flight, with its delay), node kills, etcd member
kills with their down time, and where the SIGSTOP round runs. What it does
not fix: process timing, hence which coordinator wins each election,
collection / node / task ids, the answers of conflicting requests, where
segments land and every measured duration.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from querycoord.tooling.drill.options import DrillOptions

OpKind = Literal["load", "release", "load_partitions", "release_partitions", "balance"]
KillMode = Literal["idle", "after_answer", "in_flight"]
K = TypeVar("K", bound=str)


@dataclass(frozen=True)
class Request(Generic[K]):
    """One client request of a seeded plan (this schedule, the chaos drill's plan). ``coll`` and ``parts`` are
    indices (ids exist only at run time)."""

    kind: K
    coll: int = 0
    parts: tuple[int, ...] = ()
    node_slot: int = 0


@dataclass(frozen=True)
class Op(Request[OpKind]):
    """A request of the schedule, with the leader kill attached to it if any: right after its answer, or
    ``kill_delay`` s after sending it."""

    kill: KillMode | None = None
    kill_delay: float = 0.0


@dataclass(frozen=True)
class KillLeader:
    """SIGKILL the current leader between requests."""


@dataclass(frozen=True)
class KillNode:
    """SIGKILL the query node in ``slot`` and start a new one in its place."""

    slot: int


@dataclass(frozen=True)
class EtcdKill:
    """SIGKILL one etcd member (``None``: the raft leader of the moment), restart it after ``down_s``."""

    member: int | None
    down_s: float


@dataclass(frozen=True)
class Pause:
    """The SIGSTOP round that proves fencing from etcd's history (see ``stale``)."""


Action = Op | KillLeader | KillNode | EtcdKill | Pause


@dataclass(frozen=True)
class Step:
    """Wait ``wait_s``, then do ``action``."""

    wait_s: float
    action: Action


@dataclass
class Schedule:
    seed: int
    steps: list[Step] = field(default_factory=list)

    def count(self, kind: type) -> int:
        return sum(isinstance(s.action, kind) for s in self.steps)

    @property
    def leader_kills(self) -> int:
        return self.count(KillLeader) + sum(isinstance(s.action, Op) and s.action.kill is not None
                                            for s in self.steps)

    @property
    def ops(self) -> int:
        return self.count(Op)

    def digest(self) -> str:
        """A short hash of the whole schedule: equal seeds and options print equal digests."""
        return hashlib.sha256(repr(self.steps).encode()).hexdigest()[:12]


_KILL_MODES: tuple[KillMode, ...] = ("after_answer", "in_flight", "idle")
_KILL_WEIGHTS = (0.4, 0.3, 0.3)


def make_schedule(seed: int, opts: DrillOptions) -> Schedule:
    """The schedule of ``seed`` (see module docstring); a pure function of its arguments."""
    if opts.collections < 1 or opts.partitions < 1 or opts.nodes < 1:
        raise ValueError("need at least one collection, one partition and one node")
    rng = random.Random(seed)
    n_ops = opts.op_count()
    # Specials are placed before op indices; the first two ops are plain so a leader exists and works.
    places = list(range(2, n_ops))

    def spots(k: int) -> list[int]:
        return sorted(rng.choice(places) for _ in range(k))

    kill_at = spots(opts.kills)
    kill_modes = [rng.choices(_KILL_MODES, _KILL_WEIGHTS)[0] for _ in kill_at]
    node_kill_at = spots(opts.node_kills)
    etcd_kill_at = spots(opts.etcd_kills)
    # The pause round runs in the middle third, with work before and after it.
    pause_at = sorted(rng.randrange(n_ops // 3, max(n_ops // 3 + 1, 2 * n_ops // 3)) for _ in range(opts.pauses))

    predicted: dict[int, frozenset[int] | None] = {c: None for c in range(opts.collections)}
    every = frozenset(range(opts.partitions))
    steps: list[Step] = []

    def wait() -> float:
        return round(rng.uniform(0.0, opts.max_wait_s), 3)

    for i in range(n_ops):
        for _ in range(pause_at.count(i)):
            steps.append(Step(wait(), Pause()))
        for _ in range(node_kill_at.count(i)):
            steps.append(Step(wait(), KillNode(rng.randrange(opts.nodes))))
        for _ in range(etcd_kill_at.count(i)):
            member = None if rng.random() < 0.4 else rng.randrange(opts.etcd_members)
            steps.append(Step(wait(), EtcdKill(member, round(rng.uniform(1.0, 4.0), 2))))
        attached: list[KillMode] = []
        for j, at in enumerate(kill_at):
            if at == i:
                if kill_modes[j] == "idle":
                    steps.append(Step(wait(), KillLeader()))
                else:
                    attached.append(kill_modes[j])
        for mode in attached:
            # A kill tied to a LoadCollection: release first if the collection is predicted loaded.
            coll = rng.randrange(opts.collections)
            if predicted[coll] is not None:
                steps.append(Step(wait(), Op("release", coll)))
                predicted[coll] = None
            delay = round(rng.uniform(0.0, 0.15), 3) if mode == "in_flight" else 0.0
            steps.append(Step(wait(), Op("load", coll, kill=mode, kill_delay=delay)))
            predicted[coll] = every
        steps.append(Step(wait(), _next_op(rng, opts, predicted, every)))
    return Schedule(seed, steps)


def _next_op(rng: random.Random, opts: DrillOptions, predicted: dict[int, frozenset[int] | None],
             every: frozenset[int]) -> Op:
    """A request that makes sense for the predicted state, and the predicted state after it."""
    if rng.random() < 0.1:
        return Op("balance", node_slot=rng.randrange(opts.nodes))
    coll = rng.randrange(opts.collections)
    state = predicted[coll]
    r = rng.random()
    if state is None:
        if r < 0.6 or opts.partitions == 1:
            predicted[coll] = every
            return Op("load", coll)
        parts = _subset(rng, sorted(every))
        predicted[coll] = frozenset(parts)
        return Op("load_partitions", coll, parts)
    if state == every and r < 0.7:
        predicted[coll] = None
        return Op("release", coll)
    missing = sorted(every - state)
    if missing and r < 0.4:
        parts = _subset(rng, missing)
        predicted[coll] = state | frozenset(parts)
        return Op("load_partitions", coll, parts)
    if r < 0.8 and state != every:
        parts = _subset(rng, sorted(state))
        left = state - frozenset(parts)
        predicted[coll] = left or None
        return Op("release_partitions", coll, parts)
    predicted[coll] = None
    return Op("release", coll)


def _subset(rng: random.Random, items: list[int]) -> tuple[int, ...]:
    k = rng.randint(1, len(items))
    return tuple(sorted(rng.sample(items, k)))


def describe(action: Action) -> str:
    """One line for the table and logs."""
    if isinstance(action, Op):
        parts = f" partitions#{list(action.parts)}" if action.parts else ""
        target = f"node-slot {action.node_slot}" if action.kind == "balance" else f"coll#{action.coll}{parts}"
        kill = f" + kill leader ({action.kill}{f' {action.kill_delay:.3f}s' if action.kill == 'in_flight' else ''})" \
            if action.kill else ""
        return f"{action.kind} {target}{kill}"
    if isinstance(action, KillLeader):
        return "kill leader (idle)"
    if isinstance(action, KillNode):
        return f"kill node-slot {action.slot}"
    if isinstance(action, EtcdKill):
        who = "raft leader" if action.member is None else f"m{action.member}"
        return f"kill etcd {who} for {action.down_s:.2f}s"
    return "pause leader (SIGSTOP)"
