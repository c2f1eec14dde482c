"""The chaos drill's records: each request as a client saw it, each phase, and the whole result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord.tooling.drill.activity import FaultRecord
from querycoord.tooling.drill.chaos_cluster import FaultCounts
from querycoord.tooling.drill.chaos_ops import ChaosPlan
from querycoord.tooling.drill.options import ChaosOptions


@dataclass
class ChaosCall:
    """One request as a client saw it; ``sent`` / ``answered`` are drill seconds (monotonic)."""

    seq: int
    phase: int
    worker: int
    group: int
    pattern: str
    method: str
    kind: str
    target: str
    cid: int = 0
    pids: tuple[int, ...] = ()
    sent: float = 0.0
    answered: float | None = None
    outcome: str = ""  # success / error / unanswered / abandoned
    code: str = ""
    reason: str = ""
    task_id: int = 0

    @property
    def elapsed(self) -> float:
        return (self.answered - self.sent) if self.answered is not None else 0.0

    def label(self) -> str:
        return f"#{self.seq} {self.method} {self.target}"


@dataclass
class PhaseReport:
    index: int
    faults: list[str] = field(default_factory=list)
    calls: int = 0
    quiesce_s: float = 0.0
    problems: list[str] = field(default_factory=list)  # new violation details of this phase
    stuck: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ChaosResult:
    options: ChaosOptions
    plan: ChaosPlan
    calls: list[ChaosCall] = field(default_factory=list)
    phases: list[PhaseReport] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    counts: FaultCounts = field(default_factory=FaultCounts)
    checker_repairs: int = 0
    stuck_ids: set[int] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)  # unique details, in the order found
    seen_in: dict[str, list[int]] = field(default_factory=dict)  # detail -> phases whose check found it
    failed_triggers: dict[int, qc.TaskInfo] = field(default_factory=dict)
    triggers_seen: int = 0
    duration_s: float = 0.0
    ops_run: int = 0
    fenced_refusals: int = 0  # lines of deposed leaders' logs showing a refused write or node call
    # The continuous invariants (``samples``): samples judged, and what they found.
    samples: int = 0
    false_full_samples: int = 0
    false_full: list[str] = field(default_factory=list)
    blocked_units: list[str] = field(default_factory=list)
    blocked_releases: list[str] = field(default_factory=list)
    units_waiting_for_room: int = 0  # distinct (collection, replica) units seen waiting for room

    @property
    def unanswered(self) -> list[ChaosCall]:
        return [c for c in self.calls if c.outcome == "unanswered"]

    def summary(self) -> dict[str, Any]:
        return {
            "ops": self.ops_run,
            "replicas": self.options.replicas,
            "capacity": self.options.capacity,
            "leader_kills": self.counts.leader_kills,
            "node_kills": self.counts.node_kills,
            "node_restarts": self.counts.node_restarts,
            "cluster_restarts": self.counts.cluster_restarts,
            "partitions": self.counts.partitions,
            "checker_repairs": self.checker_repairs,
            "no_room_loads": sum(c.code in ("NO_AVAILABLE_NODE", "RESOURCE_EXHAUSTED") for c in self.calls),
            "units_waiting_for_room": self.units_waiting_for_room,
            "unanswered": len(self.unanswered),
            "invariant_violations": len(self.violations),
            "stuck_triggers": len(self.stuck_ids),
            "false_full_samples": self.false_full_samples,
            "blocked_units": len(self.blocked_units),
            "blocked_releases": len(self.blocked_releases),
            "samples": self.samples,
            "seed": self.options.seed,
            "phases": len(self.phases),
            "calls": len(self.calls),
            "fenced_refusals": self.fenced_refusals,
            "plan": self.plan.digest(),
            "duration_s": round(self.duration_s, 1),
        }

    @property
    def failed(self) -> bool:
        return bool(self.unanswered or self.violations or self.stuck_ids or self.false_full_samples
                    or self.blocked_units or self.blocked_releases)
