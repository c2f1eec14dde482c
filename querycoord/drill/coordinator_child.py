"""``python -m querycoord.drill.coordinator_child``: one coordinator process with the drill's scheduler knobs.

The drill could start ``querycoord coord``; it runs this instead so that its
knobs (short back-offs, small merged requests so a load has many children
to be killed in the middle of, a bounded trigger deadline) do not depend on
which hidden options the CLI exposes. The process body is the production
one (``run_coordinator``): same gRPC server, leadership life cycle and
``{"event": ...}`` lines on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from meta.config import EtcdConfig
from querycoord.config import CoordConfig
from querycoord.logs import setup_logging
from querycoord.process import run_coordinator
from querycoord.stream.manager import StreamConfig
from querycoord.task.model import SchedulerConfig


def build_config(args: argparse.Namespace) -> CoordConfig:
    scheduler = SchedulerConfig(retry_backoff=0.05, retry_backoff_max=0.5, wait_interval=0.2,
                                max_request_bytes=args.max_request_bytes, max_concurrent_children=4,
                                trigger_timeout=args.trigger_timeout)
    extra: dict[str, object] = {}
    if getattr(args, "stream_fast", False):
        # Stream management scaled down (``drill streams``): WATCH, silences, back-offs and isolation in seconds.
        extra = dict(stream=fast_stream_config(args.stream_watch_timeout), stream_tick=0.1, stream_refresh=5.0)
    return CoordConfig(etcd=EtcdConfig.from_endpoints(args.etcd_endpoints), root=args.root, listen=args.listen,
                       session_ttl=args.ttl, rpc_timeout=args.rpc_timeout, auto_balance_interval=0,
                       scheduler=scheduler, **extra)  # type: ignore[arg-type]


def fast_stream_config(watch_timeout: float = 2.0) -> StreamConfig:
    """The stream manager's durations scaled down for drills (TDengine's defaults are tens of seconds)."""
    return StreamConfig(watch_timeout=watch_timeout, task_silence=5.0, min_start_delay=0.2, error_retry_delay=0.5,
                        max_retry_delay=2.0, reset_after=5.0, health_interval=0.3, health_slots=2, isolation=3.0,
                        vgroup_lost_stop=30.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m querycoord.drill.coordinator_child")
    p.add_argument("--etcd-endpoints", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--rpc-timeout", type=float, default=5.0)
    p.add_argument("--max-request-bytes", type=int, default=3000)
    p.add_argument("--trigger-timeout", type=float, default=120.0)
    p.add_argument("--stream-fast", action="store_true", help="scaled-down stream management timings")
    p.add_argument("--stream-watch-timeout", type=float, default=2.0, help="WATCH bound with --stream-fast")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    # querycoord.stream.manager logs through the standard library, which setup_logging (loguru) leaves
    # unconfigured: without a handler its INFO lines (WATCH ended, node lost, ...) would be dropped.
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s %(message)s", datefmt="%H:%M:%S")
    try:
        return asyncio.run(run_coordinator(build_config(args)))
    except OSError as exc:  # e.g. the address is taken: the drill falls back to another port
        print(f"error: the coordinator could not start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
