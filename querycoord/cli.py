"""The ``querycoord`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from querycoord.logs import setup_logging


def cmd_etcd(args: argparse.Namespace) -> int:
    """Run the embedded etcd in the foreground until Ctrl-C or SIGTERM."""
    from meta.etcd_server import EtcdCluster, EtcdNotFound, EtcdStartError

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="querycoord-etcd-"))
    try:
        cluster = EtcdCluster(data_dir, size=args.members).start()
    except (EtcdNotFound, EtcdStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"etcd running: --etcd-endpoints {','.join(cluster.endpoints)}  (data in {data_dir}; Ctrl-C stops)")
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            dead = [m.name for m in cluster.members if not m.running]
            if dead:
                print(f"error: etcd member(s) {dead} exited; see logs in {data_dir}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from querycoord import demo

    return demo.main()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="querycoord", description="etcd-backed query coordinator")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("etcd", help="run the embedded etcd in the foreground")
    p.add_argument("--data-dir", help="data directory (kept across runs; default: a new temp dir)")
    p.add_argument("--members", type=int, default=1, choices=(1, 3), help="1 member, or a 3-member cluster")
    p.set_defaults(func=cmd_etcd)

    p = sub.add_parser("demo", help="the demo that `make demo` runs")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
