"""The scheduler: a priority queue of triggers, concurrent children, retries, rescheduling, rollback.

``Scheduler`` is the thin facade the leader and the services use; its parts each own one job:

* ``task.queue``: admission (ids, persistence, refusal or wait while etcd is out of space), priority order,
  one trigger per collection at a time, releases cancelling loads;
* ``task.executor``: dispatch and a tree's run under its deadline, to its finish or its drop;
* ``task.retries``: children retried on their node, rescheduled to others, and the rollback of a failed tree;
* ``task.retention``: finished trees' keys removed with their history record, and the history pruned;
* ``task.nospace``: a trigger's writes pausing while etcd has no space, its deadline stopped meanwhile;
* ``task.reload``: the queue rebuilt from etcd at takeover;
* ``task.leadership``: the stopped flag and how a lost leadership stops every part without another write.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from meta.loops import keep_running
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.common import memory
from querycoord.task.executor import TreeRunner
from querycoord.task.leadership import Lifecycle
from querycoord.task.model import CANCELLED, DOING, DONE, EXPIRED, FAILED, UNDO, TaskEnv, TaskError
from querycoord.task.nospace import SpacePauses
from querycoord.task.queue import TriggerQueue
from querycoord.task.reload import reload_trees
from querycoord.task.retention import Retention
from querycoord.task.retries import ChildRunner
from querycoord.task.triggers import TriggerTask
from querycoord.task.waits import TriggerState, Waits, trigger_waits

if TYPE_CHECKING:
    from querycoord.common.etcd_space import SpaceMonitor

# A child's state as its trigger's counts name it (a cancelled tree's children stop as they stand).
_STATE_NAMES = {UNDO: "undo", DOING: "doing", DONE: "done", EXPIRED: "expired", FAILED: "failed",
                CANCELLED: "failed"}


class Scheduler:
    """Runs trigger trees (see module docstring)."""

    def __init__(self, env: TaskEnv, *, on_leadership_lost: Callable[[BaseException], None] | None = None,
                 space: SpaceMonitor | None = None):
        """``space``: etcd's NOSPACE alarm; with it, triggers pause while etcd is out of space instead of failing."""
        self.env = env
        self.cfg = env.config
        self.space = space
        self.life = Lifecycle(on_leadership_lost)
        self.waits = Waits()  # what running children wait for (``task.waits``; GetTask, explain)
        self.queue = TriggerQueue(env, self.life, space)
        self.pauses = SpacePauses(space, self.queue.triggers)
        self.children = ChildRunner(env, self.waits)
        self.retention = Retention(env, self.life, self.queue.started_ms)
        self.queue.persist_unknown = self.retention.remove_later
        self.runner = TreeRunner(env, self.life, self.queue, self.children, self.retention, self.pauses,
                                 self.waits, self.tree)
        self.triggers: dict[int, TriggerTask] = self.queue.triggers  # queued or running
        self.finished: deque[qc.TaskTree] = self.runner.finished
        # Called with each finished trigger (the checker's kick: a release freed memory a parked unit may need).
        self.finish_hooks: list[Callable[[TriggerTask], None]] = self.runner.finish_hooks
        self._loop: asyncio.Task[None] | None = None
        self._pruner: asyncio.Task[None] | None = None
        self._undefer: Callable[[], None] = lambda: None  # ``memory.defer_while`` once started

    @property
    def stopped(self) -> bool:
        return self.life.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self.life.stopped = value

    @property
    def on_leadership_lost(self) -> Callable[[BaseException], None] | None:
        return self.life.on_leadership_lost

    @property
    def resumed_at(self) -> float:
        """When ``reload`` ran: resumed trees wait for nodes from then on."""
        return self.children.resumed_at

    @property
    def unremoved(self) -> list[tuple[task_pb2.TaskRecord, list[task_pb2.TaskRecord], qc.TaskTree | None]]:
        """Finished trees whose keys etcd did not take away, retried by ``sweep_unremoved``."""
        return self.retention.unremoved

    # ----- life cycle ---------------------------------------------------------------------------------------
    async def start(self, *, reload: bool = True) -> int:
        """Reload persisted trees (returns how many triggers were queued), then start dispatching."""
        n = await self.reload() if reload else 0
        client = self.env.store.kv.client
        self._undefer = memory.defer_while(self.has_triggers)  # a memory release waits for the triggers
        self._loop = asyncio.create_task(keep_running("scheduler", self.runner.dispatch_loop, client=client),
                                         name="scheduler")
        self._pruner = asyncio.create_task(keep_running("task history pruner", self.retention.prune_loop,
                                                        client=client), name="task-history-pruner")
        return n

    def has_triggers(self) -> bool:
        """Whether a trigger is queued or runs now."""
        return bool(self.triggers)

    @property
    def dispatching(self) -> bool:
        """Whether ``start`` ran (dispatching began)."""
        return self._loop is not None

    async def stop(self) -> None:
        """Stop dispatching and cancel running triggers without writing anything more."""
        self.life.stopped = True
        self._undefer()
        tasks = [*self.queue.running.values(), *(t for t in (self._loop, self._pruner) if t is not None)]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for trig in self.triggers.values():
            for fut in (trig.planned, trig.finished):
                if not fut.done():
                    fut.set_exception(TaskError("the coordinator stopped or lost leadership; retry against the leader",
                                                common_pb2.NOT_LEADER))
                    fut.exception()  # mark retrieved

    def leadership_lost(self, exc: BaseException) -> None:
        """A fenced write outside the scheduler was refused (a service's): stop as if one of ours had been."""
        self.life.lost(exc)

    async def reload(self) -> int:
        """Rebuild the queue from etcd (``task.reload``); returns how many triggers were queued."""
        self.children.resumed_at = time.monotonic()
        return await reload_trees(self.env, self.queue.push)

    # ----- queue --------------------------------------------------------------------------------------------
    async def enqueue(self, trigger: TriggerTask) -> TriggerTask:
        """Give the trigger an id, persist it, queue it (``TriggerQueue.enqueue``)."""
        return await self.queue.enqueue(trigger)

    def is_running(self, trigger_id: int) -> bool:
        """Whether the trigger has been dispatched (else it is queued)."""
        return self.queue.is_running(trigger_id)

    def pending(self, collection_id: int | None = None, kinds: Collection[int] = (), *,
                cancelled: bool = True) -> list[TriggerTask]:
        """Queued or running triggers, oldest first (``TriggerQueue.pending``)."""
        return self.queue.pending(collection_id, kinds, cancelled=cancelled)

    def busy_collections(self) -> set[int]:
        """The collections a queued or running trigger owns: a checker pass, a lost node's repair and the
        progress raised after a move leave them to it (kept by the queue: ``task.owners``)."""
        return self.queue.owners.busy()

    def find(self, task_id: int) -> TriggerTask | None:
        """The queued or running trigger with this id, or whose tree holds a child with it."""
        return self.queue.find(task_id)

    # ----- finished trees -----------------------------------------------------------------------------------
    async def prune_history(self) -> int:
        """Prune the task history to its configured count and age; returns how many records were deleted."""
        return await self.retention.prune_history()

    async def sweep_unremoved(self) -> int:
        """Retry removing the keys of finished trees whose removal failed (etcd trouble at the time)."""
        return await self.retention.sweep_unremoved()

    def history_record(self, t: TriggerTask) -> qc.TaskTree | None:
        """The finished tree's task-history record (``task.history``); None when no history is kept."""
        return self.retention.history_record(t)

    # ----- views --------------------------------------------------------------------------------------------
    def tree(self, t: TriggerTask, children_limit: int = 0) -> qc.TaskTree:
        """The trigger, its children (the first ``children_limit``; 0: all), their counts by state, its waits."""
        counts = qc.ChildStateCounts(total=len(t.children))
        for c in t.children:
            name = _STATE_NAMES[c.state]
            setattr(counts, name, getattr(counts, name) + 1)
        kids = t.children if not children_limit else t.children[:children_limit]
        return qc.TaskTree(trigger=t.info(), children=[c.info() for c in kids], child_counts=counts,
                           waits=self.waits_of(t))

    def waits_of(self, t: TriggerTask) -> list[qc.TaskWait]:
        """What ``t`` waits for now (``task.waits``); nothing once it finished."""
        q = self.queue
        if q.triggers.get(t.id) is not t:
            return []
        held = next((c for c in sorted(t.collections()) if q.busy.get(c, t.id) != t.id), 0)
        return trigger_waits(TriggerState(
            t.id, running=t.id in q.running, planned=t.state not in (UNDO, DOING),
            since_ms=q.started_ms.get(t.id, t.rec.created_ms), blocked_by=q.busy.get(held, 0),
            collection_id=held, slots_taken=len(q.running), slots=self.cfg.max_concurrent_triggers,
            paused_since=self.pauses.paused_since(t.id)), self.waits)
