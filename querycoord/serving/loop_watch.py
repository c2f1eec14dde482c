"""How long the coordinator's event loop went without running anything else: the one stall that costs leadership.

Why: the session lease is kept alive, the election followed and every RPC answered on one asyncio loop. A piece
of work that holds the loop (a synchronous pass over a million records) past the session TTL lets the lease
lapse: another coordinator takes over, and from outside it looks like a crash. This watch wakes every
``INTERVAL`` seconds and measures how late it woke; a lateness over ``NOTICE`` is counted in
``querycoord_event_loop_blocked_seconds``, the largest one kept in ``querycoord_event_loop_blocked_max_seconds``,
and one over a third of the TTL is logged as a warning, so an operator sees the risk before the failover.
"""

from __future__ import annotations

import asyncio
import time

from loguru import logger

from querycoord.common.metrics import LOOP_BLOCKED, LOOP_BLOCKED_MAX

#: Seconds between the watch's wake-ups.
INTERVAL = 0.1
#: A lateness below this is the loop's normal jitter, not counted.
NOTICE = 0.05


class LoopWatch:
    """Measures the loop's lateness (see module docstring); ``largest`` is the longest block seen so far."""

    def __init__(self, session_ttl: float):
        self.session_ttl = session_ttl
        self.largest = 0.0

    def saw(self, late: float) -> None:
        """Count one wake-up that came ``late`` seconds after it was due."""
        if late < NOTICE:
            return
        LOOP_BLOCKED.observe(late)
        if late > self.largest:
            self.largest = late
            LOOP_BLOCKED_MAX.set(late)
        if late > self.session_ttl / 3:
            logger.warning("the event loop was blocked for {:.1f}s (session TTL {:g}s): a block longer than the "
                           "TTL lets the session lapse and hands the leadership to another coordinator", late,
                           self.session_ttl)

    async def run(self) -> None:
        """Wake every ``INTERVAL`` until cancelled."""
        while True:
            due = time.monotonic() + INTERVAL
            await asyncio.sleep(INTERVAL)
            self.saw(time.monotonic() - due)
