"""Per-stream gauges at scrape time: lag, processed time, whether a stream is stopped by an error, and its
consensus checkpoint with its age.

Read from the leader's stream runtime (``querycoord.stream.progress`` says how
lag and progress come from the nodes' reports), so nothing is kept in step.
The label is ``stream``, whose value is the stream's id (never its name:
names are what users typed, ids are what the metrics of collections use
too). A stream with no reported progress (stopped, not running yet) has no
lag or processed series, only its ``failed`` one, so a missing series never
reads as "no lag".

Label cardinality is bounded by ``--max-stream-metrics`` (default 10,000
streams; a few gauges each is well within what Prometheus takes): beyond it
the streams stopped by an error come first, then the most lagging, and
``querycoord_stream_metrics_omitted`` counts the streams left out.
"""

from __future__ import annotations

import time

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from querycoord.common.metrics import gauge as _gauge
from querycoord.stream.manager import StreamManager
from querycoord.stream.progress import stream_progress


def stream_progress_families(streams: StreamManager, limit: int) -> list[Metric]:
    """``querycoord_stream_lag_seconds``, ``_processed_timestamp_seconds``, ``querycoord_stream_failed``,
    ``_checkpoint_id`` and ``_checkpoint_age_seconds`` per stream, at most ``limit`` streams (see module docstring)."""
    lag = GaugeMetricFamily("querycoord_stream_lag_seconds", "How far the stream's slowest task is behind its "
                            "source: the largest source_ms - processed_ms its tasks last reported, in seconds",
                            labels=["stream"])
    processed = GaugeMetricFamily("querycoord_stream_processed_timestamp_seconds", "Event time (unix seconds) up "
                                  "to which every reporting task of the stream has processed its input",
                                  labels=["stream"])
    checkpoint_id = GaugeMetricFamily("querycoord_stream_checkpoint_id", "The stream's committed consensus "
                                      "checkpoint (every task held it; 0: none yet)", labels=["stream"])
    checkpoint_age = GaugeMetricFamily("querycoord_stream_checkpoint_age_seconds", "Seconds since the stream's "
                                       "consensus checkpoint was committed (streams with one)", labels=["stream"])
    failed = GaugeMetricFamily("querycoord_stream_failed", "1 while the stream is stopped by an error (a task "
                               "failed or was lost; it is retried after a back-off), else 0", labels=["stream"])
    rows: list[tuple[int, int, int, int]] = []  # (failed, lag_ms, processed_ms, stream id)
    for stream_id, rt in streams.streams.items():
        done, lag_ms = stream_progress(rt.tasks.values())
        rows.append((1 if rt.error_stopped else 0, lag_ms, done, stream_id))
    kept = rows
    if len(rows) > limit:
        kept = sorted(rows, key=lambda r: (-r[0], -r[1], r[3]))[:limit]
    wall = time.time()
    for is_failed, lag_ms, done, stream_id in sorted(kept, key=lambda r: r[3]):
        label = [str(stream_id)]
        failed.add_metric(label, is_failed)
        rt = streams.streams[stream_id]
        checkpoint_id.add_metric(label, rt.checkpoint_id)
        if rt.checkpoint_ms:
            checkpoint_age.add_metric(label, max(0.0, wall - rt.checkpoint_ms / 1000))
        if done:
            lag.add_metric(label, lag_ms / 1000)
            processed.add_metric(label, done / 1000)
    omitted = _gauge("querycoord_stream_metrics_omitted", "Streams left out of the per-stream gauges by "
                     "--max-stream-metrics (0: every stream has its series)", len(rows) - len(kept))
    return [lag, processed, failed, checkpoint_id, checkpoint_age, omitted]


__all__ = ["stream_progress_families"]
