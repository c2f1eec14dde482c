"""Heartbeat intake: one node's report of one stream group in, this leader's actions for it out.

A heartbeat is first verified (``claims``); its reports are kept for the
checker. In WATCH they are only recorded for adoption and the reply carries
no action. In NORMAL each report is acted on (TDengine's status update):
stale instances are undeployed, statuses recorded, triggers started, failures
handled; then pending deploys are planned and handed out.

Actions are level-triggered: nothing is "sent once". A start is put in every
reply to a heartbeat that reports the trigger INIT while the start rule holds,
until the trigger reports RUNNING; a RunnerUpdate is put in every reply to a
heartbeat that reports the trigger with other top runners than the leader's,
until it reports the leader's; an undeploy in every reply to a heartbeat that
still reports the stale instance. A lost reply (node timeout, or one refused
as a whole) therefore only delays an action.
"""

from __future__ import annotations

import time

from loguru import logger

from proto import stream_pb2
from querycoord.common import events
from querycoord.common.messages import copy_fields
from querycoord.stream.adoption import Adoption
from querycoord.stream.checker import Checker
from querycoord.stream.checkpoint import Checkpoints
from querycoord.stream.claims import Claims
from querycoord.stream.deploy import Deploy
from querycoord.stream.liveness import Liveness
from querycoord.stream.plan import RUNNER, TRIGGER
from querycoord.stream.runtime import (
    ALIVE_STATUSES,
    READER_KINDS,
    STOP_TASK_FAILED,
    ManagerState,
    Runtime,
    StreamRuntime,
    TaskRuntime,
    reported_tops,
)


class Heartbeats:
    """Answers heartbeats, drawing on every other part of the manager."""

    def __init__(
        self,
        shared: Runtime,
        *,
        claims: Claims,
        adoption: Adoption,
        checker: Checker,
        liveness: Liveness,
        deploy: Deploy,
        checkpoints: Checkpoints,
    ):
        self.shared = shared
        self.claims = claims
        self.adoption = adoption
        self.checker = checker
        self.liveness = liveness
        self.deploy = deploy
        self.checkpoints = checkpoints

    async def handle(self, req: stream_pb2.HeartbeatRequest) -> stream_pb2.HeartbeatReply:
        """One heartbeat, its handling time measured (``querycoord_stream_heartbeat_duration_seconds``)."""
        began = time.perf_counter()
        try:
            return await self._handle(req)
        finally:
            events.heartbeat_handled(time.perf_counter() - began)

    async def _handle(self, req: stream_pb2.HeartbeatRequest) -> stream_pb2.HeartbeatReply:
        shared = self.shared
        now = shared.clock()
        refused = self.claims.sender_refused(req)
        if refused:
            return self.claims.refuse(req, refused)
        self.claims.accepted(("node", req.node_id, 0))
        reply = stream_pb2.HeartbeatReply(leader_revision=shared.leader_revision)
        snode_id = self.claims.snode_claim(req, now)
        vgroups, moved = self.claims.vgroup_claims(req, now)
        self.checker.record_reports(req, now)
        if shared.state is ManagerState.WATCH and self.adoption.done():
            self.adoption.end()
        if shared.state is ManagerState.WATCH:
            self.adoption.record(req)
            if self.adoption.done():
                self.adoption.end()
            reply.watching = True
            return reply
        for vg in moved:
            self.liveness.vgroup_moved(vg, req.node_id, now)
        undeploys: dict[int, stream_pb2.StreamUndeploy] = {}
        triggers: list[stream_pb2.TaskStatusReport] = []
        orders: dict[int, int] = {}
        for rep in req.tasks:
            self._on_report(req.node_id, rep, now, reply, undeploys, orders)
            if rep.kind == TRIGGER:
                triggers.append(rep)
        reply.undeploys.extend(undeploys.values())
        self.checkpoints.settle({rep.stream_id for rep in req.tasks})
        reply.checkpoints.extend(self.checkpoints.orders(orders, set(undeploys)))
        for rep in triggers:
            rt = shared.streams.get(rep.stream_id)
            if rt is not None and rt.runner_update:
                self._maybe_runner_update(rt, rep, req.node_id, reply, set(undeploys))
        await self.deploy.plan_pending(now)
        self.deploy.hand_out(req.node_id, snode_id, set(vgroups), now, reply, set(undeploys))
        return reply

    def _undeploy(
        self,
        node_id: int,
        now: float,
        undeploys: dict[int, stream_pb2.StreamUndeploy],
        rep: stream_pb2.TaskStatusReport,
        *,
        checkpoint: bool = False,
        cleanup: bool = False,
    ) -> None:
        """Undeploy a reported instance; again on every report of it (level-triggered), counted when repeated."""
        shared = self.shared
        u = undeploys.setdefault(rep.stream_id, stream_pb2.StreamUndeploy(stream_id=rep.stream_id))
        u.checkpoint = u.checkpoint or checkpoint
        u.cleanup = u.cleanup or cleanup
        u.tasks.append(copy_fields(rep, stream_pb2.TaskId, node_id=node_id))
        sent = shared.undeploy_sent.setdefault(node_id, {})
        key = (rep.stream_id, rep.task_id, rep.sid)
        first, counted = sent.setdefault(key, (now, False))
        if first < now:
            shared.resent_actions += 1
            if not counted:  # one repair per instance, however often it is sent again
                shared.checker_repairs += 1
                sent[key] = (first, True)
                logger.warning("stream checker: node {} still runs task {} (SID {}) of stream {} {:.1f}s after its "
                               "undeploy was sent: sent again with every report of it", node_id, rep.task_id,
                               rep.sid, rep.stream_id, now - first)

    def _on_report(
        self,
        node_id: int,
        rep: stream_pb2.TaskStatusReport,
        now: float,
        reply: stream_pb2.HeartbeatReply,
        undeploys: dict[int, stream_pb2.StreamUndeploy],
        orders: dict[int, int],
    ) -> None:
        """TDengine's status update: stale instances are undeployed, the rest recorded and acted on.

        ``node_id`` is the session-verified sender; the node id written in the report is never used.
        """
        shared = self.shared
        if rep.status == stream_pb2.TASK_STATUS_UNSPECIFIED:
            return  # a report without a status says nothing (proto comment): never taken as INIT
        rt = shared.streams.get(rep.stream_id)
        if rt is None:
            self._undeploy(node_id, now, undeploys, rep, cleanup=True)  # dropped (or never known): state goes too
            return
        if rt.sdef.user_stopped or rt.error_stopped:
            if rep.status != stream_pb2.TASK_STOPPED:
                self._undeploy(node_id, now, undeploys, rep, checkpoint=True)
            return
        t = rt.tasks.get(rep.task_id)
        if t is None or t.task.sid != rep.sid or t.node_id != node_id or rep.task_id in rt.pending:
            if rep.status != stream_pb2.TASK_STOPPED:
                self._undeploy(node_id, now, undeploys, rep)
            return
        t.last_heard = now
        t.status = rep.status
        t.processed_ms, t.source_ms = rep.processed_ms, rep.source_ms  # kept in memory only: O(1) per report
        t.error_code, t.error_message = rep.error_code, rep.error_message
        self.checkpoints.on_report(rt, t, rep, orders)
        if rep.status == stream_pb2.TASK_RUNNING:
            if t.running_since is None:
                t.running_since = now
        else:
            t.running_since = None
        if rep.status == stream_pb2.TASK_FAILED:
            code = rep.error_code or STOP_TASK_FAILED  # a stop code is never 0
            if t.task.kind in READER_KINDS:
                self._undeploy(node_id, now, undeploys, rep)
                shared.redeploy_task(rt, t, now)
            else:
                reason = f"{stream_pb2.TaskKind.Name(t.task.kind)} task {t.task.task_id} failed: {rep.error_message}"
                shared.stop_by_error(rt, code, reason, now)
                undeploys[rep.stream_id] = stream_pb2.StreamUndeploy(
                    stream_id=rep.stream_id, undeploy_all=True, checkpoint=True
                )
            return
        if t.task.kind == TRIGGER and rep.status == stream_pb2.TASK_INIT:
            self._maybe_start(rt, t, now, reply)

    def _maybe_start(self, rt: StreamRuntime, trig: TaskRuntime, now: float, reply: stream_pb2.HeartbeatReply) -> None:
        """Start rule: every task INIT or RUNNING, and min_start_delay passed since the last deploy.

        Level-triggered: called for each report of the trigger INIT, so the
        start goes out again until the trigger reports RUNNING (a start lost
        with its reply is only late, never lost).
        """
        if rt.pending or now - rt.last_action < self.shared.config.min_start_delay:
            return
        if any(t.status not in ALIVE_STATUSES for t in rt.tasks.values()):
            return
        if trig.started_sid == trig.task.sid:
            self.shared.resent_actions += 1
            logger.info("stream {}: trigger {} (SID {}) still INIT: start sent again", rt.sdef.name, trig.task.task_id,
                        trig.task.sid)
        trig.started_sid = trig.task.sid
        reply.starts.append(
            stream_pb2.StreamStart(stream_id=rt.sdef.id, trigger=trig.task.to_proto(rt.sdef.id, trig.node_id),
                                   skip_until_ms=rt.sdef.start_from_ms)
        )

    def _maybe_runner_update(
        self,
        rt: StreamRuntime,
        rep: stream_pb2.TaskStatusReport,
        node_id: int,
        reply: stream_pb2.HeartbeatReply,
        skip: set[int],
    ) -> None:
        """Tell the trigger its new top runners until it reports them (level-triggered).

        Called for a stream with ``runner_update`` set whose trigger this node
        just reported. The update goes out once every redeployed runner was
        handed out (in an earlier reply); an undeploy of the stream in the same
        reply overrides it, and it waits for a later heartbeat. The flag is
        cleared only when the trigger's report lists the leader's top runners.
        """
        shared = self.shared
        trig = rt.trigger()
        if trig is None or rt.error_stopped or rt.sdef.user_stopped:
            return
        if rt.sdef.id in skip or trig.node_id != node_id or trig.task.task_id in rt.pending:
            return
        if (rep.task_id, rep.sid) != (trig.task.task_id, trig.task.sid):
            return
        if reported_tops(rep) == shared.top_keys(rt):
            rt.runner_update, rt.runner_update_sends = False, 0
            logger.info("stream {}: trigger {} feeds the new top runners", rt.sdef.name, trig.task.task_id)
            return
        if trig.status not in ALIVE_STATUSES:
            return
        if any(rt.tasks[i].task.kind == RUNNER for i in rt.pending):
            return  # not all handed out yet: the update would name runners nobody runs
        if rt.runner_update_sends:
            shared.resent_actions += 1
            logger.info("stream {}: trigger {} still reports old top runners: runner update sent again",
                        rt.sdef.name, trig.task.task_id)
        tops = [r.task.to_proto(rt.sdef.id, r.node_id) for r in shared.top_runners(rt)]
        reply.runner_updates.append(
            stream_pb2.RunnerUpdate(
                stream_id=rt.sdef.id, trigger=trig.task.to_proto(rt.sdef.id, trig.node_id), top_runners=tops
            )
        )
        rt.runner_update_sends += 1
