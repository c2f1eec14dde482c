"""Run a querycoord process (``python -m MODULE ARGS``) with a profiler switched by signals, for the benches.

    python scripts/profiled_coord.py DIR -m querycoord.cli coord ...

SIGUSR1 starts a fresh cProfile of the main thread (the event loop: every coroutine of the process); SIGUSR2
stops it and writes it to ``DIR/profile-<k>.prof`` (k = 1, 2, ...; written under another name and renamed,
so a file that exists is complete). A profile thus covers one stretch of a long-running coordinator (its
checker's steady passes, a repair) instead of its whole life, and needs no hook in the product.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit("usage: profiled_coord.py DIR -m MODULE [ARGS...]")
    out, module = Path(sys.argv[1]), sys.argv[3]
    out.mkdir(parents=True, exist_ok=True)
    current: list[cProfile.Profile] = []
    written = [0]

    def start(_sig: int, _frame: FrameType | None) -> None:
        if not current:
            current.append(cProfile.Profile())
            current[0].enable()

    def stop(_sig: int, _frame: FrameType | None) -> None:
        if current:
            prof = current.pop()
            prof.disable()
            written[0] += 1
            tmp = out / f".profile-{written[0]}.tmp"
            prof.dump_stats(str(tmp))
            os.replace(tmp, out / f"profile-{written[0]}.prof")

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
