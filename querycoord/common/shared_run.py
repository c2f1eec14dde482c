"""One run of a costly read shared by every caller that asked while it had not started yet (single flight).

Why: a read such as a standby's rebuild of the whole query meta costs hundreds
of MiB at 100k segments; one run per caller would let a few dozen concurrent
readers exhaust the process's memory. Shared, the cost is one run at a time
whatever the number of callers.

A caller never gets the result of a run that started before it called (that
run may have read etcd before the caller's own write was acknowledged): it
joins the run that has not started yet, or starts one after the running one.
So at most two runs exist at once: one running, one gathering callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedRun(Generic[T]):
    """``await run()``: the result of a run of ``fn`` that started after this call (shared with other callers)."""

    def __init__(self, fn: Callable[[], Awaitable[T]], name: str = "shared-run"):
        self._fn = fn
        self._name = name
        self._open: asyncio.Task[T] | None = None  # not started yet: later callers join it
        self._tail: asyncio.Task[T] | None = None  # the last run created (it may still be running)
        self.runs = 0  # runs started (tests and benchmarks count them)

    async def _run(self, previous: asyncio.Task[T] | None) -> T:
        if previous is not None:
            await asyncio.wait({previous})
        self._open = None  # from here on, a new caller needs a run that starts after it
        self.runs += 1
        return await self._fn()

    async def __call__(self) -> T:
        task = self._open
        if task is None:
            task = asyncio.create_task(self._run(self._tail), name=self._name)
            task.add_done_callback(_retrieve)
            self._open = self._tail = task
        # shield: a caller that gives up (deadline, cancel) must not cancel the run the others wait for.
        return await asyncio.shield(task)


def _retrieve(task: asyncio.Task[object]) -> None:
    """Its exception was seen by its callers; when every caller left, it must not be reported as unretrieved."""
    if not task.cancelled():
        task.exception()


__all__ = ["SharedRun"]
