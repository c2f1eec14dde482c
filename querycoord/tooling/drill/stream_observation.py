"""What the streams drill sees of the cluster at one moment (``Observation``), the faults it injects (``Fault``),
and why a stream it expected running is not."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from proto import stream_pb2
from querycoord.stream.plan import expected_counts

sp = stream_pb2


def why_not_running(info: sp.StreamStatusInfo, led: dict[int, int], snode_hosts: dict[Any, int]) -> str:
    """Why a stream the leader shows is not running as it should ("" if it is): its state, its task counts
    (``plan.expected_counts``), a task not RUNNING, a reader not on its vgroup's leader (``led``: vgroup ->
    node), a trigger or runner not on a live node hosting its snode (``snode_hosts``: snode -> node)."""
    exp = expected_counts(info.stream)
    kinds = Counter(row.task.kind for row in info.tasks)
    why = ""
    if info.state != sp.STREAM_RUNNING:
        why = f"state {sp.StreamState.Name(info.state)} {info.stop_reason}".strip()
    elif (kinds[sp.TRIGGER] != 1 or kinds[sp.TRIGGER_READER] != exp.trigger_readers
          or kinds[sp.CALC_READER] != exp.calc_readers or kinds[sp.RUNNER] != exp.runners):
        why = f"tasks {dict(kinds)} != expected {exp}"
    elif any(row.status != sp.TASK_RUNNING for row in info.tasks):
        why = "a task is not RUNNING"
    else:
        for row in info.tasks:
            t = row.task
            if t.kind in (sp.TRIGGER_READER, sp.CALC_READER) and led.get(t.vgroup_id) != t.node_id:
                why = f"reader {t.task_id} of vgroup {t.vgroup_id} on node {t.node_id}, not its leader"
            elif t.kind in (sp.TRIGGER, sp.RUNNER) and snode_hosts.get(t.snode_id) != t.node_id:
                why = f"task {t.task_id} on snode {t.snode_id}, not on a live node hosting it"
    return why


@dataclass
class Observation:
    """One look at the leader's ShowStreams and every live node's tasks."""

    leader: str = ""
    watching: bool = True
    streams: int = 0
    user_stopped: int = 0
    not_running: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # leader instances no node holds alive (yet)
    instances: dict[int, frozenset[tuple[int, int, int]]] = field(default_factory=dict)
    error: str = ""

    @property
    def quiescent(self) -> bool:
        return (not self.error and not self.watching and not self.not_running and not self.duplicates
                and not self.stale and not self.missing)

    def brief(self) -> str:
        if self.error:
            return self.error
        parts = [f"watching={self.watching}", f"not_running={len(self.not_running)}",
                 f"duplicates={len(self.duplicates)}", f"stale={len(self.stale)}", f"missing={len(self.missing)}"]
        first = (self.not_running + self.duplicates + self.stale + self.missing)[:3]
        return ", ".join(parts) + (f"; e.g. {first}" if first else "")


@dataclass
class Fault:
    n: int
    kind: str
    what: str
    t: float
    recovered_s: float | None = None
    adopted: int | None = None
    redeployed: int | None = None
    leader_says_adopted: int | None = None
    note: str = ""


__all__ = ["Fault", "Observation", "why_not_running"]
