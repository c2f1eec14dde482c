"""Text drawing for the CLI and the demo: task trees, tables and a load progress bar.

Kept apart from the commands so the demo draws exactly what ``querycoord
tasks`` and ``querycoord collection load`` draw, and so the drawing can be
tested without a cluster. Nothing here talks to the network.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TextIO

from proto import querycoord_pb2 as qc

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
    """A trigger with its children (those the answer carried) and the count of its children by state."""
    counts = tree.child_counts
    return {
        **task_record(tree.trigger, trigger=True),
        "child_counts": {"total": counts.total, "undo": counts.undo, "doing": counts.doing,
                         "done": counts.done + counts.expired, "failed": counts.failed},
        "children": [task_record(c) for c in tree.children],
    }


def is_rescheduled(c: qc.TaskInfo) -> bool:
    """A child created by rescheduling another (it names the one it replaces)."""
    return c.replaces_task_id != 0


# ----- tables ---------------------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, right: Iterable[int] = ()) -> list[str]:
    """Columns padded to their widest cell; the columns in ``right`` (numbers) are right-aligned."""
    body = [[str(x) for x in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in body:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    align_right = set(right)

    def fmt(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in align_right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    return [fmt(list(headers)), fmt(["─" * w for w in widths]), *(fmt(r) for r in body)]


def mib(n: int) -> str:
    """Bytes as MiB with one decimal under 10 MiB (segments of a demo are small), else whole MiB."""
    v = n / MIB
    if v == 0:
        return "0 MiB"
    return f"{v:.1f} MiB" if v < 10 else f"{v:,.0f} MiB"


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
