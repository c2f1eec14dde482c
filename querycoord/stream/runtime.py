"""The leader's stream runtime: what every part of the stream manager reads and writes.

Only stream and snode definitions are persisted (``StreamStore``); everything
here lives in the leader's memory and is rebuilt on every leadership by a new
``StreamManager``, so a deposed leader's maps can never leak into the next one.

``Runtime`` holds the maps the parts share (streams and their tasks, who
hosts each snode and leads each vgroup, the live node set, the plan queue,
the checker's view of the nodes' reports) and the few actions several parts
take on them: stop a stream by an error with back-off, redeploy one task,
clear a stream's tasks, count a checker repair. State a single part owns
stays in that part.

Durations are measured with the injected monotonic ``clock``; ShowStreams
converts them to unix milliseconds only for display.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from loguru import logger

from proto import stream_pb2
from querycoord.settings.config import StreamConfig
from querycoord.stream.plan import CALC_READER, RUNNER, TRIGGER, TRIGGER_READER, PlannedTask
from querycoord.stream.store import StreamStore

READER_KINDS = frozenset({TRIGGER_READER, CALC_READER})
ALIVE_STATUSES = frozenset({stream_pb2.TASK_INIT, stream_pb2.TASK_RUNNING})

# Why a stream was stopped by an error (StreamStatusInfo.stop_error_code). Never 0 for a stop: 0 means "not
# stopped" to every reader of the status.
STOP_TASK_LOST = 1001
STOP_TASK_FAILED = 1002
STOP_NO_SNODE = 1003
STOP_SNODE_LOST = 1004
STOP_VGROUP_LOST = 1005

TaskKey = tuple[int, int, int]  # (stream_id, task_id, sid): one task instance


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
    # Progress as its last report gave it (``progress``): processed up to (unix ms, 0 unknown), the source's newest.
    processed_ms: int = 0
    source_ms: int = 0
    # The newest checkpoint this instance reported holding (0: none).
    checkpoint_id: int = 0


@dataclass(frozen=True, slots=True)
class CheckpointRound:
    """A checkpoint round in flight: its id, when it started, and the task instances it covers.

    ``tasks`` is the stream's (task id, SID) set when the round started: a
    round whose stream was redeployed meanwhile is abandoned (a new instance
    never held what the old one was told to take).
    """

    id: int
    started: float
    tasks: frozenset[tuple[int, int]]
    # Started by a stop: the tasks are undeployed after it (or after the timeout).
    final: bool = False


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
    # Why planning could not place the stream last time (no live snode it may run on); "" once planned.
    waiting: str = ""
    # Runners were redeployed: the trigger gets a RunnerUpdate once they are handed out. Set on redeploy and
    # cleared only when the trigger REPORTS the new top runners: clearing it when the update was put in a reply
    # would lose the update with a lost reply.
    runner_update: bool = False
    runner_update_sends: int = 0
    # The committed consensus checkpoint (persisted; loaded on every leadership) and when it was committed:
    # unix ms as persisted, and on the monotonic clock for its age (None: not committed by this leader).
    checkpoint_id: int = 0
    checkpoint_ms: int = 0
    checkpoint_at: float | None = None
    # The newest round every task held, queued for commit or committed: what a task deployed now resumes from
    # (a commit is written a tick later; a task handed out meanwhile must not resume from the older consensus).
    settled_id: int = 0
    # The round in flight, and when the last round started (rounds start checkpoint_interval apart).
    round: CheckpointRound | None = None
    last_round: float | None = None

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


class Runtime:
    """The maps and counters the stream manager's parts share, and the actions several of them take.

    Not thread-safe; all calls come from the coordinator's event loop.
    """

    def __init__(
        self,
        store: StreamStore,
        *,
        leader_revision: int,
        config: StreamConfig,
        clock: Callable[[], float],
        rng: random.Random,
    ):
        self.store = store
        self.leader_revision = leader_revision
        self.config = config
        self.clock = clock
        self.rng = rng
        self.state = ManagerState.NORMAL
        self.state_since = clock()
        self.streams: dict[int, StreamRuntime] = {}
        self.vgroups: dict[int, Heard] = {}
        self.snodes: dict[int, Heard] = {}
        self.replica_of: dict[int, int] = {}
        # Each snode's node as recorded in the store: the only node whose claim of the snode counts.
        self.snode_owner: dict[int, int] = {}
        # The nodes with a live stream-node session (None until the caller first feeds them: nobody is heard).
        self.live_nodes: set[int] | None = None
        # Streams that need a plan (new, or error-stopped whose retry came, or WATCH fell back).
        self.to_plan: set[int] = set()
        # The snodes and vgroups declared lost, and since when.
        self.lost_snodes: dict[int, float] = {}
        self.lost_vgroups: dict[int, float] = {}
        # The checker's input: each node's last report per stream group, and the undeploys sent and not yet seen
        # to take effect (node -> instance -> when first sent, whether counted as a repair).
        self.reports: dict[int, NodeReports] = {}
        self.undeploy_sent: dict[int, dict[TaskKey, tuple[float, bool]]] = {}
        # Counters for tests, drills and benchmarks.
        self.adopted = 0
        self.redeploys = 0
        self.checker_repairs = 0
        self.rejected_heartbeats = 0
        self.rejected_claims = 0
        self.resent_actions = 0
        self.errors = 0

    async def load_snodes(self) -> None:
        """Re-read the snodes: each one's replica (placement) and recorded node (claim verification)."""
        snodes = await self.store.list_snodes()
        self.replica_of = {s.id: s.replica_id for s in snodes}
        self.snode_owner = {s.id: s.node_id for s in snodes}

    def live_snodes(self, now: float) -> set[int]:
        """Snodes heard within task_silence and not declared lost (where new tasks may be placed now)."""
        silence = self.config.task_silence
        return {s for s, h in self.snodes.items() if now - h.last_heard < silence and s not in self.lost_snodes}

    def top_runners(self, rt: StreamRuntime) -> list[TaskRuntime]:
        tops = [r for r in rt.tasks.values() if r.task.kind == RUNNER and r.task.top]
        return sorted(tops, key=lambda r: r.task.deploy_id)

    def top_keys(self, rt: StreamRuntime) -> set[tuple[int, int]]:
        return {(r.task.task_id, r.task.sid) for r in self.top_runners(rt)}

    def redeploy_task(self, rt: StreamRuntime, t: TaskRuntime, now: float) -> None:
        """Redeploy one task alone: same task id, SID + 1, handed out by a later heartbeat."""
        t.task = dataclasses.replace(t.task, sid=t.task.sid + 1)
        t.node_id, t.status, t.last_heard, t.running_since = 0, stream_pb2.TASK_STATUS_UNSPECIFIED, None, None
        t.processed_ms = t.source_ms = 0  # a new instance: its progress is unknown until it reports
        rt.pending.add(t.task.task_id)
        rt.last_action = now
        self.redeploys += 1

    def stop_by_error(self, rt: StreamRuntime, code: int, reason: str, now: float) -> None:
        """Stop a stream by an error, with back-off; its tasks are undeployed as they report."""
        trig = rt.trigger()
        if trig is not None and trig.running_since is not None and now - trig.running_since >= self.config.reset_after:
            rt.retries = 0
        rt.retries += 1
        delay = self.config.error_retry_delay if rt.retries <= self.config.fast_retries else self.config.max_retry_delay
        rt.stop_code, rt.stop_reason, rt.next_retry = code, reason, now + delay
        self.clear_tasks(rt)
        self.to_plan.discard(rt.sdef.id)
        logger.info("stream {} stopped by error {} ({}); retry in {:.1f}s", rt.sdef.name, code, reason, delay)

    def clear_tasks(self, rt: StreamRuntime) -> None:
        rt.tasks.clear()
        rt.pending.clear()
        rt.runner_update, rt.runner_update_sends = False, 0

    def repaired(self, sdef: stream_pb2.StreamDef, what: str) -> None:
        """Count and log one repair of the stream checker."""
        self.checker_repairs += 1
        logger.warning("stream checker: stream {} (id {}): {}", sdef.name, sdef.id, what)


def reported_tops(rep: stream_pb2.TaskStatusReport) -> set[tuple[int, int]]:
    """The top runners a trigger reports feeding, as (task id, SID)."""
    return {(t.task_id, t.sid) for t in rep.top_runners}


def due(last: float | None, interval: float, now: float) -> bool:
    """Whether a periodic part of ``tick()`` runs now. Up to 10% early still counts: with ``tick()`` called every
    interval, loop jitter must not make a periodic part skip every other tick."""
    return last is None or now - last >= 0.9 * interval
