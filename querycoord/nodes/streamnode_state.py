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
* Recalculation orders (runners): a RUNNING runner named by an order runs
  it for ``recalc_delay_s`` (a simulated computation of the range), then
  reports it in ``recalcs_done`` until a reply to a heartbeat that reported
  it no longer orders it for that task (the leader recorded it). An
  instance never runs one recalculation twice: an order again for one it
  finished is answered by reporting it again. ``recalc_runs`` counts the
  finished runs per (stream, recalculation, task, SID) for tests and drills
  (any count above 1 is a duplicate), and ``finished_recalcs`` queues them
  for the process to print.
* Progress: the node simulates a source that advances with wall time
  (``tick(now, wall_ms)``: the source holds events up to ``wall_ms``). A
  RUNNING task processes, at each tick, what the source held at the tick
  before, so a task that keeps up lags by one tick; it begins at the source's
  newest event when it turns RUNNING. Each report carries the task's
  ``processed_ms`` (0 until it ran) and the source's ``source_ms``.
* Checkpoints: a ``CheckpointOrder`` makes every task of the stream held
  here take that checkpoint (recorded per task with when it was taken,
  reported as ``checkpoint_id`` from the next heartbeat on); an order for an
  id not above what a task holds changes nothing. A deployed task starts from
  the deploy's ``resume_checkpoint_id`` and records it (``resumed_from``), so
  tests and drills can read what it restored. ``checkpoint_fault`` makes the
  node refuse orders, or take them only ``checkpoint_delay_s`` later.
* Faults: ``fail_task`` marks a task FAILED with a non-zero error code
  (a FAILED report with code 0 is a bug the coordinator must never see);
  ``pause`` stops the processing of a stream's tasks (or of one task) while
  they stay RUNNING and keep reporting, so their lag grows; ``resume`` lets
  them catch up.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proto import common_pb2, stream_pb2
from querycoord.common.messages import copy_fields

TaskKey = tuple[int, int]  # (stream_id, task_id)

DEFAULT_GROUPS = 5
DEFAULT_INIT_DELAY_S = 0.3
DEFAULT_RUNNER_THREADS = 4
DEFAULT_RECALC_DELAY_S = 0.5
# Recalculations an instance remembers having run (the oldest are forgotten beyond this).
MAX_RECALCS_REMEMBERED = 256
RecalcRun = tuple[int, int, int, int]  # (stream_id, recalc_id, task_id, sid): one run of a recalculation
# Deploys remembered with the checkpoint they resumed from (the newest; older ones are forgotten).
MAX_RESUMES_KEPT = 10_000
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
    # Runners: recalculations running (id -> when they finish), finished and still reported, run by this instance.
    recalcs_running: dict[int, float] = field(default_factory=dict)
    recalcs_done: list[int] = field(default_factory=list)
    recalcs_run: dict[int, None] = field(default_factory=dict)
    # Event time (unix ms) up to which the task has processed its input; 0 until it ran.
    processed_ms: int = 0
    # The checkpoint held (0: none) and when it was taken (unix ms), the ids taken in this instance's life, and
    # the consensus checkpoint it started from (the deploy's resume_checkpoint_id).
    checkpoint_id: int = 0
    checkpoint_ms: int = 0
    checkpoints: list[int] = field(default_factory=list)
    resumed_from: int = 0
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
            "top_runners": [t.task_id for t in self.top_runners], "processed_ms": self.processed_ms,
            "checkpoint_id": self.checkpoint_id, "checkpoints": list(self.checkpoints),
            "resumed_from": self.resumed_from,
            "skip_until_ms": self.skip_until_ms,
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
    recalcs_started: list[RecalcRun] = field(default_factory=list)
    checkpoints_taken: list[tuple[TaskKey, int]] = field(default_factory=list)


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
        recalc_delay_s: float = DEFAULT_RECALC_DELAY_S,
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
        self.recalc_delay_s = recalc_delay_s
        self.recalc_runs: Counter[RecalcRun] = Counter()
        self.finished_recalcs: list[RecalcRun] = []
        # What the last heartbeat reported done: task -> (SID, recalculation ids).
        self._reported_done: dict[TaskKey, tuple[int, list[int]]] = {}
        # The newest event time (unix ms) the simulated source holds, as of the last tick (0: no tick with a time).
        self.source_ms = 0
        # Paused processing: (stream_id, task_id), task_id 0 for every task of the stream.
        self.paused: set[TaskKey] = set()
        # Checkpoint faults: "" takes orders at once, "refuse" ignores them, "slow" takes them checkpoint_delay_s
        # after they came (orders wait in delayed_orders: stream id -> (checkpoint id, when ordered)).
        self.checkpoint_fault = ""
        self.checkpoint_delay_s = 0.0
        self.delayed_orders: dict[int, tuple[int, float]] = {}
        # Every deploy this node took: (stream id, task id, SID, resume_checkpoint_id), oldest first.
        self.resumes: deque[tuple[int, int, int, int]] = deque(maxlen=MAX_RESUMES_KEPT)

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
    def tick(self, now: float, wall_ms: int | None = None) -> list[TaskKey]:
        """Advance tasks in time: INIT readers and runners past the init delay, and started triggers, turn RUNNING;
        with ``wall_ms`` the source advances to it and RUNNING tasks not paused process what it held before."""
        promoted = []
        for stream_id, (cid, ordered) in list(self.delayed_orders.items()):
            if self.checkpoint_fault != "slow" or now - ordered >= self.checkpoint_delay_s:
                del self.delayed_orders[stream_id]
                if self.checkpoint_fault != "refuse":
                    self._take_checkpoint(stream_id, cid, None)
        for task in self.tasks.values():
            if task.status != stream_pb2.TASK_INIT:
                continue
            ready = task.started if task.is_trigger else now - task.deployed_at >= self.init_delay_s
            if ready:
                task.status = stream_pb2.TASK_RUNNING
                promoted.append(task.key)
        self._finish_recalcs(now)
        if wall_ms is not None:
            self._progress(wall_ms)
        return promoted

    def _progress(self, wall_ms: int) -> None:
        """The source advances to ``wall_ms``; each RUNNING task not paused processes what it held at the last
        tick (a task that just began starts at the source's newest event)."""
        held = self.source_ms or wall_ms
        self.source_ms = max(self.source_ms, wall_ms)
        for task in self.tasks.values():
            if task.status != stream_pb2.TASK_RUNNING:
                continue
            if not task.processed_ms:
                task.processed_ms = held
            elif not self.is_paused(task):
                task.processed_ms = max(task.processed_ms, held)

    # ----- processing faults --------------------------------------------------
    def pause(self, stream_id: int, task_id: int = 0) -> None:
        """Stop processing a stream's tasks (``task_id`` 0) or one of its tasks: they stay RUNNING and report a
        lag that grows with the source."""
        self.paused.add((stream_id, task_id))

    def resume(self, stream_id: int, task_id: int = 0) -> None:
        """Process again (``task_id`` 0: every pause of the stream ends); the tasks catch up at the next tick."""
        if task_id:
            self.paused.discard((stream_id, task_id))
        else:
            self.paused = {k for k in self.paused if k[0] != stream_id}

    def is_paused(self, task: Task) -> bool:
        return (task.info.stream_id, 0) in self.paused or task.key in self.paused

    def _finish_recalcs(self, now: float) -> None:
        for task in self.tasks.values():
            for rid, at in list(task.recalcs_running.items()):
                if now < at:
                    continue
                del task.recalcs_running[rid]
                task.recalcs_done.append(rid)
                task.recalcs_run[rid] = None
                while len(task.recalcs_run) > MAX_RECALCS_REMEMBERED:
                    del task.recalcs_run[next(iter(task.recalcs_run))]
                run = (task.info.stream_id, rid, task.info.task_id, task.info.sid)
                self.recalc_runs[run] += 1
                self.finished_recalcs.append(run)

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
                          error_code=task.error_code, error_message=task.error_message,
                          processed_ms=task.processed_ms, source_ms=self.source_ms,
                          checkpoint_id=task.checkpoint_id, checkpoint_ms=task.checkpoint_ms)
        if task.recalcs_done:
            rep.recalcs_done.extend(task.recalcs_done)
        if task.is_trigger:
            rep.top_runners.extend(stream_pb2.TaskId(stream_id=t.stream_id, task_id=t.task_id, sid=t.sid)
                                   for t in task.top_runners)
        return rep

    def build_heartbeat(self) -> stream_pb2.HeartbeatRequest:
        """The heartbeat of the next stream group (and move on to the following group)."""
        group = self.next_group
        self.next_group = (self.next_group + 1) % self.groups
        self.heartbeats_built += 1
        reports = self.reports(group)
        self._reported_done = {(r.stream_id, r.task_id): (r.sid, list(r.recalcs_done)) for r in reports
                               if r.recalcs_done}
        return stream_pb2.HeartbeatRequest(
            node_id=self.node_id, snode_id=self.snode_id, vgroup_ids=sorted(self.vgroups), stream_group=group,
            num_stream_groups=self.groups, tasks=reports, runner_threads=self.runner_threads,
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
        for order in reply.checkpoints:
            if order.stream_id not in undeployed_streams:
                self._order_checkpoint(order, now, out)
        if not reply.watching:
            self._apply_recalcs(reply, now, out)
        return out

    def _apply_recalcs(self, reply: stream_pb2.HeartbeatReply, now: float, out: ReplyOutcome) -> None:
        """Start the ordered recalculations not run yet; stop reporting those the reply orders no more."""
        ordered = {(o.stream_id, tid, o.recalc_id) for o in reply.recalcs for tid in o.task_ids}
        for (stream_id, task_id), (sid, rids) in self._reported_done.items():
            task = self.tasks.get((stream_id, task_id))
            if task is None or task.info.sid != sid:
                continue
            recorded = {r for r in rids if (stream_id, task_id, r) not in ordered}
            task.recalcs_done = [r for r in task.recalcs_done if r not in recorded]
        self._reported_done = {}
        for o in reply.recalcs:
            for tid in o.task_ids:
                task = self.tasks.get((o.stream_id, tid))
                if task is None or task.status != stream_pb2.TASK_RUNNING or o.recalc_id in task.recalcs_running:
                    continue
                if o.recalc_id in task.recalcs_run:  # finished by this instance: report it again, never rerun
                    if o.recalc_id not in task.recalcs_done:
                        task.recalcs_done.append(o.recalc_id)
                    continue
                task.recalcs_running[o.recalc_id] = now + self.recalc_delay_s
                out.recalcs_started.append((o.stream_id, o.recalc_id, tid, task.info.sid))

    def _order_checkpoint(self, order: stream_pb2.CheckpointOrder, now: float, out: ReplyOutcome) -> None:
        """Take (or, with a fault, delay or refuse) checkpoint ``order.checkpoint_id`` of every task of the stream."""
        if self.checkpoint_fault == "refuse":
            return
        if self.checkpoint_fault == "slow":
            held = self.delayed_orders.get(order.stream_id)
            if held is None or held[0] < order.checkpoint_id:
                self.delayed_orders[order.stream_id] = (order.checkpoint_id, now if held is None else held[1])
            return
        self._take_checkpoint(order.stream_id, order.checkpoint_id, out)

    def _take_checkpoint(self, stream_id: int, checkpoint_id: int, out: ReplyOutcome | None) -> None:
        taken_ms = int(time.time() * 1000)
        for key, task in self.tasks.items():
            if key[0] != stream_id or task.checkpoint_id >= checkpoint_id:
                continue
            task.checkpoint_id, task.checkpoint_ms = checkpoint_id, taken_ms
            task.checkpoints.append(checkpoint_id)
            if out is not None:
                out.checkpoints_taken.append((key, checkpoint_id))

    def set_checkpoint_fault(self, fault: str, delay_s: float = 0.0) -> None:
        """``""``: take orders at once; ``"refuse"``: ignore them; ``"slow"``: take them ``delay_s`` later."""
        if fault not in ("", "refuse", "slow"):
            raise ValueError(f"unknown checkpoint fault {fault!r} (none, refuse, slow)")
        if delay_s < 0:
            raise ValueError(f"checkpoint delay must not be negative, got {delay_s}")
        self.checkpoint_fault, self.checkpoint_delay_s = fault, delay_s
        if fault == "refuse":
            self.delayed_orders.clear()

    def _deploy_stream(self, d: stream_pb2.StreamDeploy, now: float, out: ReplyOutcome) -> None:
        """Deploy one stream's tasks of a reply: its readers, its trigger (with the trigger's readers and top
        runners), its runners; each starts from the deploy's consensus checkpoint."""
        new: list[Task | None] = [self._deploy(r.task, now, out) for r in d.readers]
        if d.HasField("trigger"):
            task = self._deploy(d.trigger.task, now, out)
            if task is not None:
                task.readers = list(d.trigger.readers)
                task.top_runners = list(d.trigger.top_runners)
            new.append(task)
        new.extend(self._deploy(rn.task, now, out) for rn in d.runners)
        for task in new:
            if task is not None:
                task.resumed_from = task.checkpoint_id = d.resume_checkpoint_id
                task.skip_until_ms = d.start_from_ms
                self.resumes.append((task.info.stream_id, task.info.task_id, task.info.sid, d.resume_checkpoint_id))

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
