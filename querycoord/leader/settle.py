"""Load progress raised the moment a repair or a balance (a drain's move) ends, not at the checker's next pass.

The checker corrects the persisted percentages from the nodes' distributions, but only once its pass has asked every
node for what it holds and compared a whole collection with its target: at a million segments that comes a second
or more after the nodes hold everything again, and until then ShowCollections (the lower of the persisted and the
served figure) shows the collection below 100 %. So when such a trigger ends, each collection it touched is counted
at once by ``served.state`` (the copies query meta records on online nodes, each written when its node answered the
load, against the followed catalog's target, brought up to etcd's revision first) and the persisted percentages
are raised to that (``served.persist.persist_raised``), through query meta's fenced writes. Never more than the
nodes answered: a segment whose LoadSegments failed is recorded nowhere, a node lost meanwhile counts for nothing,
and a collection a trigger owns again (a load, a release) is left alone. A leader that dies before this write
leaves the percentages to the next leader's first pass, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from loguru import logger

from proto import querycoord_pb2 as qc
from querycoord.catalog.targets import CatalogTargets
from querycoord.checkers.targets import TARGETS_CATCH_UP
from querycoord.served.persist import persist_raised
from querycoord.served.state import ServedView
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import TriggerTask

# Triggers that move copies between nodes and leave the percentages to the checker.
_MOVES = frozenset({qc.TASK_KIND_REPAIR, qc.TASK_KIND_LOAD_BALANCE, qc.TASK_KIND_REHOME_NODE})


class ProgressAfterMoves:
    """``after_trigger`` is a scheduler finish hook; the counting runs in one background task per leadership."""

    def __init__(self, scheduler: Scheduler, served: ServedView, targets: CatalogTargets | None,
                 busy: Callable[[], set[int]] | None = None):
        """``busy``: the collections left alone (default: those triggers own; the checker's also counts those
        whose next repair part it is queuing: their percentages wait for the last part)."""
        self.scheduler = scheduler
        self.busy = busy if busy is not None else scheduler.busy_collections
        self.served = served
        self.targets = targets
        self._pending: set[int] = set()
        self._task: asyncio.Task[None] | None = None
        self.raised = 0  # collections whose percentages were raised (tests, logs)

    def after_trigger(self, trigger: TriggerTask) -> None:
        if trigger.KIND not in _MOVES or self.targets is None or self.scheduler.stopped:
            return
        self._pending |= {c for c in {trigger.collection_id, *trigger.collections()} if c}
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="progress-after-moves")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._pending and not self.scheduler.stopped:
            cids, self._pending = sorted(self._pending), set()
            try:
                assert self.targets is not None
                await self.targets.catch_up(TARGETS_CATCH_UP)
                for cid in cids:
                    # Checked after the catch-up's await, with no await before the counting: a trigger that took
                    # the collection meanwhile owns its percentages.
                    if cid in self.busy() or self.scheduler.stopped:
                        continue
                    if await persist_raised(self.scheduler.env.meta, cid, self.served.collection(cid)):
                        self.raised += 1
                        logger.info("collection {}: load progress raised to what the nodes hold after its move",
                                    cid)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # TimeoutError, MetaError, a lost fence: the checker's next pass sets them
                logger.info("load progress after a move left to the checker: {}", exc)
                return
