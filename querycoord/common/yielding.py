"""Long loops give the event loop a turn: ``every_few``.

The leader's session keepalive, its election watch and every gRPC answer run on the one event loop. Planning a
million segments (building load infos, stripping, placing) or reloading a million records has no await of its
own: without a turn now and then the lease lapses mid-plan (seen at 1M segments with TTL 10 s) and every caller
waits seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Iterable
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


#: A computation cut in steps: a generator that yields (nothing) where a turn may be given, and returns its result.
Steps = Generator[None, None, T]


def run_steps(steps: Steps[T]) -> T:
    """The result of ``steps``, run through in one stretch (for callers that are not coroutines)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


async def run_steps_with_turns(steps: Steps[T]) -> T:
    """The result of ``steps``, with a turn of the event loop at each step: the same computation as
    ``run_steps``, for a coroutine whose input may be a million segments."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)
