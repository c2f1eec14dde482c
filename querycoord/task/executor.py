"""Running a trigger's tree: dispatch from the queue, plan and commit, children, and every way a tree ends.

Every trigger runs under its deadline. Whatever happens, a trigger either finishes (callers answered, keys
removed, lock and slot released) or, when leadership is gone, is dropped with its keys left for the next
leader (``Scheduler.stop`` answers the callers). A failed tree is rolled back within a bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from loguru import logger

from meta.client import NOSPACE_WAIT
from meta.errors import NotLeader
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.common import events
from querycoord.common.errors import CoordError
from querycoord.task.leadership import CHILD_FAILURES, Abandon, LeadershipLost, Lifecycle, internal, is_stale_leader
from querycoord.task.model import (
    CANCELLED,
    DOING,
    DONE,
    EXPIRED,
    FAILED,
    UNDO,
    TaskCancelled,
    TaskEnv,
    TaskError,
    check_cancelled,
    now_ms,
)
from querycoord.task.nospace import SpacePauses
from querycoord.task.queue import TriggerQueue
from querycoord.task.retention import Retention
from querycoord.task.retries import ChildRunner
from querycoord.task.triggers import TriggerTask
from querycoord.task.waits import Waits


class TreeRunner:
    """Takes triggers from ``queue`` and runs each tree to one of its exits (see module docstring)."""

    def __init__(self, env: TaskEnv, life: Lifecycle, queue: TriggerQueue, children: ChildRunner,
                 retention: Retention, pauses: SpacePauses, waits: Waits,
                 tree: Callable[[TriggerTask], qc.TaskTree]):
        """``tree``: the view of a finished trigger kept in ``finished``."""
        self.env = env
        self.cfg = env.config
        self.life = life
        self.queue = queue
        self.children = children
        self.retention = retention
        self.pauses = pauses
        self.waits = waits
        self.tree = tree
        self.finished: deque[qc.TaskTree] = deque(maxlen=self.cfg.finished_history)
        # Called with each finished trigger (the checker's kick: a release freed memory a parked unit may need).
        self.finish_hooks: list[Callable[[TriggerTask], None]] = []
        queue.finish_cancelled = self.finish_cancelled

    async def dispatch_loop(self) -> None:
        q = self.queue
        q.wake.set()  # (re)started by ``keep_running``: look at the queue at once
        while not self.life.stopped:
            await q.wake.wait()
            q.wake.clear()
            q.dispatch(lambda t: asyncio.create_task(self._run_with_ids(t), name=f"trigger-{t.id}"))

    async def _run_with_ids(self, t: TriggerTask) -> None:
        """``_run_trigger`` with the trigger's id and collection on every line logged while it runs (its children's
        lines too: their tasks inherit the context), so a json log can be filtered by task."""
        q = self.queue
        q.started.add(t.id)
        q.started_ms.setdefault(t.id, now_ms())
        try:
            with logger.contextualize(task=t.id, **({"collection": t.collection_id} if t.collection_id else {})):
                if t.id in q.cancel_reason or (t.cancel_why and t.state == UNDO):
                    # a release (or CancelTask) cancelled it before it took a step: nothing to undo
                    await self.finish_cancelled(t)
                else:
                    await self._run_trigger(t)
        finally:
            q.started.discard(t.id)
            q.finishing.discard(t.id)

    async def _run_trigger(self, t: TriggerTask) -> None:
        """Run one tree to one of its exits (see module docstring)."""
        if self.pauses.space is not None:  # the writes of this task and of its children wait out NOSPACE
            NOSPACE_WAIT.set(self.pauses.waiter(t.id))  # the id: tasks copy this context
        try:
            error = await self._run_tree(t)
            self.queue.finishing.add(t.id)  # ended: a release queued now waits for it, it does not cancel it
            await self.retention.remove_tree(t)
        except Abandon:
            self._drop(t)
            return
        except BaseException as exc:  # a bug, or a cancellation nobody asked for: still answer the callers
            logger.opt(exception=exc).error("{}: the runner failed unexpectedly", t.describe())
            if self.life.stopped:
                self._drop(t)
            else:
                self._finish(t, internal(exc))
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
                self.pauses.timeouts[t.id] = timeout
                try:
                    await self._execute_tree(t)
                    return None
                except asyncio.CancelledError:
                    reason = self.queue.cancel_reason.get(t.id)
                    if reason is None or self.life.stopped:
                        raise
                    current = asyncio.current_task()
                    if current is not None:
                        current.uncancel()  # the cancellation was ours and is handled here
                    error = TaskCancelled(reason)
                finally:
                    self.pauses.timeouts.pop(t.id, None)
        except TimeoutError as exc:
            error = TaskError(f"{t.describe()} passed its deadline of {self.cfg.trigger_timeout:.0f}s",
                              common_pb2.TIMEOUT)
            error.__cause__ = exc
        except Exception as exc:
            error = self._tree_error(t, exc)
        except asyncio.CancelledError:
            if self.life.stopped:
                raise Abandon from None
            raise
        if t.cancel_why:  # CancelTask: whatever stopped the tree, it ends cancelled, rolled back alike
            error = TaskCancelled(f"cancelled: {t.cancel_why}")
        await self._fail_safely(t, error)
        if t.cancel_why:
            t.set_state(CANCELLED)
        return error

    def _tree_error(self, t: TriggerTask, exc: Exception) -> BaseException:
        """The error a tree that raised ``exc`` fails with; raises ``Abandon`` when leadership is gone."""
        if isinstance(exc, NotLeader | LeadershipLost) or is_stale_leader(exc):
            self.life.lost(exc)
            raise Abandon from exc
        if not isinstance(exc, (*CHILD_FAILURES, CoordError)):  # a CoordError keeps its code (query meta's too)
            logger.opt(exception=exc).error("{}: unexpected error", t.describe())
            return internal(exc)
        return exc

    async def _execute_tree(self, t: TriggerTask) -> None:
        """Plan, commit, run the children, record the result. CancelTask (``t.cancel_why``) is honoured
        between the steps: after planning (nothing committed), by the children (no new node call; calls in flight
        end first, so the rollback undoes what the nodes hold), and before the result is recorded; a tree a new
        leader resumes with a cancel stored for it rebuilds what its rollback needs and is rolled back."""
        store = self.env.store
        if t.cancel_why:
            await t.on_reload()
            check_cancelled(t)
        while True:
            if t.state in (UNDO, DOING):
                t.set_state(DOING)
                await store.save(t.rec)
                await t.pre_execute()
                await t.execute()
                check_cancelled(t)
                await self._commit_plan(t)
            else:
                await t.on_reload()
            if not t.planned.done():
                t.planned.set_result(None)
            await self.children.run_children(t, [c for c in t.children if c.state != DONE])
            check_cancelled(t)
            await t.post_execute()
            if not t.another_phase:
                break
            await self._next_phase(t)
        t.set_state(EXPIRED)

    async def _next_phase(self, t: TriggerTask) -> None:
        """A trigger whose ``post_execute`` asked for another phase plans again: its record goes back to DOING
        (a new leader then runs ``execute`` again, and reload drops the finished children as an uncommitted
        plan's), then the finished children's keys go."""
        t.another_phase = False
        done = [c.rec for c in t.children if c.id]
        t.set_state(DOING)
        await self.env.store.save(t.rec)
        if done:
            await self.env.store.remove(done)
        t.children = []

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

    async def _fail_safely(self, t: TriggerTask, error: BaseException) -> None:
        """Roll back within a bound; a rollback that itself fails is logged, never left hanging."""
        self.queue.failing.add(t.id)
        try:
            await asyncio.wait_for(self.children.fail(t, error), self.cfg.rollback_timeout)
        except (NotLeader, LeadershipLost) as exc:
            self.life.lost(exc)
            raise Abandon from exc
        except asyncio.CancelledError:
            if self.life.stopped:
                raise Abandon from None
            raise
        except Exception as exc:
            if is_stale_leader(exc):
                self.life.lost(exc)
                raise Abandon from exc
            logger.opt(exception=exc).error("{}: rollback did not complete ({}); the checker repairs what is left",
                                            t.describe(), exc)
            t.set_error(error)
            t.set_state(CANCELLED if t.cancel_why else FAILED)
        finally:
            self.queue.failing.discard(t.id)

    async def finish_cancelled(self, t: TriggerTask) -> None:
        """Finish a load a release (or any trigger CancelTask) cancelled before it ran: nothing to roll back, its
        keys removed."""
        user = t.cancel_why
        err = TaskCancelled(f"cancelled: {user}" if user else self.queue.cancel_reason.get(t.id, "cancelled"))
        t.set_error(err)
        t.set_state(CANCELLED if user else FAILED)
        try:
            await self.retention.remove_tree(t)
        except Abandon:
            self._drop(t)
            return
        self._finish(t, err)

    def _drop(self, t: TriggerTask) -> None:
        """Forget a trigger without finishing it (shutdown / lost leadership): its keys stay for the next leader."""
        self.queue.running.pop(t.id, None)
        self.queue.started_ms.pop(t.id, None)
        self.waits.forget(t.id)
        self.queue.release_locks(t)

    def _finish(self, t: TriggerTask, error: BaseException | None) -> None:
        q = self.queue
        q.running.pop(t.id, None)
        q.drop(t)
        q.cancel_reason.pop(t.id, None)
        q.started_ms.pop(t.id, None)
        self.waits.forget(t.id)
        q.release_locks(t)
        self.finished.append(self.tree(t))
        self.retention.finished_one()
        result = "done" if error is None else "cancelled" if isinstance(error, TaskCancelled) else "failed"
        events.trigger_finished(t.KIND, t.rec.trigger_condition, t.rec.created_ms, result)
        for hook in self.finish_hooks:
            try:
                hook(t)
            except Exception as exc:
                logger.warning("a finish hook of {} failed: {}", t.describe(), exc)
        for c in t.children:  # a finished tree must not be a reference cycle: the full GC rarely runs (process.py)
            c.parent = None
        self._answer(t, error)
        q.wake.set()

    @staticmethod
    def _answer(t: TriggerTask, error: BaseException | None) -> None:
        for fut in (t.planned, t.finished):
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error if isinstance(error, TaskError)
                                  else TaskError(str(error), getattr(error, "code", common_pb2.UNEXPECTED_ERROR)))
                fut.exception()
