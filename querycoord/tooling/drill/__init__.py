"""Drills: real processes, real faults, invariants checked at the end (``querycoord drill ...``).

``add_drill_parser(subparsers)`` registers ``drill`` (with its ``failover``,
``streams`` and ``chaos`` sub-commands) on the ``querycoord`` CLI; ``main(argv)`` is the same command
line without the CLI: ``python -m querycoord.tooling.drill failover ...``. The drill
modules are imported lazily so that ``querycoord --help`` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def _add_failover(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "failover", help="kill the leader (and nodes, and etcd members) under a seeded workload; check invariants",
        description="Start etcd, coordinators and query nodes as processes, run a seeded workload while the "
                    "leader is SIGKILLed and restarted, pause one leader past its TTL to prove fencing from "
                    "etcd's history, then check the invariants. Prints a table and one JSON line; exits 1 when "
                    "an invariant failed (takeover times are reported, not enforced).")
    p.add_argument("--coordinators", type=int, default=3, help="coordinator processes (default 3, >= 2)")
    p.add_argument("--nodes", type=int, default=4, help="query node processes (default 4)")
    p.add_argument("--collections", type=int, default=20, help="collections created in the catalog (default 20)")
    p.add_argument("--kills", type=int, default=10, help="leader SIGKILLs (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the schedule (default 0)")
    p.add_argument("--etcd-members", type=int, default=1, choices=(1, 3), help="embedded etcd members (default 1)")
    p.add_argument("--etcd-kills", type=int, default=0, help="etcd member SIGKILLs, one down at a time (needs 3)")
    p.add_argument("--ttl", type=float, default=2.0, help="session TTL of coordinators and nodes (default 2)")
    p.add_argument("--segments-per-collection", type=int, default=80, help="sealed segments per collection "
                                                                           "(default 80)")
    p.add_argument("--partitions", type=int, default=2, help="partitions per collection (default 2)")
    p.add_argument("--pauses", type=int, default=1, help="SIGSTOP rounds proving fencing (default 1)")
    p.add_argument("--node-kills", type=int, default=2, help="query node SIGKILLs with replacement (default 2)")
    p.add_argument("--ops", type=int, default=0, help="client requests in the schedule (default: derived)")
    p.add_argument("--node-latency-ms", type=float, default=10.0, help="latency of every node call (default 10)")
    p.add_argument("--quiesce-timeout", type=float, default=120.0, help="bound of the final wait (default 120)")
    _add_run_options(p, "print every call and role change")
    p.set_defaults(func=cmd_failover)
    return p


def _add_streams(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "streams", help="kill the leader, an snode's node, move a vgroup, fail tasks; check the streams",
        description="Start etcd, 2 coordinators (scaled-down stream timings) and stream nodes as processes, create "
                    "snodes and seeded streams, then SIGKILL the coordinator leader, SIGKILL an snode's node, move "
                    "a vgroup's leadership and fail tasks, waiting until quiescent after each; check that every "
                    "stream not stopped by the user runs with every expected task, none twice, none stale. Prints "
                    "a table and one JSON line; exits 1 when an invariant failed.")
    p.add_argument("--nodes", type=int, default=4, help="stream node processes, 2 vgroups each (default 4)")
    p.add_argument("--snodes", type=int, default=2, help="nodes hosting an snode (default 2)")
    p.add_argument("--streams", type=int, default=50, help="streams created (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the stream shapes and faults (default 0)")
    p.add_argument("--leader-kills", type=int, default=2, help="coordinator leader SIGKILLs (default 2)")
    p.add_argument("--node-kills", type=int, default=1, help="SIGKILLs of an snode's node (default 1)")
    p.add_argument("--vgroup-moves", type=int, default=1, help="vgroup leadership moves (default 1)")
    p.add_argument("--task-fails", type=int, default=3, help="tasks failed through stdin (default 3)")
    p.add_argument("--user-stops", type=int, default=-1, help="streams stopped by the user (default streams/10)")
    p.add_argument("--ttl", type=float, default=2.0, help="session TTL of coordinators and nodes (default 2)")
    p.add_argument("--heartbeat-ms", type=float, default=100.0, help="stream node heartbeat tick (default 100)")
    p.add_argument("--watch-timeout", type=float, default=2.0, help="the leader's WATCH bound (default 2)")
    p.add_argument("--quiesce-timeout", type=float, default=60.0, help="bound of each wait (default 60)")
    _add_run_options(p, "print every observation and role change")
    p.set_defaults(func=cmd_streams)
    return p


def cmd_streams(args: argparse.Namespace) -> int:
    """Handler of ``drill streams`` (``args.func``)."""
    from querycoord.logs import setup_logging
    from querycoord.tooling.drill.streams import StreamDrillOptions, run_streams

    setup_logging(getattr(args, "log_level", None) or os.environ.get("QUERYCOORD_DRILL_LOG_LEVEL") or "WARNING")
    try:
        opts = StreamDrillOptions(
            nodes=args.nodes, snodes=args.snodes, streams=args.streams, seed=args.seed,
            leader_kills=args.leader_kills, node_kills=args.node_kills, vgroup_moves=args.vgroup_moves,
            task_fails=args.task_fails, user_stops=args.user_stops, ttl=args.ttl, heartbeat_ms=args.heartbeat_ms,
            watch_timeout=args.watch_timeout, quiesce_timeout=args.quiesce_timeout, work_dir=args.work_dir,
            keep=args.keep, verbose=args.verbose)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run(opts, run_streams)


def _add_chaos(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "chaos", help="seeded concurrent requests while links are cut and processes die; check after each phase",
        description="Start etcd, coordinators (querycoord coord) and query nodes (querycoord querynode) as "
                    "processes, with a TCP proxy on every etcd link and in front of every node, then run a seeded "
                    "plan of phases: concurrent clients load and release collections and partitions (duplicates, "
                    "retries, conflicting requests), balance, add and compact segments, while the leader is "
                    "killed, paused or cut off from etcd, nodes are killed, added or partitioned. After each phase "
                    "the links heal and the drill waits until quiescent and checks the invariants. Prints a table "
                    "and one JSON line; exits 1 when a call went unanswered, an invariant failed or a trigger "
                    "stuck.")
    p.add_argument("--ops", type=int, default=300, help="client requests in the plan (default 300)")
    p.add_argument("--seed", type=int, default=0, help="seed of the plan (default 0)")
    p.add_argument("--coordinators", type=int, default=3, help="coordinator processes (default 3)")
    p.add_argument("--nodes", type=int, default=4, help="query node processes at the start (default 4; kills "
                                                        "and adds keep 3 to 6)")
    p.add_argument("--clients", type=int, default=3, help="concurrent clients (default 3)")
    p.add_argument("--collections", type=int, default=12, help="collections in the catalog (default 12)")
    p.add_argument("--partitions", type=int, default=3, help="partitions per collection (default 3)")
    p.add_argument("--segments-per-collection", type=int, default=30, help="sealed segments per collection at "
                                                                           "the start (default 30)")
    p.add_argument("--ttl", type=float, default=2.0, help="session TTL of coordinators and nodes (default 2)")
    p.add_argument("--node-latency-ms", type=float, default=10.0, help="latency of every node call (default 10)")
    p.add_argument("--call-deadline", type=float, default=60.0, help="every call must be answered within this "
                                                                     "(default 60)")
    p.add_argument("--quiesce-timeout", type=float, default=60.0, help="bound of each wait for quiescence; "
                                                                       "triggers still running then are stuck "
                                                                       "(default 60)")
    p.add_argument("--checker-interval", type=float, default=1.0, help="the coordinators' checker interval, when "
                                                                       "`querycoord coord` has that option "
                                                                       "(default 1)")
    p.add_argument("--settle", type=float, default=None, help="seconds the leader must stay idle to be quiescent "
                                                               "(default: one checker interval + 1 s; 1.5 without a "
                                                               "checker)")
    p.add_argument("--time-budget", type=float, default=900.0, help="bound of the whole run in seconds; phases "
                                                                    "left are skipped (default 900)")
    _add_run_options(p, "print every call and role change")
    p.set_defaults(func=cmd_chaos)
    return p


def cmd_chaos(args: argparse.Namespace) -> int:
    """Handler of ``drill chaos`` (``args.func``)."""
    from querycoord.logs import setup_logging
    from querycoord.tooling.drill.chaos import ChaosOptions, run_chaos

    setup_logging(getattr(args, "log_level", None) or os.environ.get("QUERYCOORD_DRILL_LOG_LEVEL") or "WARNING")
    try:
        opts = ChaosOptions(
            ops=args.ops, seed=args.seed, coordinators=args.coordinators, nodes=args.nodes, clients=args.clients,
            collections=args.collections, partitions=args.partitions,
            segments_per_collection=args.segments_per_collection, ttl=args.ttl,
            node_latency_ms=args.node_latency_ms, call_deadline=args.call_deadline,
            quiesce_timeout=args.quiesce_timeout, checker_interval=args.checker_interval, settle=args.settle,
            time_budget=args.time_budget,
            work_dir=args.work_dir,
            keep=args.keep, verbose=args.verbose)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run(opts, run_chaos)


def _add_run_options(p: argparse.ArgumentParser, verbose_help: str) -> None:
    """What every drill takes: where its logs go, whether to keep them, how much to print."""
    p.add_argument("--work-dir", default=None, help="keep logs and etcd data here (default: a temp dir, removed "
                                                    "when the drill passes)")
    p.add_argument("--keep", action="store_true", help="keep the temp work dir even when the drill passes")
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)


def _run(opts: Any, runner: Callable[[Any], Coroutine[Any, Any, int]]) -> int:
    """Validate the options (a bad one is one error line, exit 2) and run the drill to its exit code."""
    try:
        opts.validate()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(runner(opts))
    except KeyboardInterrupt:
        print("\ninterrupted: every process of the drill was stopped", file=sys.stderr)
        return 130


def add_drill_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``drill`` and its sub-commands on the ``querycoord`` sub-command parsers."""
    p = subparsers.add_parser("drill", help="failure drills against a cluster of real processes")
    sub = p.add_subparsers(dest="drill", required=True, metavar="DRILL")
    _add_failover(sub)
    _add_streams(sub)
    _add_chaos(sub)
    return p


def cmd_failover(args: argparse.Namespace) -> int:
    """Handler of ``drill failover`` (``args.func``)."""
    from querycoord.logs import setup_logging
    from querycoord.tooling.drill.failover import DrillOptions, run_failover

    # The drill's own process logs little: its output is the table; children log to files.
    setup_logging(getattr(args, "log_level", None) or os.environ.get("QUERYCOORD_DRILL_LOG_LEVEL") or "WARNING")
    try:
        opts = DrillOptions(
            coordinators=args.coordinators, nodes=args.nodes, collections=args.collections, kills=args.kills,
            seed=args.seed, etcd_members=args.etcd_members, etcd_kills=args.etcd_kills, ttl=args.ttl,
            segments_per_collection=args.segments_per_collection, partitions=args.partitions, pauses=args.pauses,
            node_kills=args.node_kills, ops=args.ops, node_latency_ms=args.node_latency_ms,
            quiesce_timeout=args.quiesce_timeout, work_dir=args.work_dir, keep=args.keep, verbose=args.verbose)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run(opts, run_failover)


def main(argv: list[str] | None = None) -> int:
    """``python -m querycoord.tooling.drill failover|streams|chaos ...``."""
    parser = argparse.ArgumentParser(prog="python -m querycoord.tooling.drill", description="failure drills")
    parser.add_argument("--log-level", default=None, help="log level of the drill process (default WARNING)")
    sub = parser.add_subparsers(dest="drill", required=True, metavar="DRILL")
    _add_failover(sub)
    _add_streams(sub)
    _add_chaos(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


__all__ = ["add_drill_parser", "cmd_chaos", "cmd_failover", "cmd_streams", "main"]
