"""``querycoord node cordon|uncordon|drain ID [--wait]``: a query node's maintenance lifecycle.

Each prints the node's line after the change (``-o json``: its NodeInfo as ``nodes -o json`` prints a node).
``drain --wait`` then follows the drain, one line whenever its progress changes, until the node is DRAINED;
Ctrl-C stops the following, not the drain.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord.cli.common import add_output_option, client_command, emit, positive_int
from querycoord.console.actions import POLL_INTERVAL, check, drain_text, lifecycle_name, node_records
from querycoord.net.client import QueryCoordClient

_RPC = {"cordon": "CordonNode", "uncordon": "UncordonNode", "drain": "DrainNode"}


def node_line(n: qc.NodeInfo) -> str:
    """``node 3: draining, 4/10 left, eta 12:00:05``."""
    text = f"node {n.node_id}: {lifecycle_name(n)}"
    drain = drain_text(n, why=True)
    return text if drain == "-" else f"{text}, {drain}"


async def _follow(c: QueryCoordClient, node_id: int) -> qc.NodeInfo:
    """Poll ShowNodes until the node is DRAINED (or no longer draining: uncordoned meanwhile)."""
    last = ""
    while True:
        nodes = check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes").nodes
        node = next((n for n in nodes if n.node_id == node_id), None)
        if node is None:
            return qc.NodeInfo(node_id=node_id)
        line = node_line(node)
        if line != last:
            print(line, flush=True)
            last = line
        if node.lifecycle != qc.NODE_LIFECYCLE_DRAINING:
            return node
        await asyncio.sleep(POLL_INTERVAL)


async def _node(c: QueryCoordClient, args: argparse.Namespace) -> int:
    if args.wait and args.action != "drain":
        raise ValueError("--wait follows a drain: only `node drain ID --wait`")
    resp = check(await c.query(_RPC[args.action], qc.NodeLifecycleRequest(node_id=args.id)),
                 f"{args.action} node {args.id}")
    node = resp.node
    if args.wait and node.lifecycle == qc.NODE_LIFECYCLE_DRAINING:
        quiet = getattr(args, "output", "table") in ("json", "yaml")
        if quiet:
            while node.lifecycle == qc.NODE_LIFECYCLE_DRAINING:
                await asyncio.sleep(POLL_INTERVAL)
                nodes = check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes").nodes
                node = next((n for n in nodes if n.node_id == args.id), node)
        else:
            node = await _follow(c, args.id)
            return 0
    emit(args, node_records([node])[0], lambda: [node_line(node)])
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("node", parents=client,
                       help="query node maintenance: cordon (nothing new), drain (move its copies away), uncordon")
    p.add_argument("action", choices=["cordon", "uncordon", "drain"],
                   help="cordon: keeps what it holds, given nothing new; drain: its copies loaded elsewhere in "
                        "their replicas, then it leaves them; uncordon: active again")
    p.add_argument("id", type=positive_int, help="the query node id")
    p.add_argument("--wait", action="store_true", help="drain: follow the drain until the node is drained")
    add_output_option(p)
    p.set_defaults(func=client_command(_node))
