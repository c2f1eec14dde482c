"""One way to start a child process: ``ChildProcess``, ``pdeathsig_prefix``, ``child_env``, ``log_tail``.

Every helper process of the tooling (etcd members aside, which ``etcd_server``
starts from its own thread) is a ``ChildProcess``: a real process (a SIGKILL
is a real crash), started as ``python <argv>``:

* through ``setpriv --pdeathsig KILL`` (``pdeathsig_prefix``), so the kernel
  SIGKILLs it when we die, even by SIGKILL. The signal is tied to the thread
  that forked; ``asyncio`` forks on the event-loop thread, which lives as
  long as we run;
* by default in its own session, so a terminal's Ctrl-C reaches only us and
  we stop the children in order ourselves;
* stdout carries JSON event lines (``{"event": kind, ...}``), read as they
  come into ``events`` (each stamped ``recv``, our clock at reading), handed
  to an optional ``sink`` callback, and waited for without blocking the event
  loop (``next_event``: the next one of some kinds; ``wait_event``: the first
  one of a kind from the start);
* stderr goes to ``log_path`` (appended) when one is given, else it is ours;
* with ``stdin=True`` stdin is a pipe for control lines (``command``: one
  line, answered by an ``ack`` event); else it is /dev/null.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from loguru import logger

PROJECT_ROOT = Path(__file__).resolve().parents[2]

C = TypeVar("C", bound="ChildProcess")

# asyncio's default line limit is 64 KiB: one large answer (a stream node's ``tasks`` with a few hundred tasks) would
# end the reader, and every waiter would then sleep until its timeout. Event lines are small but not bounded by us.
EVENT_LINE_LIMIT = 64 * 1024 * 1024
EventSink = Callable[["ChildProcess", dict[str, Any]], None]


def pdeathsig_prefix() -> list[str]:
    """``setpriv --pdeathsig KILL --`` where available, so the child dies with us (empty where unsupported)."""
    setpriv = shutil.which("setpriv")
    if setpriv and sys.platform.startswith("linux"):
        return [setpriv, "--pdeathsig", "KILL", "--"]
    logger.warning("setpriv not found: child processes may outlive this one if it is SIGKILLed")
    return []


def child_env(base: Mapping[str, str] | None = None, project_root: Path = PROJECT_ROOT) -> dict[str, str]:
    """``base`` (default: our environment) plus unbuffered output and the project on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(project_root), env.get("PYTHONPATH", "")) if p)
    return env


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a child's log, indented, for an error message."""
    if path is None:
        return "    (no log)"
    try:
        text = Path(path).read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text) or "    (log is empty)"


class ChildProcess:
    """One child process, the JSON events it printed, its log file (see module docstring)."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log_path: Path | None = None,
                 sink: EventSink | None = None):
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self.killed_at: float | None = None
        self._sink = sink
        self._cursor = 0
        self._changed = asyncio.Condition()
        self._stdin_lock = asyncio.Lock()
        self._reader = asyncio.create_task(self._read(), name=f"read-{name}")

    @classmethod
    async def spawn(cls: type[C], name: str, argv: Sequence[str], *, log_path: Path | None = None,
                    env: Mapping[str, str] | None = None, sink: EventSink | None = None, stdin: bool = False,
                    new_session: bool = True, pdeathsig: bool = True, line_limit: int = EVENT_LINE_LIMIT) -> C:
        """Start ``python <argv>`` (e.g. ``["-m", "querycoord.cli", "coord", ...]``); see the module docstring."""
        log = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:  # the child keeps its own copy of the descriptor
            proc = await asyncio.create_subprocess_exec(
                *(pdeathsig_prefix() if pdeathsig else []), sys.executable, *argv,
                stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=log, limit=line_limit,
                env=dict(env) if env is not None else None, start_new_session=new_session,
            )
        finally:
            if log is not None:
                os.close(log)
        return cls(name, proc, log_path, sink)

    # ----- state ----------------------------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines)

    def _gone(self, what: str) -> EOFError:
        where = f"; see {self.log_path}" if self.log_path is not None else ""
        return EOFError(f"{self.name} exited with code {self.proc.returncode} before {what}{where}")

    # ----- events ---------------------------------------------------------------------------------------------------
    async def _read(self) -> None:
        """Read event lines until EOF; a line over the spawn's ``line_limit`` is dropped with a warning, never fatal.

        A reader that stopped early would leave the child blocked on a full pipe and every waiter asleep until its
        timeout, with nothing saying why.
        """
        stdout = self.proc.stdout
        assert stdout is not None
        try:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError as exc:  # over the limit: asyncio dropped the buffered part; resync on the next line
                    logger.warning("{}: an output line was dropped: {}", self.name, exc)
                    continue
                if not line:
                    return
                await self._take(line)
        finally:
            async with self._changed:
                self._changed.notify_all()

    async def _take(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        event["recv"] = time.time()
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()
        if self._sink is not None:
            self._sink(self, event)

    async def next_event(self, *kinds: str, timeout: float = 30.0) -> dict[str, Any]:
        """The next event (after the last one returned) of one of ``kinds``; EOFError if the child exits first."""

        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    while self._cursor < len(self.events):
                        event = self.events[self._cursor]
                        self._cursor += 1
                        if event.get("event") in kinds:
                            return event
                    if self._reader.done():
                        await self.proc.wait()
                        raise self._gone("/".join(kinds))
                    await self._changed.wait()

        return await asyncio.wait_for(find(), timeout)

    async def wait_event(self, kind: str, timeout: float = 30.0, since: int = 0) -> dict[str, Any]:
        """The first event of ``kind`` from ``events[since]`` on; EOFError if the child exits without it."""

        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    for ev in self.events[since:]:
                        if ev.get("event") == kind:
                            return ev
                    if self._reader.done():
                        await self.proc.wait()
                        raise self._gone(repr(kind))
                    await self._changed.wait()

        return await asyncio.wait_for(find(), timeout)

    async def command(self, line: str, timeout: float = 10.0) -> dict[str, Any]:
        """Send one control line on stdin (``spawn(stdin=True)``); its ``ack`` event."""
        async with self._stdin_lock:
            assert self.proc.stdin is not None, f"{self.name} was started without a stdin pipe"
            seen = len(self.events)
            self.proc.stdin.write(line.encode() + b"\n")
            await self.proc.stdin.drain()
            return await self.wait_event("ack", timeout, since=seen)

    # ----- signals and the end ----------------------------------------------------------------------------------------
    def signal(self, sig: int) -> bool:
        """Send ``sig``; False if the process is already gone."""
        if not self.running:
            return False
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def send_signal(self, sig: int) -> None:
        self.signal(sig)

    def kill_now(self) -> float:
        """SIGKILL (after SIGCONT, so a stopped process dies too) without waiting; returns the time it was sent."""
        self.signal(signal.SIGCONT)
        self.killed_at = time.time()
        self.signal(signal.SIGKILL)
        return self.killed_at

    async def kill(self) -> int:
        """SIGKILL (after SIGCONT), reap, drain stdout; the exit code."""
        self.kill_now()
        code = await self.proc.wait()
        await self._drain()
        return code

    async def wait(self, timeout: float = 30.0) -> int:
        """Until it exits by itself (TimeoutError after ``timeout``); the exit code, stdout drained."""
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        await self._drain()
        return code

    async def stop(self, timeout: float = 5.0) -> int:
        """SIGCONT + SIGTERM, SIGKILL if still running after ``timeout``; reap, drain stdout; the exit code."""
        if self.running:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                logger.warning("{} (pid {}) ignored SIGTERM for {:.0f}s; sending SIGKILL", self.name, self.pid, timeout)
                self.signal(signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 10)
        await self._drain()
        return self.proc.returncode if self.proc.returncode is not None else -9

    async def _drain(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(self._reader), 5.0)


__all__ = ["PROJECT_ROOT", "ChildProcess", "EventSink", "child_env", "log_tail", "pdeathsig_prefix"]
