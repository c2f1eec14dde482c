"""Lag and progress of stream tasks and streams, from what the nodes last reported.

A stream node reports, with each task's status, ``processed_ms`` (the event
time up to which the task has processed its input; 0 while unknown) and
``source_ms`` (the newest event time its source held when the report was
built). The leader keeps the last pair per task in memory (``TaskRuntime``;
nothing per heartbeat is written to etcd) and derives here, when asked:

* a task's lag: ``source_ms - processed_ms`` of its last report (never
  negative), and nothing while ``processed_ms`` is unknown;
* a stream's progress: the slowest reporting task's ``processed_ms`` (the
  stream's output is complete up to there), and its lag: the largest lag of
  its tasks. Tasks that have not reported progress (pending, INIT, just
  redeployed) do not count; a stream with none (stopped, not running yet)
  has no progress (0) rather than a made-up one.

The lag is what the nodes say, not an estimate: a node that stops
heartbeating leaves its last figures in place until the task silence
declares the task lost (the stream is then stopped by an error, and its
failed gauge says so).

The checkpoint age is read from ``StreamStatusInfo.checkpoint_ms`` when the
message has the field (the checkpoint feature), and is None otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from proto import stream_pb2

if TYPE_CHECKING:  # only named: the console draws progress without importing the stream runtime
    from querycoord.stream.runtime import TaskRuntime


def task_lag_ms(t: TaskRuntime) -> int:
    """The task's lag as its last report gave it; 0 while its progress is unknown."""
    return max(0, t.source_ms - t.processed_ms) if t.processed_ms else 0


def stream_progress(tasks: Iterable[TaskRuntime]) -> tuple[int, int]:
    """``(processed_ms, lag_ms)`` of a stream: the slowest reporting task's processed time and the largest task
    lag; ``(0, 0)`` when no task has reported progress."""
    processed, lag = 0, 0
    for t in tasks:
        if not t.processed_ms:
            continue
        processed = t.processed_ms if not processed else min(processed, t.processed_ms)
        lag = max(lag, task_lag_ms(t))
    return processed, lag


def lag_seconds(info: stream_pb2.StreamStatusInfo) -> float | None:
    """The stream's lag in seconds, None while it has no progress (no task reported any)."""
    return info.lag_ms / 1000 if info.processed_ms else None


def checkpoint_ms(info: stream_pb2.StreamStatusInfo) -> int | None:
    """When the stream's last checkpoint was taken (unix ms), None when unknown or when this build's message has
    no checkpoint field."""
    return getattr(info, "checkpoint_ms", 0) or None


def checkpoint_age_seconds(info: stream_pb2.StreamStatusInfo, now: float) -> float | None:
    """Seconds since the stream's last checkpoint at unix time ``now``; None when unknown."""
    ms = checkpoint_ms(info)
    return None if ms is None else max(0.0, now - ms / 1000)
