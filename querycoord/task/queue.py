"""The trigger queue: admission, priority order, one trigger per collection at a time, and releases cancelling loads.

* Queue order: trigger condition (NodeDown > GrpcRequest > LoadBalance >
  Handoff), then FIFO by id. Triggers touching the same collection run one
  at a time; others run concurrently, at most ``max_concurrent_triggers``.
* A ReleaseCollection/ReleasePartitions cancels queued or running loads (and
  a ReleaseCollection resizes) of the same collection (their callers get CANCELLED "cancelled by release")
  instead of waiting behind them (Milvus problem 6).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Collection, Coroutine
from typing import TYPE_CHECKING

from meta.errors import MetaNoSpace, MetaUnavailable, NotLeader
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.task.leadership import Lifecycle
from querycoord.task.model import TaskEnv, TaskError, mark_retrieved
from querycoord.task.owners import CollectionOwners
from querycoord.task.triggers import ReleaseCollectionTask, ReleasePartitionsTask, TriggerTask

if TYPE_CHECKING:
    from querycoord.common.etcd_space import SpaceMonitor

# What a release cancels: loads, and resizes (whose new replicas a release would drop anyway).
LOAD_KINDS = (qc.TASK_KIND_LOAD_COLLECTION, qc.TASK_KIND_LOAD_PARTITION, qc.TASK_KIND_UPDATE_LOAD_CONFIG)

# Queue priority by trigger condition (higher first): Milvus's order, the checker's repairs with handoffs.
PRIORITY = {
    qc.TRIGGER_CONDITION_NODE_DOWN: 4,
    qc.TRIGGER_CONDITION_GRPC_REQUEST: 3,
    qc.TRIGGER_CONDITION_LOAD_BALANCE: 2,
    qc.TRIGGER_CONDITION_HANDOFF: 1,
    qc.TRIGGER_CONDITION_CHECKER: 1,
}


class TriggerQueue:
    """Queued and running triggers (see module docstring); the tree runner takes them from here."""

    def __init__(self, env: TaskEnv, life: Lifecycle, space: SpaceMonitor | None = None):
        self.env = env
        self.cfg = env.config
        self.life = life
        self.space = space
        self._heap: list[tuple[int, int, int]] = []  # (-priority, id, tiebreak)
        self._tiebreak = itertools.count()
        self.triggers: dict[int, TriggerTask] = {}  # queued or running: changed by ``push`` and ``drop`` only
        self.owners = CollectionOwners()  # which collections they own, kept with ``triggers``
        self.running: dict[int, asyncio.Task[None]] = {}
        self.started: set[int] = set()  # dispatched triggers whose task has begun running (cancel only those)
        self.started_ms: dict[int, int] = {}  # running trigger id -> when this coordinator began running it
        self.busy: dict[int, int] = {}  # collection -> trigger id
        self.cancel_reason: dict[int, str] = {}
        self.failing: set[int] = set()  # triggers rolling back their failure: not cancelled
        # Triggers whose tree ended and whose keys are being removed: too late to cancel (a release cancelling a
        # finished load interrupted the removal of its keys, which stayed in etcd, unknown to the leader).
        self.finishing: set[int] = set()
        # The highest id of a release queued per collection, and per (collection, partition) for partition
        # releases: a load persisted before a release but queued after it (its etcd write answered later) is
        # older than the release and must not run after it (``_cancel_if_released``).
        self._released_upto: dict[int, int] = {}
        self._released_partitions_upto: dict[tuple[int, int], int] = {}
        self.wake = asyncio.Event()
        # Finishes a queued trigger a release cancelled (set by the tree runner).
        self.finish_cancelled: Callable[[TriggerTask], Coroutine[object, object, None]] | None = None
        # Takes the record of a trigger whose persist failed with no answer from etcd: the txn may have been
        # applied, so its keys are removed later (set by the scheduler: ``Retention.remove_later``).
        self.persist_unknown: Callable[[task_pb2.TaskRecord], None] | None = None

    async def enqueue(self, trigger: TriggerTask) -> TriggerTask:
        """Give the trigger an id, persist it (UNDO), queue it. Releases cancel loads of their collection.

        Persisting and queueing run to the end even if the caller is cancelled (a client that gave up):
        a trigger persisted but never queued would sit in etcd unseen, and the next leader would run it
        long after its caller and every later request had moved on.

        While etcd is out of space a request is refused (RESOURCE_EXHAUSTED, saying what to run) and the
        leader's own triggers (node down, checker, handoff, balance) wait for space: they are not lost.
        """
        while True:
            if self.life.stopped:
                raise TaskError("the scheduler is stopped (not leader)", common_pb2.NOT_LEADER)
            if self.space is not None and self.space.nospace:
                if trigger.rec.trigger_condition == qc.TRIGGER_CONDITION_GRPC_REQUEST:
                    raise await self.space.refusal()
                await self.space.wait_writable()
                continue
            inner = asyncio.ensure_future(self._enqueue(trigger))
            # A caller cancelled meanwhile no longer awaits it: its failure (NotLeader on a deposed leader) is
            # still read, rather than logged by asyncio as "Task exception was never retrieved".
            inner.add_done_callback(mark_retrieved)
            try:
                return await asyncio.shield(inner)
            except MetaNoSpace as exc:
                if self.space is None:
                    raise
                self.space.noted(exc)  # then refused or waited for, above

    async def _enqueue(self, trigger: TriggerTask) -> TriggerTask:
        try:
            trigger.rec.id = (await self.env.ids.allocate(1))[0]
            await self.env.store.add_trigger(trigger.rec)
        except NotLeader as exc:
            self.life.lost(exc)
            raise
        except MetaUnavailable:
            # No answer is no refusal: etcd may have applied the txn (the answer lost, or every retry timed out
            # after the first was applied). The caller hears that it failed, so the keys go: left, this leader
            # would never run the trigger and the next one would, long after the caller and every later
            # request had moved on (a trigger left in etcd, unknown to the leader, for the rest of a drill).
            if self.persist_unknown is not None and trigger.rec.id:
                self.persist_unknown(trigger.rec)
            raise
        cid = trigger.collection_id
        if isinstance(trigger, ReleaseCollectionTask):
            self._released_upto[cid] = max(trigger.id, self._released_upto.get(cid, 0))
            self.cancel_loads(cid, f"cancelled by release (task {trigger.id})")
        elif isinstance(trigger, ReleasePartitionsTask):
            for pid in trigger.request.partition_ids:
                key = (cid, pid)
                self._released_partitions_upto[key] = max(trigger.id, self._released_partitions_upto.get(key, 0))
            self.cancel_loads(cid, f"cancelled by release (task {trigger.id})", set(trigger.request.partition_ids))
        elif trigger.KIND in LOAD_KINDS:
            self._cancel_if_released(trigger)
        self.push(trigger)
        return trigger

    def _cancel_if_released(self, load: TriggerTask) -> None:
        """A release with a higher id was queued while this load's persist was in flight: the release came
        later, so the load is cancelled as if it had been queued when the release arrived (``cancel_loads``
        could not see it then). It finishes as cancelled when dispatched, after the release."""
        cid = load.collection_id
        newer = self._released_upto.get(cid, 0)
        if load.KIND == qc.TASK_KIND_LOAD_PARTITION:
            newer = max([newer, *(self._released_partitions_upto.get((cid, p), 0)
                                  for p in load.request.partition_ids)])
        if newer > load.id:
            self.cancel_reason[load.id] = f"cancelled by release (task {newer})"

    def push(self, trigger: TriggerTask) -> None:
        """Queue a persisted trigger in priority order."""
        self.triggers[trigger.id] = trigger
        self.owners.add(trigger)
        heapq.heappush(self._heap, (-PRIORITY.get(trigger.rec.trigger_condition, 0), trigger.id,
                                    next(self._tiebreak)))
        self.wake.set()

    def drop(self, t: TriggerTask) -> None:
        """The trigger has left the queue (finished, failed or cancelled)."""
        gone = self.triggers.pop(t.id, None)
        if gone is not None:
            self.owners.remove(gone)

    def cancel_loads(self, collection_id: int, reason: str, partition_ids: set[int] | None = None) -> None:
        """Cancel the loads a release really conflicts with: all of the collection's, or (a partitions
        release) the LoadPartitions that name one of ``partition_ids``.

        A trigger is cancelled once: a second release (a client retry) arriving
        while the first cancellation rolls back must not interrupt that rollback,
        or the load would never answer its callers nor remove its keys.
        """
        for t in list(self.triggers.values()):
            if t.collection_id != collection_id or t.KIND not in LOAD_KINDS or t.id in self.cancel_reason \
                    or t.cancel_why:  # CancelTask is ending it already
                continue
            if partition_ids is not None and (
                t.KIND != qc.TASK_KIND_LOAD_PARTITION or not partition_ids & set(t.request.partition_ids)
            ):
                continue
            if partition_ids is not None:
                t.cancelled_partitions = frozenset(partition_ids)
            self.cancel(t, reason)

    def cancel(self, t: TriggerTask, reason: str) -> None:
        """Cancel ``t`` (queued or running) once: its callers get CANCELLED with ``reason``; a running one rolls
        back what it undoes (a load) and finishes, a queued one finishes without running."""
        if t.id in self.cancel_reason or self.triggers.get(t.id) is not t or t.id in self.finishing:
            return
        self.cancel_reason[t.id] = reason
        running = self.running.get(t.id)
        if running is not None:
            if t.id in self.started and t.id not in self.failing:
                # A load rolling back its own failure is left to finish that: cancelled half-way, it would leave
                # partitions in meta that nothing loads, and its callers an internal error instead of its own.
                running.cancel()
            # else: dispatched but its task has not taken a step. Cancelled now, its body would never run and
            # nothing would finish it (it would hold the collection's lock forever); it sees the reason first.
        else:
            # Still queued: it never started, so it has nothing to roll back.
            assert self.finish_cancelled is not None
            self.running[t.id] = asyncio.create_task(self.finish_cancelled(t))

    def dispatch(self, start: Callable[[TriggerTask], asyncio.Task[None]]) -> None:
        """Start (``start``) every queued trigger a slot and its collections allow, highest priority first; a
        trigger holds its collections until ``release_locks``."""
        blocked = []
        while self._heap and len(self.running) < self.cfg.max_concurrent_triggers:
            item = heapq.heappop(self._heap)
            t = self.triggers.get(item[1])
            if t is None or t.id in self.running:
                continue
            colls = t.collections()
            if any(c in self.busy for c in colls):
                blocked.append(item)
                continue
            for c in colls:
                self.busy[c] = t.id
            t.locked = colls  # type: ignore[attr-defined]
            self.running[t.id] = start(t)
        for item in blocked:
            heapq.heappush(self._heap, item)

    def release_locks(self, t: TriggerTask) -> None:
        for c in getattr(t, "locked", ()):
            if self.busy.get(c) == t.id:
                del self.busy[c]

    def queued_order(self) -> list[int]:
        """Ids of the triggers queued and not dispatched yet, in the order ``dispatch`` takes them: highest
        priority first, then first queued first."""
        return [trigger_id for _, trigger_id, _ in sorted(self._heap)]

    def is_running(self, trigger_id: int) -> bool:
        """Whether the trigger has been dispatched (else it is queued)."""
        return trigger_id in self.running

    def pending(self, collection_id: int | None = None, kinds: Collection[int] = (), *,
                cancelled: bool = True) -> list[TriggerTask]:
        """Queued or running triggers, oldest first, for callers that must not start a duplicate (the jobs):
        of one collection (None: any), of ``kinds`` (empty: any); ``cancelled=False`` leaves out loads that a
        release is cancelling and triggers CancelTask cancels (they will not load anything)."""
        return [t for t in sorted(self.triggers.values(), key=lambda t: t.id)
                if (collection_id is None or t.collection_id == collection_id) and (not kinds or t.KIND in kinds)
                and (cancelled or (t.id not in self.cancel_reason and not t.cancel_why))]

    def find(self, task_id: int) -> TriggerTask | None:
        """The queued or running trigger with this id, or whose tree holds a child with it."""
        t = self.triggers.get(task_id)
        if t is not None:
            return t
        for trig in self.triggers.values():
            if any(c.id == task_id for c in trig.children):
                return trig
        return None
