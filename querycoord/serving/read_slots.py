"""Bounded concurrency of the heavy reads: a few run at once per kind, a few more wait a little, the rest are told.

Why: GetSegmentInfo asks every online node, ListTasks may page the task
history, GetReplicas walks every segment of a collection; each holds its
answer (up to the message limit) while it is built. Unbounded, a reader's
credential (or a buggy dashboard) running many of them at once costs memory
without limit; a standby crashed that way and then could not take over.
Bounded, the cost of one kind is at most ``slots`` answers, and a caller over
the bound gets RESOURCE_EXHAUSTED naming the read and the bound (retry later),
never a hang or a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from proto import common_pb2
from querycoord.common.errors import CoordError
from querycoord.common.limits import DEFAULT_LIMITS
from querycoord.common.metrics import READS_REFUSED

# Per kind: reads running at once and callers waiting beyond them (defaults of ``Limits.max_heavy_reads*``,
# configurable), and how long one waits at most (also bounded by the caller's deadline).
READ_SLOTS = DEFAULT_LIMITS.max_heavy_reads
READ_QUEUE = DEFAULT_LIMITS.max_heavy_reads_waiting
READ_WAIT = 5.0


class Busy(CoordError):
    """Too many reads of one kind at once: the caller should retry later."""

    code = common_pb2.RESOURCE_EXHAUSTED


class ReadSlots:
    """``async with slots.hold("GetReplicas", budget)``: run within the bound of that kind, or raise ``Busy``."""

    def __init__(self, slots: int = READ_SLOTS, queue: int = READ_QUEUE, wait: float = READ_WAIT):
        self.slots, self.queue, self.wait = slots, queue, wait
        self._sems: dict[str, asyncio.Semaphore] = {}
        self._waiting: dict[str, int] = {}

    def _busy(self, kind: str, why: str) -> Busy:
        READS_REFUSED.labels(kind).inc()
        return Busy(f"{kind}: too many at once ({self.slots} running, {self._waiting.get(kind, 0)} waiting); "
                    f"{why}; retry later")

    @contextlib.asynccontextmanager
    async def hold(self, kind: str, budget: float | None = None) -> AsyncIterator[None]:
        sem = self._sems.setdefault(kind, asyncio.Semaphore(self.slots))
        waiting = self._waiting.get(kind, 0)
        if sem.locked() and waiting >= self.queue:
            raise self._busy(kind, f"no room to wait (at most {self.queue})")
        wait = self.wait if budget is None else min(self.wait, budget)
        self._waiting[kind] = waiting + 1
        try:
            async with asyncio.timeout(wait):
                await sem.acquire()
        except TimeoutError:
            raise self._busy(kind, f"none finished within {wait:g}s") from None
        finally:
            self._waiting[kind] -= 1
        try:
            yield
        finally:
            sem.release()


__all__ = ["READ_QUEUE", "READ_SLOTS", "READ_WAIT", "Busy", "ReadSlots"]
