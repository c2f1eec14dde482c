"""The failover drill's records: each client call, replica observation and leader kill, and the whole result."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from querycoord.tooling.drill.activity import FaultRecord
from querycoord.tooling.drill.invariants import UNCLEAR_CODES, CheckResult, MetaColl
from querycoord.tooling.drill.options import DrillOptions
from querycoord.tooling.drill.schedule import Schedule
from querycoord.tooling.drill.stale import PauseReport


@dataclass
class CallRecord:
    seq: int
    method: str
    target: str
    t: float
    elapsed: float = 0.0
    outcome: str = ""  # success / error / unanswered
    code: str = ""
    reason: str = ""
    task_id: int = 0
    cid: int = 0  # the collection asked about (0: a balance)


@dataclass
class ReplicaObservation:
    """The replicas in etcd at one moment (read between ``t0`` and ``t1``, drill seconds), and the nodes running
    then."""

    what: str
    t0: float
    t1: float
    collections: dict[int, MetaColl]
    live: set[int]
    quiescent: bool = False
    phase: int = 0


@dataclass
class KillRecord:
    n: int
    t: float
    mode: str
    old: str
    new: str = ""
    takeover_s: float | None = None
    note: str = ""


@dataclass
class DrillResult:
    options: DrillOptions
    schedule: Schedule
    calls: list[CallRecord] = field(default_factory=list)
    kills: list[KillRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    pauses: list[PauseReport] = field(default_factory=list)
    check: CheckResult | None = None
    duration_s: float = 0.0
    work_dir: Path | None = None

    @property
    def takeovers(self) -> list[float]:
        return [k.takeover_s for k in self.kills if k.takeover_s is not None]

    @property
    def stale_writes(self) -> int:
        return sum(p.stale_writes for p in self.pauses)

    def summary(self) -> dict[str, Any]:
        ts = self.takeovers
        c = self.check or CheckResult()
        return {
            "kills": len(self.kills),
            "replicas": self.options.replicas,
            "takeover_p50_s": round(statistics.median(ts), 3) if ts else None,
            "takeover_max_s": round(max(ts), 3) if ts else None,
            "lost_tasks": c.lost_tasks,
            "duplicate_segments": c.duplicate_segments,
            "stale_writes": self.stale_writes,
            "invariant_violations": c.invariant_violations,
            "seed": self.options.seed,
            "unanswered_calls": sum(r.outcome == "unanswered" for r in self.calls),
            "unclear_errors": sum(r.outcome == "error" and r.code in UNCLEAR_CODES for r in self.calls),
            "calls": len(self.calls),
            "pauses": len(self.pauses),
            "pause_takeover_s": [round(p.takeover_s, 3) if p.takeover_s is not None else None for p in self.pauses],
            "stale_window_changes": sum(p.window_changes for p in self.pauses),
            "fenced_refusals": sum(p.refused_in_log for p in self.pauses),
            "node_kills": sum(f.what.startswith("node") for f in self.faults),
            "etcd_kills": sum(f.what.startswith("etcd") for f in self.faults),
            "schedule": self.schedule.digest(),
            "duration_s": round(self.duration_s, 1),
        }

    @property
    def failed(self) -> bool:
        s = self.summary()
        return any(s[k] for k in ("lost_tasks", "duplicate_segments", "stale_writes", "invariant_violations"))
