"""Long loops give the event loop a turn: ``every_few``.

The leader's session keepalive, its election watch and every gRPC answer run on the one event loop. Planning a
million segments (building load infos, stripping, placing) or reloading a million records has no await of its
own: without a turn now and then the lease lapses mid-plan (seen at 1M segments with TTL 10 s) and every caller
waits seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

T = TypeVar("T")

#: Items between two turns: about a few milliseconds of per-segment Python work.
TURN_EVERY = 2_000


async def every_few(items: Iterable[T], every: int = TURN_EVERY) -> AsyncIterator[T]:
    """``items``, with ``await asyncio.sleep(0)`` after every ``every`` of them."""
    for i, item in enumerate(items, 1):
        yield item
        if i % every == 0:
            await asyncio.sleep(0)
