"""``querycoord health`` and ``querycoord explain``: how whole each loaded collection is, and why not.

Both ask the leader (CheckHealth, Explain): the figures are what online nodes hold now. ``health`` exits 0 when
the answer came, whatever the colours, unless ``--fail-on yellow|red`` asks for exit 3 at or past that colour
(for scripts and probes); a refused or unreachable call exits 1 as every client command does.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord.cli.common import add_output_option, client_command, emit, positive_int
from querycoord.cli.watch import add_watch_option
from querycoord.console.actions import check, describe
from querycoord.console.draw_health import HEALTH_ORDER, explain_lines, explain_record, health_lines, health_record
from querycoord.net.client import QueryCoordClient

# Exit status of `health --fail-on` when the worst collection is at or past the colour asked.
UNHEALTHY_EXIT = 3


async def _health(c: QueryCoordClient, args: argparse.Namespace) -> int:
    ids = [(await describe(c, ref)).collection_id for ref in args.collections]
    resp = check(await c.query("CheckHealth", qc.CheckHealthRequest(collection_ids=ids)), "check health")
    record = health_record(resp)
    emit(args, record, lambda: health_lines(record))
    if args.fail_on and HEALTH_ORDER.index(record["state"]) >= HEALTH_ORDER.index(args.fail_on):
        return UNHEALTHY_EXIT
    return 0


async def _explain(c: QueryCoordClient, args: argparse.Namespace) -> int:
    ref: str = args.collection
    req = qc.ExplainRequest(segment_limit=args.segments)
    if ref.isdigit():
        req.collection_id = int(ref)
    else:
        req.collection_name = ref
    record = explain_record(check(await c.query("Explain", req), f"explain {ref}"))
    emit(args, record, lambda: explain_lines(record, int(time.time() * 1000)))
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("health", parents=client,
                       help="each loaded collection green, yellow or red, with what is missing (from the leader)")
    p.add_argument("collections", nargs="*", help="collection ids or names (default: every loaded collection)")
    p.add_argument("--fail-on", choices=("yellow", "red"),
                   help=f"exit {UNHEALTHY_EXIT} when a collection is this colour or worse (default: exit 0 "
                        "whenever the leader answered)")
    add_output_option(p)
    add_watch_option(p)
    p.set_defaults(func=client_command(_health))

    p = sub.add_parser("explain", parents=client,
                       help="why each replica of a collection lacks what it lacks, and what happens next")
    p.add_argument("collection", help="collection id or name")
    p.add_argument("--segments", type=positive_int, default=100, metavar="N",
                   help="missing segment ids listed per replica at most in -o json (default 100, at most 1000)")
    add_output_option(p)
    add_watch_option(p)
    p.set_defaults(func=client_command(_explain))
