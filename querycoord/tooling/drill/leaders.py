"""Waiting on a condition about the cluster, woken by its processes' events rather than by polling alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_until(cond: Callable[[], T | None], changed: asyncio.Event, timeout: float) -> T:
    """``cond()``'s first truthy value, re-checked whenever ``changed`` is set (the harness sets it on every
    event) and twice a second, since another waiter may clear it first; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        changed.clear()
        value = cond()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), min(remaining, 0.5))


__all__ = ["wait_until"]
