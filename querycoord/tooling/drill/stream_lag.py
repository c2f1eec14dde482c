"""The stream drill's lag sampler: every stream's lag as the leader shows it, sampled through the whole run.

Every ``interval`` seconds it asks the leader's ShowStreams (without task
tables) and keeps the lag of each stream that has progress (a stream that
is stopped, not running yet, or answered during WATCH or by a standby has
none and is not sampled: that is not a lag of 0). ``lag_p99_s`` is the 99th
percentile over all samples: with the reference nodes keeping up, it stays
near one heartbeat tick even across the drill's faults, unless a stream's
tasks stop making progress while still reporting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

from proto import stream_pb2

ShowCall = Callable[[], Awaitable[stream_pb2.ShowStreamsResponse]]


class LagSampler:
    """Samples every stream's lag until cancelled (see module docstring)."""

    def __init__(self, show: ShowCall, *, interval: float = 0.5):
        self.show = show
        self.interval = interval
        self.samples: list[int] = []  # lag in ms, one per stream per look
        self.looks = 0
        self.failed_looks = 0

    async def run(self) -> None:
        while True:
            try:
                resp = await self.show()
            except asyncio.CancelledError:
                raise
            except Exception:  # no leader for a moment (a kill): the next look counts
                self.failed_looks += 1
            else:
                self.looks += 1
                self.samples.extend(i.lag_ms for i in resp.streams if i.processed_ms)
            await asyncio.sleep(self.interval)

    def p99_s(self) -> float | None:
        """The 99th percentile (nearest rank) of the sampled lags in seconds; None before any sample."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return round(ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] / 1000, 3)

    def summary(self) -> dict[str, Any]:
        return {"lag_p99_s": self.p99_s(), "lag_max_s": round(max(self.samples) / 1000, 3) if self.samples else None,
                "lag_samples": len(self.samples)}


async def stop(task: asyncio.Task[None]) -> None:
    """Cancel a running sampler and wait for it."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
