"""meta.ops.child: the one way tooling starts a child process (events, stdin commands, log, signals, environment)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from meta.ops.child import PROJECT_ROOT, ChildProcess, child_env, log_tail

ECHO = r"""
import json, sys
print("not json", flush=True)
print(json.dumps({"event": "ready", "n": 1}), flush=True)
print(json.dumps([1, 2]), flush=True)
print("to the log", file=sys.stderr, flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "exit":
        break
    print(json.dumps({"event": "ack", "ok": True, "cmd": cmd}), flush=True)
print(json.dumps({"event": "bye"}), flush=True)
"""

SLEEPER = r"""
import json, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN) if sys.argv[1] == "stubborn" else None
print(json.dumps({"event": "ready"}), flush=True)
time.sleep(60)
"""


async def test_events_commands_log_and_exit(tmp_path: Path) -> None:
    seen: list[str] = []
    log = tmp_path / "logs" / "echo.log"
    child = await ChildProcess.spawn("echo", ["-c", ECHO], log_path=log, env=child_env(), stdin=True,
                                     sink=lambda ch, ev: seen.append(ev["event"]))
    ready = await child.next_event("ready", timeout=30)
    assert ready["n"] == 1 and "recv" in ready
    assert (await child.wait_event("ready", timeout=5)) is ready  # from the start, again
    ack = await child.command("hello")
    assert ack["cmd"] == "hello"
    assert (await child.command("again"))["cmd"] == "again"  # the ack after the line, not the first one
    child.proc.stdin.write(b"exit\n")  # type: ignore[union-attr]
    assert (await child.next_event("bye", timeout=10))["event"] == "bye"
    assert await child.wait(timeout=10) == 0
    assert seen == ["ready", "ack", "ack", "bye"]  # only JSON objects are events
    assert "to the log" in log_tail(log) and "to the log" in child.log_tail()
    with pytest.raises(EOFError, match="exited with code 0 before 'missing'"):
        await child.wait_event("missing", timeout=5)


async def test_stop_escalates_to_sigkill_and_kill_continues_a_stopped_child(tmp_path: Path) -> None:
    stubborn = await ChildProcess.spawn("stubborn", ["-c", SLEEPER, "stubborn"], log_path=tmp_path / "s.log")
    await stubborn.next_event("ready", timeout=30)
    assert await stubborn.stop(timeout=0.5) == -signal.SIGKILL
    assert not stubborn.running and not stubborn.signal(signal.SIGTERM)

    paused = await ChildProcess.spawn("paused", ["-c", SLEEPER, "polite"], new_session=False, pdeathsig=False)
    await paused.next_event("ready", timeout=30)
    paused.send_signal(signal.SIGSTOP)
    assert await asyncio.wait_for(paused.kill(), 10) == -signal.SIGKILL
    assert paused.killed_at is not None


def test_child_env_and_log_tail(tmp_path: Path) -> None:
    env = child_env({"PYTHONPATH": "/elsewhere", "X": "1"})
    assert env["PYTHONUNBUFFERED"] == "1" and env["X"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PROJECT_ROOT), "/elsewhere"]
    assert log_tail(tmp_path / "nope.log") == "    (no log)"
    (tmp_path / "empty.log").write_text("")
    assert log_tail(tmp_path / "empty.log") == "    (log is empty)"
    (tmp_path / "a.log").write_text("".join(f"line {i}\n" for i in range(30)))
    assert log_tail(tmp_path / "a.log", 2) == "    line 28\n    line 29"


BIG = r"""
import json, sys
size = int(sys.argv[1])
print(json.dumps({"event": "big", "blob": "x" * size}), flush=True)
print(json.dumps({"event": "after"}), flush=True)
"""


async def test_a_large_event_line_is_read(tmp_path: Path) -> None:
    """asyncio's default 64 KiB line limit ended the reader on a stream node's large ``tasks`` answer: the waiter then
    slept until its timeout (the CI failure of test_stream_failover's 50-stream takeover)."""
    child = await ChildProcess.spawn("big", ["-c", BIG, str(200_000)], log_path=tmp_path / "big.log")
    assert len((await child.next_event("big", timeout=30))["blob"]) == 200_000
    assert (await child.next_event("after", timeout=10))["event"] == "after"
    assert await child.wait(timeout=10) == 0


async def test_a_line_over_the_limit_is_dropped_and_reading_goes_on(tmp_path: Path) -> None:
    child = await ChildProcess.spawn("big", ["-c", BIG, str(4096)], log_path=tmp_path / "big.log", line_limit=1024)
    assert (await child.next_event("big", "after", timeout=30))["event"] == "after"
    assert [ev["event"] for ev in child.events] == ["after"]
    assert await child.wait(timeout=10) == 0
