"""Text drawing for the CLI and the demo: task trees, tables, a load progress bar, replicas and streams.

Kept apart from the commands so the demo draws exactly what ``querycoord
tasks`` and ``querycoord collection load`` draw, and so the drawing can be
tested without a cluster. Nothing here talks to the network.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from proto import data_pb2
from proto import querycoord_pb2 as qc
from proto import stream_pb2 as sp
from querycoord.common import wording
from querycoord.console.draw_progress import (
    progress_line,
    progress_record,
    stream_progress_cells,
    task_progress_cells,
    task_progress_record,
)
from querycoord.console.tables import headers_shown

MIB = 1 << 20

# TaskKind -> the name users know from Milvus's task.go (LoadCollection, LoadSegment, ...).
KIND_NAMES: dict[int, str] = {
    qc.TASK_KIND_UNSPECIFIED: "Unspecified",
    qc.TASK_KIND_LOAD_COLLECTION: "LoadCollection",
    qc.TASK_KIND_RELEASE_COLLECTION: "ReleaseCollection",
    qc.TASK_KIND_LOAD_PARTITION: "LoadPartition",
    qc.TASK_KIND_RELEASE_PARTITION: "ReleasePartition",
    qc.TASK_KIND_LOAD_SEGMENT: "LoadSegment",
    qc.TASK_KIND_RELEASE_SEGMENT: "ReleaseSegment",
    qc.TASK_KIND_WATCH_DM_CHANNEL: "WatchDmChannel",
    qc.TASK_KIND_WATCH_DELTA_CHANNEL: "WatchDeltaChannel",
    qc.TASK_KIND_WATCH_QUERY_CHANNEL: "WatchQueryChannel",
    qc.TASK_KIND_HANDOFF: "Handoff",
    qc.TASK_KIND_LOAD_BALANCE: "LoadBalance",
    qc.TASK_KIND_REPAIR: "Repair",
    qc.TASK_KIND_UPDATE_LOAD_CONFIG: "UpdateLoadConfig",
    qc.TASK_KIND_RELEASE_DM_CHANNEL: "ReleaseDmChannel",
}

# What users read for each state. The proto keeps Milvus's names, in which EXPIRED is a task that finished
# successfully: users read DONE. A trigger's own DONE is the commit point of its plan while its children still
# run: users read DOING (a child's DONE is its success).
STATE_NAMES: dict[int, str] = {
    qc.TASK_STATE_UNDO: "UNDO",
    qc.TASK_STATE_DOING: "DOING",
    qc.TASK_STATE_DONE: "DONE",
    qc.TASK_STATE_EXPIRED: "DONE",
    qc.TASK_STATE_FAILED: "FAILED",
    qc.TASK_STATE_CANCELLED: "CANCELLED",
}


CONDITION_NAMES: dict[int, str] = {
    qc.TRIGGER_CONDITION_UNSPECIFIED: "",
    qc.TRIGGER_CONDITION_HANDOFF: "handoff",
    qc.TRIGGER_CONDITION_LOAD_BALANCE: "load balance",
    qc.TRIGGER_CONDITION_GRPC_REQUEST: "request",
    qc.TRIGGER_CONDITION_NODE_DOWN: "node down",
    qc.TRIGGER_CONDITION_CHECKER: "checker",
}


def kind_name(kind: int) -> str:
    return KIND_NAMES.get(kind, f"Kind{kind}")


def state_name(state: int, *, trigger: bool = False) -> str:
    """The state as users read it (see ``STATE_NAMES``); ``trigger``: the state of a trigger, not a child."""
    if trigger and state == qc.TASK_STATE_DONE:
        return "DOING"
    return STATE_NAMES.get(state, f"STATE{state}")


def _shorten(text: str, width: int) -> str:
    """One line of at most ``width`` characters: errors can be long and multi-line."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


# ----- task trees -----------------------------------------------------------------------------------------------
def trigger_line(t: qc.TaskInfo, counts: qc.ChildStateCounts | None = None, *, error_width: int = 160) -> str:
    """``#id Kind STATE collection C (why) children N (d done, ...) error: ...`` for one trigger."""
    parts = [f"#{t.task_id}", kind_name(t.kind), state_name(t.state, trigger=True)]
    if t.collection_id:
        parts.append(f"collection {t.collection_id}")
    why = CONDITION_NAMES.get(t.trigger_condition, "")
    if why and t.trigger_condition != qc.TRIGGER_CONDITION_GRPC_REQUEST and t.kind != qc.TASK_KIND_LOAD_BALANCE:
        parts.append(f"({why})")
    if counts is not None and counts.total:
        by_state = [(counts.undo, "undo"), (counts.doing, "doing"), (counts.done + counts.expired, "done"),
                    (counts.failed, "failed")]
        detail = ", ".join(f"{n} {name}" for n, name in by_state if n)
        parts.append(f"children {counts.total}" + (f" ({detail})" if detail else ""))
    if t.summary and t.kind not in (qc.TASK_KIND_LOAD_COLLECTION, qc.TASK_KIND_RELEASE_COLLECTION):
        parts.append(t.summary)
    if t.error:
        parts.append(f"error: {_shorten(t.error, error_width)}")
    return "  ".join(parts)


def child_line(c: qc.TaskInfo, *, summary_width: int = 60, error_width: int = 120) -> str:
    """``#id Kind summary node N STATE retries R replaces #X excluded [..] error: ...`` for one child."""
    parts = [f"#{c.task_id}", kind_name(c.kind)]
    if c.summary:
        parts.append(_shorten(c.summary, summary_width))
    parts.append(f"node {c.node_id}" if c.node_id else "no node")
    parts.append(state_name(c.state))
    parts.append(f"retries {max(0, c.retry_count - 1)}")
    if c.replaces_task_id:
        parts.append(f"replaces #{c.replaces_task_id}")
    if c.excluded_node_ids:
        parts.append(f"excluded {list(c.excluded_node_ids)}")
    if c.error:
        parts.append(f"last error: {_shorten(c.error, error_width)}")
    return "  ".join(parts)


def draw_tree(
    tree: qc.TaskTree,
    *,
    only: Callable[[qc.TaskInfo], bool] | None = None,
    max_children: int = 0,
    hidden_note: str = "other children",
) -> list[str]:
    """The tree as lines: the trigger, then its children joined by box-drawing branches.

    ``only`` keeps the children worth showing (e.g. the rescheduled ones),
    ``max_children`` caps how many are drawn (0: all); whatever is left out
    is counted on a last branch, so the drawing never hides that it is partial.
    """
    lines = [trigger_line(tree.trigger, tree.child_counts)]
    kids = [c for c in tree.children if only is None or only(c)]
    shown = kids[:max_children] if max_children else kids
    hidden = max(len(tree.children), tree.child_counts.total) - len(shown)
    items = [child_line(c) for c in shown]
    if hidden > 0:
        items.append(f"… {hidden} {hidden_note}")
    for i, text in enumerate(items):
        last = i == len(items) - 1
        lines.append(("└── " if last else "├── ") + text)
    return lines


def task_record(t: qc.TaskInfo, *, trigger: bool = False) -> dict[str, object]:
    """One task as ``tasks -o json`` prints it: the names the drawing uses, ids and numbers as they are."""
    record: dict[str, object] = {
        "task_id": t.task_id, "kind": kind_name(t.kind), "state": state_name(t.state, trigger=trigger),
        "collection_id": t.collection_id, "node_id": t.node_id, "summary": t.summary, "error": t.error,
    }
    if trigger:
        record["trigger_condition"] = CONDITION_NAMES.get(t.trigger_condition, "")
    else:
        record.update(retries=max(0, t.retry_count - 1), replaces_task_id=t.replaces_task_id,
                      excluded_node_ids=list(t.excluded_node_ids))
    return record


def tree_record(tree: qc.TaskTree) -> dict[str, object]:
    """A trigger with its children (those the answer carried), the count of its children by state, and what it
    waits for (queued or running on the leader; empty otherwise)."""
    counts = tree.child_counts
    return {
        **task_record(tree.trigger, trigger=True),
        "child_counts": {"total": counts.total, "undo": counts.undo, "doing": counts.doing,
                         "done": counts.done + counts.expired, "failed": counts.failed},
        "children": [task_record(c) for c in tree.children],
        "waits": [wait_record(w) for w in getattr(tree, "waits", ())],
    }


def wait_record(w: qc.TaskWait) -> dict[str, object]:
    """One thing a trigger waits for, as ``tasks show -o json`` prints it (times in unix ms, 0: unknown)."""
    return {"kind": qc.WaitKind.Name(w.kind).removeprefix("WAIT_KIND_").lower() if w.kind in qc.WaitKind.values()
            else str(w.kind), "text": w.text, "since_ms": w.since_ms, "until_ms": w.until_ms,
            "child_task_id": w.child_task_id, "node_id": w.node_id, "attempt": w.attempt, "error": w.error,
            "blocking_task_id": w.blocking_task_id}


def span(seconds: float) -> str:
    """A duration as people read it: ``0.4s``, ``12s``, ``3m``, ``2h``."""
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    return f"{s:.0f}s" if s < 120 else f"{s // 60:.0f}m" if s < 7200 else f"{s // 3600:.0f}h"


def wait_line(w: qc.TaskWait, now_ms: int, *, width: int = 240) -> str:
    """``<what it waits for> (for 3.1s[, next attempt in 0.2s])``."""
    when = [f"for {span((now_ms - w.since_ms) / 1000)}"] if w.since_ms else []
    if w.until_ms:
        word = "next attempt" if w.kind == qc.WAIT_KIND_RETRY else "ends"
        when.append(f"{word} in {span((w.until_ms - now_ms) / 1000)}")
    return _shorten(w.text, width) + (f" ({', '.join(when)})" if when else "")


def is_rescheduled(c: qc.TaskInfo) -> bool:
    """A child created by rescheduling another (it names the one it replaces)."""
    return c.replaces_task_id != 0


# ----- tables ---------------------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, right: Iterable[int] = ()) -> list[str]:
    """Columns padded to their widest cell; the columns in ``right`` (numbers) are right-aligned. Without the
    header and its rule under ``--no-headers`` (``tables.headers``)."""
    body = [[str(x) for x in r] for r in rows]
    shown = headers_shown()
    widths = [len(h) if shown else 0 for h in headers]
    for r in body:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    align_right = set(right)

    def fmt(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in align_right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    head = [fmt(list(headers)), fmt(["─" * w for w in widths])] if shown else []
    return [*head, *(fmt(r) for r in body)]


def mib(n: int) -> str:
    """Bytes as a size (``common.wording.mib``): one decimal under 10 MiB, whole MiB above, KiB under 1 MiB."""
    return wording.mib(n)


# ----- replicas -------------------------------------------------------------------------------------------------
REPLICA_HEADERS = ("REPLICA", "NODES", "LOADED", "SEGMENTS", "DM CHANNELS")


def replica_records(replicas: Iterable[data_pb2.ReplicaInfo]) -> list[dict[str, Any]]:
    """Replicas (GetReplicas) as ``querycoord replicas -o json`` prints them, by replica id."""
    return [{"id": r.replica_id, "collection_id": r.collection_id, "node_ids": sorted(r.node_ids),
             "loaded_percentage": r.in_memory_percentage, "segments": r.segment_count,
             "dm_channels": list(r.dm_channels)} for r in sorted(replicas, key=lambda r: r.replica_id)]


def replica_rows(records: Sequence[dict[str, Any]], *, collection: bool = False) -> list[list[object]]:
    """``replica_records`` as rows under ``REPLICA_HEADERS`` (``collection``: led by the collection id, under
    ``("COLLECTION", *REPLICA_HEADERS)``); nodes comma-separated, "-" for a replica without a node."""
    rows: list[list[object]] = []
    for r in records:
        row: list[object] = [r["id"], ",".join(map(str, r["node_ids"])) or "-", f"{r['loaded_percentage']}%",
                             f"{r['segments']:,}", len(r["dm_channels"])]
        rows.append([r["collection_id"], *row] if collection else row)
    return rows


# ----- progress bar ---------------------------------------------------------------------------------------------
def bar(percentage: float, width: int = 30) -> str:
    """``[██████░░░░]``: full blocks for the loaded part."""
    p = max(0.0, min(100.0, percentage))
    full = round(width * p / 100)
    return "[" + "█" * full + "░" * (width - full) + "]"


class ProgressBar:
    """A one-line progress bar that redraws in place on a terminal and prints sparse lines otherwise.

    Why two modes: on a terminal ``\\r`` redraws are the familiar bar; in a
    pipe or a log (``make demo | tee``, tests) carriage returns would leave
    one huge line, so a line is printed only when the percentage changed and
    at most every ``interval`` seconds, plus the final one.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None, width: int = 30, interval: float = 1.0,
                 tty: bool | None = None, indent: str = ""):
        self.label = label
        self.stream = stream or sys.stdout
        self.width = width
        self.interval = interval
        self.tty = self.stream.isatty() if tty is None else tty
        self.indent = indent
        self.pct = -1
        self.note = ""
        self._printed_pct = -1
        self._printed_text = ""
        self._last_print = float("-inf")
        self._on_line = False

    def _text(self) -> str:
        note = f"  {self.note}" if self.note else ""
        return f"{self.indent}{self.label} {bar(max(self.pct, 0), self.width)} {max(self.pct, 0):3d}%{note}"

    def update(self, pct: int, note: str = "", *, force: bool = False) -> None:
        """Show ``pct``; in a pipe only if it changed and ``interval`` passed (or ``force``)."""
        changed = pct != self.pct or note != self.note
        self.pct, self.note = pct, note
        if self.tty:
            if changed or force:
                self.stream.write("\r\x1b[2K" + self._text())
                self.stream.flush()
                self._on_line = True
            return
        now = time.monotonic()
        if force or (pct != self._printed_pct and now - self._last_print >= self.interval):
            self._print_line()
            self._last_print = now

    def _print_line(self) -> None:
        text = self._text()
        self.stream.write(text + "\n")
        self.stream.flush()
        self._printed_pct, self._printed_text = self.pct, text

    def message(self, text: str) -> None:
        """Print a line above the bar (an event during the load) and redraw the bar under it."""
        if self.tty and self._on_line:
            self.stream.write("\r\x1b[2K")
        self.stream.write(text + "\n")
        if self.tty and self.pct >= 0:
            self.stream.write(self._text())
        self.stream.flush()

    def finish(self, note: str | None = None) -> None:
        """Draw the final state once (whatever the throttle) and end the line."""
        if note is not None:
            self.note = note
        if self.tty:
            self.stream.write("\r\x1b[2K" + self._text() + "\n")
        elif self._text() != self._printed_text:
            self._print_line()
        self.stream.flush()
        self._on_line = False


# ----- streams --------------------------------------------------------------------------------------------------
STREAM_STATE_NAMES: dict[int, str] = {
    sp.STREAM_STATE_UNSPECIFIED: "unknown",  # a standby's answer: it has no task table
    sp.STREAM_UNDEPLOYED: "undeployed",
    sp.STREAM_DEPLOYING: "deploying",
    sp.STREAM_RUNNING: "running",
    sp.STREAM_STOPPED_BY_USER: "stopped",
    sp.STREAM_STOPPED_BY_ERROR: "stopped by error",
}


STREAM_KIND_NAMES: dict[int, str] = {
    sp.TASK_KIND_UNSPECIFIED: "?",
    sp.TRIGGER_READER: "trigger reader",
    sp.CALC_READER: "calc reader",
    sp.TRIGGER: "trigger",
    sp.RUNNER: "runner",
}


# A task the leader planned but has not heard of: PENDING while its deploy waits for a heartbeat of its host,
# DEPLOYED once handed out (until the node reports it).
TASK_STATUS_NAMES: dict[int, str] = {
    sp.TASK_STATUS_UNSPECIFIED: "DEPLOYED",
    sp.TASK_INIT: "INIT",
    sp.TASK_RUNNING: "RUNNING",
    sp.TASK_FAILED: "FAILED",
    sp.TASK_STOPPED: "STOPPED",
}


# Readers first (their vgroups feed the rest), then the trigger, then the runners deploy by deploy.
_KIND_ORDER = {sp.TRIGGER_READER: 0, sp.CALC_READER: 1, sp.TRIGGER: 2, sp.RUNNER: 3}


def stream_state_name(state: int) -> str:
    return STREAM_STATE_NAMES.get(state, f"state {state}")


def stream_task_status(row: sp.TaskRow) -> str:
    """The task's state as users read it (``TASK_STATUS_NAMES``; PENDING: not handed to a node yet)."""
    if row.pending:
        return "PENDING"
    return TASK_STATUS_NAMES.get(row.status, f"STATUS{row.status}")


def _in(ms: int, now: float) -> str:
    """``in 12s`` / ``now`` for a unix-ms time relative to ``now`` (seconds)."""
    left = ms / 1000 - now
    return f"in {left:.0f}s" if left >= 0.5 else "now"


def _ago(ms: int, now: float) -> str:
    return f"{max(0.0, now - ms / 1000):.1f}s ago" if ms else "never"


def stream_activity(info: sp.StreamStatusInfo, show: sp.ShowStreamsResponse, now: float) -> str:
    """What the leader's stream manager is doing about this stream, in one line.

    Why a sentence and not a state: the state says where the stream is, an
    operator asks what happens next (a retry and when, a deploy waiting for
    which hosts, a new leader still listening to the nodes before it acts).
    """
    n = len(info.tasks)
    if show.watching:
        until = f" (until {_in(show.watch_until_ms, now)} at the latest)" if show.watch_until_ms else ""
        return (f"WATCH: a new leader listens to the stream nodes' reports{until}, then adopts the tasks as they "
                "run or redeploys the stream")
    if info.state == sp.STREAM_STATE_UNSPECIFIED:
        return "unknown: answered from etcd by a standby, which has no task table"
    if info.state == sp.STREAM_STOPPED_BY_USER:
        return f"stopped by the user; `querycoord stream start {info.stream.name}` deploys it again"
    if info.state == sp.STREAM_STOPPED_BY_ERROR:
        retry = f"retry #{info.retries} {_in(info.next_retry_ms, now)}" if info.next_retry_ms else "no retry planned"
        return f"stopped by error {info.stop_error_code}: {_shorten(info.stop_reason, 120)}; {retry}"
    if info.state == sp.STREAM_UNDEPLOYED:
        if info.plan_queued and info.wait_reason:
            return f"waiting for a plan: {_shorten(info.wait_reason, 120)} (it is planned once one reports)"
        if info.plan_queued and not show.live_snode_ids:
            return "waiting for a plan: no snode is live (start the stream node of an snode)"
        return "waiting for a plan: the next stream heartbeat plans and deploys it"
    if info.state == sp.STREAM_DEPLOYING:
        pending = sum(1 for t in info.tasks if t.pending)
        counts: dict[str, int] = {}
        for t in info.tasks:
            if not t.pending:
                counts[stream_task_status(t)] = counts.get(stream_task_status(t), 0) + 1
        detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        waits = (f"{pending} of {wording.plural(n, 'task')} wait for their host's heartbeat" if pending
                 else f"{wording.plural(n, 'task')} handed out")
        waiting = f"; {_shorten(info.wait_reason, 120)}" if info.wait_reason else ""
        return f"deploying (deploy #{info.deploy_times}): {waits}" + (f"; {detail}" if detail else "") + waiting
    if info.state == sp.STREAM_RUNNING:
        if info.wait_reason:
            return f"running: {wording.plural(n, 'task')} RUNNING; {_shorten(info.wait_reason, 120)}"
        return f"running: {wording.plural(n, 'task')} RUNNING, nothing to do"
    return stream_state_name(info.state)


def stream_header(info: sp.StreamStatusInfo) -> str:
    """``stream s1 (id 3): running  source db vgroups 1,2  main snode 1  1 scan plan, 3 runner deploys of 2
    deployed 1x``."""
    d = info.stream
    source = f"source {d.source_db or '-'} vgroups {','.join(map(str, d.source_vgroup_ids)) or '-'}"
    if d.trigger_vgroup_id:
        source += f" (trigger vgroup {d.trigger_vgroup_id})"
    return (f"stream {d.name} (id {d.id}): {stream_state_name(info.state)}  {source}  main snode {d.main_snode_id}"
            f"  {d.num_calc_scan_plans} scan plan{'s' if d.num_calc_scan_plans != 1 else ''}, {d.runner_deploys} "
            f"runner deploys of {d.num_calc_subplans}  deployed {info.deploy_times}x")


def stream_checkpoint(info: sp.StreamStatusInfo, now: float) -> str:
    """``#12 committed 8.0s ago; round #14 in flight for 0.4s``: the consensus checkpoint and the round in flight."""
    text = f"#{info.checkpoint_id} committed {_ago(info.checkpoint_ms, now)}" if info.checkpoint_id else "none yet"
    if info.checkpoint_round_id:
        age = max(0.0, now - info.checkpoint_round_started_ms / 1000)
        text += f"; round #{info.checkpoint_round_id} in flight for {age:.1f}s"
    return text


STREAM_TASK_HEADERS = ("TASK", "KIND", "NODE", "VGROUP", "SNODE", "DEPLOY", "SID", "STATE", "HEARD", "PROCESSED",
                       "LAG")


def _task_order(row: sp.TaskRow) -> tuple[int, int, int, int]:
    t = row.task
    return (_KIND_ORDER.get(t.kind, 9), t.deploy_id, t.task_idx, t.task_id)


def stream_task_rows(info: sp.StreamStatusInfo, now: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for r in sorted(info.tasks, key=_task_order):
        t = r.task
        kind = STREAM_KIND_NAMES.get(t.kind, str(t.kind)) + (" (top)" if t.top else "")
        if t.kind == sp.CALC_READER:
            kind += f" plan {t.scan_plan_idx}"
        state = stream_task_status(r)
        if r.error_message:
            state += f" ({r.error_code}: {_shorten(r.error_message, 60)})"
        rows.append([f"#{t.task_id}", kind, t.node_id or "-", t.vgroup_id or "-", t.snode_id or "-",
                     f"{t.deploy_id}/{t.task_idx}" if t.kind == sp.RUNNER else "-", t.sid, state,
                     _ago(r.last_heard_ms, now), *task_progress_cells(r)])
    return rows


def draw_stream(info: sp.StreamStatusInfo, show: sp.ShowStreamsResponse, now: float, *, indent: str = "  ") -> list[
        str]:
    """One stream as ``stream show`` draws it: a header, what the manager does, then its tasks (readers, trigger,
    runners by deploy) with node, vgroup or snode, SID and state."""
    lines = [stream_header(info), f"{indent}manager: {stream_activity(info, show, now)}",
             f"{indent}progress: {progress_line(info, now, checkpoint=False)}",
             f"{indent}checkpoint: {stream_checkpoint(info, now)}"]
    if info.tasks:
        table_ = table(STREAM_TASK_HEADERS, stream_task_rows(info, now), right=(2, 3, 4, 6, 10))
        lines.extend(indent + line for line in table_)
    return lines


def task_row_record(r: sp.TaskRow) -> dict[str, object]:
    t = r.task
    return {"task_id": t.task_id, "kind": STREAM_KIND_NAMES.get(t.kind, str(t.kind)), "sid": t.sid,
            "node_id": t.node_id, "vgroup_id": t.vgroup_id, "snode_id": t.snode_id, "deploy_id": t.deploy_id,
            "task_idx": t.task_idx, "scan_plan_idx": t.scan_plan_idx, "top": t.top, "state": stream_task_status(r),
            "pending": r.pending, "last_heard_ms": r.last_heard_ms, "error_code": r.error_code,
            "error": r.error_message, **task_progress_record(r), "checkpoint_id": r.checkpoint_id}


def stream_record(info: sp.StreamStatusInfo, show: sp.ShowStreamsResponse, now: float) -> dict[str, object]:
    """One stream as ``stream show -o json`` prints it: its definition, state, what the manager does, its tasks."""
    d = info.stream
    return {
        "id": d.id, "name": d.name, "state": stream_state_name(info.state), "source_db": d.source_db,
        "source_vgroup_ids": list(d.source_vgroup_ids), "trigger_vgroup_id": d.trigger_vgroup_id,
        "num_calc_scan_plans": d.num_calc_scan_plans, "num_calc_subplans": d.num_calc_subplans,
        "runner_deploys": d.runner_deploys, "main_snode_id": d.main_snode_id, "user_stopped": d.user_stopped,
        "create_ms": d.create_ms, "update_ms": d.update_ms, "stop_ms": d.stop_ms, "start_from_ms": d.start_from_ms,
        "deploy_times": info.deploy_times,
        "stop_error_code": info.stop_error_code, "stop_reason": info.stop_reason, "next_retry_ms": info.next_retry_ms,
        "retries": info.retries, "plan_queued": info.plan_queued, "wait_reason": info.wait_reason,
        "watching": show.watching, **progress_record(info, now),
        "checkpoint_id": info.checkpoint_id, "checkpoint_ms": info.checkpoint_ms,
        "checkpoint_round_id": info.checkpoint_round_id,
        "checkpoint_round_started_ms": info.checkpoint_round_started_ms,
        "activity": stream_activity(info, show, now), "tasks": [task_row_record(r) for r in
                                                                sorted(info.tasks, key=_task_order)],
    }


# The one-row-per-stream table (``stream show --summary``, ``make demo``): each column a fact the demo follows.
STREAM_SUMMARY_HEADERS = ("STREAM", "ID", "STATE", "SNODE", "TASK IDS", "TRIGGER snode/SID",
                          "RUNNER DEPLOYS snode/SID", "PROCESSED", "LAG")


def runner_deploys(info: sp.StreamStatusInfo) -> dict[int, list[sp.TaskId]]:
    """The stream's runners by deploy, each deploy in DAG order."""
    deploys: dict[int, list[sp.TaskId]] = {}
    for t in sorted(info.tasks, key=lambda r: (r.task.deploy_id, r.task.task_idx)):
        if t.task.kind == sp.RUNNER:
            deploys.setdefault(t.task.deploy_id, []).append(t.task)
    return deploys


def id_span(ids: Iterable[int]) -> str:
    """``#1-#11``, or ``#1-#5,#12`` when the ids are not one run."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(f"#{r[0]}" if len(r) == 1 else f"#{r[0]}-#{r[-1]}" for r in runs)


def stream_summary_rows(show: sp.ShowStreamsResponse) -> list[list[object]]:
    rows: list[list[object]] = []
    for info in sorted(show.streams, key=lambda s: s.stream.id):
        trig = next((t.task for t in info.tasks if t.task.kind == sp.TRIGGER), None)
        state = sp.StreamState.Name(info.state).removeprefix("STREAM_").lower()
        deploys = runner_deploys(info)
        rows.append([info.stream.name, info.stream.id, state, info.stream.main_snode_id,
                     id_span(t.task.task_id for t in info.tasks) or "-",
                     f"{trig.snode_id}/{trig.sid}" if trig else "-",
                     " ".join(f"{ts[0].snode_id}/{max(t.sid for t in ts)}" for _, ts in sorted(deploys.items()))
                     or "-", *stream_progress_cells(info)])
    return rows


def stream_summary(show: sp.ShowStreamsResponse) -> list[str]:
    return table(STREAM_SUMMARY_HEADERS, stream_summary_rows(show), right=(1, 3, 4, 8))


# ----- snodes ---------------------------------------------------------------------------------------------------
SNODE_HEADERS = ("SNODE", "NODE", "REPLICA", "LIVE", "MAIN OF", "STATE")


def snode_records(show: sp.ShowStreamsResponse, *, liveness_known: bool = True) -> list[dict[str, object]]:
    """Snodes as ``snode show -o json`` prints them: where each runs, its replica, whether the leader hears it
    (None when a standby answered) and how many streams it is the main snode of."""
    live = set(show.live_snode_ids)
    mains: dict[int, int] = {}
    for info in show.streams:
        mains[info.stream.main_snode_id] = mains.get(info.stream.main_snode_id, 0) + 1
    return [{"id": s.id, "node_id": s.node_id, "replica_id": s.replica_id,
             "live": (s.id in live) if liveness_known else None, "main_streams": mains.get(s.id, 0),
             "dropping": s.dropping, "create_ms": s.create_ms} for s in sorted(show.snodes, key=lambda s: s.id)]


def snode_rows(records: Sequence[dict[str, object]]) -> list[list[object]]:
    def live(v: object) -> str:
        return "?" if v is None else ("yes" if v else "no")

    return [[r["id"], r["node_id"], r["replica_id"] or "-", live(r["live"]), r["main_streams"],
             "dropping" if r["dropping"] else "ok"] for r in records]
