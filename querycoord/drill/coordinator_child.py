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
import sys

from meta.config import EtcdConfig
from querycoord.config import CoordConfig
from querycoord.logs import setup_logging
from querycoord.process import run_coordinator
from querycoord.task.model import SchedulerConfig


def build_config(args: argparse.Namespace) -> CoordConfig:
    scheduler = SchedulerConfig(retry_backoff=0.05, retry_backoff_max=0.5, wait_interval=0.2,
                                max_request_bytes=args.max_request_bytes, max_concurrent_children=4,
                                trigger_timeout=args.trigger_timeout)
    return CoordConfig(etcd=EtcdConfig.from_endpoints(args.etcd_endpoints), root=args.root, listen=args.listen,
                       session_ttl=args.ttl, rpc_timeout=args.rpc_timeout, auto_balance_interval=0,
                       scheduler=scheduler)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m querycoord.drill.coordinator_child")
    p.add_argument("--etcd-endpoints", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--rpc-timeout", type=float, default=5.0)
    p.add_argument("--max-request-bytes", type=int, default=3000)
    p.add_argument("--trigger-timeout", type=float, default=120.0)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return asyncio.run(run_coordinator(build_config(args)))
    except OSError as exc:  # e.g. the address is taken: the drill falls back to another port
        print(f"error: the coordinator could not start: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
