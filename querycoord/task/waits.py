"""What each queued or running trigger waits for, and since when (DESIGN rule 8: anything running says so).

Two sources. What only happens inside a child's run (its call to a node, its failure and back-off, a resumed
tree's wait for nodes to register) is noted by the scheduler where it happens, in ``Waits``: a dict write per
attempt, nothing persisted (a new leader starts its own notes; waits are the present, not history). What the
scheduler's state already says (queued behind another trigger of the same collection, no free slot, planning,
paused for etcd space) is read when asked (``TriggerState``). ``trigger_waits`` joins both into the
``TaskWait``s GetTask and ListTasks carry, and which explain reads to say what a trigger is doing about a replica.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proto import querycoord_pb2 as qc

if TYPE_CHECKING:
    from querycoord.task.model import Task

# Waits listed per trigger at most (failing children first); the rest are counted in one last entry.
MAX_WAITS = 10


def _ms(wall: float) -> int:
    return int(wall * 1000)


@dataclass
class ChildNote:
    """A child at work on its node, or backing off after a failure there."""

    child_id: int
    summary: str
    node_id: int
    attempt: int
    since: float  # wall time this attempt (or back-off) began
    error: str = ""  # its last error (set once an attempt failed)
    retry_at: float = 0.0  # wall time of the next attempt while it backs off; 0 while its call is in flight
    throttled: str = ""  # why its move waits for a slot of its budget (``task.throttle``); "" once it has one


@dataclass
class NodesNote:
    """A resumed tree's child found no online node: the tree waits for nodes to register after the takeover."""

    child_id: int
    summary: str
    reason: str
    since: float
    until: float


class Waits:
    """The scheduler's notes, by trigger id (see module docstring)."""

    def __init__(self) -> None:
        self._children: dict[int, dict[int, ChildNote]] = {}
        self._nodes: dict[int, NodesNote] = {}

    def calling(self, trigger_id: int, child: Task) -> None:
        """An attempt of ``child`` begins (its ``retry_count`` already counts it)."""
        self._children.setdefault(trigger_id, {})[child.id] = ChildNote(
            child.id, child.summary(), child.node_id, child.rec.retry_count, time.time(), child.rec.error)

    def backing_off(self, trigger_id: int, child: Task, delay: float) -> None:
        """The attempt failed (``child.rec.error`` says why); the next one is in ``delay`` seconds."""
        now = time.time()
        self._children.setdefault(trigger_id, {})[child.id] = ChildNote(
            child.id, child.summary(), child.node_id, child.rec.retry_count, now, child.rec.error, now + delay)

    def throttled(self, trigger_id: int, child: Task, why: str) -> None:
        """The attempt's move waits for a slot of its budget: ``why`` (e.g. "4 recoveries running on node 3
        (budget 4)")."""
        note = self._children.setdefault(trigger_id, {}).get(child.id)
        if note is None or note.throttled != why:
            self._children[trigger_id][child.id] = ChildNote(
                child.id, child.summary(), child.node_id, child.rec.retry_count,
                note.since if note is not None and note.throttled else time.time(), child.rec.error, throttled=why)

    def ended(self, trigger_id: int, child_id: int) -> None:
        """The child is done on its node, or given up there (rescheduled, or its trigger failed)."""
        notes = self._children.get(trigger_id)
        if notes is not None:
            notes.pop(child_id, None)
            if not notes:
                del self._children[trigger_id]

    def waiting_for_nodes(self, trigger_id: int, child: Task, reason: str, until: float) -> None:
        self._nodes[trigger_id] = NodesNote(child.id, child.summary(), reason, time.time(), until)

    def nodes_done(self, trigger_id: int) -> None:
        self._nodes.pop(trigger_id, None)

    def forget(self, trigger_id: int) -> None:
        """The trigger finished or was dropped."""
        self._children.pop(trigger_id, None)
        self._nodes.pop(trigger_id, None)

    def children(self, trigger_id: int) -> list[ChildNote]:
        return list(self._children.get(trigger_id, {}).values())

    def nodes(self, trigger_id: int) -> NodesNote | None:
        return self._nodes.get(trigger_id)


@dataclass(frozen=True, slots=True)
class TriggerState:
    """What the scheduler knows of one trigger when asked (the scheduler fills it: this module reads no queue)."""

    trigger_id: int
    running: bool  # dispatched (else queued)
    planned: bool  # its children are committed (else it is planning them)
    since_ms: int  # when it began running (queued: when it was created)
    blocked_by: int = 0  # queued: the trigger holding one of its collections
    collection_id: int = 0  # the collection ``blocked_by`` holds
    slots_taken: int = 0
    slots: int = 0
    paused_since: float = 0.0  # wall time its writes began waiting for etcd space; 0: not paused


def trigger_waits(state: TriggerState, notes: Waits) -> list[qc.TaskWait]:
    """What the trigger waits for now, the most telling first, at most ``MAX_WAITS`` (see module docstring)."""
    if state.paused_since:
        return [qc.TaskWait(kind=qc.WAIT_KIND_SPACE, since_ms=_ms(state.paused_since),
                            text="its writes wait for etcd to have space (NOSPACE); it resumes, with the time it "
                                 "had left, once `querycoord etcd maintain` made room")]
    if not state.running:
        if state.blocked_by:
            return [qc.TaskWait(kind=qc.WAIT_KIND_COLLECTION, since_ms=state.since_ms,
                                blocking_task_id=state.blocked_by,
                                text=f"queued behind task #{state.blocked_by}, which holds collection "
                                     f"{state.collection_id}: triggers of one collection run one at a time")]
        full = state.slots_taken >= state.slots
        return [qc.TaskWait(kind=qc.WAIT_KIND_SLOT, since_ms=state.since_ms,
                            text=f"queued: {state.slots_taken} of {state.slots} trigger slots are taken"
                            if full else "queued: dispatched at the scheduler's next turn")]
    if not state.planned:
        return [qc.TaskWait(kind=qc.WAIT_KIND_PLANNING, since_ms=state.since_ms,
                            text="planning its children (reading the catalog and query meta)")]
    out: list[qc.TaskWait] = []
    nodes = notes.nodes(state.trigger_id)
    if nodes is not None:
        out.append(qc.TaskWait(kind=qc.WAIT_KIND_NODES, since_ms=_ms(nodes.since), until_ms=_ms(nodes.until),
                               child_task_id=nodes.child_id,
                               text=f"child #{nodes.child_id} ({nodes.summary}) found no node: {nodes.reason}; "
                                    "waiting for query nodes to register after the takeover"))
    children = sorted(notes.children(state.trigger_id), key=lambda n: (not n.retry_at, n.since, n.child_id))
    for n in children[:MAX_WAITS - len(out)]:
        if n.throttled:
            out.append(qc.TaskWait(kind=qc.WAIT_KIND_THROTTLED, since_ms=_ms(n.since), child_task_id=n.child_id,
                                   node_id=n.node_id, attempt=n.attempt,
                                   text=f"child #{n.child_id} ({n.summary}) throttled: {n.throttled}"))
        elif n.retry_at:
            out.append(qc.TaskWait(kind=qc.WAIT_KIND_RETRY, since_ms=_ms(n.since), until_ms=_ms(n.retry_at),
                                   child_task_id=n.child_id, node_id=n.node_id, attempt=n.attempt, error=n.error,
                                   text=f"child #{n.child_id} ({n.summary}) failed on node {n.node_id} (attempt "
                                        f"{n.attempt}); it tries again there: {n.error}"))
        else:
            again = f" (attempt {n.attempt}, last error: {n.error})" if n.error and n.attempt > 1 else \
                f" (attempt {n.attempt})" if n.attempt > 1 else ""
            out.append(qc.TaskWait(kind=qc.WAIT_KIND_CHILD, since_ms=_ms(n.since), child_task_id=n.child_id,
                                   node_id=n.node_id, attempt=n.attempt, error=n.error if n.attempt > 1 else "",
                                   text=f"child #{n.child_id} ({n.summary}) at work on node {n.node_id}{again}"))
    hidden = len(children) - (len(out) - (nodes is not None))
    if hidden > 0:
        out.append(qc.TaskWait(kind=qc.WAIT_KIND_CHILD, text=f"and {hidden} more children at work"))
    return out
