"""Lag and progress of streams as ``stream show``, the status page and ``make demo`` draw them.

The figures are the leader's (ShowStreams: ``querycoord.stream.progress`` says
how they are derived from the nodes' reports); here they only become text and
JSON fields. A stream or task with no reported progress shows ``-``, never 0.
"""

from __future__ import annotations

import time

from proto import stream_pb2 as sp
from querycoord.stream.progress import checkpoint_age_seconds, checkpoint_ms, lag_seconds


def clock_time(ms: int) -> str:
    """``21:42:17.1``: a unix-ms event time as local wall-clock time to the tenth; ``-`` when unknown."""
    if not ms:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000 // 100}"


def seconds(value: float | None) -> str:
    """``0.6s``, ``12.3s``, ``-`` for unknown."""
    return "-" if value is None else f"{value:.1f}s"


def progress_line(info: sp.StreamStatusInfo, now: float, *, checkpoint: bool = True) -> str:
    """``processed up to 21:42:17.1, lag 0.6s`` (and ``; checkpoint 3.2s old`` when ``checkpoint`` and the stream
    has one: ``stream show`` draws the checkpoint on a line of its own), or why there is none."""
    lag = lag_seconds(info)
    text = (f"processed up to {clock_time(info.processed_ms)}, lag {seconds(lag)}" if lag is not None
            else "no task has reported progress")
    age = checkpoint_age_seconds(info, now) if checkpoint else None
    return text + (f"; checkpoint {seconds(age)} old" if age is not None else "")


def task_progress_cells(row: sp.TaskRow) -> list[object]:
    """The PROCESSED and LAG cells of a task row."""
    if not row.processed_ms:
        return ["-", "-"]
    return [clock_time(row.processed_ms), seconds(row.lag_ms / 1000)]


def stream_progress_cells(info: sp.StreamStatusInfo) -> list[object]:
    """The PROCESSED and LAG cells of a stream row."""
    return [clock_time(info.processed_ms), seconds(lag_seconds(info))]


def progress_record(info: sp.StreamStatusInfo, now: float) -> dict[str, object]:
    """A stream's progress as JSON fields (``-o json``, ``status.json``): times in unix ms, durations in seconds,
    None when unknown."""
    age = checkpoint_age_seconds(info, now)
    return {"processed_ms": info.processed_ms, "lag_s": lag_seconds(info), "checkpoint_ms": checkpoint_ms(info),
            "checkpoint_age_s": None if age is None else round(age, 3)}


def task_progress_record(row: sp.TaskRow) -> dict[str, object]:
    return {"processed_ms": row.processed_ms, "lag_s": row.lag_ms / 1000 if row.processed_ms else None}
