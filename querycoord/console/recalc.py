"""Stream recalculation on the client side: the time argument, the call, waiting for it, and its drawing.

Used by ``querycoord stream recalc`` and by ``stream show`` (its recalculation lines and JSON).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

from proto import stream_pb2 as sp
from querycoord.console.actions import Refusal, show_streams, stream_call, stream_ref
from querycoord.net.client import QueryCoordClient

RECALC_STATE_NAMES = {sp.RECALC_PENDING: "pending", sp.RECALC_RUNNING: "running", sp.RECALC_DONE: "done",
                      sp.RECALC_FAILED: "failed", sp.RECALC_CANCELLED: "cancelled"}


def parse_time_ms(text: str) -> int:
    """A time as unix milliseconds (digits) or ISO 8601 (a time without a zone is UTC); ValueError naming it."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"bad time {text!r}: give unix milliseconds or an ISO 8601 time "
                         f"(e.g. 2024-05-01T00:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"bad time {text!r}: before 1970")
    return ms


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


async def recalculate_stream(c: QueryCoordClient, ref: str, from_ms: int, to_ms: int) -> sp.RecalcInfo:
    """RecalculateStream: the accepted (persisted, PENDING) recalculation."""
    req = sp.RecalculateStreamRequest(stream=stream_ref(ref), from_ms=from_ms, to_ms=to_ms)
    return (await stream_call(c, "RecalculateStream", req, f"recalculate stream {ref}")).recalc


async def wait_recalc(c: QueryCoordClient, ref: str, recalc_id: int, timeout: float,
                      interval: float = 0.5) -> sp.RecalcInfo:
    """Poll ShowStreams until the recalculation is finished; a Refusal when it is gone or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last: sp.RecalcInfo | None = None
    while True:
        show = await show_streams(c, [ref], with_tasks=False)
        found = [r for info in show.streams for r in info.recalcs if r.recalc_id == recalc_id]
        if found:
            last = found[0]
            if last.state in (sp.RECALC_DONE, sp.RECALC_FAILED, sp.RECALC_CANCELLED):
                return last
        elif not show.status.reason:  # the leader answered and no longer has it
            raise Refusal(f"recalculation {recalc_id} of stream {ref} is no longer listed (stream dropped?)")
        if time.monotonic() > deadline:
            progress = f"{last.tasks_done}/{last.tasks_total} runners" if last is not None else "not listed"
            raise Refusal(f"recalculation {recalc_id} of stream {ref} not finished within {timeout:g}s "
                          f"({progress}); it goes on, follow it with `querycoord stream show {ref}`")
        await asyncio.sleep(interval)


def recalc_line(r: sp.RecalcInfo) -> str:
    """One recalculation as ``stream show`` and ``stream recalc`` print it."""
    state = RECALC_STATE_NAMES.get(r.state, str(r.state))
    line = (f"recalc #{r.recalc_id} {iso(r.from_ms)} .. {iso(r.to_ms)}: {state} "
            f"{r.tasks_done}/{r.tasks_total} runners")
    if r.error:
        line += f" ({r.error})"
    return line


def recalc_lines(info: sp.StreamStatusInfo, indent: str = "  ") -> list[str]:
    return [f"{indent}{recalc_line(r)}" for r in info.recalcs]


def recalc_record(r: sp.RecalcInfo) -> dict[str, object]:
    return {"recalc_id": r.recalc_id, "from_ms": r.from_ms, "to_ms": r.to_ms,
            "state": RECALC_STATE_NAMES.get(r.state, str(r.state)), "tasks_done": r.tasks_done,
            "tasks_total": r.tasks_total, "created_ms": r.created_ms, "finished_ms": r.finished_ms, "error": r.error}
