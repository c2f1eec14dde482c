"""WATCH: after a leader change, adopt the tasks that run instead of redeploying everything.

While WATCH lasts (from winning leadership, when streams exist) replies carry
no actions, so running tasks are undisturbed, and every reported task is
recorded against the persisted definitions. WATCH ends by a timer
(``watch_timeout``, checked on each heartbeat and by ``tick()``, so it ends
even if no node ever reports) or earlier once every live node has reported
every stream group. Complete streams are then adopted as they run (same task
ids and SIDs, no redeploy); incomplete ones are stopped with
``STOP_TASK_LOST`` and redeployed by the next ``tick()``. Any error while
ending WATCH falls back to redeploying everything.

The completeness check uses ``plan.task_layout``, the slots ``plan_stream``
fills, so deployment and adoption can never disagree on what a stream's task
set is. Adoption restores every field of a task as deployed: reports carry
the whole identity, and the layout restores what an older node leaves out and
rejects reports that do not fit the persisted definition.

Reports are recorded under the sender's session-verified node id (never the
id written in the report), and trigger and runner reports only from the node
that owns their snode.
"""

from __future__ import annotations

from loguru import logger

from proto import stream_pb2
from querycoord.stream.claims import Claims
from querycoord.stream.plan import TRIGGER, PlannedTask, Slot, expected_counts, task_layout
from querycoord.stream.runtime import (
    ALIVE_STATUSES,
    READER_KINDS,
    STOP_TASK_LOST,
    ManagerState,
    Runtime,
    StreamRuntime,
    TaskRuntime,
    reported_tops,
)

WatchReport = tuple[int, stream_pb2.TaskStatusReport]  # (session-verified node id, report)


class Adoption:
    """The WATCH phase: record reports, decide when it is over, adopt or stop each stream."""

    def __init__(self, shared: Runtime, claims: Claims):
        self.shared = shared
        self.claims = claims
        # Reports per stream (under the sender's verified node id) and which stream groups each node reported.
        self.reports: dict[int, dict[int, WatchReport]] = {}
        self.groups: dict[int, tuple[set[int], int]] = {}

    def record(self, req: stream_pb2.HeartbeatRequest) -> None:
        """Record an accepted heartbeat's reports under its (session-verified) sender, never the report's node id.

        A trigger or runner counts only from the node its snode is recorded
        for; of two nodes reporting the same reader, the vgroup's holder wins.
        """
        node = req.node_id
        groups, _ = self.groups.get(node, (set(), 0))
        groups.add(req.stream_group)
        self.groups[node] = (groups, max(req.num_stream_groups, 1))
        for rep in req.tasks:
            if rep.stream_id not in self.shared.streams:
                continue
            if rep.kind not in READER_KINDS and self.shared.snode_owner.get(rep.snode_id) != node:
                kind = stream_pb2.TaskKind.Name(rep.kind) if rep.kind in stream_pb2.TaskKind.values() else rep.kind
                self.claims.reject_claim(("task", node, rep.task_id),
                                         f"node {node} reports {kind} task {rep.task_id} of stream {rep.stream_id} "
                                         f"on snode {rep.snode_id}, which is not recorded for it: not adopted")
                continue
            reports = self.reports.setdefault(rep.stream_id, {})
            held = reports.get(rep.task_id)
            if held is not None and held[0] != node and not self.claims.leads(node, rep.vgroup_id):
                continue
            reports[rep.task_id] = (node, rep)

    def forget(self, stream_id: int) -> None:
        """A dropped stream: its reports no longer count."""
        self.reports.pop(stream_id, None)

    def done(self) -> bool:
        """Whether WATCH is over: its timer ran out, or every live node reported every stream group."""
        shared = self.shared
        if shared.clock() - shared.state_since >= shared.config.watch_timeout:
            return True
        if not shared.live_nodes:
            return False
        for node in shared.live_nodes:
            groups, total = self.groups.get(node, (set(), 1))
            if len(groups) < total:
                return False
        return True

    def end(self) -> None:
        """Adopt complete streams, stop incomplete ones; on any error, redeploy everything (safe fallback)."""
        shared = self.shared
        now = shared.clock()
        try:
            for stream_id, rt in shared.streams.items():
                if rt.sdef.user_stopped:
                    continue
                reports = self.reports.get(stream_id, {})
                if self.complete(rt.sdef, reports):
                    self.adopt(rt, reports, now)
                else:
                    have = len(reports)
                    reason = f"after a leader change {have} of {expected_counts(rt.sdef).total} tasks reported"
                    shared.stop_by_error(rt, STOP_TASK_LOST, reason, now)
                    # Redeployed by the next tick, not after the back-off: a leader change is not a repeated
                    # failure, and the new deploy's fresh task ids make any leftover instance stale.
                    rt.next_retry = now
        except Exception:
            logger.exception("ending WATCH failed: every stream is redeployed")
            for rt in shared.streams.values():
                shared.clear_tasks(rt)
                rt.stop_code, rt.stop_reason, rt.next_retry = 0, "", None
            shared.to_plan = {s for s, rt in shared.streams.items() if not rt.sdef.user_stopped}
        self.reports.clear()
        self.groups.clear()
        shared.state = ManagerState.NORMAL
        shared.state_since = now
        logger.info("WATCH ended: {} streams adopted", shared.adopted)

    @staticmethod
    def complete(sdef: stream_pb2.StreamDef, reports: dict[int, WatchReport]) -> bool:
        """Whether the reports fill every slot of ``plan.task_layout`` exactly once, alive and fitting the slot.

        The same layout ``plan_stream`` deploys, checked slot by slot: a
        reader on another vgroup, or a task whose reported scan plan or top
        flag differs from its slot's, is not the task that was planned.
        """
        layout = task_layout(sdef)
        seen: set[tuple[int, int, int]] = set()
        for _, r in reports.values():
            key = (r.kind, r.deploy_id, r.task_idx)
            slot = layout.get(key)
            if r.status not in ALIVE_STATUSES or slot is None or key in seen or not _fits(r, slot):
                return False
            seen.add(key)
        return len(seen) == len(layout)

    def adopt(self, rt: StreamRuntime, reports: dict[int, WatchReport], now: float) -> None:
        """Take a complete stream over as it runs: every task exactly as deployed, on the node that reported it.

        Fields a report lacks (an older node) come from the slot in
        ``task_layout``, which ``complete`` has checked the report against.
        Readers whose vgroup another node holds now are moved there (SID + 1);
        a trigger reporting other top runners than the adopted ones gets a
        RunnerUpdate (the old leader's update may have been lost with it).
        """
        shared = self.shared
        layout = task_layout(rt.sdef)
        rt.tasks = {}
        for node, r in reports.values():
            slot = layout[(r.kind, r.deploy_id, r.task_idx)]
            rt.tasks[r.task_id] = TaskRuntime(
                task=PlannedTask.of(r, scan_plan_idx=slot.scan_plan_idx, top=slot.top),
                node_id=node,
                status=r.status,
                last_heard=now,
                deployed_at=now,
                running_since=now if r.status == stream_pb2.TASK_RUNNING else None,
                processed_ms=r.processed_ms,
                source_ms=r.source_ms,
                checkpoint_id=r.checkpoint_id,
            )
        rt.pending.clear()
        for t in rt.tasks.values():
            if t.task.kind == TRIGGER and t.status == stream_pb2.TASK_RUNNING:
                t.started_sid = t.task.sid
        trig_rep = next((r for _, r in reports.values() if r.kind == TRIGGER), None)
        if trig_rep is not None and trig_rep.top_runners and reported_tops(trig_rep) != shared.top_keys(rt):
            rt.runner_update, rt.runner_update_sends = True, 0
        for t in rt.tasks.values():
            h = shared.vgroups.get(t.task.vgroup_id)
            if t.task.kind in READER_KINDS and h is not None and h.claiming and h.node_id != t.node_id:
                shared.redeploy_task(rt, t, now)
        shared.adopted += 1


def _fits(r: stream_pb2.TaskStatusReport, slot: Slot) -> bool:
    """Whether a report matches its slot of ``plan.task_layout`` (fields it lacks are taken from the slot)."""
    if r.vgroup_id != slot.vgroup_id:
        return False
    if r.HasField("scan_plan_idx") and r.scan_plan_idx != slot.scan_plan_idx:
        return False
    return not r.HasField("top") or r.top == slot.top
