"""The stream checker's task part: each task against what its node last reported.

The checker compares what should run with what runs and repairs through the
normal deploy path, counting each repair in ``checker_repairs`` and logging
what differed. Its three parts:

* definitions (``definitions.Definitions.refresh``): persisted definitions
  against the leader's streams;
* tasks (here, every ``check_interval``): each task against the last report
  of its stream group by the node it was handed to. A report received after
  the hand-out that lacks the task means the task is on no node (its deploy
  reply was lost, or the node lost it): it is redeployed (same task id,
  SID + 1; a top runner's trigger then gets a RunnerUpdate). A stream that
  should run but has no task and none being planned is planned again;
* undeploys (``heartbeat``): a node still reporting a task of a dropped or
  stopped stream (or a stale instance) after its undeploy was sent gets the
  undeploy again.

Task silence (``liveness``) stays the backstop for tasks whose group is never
reported.
"""

from __future__ import annotations

from proto import stream_pb2
from querycoord.stream.plan import RUNNER
from querycoord.stream.runtime import (
    GroupReport,
    ManagerState,
    NodeReports,
    Runtime,
    StreamRuntime,
    TaskRuntime,
    due,
)


class Checker:
    """Keeps each node's last report per stream group and redeploys the tasks missing from them."""

    def __init__(self, shared: Runtime):
        self.shared = shared
        self.last_check: float | None = None

    def record_reports(self, req: stream_pb2.HeartbeatRequest, now: float) -> None:
        """Keep the node's report of this stream group for the checker; forget undeploys that took effect."""
        shared = self.shared
        groups = req.num_stream_groups
        if groups < 1:
            return  # no group information: the checker cannot tell a missing task from an unreported one
        node, group = req.node_id, req.stream_group % groups
        nr = shared.reports.get(node)
        if nr is None or nr.groups != groups:
            nr = shared.reports[node] = NodeReports(groups)
        keys = frozenset((r.stream_id, r.task_id, r.sid) for r in req.tasks)
        nr.by_group[group] = GroupReport(now, keys)
        sent = shared.undeploy_sent.get(node)
        if sent:
            for key in [k for k in sent if k[0] % groups == group and k not in keys]:
                del sent[key]

    def forget_dead_nodes(self, live_nodes: set[int]) -> None:
        """Drop what nodes without a live session reported: their tasks are the liveness part's."""
        shared = self.shared
        for node in [n for n in shared.reports if n not in live_nodes]:
            del shared.reports[node]
        for node in [n for n in shared.undeploy_sent if n not in live_nodes]:
            del shared.undeploy_sent[node]

    def tick(self, now: float) -> None:
        if self.shared.streams and due(self.last_check, self.shared.config.check_interval, now):
            self.last_check = now
            self.check_tasks(now)

    def check_tasks(self, now: float) -> int:
        """Redeploy the tasks that run on no node, plan streams without tasks; returns how many streams it
        repaired."""
        shared = self.shared
        before = shared.checker_repairs
        for rt in list(shared.streams.values()):
            if rt.sdef.user_stopped or rt.error_stopped or shared.state is not ManagerState.NORMAL:
                continue
            if not rt.tasks:
                if rt.sdef.id not in shared.to_plan:
                    shared.to_plan.add(rt.sdef.id)
                    shared.repaired(rt.sdef, "should run but has no task and none is being planned: planned again")
                continue
            missing = [(t, why) for t in rt.tasks.values() if (why := self._missing(rt, t, now))]
            if missing:
                self._redeploy_missing(rt, missing, now)
        return shared.checker_repairs - before

    def _missing(self, rt: StreamRuntime, t: TaskRuntime, now: float) -> str:
        """Why ``t`` runs on no node ('' if it may run): its node reported the stream's group without it after
        the hand-out (a report received later than the hand-out was sent after the deploy reply was applied or
        lost)."""
        shared = self.shared
        if t.task.task_id in rt.pending or not t.node_id or t.deployed_at is None:
            return ""
        if shared.live_nodes is None or t.node_id not in shared.live_nodes:
            return ""  # a node without session: node_lost() and the health check handle its tasks
        nr = shared.reports.get(t.node_id)
        group = rt.sdef.id % nr.groups if nr is not None else 0
        gr = nr.by_group.get(group) if nr is not None else None
        if gr is None or gr.at <= t.deployed_at or (rt.sdef.id, t.task.task_id, t.task.sid) in gr.keys:
            return ""
        kind = stream_pb2.TaskKind.Name(t.task.kind)
        return (f"{kind} task {t.task.task_id} (SID {t.task.sid}) handed to node {t.node_id} "
                f"{now - t.deployed_at:.1f}s ago is missing from that node's report of stream group "
                f"{group}/{nr.groups if nr is not None else 0} ({now - gr.at:.1f}s ago)")

    def _redeploy_missing(self, rt: StreamRuntime, missing: list[tuple[TaskRuntime, str]], now: float) -> None:
        """Redeploy tasks that run nowhere through the normal path: same task ids, SID + 1, handed out again."""
        for t, _ in missing:
            if t.task.kind == RUNNER and t.task.top:
                rt.runner_update, rt.runner_update_sends = True, 0  # the trigger must learn the new SID
            self.shared.redeploy_task(rt, t, now)
        self.shared.repaired(rt.sdef, "; ".join(why for _, why in missing) + ": redeployed (same task ids, SID + 1)")
