"""Probes of ``bench_scale_ops.py``: what the in-process nodes hold, a process's CPU, a command's wall and RSS.

Imported by the scripts as a sibling module (see ``benchlib``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchlib import BenchError

from meta.ops.child import child_env
from querycoord.nodes.querynode import QueryNode

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (every thread), seconds, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of proc(5), after pid and comm


def machine_cpu_s() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, every core (/proc/stat's first line): over a
    window, busy / all says how close the machine was to saturated, whoever used it (etcd included)."""
    ticks = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks[:8]) - idle) / _TICK, sum(ticks[:8]) / _TICK  # guest time is already counted in user


def byte_compile_project() -> None:
    """Byte-compile the project's packages (``meta``, ``proto``, ``querycoord``) where they are imported from, so a
    command process loads their ``.pyc`` as it does from a pip-installed package (pip compiles at install). A
    source tree installed editable has none, and with ``PYTHONDONTWRITEBYTECODE`` set (as here) none is ever
    written: every process would compile its modules anew, a cost no installed ``querycoord`` pays."""
    import meta
    import proto
    import querycoord

    dirs = [str(Path(m.__file__).parent) for m in (meta, proto, querycoord) if m.__file__]
    env = {k: v for k, v in child_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], env=env, capture_output=True,
                          check=False)
    if done.returncode != 0:
        raise BenchError(f"compileall of {', '.join(dirs)} exited {done.returncode}: "
                         f"{(done.stdout + done.stderr).decode(errors='replace')[-2000:]}")


def timed_process(argv: Sequence[str], timeout: float = 3600) -> tuple[float, int, int, str]:
    """Run ``argv`` to its end: (wall seconds, peak RSS KiB, exit code, stdout). The peak is the child's own
    high-water mark (``VmHWM``), read while it runs: not ``ru_maxrss``, which Linux raises at ``exec`` to the
    high-water mark of the memory it replaces, here this process's own (subprocess forks with vfork), so a bench
    holding its nodes would report its own size for every command."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, env=child_env())
        deadline = time.monotonic() + timeout
        peak = 0
        while True:
            peak = max(peak, _high_water_kib(proc.pid))
            pid, status, _usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise BenchError(f"{' '.join(argv[:5])} ... did not end within {timeout:.0f}s")
            time.sleep(0.005)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode not in (0, 1):
            tail = err.read().decode(errors="replace")[-2000:]
            raise BenchError(f"{' '.join(argv[2:5])} ... exited {proc.returncode}: {tail}")
        return wall, peak, proc.returncode, out.read().decode(errors="replace")


def _high_water_kib(pid: int) -> int:
    """``VmHWM`` of /proc/<pid>/status, KiB; 0 once the process is gone (a zombie has no memory fields)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class Whole:
    """Whether the nodes still counted hold every segment and DM channel of one collection, read from the node
    objects themselves (one replica: every copy counts once)."""

    def __init__(self, nodes: Sequence[QueryNode], collection_id: int, segments: int, channels: int):
        self.up = list(nodes)
        self.collection_id, self.segments, self.channels = collection_id, segments, channels

    async def crash(self, node: QueryNode) -> None:
        """The node dies: its server stops at once and its session lease is revoked (what the coordinator sees
        of a SIGKILLed node once its TTL lapsed); its copies count no more."""
        self.up.remove(node)
        await node.crash(revoke=True)

    def leave(self, node: QueryNode) -> None:
        """The node's copies count no more (it is being drained)."""
        self.up.remove(node)

    def counted_enough(self) -> bool:
        """The nodes still counted hold at least as many segments as the collection has: ``holds_all``'s cheap
        first check (a few ``len``), polled often."""
        return sum(len(n.state.segments) for n in self.up) >= self.segments

    def holds_all(self) -> bool:
        cid = self.collection_id
        if not self.counted_enough():
            return False
        held: set[int] = set()
        for n in self.up:
            held.update(sid for sid, seg in n.state.segments.items() if seg.collection_id == cid)
        if len(held) < self.segments:
            return False
        watched = {name for n in self.up for name, w in n.state.dm_channels.items() if w.collection_id == cid}
        return len(watched) >= self.channels

    async def wait(self, t0: float, timeout: float) -> float:
        """Until ``holds_all``; seconds since ``t0`` (``time.perf_counter``) then. Polled every 10 ms while the
        count falls short (a few ``len``: the end is read that closely), the whole check (a set of every id
        held) more sparingly."""
        while not self.holds_all():
            if time.perf_counter() - t0 > timeout:
                raise BenchError(f"the nodes did not hold the whole collection within {timeout:.0f}s")
            await asyncio.sleep(0.01 if not self.counted_enough() else 0.1 if self.segments < 200_000 else 0.25)
        return time.perf_counter() - t0
