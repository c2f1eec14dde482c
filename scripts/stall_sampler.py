"""Run a querycoord process (``python -m MODULE ARGS``) and record where its event loop stalls, for the benches.

    python scripts/stall_sampler.py FILE -m querycoord.cli coord ...

The loop's every iteration, and every return from its selector's wait, stamps the time (``BaseEventLoop._run_once``
and the selector's ``select`` wrapped); a watcher thread samples the main thread's stack every ``EVERY`` seconds
while, outside that wait, no stamp is newer than ``THRESHOLD`` seconds. When the loop
moves again, the stall (its length, and its sampled stacks grouped, most frequent first) is appended to FILE.
Cyclic GC collections over ``GC_NOTICE`` seconds are appended too (gc callbacks), since a full collection over
millions of tracked objects stalls the loop with no Python frame of its own. No hook in the product. A low
``STALL_THRESHOLD`` (0.03) at a small size finds the stretches that grow into long stalls at a large one.
"""

from __future__ import annotations

import asyncio.base_events
import gc
import os
import runpy
import selectors
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

#: A loop iteration older than this is a stall being sampled (``STALL_THRESHOLD`` in the environment: another).
THRESHOLD = float(os.environ.get("STALL_THRESHOLD", "0.15"))
#: Seconds between samples.
EVERY = 0.01
#: A GC collection longer than this is written down.
GC_NOTICE = 0.05
#: Frames kept per sample (innermost last).
DEPTH = 18


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit("usage: stall_sampler.py FILE -m MODULE [ARGS...]")
    out, module = Path(sys.argv[1]), sys.argv[3]
    out.parent.mkdir(parents=True, exist_ok=True)
    beat = [time.monotonic()]
    lock = threading.Lock()
    main_id = threading.main_thread().ident
    original = asyncio.base_events.BaseEventLoop._run_once  # noqa: SLF001 (the one place every iteration passes)

    idle = [False]
    selector = selectors.DefaultSelector
    waits = selector.select

    def run_once(self: Any) -> None:
        beat[0] = time.monotonic()
        original(self)

    def select(self: Any, timeout: float | None = None) -> Any:
        idle[0] = True  # waiting for I/O or a timer: not a stall, however long
        try:
            return waits(self, timeout)
        finally:
            idle[0] = False
            beat[0] = time.monotonic()

    asyncio.base_events.BaseEventLoop._run_once = run_once  # type: ignore[method-assign]  # noqa: SLF001
    selector.select = select  # type: ignore[method-assign]

    def write(text: str) -> None:
        with lock, out.open("a") as f:
            f.write(text)

    def stack() -> tuple[str, ...]:
        frame = sys._current_frames().get(main_id or 0)  # noqa: SLF001 (another thread's stack)
        if frame is None:
            return ()
        summary = traceback.extract_stack(frame)[-DEPTH:]
        return tuple(f"{os.path.relpath(s.filename)}:{s.lineno} {s.name}" for s in summary)

    def watch() -> None:
        samples: Counter[tuple[str, ...]] = Counter()
        stalled_from = 0.0
        while True:
            time.sleep(EVERY)
            began = beat[0]
            late = time.monotonic() - began
            if late > THRESHOLD and not idle[0]:
                stalled_from = began
                samples[stack()] += 1
            elif samples:
                length = beat[0] - stalled_from
                lines = [f"== stall {length:.3f}s at {time.strftime('%H:%M:%S')} ({sum(samples.values())} samples)"]
                for st, n in samples.most_common(4):
                    lines.append(f"  -- {n} samples:")
                    lines += [f"     {s}" for s in st]
                write("\n".join(lines) + "\n")
                samples.clear()

    gc_start = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
            return
        took = time.perf_counter() - gc_start[0]
        if took > GC_NOTICE:
            write(f"== gc generation {info['generation']} {took:.3f}s collected {info['collected']}\n")

    gc.callbacks.append(on_gc)
    threading.Thread(target=watch, name="stall sampler", daemon=True).start()
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
