"""The stream manager's runtime: the leader's in-memory view of streams and their tasks.

Model: TDengine's mnode stream manager (``mndStreamMgmt.c``). Only stream and
snode definitions are persisted (``StreamStore``); everything here lives in
the leader's memory and is rebuilt on every leadership by a new
``StreamManager``, so a deposed leader's maps can never leak into the next one.

States:

* WATCH (after winning leadership, when streams exist): replies carry no
  actions so running tasks are undisturbed, and every reported task is
  recorded against the persisted definitions. WATCH ends by a timer
  (``watch_timeout``, checked on each heartbeat and by ``tick()``, so it ends
  even if no node ever reports: seed bug 7) or earlier once every live node
  has reported every stream group. Complete streams are then adopted as they
  run (same task ids and SIDs, no redeploy); incomplete ones are stopped with
  ``STOP_TASK_LOST`` and redeployed by the next ``tick()``. The completeness
  check uses ``plan.expected_counts``, the same rules deployment uses (seed
  bug 4). Any error while ending WATCH falls back to redeploying everything.
* NORMAL: heartbeats hand out pending deploys, undeploy stale instances,
  record statuses, start triggers and handle failures; ``tick()`` does the
  periodic part (the slotted health check, the stream checker, error-stop
  retries, task silence).

Health check (``tick()``, every ``health_interval``, NORMAL and some stream
exists): ``slot = (slot + 1) % health_slots`` and the snodes and vgroups whose
id is ``slot`` modulo ``health_slots`` are checked, so each one every
``health_slots`` checks. An snode silent for ``isolation`` is lost: a stream
whose trigger is there is stopped with ``STOP_SNODE_LOST``; a stream with only
runners there gets them redeployed (whole runner deploys, same task ids,
SID + 1, new snodes from ``plan.place_runner_deploys``) and its trigger a
``RunnerUpdate`` with the new top runners in a reply after the runners were
handed out (a plain flag, seed bug 1, cleared only when the trigger reports
the new top runners: seed hole 5). A vgroup silent for ``isolation`` is lost;
once lost for ``vgroup_lost_stop`` every stream with a task on it is stopped
with ``STOP_VGROUP_LOST``. A vgroup taken over by another node (leadership
moved, see the claim rules below) gets its readers redeployed on the new
leader (same ids, SID + 1); the old instances are then
undeployed as stale when their node reports them. ``node_lost()`` (a node's
meta session was deleted) runs the lost handling for that node's snode and
vgroups at once, at most once per ``isolation`` per node. Task silence leaves
alone the tasks whose snode or vgroup is itself silent and not yet declared
lost: the host's handling (above) decides for them.

Heartbeats are checked against the sender (seed hole 7). A heartbeat is
accepted only from a node id in the live stream-node session set the caller
feeds with ``set_live_nodes`` (none fed yet: every heartbeat is refused); a
refused heartbeat gets a reply with a NOT_FOUND status and no action. Of an
accepted heartbeat, the snode claim counts only when the snode is recorded
for that node id (``SnodeInfo.node_id``), and a vgroup claim only when no
other node holds it: the current holder keeps a vgroup until a heartbeat of
its own leaves it out, its session goes, or it is silent for ``isolation``,
so two claimants never make readers flap. Refused claims are counted
(``rejected_heartbeats``, ``rejected_claims``) and logged once per change,
never raised. WATCH records each report under the sender's session-verified
node id (never the id written in the report), and trigger and runner
reports only from the node that owns their snode.

Actions are level-triggered (seed hole 5): nothing is "sent once". A start is
put in every reply to a heartbeat that reports the trigger INIT while the
start rule holds, until the trigger reports RUNNING; a RunnerUpdate is put in
every reply to a heartbeat that reports the trigger with other top runners
than the leader's, until it reports the leader's; an undeploy in every reply
to a heartbeat that still reports the stale instance. A lost reply (node
timeout, or one refused as a whole) therefore only delays an action. Planning
errors are logged and counted per stream and never replace the reply.

Adoption restores every field of a task as deployed (seed hole 12): reports
carry the whole identity, and ``plan.task_layout`` (the slots ``plan_stream``
fills) restores what an older node leaves out and rejects reports that do
not fit the persisted definition.

The stream checker compares what should run with what runs and repairs
through the normal deploy path, counting each repair in ``checker_repairs``
and logging what differed:

* ``refresh()`` (the caller's stream loop): persisted definitions against
  the leader's streams (a missed create, drop, stop or start). Streams
  notified while the store was being read are left alone: the read is older.
* ``tick()``, every ``check_interval``: each task against the last report of
  its stream group by the node it was handed to. A report received after the
  hand-out that lacks the task means the task is on no node (its deploy reply
  was lost, or the node lost it): it is redeployed (same task id, SID + 1; a
  top runner's trigger then gets a RunnerUpdate). A stream that should run
  but has no task and none being planned is planned again.
* heartbeats: a node still reporting a task of a dropped or stopped stream
  (or a stale instance) after its undeploy was sent gets the undeploy again.

Task silence stays the backstop for tasks whose group is never reported.
Every part of ``tick()`` runs on its own: an error is logged and counted
(``errors``) and the other parts still run.

Task ids come from the store's etcd id allocator, so they are never reused
across leaders and need no "+100000" gap after WATCH.

Durations are measured with the injected monotonic ``clock``; ShowStreams
converts them to unix milliseconds only for display.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from loguru import logger

from meta.errors import NotLeader
from proto import common_pb2, stream_pb2
from querycoord import metrics
from querycoord.config import StreamConfig
from querycoord.messages import copy_fields
from querycoord.stream.plan import (
    CALC_READER,
    RUNNER,
    TRIGGER,
    TRIGGER_READER,
    PlannedTask,
    Slot,
    expected_counts,
    place_runner_deploys,
    plan_stream,
    task_layout,
)
from querycoord.stream.store import NoSnodeAvailable, StreamError, StreamStore

READER_KINDS = frozenset({TRIGGER_READER, CALC_READER})
ALIVE_STATUSES = frozenset({stream_pb2.TASK_INIT, stream_pb2.TASK_RUNNING})

# Why a stream was stopped by an error (StreamStatusInfo.stop_error_code). Never 0 for a stop (seed bug 2).
STOP_TASK_LOST = 1001
STOP_TASK_FAILED = 1002
STOP_NO_SNODE = 1003
STOP_SNODE_LOST = 1004
STOP_VGROUP_LOST = 1005

# Refused claims remembered for logging once per change; past this many (a node id sweep) the memory restarts.
MAX_REJECTIONS = 1000

TaskKey = tuple[int, int, int]  # (stream_id, task_id, sid): one task instance
WatchReport = tuple[int, stream_pb2.TaskStatusReport]  # (session-verified node id, report)


class ManagerState(Enum):
    WATCH = "watch"
    NORMAL = "normal"


@dataclass(slots=True)
class TaskRuntime:
    """One task as the leader knows it: the planned identity (current SID), where it runs and what it last said."""

    task: PlannedTask
    # 0 while the deploy is pending (not yet handed to a node).
    node_id: int = 0
    status: int = stream_pb2.TASK_STATUS_UNSPECIFIED
    last_heard: float | None = None
    deployed_at: float | None = None
    running_since: float | None = None
    error_code: int = 0
    error_message: str = ""
    # The SID whose trigger was last sent a start: a start sent again for it is a re-send (counted). Starts are
    # level-triggered: sent while the trigger reports INIT, whatever this says.
    started_sid: int = 0


@dataclass(slots=True)
class StreamRuntime:
    """One stream in the leader's memory (TDengine's streamMap entry)."""

    sdef: stream_pb2.StreamDef
    tasks: dict[int, TaskRuntime] = field(default_factory=dict)
    # Task ids whose deploy has not been handed out yet.
    pending: set[int] = field(default_factory=set)
    stop_code: int = 0
    stop_reason: str = ""
    deploy_times: int = 0
    last_action: float = 0.0
    retries: int = 0
    next_retry: float | None = None
    # Runners were redeployed: the trigger gets a RunnerUpdate once they are handed out. A plain bool (seed bug 1
    # cleared it with a wrong mask), set on redeploy and cleared only when the trigger REPORTS the new top runners
    # (seed hole 5: clearing it when the update was put in a reply lost the update with the reply).
    runner_update: bool = False
    runner_update_sends: int = 0

    @property
    def error_stopped(self) -> bool:
        return self.stop_code != 0

    def trigger(self) -> TaskRuntime | None:
        return next((t for t in self.tasks.values() if t.task.kind == TRIGGER), None)


@dataclass(slots=True)
class Heard:
    """Who leads a vgroup or hosts an snode, and when that was last reported."""

    node_id: int
    last_heard: float
    # Vgroups: False once a heartbeat of this node left the vgroup out (another node may take it at once).
    claiming: bool = True


@dataclass(frozen=True, slots=True)
class GroupReport:
    """One node's last report of one stream group: when it came and which task instances it held."""

    at: float
    keys: frozenset[TaskKey]


@dataclass(slots=True)
class NodeReports:
    """The last report of each stream group of one node (reset when its number of groups changes)."""

    groups: int
    by_group: dict[int, GroupReport] = field(default_factory=dict)


class StreamManager:
    """The leader's stream runtime: heartbeat handling, WATCH adoption, failure handling (module docstring).

    Not thread-safe; all calls come from the coordinator's event loop. The
    caller feeds ``set_live_nodes`` (from meta sessions), calls ``tick()``
    periodically, and notifies ``put_stream``/``remove_stream`` after each
    committed store txn.
    """

    def __init__(
        self,
        store: StreamStore,
        *,
        leader_revision: int,
        config: StreamConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ):
        self.store = store
        self.leader_revision = leader_revision
        self.config = config or StreamConfig()
        self.clock = clock
        self.rng = rng or random.Random()
        self.state = ManagerState.NORMAL
        self.state_since = clock()
        self.streams: dict[int, StreamRuntime] = {}
        self.vgroups: dict[int, Heard] = {}
        self.snodes: dict[int, Heard] = {}
        self.replica_of: dict[int, int] = {}
        # Each snode's node as recorded in the store: the only node whose claim of the snode counts.
        self.snode_owner: dict[int, int] = {}
        self.live_nodes: set[int] | None = None
        # The vgroups each node holds (those of ``vgroups`` naming it): a heartbeat releases the ones it leaves out.
        self._held: dict[int, set[int]] = {}
        # Streams that need a plan (new, or error-stopped whose retry came, or WATCH fell back).
        self._to_plan: set[int] = set()
        self._plan_lock = asyncio.Lock()
        # WATCH: reports per stream (under the sender's verified node id) and which stream groups each node reported.
        self._watch_reports: dict[int, dict[int, WatchReport]] = {}
        self._watch_groups: dict[int, tuple[set[int], int]] = {}
        # Health check: the current slot, when it last ran, the snodes and vgroups declared lost (and when),
        # and when node_lost() last acted on each node (damping).
        self.health_slot = 0
        self._last_health: float | None = None
        self.lost_snodes: dict[int, float] = {}
        self.lost_vgroups: dict[int, float] = {}
        self._node_lost_at: dict[int, float] = {}
        # Heartbeat verification: refused claims as last logged, by (what, node, target).
        self._rejections: dict[tuple[str, int, int], str] = {}
        # The checker: each node's last report per stream group, undeploys sent and not yet seen to take effect
        # (node -> instance -> when first sent, whether counted as a repair), when the task check last ran.
        self._reports: dict[int, NodeReports] = {}
        self._undeploy_sent: dict[int, dict[TaskKey, tuple[float, bool]]] = {}
        self._last_check: float | None = None
        # refresh() leaves alone the streams notified (put_stream, remove_stream) after its read began.
        self._notify_seq = 0
        self._notified: dict[int, int] = {}
        self._plan_error = ""
        # Counters for tests, drills and benchmarks.
        self.adopted = 0
        self.redeploys = 0
        self.checker_repairs = 0
        self.rejected_heartbeats = 0
        self.rejected_claims = 0
        self.resent_actions = 0
        self.errors = 0

    # ----- lifecycle -------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the persisted streams and snodes; WATCH when any stream exists (running tasks may be out there)."""
        await self._load_snodes()
        for sdef in await self.store.list_streams():
            self.streams[sdef.id] = StreamRuntime(sdef=sdef, last_action=self.clock())
        self.state = ManagerState.WATCH if self.streams else ManagerState.NORMAL
        self.state_since = self.clock()
        if self.state is ManagerState.NORMAL:
            self._to_plan.update(self.streams)
        logger.info("stream manager starts in {} with {} streams", self.state.value, len(self.streams))

    async def _load_snodes(self) -> None:
        snodes = await self.store.list_snodes()
        self.replica_of = {s.id: s.replica_id for s in snodes}
        self.snode_owner = {s.id: s.node_id for s in snodes}

    def set_live_nodes(self, node_ids: Iterable[int]) -> None:
        """The nodes with a live meta session: only they are heard, and WATCH ends early once all of them
        reported every stream group."""
        self.live_nodes = set(node_ids)
        for node in [n for n in self._reports if n not in self.live_nodes]:
            del self._reports[node]
        for node in [n for n in self._undeploy_sent if n not in self.live_nodes]:
            del self._undeploy_sent[node]

    def _notify(self, stream_id: int) -> None:
        self._notify_seq += 1
        self._notified[stream_id] = self._notify_seq

    def put_stream(self, sdef: stream_pb2.StreamDef) -> None:
        """A committed create, stop or start (called after the store's txn, never before: seed bug 6)."""
        self._notify(sdef.id)
        self._put(sdef)

    def _put(self, sdef: stream_pb2.StreamDef) -> None:
        rt = self.streams.get(sdef.id)
        if rt is None:
            rt = self.streams[sdef.id] = StreamRuntime(sdef=sdef, last_action=self.clock())
            if self.state is ManagerState.NORMAL:
                self._to_plan.add(sdef.id)
            return
        was_stopped = rt.sdef.user_stopped
        rt.sdef = sdef
        if sdef.user_stopped:
            # Tasks are undeployed (with checkpoint) as they report; nothing is pending any more.
            self._clear_tasks(rt)
            self._to_plan.discard(sdef.id)
        elif was_stopped and self.state is ManagerState.NORMAL:
            rt.stop_code, rt.stop_reason, rt.retries, rt.next_retry = 0, "", 0, None
            self._to_plan.add(sdef.id)

    def remove_stream(self, stream_id: int) -> None:
        """A committed drop: forget the stream; its tasks are undeployed with cleanup when they report."""
        self._notify(stream_id)
        self._remove(stream_id)

    def _remove(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)
        self._to_plan.discard(stream_id)
        self._watch_reports.pop(stream_id, None)

    async def refresh(self) -> None:
        """The stream loop and the checker's definition part: re-read the store and reconcile.

        A stream created, dropped, stopped or started without the manager
        being told is a missed notification: repaired, counted and logged. A
        stream notified while the store was being read is skipped (the read
        may predate its txn: acting on it would resurrect a dropped stream or
        drop a new one). Other differences (a main snode moved by an snode
        drop) are ordinary updates.
        """
        seq = self._notify_seq
        await self._load_snodes()
        persisted = {s.id: s for s in await self.store.list_streams()}

        def fresh(stream_id: int) -> bool:
            return self._notified.get(stream_id, 0) <= seq

        for stream_id in [s for s in self.streams if s not in persisted and fresh(s)]:
            self._repaired(self.streams[stream_id], "in the leader's memory but no longer persisted (a missed "
                                                    "drop): forgotten, its tasks are undeployed with cleanup")
            self._remove(stream_id)
        for sdef in persisted.values():
            rt = self.streams.get(sdef.id)
            if not fresh(sdef.id) or (rt is not None and rt.sdef == sdef):
                continue
            if rt is None:
                then = "kept stopped" if sdef.user_stopped else "planned"
                self._repaired_def(sdef, f"persisted but unknown to the leader (a missed create): {then}")
            elif rt.sdef.user_stopped != sdef.user_stopped:
                now_state = "stopped" if sdef.user_stopped else "started"
                self._repaired_def(sdef, f"persisted {now_state} by a user, the leader had it "
                                         f"{'running' if sdef.user_stopped else 'stopped'} (a missed notification)")
            self._put(sdef)
        self._notified = {s: n for s, n in self._notified.items() if n > seq}

    # ----- WATCH -----------------------------------------------------------------------------------------------------
    def _watch_record(self, req: stream_pb2.HeartbeatRequest) -> None:
        """Record an accepted heartbeat's reports under its (session-verified) sender, never the report's node id.

        A trigger or runner counts only from the node its snode is recorded
        for; of two nodes reporting the same reader, the vgroup's holder wins.
        """
        node = req.node_id
        groups, _ = self._watch_groups.get(node, (set(), 0))
        groups.add(req.stream_group)
        self._watch_groups[node] = (groups, max(req.num_stream_groups, 1))
        for rep in req.tasks:
            if rep.stream_id not in self.streams:
                continue
            if rep.kind not in READER_KINDS and self.snode_owner.get(rep.snode_id) != node:
                kind = stream_pb2.TaskKind.Name(rep.kind) if rep.kind in stream_pb2.TaskKind.values() else rep.kind
                self._reject_claim(("task", node, rep.task_id),
                                   f"node {node} reports {kind} task {rep.task_id} of stream {rep.stream_id} on "
                                   f"snode {rep.snode_id}, which is not recorded for it: not adopted")
                continue
            reports = self._watch_reports.setdefault(rep.stream_id, {})
            held = reports.get(rep.task_id)
            if held is not None and held[0] != node and not self._leads(node, rep.vgroup_id):
                continue
            reports[rep.task_id] = (node, rep)

    def _leads(self, node_id: int, vgroup_id: int) -> bool:
        h = self.vgroups.get(vgroup_id)
        return h is not None and h.node_id == node_id and h.claiming

    def _watch_done(self) -> bool:
        if self.clock() - self.state_since >= self.config.watch_timeout:
            return True
        if not self.live_nodes:
            return False
        for node in self.live_nodes:
            groups, total = self._watch_groups.get(node, (set(), 1))
            if len(groups) < total:
                return False
        return True

    def _end_watch(self) -> None:
        """Adopt complete streams, stop incomplete ones; on any error, redeploy everything (safe fallback)."""
        now = self.clock()
        try:
            for stream_id, rt in self.streams.items():
                if rt.sdef.user_stopped:
                    continue
                reports = self._watch_reports.get(stream_id, {})
                if self._complete(rt.sdef, reports):
                    self._adopt(rt, reports, now)
                else:
                    have = len(reports)
                    reason = f"after a leader change {have} of {expected_counts(rt.sdef).total} tasks reported"
                    self._stop_by_error(rt, STOP_TASK_LOST, reason, now)
                    # Redeployed by the next tick, not after the back-off: a leader change is not a repeated
                    # failure, and the new deploy's fresh task ids make any leftover instance stale.
                    rt.next_retry = now
        except Exception:
            logger.exception("ending WATCH failed: every stream is redeployed")
            for rt in self.streams.values():
                self._clear_tasks(rt)
                rt.stop_code, rt.stop_reason, rt.next_retry = 0, "", None
            self._to_plan = {s for s, rt in self.streams.items() if not rt.sdef.user_stopped}
        self._watch_reports.clear()
        self._watch_groups.clear()
        self.state = ManagerState.NORMAL
        self.state_since = now
        logger.info("WATCH ended: {} streams adopted", self.adopted)

    @staticmethod
    def _complete(sdef: stream_pb2.StreamDef, reports: dict[int, WatchReport]) -> bool:
        """Whether the reports fill every slot of ``plan.task_layout`` exactly once, alive and fitting the slot.

        The same layout ``plan_stream`` deploys (seed bug 4), checked slot by
        slot: a reader on another vgroup, or a task whose reported scan plan or
        top flag differs from its slot's, is not the task that was planned.
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

    def _adopt(self, rt: StreamRuntime, reports: dict[int, WatchReport], now: float) -> None:
        """Take a complete stream over as it runs: every task exactly as deployed, on the node that reported it.

        Fields a report lacks (an older node) come from the slot in
        ``task_layout``, which ``_complete`` has checked the report against.
        Readers whose vgroup another node holds now are moved there (SID + 1);
        a trigger reporting other top runners than the adopted ones gets a
        RunnerUpdate (the old leader's update may have been lost with it).
        """
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
            )
        rt.pending.clear()
        for t in rt.tasks.values():
            if t.task.kind == TRIGGER and t.status == stream_pb2.TASK_RUNNING:
                t.started_sid = t.task.sid
        trig_rep = next((r for _, r in reports.values() if r.kind == TRIGGER), None)
        if trig_rep is not None and trig_rep.top_runners and _reported_tops(trig_rep) != self._top_keys(rt):
            rt.runner_update, rt.runner_update_sends = True, 0
        for t in rt.tasks.values():
            h = self.vgroups.get(t.task.vgroup_id)
            if t.task.kind in READER_KINDS and h is not None and h.claiming and h.node_id != t.node_id:
                self._redeploy_task(rt, t, now)
        self.adopted += 1

    # ----- heartbeat -------------------------------------------------------------------------------------------------
    async def handle_heartbeat(self, req: stream_pb2.HeartbeatRequest) -> stream_pb2.HeartbeatReply:
        """One node's heartbeat for one stream group: the reply carries this leader's revision and its actions.

        Refused (NOT_FOUND status, no action) unless the node has a live
        session; of an accepted one, only the verified snode and vgroup claims
        count (module docstring). Its handling time is measured
        (``querycoord_stream_heartbeat_duration_seconds``).
        """
        began = time.perf_counter()
        try:
            return await self._handle_heartbeat(req)
        finally:
            metrics.heartbeat_handled(time.perf_counter() - began)

    async def _handle_heartbeat(self, req: stream_pb2.HeartbeatRequest) -> stream_pb2.HeartbeatReply:
        now = self.clock()
        refused = self._sender_refused(req)
        if refused:
            return self._refuse(req, refused)
        self._accepted(("node", req.node_id, 0))
        reply = stream_pb2.HeartbeatReply(leader_revision=self.leader_revision)
        snode_id = self._snode_claim(req, now)
        vgroups, moved = self._vgroup_claims(req, now)
        self._record_reports(req, now)
        if self.state is ManagerState.WATCH and self._watch_done():
            self._end_watch()
        if self.state is ManagerState.WATCH:
            self._watch_record(req)
            if self._watch_done():
                self._end_watch()
            reply.watching = True
            return reply
        for vg in moved:
            self._vgroup_moved(vg, req.node_id, now)
        undeploys: dict[int, stream_pb2.StreamUndeploy] = {}
        triggers: list[stream_pb2.TaskStatusReport] = []
        for rep in req.tasks:
            self._on_report(req.node_id, rep, now, reply, undeploys)
            if rep.kind == TRIGGER:
                triggers.append(rep)
        reply.undeploys.extend(undeploys.values())
        for rep in triggers:
            rt = self.streams.get(rep.stream_id)
            if rt is not None and rt.runner_update:
                self._maybe_runner_update(rt, rep, req.node_id, reply, set(undeploys))
        await self._plan_pending(now)
        self._hand_out(req.node_id, snode_id, set(vgroups), now, reply, set(undeploys))
        return reply

    # ----- heartbeat verification ------------------------------------------------------------------------------------
    def _sender_refused(self, req: stream_pb2.HeartbeatRequest) -> str:
        """Why the sender is not heard ('' when it is): only nodes with a live stream-node session are."""
        if req.node_id <= 0:
            return f"node id {req.node_id} is not a session id"
        if self.live_nodes is None:
            return "the leader does not know the live stream node sessions yet; heartbeat again"
        if req.node_id not in self.live_nodes:
            return f"node {req.node_id} has no live stream node session (register one, role streamnode)"
        return ""

    def _refuse(self, req: stream_pb2.HeartbeatRequest, reason: str) -> stream_pb2.HeartbeatReply:
        self.rejected_heartbeats += 1
        self._note_rejection(("node", req.node_id, 0), f"heartbeat of node {req.node_id} refused: {reason}")
        return stream_pb2.HeartbeatReply(
            leader_revision=self.leader_revision,
            status=common_pb2.Status(error_code=common_pb2.NOT_FOUND, reason=reason),
        )

    def _snode_claim(self, req: stream_pb2.HeartbeatRequest, now: float) -> int:
        """The snode this heartbeat may speak for: the claimed one if recorded for the sender, else 0."""
        snode_id, node = req.snode_id, req.node_id
        if not snode_id:
            return 0
        owner = self.snode_owner.get(snode_id)
        if owner != node:
            why = f"it is recorded for node {owner}" if owner is not None else "no such snode is recorded"
            self._reject_claim(("snode", node, snode_id), f"node {node} claims snode {snode_id}, but {why}: ignored")
            return 0
        self._accepted(("snode", node, snode_id))
        self.snodes[snode_id] = Heard(node, now)
        self.lost_snodes.pop(snode_id, None)
        return snode_id

    def _vgroup_claims(self, req: stream_pb2.HeartbeatRequest, now: float) -> tuple[list[int], list[int]]:
        """The vgroups this heartbeat may speak for, and those of them that moved to the sender.

        Vgroups the sender held and no longer claims are released. A claim of
        a vgroup another node holds (``_holds``) is refused: the holder keeps
        it, so two claimants cannot make its readers flap.
        """
        node, claimed = req.node_id, set(req.vgroup_ids)
        held = self._held.setdefault(node, set())
        for vg in held - claimed:
            self.vgroups[vg].claiming = False
        if self._rejections:
            for key in [k for k in self._rejections if k[0] == "vgroup" and k[1] == node and k[2] not in claimed]:
                del self._rejections[key]
        accepted: list[int] = []
        moved: list[int] = []
        for vg in sorted(claimed):
            prev = self.vgroups.get(vg)
            if prev is not None and prev.node_id != node and self._holds(prev, now):
                self._reject_claim(("vgroup", node, vg), f"node {node} claims vgroup {vg}, which node "
                                                         f"{prev.node_id} still claims: it stays there")
                continue
            self._accepted(("vgroup", node, vg))
            if prev is not None and prev.node_id != node:
                moved.append(vg)
                self._held.get(prev.node_id, set()).discard(vg)
            held.add(vg)
            self.vgroups[vg] = Heard(node, now)
            self.lost_vgroups.pop(vg, None)
            accepted.append(vg)
        return accepted, moved

    def _holds(self, h: Heard, now: float) -> bool:
        """Whether a vgroup's holder keeps it: still claiming, session live, heard within isolation."""
        live = self.live_nodes is not None and h.node_id in self.live_nodes
        return h.claiming and live and now - h.last_heard < self.config.isolation

    def _reject_claim(self, key: tuple[str, int, int], message: str) -> None:
        self.rejected_claims += 1
        self._note_rejection(key, message)

    def _note_rejection(self, key: tuple[str, int, int], message: str) -> None:
        """Log a refusal once per change (the same refusal on every heartbeat would flood the log)."""
        if self._rejections.get(key) == message:
            return
        if len(self._rejections) >= MAX_REJECTIONS:
            self._rejections.clear()
        self._rejections[key] = message
        logger.warning("{}", message)

    def _accepted(self, key: tuple[str, int, int]) -> None:
        message = self._rejections.pop(key, None)
        if message is not None:
            logger.info("accepted again after: {}", message)

    # ----- reports -----------------------------------------------------------------------------------------------
    def _record_reports(self, req: stream_pb2.HeartbeatRequest, now: float) -> None:
        """Keep the node's report of this stream group for the checker; forget undeploys that took effect."""
        groups = req.num_stream_groups
        if groups < 1:
            return  # no group information: the checker cannot tell a missing task from an unreported one
        node, group = req.node_id, req.stream_group % groups
        nr = self._reports.get(node)
        if nr is None or nr.groups != groups:
            nr = self._reports[node] = NodeReports(groups)
        keys = frozenset((r.stream_id, r.task_id, r.sid) for r in req.tasks)
        nr.by_group[group] = GroupReport(now, keys)
        sent = self._undeploy_sent.get(node)
        if sent:
            for key in [k for k in sent if k[0] % groups == group and k not in keys]:
                del sent[key]

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
        u = undeploys.setdefault(rep.stream_id, stream_pb2.StreamUndeploy(stream_id=rep.stream_id))
        u.checkpoint = u.checkpoint or checkpoint
        u.cleanup = u.cleanup or cleanup
        u.tasks.append(copy_fields(rep, stream_pb2.TaskId, node_id=node_id))
        sent = self._undeploy_sent.setdefault(node_id, {})
        key = (rep.stream_id, rep.task_id, rep.sid)
        first, counted = sent.setdefault(key, (now, False))
        if first < now:
            self.resent_actions += 1
            if not counted:  # one repair per instance, however often it is sent again
                self.checker_repairs += 1
                sent[key] = (first, True)
                logger.warning("stream checker: node {} still runs task {} (SID {}) of stream {} {:.1f}s after its "
                            "undeploy was sent: sent again with every report of it", node_id, rep.task_id, rep.sid,
                            rep.stream_id, now - first)

    def _on_report(
        self,
        node_id: int,
        rep: stream_pb2.TaskStatusReport,
        now: float,
        reply: stream_pb2.HeartbeatReply,
        undeploys: dict[int, stream_pb2.StreamUndeploy],
    ) -> None:
        """TDengine's status update: stale instances are undeployed, the rest recorded and acted on.

        ``node_id`` is the session-verified sender; the node id written in the report is never used.
        """
        if rep.status == stream_pb2.TASK_STATUS_UNSPECIFIED:
            return  # a report without a status says nothing (proto comment): never taken as INIT
        rt = self.streams.get(rep.stream_id)
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
        t.error_code, t.error_message = rep.error_code, rep.error_message
        if rep.status == stream_pb2.TASK_RUNNING:
            if t.running_since is None:
                t.running_since = now
        else:
            t.running_since = None
        if rep.status == stream_pb2.TASK_FAILED:
            code = rep.error_code or STOP_TASK_FAILED  # never stop with code 0 (seed bug 2)
            if t.task.kind in READER_KINDS:
                self._undeploy(node_id, now, undeploys, rep)
                self._redeploy_task(rt, t, now)
            else:
                reason = f"{stream_pb2.TaskKind.Name(t.task.kind)} task {t.task.task_id} failed: {rep.error_message}"
                self._stop_by_error(rt, code, reason, now)
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
        with its reply is only late, never lost: seed hole 5).
        """
        if rt.pending or now - rt.last_action < self.config.min_start_delay:
            return
        if any(t.status not in ALIVE_STATUSES for t in rt.tasks.values()):
            return
        if trig.started_sid == trig.task.sid:
            self.resent_actions += 1
            logger.info("stream {}: trigger {} (SID {}) still INIT: start sent again", rt.sdef.name, trig.task.task_id,
                     trig.task.sid)
        trig.started_sid = trig.task.sid
        reply.starts.append(
            stream_pb2.StreamStart(stream_id=rt.sdef.id, trigger=trig.task.to_proto(rt.sdef.id, trig.node_id))
        )

    def _top_runners(self, rt: StreamRuntime) -> list[TaskRuntime]:
        tops = [r for r in rt.tasks.values() if r.task.kind == RUNNER and r.task.top]
        return sorted(tops, key=lambda r: r.task.deploy_id)

    def _top_keys(self, rt: StreamRuntime) -> set[tuple[int, int]]:
        return {(r.task.task_id, r.task.sid) for r in self._top_runners(rt)}

    def _maybe_runner_update(
        self,
        rt: StreamRuntime,
        rep: stream_pb2.TaskStatusReport,
        node_id: int,
        reply: stream_pb2.HeartbeatReply,
        skip: set[int],
    ) -> None:
        """Tell the trigger its new top runners until it reports them (level-triggered: seed hole 5).

        Called for a stream with ``runner_update`` set whose trigger this node
        just reported. The update goes out once every redeployed runner was
        handed out (in an earlier reply); an undeploy of the stream in the same
        reply overrides it, and it waits for a later heartbeat. The flag is
        cleared only when the trigger's report lists the leader's top runners.
        """
        trig = rt.trigger()
        if trig is None or rt.error_stopped or rt.sdef.user_stopped:
            return
        if rt.sdef.id in skip or trig.node_id != node_id or trig.task.task_id in rt.pending:
            return
        if (rep.task_id, rep.sid) != (trig.task.task_id, trig.task.sid):
            return
        if _reported_tops(rep) == self._top_keys(rt):
            rt.runner_update, rt.runner_update_sends = False, 0
            logger.info("stream {}: trigger {} feeds the new top runners", rt.sdef.name, trig.task.task_id)
            return
        if trig.status not in ALIVE_STATUSES:
            return
        if any(rt.tasks[i].task.kind == RUNNER for i in rt.pending):
            return  # not all handed out yet: the update would name runners nobody runs
        if rt.runner_update_sends:
            self.resent_actions += 1
            logger.info("stream {}: trigger {} still reports old top runners: runner update sent again",
                     rt.sdef.name, trig.task.task_id)
        tops = [r.task.to_proto(rt.sdef.id, r.node_id) for r in self._top_runners(rt)]
        reply.runner_updates.append(
            stream_pb2.RunnerUpdate(
                stream_id=rt.sdef.id, trigger=trig.task.to_proto(rt.sdef.id, trig.node_id), top_runners=tops
            )
        )
        rt.runner_update_sends += 1

    def _redeploy_task(self, rt: StreamRuntime, t: TaskRuntime, now: float) -> None:
        """Redeploy one reader alone: same task id, SID + 1, handed out by a later heartbeat."""
        t.task = dataclasses.replace(t.task, sid=t.task.sid + 1)
        t.node_id, t.status, t.last_heard, t.running_since = 0, stream_pb2.TASK_STATUS_UNSPECIFIED, None, None
        rt.pending.add(t.task.task_id)
        rt.last_action = now
        self.redeploys += 1

    def _stop_by_error(self, rt: StreamRuntime, code: int, reason: str, now: float) -> None:
        """Stop a stream by an error, with back-off; its tasks are undeployed as they report."""
        trig = rt.trigger()
        if trig is not None and trig.running_since is not None and now - trig.running_since >= self.config.reset_after:
            rt.retries = 0
        rt.retries += 1
        delay = self.config.error_retry_delay if rt.retries <= self.config.fast_retries else self.config.max_retry_delay
        rt.stop_code, rt.stop_reason, rt.next_retry = code, reason, now + delay
        self._clear_tasks(rt)
        self._to_plan.discard(rt.sdef.id)
        logger.info("stream {} stopped by error {} ({}); retry in {:.1f}s", rt.sdef.name, code, reason, delay)

    def _clear_tasks(self, rt: StreamRuntime) -> None:
        rt.tasks.clear()
        rt.pending.clear()
        rt.runner_update, rt.runner_update_sends = False, 0

    async def _plan_pending(self, now: float) -> None:
        """Plan every stream waiting for a deploy (fresh task ids, SID 1); streams without a live snode wait.

        Heartbeats are handled concurrently and planning awaits the id
        allocator: one planner at a time, and each stream re-checked after the
        wait, or two overlapping heartbeats would plan (and hand out) the same
        stream twice (found by tests/test_stream_failover.py).
        """
        async with self._plan_lock:
            await self._plan_pending_locked(now)

    async def _plan_pending_locked(self, now: float) -> None:
        if not self._to_plan:
            return
        live_snodes = self._live_snodes(now)
        for stream_id in sorted(self._to_plan):
            rt = self.streams.get(stream_id)
            if rt is None or rt.sdef.user_stopped or rt.error_stopped:
                self._to_plan.discard(stream_id)
                continue
            try:
                total = expected_counts(rt.sdef).total
                ids = list(await self.store.task_ids.allocate(total))

                def take(n: int, ids: list[int] = ids) -> list[int]:
                    return ids[:n]

                plan = plan_stream(rt.sdef, None, live_snodes, self.replica_of, take, self.rng)
            except NoSnodeAvailable:
                continue  # retried on the next heartbeat, once an snode reports
            except StreamError as exc:
                self._stop_by_error(rt, STOP_NO_SNODE, exc.reason, now)
                continue
            except NotLeader:
                raise  # deposed: the service drops leadership
            except Exception as exc:  # e.g. etcd unreachable: the stream stays queued, the reply still goes out
                self._plan_failed(rt, exc)
                continue
            if (self.streams.get(stream_id) is not rt or stream_id not in self._to_plan
                    or rt.sdef.user_stopped or rt.error_stopped):
                continue  # stopped, dropped or replaced while the ids were being reserved
            if self._plan_error:
                logger.info("stream planning works again (after: {})", self._plan_error)
                self._plan_error = ""
            rt.tasks = {p.task_id: TaskRuntime(task=p) for p in plan.tasks()}
            rt.pending = set(rt.tasks)
            rt.deploy_times += 1
            rt.last_action = now
            self._to_plan.discard(stream_id)

    def _plan_failed(self, rt: StreamRuntime, exc: Exception) -> None:
        """Planning one stream raised: count it, log once per distinct error, retry on the next heartbeat.

        Never raised out of the heartbeat: the reply carries starts, updates
        and undeploys of other streams, which a failed reply would lose.
        """
        self.errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if message != self._plan_error:
            self._plan_error = message
            logger.warning("planning stream {} failed ({}); retried on the next heartbeat", rt.sdef.name, message)

    def _hand_out(
        self,
        node_id: int,
        snode_id: int,
        vgroups: set[int],
        now: float,
        reply: stream_pb2.HeartbeatReply,
        skip: set[int],
    ) -> None:
        """Give this node the pending tasks of the vgroups and the snode it was verified to speak for."""
        for stream_id, rt in self.streams.items():
            if not rt.pending or stream_id in skip:
                continue
            deploy = stream_pb2.StreamDeploy(stream_id=stream_id, stream_name=rt.sdef.name)
            given: list[TaskRuntime] = []
            for task_id in sorted(rt.pending):
                t = rt.tasks[task_id]
                p = t.task
                mine = p.vgroup_id in vgroups if p.kind in READER_KINDS else bool(snode_id) and p.snode_id == snode_id
                if not mine:
                    continue
                t.node_id, t.deployed_at = node_id, now
                given.append(t)
                msg = p.to_proto(stream_id, node_id)
                if p.kind in READER_KINDS:
                    deploy.readers.append(stream_pb2.ReaderDeploy(task=msg, trigger_reader=p.kind == TRIGGER_READER))
                elif p.kind == RUNNER:
                    deploy.runners.append(stream_pb2.RunnerDeploy(task=msg))
                else:
                    readers = [
                        r.task.to_proto(stream_id, r.node_id)
                        for r in rt.tasks.values()
                        if r.task.kind == TRIGGER_READER
                    ]
                    tops = [r.task.to_proto(stream_id, r.node_id) for r in self._top_runners(rt)]
                    deploy.trigger.CopyFrom(stream_pb2.TriggerDeploy(task=msg, readers=readers, top_runners=tops))
            if given:
                for t in given:
                    rt.pending.discard(t.task.task_id)
                rt.last_action = now
                reply.deploys.append(deploy)

    # ----- periodic --------------------------------------------------------------------------------------------------
    def tick(self) -> None:
        """The periodic part: the WATCH timer, the slotted health check, the checker, retries, task silence.

        Each part runs on its own: one that raises is logged and counted
        (``errors``) and the others still run, on this tick and the next.
        """
        now = self.clock()
        if self.state is ManagerState.WATCH:
            if self._watch_done():
                self._end_watch()
            return
        for what, part in (
            ("health check", self._health_tick),
            ("stream checker", self._check_tick),
            ("error-stop retries", self._retry_tick),
            ("task silence", self._silence_tick),
        ):
            try:
                part(now)
            except Exception:
                self.errors += 1
                logger.exception("stream manager: {} failed ({} errors so far); going on", what, self.errors)

    def _due(self, last: float | None, interval: float, now: float) -> bool:
        # Up to 10% early still counts: with tick() called every interval, loop jitter must not make a periodic
        # part skip every other tick.
        return last is None or now - last >= 0.9 * interval

    def _health_tick(self, now: float) -> None:
        if self.streams and self._due(self._last_health, self.config.health_interval, now):
            self._last_health = now
            self._health_check(now)

    def _check_tick(self, now: float) -> None:
        if self.streams and self._due(self._last_check, self.config.check_interval, now):
            self._last_check = now
            self.check_tasks(now)

    def _retry_tick(self, now: float) -> None:
        for rt in self.streams.values():
            if rt.error_stopped and not rt.sdef.user_stopped and rt.next_retry is not None and now >= rt.next_retry:
                rt.stop_code, rt.stop_reason, rt.next_retry = 0, "", None
                self._to_plan.add(rt.sdef.id)
                self.redeploys += 1

    def _silence_tick(self, now: float) -> None:
        """Tasks not heard of for task_silence: readers are redeployed, a silent trigger or runner stops its stream."""
        silence = self.config.task_silence
        for rt in self.streams.values():
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
                    self._redeploy_task(rt, t, now)
                else:
                    kind = stream_pb2.TaskKind.Name(t.task.kind)
                    reason = f"{kind} task {t.task.task_id} on node {t.node_id} silent for {now - heard:.1f}s"
                    self._stop_by_error(rt, STOP_TASK_LOST, reason, now)
                    break

    # ----- the stream checker ----------------------------------------------------------------------------------------
    def check_tasks(self, now: float | None = None) -> int:
        """The checker's task part (module docstring); returns how many streams it repaired."""
        now = self.clock() if now is None else now
        before = self.checker_repairs
        for rt in list(self.streams.values()):
            if rt.sdef.user_stopped or rt.error_stopped or self.state is not ManagerState.NORMAL:
                continue
            if not rt.tasks:
                if rt.sdef.id not in self._to_plan:
                    self._to_plan.add(rt.sdef.id)
                    self._repaired(rt, "should run but has no task and none is being planned: planned again")
                continue
            missing = [(t, why) for t in rt.tasks.values() if (why := self._missing(rt, t, now))]
            if missing:
                self._redeploy_missing(rt, missing, now)
        return self.checker_repairs - before

    def _missing(self, rt: StreamRuntime, t: TaskRuntime, now: float) -> str:
        """Why ``t`` runs on no node ('' if it may run): its node reported the stream's group without it after
        the hand-out (a report received later than the hand-out was sent after the deploy reply was applied or
        lost)."""
        if t.task.task_id in rt.pending or not t.node_id or t.deployed_at is None:
            return ""
        if self.live_nodes is None or t.node_id not in self.live_nodes:
            return ""  # a node without session: node_lost() and the health check handle its tasks
        nr = self._reports.get(t.node_id)
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
            self._redeploy_task(rt, t, now)
        self._repaired(rt, "; ".join(why for _, why in missing) + ": redeployed (same task ids, SID + 1)")

    def _repaired(self, rt: StreamRuntime, what: str) -> None:
        self._repaired_def(rt.sdef, what)

    def _repaired_def(self, sdef: stream_pb2.StreamDef, what: str) -> None:
        self.checker_repairs += 1
        logger.warning("stream checker: stream {} (id {}): {}", sdef.name, sdef.id, what)

    # ----- health check ----------------------------------------------------------------------------------------------
    def live_snode_ids(self) -> set[int]:
        """Snodes heard within task_silence and not declared lost (where new tasks may be placed now)."""
        return self._live_snodes(self.clock())

    def _live_snodes(self, now: float) -> set[int]:
        """Snodes heard within task_silence and not declared lost."""
        silence = self.config.task_silence
        return {s for s, h in self.snodes.items() if now - h.last_heard < silence and s not in self.lost_snodes}

    def _host_silent(self, t: TaskRuntime, now: float) -> bool:
        """Whether the task's vgroup (reader) or snode is silent and not yet declared lost."""
        if t.task.kind in READER_KINDS:
            h, lost = self.vgroups.get(t.task.vgroup_id), self.lost_vgroups
            host = t.task.vgroup_id
        else:
            h, lost = self.snodes.get(t.task.snode_id), self.lost_snodes
            host = t.task.snode_id
        if h is None or host in lost:
            return False
        return now - h.last_heard >= self.config.task_silence

    def _health_check(self, now: float) -> None:
        """One slot: the snodes and vgroups whose id % health_slots is the new slot index."""
        slots = max(self.config.health_slots, 1)
        self.health_slot = (self.health_slot + 1) % slots
        isolation = self.config.isolation
        for snode_id, h in sorted(self.snodes.items()):
            if snode_id % slots != self.health_slot or snode_id in self.lost_snodes:
                continue
            if now - h.last_heard >= isolation:
                self._snode_lost(snode_id, now, f"snode {snode_id} silent for {now - h.last_heard:.1f}s")
        for vg, h in sorted(self.vgroups.items()):
            if vg % slots != self.health_slot:
                continue
            self._check_vgroup(vg, h, now)

    def _check_vgroup(self, vg: int, h: Heard, now: float) -> None:
        since = self.lost_vgroups.get(vg)
        if since is None:
            if now - h.last_heard < self.config.isolation:
                return
            since = self.lost_vgroups[vg] = now
            logger.info("vgroup {} lost (silent for {:.1f}s)", vg, now - h.last_heard)
        if now - since >= self.config.vgroup_lost_stop:
            self._vgroup_lost_stop(vg, now)

    def _snode_lost(self, snode_id: int, now: float, why: str) -> None:
        """An snode is lost: stop streams whose trigger is there, move the runners of the others elsewhere."""
        self.lost_snodes[snode_id] = now
        logger.info("{}: lost", why)
        for rt in self.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped or not rt.tasks:
                continue
            trig = rt.trigger()
            if trig is not None and trig.task.snode_id == snode_id:
                self._stop_by_error(rt, STOP_SNODE_LOST, f"{why}: it hosts the trigger", now)
                continue
            lost_deploys = sorted(
                {t.task.deploy_id for t in rt.tasks.values() if t.task.kind == RUNNER and t.task.snode_id == snode_id}
            )
            if lost_deploys:
                self._move_runners(rt, trig, lost_deploys, now, why)

    def _move_runners(
        self, rt: StreamRuntime, trig: TaskRuntime | None, deploys: list[int], now: float, why: str
    ) -> None:
        """Redeploy whole runner deploys on live snodes: same task ids, SID + 1; the trigger is then updated."""
        live = self._live_snodes(now)
        n_deploys = 1 + max(t.task.deploy_id for t in rt.tasks.values() if t.task.kind == RUNNER)
        static = trig.task.snode_id if trig is not None else 0
        try:
            if not static:
                raise NoSnodeAvailable("the stream has no trigger snode")
            placement = place_runner_deploys(static, n_deploys, live, self.rng)
        except NoSnodeAvailable as exc:
            self._stop_by_error(rt, STOP_NO_SNODE, f"{why}: {exc.reason}", now)
            return
        for t in rt.tasks.values():
            if t.task.kind != RUNNER or t.task.deploy_id not in deploys:
                continue
            t.task = dataclasses.replace(t.task, snode_id=placement[t.task.deploy_id])
            self._redeploy_task(rt, t, now)
        rt.runner_update, rt.runner_update_sends = True, 0
        logger.info("stream {}: runner deploys {} moved ({})", rt.sdef.name, deploys, why)

    def _vgroup_lost_stop(self, vg: int, now: float) -> None:
        for rt in self.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped:
                continue
            if any(t.task.kind in READER_KINDS and t.task.vgroup_id == vg for t in rt.tasks.values()):
                since = self.lost_vgroups.get(vg, now)
                reason = f"vgroup {vg} lost for {now - since:.1f}s"
                self._stop_by_error(rt, STOP_VGROUP_LOST, reason, now)

    def _vgroup_moved(self, vg: int, new_node: int, now: float) -> None:
        """Vgroup leadership moved: its readers go to the new leader (same ids, SID + 1)."""
        for rt in self.streams.values():
            if rt.sdef.user_stopped or rt.error_stopped:
                continue
            for t in rt.tasks.values():
                p = t.task
                if p.kind in READER_KINDS and p.vgroup_id == vg and t.node_id not in (0, new_node):
                    if p.task_id not in rt.pending:
                        self._redeploy_task(rt, t, now)
        logger.info("vgroup {} now led by node {}: its readers are redeployed there", vg, new_node)

    def node_lost(self, node_id: int) -> bool:
        """A node's meta session was deleted: handle its snode and vgroups as lost now (damped by isolation).

        Returns whether anything was done (False within ``isolation`` of the last call for this node). In
        WATCH, the node's snode and vgroups are only marked silent: the first health check after WATCH acts.
        """
        now = self.clock()
        last = self._node_lost_at.get(node_id)
        if last is not None and now - last < self.config.isolation:
            return False
        self._node_lost_at[node_id] = now
        if self.live_nodes is not None:
            self.live_nodes.discard(node_id)
        self._reports.pop(node_id, None)
        self._undeploy_sent.pop(node_id, None)
        silent = now - self.config.isolation
        snodes = sorted(s for s, h in self.snodes.items() if h.node_id == node_id)
        vgroups = sorted(v for v, h in self.vgroups.items() if h.node_id == node_id)
        for s in snodes:
            self.snodes[s].last_heard = min(self.snodes[s].last_heard, silent)
        for v in vgroups:
            self.vgroups[v].last_heard = min(self.vgroups[v].last_heard, silent)
        logger.info("node {} lost (session deleted): snodes {}, vgroups {}", node_id, snodes, vgroups)
        if self.state is ManagerState.WATCH:
            return True
        for s in snodes:
            if s not in self.lost_snodes:
                self._snode_lost(s, now, f"snode {s} of lost node {node_id}")
        for v in vgroups:
            self._check_vgroup(v, self.vgroups[v], now)
        return True

    # ----- ShowStreams -----------------------------------------------------------------------------------------------
    def _state_of(self, rt: StreamRuntime) -> int:
        if rt.sdef.user_stopped:
            return stream_pb2.STREAM_STOPPED_BY_USER
        if rt.error_stopped:
            return stream_pb2.STREAM_STOPPED_BY_ERROR
        if not rt.tasks:
            return stream_pb2.STREAM_UNDEPLOYED
        if not rt.pending and all(t.status == stream_pb2.TASK_RUNNING for t in rt.tasks.values()):
            return stream_pb2.STREAM_RUNNING
        return stream_pb2.STREAM_DEPLOYING

    def show_streams(self, req: stream_pb2.ShowStreamsRequest | None = None) -> stream_pb2.ShowStreamsResponse:
        """Every stream (or those named) with its state and, on request, its task table."""
        req = req or stream_pb2.ShowStreamsRequest(with_tasks=True)
        now, wall = self.clock(), time.time()

        def unix_ms(t: float | None) -> int:
            return 0 if t is None else int((wall - (now - t)) * 1000)

        wanted_ids = {r.stream_id for r in req.streams if r.stream_id}
        wanted_names = {r.name for r in req.streams if not r.stream_id}
        watching = self.state is ManagerState.WATCH
        resp = stream_pb2.ShowStreamsResponse(
            watching=watching,
            watch_until_ms=unix_ms(self.state_since + self.config.watch_timeout) if watching else 0,
            live_snode_ids=sorted(self._live_snodes(now)),
        )
        for stream_id in sorted(self.streams):
            rt = self.streams[stream_id]
            if req.streams and stream_id not in wanted_ids and rt.sdef.name not in wanted_names:
                continue
            info = stream_pb2.StreamStatusInfo(
                stream=rt.sdef,
                state=self._state_of(rt),  # type: ignore[arg-type]
                stop_error_code=rt.stop_code,
                stop_reason=rt.stop_reason,
                next_retry_ms=unix_ms(rt.next_retry),
                deploy_times=rt.deploy_times,
                retries=rt.retries,
                plan_queued=stream_id in self._to_plan,
            )
            if req.with_tasks:
                for t in sorted(rt.tasks.values(), key=lambda t: t.task.task_id):
                    info.tasks.append(
                        stream_pb2.TaskRow(
                            task=t.task.to_proto(stream_id, t.node_id),
                            status=t.status,  # type: ignore[arg-type]
                            last_heard_ms=unix_ms(t.last_heard),
                            error_code=t.error_code,
                            error_message=t.error_message,
                            pending=t.task.task_id in rt.pending,
                        )
                    )
            resp.streams.append(info)
        resp.status.CopyFrom(common_pb2.Status(error_code=common_pb2.SUCCESS))
        return resp


def _fits(r: stream_pb2.TaskStatusReport, slot: Slot) -> bool:
    """Whether a report matches its slot of ``plan.task_layout`` (fields it lacks are taken from the slot)."""
    if r.vgroup_id != slot.vgroup_id:
        return False
    if r.HasField("scan_plan_idx") and r.scan_plan_idx != slot.scan_plan_idx:
        return False
    return not r.HasField("top") or r.top == slot.top


def _reported_tops(rep: stream_pb2.TaskStatusReport) -> set[tuple[int, int]]:
    """The top runners a trigger reports feeding, as (task id, SID)."""
    return {(t.task_id, t.sid) for t in rep.top_runners}


__all__ = [
    "STOP_NO_SNODE",
    "STOP_SNODE_LOST",
    "STOP_TASK_FAILED",
    "STOP_TASK_LOST",
    "STOP_VGROUP_LOST",
    "ManagerState",
    "StreamConfig",
    "StreamManager",
    "StreamRuntime",
    "TaskRuntime",
]
