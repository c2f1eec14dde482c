"""Drills: real processes, real faults, invariants checked at the end (``querycoord drill ...``).

``add_drill_parser(subparsers)`` registers ``drill`` (with its ``failover``,
``streams``, ``chaos``, ``restart`` and ``rolling`` sub-commands) on the ``querycoord`` CLI; ``main(argv)`` is the
same command line without the CLI: ``python -m querycoord.tooling.drill failover ...``. Each sub-command's options
are the fields of its options dataclass (``options``); the drill modules are imported lazily so that
``querycoord --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import io
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from querycoord.tooling.drill.options import (
    ChaosOptions,
    DrillOptions,
    RestartOptions,
    RollingOptions,
    RunOptions,
    StreamDrillOptions,
    cli_help,
    cli_options,
)


@dataclass(frozen=True)
class Drill:
    """One sub-command of ``drill``: its options and its --help; it runs ``run_<name>`` of module ``<name>``."""

    options: type[RunOptions]
    help: str
    description: str
    verbose_help: str = "print every call and role change"


DRILLS: dict[str, Drill] = {
    "failover": Drill(
        DrillOptions,
        help="kill the leader (and nodes, and etcd members) under a seeded workload; check invariants",
        description="Start etcd, coordinators and query nodes as processes, run a seeded workload while the "
                    "leader is SIGKILLed and restarted, pause one leader past its TTL to prove fencing from "
                    "etcd's history, then check the invariants. Prints a table and one JSON line; exits 1 when "
                    "an invariant failed (takeover times are reported, not enforced)."),
    "streams": Drill(
        StreamDrillOptions,
        help="kill the leader, an snode's node, move a vgroup, fail tasks; check the streams",
        description="Start etcd, 2 coordinators (scaled-down stream timings) and stream nodes as processes, create "
                    "snodes and seeded streams, then SIGKILL the coordinator leader, SIGKILL an snode's node, move "
                    "a vgroup's leadership and fail tasks, waiting until quiescent after each; check that every "
                    "stream not stopped by the user runs with every expected task, none twice, none stale. Prints "
                    "a table and one JSON line; exits 1 when an invariant failed.",
        verbose_help="print every observation and role change"),
    "chaos": Drill(
        ChaosOptions,
        help="seeded concurrent requests while links are cut and processes die; check after each phase",
        description="Start etcd, coordinators (querycoord coord) and query nodes (querycoord querynode) as "
                    "processes, with a TCP proxy on every etcd link and in front of every node, then run a seeded "
                    "plan of phases: concurrent clients load and release collections and partitions (duplicates, "
                    "retries, conflicting requests), balance, add and compact segments, while the leader is "
                    "killed, paused or cut off from etcd, nodes are killed, added or partitioned. After each phase "
                    "the links heal and the drill waits until quiescent and checks the invariants. Prints a table "
                    "and one JSON line; exits 1 when a call went unanswered, an invariant failed or a trigger "
                    "stuck."),
    "restart": Drill(
        RestartOptions,
        help="stop the whole cluster (etcd, coordinators, query nodes) and start it again, several times",
        description="Start etcd, coordinators (querycoord coord) and query nodes (querycoord querynode, fixed "
                    "--node-id) as processes, load collections with 2 replicas and with 1, then stop every process "
                    "with SIGTERM or SIGKILL (alternating; seeded orders) and start them again on their data dirs, "
                    "--restarts times. All along, sample the leader's ShowCollections and GetReplicas against what "
                    "the nodes themselves report. Prints a table and one JSON line; exits 1 when a sample showed "
                    "100 % that the nodes did not hold, a trigger FAILED, or a restart was not whole again within "
                    "the session TTL + 10 s.",
        verbose_help="print every sample excused, role change and restart step"),
    "rolling": Drill(
        RollingOptions,
        help="drain, stop, restart and uncordon every query node in turn while clients load and release",
        description="Start etcd, coordinators (querycoord coord) and query nodes (querycoord querynode, fixed "
                    "--node-id) as processes, load collections with 2 replicas and with 1, then take every query "
                    "node in turn: cordon, drain until DRAINED, SIGTERM, start it again under its id and address, "
                    "wait until online, uncordon, wait until whole again; meanwhile clients load and release other "
                    "collections. Every --sample-interval seconds, what each node holds is asked of the node itself. "
                    "Prints a table and one JSON line; exits 1 when a sample found a 2-replica collection with no "
                    "whole replica, a node was not restarted or not whole again, a drain did not end DRAINED, a "
                    "process exited on its own, or a node is not online and ACTIVE at the end.",
        verbose_help="print every step, churn refusal and failed sample"),
}


def _add_drills(sub: Any) -> None:
    for name, drill in DRILLS.items():
        p = sub.add_parser(name, help=drill.help, description=drill.description)
        for f in cli_options(drill.options):
            p.add_argument(f"--{f.name.replace('_', '-')}", type=f.metadata["kind"], default=f.default,
                           choices=f.metadata["choices"], help=cli_help(f))
        _add_run_options(p, drill.verbose_help)
        p.set_defaults(func=run_drill)


def _add_run_options(p: argparse.ArgumentParser, verbose_help: str) -> None:
    """What every drill takes: where its logs go, whether to keep them, how much to print."""
    p.add_argument("--work-dir", default=None, help="keep logs and etcd data here (default: a temp dir, removed "
                                                    "when the drill passes)")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir even when the drill passes")
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line (errors still go to "
                                                             "stderr)")


def run_drill(args: argparse.Namespace) -> int:
    """Handler of ``drill <name>`` (``args.func``): the drill's options from ``args``, then the drill."""
    from querycoord.settings.logs import setup_logging

    options = DRILLS[args.drill].options
    # The drill's own process logs little: its output is the table; children log to files.
    setup_logging(getattr(args, "log_level", None) or os.environ.get("QUERYCOORD_DRILL_LOG_LEVEL") or "WARNING")
    opts = options(**{f.name: getattr(args, f.name) for f in cli_options(options)}, work_dir=args.work_dir,
                   keep=args.keep, verbose=args.verbose, json_only=args.json_only)
    runner = getattr(importlib.import_module(f"{__name__}.{args.drill}"), f"run_{args.drill}")
    return _run(opts, runner)


def _run(opts: RunOptions, runner: Callable[[Any], Coroutine[Any, Any, int]]) -> int:
    """Validate the options (a bad one is one error line, exit 2) and run the drill to its exit code."""
    try:
        opts.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if not opts.json_only:
            return asyncio.run(runner(opts))
        # The drills print to sys.stdout as it is when they start: the table and progress go to a buffer.
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            code = asyncio.run(runner(opts))
        lines = printed.getvalue().strip().splitlines()
        if lines and lines[-1].startswith("{"):
            print(lines[-1], flush=True)
        return code
    except KeyboardInterrupt:
        print("\ninterrupted: every process of the drill was stopped", file=sys.stderr)
        return 130


def add_drill_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``drill`` and its sub-commands on the ``querycoord`` sub-command parsers."""
    p = subparsers.add_parser("drill", help="failure drills against a cluster of real processes")
    _add_drills(p.add_subparsers(dest="drill", required=True, metavar="DRILL"))
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m querycoord.tooling.drill failover|streams|chaos|restart|rolling ...``."""
    parser = argparse.ArgumentParser(prog="python -m querycoord.tooling.drill", description="failure drills")
    parser.add_argument("--log-level", default=None, help="log level of the drill process (default WARNING)")
    _add_drills(parser.add_subparsers(dest="drill", required=True, metavar="DRILL"))
    args = parser.parse_args(argv)
    return int(args.func(args))


__all__ = ["DRILLS", "Drill", "add_drill_parser", "main", "run_drill"]
