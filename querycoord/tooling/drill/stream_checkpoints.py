"""The stream drill's checkpoint checks: consensus ids never go back, every new or adopted task resumed from it.

Fed each observation of the drill (the leader's ShowStreams and every live node's ``tasks`` answer):

* the consensus checkpoint the leader shows per stream is sampled; a value below one seen before is a
  regression (``checkpoint_regressions``, must be 0). Answers of a standby (persisted streams only, no
  checkpoint fields) are skipped. ``checkpoints`` counts the distinct consensus ids seen committed.
* a task instance (stream, task id, SID, node) seen for the first time was deployed since the last look:
  the checkpoint it resumed from (the node's ``resumed_from``) must be at least the stream's consensus seen
  before it appeared and at most the one seen by the next look (a committed consensus, never an older one;
  the next look, since the leader is asked before the nodes and may have committed meanwhile).
* an instance seen before keeps running (adopted by a new leader, or untouched): what it holds must never
  be below the consensus seen before (a commit means every task held it).

Each instance checked counts once in ``resumes_checked``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proto import stream_pb2

Instance = tuple[int, int, int, int]  # (stream id, task id, SID, node id)


@dataclass
class CheckpointChecks:
    """What the drill saw of checkpoints (module docstring)."""

    high: dict[int, int] = field(default_factory=dict)
    committed: dict[int, set[int]] = field(default_factory=dict)
    seen: set[Instance] = field(default_factory=set)
    checked: set[Instance] = field(default_factory=set)
    regressions: list[str] = field(default_factory=list)
    bad_resumes: list[str] = field(default_factory=list)
    # New instances whose resume point is checked against the consensus of the next look.
    unconfirmed: list[tuple[Instance, int]] = field(default_factory=list)

    def observe(self, show: stream_pb2.ShowStreamsResponse, nodes: dict[int, dict[str, Any]],
                stopped: Iterable[int] = ()) -> None:
        """One observation: the leader's answer and the nodes' task lists (node id -> ``tasks`` answer)."""
        if show.status.reason:
            return  # a standby's answer: persisted streams only, no checkpoint fields
        before = dict(self.high)
        for info in show.streams:
            sid, cid = info.stream.id, info.checkpoint_id
            high = self.high.get(sid, 0)
            if cid < high:
                self.regressions.append(f"stream {info.stream.name}: consensus checkpoint {cid} after {high}")
            else:
                self.high[sid] = cid
            if cid:
                self.committed.setdefault(sid, set()).add(cid)
        for inst, resumed in self.unconfirmed:
            if resumed > self.high.get(inst[0], 0):
                self.bad_resumes.append(f"task {inst[1]} SID {inst[2]} of stream {inst[0]} on node {inst[3]} resumed "
                                        f"from {resumed}, never a committed consensus (now {self.high.get(inst[0])})")
        self.unconfirmed.clear()
        skip = set(stopped)
        for nid, ack in nodes.items():
            for t in ack.get("tasks", []):
                stream_id = int(t["stream_id"])
                if stream_id in skip or t.get("status") not in ("INIT", "RUNNING"):
                    continue
                inst = (stream_id, int(t["task_id"]), int(t["sid"]), nid)
                floor = before.get(stream_id, 0)
                if inst not in self.seen:
                    resumed = int(t.get("resumed_from", 0))
                    if resumed < floor:
                        self.bad_resumes.append(f"task {inst[1]} SID {inst[2]} of stream {stream_id} on node {nid} "
                                                f"resumed from {resumed}, below the consensus {floor}")
                    self.unconfirmed.append((inst, resumed))
                    self.seen.add(inst)
                elif int(t.get("checkpoint_id", 0)) < floor:
                    self.bad_resumes.append(f"task {inst[1]} SID {inst[2]} of stream {stream_id} on node {nid} holds "
                                            f"checkpoint {t.get('checkpoint_id')} below the consensus {floor}")
                self.checked.add(inst)

    def least_consensus(self, stream_ids: Iterable[int]) -> int:
        """The lowest consensus seen among these streams (0 if one has none yet)."""
        return min((self.high.get(s, 0) for s in stream_ids), default=0)

    def summary(self) -> dict[str, int]:
        return {
            "checkpoints": sum(len(v) for v in self.committed.values()),
            "checkpoint_regressions": len(self.regressions),
            "resumes_checked": len(self.checked),
            "bad_resumes": len(self.bad_resumes),
        }
