"""The command line of a tooling coordinator: always ``querycoord coord`` with its flags.

``drill_coordinator_argv`` gives the drills' scheduler knobs (short back-offs,
small merged requests so a load has many children to be killed in the middle
of, a bounded trigger deadline, no auto balance); ``stream_fast`` adds the
scaled-down stream management timings of the stream drill
(``coord --stream-fast``).
"""

from __future__ import annotations

from collections.abc import Sequence


def coord_argv(etcd_endpoints: str | Sequence[str], root: str, listen: str, ttl: float, *extra: str,
               log_level: str | None = None) -> list[str]:
    """``python <argv>`` runs ``querycoord coord`` with these options (``extra`` appended)."""
    endpoints = etcd_endpoints if isinstance(etcd_endpoints, str) else ",".join(etcd_endpoints)
    return ["-m", "querycoord.cli", *(["--log-level", log_level] if log_level else []), "coord",
            "--etcd-endpoints", endpoints, "--root", root, "--listen", listen, "--ttl", f"{ttl:g}", *extra]


def drill_coordinator_argv(etcd_endpoints: str | Sequence[str], root: str, listen: str, ttl: float, *,
                           max_request_bytes: int = 3000, rpc_timeout: float = 5.0, trigger_timeout: float = 120.0,
                           wait_interval: float | None = 0.2,
                           stream_fast: bool = False, stream_watch_timeout: float = 2.0,
                           extra: Sequence[str] = ()) -> list[str]:
    """A coordinator with the drills' scheduler knobs (see module docstring)."""
    knobs = ["--rpc-timeout", f"{rpc_timeout:g}", "--auto-balance-interval", "0",
             "--max-request-bytes", str(max_request_bytes), "--max-concurrent-children", "4",
             "--retry-backoff", "0.05", "--retry-backoff-max", "0.5", "--trigger-timeout", f"{trigger_timeout:g}"]
    if wait_interval is not None:  # None: the scheduler's default
        knobs += ["--wait-interval", f"{wait_interval:g}"]
    if stream_fast:
        knobs += ["--stream-fast", "--stream-watch-timeout", f"{stream_watch_timeout:g}"]
    return coord_argv(etcd_endpoints, root, listen, ttl, *knobs, *extra, log_level="INFO")


__all__ = ["coord_argv", "drill_coordinator_argv"]
