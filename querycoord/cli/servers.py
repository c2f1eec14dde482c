"""The server commands: ``etcd`` (embedded etcd), ``coord`` (one coordinator), ``up`` (the all-in-one cluster),
``demo``. The reference nodes add their own (``querynode``, ``streamnode``)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class TermFlag:
    """Set by SIGTERM; ``wait`` sleeps until it is set or the timeout passes.

    Why not a ``threading.Event`` set by the handler: a handler runs in the main thread between two bytecodes,
    and when that is inside ``Event.wait`` holding the event's lock, ``Event.set`` waits for that lock for ever
    (``querycoord etcd`` once hung so on SIGTERM). The handler only assigns a flag; the waiter sleeps in short
    steps and looks at it.
    """

    STEP = 0.05

    def __init__(self) -> None:
        self.signalled = False

    @classmethod
    def install(cls) -> TermFlag:
        flag = cls()
        signal.signal(signal.SIGTERM, flag.on_signal)
        return flag

    def on_signal(self, *_: object) -> None:
        self.signalled = True

    def wait(self, timeout: float) -> bool:
        """Whether SIGTERM came, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.signalled:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.STEP, left))
        return True


def cmd_etcd(args: argparse.Namespace) -> int:
    """Run the embedded etcd in the foreground until Ctrl-C or SIGTERM.

    Without ``--data-dir`` its data lives in a new temporary directory, removed
    when it is stopped (Ctrl-C, SIGTERM): nothing is left behind in /tmp. It
    is kept, and named, only when etcd failed (a member that would not start
    or died), for its logs. With ``--data-dir`` the data is kept for the next
    run.
    """
    from querycoord.cli.etcd_admin import cluster_options

    if args.data_dir and _data_dir_problem(args.data_dir):
        return 2
    try:
        options = cluster_options(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.data_dir:
        return _run_etcd(Path(args.data_dir), args.members, options, temporary=False)
    stop = TermFlag.install()  # before the directory exists: a SIGTERM from now on still reaches its removal
    data_dir = Path(tempfile.mkdtemp(prefix="querycoord-etcd-"))
    code = 1
    try:
        code = _run_etcd(data_dir, args.members, options, temporary=True, stop=stop)
        return code
    except KeyboardInterrupt:  # Ctrl-C before etcd's own handling began
        code = 130
        return code
    finally:
        if code == 1:
            print(f"etcd's logs are kept in {data_dir}", file=sys.stderr)
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def _run_etcd(data_dir: Path, members: int, options: dict[str, Any], *, temporary: bool,
              stop: TermFlag | None = None) -> int:
    """Start the members in ``data_dir``, say where they listen, wait for Ctrl-C or SIGTERM, stop them."""
    from meta.ops.etcd_server import EtcdCluster, EtcdNotFound, EtcdStartError

    stop = stop or TermFlag.install()
    try:
        cluster = EtcdCluster(data_dir, size=members, **options)
    except (EtcdNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            cluster.start()
        except EtcdStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        where = "a temporary dir, removed when etcd stops" if temporary else "kept"
        print(f"etcd running: --etcd-endpoints {','.join(cluster.endpoints)}  (data in {data_dir}; {where}; "
              "Ctrl-C stops)")
        sys.stdout.flush()
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


def cmd_coord(args: argparse.Namespace) -> int:
    """Run one coordinator until SIGTERM/SIGINT (it campaigns; with others running it may stand by)."""
    from meta.errors import MetaError
    from querycoord.serving.process import run_coordinator
    from querycoord.settings.coord_options import config_from_args
    from querycoord.settings.security_options import configure_from_args
    from querycoord.tooling.allinone import listen_problem

    try:
        config = config_from_args(args)
        configure_from_args(args)  # this process's gRPC security: TLS, its token, the principals it accepts
        problem = listen_problem(config.listen)
        if problem:
            raise ValueError(problem)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_coordinator(config))
    except (MetaError, OSError, RuntimeError) as exc:  # grpc raises RuntimeError when it cannot bind
        print(f"error: the coordinator could not start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _data_dir_problem(data_dir: str) -> bool:
    """Whether ``--data-dir`` is unusable (a file, not writable); if so the user has been told."""
    from querycoord.tooling.allinone import data_dir_problem

    problem = data_dir_problem(data_dir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
    return problem is not None


def cmd_demo(args: argparse.Namespace) -> int:
    from querycoord.tooling import demo

    return demo.run_from_args(args)


def add_parsers(sub: Any) -> None:
    from querycoord.cli import etcd_admin
    from querycoord.cli.up_cmd import add_up_parser
    from querycoord.nodes.querynode import add_querynode_parser
    from querycoord.nodes.streamnode import add_streamnode_parser
    from querycoord.settings.coord_options import add_coord_options
    from querycoord.tooling.demo import add_demo_arguments
    from querycoord.tooling.drill import add_drill_parser

    p = sub.add_parser("etcd", help="run the embedded etcd in the foreground")
    p.add_argument("--data-dir", help="data directory (kept across runs; default: a new temp dir)")
    p.add_argument("--members", type=int, default=1, choices=(1, 3), help="1 member, or a 3-member cluster")
    p.set_defaults(func=cmd_etcd)
    etcd_admin.add_run_options(p)
    etcd_admin.add_subcommands(p)  # `etcd status`, `etcd maintain`

    p = sub.add_parser("coord", help="run one coordinator (campaigns; leads or stands by)")
    add_coord_options(p)
    p.set_defaults(func=cmd_coord)

    add_querynode_parser(sub)
    add_streamnode_parser(sub)
    add_drill_parser(sub)

    add_up_parser(sub)

    p = sub.add_parser("demo", help="the demo that `make demo` runs")
    add_demo_arguments(p)
    p.set_defaults(func=cmd_demo)
