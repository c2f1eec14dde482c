"""Give the memory a large task freed back to the operating system.

A load of 100,000 segments builds and drops several protobuf messages per segment (catalog binlogs, load infos,
requests, query meta records, the nodes' distributions). Python frees them, but the coordinator's RSS stays near
its peak: the process raises the cyclic GC's thresholds (``process.py``), so garbage in cycles waits for a
generation-2 pass that rarely comes, and glibc's malloc keeps freed chunks in its arenas (only the top of the
main heap is returned on its own). ``release_freed_memory`` runs a full collection and then asks glibc to
return every free page (``malloc_trim(0)``); it logs the RSS before and after.

It blocks the event loop for a full GC pass (tens of ms per 100,000 live objects), so it is for the end of a
large task, never for a hot path: ``release_soon`` schedules one run a little later (so whatever just finished
is unreferenced by then), coalescing requests that arrive meanwhile. While other work runs (``defer_while``: the
scheduler, while a trigger runs) the run waits for it, up to ``MAX_DEFER`` seconds: a lost node's repair at a million
segments goes in five parts one after the other, and a full pass after each part stalled the next one's loads for
0.25-0.3 s (four times in a 10 s repair); one pass after the last part frees the same garbage.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import os
import time
import weakref
from collections.abc import Callable

from loguru import logger

# A trigger that touched at least this many segments releases memory once it finished (``release_soon``).
LARGE_TASK_SEGMENTS = 10_000
# Seconds between the request and the release: the finished task's runner must have let go of it.
RELEASE_DELAY = 0.5
# Longest a release waits for the work that holds it (``defer_while``): under a steady stream of triggers the memory
# must still come back.
MAX_DEFER = 30.0


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is not there to read it)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_malloc_trim = _find_malloc_trim()
releases = 0  # how many times release_freed_memory ran (tests and /debug readers)
# the loop, the timer, and when the first request it serves came (``MAX_DEFER`` counts from it)
_pending: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle, float] | None = None
# what holds a release back while it says it is busy (weak: a holder that is gone holds nothing)
_holders: list[weakref.WeakMethod[Callable[[], bool]]] = []


def malloc_trim_found() -> bool:
    """This C library has ``malloc_trim`` (glibc): ``release_freed_memory`` can give free heap pages back."""
    return _malloc_trim is not None


def release_freed_memory() -> bool:
    """Collect every generation, then return free heap pages to the OS; True when ``malloc_trim`` ran."""
    global releases
    releases += 1
    before, start = rss_bytes(), time.perf_counter()
    collected = gc.collect()
    if _malloc_trim is not None:
        _malloc_trim(0)
    logger.info("released freed memory: {} objects collected, RSS {:.0f} -> {:.0f} MiB in {:.0f} ms{}", collected,
                before / 2**20, rss_bytes() / 2**20, (time.perf_counter() - start) * 1000,
                "" if _malloc_trim is not None else " (no malloc_trim in this C library)")
    return _malloc_trim is not None


def trim() -> bool:
    """Return free heap pages to the OS without a GC pass (milliseconds: for after each large checker pass,
    whose garbage is freed by reference counting alone); True when ``malloc_trim`` ran."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def defer_while(busy: Callable[[], bool]) -> Callable[[], None]:
    """Hold every release (``release_soon``) while the bound method ``busy`` returns True, ``MAX_DEFER`` seconds at
    most; returns the function that stops holding. Kept weakly: an object that is gone holds nothing."""
    ref = weakref.WeakMethod(busy)
    _holders.append(ref)

    def stop() -> None:
        if ref in _holders:
            _holders.remove(ref)

    return stop


def _held() -> bool:
    _holders[:] = [ref for ref in _holders if ref() is not None]
    return any(busy() for ref in _holders if (busy := ref()) is not None)


def release_soon(delay: float = RELEASE_DELAY) -> None:
    """Run ``release_freed_memory`` once, ``delay`` seconds from now on the running loop, or once what holds it
    (``defer_while``) is done (one pending run at a time: a request while one is pending joins it)."""
    global _pending
    loop = asyncio.get_running_loop()
    if _pending is not None and _pending[0] is loop and not _pending[1].cancelled():
        return
    _pending = (loop, loop.call_later(delay, _run_pending), time.monotonic())


def _run_pending() -> None:
    global _pending
    if _pending is not None and _held() and time.monotonic() - _pending[2] < MAX_DEFER:
        loop, _, first = _pending
        _pending = (loop, loop.call_later(RELEASE_DELAY, _run_pending), first)
        return
    _pending = None
    try:
        release_freed_memory()
    except Exception as exc:  # never let a housekeeping step break the loop's callbacks
        logger.warning("releasing freed memory failed: {}", exc)


__all__ = ["LARGE_TASK_SEGMENTS", "defer_while", "release_freed_memory", "release_soon", "trim"]
