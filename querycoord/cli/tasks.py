"""``querycoord balance``, ``tasks`` and ``nodes``: what the scheduler does and what the nodes hold."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord import draw
from querycoord.actions import (
    NODE_HEADERS,
    Refusal,
    check,
    list_trees,
    node_records,
    node_rows,
    segments_in,
    wait_task,
)
from querycoord.cli.common import add_output_option, client_command, emit, non_negative_int
from querycoord.client import QueryCoordClient


def _ints(values: Sequence[str] | None, what: str) -> list[int]:
    out: list[int] = []
    for item in (x.strip() for v in (values or ()) for x in v.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"{what} must be numeric ids, got {item!r}")
        out.append(int(item))
    return out


async def _balance(c: QueryCoordClient, args: argparse.Namespace) -> int:
    req = qc.LoadBalanceRequest(source_node_ids=_ints(args.source, "--source"), dst_node_ids=_ints(args.dst, "--dst"),
                                sealed_segment_ids=_ints(args.segments, "--segments"),
                                collection_id=args.collection)
    task_id = check(await c.query("LoadBalance", req), "load balance").task_id
    if args.no_wait:
        print(f"balance queued as task #{task_id}; follow it with `querycoord tasks --task {task_id}`")
        return 0
    tree = await wait_task(c, task_id)
    print("\n".join(draw.draw_tree(tree, max_children=args.max_children)))
    if tree.trigger.state == qc.TASK_STATE_FAILED:
        raise Refusal(f"balance task #{task_id} failed: {tree.trigger.error}", tree.trigger.error_code)
    moved = sum(segments_in(ch.summary) for ch in tree.children if ch.kind == qc.TASK_KIND_LOAD_SEGMENT)
    print(f"balance task #{task_id} finished: {moved:,} segments moved")
    return 0


async def _tasks(c: QueryCoordClient, args: argparse.Namespace) -> int:
    if args.task:
        got = check(await c.query("GetTask", qc.GetTaskRequest(task_id=args.task, children_limit=args.max_children)),
                    f"task {args.task}")
        emit(args, draw.tree_record(got.tree), lambda: draw.draw_tree(got.tree, max_children=args.max_children))
        return 0
    trees = await list_trees(c, include_finished=args.all, include_children=args.children,
                             collection_id=args.collection, children_limit=args.max_children)

    def render() -> list[str]:
        if not trees:
            return ["no task is queued or running" + ("" if args.all else " (--all also lists recently finished ones)")]
        if not args.children:
            return [draw.trigger_line(tree.trigger, tree.child_counts) for tree in trees]
        lines: list[str] = []
        for i, tree in enumerate(trees):
            lines.extend([""] if i else [])
            lines.extend(draw.draw_tree(tree, max_children=args.max_children))
        return lines

    emit(args, [draw.tree_record(t) for t in trees], render)
    return 0


async def _nodes(c: QueryCoordClient, args: argparse.Namespace) -> int:
    resp = check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes")

    def render() -> list[str]:
        if not resp.nodes:
            return ["no query node is registered; start one with `querycoord querynode` (or use `querycoord up`)"]
        return draw.table(NODE_HEADERS, node_rows(resp.nodes), right=(0, 3, 4, 6))

    emit(args, node_records(resp.nodes), render)
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("balance", parents=client, help="move sealed segments off query nodes")
    p.add_argument("--source", nargs="+", required=True, help="source node ids")
    p.add_argument("--dst", nargs="+", help="destination node ids (default: any other online node)")
    p.add_argument("--segments", nargs="+", help="segment ids to move (default: every segment of the sources)")
    p.add_argument("--collection", type=non_negative_int, default=0, help="only segments of this collection id")
    p.add_argument("--no-wait", action="store_true", help="return once the balance is queued")
    p.add_argument("--max-children", type=non_negative_int, default=20,
                   help="children drawn at most (0: all; default 20)")
    p.set_defaults(func=client_command(_balance))

    p = sub.add_parser("tasks", parents=client, help="task trees: queued and running (--all: recent ones too)")
    p.add_argument("--all", action="store_true", help="include recently finished trees")
    p.add_argument("--children", action="store_true", help="draw the children of each trigger")
    p.add_argument("--task", type=non_negative_int, default=0, help="draw the tree of this task (trigger or child id)")
    p.add_argument("--collection", type=non_negative_int, default=0, help="only tasks of this collection id")
    p.add_argument("--max-children", type=non_negative_int, default=50,
                   help="children drawn per tree at most (0: all; default 50)")
    add_output_option(p)
    p.set_defaults(func=client_command(_tasks))

    p = sub.add_parser("nodes", parents=client, help="query nodes and what they hold")
    add_output_option(p)
    p.set_defaults(func=client_command(_nodes))
