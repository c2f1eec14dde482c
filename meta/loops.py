"""Background loops never die: what one meets is logged, counted, and the loop goes on.

Why: a loop task that ends with an exception ends silently (asyncio only says "Task exception was never
retrieved" when the task is collected, if ever), and whatever it watched goes unwatched: the etcd space monitor
once ended on an AssertionError, after which a NOSPACE alarm would have gone unnoticed. Every background loop
of the coordinator either guards each round itself and reports what it caught through ``loop_failed``, or is
run by ``keep_running``, which runs it again after a pause whatever it raised.

A closed etcd client is a clean stop, not an error: the process is stopping (or a test crashed it), nothing the
loop could do would work again, and retrying would only log the same failure forever. ``CancelledError`` is
never caught: cancelling is how a loop is stopped.

Each failure is counted through ``meta.observe.loop_error`` (the coordinator's
``querycoord_background_loop_errors_total{loop=...}``); loop names are fixed strings, never keys or ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from meta import observe
from meta.errors import ClientClosed, MetaError
from meta.log import logger

#: First pause before a loop that raised runs again; doubled while it keeps failing at once, up to ``MAX_PAUSE``.
FIRST_PAUSE = 0.5
MAX_PAUSE = 10.0


class Closable(Protocol):
    """What a loop needs of its etcd client: whether it was closed (``meta.client.EtcdClient``)."""

    @property
    def closed(self) -> bool: ...


def stopped_by(exc: BaseException, client: Closable | None = None) -> bool:
    """Whether ``exc`` means the loop's etcd client is closed: a clean stop, whatever the exception says (a
    closed client's stubs raise anything from AttributeError to a gRPC usage error)."""
    return isinstance(exc, ClientClosed) or (client is not None and client.closed)


def loop_failed(loop: str, exc: BaseException, client: Closable | None = None) -> bool:
    """A round of background loop ``loop`` raised ``exc``: True if the loop should stop (its client is closed;
    logged at debug level), else the failure is logged and counted and the loop goes on (False).

    etcd trouble (``MetaError``) is logged in one line; anything else, a bug, with its traceback."""
    if stopped_by(exc, client):
        logger.debug("{}: the etcd client is closed; the loop stops", loop)
        return True
    observe.loop_error(loop)
    if isinstance(exc, MetaError):
        logger.warning("{}: {}; the loop goes on", loop, exc)
    else:
        logger.opt(exception=exc).error("{}: unexpected {}: {}; the loop goes on", loop, type(exc).__name__, exc)
    return False


async def keep_running(loop: str, body: Callable[[], Awaitable[None]], *, client: Closable | None = None,
                       first_pause: float = FIRST_PAUSE, max_pause: float = MAX_PAUSE) -> None:
    """Run ``body()`` until it returns; if it raises, report it (``loop_failed``) and run it again after a pause
    (doubled while it keeps failing within ``max_pause`` of its start). Returns when ``body`` returns or the
    client is closed; ``CancelledError`` goes through."""
    pause = first_pause
    while True:
        started = time.monotonic()
        try:
            await body()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if loop_failed(loop, exc, client):
                return
        if time.monotonic() - started > max_pause:  # it ran a good while: a new failure, not the same one again
            pause = first_pause
        await asyncio.sleep(pause)
        pause = min(pause * 2, max_pause)


async def follow_forever(loop: str, follow: Callable[[], Awaitable[None]], *, pause: float,
                         client: Closable | None = None, on_error: Callable[[], None] | None = None,
                         after: Callable[[], None] | None = None) -> None:
    """Run ``follow()`` (a watch) again and again, ``pause`` after each end, whether it returned or raised
    (reported through ``loop_failed``): a watch that ends or breaks restarts from a fresh read, so nothing goes
    unwatched for long. ``on_error`` runs on each failure, ``after`` after each end (the last too). Returns when
    the client is closed; ``CancelledError`` goes through."""
    while True:
        try:
            await follow()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if on_error is not None:
                on_error()
            if loop_failed(loop, exc, client):
                if after is not None:
                    after()
                return
        if after is not None:
            after()
        await asyncio.sleep(pause)


__all__ = ["FIRST_PAUSE", "MAX_PAUSE", "Closable", "follow_forever", "keep_running", "loop_failed", "stopped_by"]
