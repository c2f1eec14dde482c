"""Child processes of the drill: coordinators and query nodes, their JSON events, their logs.

Every child is a real process (a SIGKILL is a real crash): it is started
through ``setpriv --pdeathsig KILL`` so the kernel kills it if the drill dies,
even by SIGKILL (the signal is tied to the forking thread; asyncio forks on
the event-loop thread, which lives as long as the drill), and in its own
session so a terminal's Ctrl-C reaches only the drill, which then stops the
children itself. stdout carries the JSON event lines the drill parses;
stderr goes to a log file per child, kept with the drill's work directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from meta.etcd_server import _pdeathsig_prefix

EventSink = Callable[["Child", dict[str, Any]], None]


class Child:
    """One child process and the events it printed (each stamped with ``recv``, our clock at reading)."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log_path: Path, sink: EventSink | None):
        self.name = name
        self.proc = proc
        self.log_path = log_path
        self.events: list[dict[str, Any]] = []
        self._sink = sink
        self._changed = asyncio.Condition()
        self._reader = asyncio.create_task(self._read(), name=f"read-{name}")
        self.killed_at: float | None = None

    @classmethod
    async def spawn(cls, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str],
                    sink: EventSink | None = None) -> Child:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:  # the child keeps its own copy of the descriptor
            proc = await asyncio.create_subprocess_exec(
                *_pdeathsig_prefix(), sys.executable, *argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log,
                env=env, start_new_session=True,
            )
        finally:
            os.close(log)
        return cls(name, proc, log_path, sink)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            event["recv"] = time.time()
            async with self._changed:
                self.events.append(event)
                self._changed.notify_all()
            if self._sink is not None:
                self._sink(self, event)
        async with self._changed:
            self._changed.notify_all()

    async def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        """The first event of ``kind`` (from the start); EOFError if the child exits without it."""

        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    for ev in self.events:
                        if ev.get("event") == kind:
                            return ev
                    if self._reader.done():
                        await self.proc.wait()
                        raise EOFError(f"{self.name} exited with code {self.proc.returncode} before {kind!r}; "
                                       f"see {self.log_path}")
                    await self._changed.wait()

        return await asyncio.wait_for(find(), timeout)

    def signal(self, sig: int) -> bool:
        """Send ``sig``; False if the process is already gone."""
        if not self.running:
            return False
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def kill_now(self) -> float:
        """SIGKILL (after SIGCONT, so a stopped process dies too) without waiting; returns the time it was sent."""
        self.signal(signal.SIGCONT)
        self.killed_at = time.time()
        self.signal(signal.SIGKILL)
        return self.killed_at

    async def stop(self, timeout: float = 5.0) -> int | None:
        """SIGCONT + SIGTERM, SIGKILL after ``timeout``; reap and drain stdout."""
        if self.running:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.signal(signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.proc.wait(), 10)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(self._reader, 5)
        return self.proc.returncode


def child_env(project_root: Path) -> dict[str, str]:
    """The drill's environment plus unbuffered output and the project on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(project_root), env.get("PYTHONPATH", "")) if p)
    return env


def log_tail(path: Path, lines: int = 10) -> str:
    try:
        text = path.read_text(errors="replace").rstrip().splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text) or "    (log is empty)"
