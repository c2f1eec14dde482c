"""Liveness: silent snodes, vgroups and tasks, and what their loss does to the streams on them.

Health check (every ``health_interval``, NORMAL and some stream exists):
``slot = (slot + 1) % health_slots`` and the snodes and vgroups whose id is
``slot`` modulo ``health_slots`` are checked, so each one every
``health_slots`` checks. An snode silent for ``isolation`` is lost: a stream
whose trigger is there is stopped with ``STOP_SNODE_LOST``; a stream with only
runners there gets them redeployed (whole runner deploys, same task ids,
SID + 1, new snodes from ``plan.place_runner_deploys``) and its trigger a
``RunnerUpdate`` with the new top runners once they are handed out. A vgroup
silent for ``isolation`` is lost; once lost for ``vgroup_lost_stop`` every
stream with a task on it is stopped with ``STOP_VGROUP_LOST``. A vgroup taken
over by another node (see ``claims``) gets its readers redeployed on the new
leader (same ids, SID + 1); the old instances are then undeployed as stale
when their node reports them.

``node_lost()`` (a node's meta session was deleted) runs the lost handling
for that node's snode and vgroups at once, at most once per ``isolation`` per
node.

Task silence (every tick): a task not heard of for ``task_silence`` is
redeployed (a reader) or stops its stream (a trigger or runner). It leaves
alone the tasks whose snode or vgroup is itself silent and not yet declared
lost: the host's handling decides for them. It is the backstop for tasks
whose stream group is never reported; the checker handles the others sooner.
"""

from __future__ import annotations

import dataclasses

from loguru import logger

from proto import stream_pb2
from querycoord.stream.plan import RUNNER, place_runner_deploys
from querycoord.stream.runtime import (
    READER_KINDS,
    STOP_NO_SNODE,
    STOP_SNODE_LOST,
    STOP_TASK_LOST,
    STOP_VGROUP_LOST,
    Heard,
    ManagerState,
    Runtime,
    StreamRuntime,
    TaskRuntime,
    due,
)
from querycoord.stream.store import NoSnodeAvailable


class Liveness:
    """The slotted health check, task silence, and the handling of a lost snode, vgroup or node."""

    def __init__(self, shared: Runtime):
        self.shared = shared
        self.health_slot = 0
        self.last_health: float | None = None
        # When node_lost() last acted on each node (damping).
        self.node_lost_at: dict[int, float] = {}

    def health_tick(self, now: float) -> None:
        if self.shared.streams and due(self.last_health, self.shared.config.health_interval, now):
            self.last_health = now
            self.health_check(now)

    def health_check(self, now: float) -> None:
        """One slot: the snodes and vgroups whose id % health_slots is the new slot index."""
        shared = self.shared
        slots = max(shared.config.health_slots, 1)
        self.health_slot = (self.health_slot + 1) % slots
        isolation = shared.config.isolation
        for snode_id, h in sorted(shared.snodes.items()):
            if snode_id % slots != self.health_slot or snode_id in shared.lost_snodes:
                continue
            if now - h.last_heard >= isolation:
                self.snode_lost(snode_id, now, f"snode {snode_id} silent for {now - h.last_heard:.1f}s")
        for vg, h in sorted(shared.vgroups.items()):
            if vg % slots != self.health_slot:
                continue
            self.check_vgroup(vg, h, now)

    def check_vgroup(self, vg: int, h: Heard, now: float) -> None:
        """Declare a silent vgroup lost; stop the streams on it once it was lost for ``vgroup_lost_stop``."""
        shared = self.shared
        since = shared.lost_vgroups.get(vg)
        if since is None:
            if now - h.last_heard < shared.config.isolation:
                return
            since = shared.lost_vgroups[vg] = now
            logger.info("vgroup {} lost (silent for {:.1f}s)", vg, now - h.last_heard)
        if now - since >= shared.config.vgroup_lost_stop:
            self.vgroup_lost_stop(vg, now)

    def snode_lost(self, snode_id: int, now: float, why: str) -> None:
        """An snode is lost: stop streams whose trigger is there, move the runners of the others elsewhere."""
        shared = self.shared
        shared.lost_snodes[snode_id] = now
        logger.info("{}: lost", why)
        for rt in shared.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped or not rt.tasks:
                continue
            trig = rt.trigger()
            if trig is not None and trig.task.snode_id == snode_id:
                shared.stop_by_error(rt, STOP_SNODE_LOST, f"{why}: it hosts the trigger", now)
                continue
            lost_deploys = sorted(
                {t.task.deploy_id for t in rt.tasks.values() if t.task.kind == RUNNER and t.task.snode_id == snode_id}
            )
            if lost_deploys:
                self.move_runners(rt, trig, lost_deploys, now, why)

    def move_runners(
        self, rt: StreamRuntime, trig: TaskRuntime | None, deploys: list[int], now: float, why: str
    ) -> None:
        """Redeploy whole runner deploys on live snodes: same task ids, SID + 1; the trigger is then updated."""
        shared = self.shared
        live = shared.live_snodes(now)
        n_deploys = 1 + max(t.task.deploy_id for t in rt.tasks.values() if t.task.kind == RUNNER)
        static = trig.task.snode_id if trig is not None else 0
        try:
            if not static:
                raise NoSnodeAvailable("the stream has no trigger snode")
            placement = place_runner_deploys(static, n_deploys, live, shared.rng)
        except NoSnodeAvailable as exc:
            shared.stop_by_error(rt, STOP_NO_SNODE, f"{why}: {exc.reason}", now)
            return
        for t in rt.tasks.values():
            if t.task.kind != RUNNER or t.task.deploy_id not in deploys:
                continue
            t.task = dataclasses.replace(t.task, snode_id=placement[t.task.deploy_id])
            shared.redeploy_task(rt, t, now)
        rt.runner_update, rt.runner_update_sends = True, 0
        logger.info("stream {}: runner deploys {} moved ({})", rt.sdef.name, deploys, why)

    def vgroup_lost_stop(self, vg: int, now: float) -> None:
        """Stop every stream with a reader on a vgroup lost for ``vgroup_lost_stop``."""
        shared = self.shared
        for rt in shared.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped:
                continue
            if any(t.task.kind in READER_KINDS and t.task.vgroup_id == vg for t in rt.tasks.values()):
                since = shared.lost_vgroups.get(vg, now)
                reason = f"vgroup {vg} lost for {now - since:.1f}s"
                shared.stop_by_error(rt, STOP_VGROUP_LOST, reason, now)

    def vgroup_moved(self, vg: int, new_node: int, now: float) -> None:
        """Vgroup leadership moved: its readers go to the new leader (same ids, SID + 1)."""
        for rt in self.shared.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped:
                continue
            for t in rt.tasks.values():
                p = t.task
                if p.kind in READER_KINDS and p.vgroup_id == vg and t.node_id not in (0, new_node):
                    if p.task_id not in rt.pending:
                        self.shared.redeploy_task(rt, t, now)
        logger.info("vgroup {} now led by node {}: its readers are redeployed there", vg, new_node)

    def node_lost(self, node_id: int) -> bool:
        """A node's meta session was deleted: handle its snode and vgroups as lost now (damped by isolation).

        Returns whether anything was done (False within ``isolation`` of the last call for this node). In
        WATCH, the node's snode and vgroups are only marked silent: the first health check after WATCH acts.
        """
        shared = self.shared
        now = shared.clock()
        last = self.node_lost_at.get(node_id)
        if last is not None and now - last < shared.config.isolation:
            return False
        self.node_lost_at[node_id] = now
        if shared.live_nodes is not None:
            shared.live_nodes.discard(node_id)
        shared.reports.pop(node_id, None)
        shared.undeploy_sent.pop(node_id, None)
        silent = now - shared.config.isolation
        snodes = sorted(s for s, h in shared.snodes.items() if h.node_id == node_id)
        vgroups = sorted(v for v, h in shared.vgroups.items() if h.node_id == node_id)
        for s in snodes:
            shared.snodes[s].last_heard = min(shared.snodes[s].last_heard, silent)
        for v in vgroups:
            shared.vgroups[v].last_heard = min(shared.vgroups[v].last_heard, silent)
        logger.info("node {} lost (session deleted): snodes {}, vgroups {}", node_id, snodes, vgroups)
        if shared.state is ManagerState.WATCH:
            return True
        for s in snodes:
            if s not in shared.lost_snodes:
                self.snode_lost(s, now, f"snode {s} of lost node {node_id}")
        for v in vgroups:
            self.check_vgroup(v, shared.vgroups[v], now)
        return True

    def silence_tick(self, now: float) -> None:
        """Tasks not heard of for task_silence: readers are redeployed, a silent trigger or runner stops its stream."""
        shared = self.shared
        silence = shared.config.task_silence
        for rt in shared.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped:
                continue
            for t in list(rt.tasks.values()):
                if t.task.task_id in rt.pending:
                    continue
                heard = t.last_heard if t.last_heard is not None else t.deployed_at
                if heard is None or now - heard < silence:
                    continue
                if self._host_silent(t, now):
                    continue  # the snode's or vgroup's own loss handling decides (health check)
                if t.task.kind in READER_KINDS:
                    shared.redeploy_task(rt, t, now)
                else:
                    kind = stream_pb2.TaskKind.Name(t.task.kind)
                    reason = f"{kind} task {t.task.task_id} on node {t.node_id} silent for {now - heard:.1f}s"
                    shared.stop_by_error(rt, STOP_TASK_LOST, reason, now)
                    break

    def _host_silent(self, t: TaskRuntime, now: float) -> bool:
        """Whether the task's vgroup (reader) or snode is silent and not yet declared lost."""
        shared = self.shared
        if t.task.kind in READER_KINDS:
            h, lost = shared.vgroups.get(t.task.vgroup_id), shared.lost_vgroups
            host = t.task.vgroup_id
        else:
            h, lost = shared.snodes.get(t.task.snode_id), shared.lost_snodes
            host = t.task.snode_id
        if h is None or host in lost:
            return False
        return now - h.last_heard >= shared.config.task_silence
