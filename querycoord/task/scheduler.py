"""The scheduler: a priority queue of triggers, concurrent children, retries, rescheduling, rollback.

* Queue order: trigger condition (NodeDown > GrpcRequest > LoadBalance >
  Handoff), then FIFO by id. Triggers touching the same collection run one
  at a time; others run concurrently, at most ``max_concurrent_triggers``.
* A ReleaseCollection/ReleasePartitions cancels queued or running loads of
  the same collection (their callers get CANCELLED "cancelled by release")
  instead of waiting behind them (Milvus problem 6).
* A child is retried on its node with back-off while its node is online
  and its budget lasts, then rescheduled to other nodes (its node added to
  the excluded ones); when no node can take it the trigger fails and is
  rolled back. Every trigger runs under its deadline.
* Reload never blocks start-up: records are read page by page and queued
  in memory with no capacity limit (Milvus problem 1).
* Losing leadership (``NotLeader`` from a fenced write, or a node reporting
  a newer leader) stops everything without another write.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, NoReturn

from loguru import logger

from meta.client import NOSPACE_WAIT
from meta.errors import MetaError, MetaNoSpace, NotLeader
from meta.loops import keep_running, loop_failed
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord import metrics
from querycoord.catalog.broker import BrokerError
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.client import NodeError
from querycoord.errors import CoordError
from querycoord.task import repair  # noqa: F401  (its kind registers in Task.KINDS, which reload reads)
from querycoord.task.history import TaskHistory, summarize
from querycoord.task.model import (
    DOING,
    DONE,
    EXPIRED,
    FAILED,
    UNDO,
    Task,
    TaskCancelled,
    TaskEnv,
    TaskError,
    mark_retrieved,
    now_ms,
)
from querycoord.task.triggers import ReleaseCollectionTask, ReleasePartitionsTask, TriggerTask
from querycoord.task.waits import TriggerState, Waits, trigger_waits

if TYPE_CHECKING:
    from querycoord.etcd_space import SpaceMonitor

LOAD_KINDS = (qc.TASK_KIND_LOAD_COLLECTION, qc.TASK_KIND_LOAD_PARTITION)


# Queue priority by trigger condition (higher first): Milvus's order, the checker's repairs with handoffs.
PRIORITY = {
    qc.TRIGGER_CONDITION_NODE_DOWN: 4,
    qc.TRIGGER_CONDITION_GRPC_REQUEST: 3,
    qc.TRIGGER_CONDITION_LOAD_BALANCE: 2,
    qc.TRIGGER_CONDITION_HANDOFF: 1,
    qc.TRIGGER_CONDITION_CHECKER: 1,
}

# Failures a child survives by retrying or rescheduling.
_CHILD_FAILURES = (NodeError, TaskError, NoAvailableNode, MetaError, BrokerError)


class LeadershipLost(Exception):
    """Raised inside the scheduler when a write or a node says another leader exists."""


class _Abandon(Exception):
    """Leadership is gone: drop the trigger without another write (its keys stay for the next leader)."""


class _Pause:
    """A trigger whose writes wait for etcd to have space: how many, since when, the deadline time it had left."""

    def __init__(self, left: float | None):
        self.waiting = 0
        self.since = time.monotonic()
        self.left = left


def _internal(exc: BaseException) -> TaskError:
    err = TaskError(f"internal error: {exc!r}", common_pb2.UNEXPECTED_ERROR)
    err.__cause__ = exc
    return err


def _is_stale_leader(exc: BaseException) -> bool:
    return isinstance(exc, NodeError) and exc.code == common_pb2.STALE_LEADER


class Scheduler:
    """Runs trigger trees (see module docstring)."""

    def __init__(self, env: TaskEnv, *, on_leadership_lost: Callable[[BaseException], None] | None = None,
                 space: SpaceMonitor | None = None):
        """``space``: etcd's NOSPACE alarm; with it, triggers pause while etcd is out of space instead of failing."""
        self.env = env
        self.cfg = env.config
        self.on_leadership_lost = on_leadership_lost
        self.space = space
        self._timeouts: dict[int, asyncio.Timeout] = {}  # running trigger id -> its deadline
        self._pauses: dict[int, _Pause] = {}  # trigger id -> its writes waiting for etcd to have space
        self._heap: list[tuple[int, int, int]] = []  # (-priority, id, tiebreak)
        self.triggers: dict[int, TriggerTask] = {}  # queued or running
        self._running: dict[int, asyncio.Task[None]] = {}
        self._started: set[int] = set()  # dispatched triggers whose task has begun running (cancel only those)
        self._busy: dict[int, int] = {}  # collection -> trigger id
        self._cancel_reason: dict[int, str] = {}
        self._failing: set[int] = set()  # triggers rolling back their failure (``_fail_safely``): not cancelled
        # The highest id of a release queued per collection, and per (collection, partition) for partition
        # releases: a load persisted before a release but queued after it (its etcd write answered later) is
        # older than the release and must not run after it (``_cancel_if_released``).
        self._released_upto: dict[int, int] = {}
        self._released_partitions_upto: dict[tuple[int, int], int] = {}
        self.finished: deque[qc.TaskTree] = deque(maxlen=self.cfg.finished_history)
        # Finished trees whose keys etcd did not take away (with their history record); retried by
        # ``sweep_unremoved``.
        self.unremoved: list[tuple[task_pb2.TaskRecord, list[task_pb2.TaskRecord], qc.TaskTree | None]] = []
        self._started_ms: dict[int, int] = {}  # running trigger id -> when this coordinator began running it
        self._prune_kick = asyncio.Event()  # enough trees finished since the last pruning of the history
        self._finished_since_prune = 0
        self._pruner: asyncio.Task[None] | None = None
        self._history = TaskHistory(env.store.kv)  # kept: it remembers the finish times it has read
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._tiebreak = itertools.count()
        self.stopped = False
        self.resumed_at = time.monotonic()  # when ``reload`` ran: resumed trees wait for nodes from then on
        # Called with each finished trigger (the checker's kick: a release freed memory a parked unit may need).
        self.finish_hooks: list[Callable[[TriggerTask], None]] = []
        self.waits = Waits()  # what running children wait for (``task.waits``; GetTask, explain)

    # ----- life cycle ---------------------------------------------------------------------------------------
    async def start(self, *, reload: bool = True) -> int:
        """Reload persisted trees (returns how many triggers were queued), then start dispatching."""
        n = await self.reload() if reload else 0
        client = self.env.store.kv.client
        self._loop = asyncio.create_task(keep_running("scheduler", self._dispatch_loop, client=client),
                                         name="scheduler")
        self._pruner = asyncio.create_task(keep_running("task history pruner", self._prune_loop, client=client),
                                           name="task-history-pruner")
        return n

    async def stop(self) -> None:
        """Stop dispatching and cancel running triggers without writing anything more."""
        self.stopped = True
        tasks = [*self._running.values(), *(t for t in (self._loop, self._pruner) if t is not None)]
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
        self._leadership_lost(exc)

    def _leadership_lost(self, exc: BaseException) -> None:
        if not self.stopped:
            logger.error("scheduler: leadership lost ({}); stopping without further writes", exc)
            self.stopped = True
            if self.on_leadership_lost is not None:
                self.on_leadership_lost(exc)

    # ----- queue ------------------------------------------------------------------------------------------------
    async def enqueue(self, trigger: TriggerTask) -> TriggerTask:
        """Give the trigger an id, persist it (UNDO), queue it. Releases cancel loads of their collection.

        Persisting and queueing run to the end even if the caller is cancelled (a client that gave up):
        a trigger persisted but never queued would sit in etcd unseen, and the next leader would run it
        long after its caller and every later request had moved on.

        While etcd is out of space a request is refused (RESOURCE_EXHAUSTED, saying what to run) and the
        leader's own triggers (node down, checker, handoff, balance) wait for space: they are not lost.
        """
        while True:
            if self.stopped:
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
            self._leadership_lost(exc)
            raise
        cid = trigger.collection_id
        if isinstance(trigger, ReleaseCollectionTask):
            self._released_upto[cid] = max(trigger.id, self._released_upto.get(cid, 0))
            self._cancel_loads(cid, f"cancelled by release (task {trigger.id})")
        elif isinstance(trigger, ReleasePartitionsTask):
            for pid in trigger.request.partition_ids:
                key = (cid, pid)
                self._released_partitions_upto[key] = max(trigger.id, self._released_partitions_upto.get(key, 0))
            self._cancel_loads(cid, f"cancelled by release (task {trigger.id})", set(trigger.request.partition_ids))
        elif trigger.KIND in LOAD_KINDS:
            self._cancel_if_released(trigger)
        self._push(trigger)
        return trigger

    def _cancel_if_released(self, load: TriggerTask) -> None:
        """A release with a higher id was queued while this load's persist was in flight: the release came
        later, so the load is cancelled as if it had been queued when the release arrived (``_cancel_loads``
        could not see it then). It finishes as cancelled when dispatched, after the release."""
        cid = load.collection_id
        newer = self._released_upto.get(cid, 0)
        if load.KIND == qc.TASK_KIND_LOAD_PARTITION:
            newer = max([newer, *(self._released_partitions_upto.get((cid, p), 0)
                                  for p in load.request.partition_ids)])
        if newer > load.id:
            self._cancel_reason[load.id] = f"cancelled by release (task {newer})"

    def _push(self, trigger: TriggerTask) -> None:
        self.triggers[trigger.id] = trigger
        heapq.heappush(self._heap, (-PRIORITY.get(trigger.rec.trigger_condition, 0), trigger.id,
                                    next(self._tiebreak)))
        self._wake.set()

    def _cancel_loads(self, collection_id: int, reason: str, partition_ids: set[int] | None = None) -> None:
        """Cancel the loads a release really conflicts with: all of the collection's, or (a partitions
        release) the LoadPartitions that name one of ``partition_ids``.

        A trigger is cancelled once: a second release (a client retry) arriving
        while the first cancellation rolls back must not interrupt that rollback,
        or the load would never answer its callers nor remove its keys.
        """
        for t in list(self.triggers.values()):
            if t.collection_id != collection_id or t.KIND not in LOAD_KINDS or t.id in self._cancel_reason:
                continue
            if partition_ids is not None and (
                t.KIND != qc.TASK_KIND_LOAD_PARTITION or not partition_ids & set(t.request.partition_ids)
            ):
                continue
            self._cancel_reason[t.id] = reason
            if partition_ids is not None:
                t.cancelled_partitions = frozenset(partition_ids)
            running = self._running.get(t.id)
            if running is not None:
                if t.id in self._started and t.id not in self._failing:
                    # A load rolling back its own failure is left to finish that: cancelled half-way, it left
                    # partitions in meta that nothing loads, and its callers an internal error instead of its own.
                    running.cancel()
                # else: dispatched but its task has not taken a step. Cancelled now, its body would never run and
                # nothing would finish it (it would hold the collection's lock forever); it sees the reason first.
            else:
                # Still queued: it never started, so it has nothing to roll back.
                self._running[t.id] = asyncio.create_task(self._finish_cancelled(t))

    def is_running(self, trigger_id: int) -> bool:
        """Whether the trigger has been dispatched (else it is queued)."""
        return trigger_id in self._running

    def pending(self, collection_id: int | None = None, kinds: Collection[int] = (), *,
                cancelled: bool = True) -> list[TriggerTask]:
        """Queued or running triggers, oldest first, for callers that must not start a duplicate (the jobs):
        of one collection (None: any), of ``kinds`` (empty: any); ``cancelled=False`` leaves out loads that a
        release is cancelling (they will not load anything)."""
        return [t for t in sorted(self.triggers.values(), key=lambda t: t.id)
                if (collection_id is None or t.collection_id == collection_id) and (not kinds or t.KIND in kinds)
                and (cancelled or t.id not in self._cancel_reason)]

    async def _finish_cancelled(self, t: TriggerTask) -> None:
        err = TaskCancelled(self._cancel_reason.get(t.id, "cancelled"))
        t.set_error(err)
        t.set_state(FAILED)
        try:
            await self._remove_tree(t)
        except _Abandon:
            self._drop(t)
            return
        self._finish(t, err)

    async def _dispatch_loop(self) -> None:
        self._wake.set()  # (re)started by ``keep_running``: look at the queue at once
        while not self.stopped:
            await self._wake.wait()
            self._wake.clear()
            blocked = []
            while self._heap and len(self._running) < self.cfg.max_concurrent_triggers:
                item = heapq.heappop(self._heap)
                t = self.triggers.get(item[1])
                if t is None or t.id in self._running:
                    continue
                colls = t.collections()
                if any(c in self._busy for c in colls):
                    blocked.append(item)
                    continue
                for c in colls:
                    self._busy[c] = t.id
                t.locked = colls  # type: ignore[attr-defined]
                self._running[t.id] = asyncio.create_task(self._run_with_ids(t), name=f"trigger-{t.id}")
            for item in blocked:
                heapq.heappush(self._heap, item)

    # ----- running a tree ---------------------------------------------------------------------------------------
    async def _run_with_ids(self, t: TriggerTask) -> None:
        """``_run_trigger`` with the trigger's id and collection on every line logged while it runs (its children's
        lines too: their tasks inherit the context), so a json log can be filtered by task."""
        self._started.add(t.id)
        self._started_ms.setdefault(t.id, now_ms())
        try:
            with logger.contextualize(task=t.id, **({"collection": t.collection_id} if t.collection_id else {})):
                if t.id in self._cancel_reason:  # a release cancelled it between dispatch and this first step
                    await self._finish_cancelled(t)
                else:
                    await self._run_trigger(t)
        finally:
            self._started.discard(t.id)

    async def _run_trigger(self, t: TriggerTask) -> None:
        """Run one tree to one of its exits. Whatever happens, the trigger either finishes (callers
        answered, keys removed, lock and slot released) or, when leadership is gone, is dropped
        with its keys left for the next leader (``stop`` answers the callers)."""
        if self.space is not None:  # the writes of this task and of its children wait out NOSPACE
            NOSPACE_WAIT.set(functools.partial(self._wait_for_space, t.id))  # the id: tasks copy this context
        try:
            error = await self._run_tree(t)
            await self._remove_tree(t)
        except _Abandon:
            self._drop(t)
            return
        except BaseException as exc:  # a bug, or a cancellation nobody asked for: still answer the callers
            logger.opt(exception=exc).error("{}: the runner failed unexpectedly", t.describe())
            if self.stopped:
                self._drop(t)
            else:
                self._finish(t, _internal(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        self._finish(t, error)

    async def _run_tree(self, t: TriggerTask) -> BaseException | None:
        """Execute under the trigger's deadline; on any failure roll back. Returns the error, if any."""
        loop = asyncio.get_running_loop()
        error: BaseException
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, t.deadline - time.monotonic())) as timeout:
                self._timeouts[t.id] = timeout
                try:
                    await self._execute_tree(t)
                    return None
                except asyncio.CancelledError:
                    reason = self._cancel_reason.get(t.id)
                    if reason is None or self.stopped:
                        raise
                    current = asyncio.current_task()
                    if current is not None:
                        current.uncancel()  # the cancellation was ours and is handled here
                    error = TaskCancelled(reason)
                finally:
                    self._timeouts.pop(t.id, None)
        except TimeoutError as exc:
            error = TaskError(f"{t.describe()} passed its deadline of {self.cfg.trigger_timeout:.0f}s",
                              common_pb2.TIMEOUT)
            error.__cause__ = exc
        except asyncio.CancelledError:
            if self.stopped:
                raise _Abandon from None
            raise
        except (NotLeader, LeadershipLost) as exc:
            self._leadership_lost(exc)
            raise _Abandon from exc
        except Exception as exc:
            if _is_stale_leader(exc):
                self._leadership_lost(exc)
                raise _Abandon from exc
            if not isinstance(exc, (*_CHILD_FAILURES, CoordError)):  # a CoordError keeps its code (query meta's too)
                logger.opt(exception=exc).error("{}: unexpected error", t.describe())
                exc = _internal(exc)
            error = exc
        await self._fail_safely(t, error)
        return error

    async def _execute_tree(self, t: TriggerTask) -> None:
        store = self.env.store
        if t.state in (UNDO, DOING):
            t.set_state(DOING)
            await store.save(t.rec)
            await t.pre_execute()
            await t.execute()
            await self._commit_plan(t)
        else:
            await t.on_reload()
        if not t.planned.done():
            t.planned.set_result(None)
        await self._run_children(t, [c for c in t.children if c.state != DONE])
        await t.post_execute()
        t.set_state(EXPIRED)

    async def _fail_safely(self, t: TriggerTask, error: BaseException) -> None:
        """Roll back within a bound; a rollback that itself fails is logged, never left hanging."""
        self._failing.add(t.id)
        try:
            await asyncio.wait_for(self._fail(t, error), self.cfg.rollback_timeout)
        except (NotLeader, LeadershipLost) as exc:
            self._leadership_lost(exc)
            raise _Abandon from exc
        except asyncio.CancelledError:
            if self.stopped:
                raise _Abandon from None
            raise
        except Exception as exc:
            if _is_stale_leader(exc):
                self._leadership_lost(exc)
                raise _Abandon from exc
            logger.opt(exception=exc).error("{}: rollback did not complete ({}); the checker repairs what is left",
                                            t.describe(), exc)
            t.set_error(error)
            t.set_state(FAILED)
        finally:
            self._failing.discard(t.id)

    async def _wait_for_space(self, trigger_id: int, exc: MetaNoSpace) -> None:
        """A write of trigger ``trigger_id`` was refused for NOSPACE: wait until etcd has space again (then the
        write is retried).

        The trigger pauses rather than fails, whatever the maintenance takes: while any of its writes waits its
        deadline is stopped, and it resumes with the time it had left.
        """
        assert self.space is not None
        self.space.noted(exc)
        loop = asyncio.get_running_loop()
        t = self.triggers.get(trigger_id)
        what = t.describe() if t is not None else f"task {trigger_id}"
        pause = self._pauses.get(trigger_id)
        if pause is None:
            timeout = self._timeouts.get(trigger_id)
            when = timeout.when() if timeout is not None else None
            if timeout is not None and when is not None:
                timeout.reschedule(None)
            pause = self._pauses[trigger_id] = _Pause(None if when is None else when - loop.time())
            logger.warning("{}: paused: etcd is out of space; it resumes once `querycoord etcd maintain` made room",
                           what)
        pause.waiting += 1
        try:
            await self.space.wait_writable()
        finally:
            pause.waiting -= 1
            if pause.waiting == 0 and self._pauses.get(trigger_id) is pause:
                del self._pauses[trigger_id]
                if t is not None:
                    t.deadline += time.monotonic() - pause.since
                timeout = self._timeouts.get(trigger_id)
                if timeout is not None and pause.left is not None:
                    timeout.reschedule(loop.time() + pause.left)
                logger.warning("{}: resumed after {:.1f}s", what, time.monotonic() - pause.since)

    def history_record(self, t: TriggerTask) -> qc.TaskTree | None:
        """The finished tree's task-history record (``task.history``); None when no history is kept.

        Started: when this coordinator began running it, or (a tree resumed by a new leader) its plan's
        time, the creation of its oldest child, if earlier.
        """
        if self.cfg.history_keep <= 0:
            return None
        children = [c.info() for c in t.children if c.id]
        finished = now_ms()
        started = min([self._started_ms.get(t.id, finished), *(c.created_ms for c in children if c.created_ms)])
        return summarize(t.info(), children, started_ms=started, finished_ms=finished,
                         max_children=self.cfg.history_children)

    async def _remove_tree(self, t: TriggerTask) -> None:
        """Remove the finished tree's keys, writing its history record in the txn that removes the trigger;
        retried, since keys left behind would be resumed by a new leader."""
        recs = [c.rec for c in t.children if c.id]
        history = self.history_record(t)
        for attempt in range(1, 4):
            try:
                await self.env.store.remove_tree(t.rec, recs, history)
                return
            except NotLeader as exc:
                self._leadership_lost(exc)
                raise _Abandon from exc
            except MetaError as exc:
                logger.error("{}: could not remove its keys (attempt {}): {}", t.describe(), attempt, exc)
                await asyncio.sleep(self.cfg.retry_backoff * attempt)
        self.unremoved.append((t.rec, recs, history))

    async def sweep_unremoved(self) -> int:
        """Retry removing the keys of finished trees whose removal failed (etcd trouble at the time)."""
        done = 0
        while self.unremoved and not self.stopped:
            rec, recs, history = self.unremoved[0]
            await self.env.store.remove_tree(rec, recs, history)
            self.unremoved.pop(0)
            done += 1
        return done

    async def _commit_plan(self, t: TriggerTask) -> None:
        """Ids for the children, then children + the trigger's DONE in txns: the commit point."""
        if t.children:
            ids = await self.env.ids.allocate(len(t.children))
            for c, i in zip(t.children, ids, strict=True):
                c.rec.id = i
                c.rec.parent_id = t.id
                c.parent = t
        t.set_state(DONE)
        await self.env.store.commit_children(t.rec, [c.rec for c in t.children])

    async def _run_children(self, t: TriggerTask, children: list[Task]) -> None:
        sem = asyncio.Semaphore(self.cfg.max_concurrent_children)

        async def run(c: Task) -> None:
            async with sem:
                with logger.contextualize(child=c.id, node=c.node_id):
                    await self._run_child(t, c)

        results = await asyncio.gather(*(run(c) for c in children), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors:
            if isinstance(e, NotLeader | LeadershipLost | asyncio.CancelledError) or _is_stale_leader(e):
                raise e
        if errors:
            reasons = "; ".join(str(e) for e in errors[:5])
            more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
            code = getattr(errors[0], "code", common_pb2.UNEXPECTED_ERROR)
            raise TaskError(f"{len(errors)} of {len(children)} child tasks failed: {reasons}{more}", code)

    async def _run_child(self, t: TriggerTask, child: Task) -> None:
        try:
            done, cause = await self._run_on_node(t, child)
        finally:
            self.waits.ended(t.id, child.id)
        if not done:
            await self._reschedule(t, child, cause)

    async def _run_on_node(self, t: TriggerTask, child: Task) -> tuple[bool, BaseException | None]:
        """Attempts of ``child`` on its node: (True, None) once done, (False, the last failure) when it must be
        rescheduled."""
        budget = self.cfg.retry_budget
        cause: BaseException | None = None
        while child.is_valid():
            child.rec.retry_count += 1
            self.waits.calling(t.id, child)
            try:
                await child.execute()
            except _CHILD_FAILURES as exc:
                if isinstance(exc, NotLeader) or _is_stale_leader(exc):
                    raise LeadershipLost(str(exc)) from exc
                cause = exc
                child.set_error(exc)
                logger.info("{} attempt {}/{} failed: {}", child.describe(), child.rec.retry_count, budget, exc)
                exhausted = child.rec.retry_count >= budget and not child.RETRY_WHILE_NODE_ONLINE
                if exhausted or not child.retryable_on_node():
                    break
                metrics.child_retried(child)
                delay = min(self.cfg.retry_backoff * 2 ** (child.rec.retry_count - 1), self.cfg.retry_backoff_max)
                self.waits.backing_off(t.id, child, delay)
                await asyncio.sleep(delay)
                continue
            child.set_state(DONE)
            await self.env.store.save_state(child.rec)  # a child's request never changes: its info alone
            t.on_child_done(child)
            metrics.child_done(child)
            return True, None
        return False, cause

    async def _reschedule(self, t: TriggerTask, child: Task, cause: BaseException | None = None) -> None:
        try:
            new = await self._replacements(t, child)
        except NoAvailableNode as exc:
            if not await t.park_unplaced_child(child, cause, exc):
                self._unplaceable(child, exc)
            child.set_state(FAILED)
            logger.info("{} could not be rescheduled ({}); its unit is parked, {} goes on", child.describe(), exc,
                        t.describe())
            await self.env.store.replace_child(child.rec, [])
            t.children = [c for c in t.children if c is not child]
            return
        except (TaskError, NodeError) as exc:
            self._unplaceable(child, exc)
        if new:
            ids = await self.env.ids.allocate(len(new))
            for c, i in zip(new, ids, strict=True):
                c.rec.id = i
                c.rec.parent_id = t.id
                c.rec.replaces_task_id = child.id
                c.parent = t
        logger.info("{} rescheduled as {}", child.describe(), [c.describe() for c in new])
        metrics.child_rescheduled(child)
        await self.env.store.replace_child(child.rec, [c.rec for c in new])
        t.children = [c for c in t.children if c is not child] + new
        await self._run_children(t, new)

    @staticmethod
    def _unplaceable(child: Task, exc: Exception) -> NoReturn:
        child.set_state(FAILED)
        last = child.rec.error or "its node went offline"
        raise TaskError(f"{child.describe()} failed ({last}) and could not be rescheduled: {exc}",
                        getattr(exc, "code", common_pb2.NO_AVAILABLE_NODE)) from exc

    async def _replacements(self, t: TriggerTask, child: Task) -> list[Task]:
        """``child.reschedule()``; for a tree this leader resumed (a restart, a failover), no online node is not an
        answer yet while the nodes may still be registering: it waits up to ``resume_node_wait`` seconds after
        the takeover for a node to join, then asks again.

        Why: after a whole cluster restarts, the coordinator often leads before the query nodes are back, and
        failing a resumed load then (NO_AVAILABLE_NODE) threw away work the nodes could do a moment later.
        """
        while True:
            try:
                return await child.reschedule()
            except NoAvailableNode as exc:
                left = self.resumed_at + self.cfg.resume_node_wait - time.monotonic()
                if not t.resumed or left <= 0:
                    raise
                seen = self.env.nodes.version
                logger.info("{}: {}; waiting up to {:.0f}s for query nodes to register", child.describe(), exc, left)
                self.waits.waiting_for_nodes(t.id, child, str(exc), time.time() + left)
                try:
                    while self.env.nodes.version == seen and \
                            time.monotonic() < self.resumed_at + self.cfg.resume_node_wait:
                        await asyncio.sleep(self.cfg.wait_interval)
                finally:
                    self.waits.nodes_done(t.id)

    async def _fail(self, t: TriggerTask, exc: BaseException) -> None:
        """Roll back on the nodes (best effort, bounded), undo query meta, record the error."""
        logger.warning("{} failed: {}", t.describe(), exc)
        t.set_error(exc)
        rollback = t.roll_back()
        if rollback:
            results = await asyncio.gather(*(self._rollback_child(c) for c in rollback), return_exceptions=True)
            for r in results:
                if isinstance(r, NotLeader):
                    raise r
        await t.after_failure()
        t.set_state(FAILED)

    async def _rollback_child(self, c: Task) -> None:
        for attempt in range(self.cfg.retry_budget):
            try:
                await c.execute()
                return
            except _CHILD_FAILURES as exc:
                if isinstance(exc, NotLeader):
                    raise
                if not c.retryable_on_node() or attempt == self.cfg.retry_budget - 1:
                    logger.warning("rollback {} gave up: {}", c.describe(), exc)
                    return
                await asyncio.sleep(self.cfg.retry_backoff)

    def _release_locks(self, t: TriggerTask) -> None:
        for c in getattr(t, "locked", ()):
            if self._busy.get(c) == t.id:
                del self._busy[c]

    def _drop(self, t: TriggerTask) -> None:
        """Forget a trigger without finishing it (shutdown / lost leadership): its keys stay for the next leader."""
        self._running.pop(t.id, None)
        self._started_ms.pop(t.id, None)
        self.waits.forget(t.id)
        self._release_locks(t)

    def _finish(self, t: TriggerTask, error: BaseException | None) -> None:
        self._running.pop(t.id, None)
        self.triggers.pop(t.id, None)
        self._cancel_reason.pop(t.id, None)
        self._started_ms.pop(t.id, None)
        self.waits.forget(t.id)
        self._release_locks(t)
        self.finished.append(self.tree(t))
        self._finished_since_prune += 1
        if self.cfg.history_keep > 0 and self._finished_since_prune >= max(1, self.cfg.history_keep // 10):
            self._prune_kick.set()  # prune before the history grows past its bound by more than a tenth
        metrics.trigger_finished(t, error)
        for hook in self.finish_hooks:
            try:
                hook(t)
            except Exception as exc:
                logger.warning("a finish hook of {} failed: {}", t.describe(), exc)
        for c in t.children:  # a finished tree must not be a reference cycle: the full GC rarely runs (process.py)
            c.parent = None
        for fut in (t.planned, t.finished):
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error if isinstance(error, TaskError)
                                  else TaskError(str(error), getattr(error, "code", common_pb2.UNEXPECTED_ERROR)))
                fut.exception()
        self._wake.set()

    # ----- task history retention ----------------------------------------------------------------------------
    async def prune_history(self) -> int:
        """Prune the task history to its configured count and age (``TaskHistory.prune``); returns how many
        records were deleted. With ``history_keep`` 0 no history is written, and whatever an earlier
        configuration left is pruned away."""
        self._finished_since_prune = 0
        return await self._history.prune(
            keep=self.cfg.history_keep, max_age_s=self.cfg.history_max_age, now_ms=now_ms())

    async def _prune_loop(self) -> None:
        """The leader's periodic sweep of the task history (also kicked when many trees finished)."""
        while not self.stopped:
            try:
                await self.prune_history()
            except NotLeader as exc:
                self._leadership_lost(exc)
                return
            except Exception as exc:  # etcd trouble or a bug: never let the sweep die
                if loop_failed("task history pruner", exc, self.env.store.kv.client):
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._prune_kick.wait(), self.cfg.history_sweep_interval)
            self._prune_kick.clear()

    # ----- reload -------------------------------------------------------------------------------------------------
    async def reload(self) -> int:
        """Rebuild the queue from etcd (see the commit points in ``task.store``)."""
        self.resumed_at = time.monotonic()
        records = await self.env.store.load_all()
        by_id = {r.id: r for r in records}
        garbage: list[task_pb2.TaskRecord] = []
        children: dict[int, list[task_pb2.TaskRecord]] = {}
        for r in records:
            if r.parent_id == 0:
                continue
            parent = by_id.get(r.parent_id)
            if parent is None or parent.state != DONE or (r.replaces_task_id and r.replaces_task_id in by_id):
                garbage.append(r)  # uncommitted plan or uncommitted reschedule
            else:
                children.setdefault(r.parent_id, []).append(r)
        queued = 0
        for r in sorted((r for r in records if r.parent_id == 0), key=lambda r: r.id):
            cls = Task.KINDS.get(r.WhichOneof("request") or "")
            if cls is None or not issubclass(cls, TriggerTask) or r.state in (EXPIRED, FAILED):
                garbage.append(r)
                garbage.extend(children.pop(r.id, []))
                continue
            t = cls(self.env, r)
            t.resumed = True
            if r.state == DONE:
                for cr in sorted(children.pop(r.id, []), key=lambda c: c.id):
                    ccls = Task.KINDS.get(cr.WhichOneof("request") or "")
                    if ccls is None or ccls.IS_TRIGGER:
                        garbage.append(cr)
                        continue
                    child = ccls(self.env, cr)
                    child.parent = t
                    t.children.append(child)
            else:
                garbage.extend(children.pop(r.id, []))
            self._push(t)
            queued += 1
        if garbage:
            await self.env.store.remove(garbage)
        if self.env.store.orphan_request_keys:
            await self.env.store.remove_keys(self.env.store.orphan_request_keys)
        logger.info("scheduler reload: {} triggers queued, {} garbage records removed", queued, len(garbage))
        return queued

    # ----- views --------------------------------------------------------------------------------------------------
    def tree(self, t: TriggerTask, children_limit: int = 0) -> qc.TaskTree:
        counts = qc.ChildStateCounts(total=len(t.children))
        for c in t.children:
            name = {UNDO: "undo", DOING: "doing", DONE: "done", EXPIRED: "expired", FAILED: "failed"}[c.state]
            setattr(counts, name, getattr(counts, name) + 1)
        kids = t.children if not children_limit else t.children[:children_limit]
        return qc.TaskTree(trigger=t.info(), children=[c.info() for c in kids], child_counts=counts,
                           waits=self.waits_of(t))

    def waits_of(self, t: TriggerTask) -> list[qc.TaskWait]:
        """What ``t`` waits for now (``task.waits``); nothing once it finished."""
        if self.triggers.get(t.id) is not t:
            return []
        held = next((c for c in sorted(t.collections()) if self._busy.get(c, t.id) != t.id), 0)
        pause = self._pauses.get(t.id)
        return trigger_waits(TriggerState(
            t.id, running=t.id in self._running, planned=t.state not in (UNDO, DOING),
            since_ms=self._started_ms.get(t.id, t.rec.created_ms), blocked_by=self._busy.get(held, 0),
            collection_id=held, slots_taken=len(self._running), slots=self.cfg.max_concurrent_triggers,
            paused_since=time.time() - (time.monotonic() - pause.since) if pause is not None else 0.0), self.waits)

    def find(self, task_id: int) -> TriggerTask | None:
        t = self.triggers.get(task_id)
        if t is not None:
            return t
        for trig in self.triggers.values():
            if any(c.id == task_id for c in trig.children):
                return trig
        return None
