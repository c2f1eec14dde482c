"""Copies moved during a rolling restart, counted from the task history (ListTasks with include_finished).

A move is one copy (a segment, or a DM channel) loaded onto a node by a trigger that is not a client's request:
a LoadBalance or a checker repair. Each finished trigger's record keeps its children (the drill starts its
coordinators with a ``--history-children`` large enough to keep them all); every LOAD_SEGMENT child that succeeded
counts the segments it loaded, every WATCH_DM_CHANNEL child the channels it watched. By the trigger:

* **drain**: what the checker queues to empty a draining node: its LoadBalances (trigger condition CHECKER) and
  its repairs that move DM channels "off draining node N";
* **recovery**: the other checker repairs (copies a node lost, e.g. with the node gone before they were moved)
  and NODE_DOWN balances;
* **balance**: auto or user balances (the auto balance fills a returned, empty node).

``moves`` is their sum. Loads and releases of collections by clients are not moves.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from proto import querycoord_pb2 as qc

RECOVERY, BALANCE, DRAIN = "recovery", "balance", "drain"
_DONE = (qc.TASK_STATE_DONE, qc.TASK_STATE_EXPIRED)
_LOADED = re.compile(r"^load (\d+) segments")
_REASON = re.compile(r"^balance \((\w+)\)")
_DRAINING = "off draining node"


def kind_of(trigger: qc.TaskInfo) -> str | None:
    """``RECOVERY``, ``BALANCE`` or ``DRAIN`` for a trigger that moves copies; None for a client's request."""
    if trigger.kind == qc.TASK_KIND_REPAIR:
        return DRAIN if _DRAINING in trigger.summary else RECOVERY
    if trigger.kind != qc.TASK_KIND_LOAD_BALANCE:
        return None
    if trigger.trigger_condition == qc.TRIGGER_CONDITION_CHECKER:
        return DRAIN
    m = _REASON.match(trigger.summary)
    if trigger.trigger_condition == qc.TRIGGER_CONDITION_NODE_DOWN or (m and m.group(1) == "node_down"):
        return RECOVERY
    return BALANCE


def copies_of(child: qc.TaskInfo) -> int:
    """The copies a succeeded child loaded onto its node (0 for a release or a child that did not succeed)."""
    if child.state not in _DONE:
        return 0
    if child.kind == qc.TASK_KIND_LOAD_SEGMENT:
        m = _LOADED.match(child.summary)
        return int(m.group(1)) if m else 1
    if child.kind == qc.TASK_KIND_WATCH_DM_CHANNEL:
        return len([c for c in child.summary.removeprefix("watch dm ").split(",") if c.strip()])
    return 0


def count_moves(trees: Iterable[qc.TaskTree]) -> dict[str, int]:
    """{"moves", "recovery", "balance", "drain"}: copies moved by the finished ``trees`` (module docstring), and
    "unlisted_children": children a record did not keep (their copies are not counted)."""
    out = {"moves": 0, RECOVERY: 0, BALANCE: 0, DRAIN: 0, "unlisted_children": 0}
    for t in trees:
        kind = kind_of(t.trigger)
        if kind is None:
            continue
        n = sum(copies_of(c) for c in t.children)
        out[kind] += n
        out["moves"] += n
        out["unlisted_children"] += max(0, t.child_counts.total - len(t.children))
    return out


__all__ = ["BALANCE", "DRAIN", "RECOVERY", "copies_of", "count_moves", "kind_of"]
