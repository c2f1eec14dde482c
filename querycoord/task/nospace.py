"""Triggers pause while etcd is out of space: a write refused for NOSPACE waits until etcd has room again, with
the trigger's deadline stopped meanwhile, so it resumes with the time it had left whatever the maintenance takes.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from loguru import logger

from meta.errors import MetaNoSpace
from querycoord.task.triggers import TriggerTask

if TYPE_CHECKING:
    from querycoord.common.etcd_space import SpaceMonitor


class _Pause:
    """A trigger whose writes wait for etcd to have space: how many, since when, the deadline time it had left."""

    def __init__(self, left: float | None):
        self.waiting = 0
        self.since = time.monotonic()
        self.left = left


class SpacePauses:
    """The running triggers' deadlines and their pauses for space (``triggers``: the queue's, read by id)."""

    def __init__(self, space: SpaceMonitor | None, triggers: Mapping[int, TriggerTask]):
        self.space = space
        self.triggers = triggers
        self.timeouts: dict[int, asyncio.Timeout] = {}  # running trigger id -> its deadline
        self._pauses: dict[int, _Pause] = {}  # trigger id -> its writes waiting for etcd to have space

    def waiter(self, trigger_id: int) -> Callable[[MetaNoSpace], Awaitable[None]]:
        """What a write of ``trigger_id`` calls when refused for NOSPACE (``meta.client.NOSPACE_WAIT``)."""
        return functools.partial(self.wait_for_space, trigger_id)

    def paused_since(self, trigger_id: int) -> float:
        """Wall time the trigger's writes began to wait for space; 0.0 when they do not wait."""
        pause = self._pauses.get(trigger_id)
        return time.time() - (time.monotonic() - pause.since) if pause is not None else 0.0

    async def wait_for_space(self, trigger_id: int, exc: MetaNoSpace) -> None:
        """A write of trigger ``trigger_id`` was refused for NOSPACE: wait until etcd has space again (then the
        write is retried). While any of its writes waits its deadline is stopped."""
        assert self.space is not None
        self.space.noted(exc)
        loop = asyncio.get_running_loop()
        t = self.triggers.get(trigger_id)
        what = t.describe() if t is not None else f"task {trigger_id}"
        pause = self._pauses.get(trigger_id)
        if pause is None:
            timeout = self.timeouts.get(trigger_id)
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
                timeout = self.timeouts.get(trigger_id)
                if timeout is not None and pause.left is not None:
                    timeout.reschedule(loop.time() + pause.left)
                logger.warning("{}: resumed after {:.1f}s", what, time.monotonic() - pause.since)
