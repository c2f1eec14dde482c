"""Why each replica of a collection lacks what it lacks, and what happens next (DESIGN rule 8).

A pure function of what the leader knows at one moment (``Facts``): the served figures, what each replica lacks,
the parked units (``task.parking``), the triggers of the collection with what they wait for (``task.waits``),
and the checker's interval. Kept apart from the RPC so every rule is tested on plain data.

The first rule that applies says why, in this order:

1. a release of the collection is queued or running: it ends the question;
2. the unit is parked: no node (the replica has no online node and no spare is online) or no room (how much
   memory is missing, on which nodes): the checker weighs it again when a node joins or memory is freed;
3. a trigger of the collection waits for query nodes to register after a takeover (the resume wait);
4. a trigger's child failed on a node and is retried (which error, on which node, which attempt);
5. a trigger of the collection is queued or running (the checker leaves a busy collection to it);
6. members of the replica are offline (their sessions are gone; they are being forgotten);
7. otherwise nothing works on it yet: the checker repairs it at its next pass.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proto import querycoord_pb2 as qc
from querycoord.common.wording import mib_exact
from querycoord.served.missing import ReplicaMissing
from querycoord.served.state import CollectionServed, ReplicaServed
from querycoord.task.parking import NO_ROOM, Parked


@dataclass(frozen=True)
class TriggerFacts:
    """A queued or running trigger of the collection, as the scheduler sees it."""

    task_id: int
    kind: str  # in words: "repair", "load collection"
    running: bool
    since_ms: int
    release: bool = False
    waits: Sequence[qc.TaskWait] = ()


@dataclass(frozen=True)
class Facts:
    """What the leader knows of one collection at one moment."""

    served: CollectionServed
    missing: Mapping[int, ReplicaMissing]
    parked: Mapping[int, Parked] = field(default_factory=dict)  # by replica
    triggers: Sequence[TriggerFacts] = ()
    checker_interval: float = 5.0
    left: Mapping[int, int] = field(default_factory=dict)  # node whose re-replication waits -> when it ends (ms)


def _mib(n: int) -> str:
    return mib_exact(n)


def _show(t: TriggerFacts) -> str:
    return f"task #{t.task_id} ({t.kind}, {'running' if t.running else 'queued'})"


def _parked(unit: qc.ExplainUnit, p: Parked) -> None:
    unit.reason_text = p.reason
    unit.since_ms = int(p.since * 1000)
    if p.code == NO_ROOM:
        unit.reason = qc.EXPLAIN_REASON_NO_ROOM
        unit.short_bytes = p.short_bytes
        unit.room_bytes.update(p.room)
        short = f" ({_mib(p.short_bytes)} short)" if p.short_bytes else ""
        unit.next = (f"parked{short} until memory is freed (a release) or a query node joins; the checker weighs it "
                     "again then and loads it where it fits")
    else:
        unit.reason = qc.EXPLAIN_REASON_NO_NODE
        unit.next = ("parked until a query node joins or comes back; the checker gives the replica that node and "
                     "loads what it lacks there")


def _trigger_wait(triggers: Sequence[TriggerFacts], kind: int,
                  members: set[int]) -> tuple[TriggerFacts, qc.TaskWait] | None:
    """The first wait of ``kind`` among the triggers, one on a node of the replica first."""
    found = [(t, w) for t in triggers for w in t.waits if w.kind == kind]
    found.sort(key=lambda tw: tw[1].node_id not in members)
    return found[0] if found else None


def _explain(unit: qc.ExplainUnit, r: ReplicaServed, facts: Facts) -> None:
    triggers = facts.triggers
    release = next((t for t in triggers if t.release), None)
    if release is not None:
        unit.reason, unit.task_id, unit.since_ms = qc.EXPLAIN_REASON_TRIGGER, release.task_id, release.since_ms
        unit.reason_text = f"the collection is being released by {_show(release)}"
        unit.next = "the release ends it: nothing more is loaded for what it releases"
        return
    parked = facts.parked.get(r.replica_id)
    if parked is not None:
        _parked(unit, parked)
        return
    members = {*r.nodes, *r.offline_nodes}
    nodes = _trigger_wait(triggers, qc.WAIT_KIND_NODES, members)
    if nodes is not None:
        t, w = nodes
        unit.reason, unit.task_id, unit.child_task_id = qc.EXPLAIN_REASON_WAITING_FOR_NODE, t.task_id, w.child_task_id
        unit.since_ms = w.since_ms
        unit.reason_text = f"{_show(t)} resumed after a takeover: {w.text}"
        unit.next = ("it goes on as soon as a query node registers; if none does before the wait ends, the task fails "
                     "and the checker repairs (or parks) the replica")
        return
    retry = _trigger_wait(triggers, qc.WAIT_KIND_RETRY, members)
    if retry is not None:
        t, w = retry
        unit.reason, unit.task_id, unit.child_task_id = qc.EXPLAIN_REASON_RETRYING, t.task_id, w.child_task_id
        unit.node_id, unit.error, unit.retry_count, unit.since_ms = w.node_id, w.error, w.attempt, w.since_ms
        unit.reason_text = (f"{_show(t)}: child #{w.child_task_id} failed on node {w.node_id} "
                            f"(attempt {w.attempt}): {w.error}")
        unit.next = ("it tries again on that node while its retry budget lasts, then on another node of the replica "
                     f"(or a spare); follow it with `querycoord tasks show {t.task_id}`")
        return
    if triggers:
        t = triggers[0]
        unit.reason, unit.task_id, unit.since_ms = qc.EXPLAIN_REASON_TRIGGER, t.task_id, t.since_ms
        doing = f": {t.waits[0].text}" if t.waits else ""
        unit.reason_text = f"{_show(t)} works on the collection{doing}"
        unit.next = (f"the task loads what it planned; the checker then repairs whatever is still missing "
                     f"(follow it with `querycoord tasks show {t.task_id}`)")
        return
    if r.offline_nodes:
        unit.reason = qc.EXPLAIN_REASON_WAITING_FOR_NODE
        gone = ", ".join(map(str, r.offline_nodes))
        unit.reason_text = f"node{'s' if len(r.offline_nodes) > 1 else ''} {gone} of the replica lost its session"
        delayed = sorted(n for n in r.offline_nodes if n in facts.left)
        if delayed:
            now = time.time()
            unit.reason_text += "; " + ", ".join(
                f"node {n} left, re-replication in {max(0, math.ceil(facts.left[n] / 1000 - now))}s" for n in delayed)
            unit.next = ("another replica serves everything meanwhile; back under its id before then, the node is "
                         "loaded again itself and nothing moves; else the leader forgets it and the checker loads "
                         "what it held on the replica's other nodes or a spare")
            return
        unit.next = ("the leader forgets what it held; the checker then loads that on the replica's other nodes or a "
                     "spare, or parks it with its reason")
        return
    unit.reason = qc.EXPLAIN_REASON_CHECKER
    unit.reason_text = "nothing works on it yet" + ("" if r.nodes else " (the replica has no online node)")
    unit.next = (f"the checker repairs it at its next pass (every {facts.checker_interval:g}s, and at once when a "
                 "node joins or leaves or a task ends)")


def explain_units(facts: Facts) -> list[qc.ExplainUnit]:
    """One unit per replica that lacks something, by replica id (see module docstring)."""
    out = []
    for rid, r in sorted(facts.served.replicas.items()):
        if r.whole:
            continue
        lacking = facts.missing.get(rid, ReplicaMissing())
        unit = qc.ExplainUnit(replica_id=rid, segment_ids=lacking.segment_ids, missing_segments=r.missing_segments,
                              missing_channels=lacking.channels, online_node_ids=r.nodes,
                              offline_node_ids=r.offline_nodes)
        _explain(unit, r, facts)
        out.append(unit)
    return out
