"""``querycoord balance``, ``tasks`` and ``nodes``: what the scheduler does and what the nodes hold.

``balance --source ...`` is a move (LoadBalance); ``balance pause|resume|status`` is balance control
(``cli/balance_cmd.py``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.cli.balance_cmd import BALANCE_ACTIONS, balance_control
from querycoord.cli.common import (
    add_output_option,
    client_command,
    emit,
    name_or_id,
    non_negative_int,
    positive_int,
    wide,
)
from querycoord.cli.watch import add_watch_option
from querycoord.common.wording import plural
from querycoord.console import draw
from querycoord.console.actions import (
    NODE_HEADERS,
    Refusal,
    check,
    describe,
    drain_text,
    list_trees,
    node_records,
    node_rows,
    segments_in,
    wait_task,
)
from querycoord.net.client import QueryCoordClient


def _ints(values: Sequence[str] | None, what: str) -> list[int]:
    out: list[int] = []
    for item in (x.strip() for v in (values or ()) for x in v.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"{what} must be numeric ids, got {item!r}")
        out.append(int(item))
    return out


async def collection_id(c: QueryCoordClient, ref: str | None) -> int:
    """``--collection NAME_OR_ID`` as an id (0: not given): a name is looked up in the catalog (NOT_FOUND is a
    refusal); an id is sent as it is, so tasks of a dropped collection are still found and the coordinator says
    whether an id it is asked to act on is loaded."""
    if not ref:
        return 0
    return int(ref) if ref.isdigit() else (await describe(c, ref)).collection_id


async def _balance(c: QueryCoordClient, args: argparse.Namespace) -> int:
    if args.action is not None:
        return await balance_control(c, args)
    if not args.source:
        raise ValueError("`querycoord balance` needs --source NODE (a move) or one of pause, resume, status")
    req = qc.LoadBalanceRequest(source_node_ids=_ints(args.source, "--source"), dst_node_ids=_ints(args.dst, "--dst"),
                                sealed_segment_ids=_ints(args.segments, "--segments"),
                                collection_id=await collection_id(c, args.collection))
    task_id = check(await c.query("LoadBalance", req), "load balance").task_id
    if args.no_wait:
        print(f"balance queued as task #{task_id}; follow it with `querycoord tasks --task {task_id}`")
        return 0
    tree = await wait_task(c, task_id)
    print("\n".join(draw.draw_tree(tree, max_children=args.max_children)))
    if tree.trigger.state in (qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED):
        raise Refusal(f"balance task #{task_id} failed: {tree.trigger.error}", tree.trigger.error_code)
    moved = sum(segments_in(ch.summary) for ch in tree.children if ch.kind == qc.TASK_KIND_LOAD_SEGMENT)
    print(f"balance task #{task_id} finished: {plural(moved, 'segment')} moved")
    return 0


FINISHED = (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED)


def outcome(t: qc.TaskInfo) -> str:
    """How a finished trigger ended, as users read it: DONE, FAILED or CANCELLED ("" while it runs)."""
    if t.state == qc.TASK_STATE_EXPIRED:
        return "DONE"
    if t.state == qc.TASK_STATE_CANCELLED:
        return "CANCELLED"
    if t.state == qc.TASK_STATE_FAILED:
        return "CANCELLED" if t.error_code == common_pb2.CANCELLED else "FAILED"
    return ""


def _clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def timing_line(t: qc.TaskInfo) -> str:
    """``created ..  started ..  finished ..  took 1.2s`` (what a finished tree's history record knows)."""
    parts = [f"created {_clock(t.created_ms)}", f"started {_clock(t.started_ms)}"]
    if t.finished_ms:
        parts.append(f"finished {_clock(t.finished_ms)}")
        if t.started_ms:
            parts.append(f"took {(t.finished_ms - t.started_ms) / 1000:.1f}s")
    return "  ".join(parts)


def history_record(tree: qc.TaskTree) -> dict[str, object]:
    """``draw.tree_record`` with the outcome, the error code and the timings (milliseconds since the epoch)."""
    t = tree.trigger
    return {**draw.tree_record(tree), "outcome": outcome(t),
            "error_code": common_pb2.ErrorCode.Name(t.error_code) if t.error_code in common_pb2.ErrorCode.values()
            else t.error_code,
            "created_ms": t.created_ms, "started_ms": t.started_ms, "finished_ms": t.finished_ms}


async def _show(c: QueryCoordClient, args: argparse.Namespace, task_id: int) -> int:
    got = check(await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=args.max_children)),
                f"task {task_id}")
    tree = got.tree

    def render() -> list[str]:
        lines = draw.draw_tree(tree, max_children=args.max_children)
        if tree.waits:  # queued or running on the leader: what it waits for, since when
            now = int(time.time() * 1000)
            lines.append("waiting for:")
            lines.extend(f"  {draw.wait_line(w, now)}" for w in tree.waits)
        if tree.trigger.state in FINISHED:
            lines.insert(1, f"  {outcome(tree.trigger)}  {timing_line(tree.trigger)}")
            listed, total = len(tree.children), tree.child_counts.total
            if listed < total and (not args.max_children or listed < args.max_children):
                lines.append(f"  (the history record lists {listed} of its {plural(total, 'child')})")
        return lines

    emit(args, history_record(tree), render)
    return 0


async def _history(c: QueryCoordClient, args: argparse.Namespace) -> int:
    """The task history, newest first: finished trees as etcd keeps them, whichever coordinator answers."""
    trees: list[qc.TaskTree] = []
    after = 0
    cid = await collection_id(c, args.collection)
    while not args.limit or len(trees) < args.limit:
        page = 5 if args.children else 100
        if args.limit:
            page = min(page, args.limit - len(trees))
        resp = check(await c.query("ListTasks", qc.ListTasksRequest(
            include_finished=True, states=FINISHED, newest_first=True, include_children=args.children,
            collection_id=cid, after_task_id=after, limit=page,
            children_limit=args.max_children)), "list task history")
        trees.extend(resp.trees)
        if not resp.next_after_task_id:
            break
        after = resp.next_after_task_id

    def render() -> list[str]:
        if not trees:
            return ["the task history is empty (no finished task is kept)"]
        lines: list[str] = []
        for i, tree in enumerate(trees):
            if args.children:
                lines.extend([""] if i else [])
                lines.extend(draw.draw_tree(tree, max_children=args.max_children))
                lines.append(f"  {timing_line(tree.trigger)}")
            else:
                lines.append(f"{draw.trigger_line(tree.trigger, tree.child_counts)}  "
                             f"finished {_clock(tree.trigger.finished_ms)}")
        return lines

    emit(args, [history_record(t) for t in trees], render)
    return 0


async def _cancel(c: QueryCoordClient, args: argparse.Namespace, task_id: int) -> int:
    """CancelTask, then (unless ``--no-wait``) wait for the tree to end and say how it ended."""
    got = check(await c.query("CancelTask", qc.CancelTaskRequest(task_id=task_id, reason=args.reason or "")),
                f"cancel task {task_id}")
    print(f"cancelling task #{task_id} ({got.task.summary}): what it did is rolled back")
    if args.no_wait:
        return 0
    tree = await wait_task(c, task_id)
    t = tree.trigger
    if t.state == qc.TASK_STATE_CANCELLED:
        print(f"task #{task_id} CANCELLED: {t.error}")
        return 0
    raise Refusal(f"task #{task_id} ended {outcome(t)} before the cancel took effect"
                  + (f": {t.error}" if t.error else ""), common_pb2.CONFLICT)


class _ActionOrId(tuple[str, ...]):
    """The choices of ``tasks ACTION``: ``show``, ``cancel``, or a task id (``tasks ID`` is ``tasks show ID``).

    argparse checks a positional against its choices with ``in``: this container also holds every number, while
    listing (help, shell completion) only the two words."""

    def __contains__(self, value: object) -> bool:
        return super().__contains__(value) or (isinstance(value, str) and value.isdigit())


TASK_ACTIONS = _ActionOrId(("show", "cancel"))


def _action_or_id(text: str) -> str:
    """A ``type=`` for ``tasks ACTION``: a task id must be positive (a usage error naming it otherwise)."""
    if text.isdigit():
        positive_int(text)
    return text


def _resolve_action(args: argparse.Namespace) -> None:
    """``tasks ID`` becomes ``tasks show ID``; ``--watch`` never repeats a cancel."""
    if args.action is not None and args.action.isdigit():
        if args.id is not None:
            raise ValueError(f"unexpected argument {args.id} after task id {args.action}")
        args.action, args.id = "show", int(args.action)
    if args.action == "cancel" and getattr(args, "watch", False):
        raise ValueError("--watch goes with show and list commands, not with `tasks cancel`")


async def _tasks(c: QueryCoordClient, args: argparse.Namespace) -> int:
    _resolve_action(args)
    if args.action == "cancel":
        if args.id is None:
            raise ValueError("`querycoord tasks cancel` needs a task id: `querycoord tasks cancel ID`")
        return await _cancel(c, args, args.id)
    if args.reason is not None or args.no_wait:
        raise ValueError("--reason and --no-wait go with `querycoord tasks cancel ID`")
    if args.action == "show":
        if args.id is None:
            raise ValueError("`querycoord tasks show` needs a task id: `querycoord tasks show ID`")
        return await _show(c, args, args.id)
    if args.id is not None:
        raise ValueError(f"unexpected argument {args.id}: did you mean `querycoord tasks show {args.id}`?")
    if args.task:
        return await _show(c, args, args.task)
    if args.history:
        return await _history(c, args)
    trees = await list_trees(c, include_finished=args.all, include_children=args.children or wide(args),
                             collection_id=await collection_id(c, args.collection),
                             children_limit=args.max_children)

    def render() -> list[str]:
        if not trees:
            return ["no task is queued or running" + ("" if args.all else " (--all also lists recently finished ones)")]
        if not args.children:
            return [draw.trigger_line(tree.trigger, tree.child_counts) + (_child_nodes(tree) if wide(args) else "")
                    for tree in trees]
        lines: list[str] = []
        for i, tree in enumerate(trees):
            lines.extend([""] if i else [])
            lines.extend(draw.draw_tree(tree, max_children=args.max_children))
        return lines

    emit(args, [draw.tree_record(t) for t in trees], render)
    return 0


def _child_nodes(tree: qc.TaskTree) -> str:
    """``  nodes 3,4 (children #12-#15)``: where a trigger's listed children run (``tasks -o wide``)."""
    nodes = sorted({ch.node_id for ch in tree.children if ch.node_id})
    ids = sorted(ch.task_id for ch in tree.children)
    if not ids:
        return ""
    span = f"#{ids[0]}" if len(ids) == 1 else f"#{ids[0]}-#{ids[-1]}"
    return f"  nodes {','.join(map(str, nodes)) or '-'} (children {span})"


WIDE_NODE_HEADERS = (*NODE_HEADERS, "RE-REPLICATES AT")


async def _nodes(c: QueryCoordClient, args: argparse.Namespace) -> int:
    resp = check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes")

    def render() -> list[str]:
        if not resp.nodes:
            return ["no query node is registered; start one with `querycoord querynode` (or use `querycoord up`)"]
        if wide(args):  # the drain with what it waits for; when a lost node's copies are made again elsewhere
            rows = [[*row[:-1], drain_text(n, why=True), _clock(n.rereplicate_at_ms)]
                    for row, n in zip(node_rows(resp.nodes), resp.nodes, strict=True)]
            return draw.table(WIDE_NODE_HEADERS, rows, right=(0, 3, 4, 6))
        return draw.table(NODE_HEADERS, node_rows(resp.nodes), right=(0, 3, 4, 6))

    emit(args, node_records(resp.nodes), render)
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("balance", parents=client,
                       help="move sealed segments off query nodes (--source); pause|resume|status: balance control")
    p.add_argument("action", nargs="?", choices=BALANCE_ACTIONS,
                   help="pause: no optional move is planned (repairs still run); resume; status")
    p.add_argument("--source", nargs="+", help="source node ids (a move)")
    p.add_argument("--dst", nargs="+", help="destination node ids (default: any other online node)")
    p.add_argument("--segments", nargs="+", help="segment ids to move (default: every segment of the sources)")
    p.add_argument("--collection", type=name_or_id, metavar="NAME_OR_ID",
                   help="only segments of this collection (name or id)")
    p.add_argument("--no-wait", action="store_true", help="return once the balance is queued")
    p.add_argument("--max-children", type=non_negative_int, default=20,
                   help="children drawn at most (0: all; default 20)")
    add_output_option(p)  # pause|resume|status
    p.set_defaults(func=client_command(_balance))

    p = sub.add_parser("tasks", parents=client,
                       help="task trees: queued and running (--all: finished ones too; --history: finished ones, "
                            "newest first; `tasks show ID`: one tree; `tasks cancel ID`: cancel a trigger)")
    p.add_argument("action", nargs="?", type=_action_or_id, choices=TASK_ACTIONS,
                   metavar="{show,cancel,ID}",
                   help="show: draw the tree of task ID (trigger or child); cancel: cancel trigger ID (a load, a "
                        "balance, a repair) and roll back what it did; a task id alone: `tasks show ID`")
    p.add_argument("id", nargs="?", type=positive_int, help="the task id of `show` or `cancel`")
    p.add_argument("--reason", help="cancel: why (kept in the task history with who asked)")
    p.add_argument("--no-wait", action="store_true", help="cancel: return once the cancel is recorded")
    p.add_argument("--all", action="store_true", help="include finished trees (the task history)")
    p.add_argument("--history", action="store_true",
                   help="finished trees from the task history, newest first (any coordinator answers)")
    p.add_argument("--limit", type=non_negative_int, default=50,
                   help="trees listed by --history at most (0: all; default 50)")
    p.add_argument("--children", action="store_true", help="draw the children of each trigger")
    p.add_argument("--task", type=non_negative_int, default=0, help="draw the tree of this task (trigger or child id)")
    p.add_argument("--collection", type=name_or_id, metavar="NAME_OR_ID",
                   help="only tasks of this collection (name or id)")
    p.add_argument("--max-children", type=non_negative_int, default=50,
                   help="children drawn per tree at most (0: all; default 50)")
    add_output_option(p)
    add_watch_option(p)
    p.set_defaults(func=client_command(_tasks))

    p = sub.add_parser("nodes", parents=client, help="query nodes and what they hold")
    add_output_option(p)
    add_watch_option(p)
    p.set_defaults(func=client_command(_nodes))
