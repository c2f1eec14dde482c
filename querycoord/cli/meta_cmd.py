"""``querycoord meta show|verify|repair``: what a deployment keeps in etcd, read and repaired without a coordinator.

Like ``status``, these read etcd directly (the etcd options of ``coord`` and
``--root``), so they work when no coordinator runs or the leader is stuck.
``show KIND`` decodes one kind of record; ``verify`` lists each problem with
its keys and exits 1 when it finds one (usable as a check); ``repair`` says
what it would fix, and with ``--apply`` fixes it under a fence of its own,
refusing while a coordinator leads (``querycoord.metatool.repair``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from loguru import logger

from meta.client import connect
from meta.config import EtcdConfig
from meta.errors import MetaError, MetaRefused, MetaUnavailable
from meta.kv import MetaKV
from querycoord.cli.common import add_etcd_read_options, emit
from querycoord.cli.etcd_read import read_root, reader_config, refused_message, say_target
from querycoord.common.wording import plural

if TYPE_CHECKING:
    from querycoord.metatool.problems import Problem

# The kinds `meta show` decodes (``querycoord.metatool.show.KINDS``; tests/test_cli_start.py checks they agree),
# named here so that registering the command does not import metatool: its modules are imported by the commands
# that run, never by `querycoord --help` or another command's start-up.
SHOW_KINDS = ("collections", "partitions", "segments", "channels", "tasks", "sessions", "streams", "snodes")


async def _with_kv(config: EtcdConfig, root: str, fn: Callable[[MetaKV], Awaitable[Any]]) -> Any:
    async with await connect(config) as client:
        return await fn(MetaKV(client, root))


def _run(args: argparse.Namespace, fn: Callable[[MetaKV], Awaitable[Any]]) -> tuple[int, Any]:
    """(0, what ``fn`` returned) or (exit code, None) once the one error line is printed."""
    from querycoord.metatool import repair

    if (getattr(args, "log_level", None) or "") not in ("TRACE", "DEBUG"):
        logger.disable("meta")  # one-shot: etcd not answering is the one error line, not retry chatter
    try:
        config = reader_config(args, float(getattr(args, "timeout", 15.0)))
        root = read_root(args)
        say_target(args, root, config)
        return 0, asyncio.run(_with_kv(config, root, fn))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2, None
    except (repair.LeaderLive, repair.RepairRefused) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1, None
    except MetaRefused as exc:
        print(f"error: {refused_message(args, exc)}", file=sys.stderr)
        return 1, None
    except MetaUnavailable as exc:
        print(f"error: etcd did not answer: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1, None
    except MetaError as exc:  # refused credentials or permission, NOSPACE: etcd's answer says what to do
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1, None


def cmd_show(args: argparse.Namespace) -> int:
    from querycoord.metatool import show, snapshot

    code, snap = _run(args, snapshot.take)
    if code:
        return code
    rows = show.show(snap, args.kind)
    emit(args, {"root": snap.root, "revision": snap.revision, "kind": args.kind, "rows": rows},
         lambda: show.render(args.kind, rows, snap.root, snap.revision))
    return 0


def _problem_lines(problems: list[Problem], results: list[str] | None = None) -> list[str]:
    lines = []
    for i, p in enumerate(problems):
        tail = f"  [{results[i]}]" if results else ""
        lines.append(f"{p.kind}: {p.detail}{tail}")
        shown = list(p.keys[:8]) + ([f"... {len(p.keys) - 8} more"] if len(p.keys) > 8 else [])
        lines += [f"    {k}" for k in shown]
        lines.append(f"    fix: {p.fix.summary if p.fix else 'none automatic'}")
    return lines


@contextlib.contextmanager
def _no_cyclic_collection() -> Iterator[None]:
    """The cyclic collector off while a snapshot of millions of records is built and checked: they are all kept
    until the command ends, and the collector would walk them again and again as they grow (most of verify's
    time at a million segments). Turned back on after, for a caller that goes on (a test calling ``main``)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def cmd_verify(args: argparse.Namespace) -> int:
    with _no_cyclic_collection():
        return _verify(args)


def _verify(args: argparse.Namespace) -> int:
    from querycoord.metatool.verify import summary, take_streamed, verify

    code, read = _run(args, take_streamed)
    if code:
        return code
    snap = read.snap
    problems = verify(snap, read.segments)
    counts = summary(problems)

    def render() -> list[str]:
        head = f"root {snap.root} at revision {snap.revision}: "
        if not problems:
            return [head + "no problem found"]
        counted = ", ".join(f"{n} {k}" for k, n in counts.items())
        return [head + f"{plural(len(problems), 'problem')} ({counted})", *_problem_lines(problems),
                "`querycoord meta repair` shows what it would write; --apply writes it"]

    emit(args, {"root": snap.root, "revision": snap.revision, "summary": counts,
                "problems": [p.as_dict() for p in problems]}, render)
    return 1 if problems else 0


def cmd_repair(args: argparse.Namespace) -> int:
    from querycoord.metatool import repair

    code, report = _run(args, repair.apply if args.apply else repair.dry_run)
    if code:
        return code

    def render() -> list[str]:
        head = f"root {report.root} at revision {report.revision}: {report.how}"
        if not report.outcomes:
            return [head, "no problem found"]
        lines = [head, *_problem_lines([o.problem for o in report.outcomes], [o.result for o in report.outcomes])]
        done = sum(o.result == "fixed" for o in report.outcomes)
        lines.append(f"fixed {done} of {len(report.outcomes)}" if report.applied else
                     "dry run: run again with --apply to write these fixes")
        return lines

    emit(args, report.as_dict(), render)
    return 0 if report.complete else 1


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("meta", help="inspect, verify and repair what is in etcd, with or without a leader")
    msub = p.add_subparsers(dest="meta_command", required=True, metavar="{show,verify,repair}")
    s = msub.add_parser("show", help="decoded records of one kind, read from etcd")
    s.add_argument("kind", choices=list(SHOW_KINDS), metavar="KIND", help=", ".join(SHOW_KINDS))
    add_etcd_read_options(s)
    s.set_defaults(func=cmd_show)
    v = msub.add_parser("verify", help="list each problem with its keys (exit 1 when there is one)")
    add_etcd_read_options(v)
    v.set_defaults(func=cmd_verify)
    r = msub.add_parser("repair", help="fix what verify finds: dry run unless --apply; never beside a live leader")
    r.add_argument("--apply", action="store_true",
                   help="write the fixes (under the repair's own fence; refused while a coordinator leads)")
    add_etcd_read_options(r)
    r.set_defaults(func=cmd_repair)


__all__ = ["SHOW_KINDS", "add_parsers"]
