"""``querycoord stream create|show|stop|start|drop|recalc`` and ``querycoord snode create|show|drop``.

The same conventions as ``collection``: the calls go to the leading
coordinator's StreamMgmt service (the client follows the leader), a refusal
is one ``error: <server's reason>`` line and exit 1, a bad argument one
``error: ...`` line and exit 2, and ``show`` prints ``-o json`` for scripts.
The client-side actions are ``querycoord.console.actions``' (shared with ``make
demo``), the drawing ``querycoord.console.draw``'s.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from proto import stream_pb2
from querycoord.cli.common import add_output_option, client_command, emit, non_negative_int, positive_int
from querycoord.cli.watch import add_watch_option
from querycoord.common.wording import plural
from querycoord.console import draw
from querycoord.console import recalc as recalc_view
from querycoord.console.actions import (
    answered_by_standby,
    create_snode,
    create_stream_answer,
    drop_snode,
    drop_stream,
    parse_vgroups,
    show_streams,
    start_stream,
    stop_stream_noted,
)
from querycoord.net.client import QueryCoordClient


def vgroup_list(text: str) -> list[int]:
    """``--vgroups`` (argparse ``type=``): a bad list is a usage error naming the option."""
    try:
        return parse_vgroups(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _standby_note(show: stream_pb2.ShowStreamsResponse) -> None:
    """A standby answered (no leader named to follow): say so, on stderr so ``-o json`` stays one document."""
    if answered_by_standby(show):
        print(f"note: {show.status.reason}", file=sys.stderr)


# ----- streams --------------------------------------------------------------------------------------------------------
async def _stream_create(c: QueryCoordClient, args: argparse.Namespace) -> int:
    resp = await create_stream_answer(c, args.name, vgroups=args.vgroups, source_db=args.db,
                                      trigger_vgroup=args.trigger_vgroup, scan_plans=args.scan_plans,
                                      subplans=args.subplans, runner_deploys=args.runner_deploys,
                                      if_not_exists=args.if_not_exists)
    sdef = resp.stream
    if resp.already_exists:
        print(f"stream {sdef.name} (id {sdef.id}) exists, left as it is (--if-not-exists): vgroups "
              f"{','.join(map(str, sdef.source_vgroup_ids))} of {sdef.source_db or '-'}, main snode "
              f"{sdef.main_snode_id}")
        return 0
    if resp.status.reason:  # accepted, and it says what the stream waits for
        print(f"note: {resp.status.reason}", file=sys.stderr)
    print(f"created stream {sdef.name} (id {sdef.id}) on vgroups {','.join(map(str, sdef.source_vgroup_ids))} of "
          f"{sdef.source_db or '-'}: main snode {sdef.main_snode_id}, {plural(sdef.num_calc_scan_plans, 'scan plan')}, "
          f"{plural(sdef.runner_deploys, 'runner deploy')} of {sdef.num_calc_subplans}; "
          f"follow it with `querycoord stream show {sdef.name}`")
    return 0


async def _stream_show(c: QueryCoordClient, args: argparse.Namespace) -> int:
    show = await show_streams(c, args.streams, with_tasks=True)
    now = time.time()
    _standby_note(show)
    data = {"watching": show.watching, "watch_until_ms": show.watch_until_ms,
            "answered_by_standby": answered_by_standby(show),
            "streams": [{**draw.stream_record(i, show, now),
                         "recalcs": [recalc_view.recalc_record(r) for r in i.recalcs]} for i in show.streams]}

    def render() -> list[str]:
        if not show.streams:
            return ["no streams; create one with `querycoord stream create NAME --vgroups 1,2`"]
        if args.summary:
            return draw.stream_summary(show)
        lines: list[str] = []
        for i, info in enumerate(sorted(show.streams, key=lambda s: s.stream.id)):
            lines.extend(([""] if i else []) + draw.draw_stream(info, show, now) + recalc_view.recalc_lines(info))
        return lines

    emit(args, data, render)
    return 0


async def _stream_drop(c: QueryCoordClient, args: argparse.Namespace) -> int:
    sdef = await drop_stream(c, args.stream, if_exists=args.if_exists)
    if sdef is None:
        print(f"no stream {args.stream!r}: nothing to drop")
    else:
        print(f"dropped stream {sdef.name} (id {sdef.id}); its tasks are undeployed and their state cleaned up")
    return 0


async def _stream_stop(c: QueryCoordClient, args: argparse.Namespace) -> int:
    sdef, note = await stop_stream_noted(c, args.stream)
    if note:
        print(f"note: {note}", file=sys.stderr)
    print(f"stopped stream {sdef.name} (id {sdef.id}); its tasks are undeployed with a checkpoint; "
          f"`querycoord stream start {sdef.name}` resumes it")
    return 0


async def _stream_start(c: QueryCoordClient, args: argparse.Namespace) -> int:
    sdef = await start_stream(c, args.stream, ignore_untreated=args.ignore_untreated)
    skip = ("; its tasks skip what was written while it was stopped" if sdef.start_from_ms
            else "; its tasks resume where they were")
    print(f"started stream {sdef.name} (id {sdef.id}){skip}; the leader plans and deploys it "
          f"(see `querycoord stream show {sdef.name}`)")
    return 0


def time_ms(text: str) -> int:
    """``--from``/``--to`` (argparse ``type=``): unix ms or ISO 8601; a bad one is a usage error."""
    try:
        return recalc_view.parse_time_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


async def _stream_recalc(c: QueryCoordClient, args: argparse.Namespace) -> int:
    if args.from_ms >= args.to_ms:
        raise ValueError(f"--from ({recalc_view.iso(args.from_ms)}) must be before --to "
                         f"({recalc_view.iso(args.to_ms)})")
    info = await recalc_view.recalculate_stream(c, args.stream, args.from_ms, args.to_ms)
    print(f"stream {args.stream}: {recalc_view.recalc_line(info)}", flush=True)
    if not args.wait:
        return 0
    info = await recalc_view.wait_recalc(c, args.stream, info.recalc_id, args.wait_timeout)
    print(f"stream {args.stream}: {recalc_view.recalc_line(info)}")
    return 0 if info.state == stream_pb2.RECALC_DONE else 1


# ----- snodes ---------------------------------------------------------------------------------------------------------
async def _snode_create(c: QueryCoordClient, args: argparse.Namespace) -> int:
    info = await create_snode(c, args.node_id)
    replica = f"replica snode {info.replica_id}" if info.replica_id else "no replica (the only snode)"
    print(f"created snode {info.id} on stream node {info.node_id}, {replica}; the node picks it up from etcd")
    return 0


async def _snode_drop(c: QueryCoordClient, args: argparse.Namespace) -> int:
    resp = await drop_snode(c, args.snode_id, force=args.force)
    whose = "its" if resp.moved_streams == 1 else "their"
    moved = (f"; {plural(resp.moved_streams, 'stream')} moved to snode {resp.moved_to_snode_id}, {whose} tasks "
             f"redeployed elsewhere" if resp.moved_streams else "; no stream had it as main snode")
    print(f"dropped snode {args.snode_id}{moved}")
    return 0


async def _snode_show(c: QueryCoordClient, args: argparse.Namespace) -> int:
    show = await show_streams(c, with_tasks=False)
    _standby_note(show)
    records = draw.snode_records(show, liveness_known=not answered_by_standby(show))

    def render() -> list[str]:
        if not records:
            return ["no snodes; create one with `querycoord snode create NODE_ID` (a stream node's id)"]
        return draw.table(draw.SNODE_HEADERS, draw.snode_rows(records), right=(0, 1, 2, 4))

    emit(args, records, render)
    return 0


def _named(ssub: Any, name: str, help_: str, client: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    q = ssub.add_parser(name, parents=client, help=help_)
    q.add_argument("stream", help="stream id or name")
    return q


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("stream", help="create, show, stop, start, drop and recalculate streams")
    ssub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = ssub.add_parser("create", parents=client, help="create a stream (needs a live snode)")
    q.add_argument("name")
    q.add_argument("--vgroups", type=vgroup_list, required=True, metavar="IDS",
                   help="source vgroups, e.g. 1,2 or 1-4: a trigger reader and the calc readers on each")
    q.add_argument("--db", default="db", help="source database (default db)")
    q.add_argument("--trigger-vgroup", type=non_negative_int, default=0, metavar="ID",
                   help="a stream triggered by one table: its only trigger reader's vgroup (default 0: every vgroup)")
    q.add_argument("--scan-plans", type=non_negative_int, default=1,
                   help="calc scan plans, each a calc reader per vgroup (default 1)")
    q.add_argument("--subplans", type=positive_int, default=2, help="tasks of the runner DAG (default 2)")
    q.add_argument("--runner-deploys", type=non_negative_int, default=0,
                   help="copies of the runner DAG (default 0: the coordinator's default, 3)")
    q.add_argument("--if-not-exists", action="store_true", help="succeed without change if the name exists")
    q.set_defaults(func=client_command(_stream_create))

    q = ssub.add_parser("show", parents=client,
                        help="streams with their tasks (node, snode, SID, state) and what the leader does about them")
    q.add_argument("streams", nargs="*", help="stream ids or names (default: all)")
    q.add_argument("--summary", action="store_true", help="one row per stream instead of its tasks")
    add_output_option(q)
    add_watch_option(q)
    q.set_defaults(func=client_command(_stream_show))

    q = _named(ssub, "stop", "stop a stream: its tasks are undeployed with a checkpoint", client)
    q.set_defaults(func=client_command(_stream_stop))
    q = _named(ssub, "start", "start a stopped stream again", client)
    q.add_argument("--ignore-untreated", action="store_true",
                   help="skip what was written while the stream was stopped (default: resume where it was)")
    q.set_defaults(func=client_command(_stream_start))
    q = _named(ssub, "drop", "drop a stream: its tasks are undeployed, their state cleaned up", client)
    q.add_argument("--if-exists", action="store_true", help="succeed if there is no such stream")
    q.set_defaults(func=client_command(_stream_drop))
    q = _named(ssub, "recalc", "recompute a time range of a stream on its runners", client)
    q.add_argument("--from", dest="from_ms", type=time_ms, required=True, metavar="T",
                   help="start of the range: unix ms or ISO 8601 (UTC without a zone)")
    q.add_argument("--to", dest="to_ms", type=time_ms, required=True, metavar="T", help="end of the range (excluded)")
    q.add_argument("--wait", action="store_true", help="wait until every runner finished it (exit 1 if it fails)")
    q.add_argument("--wait-timeout", type=positive_int, default=600, metavar="S",
                   help="with --wait: give up waiting after this many seconds (default 600)")
    q.set_defaults(func=client_command(_stream_recalc))

    p = sub.add_parser("snode", help="create, show and drop snodes (where triggers and runners run)")
    ssub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = ssub.add_parser("create", parents=client, help="create an snode on a stream node")
    q.add_argument("node_id", type=positive_int, help="the stream node's id (its session's server id)")
    q.set_defaults(func=client_command(_snode_create))
    q = ssub.add_parser("drop", parents=client,
                        help="drop an snode (refused while streams depend on it, unless --force)")
    q.add_argument("snode_id", type=positive_int)
    q.add_argument("--force", action="store_true",
                   help="drop it even while streams depend on it: they move to its replica, their tasks are "
                        "redeployed elsewhere")
    q.set_defaults(func=client_command(_snode_drop))
    q = ssub.add_parser("show", parents=client, help="snodes: node, replica, liveness, streams")
    add_output_option(q)
    add_watch_option(q)
    q.set_defaults(func=client_command(_snode_show))
