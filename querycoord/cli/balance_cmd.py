"""``querycoord balance pause|resume|status`` and ``querycoord checkers list|activate NAME|deactivate NAME``.

``balance`` with a word is balance control (``balance --source ...``, a LoadBalance, stays in ``cli/tasks.py``,
which hands the words here). A refusal (an unknown checker: NOT_FOUND naming the known ones) is one ``error:``
line and exit 1; a usage mistake exit 2. Deactivating a checker that repairs lost copies succeeds and prints
the leader's warning on stderr. What is printed is drawn by pure functions of the JSON records, so README's
examples are checked against them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord.cli.common import add_output_option, client_command, emit, utc
from querycoord.console import draw
from querycoord.console.actions import check
from querycoord.net.client import QueryCoordClient

BALANCE_ACTIONS = ("pause", "resume", "status")
_BALANCE_CALLS = {"pause": ("SuspendBalance", qc.SuspendBalanceRequest),
                  "resume": ("ResumeBalance", qc.ResumeBalanceRequest),
                  "status": ("CheckBalanceStatus", qc.CheckBalanceStatusRequest)}


def balance_record(resp: qc.BalanceStatusResponse) -> dict[str, Any]:
    return {"paused": resp.paused, "since_ms": resp.since_ms, "by": resp.by}


def balance_lines(record: dict[str, Any]) -> list[str]:
    """What ``balance pause|resume|status`` prints."""
    if not record["paused"]:
        return ["balance runs: the auto balancer plans moves"]
    by = f" by {record['by']}" if record["by"] else ""
    return [f"balance paused since {utc(record['since_ms'])}{by}",
            "  no optional move is planned; repairs of lost copies, loads, releases and "
            "`querycoord balance --source` still run"]


async def balance_control(c: QueryCoordClient, args: argparse.Namespace) -> int:
    """``balance pause|resume|status``: the options of a move are refused with it (exit 2)."""
    given = [flag for flag, value in (("--source", args.source), ("--dst", args.dst), ("--segments", args.segments),
                                      ("--collection", args.collection), ("--no-wait", args.no_wait)) if value]
    if given:
        raise ValueError(f"`querycoord balance {args.action}` takes no {', '.join(given)} "
                         "(those are for a move: `querycoord balance --source NODE ...`)")
    method, request = _BALANCE_CALLS[args.action]
    record = balance_record(check(await c.query(method, request()), f"balance {args.action}"))
    emit(args, record, lambda: balance_lines(record))
    return 0


def checker_record(info: qc.CheckerInfo) -> dict[str, Any]:
    return {"name": info.name, "active": info.active, "description": info.description}


def checkers_lines(records: list[dict[str, Any]]) -> list[str]:
    """The table of ``checkers list``."""
    return draw.table(("NAME", "ACTIVE", "DESCRIPTION"),
                      ((r["name"], "yes" if r["active"] else "no", r["description"]) for r in records))


def checker_line(record: dict[str, Any]) -> str:
    """What ``checkers activate|deactivate NAME`` prints."""
    return f"checker {record['name']} is {'active' if record['active'] else 'off'}: {record['description']}"


async def _checkers(c: QueryCoordClient, args: argparse.Namespace) -> int:
    if args.action == "list":
        if args.name is not None:
            raise ValueError(f"`querycoord checkers list` takes no name (got {args.name!r})")
        resp = check(await c.query("ListCheckers", qc.ListCheckersRequest()), "list checkers")
        records = [checker_record(i) for i in resp.checkers]
        emit(args, records, lambda: checkers_lines(records))
        return 0
    if not args.name:
        raise ValueError(f"`querycoord checkers {args.action}` needs a checker name "
                         "(`querycoord checkers list` shows them)")
    method = "ActivateChecker" if args.action == "activate" else "DeactivateChecker"
    resp = check(await c.query(method, qc.CheckerRequest(name=args.name)), f"{args.action} checker {args.name}")
    record = {**checker_record(resp.checker), "warning": resp.status.reason}
    if resp.status.reason:
        print(resp.status.reason, file=sys.stderr)
    emit(args, record, lambda: [checker_line(record)])
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("checkers", parents=client,
                       help="the checker's kinds and the auto balancer: list them, turn one on or off (kept in etcd)")
    p.add_argument("action", choices=("list", "activate", "deactivate"),
                   help="list: every kind, whether it runs; activate|deactivate NAME: turn it on or off")
    p.add_argument("name", nargs="?", help="the checker of activate|deactivate (see `checkers list`)")
    add_output_option(p)
    p.set_defaults(func=client_command(_checkers))


__all__ = ["BALANCE_ACTIONS", "add_parsers", "balance_control", "balance_lines", "balance_record", "checker_line",
           "checker_record", "checkers_lines", "utc"]
