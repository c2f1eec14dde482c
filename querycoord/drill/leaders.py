"""What both drills need to follow their coordinators: who leads now, and waiting on a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any


class LeaderTracking:
    """Mixin for a drill with ``coords`` (each with ``role``, ``role_t`` and ``child``) and a ``_changed`` event
    set whenever a child reports something."""

    coords: list[Any]
    _changed: asyncio.Event

    def _leader(self) -> Any:
        """The coordinator that most recently reported leading and still runs, if any."""
        live = [c for c in self.coords if c.role == "leader" and c.child.running]
        return max(live, key=lambda c: c.role_t) if live else None

    async def _wait_until(self, cond: Any, timeout: float) -> Any:
        """``cond()``'s first truthy value, re-checked on every child event (and twice a second); TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            self._changed.clear()
            value = cond()
            if value:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
