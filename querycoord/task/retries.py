"""A trigger's children on their nodes: retries, rescheduling, and the rollback of a failed tree.

* A child is retried on its node with back-off while its node is online
  and its budget lasts, then rescheduled to other nodes (its node added to
  the excluded ones); when no node can take it the trigger fails and is
  rolled back. A child that no node has room for parks its unit and the
  tree goes on (``task.parking``).
* A tree this leader resumed waits a while for nodes to register before
  "no online node" counts as an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, NoReturn

from loguru import logger

from meta.errors import NotLeader
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.client import NodeError
from querycoord.common import events
from querycoord.task.children import LoadSegmentsTask
from querycoord.task.leadership import CHILD_FAILURES, LeadershipLost, is_stale_leader
from querycoord.task.model import CANCELLED, DONE, FAILED, Task, TaskCancelled, TaskEnv, TaskError, check_cancelled
from querycoord.task.throttle import move_kind
from querycoord.task.triggers import TriggerTask
from querycoord.task.waits import Waits


class ChildRunner:
    """Runs children to DONE or to their trigger's failure (see module docstring), noting their waits."""

    def __init__(self, env: TaskEnv, waits: Waits):
        self.env = env
        self.cfg = env.config
        self.waits = waits
        self.resumed_at = time.monotonic()  # when the queue was reloaded: resumed trees wait for nodes from then on

    async def run_children(self, t: TriggerTask, children: list[Task]) -> None:
        """Run ``children`` concurrently (bounded); raise one error naming the failed ones, if any."""
        sem = asyncio.Semaphore(self.cfg.max_concurrent_children)

        async def run(c: Task) -> None:
            async with sem:
                with logger.contextualize(child=c.id, node=c.node_id):
                    await self._run_child(t, c)

        results = await asyncio.gather(*(run(c) for c in children), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for e in errors:
            if isinstance(e, NotLeader | LeadershipLost | asyncio.CancelledError) or is_stale_leader(e):
                raise e
        check_cancelled(t)  # the children stopped for CancelTask: the tree's answer is that, not their errors
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
            check_cancelled(t)  # CancelTask: no new attempt (see ``executor``)
            child.rec.retry_count += 1
            self.waits.calling(t.id, child)
            try:
                if isinstance(child, LoadSegmentsTask):
                    child.move_slot = self._move_slot(t, child)  # taken once its node's load gate is the child's
                    try:
                        await child.execute()
                    finally:
                        child.move_slot = contextlib.nullcontext()  # entered once: the next attempt gets its own
                else:
                    async with self._move_slot(t, child):
                        await child.execute()
            except CHILD_FAILURES as exc:
                if isinstance(exc, NotLeader) or is_stale_leader(exc):
                    raise LeadershipLost(str(exc)) from exc
                if isinstance(exc, TaskCancelled):
                    raise
                cause = exc
                child.set_error(exc)
                logger.info("{} attempt {}/{} failed: {}", child.describe(), child.rec.retry_count, budget, exc)
                exhausted = child.rec.retry_count >= budget and not child.RETRY_WHILE_NODE_ONLINE
                if exhausted or not child.retryable_on_node():
                    break
                events.child_retried(child.KIND)
                delay = min(self.cfg.retry_backoff * 2 ** (child.rec.retry_count - 1), self.cfg.retry_backoff_max)
                self.waits.backing_off(t.id, child, delay)
                await asyncio.sleep(delay)
                check_cancelled(t)
                continue
            child.set_state(DONE)
            await self.env.store.save_state(child.rec)  # a child's request never changes: its info alone
            t.on_child_done(child)
            events.child_done(child.KIND, child.rec.created_ms)
            return True, None
        return False, cause

    def _move_slot(self, t: TriggerTask, child: Task) -> contextlib.AbstractAsyncContextManager[Any]:
        """A slot of the move budget the child's load needs (``task.throttle``): a segment load of a recovery or
        balance trigger, counted on its node and its source; anything else runs without one."""
        kind = move_kind(t) if child.KIND == qc.TASK_KIND_LOAD_SEGMENT else None
        if kind is None:
            return contextlib.nullcontext()
        source = child.request.source_node_id
        nodes = [child.node_id, source] if source else [child.node_id]
        waited = False

        def on_wait(why: str) -> None:
            nonlocal waited
            waited = True
            self.waits.throttled(t.id, child, why)

        @contextlib.asynccontextmanager
        async def slot() -> Any:
            async with self.env.throttle.slot(kind, nodes, on_wait):
                if waited:
                    self.waits.calling(t.id, child)  # at work now: no longer throttled
                yield

        return slot()

    async def _reschedule(self, t: TriggerTask, child: Task, cause: BaseException | None = None) -> None:
        check_cancelled(t)
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
        events.child_rescheduled(child.KIND)
        await self.env.store.replace_child(child.rec, [c.rec for c in new])
        t.children = [c for c in t.children if c is not child] + new
        await self.run_children(t, new)

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
        failing a resumed load then (NO_AVAILABLE_NODE) would throw away work the nodes could do a moment later.
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
                        check_cancelled(t)
                finally:
                    self.waits.nodes_done(t.id)

    async def fail(self, t: TriggerTask, exc: BaseException) -> None:
        """Roll back on the nodes (best effort, bounded), undo query meta, record the error."""
        logger.warning("{} failed: {}", t.describe(), exc)
        t.set_error(exc)
        rollback = t.roll_back()
        for c in rollback:
            c.undoing = True  # type: ignore[attr-defined]  # it runs although the tree is cancelled
        if rollback:
            results = await asyncio.gather(*(self._rollback_child(c) for c in rollback), return_exceptions=True)
            for r in results:
                if isinstance(r, NotLeader):
                    raise r
        await t.after_failure()
        # A cancelled tree is never shown FAILED, not even while its rollback ends (GetTask read it so once).
        t.set_state(CANCELLED if t.cancel_why else FAILED)

    async def _rollback_child(self, c: Task) -> None:
        for attempt in range(self.cfg.retry_budget):
            try:
                await c.execute()
                return
            except CHILD_FAILURES as exc:
                if isinstance(exc, NotLeader):
                    raise
                if not c.retryable_on_node() or attempt == self.cfg.retry_budget - 1:
                    logger.warning("rollback {} gave up: {}", c.describe(), exc)
                    return
                await asyncio.sleep(self.cfg.retry_backoff)
