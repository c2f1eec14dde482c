"""The stream node's state machine: tasks, vgroup leadership, snode, heartbeat building and reply handling.

No I/O and no clock of its own (every call takes ``now`` in seconds), so tests
drive it directly and the process (``streamnode``) only moves messages.

Rules it implements (model: a TDengine dnode's stream side):

* Heartbeats are per stream group: each ``build_heartbeat`` reports the tasks
  of one group (``stream_id % groups``) and moves to the next group, so a
  node with many streams sends small messages and every group is reported
  once every ``groups`` ticks. A report carries the task's whole identity as
  deployed (scan plan and top flag included, so a new leader adopts it
  unchanged) and, for a trigger, the top runners it feeds: that is how the
  leader sees a RunnerUpdate took effect (it re-sends it until then).
* A deployed reader or runner starts in INIT and turns RUNNING by itself
  after ``init_delay_s`` (it "opened" its inputs). A trigger stays INIT until
  the leader sends a start for it, because the leader starts it only once
  every task of the stream is in place.
* A deploy of a task already held with the same SID is a repeat and changes
  nothing; with another SID it replaces the instance (a redeploy).
* An undeploy removes the named instances (only when the SID matches, so a
  late undeploy of an old generation never kills its replacement) or every
  task of the stream; for one stream it overrides every other action in the
  same reply.
* A reply whose leader revision is lower than the highest seen comes from a
  deposed leader and is ignored whole: acting on it could undo what the new
  leader decided.
* Faults: ``fail_task`` marks a task FAILED with a non-zero error code
  (a FAILED report with code 0 is a bug the coordinator must never see).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proto import common_pb2, stream_pb2
from querycoord.common.messages import copy_fields

TaskKey = tuple[int, int]  # (stream_id, task_id)

DEFAULT_GROUPS = 5
DEFAULT_INIT_DELAY_S = 0.3
DEFAULT_RUNNER_THREADS = 4
# The error code a fault-injected failure reports (never 0, see module docstring).
INJECTED_TASK_ERROR = common_pb2.UNEXPECTED_ERROR
INJECTED_TASK_MESSAGE = "injected task failure"

_STATUS_NAMES = {
    stream_pb2.TASK_INIT: "INIT",
    stream_pb2.TASK_RUNNING: "RUNNING",
    stream_pb2.TASK_FAILED: "FAILED",
    stream_pb2.TASK_STOPPED: "STOPPED",
}


@dataclass
class Task:
    """One task instance held by the node."""

    info: stream_pb2.TaskId
    status: stream_pb2.TaskStatus = stream_pb2.TASK_INIT
    deployed_at: float = 0.0
    # Trigger only: whether the leader started it, and its current top runners.
    started: bool = False
    readers: list[stream_pb2.TaskId] = field(default_factory=list)
    top_runners: list[stream_pb2.TaskId] = field(default_factory=list)
    error_code: int = 0
    error_message: str = ""
    # Where the task starts reading (unix ms; 0: where it was, from its checkpoint): data written before it is
    # skipped (StreamDeploy.start_from_ms; for the trigger also StreamStart.skip_until_ms, the later wins).
    skip_until_ms: int = 0

    @property
    def key(self) -> TaskKey:
        return (self.info.stream_id, self.info.task_id)

    @property
    def is_trigger(self) -> bool:
        return self.info.kind == stream_pb2.TRIGGER

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (the ``tasks`` control command and logs)."""
        return {
            "stream_id": self.info.stream_id, "task_id": self.info.task_id, "sid": self.info.sid,
            "kind": stream_pb2.TaskKind.Name(self.info.kind), "status": _STATUS_NAMES.get(self.status, "?"),
            "vgroup_id": self.info.vgroup_id, "snode_id": self.info.snode_id, "deploy_id": self.info.deploy_id,
            "task_idx": self.info.task_idx, "scan_plan_idx": self.info.scan_plan_idx, "top": self.info.top,
            "error_code": self.error_code, "error_message": self.error_message,
            "top_runners": [t.task_id for t in self.top_runners], "skip_until_ms": self.skip_until_ms,
        }


@dataclass
class ReplyOutcome:
    """What ``apply_reply`` did; ``accepted`` is False for a stale or error reply (nothing applied)."""

    accepted: bool
    reason: str = ""
    deployed: list[TaskKey] = field(default_factory=list)
    started: list[TaskKey] = field(default_factory=list)
    undeployed: list[TaskKey] = field(default_factory=list)
    cleaned_streams: list[int] = field(default_factory=list)
    checkpointed_streams: list[int] = field(default_factory=list)
    runner_updates: list[TaskKey] = field(default_factory=list)


class StreamNodeState:
    """Tasks and identity of one stream node (see module docstring)."""

    def __init__(
        self,
        node_id: int = 0,
        *,
        vgroups: Iterable[int] = (),
        snode_id: int = 0,
        groups: int = DEFAULT_GROUPS,
        init_delay_s: float = DEFAULT_INIT_DELAY_S,
        runner_threads: int = DEFAULT_RUNNER_THREADS,
    ):
        if groups < 1:
            raise ValueError(f"stream groups must be at least 1, got {groups}")
        if init_delay_s < 0:
            raise ValueError(f"init delay must not be negative, got {init_delay_s}")
        self.node_id = node_id
        self.vgroups: set[int] = set(vgroups)
        self.snode_id = snode_id
        self.groups = groups
        self.init_delay_s = init_delay_s
        self.runner_threads = runner_threads
        self.tasks: dict[TaskKey, Task] = {}
        self.max_leader_revision = 0
        self.next_group = 0
        self.stale_replies = 0
        self.heartbeats_built = 0

    # ----- vgroup leadership and snode ----------------------------------------
    def lead_vgroup(self, vgroup_id: int) -> None:
        """Take leadership of a vgroup: the next heartbeat reports it and the leader places its readers here."""
        self.vgroups.add(vgroup_id)

    def drop_vgroup(self, vgroup_id: int) -> list[TaskKey]:
        """Give up a vgroup; returns the readers still held on it.

        The readers are NOT removed here: the leader owns placement, learns of
        the move from the vgroup lists of the next heartbeats, redeploys the
        readers (new SID) where the vgroup is led now and undeploys these
        instances (node mismatch). A node deciding on its own would race the
        leader's view and make a lost task out of a move.
        """
        self.vgroups.discard(vgroup_id)
        return sorted(k for k, t in self.tasks.items() if t.info.vgroup_id == vgroup_id and t.info.kind in
                      (stream_pb2.TRIGGER_READER, stream_pb2.CALC_READER))

    # ----- time ---------------------------------------------------------------
    def tick(self, now: float) -> list[TaskKey]:
        """Advance tasks in time: INIT readers and runners past the init delay, and started triggers, turn RUNNING."""
        promoted = []
        for task in self.tasks.values():
            if task.status != stream_pb2.TASK_INIT:
                continue
            ready = task.started if task.is_trigger else now - task.deployed_at >= self.init_delay_s
            if ready:
                task.status = stream_pb2.TASK_RUNNING
                promoted.append(task.key)
        return promoted

    # ----- heartbeat ----------------------------------------------------------
    def reports(self, group: int | None = None) -> list[stream_pb2.TaskStatusReport]:
        """Status reports of the tasks of one stream group (every task when ``group`` is None), in key order."""
        out = []
        for key in sorted(self.tasks):
            task = self.tasks[key]
            if group is not None and task.info.stream_id % self.groups != group:
                continue
            out.append(self._report(task))
        return out

    def _report(self, task: Task) -> stream_pb2.TaskStatusReport:
        """One task's report: its whole identity as deployed (so a new leader adopts it unchanged) and, for a
        trigger, the top runners it feeds (so the leader sees whether its RunnerUpdate took effect)."""
        rep = copy_fields(task.info, stream_pb2.TaskStatusReport, node_id=self.node_id, status=task.status,
                          error_code=task.error_code, error_message=task.error_message)
        if task.is_trigger:
            rep.top_runners.extend(stream_pb2.TaskId(stream_id=t.stream_id, task_id=t.task_id, sid=t.sid)
                                   for t in task.top_runners)
        return rep

    def build_heartbeat(self) -> stream_pb2.HeartbeatRequest:
        """The heartbeat of the next stream group (and move on to the following group)."""
        group = self.next_group
        self.next_group = (self.next_group + 1) % self.groups
        self.heartbeats_built += 1
        return stream_pb2.HeartbeatRequest(
            node_id=self.node_id, snode_id=self.snode_id, vgroup_ids=sorted(self.vgroups), stream_group=group,
            num_stream_groups=self.groups, tasks=self.reports(group), runner_threads=self.runner_threads,
            seen_leader_revision=self.max_leader_revision,
        )

    # ----- replies ------------------------------------------------------------
    def apply_reply(self, reply: stream_pb2.HeartbeatReply, now: float) -> ReplyOutcome:
        """Apply one heartbeat reply (see module docstring for the rules)."""
        if reply.status.error_code != common_pb2.SUCCESS:
            return ReplyOutcome(False, f"error reply: {reply.status.reason}")
        if reply.leader_revision < self.max_leader_revision:
            self.stale_replies += 1
            return ReplyOutcome(False, f"stale leader: revision {reply.leader_revision} < "
                                       f"{self.max_leader_revision} already seen")
        self.max_leader_revision = reply.leader_revision
        out = ReplyOutcome(True)
        undeployed_streams = set()
        for u in reply.undeploys:
            undeployed_streams.add(u.stream_id)
            self._undeploy(u, out)
        for d in reply.deploys:
            if d.stream_id not in undeployed_streams:
                self._deploy_stream(d, now, out)
        self._apply_starts_and_runner_updates(reply, undeployed_streams, out)
        return out

    def _deploy_stream(self, d: stream_pb2.StreamDeploy, now: float, out: ReplyOutcome) -> None:
        """Deploy one stream's tasks of a reply: its readers, its trigger (with the trigger's readers and top
        runners), its runners."""
        deployed: list[Task | None] = [self._deploy(r.task, now, out) for r in d.readers]
        if d.HasField("trigger"):
            task = self._deploy(d.trigger.task, now, out)
            if task is not None:
                task.readers = list(d.trigger.readers)
                task.top_runners = list(d.trigger.top_runners)
            deployed.append(task)
        deployed.extend(self._deploy(rn.task, now, out) for rn in d.runners)
        for task in deployed:
            if task is not None:
                task.skip_until_ms = d.start_from_ms

    def _apply_starts_and_runner_updates(self, reply: stream_pb2.HeartbeatReply, undeployed_streams: set[int],
                                         out: ReplyOutcome) -> None:
        """Start the triggers a reply starts and give them their new top runners (streams undeployed by the same
        reply excepted)."""
        for s in reply.starts:
            if s.stream_id in undeployed_streams:
                continue
            trig = self._same_instance(s.trigger)
            if trig is not None and trig.is_trigger:
                trig.started = True
                trig.skip_until_ms = max(trig.skip_until_ms, s.skip_until_ms)
                out.started.append(trig.key)
        for ru in reply.runner_updates:
            if ru.stream_id in undeployed_streams:
                continue
            trig = self._same_instance(ru.trigger)
            if trig is not None and trig.is_trigger:
                trig.top_runners = list(ru.top_runners)
                out.runner_updates.append(trig.key)

    def _same_instance(self, info: stream_pb2.TaskId) -> Task | None:
        task = self.tasks.get((info.stream_id, info.task_id))
        if task is None or task.info.sid != info.sid:
            return None
        return task

    def _deploy(self, info: stream_pb2.TaskId, now: float, out: ReplyOutcome) -> Task | None:
        key = (info.stream_id, info.task_id)
        held = self.tasks.get(key)
        if held is not None and held.info.sid == info.sid:
            return None  # a repeated deploy: the instance already runs
        if held is not None and held.info.sid > info.sid:
            return None  # an older generation than the one held: never go back
        task = Task(info=stream_pb2.TaskId(), deployed_at=now)
        task.info.CopyFrom(info)
        task.info.node_id = self.node_id
        self.tasks[key] = task
        out.deployed.append(key)
        return task

    def _undeploy(self, u: stream_pb2.StreamUndeploy, out: ReplyOutcome) -> None:
        if u.undeploy_all:
            keys = [k for k in self.tasks if k[0] == u.stream_id]
        else:
            keys = []
            for info in u.tasks:
                task = self._same_instance(stream_pb2.TaskId(stream_id=u.stream_id, task_id=info.task_id,
                                                             sid=info.sid))
                if task is not None:
                    keys.append(task.key)
        for k in keys:
            del self.tasks[k]
            out.undeployed.append(k)
        if keys:
            (out.cleaned_streams if u.cleanup else out.checkpointed_streams).append(u.stream_id)

    # ----- faults -------------------------------------------------------------
    def fail_task(self, task_id: int, message: str = INJECTED_TASK_MESSAGE,
                  error_code: int = INJECTED_TASK_ERROR) -> TaskKey:
        """Mark a held task FAILED (fault injection); it is reported FAILED until the leader undeploys it."""
        if error_code == 0:
            raise ValueError("a failed task needs a non-zero error code")
        for task in self.tasks.values():
            if task.info.task_id == task_id:
                task.status = stream_pb2.TASK_FAILED
                task.error_code = error_code
                task.error_message = message
                return task.key
        raise KeyError(f"task {task_id} is not on node {self.node_id}")

    def snapshot(self) -> list[dict[str, Any]]:
        """Every held task as JSON-friendly dicts, in key order."""
        return [self.tasks[k].as_dict() for k in sorted(self.tasks)]
