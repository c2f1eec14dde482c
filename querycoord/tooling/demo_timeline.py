"""What the demos share: the short session TTL they run with, so a crash is noticed quickly, and their clock."""

from __future__ import annotations

import time

# Seconds: the session TTL of every process of the demos.
TTL = 2.0


class Timeline:
    """The demo's lines, each stamped with the seconds since the demo started."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def stamp(self, at: float | None = None) -> str:
        return f"  {(at or time.time()) - self.t0:6.1f}s  "

    def say(self, what: str, at: float | None = None) -> None:
        print(f"{self.stamp(at)}{what}", flush=True)
