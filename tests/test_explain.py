"""Explain and health as pure functions (``querycoord.serving.explain``, ``served.health``, ``task.waits``,
``draw_health``): every rule on plain data, no cluster; and the README's examples, drawn from the records they
show. The real cluster's answers are tests/test_health.py's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meta.kv import MetaKV
from proto import querycoord_pb2 as qc
from querycoord.console import draw
from querycoord.console.draw_health import explain_lines, explain_record, health_lines, health_record
from querycoord.served.health import collection_health, worst
from querycoord.served.missing import ReplicaMissing, missing_by_replica
from querycoord.served.state import HEALTH_STATES, CollectionServed, ReplicaServed
from querycoord.serving import coordinator_metrics
from querycoord.serving.explain import Facts, TriggerFacts, explain_units
from querycoord.task.parking import NO_NODE, NO_ROOM, Parked
from querycoord.task.waits import MAX_WAITS, TriggerState, Waits, trigger_waits
from tests.test_served import two_replica_meta

MiB = 1 << 20
NOW_MS = 1_700_000_100_000


def replica(rid: int, held: int, segments: int, channels_held: int, channels: int, nodes: tuple[int, ...] = (),
            offline: tuple[int, ...] = ()) -> ReplicaServed:
    return ReplicaServed(rid, held, segments, channels_held, channels, nodes, offline)


def served(*replicas: ReplicaServed, unserved: int = 0, unserved_channels: int = 0,
           cid: int = 1) -> CollectionServed:
    segments = replicas[0].segments if replicas else 0
    held = sum(r.held for r in replicas)
    return CollectionServed(cid, {10: (held, segments * len(replicas))}, {r.replica_id: r for r in replicas},
                            segments, unserved, replicas[0].channels if replicas else 0, unserved_channels, True)


def lacking(segments: int, channels: list[str], first: int = 1001) -> ReplicaMissing:
    return ReplicaMissing(list(range(first, first + min(segments, 100))), segments, channels)


CHANNELS = ["by-dev-rootcoord-dml_0_1v0", "by-dev-rootcoord-dml_1_1v0"]
YELLOW = served(replica(2, 400, 400, 2, 2, nodes=(4,)), replica(3, 0, 400, 0, 2))
YELLOW_MISSING = {2: ReplicaMissing(), 3: lacking(400, CHANNELS)}


def unit(facts: Facts, rid: int = 3) -> qc.ExplainUnit:
    [u] = [u for u in explain_units(facts) if u.replica_id == rid]
    return u


def retry_wait(node: int, child: int = 14) -> qc.TaskWait:
    return qc.TaskWait(kind=qc.WAIT_KIND_RETRY, child_task_id=child, node_id=node, attempt=3, error="boom",
                       since_ms=NOW_MS - 100, until_ms=NOW_MS + 200, text=f"child #{child} failed on node {node}")


# ----- explain: one rule each, in order -------------------------------------------------------------------------
def test_whole_replicas_are_not_listed_and_what_is_missing_is() -> None:
    units = explain_units(Facts(YELLOW, YELLOW_MISSING))
    assert [u.replica_id for u in units] == [3]
    [u] = units
    assert u.missing_segments == 400 and list(u.segment_ids) == list(range(1001, 1101))
    assert list(u.missing_channels) == CHANNELS and not u.online_node_ids
    assert u.reason == qc.EXPLAIN_REASON_CHECKER and "next pass (every 5s" in u.next
    assert not explain_units(Facts(served(replica(2, 3, 3, 1, 1, nodes=(4,))), {2: ReplicaMissing()}))


def test_a_parked_unit_says_no_node_or_no_room_with_bytes_and_nodes() -> None:
    no_node = Parked(1, 3, NO_NODE, "replica 3 has no online query node", since=1_700_000_000.0)
    u = unit(Facts(YELLOW, YELLOW_MISSING, parked={3: no_node}))
    assert u.reason == qc.EXPLAIN_REASON_NO_NODE and u.reason_text == no_node.reason
    assert u.since_ms == 1_700_000_000_000 and "a query node joins" in u.next
    no_room = Parked(1, 3, NO_ROOM, "no room for 400 segments", short_bytes=90 * MiB, room={4: 2 * MiB, 5: 0})
    u = unit(Facts(YELLOW, YELLOW_MISSING, parked={3: no_room}))
    assert u.reason == qc.EXPLAIN_REASON_NO_ROOM and u.short_bytes == 90 * MiB
    assert dict(u.room_bytes) == {4: 2 * MiB, 5: 0} and "90.0 MiB short" in u.next and "memory is freed" in u.next


def test_a_release_comes_first_then_parking_then_what_triggers_wait_for() -> None:
    parked = {3: Parked(1, 3, NO_NODE, "no node")}
    release = TriggerFacts(9, "release collection", True, NOW_MS, release=True)
    repair = TriggerFacts(7, "repair", True, NOW_MS, waits=[retry_wait(4)])
    assert unit(Facts(YELLOW, YELLOW_MISSING, parked=parked, triggers=[repair, release])).task_id == 9
    assert unit(Facts(YELLOW, YELLOW_MISSING, parked=parked, triggers=[repair])).reason == qc.EXPLAIN_REASON_NO_NODE
    resumed = TriggerFacts(8, "load collection", True, NOW_MS, waits=[
        retry_wait(4), qc.TaskWait(kind=qc.WAIT_KIND_NODES, child_task_id=12, since_ms=NOW_MS, text="no node")])
    u = unit(Facts(YELLOW, YELLOW_MISSING, triggers=[resumed]))
    assert (u.reason, u.task_id, u.child_task_id) == (qc.EXPLAIN_REASON_WAITING_FOR_NODE, 8, 12)


def test_a_retry_names_the_error_the_node_and_prefers_a_node_of_the_replica() -> None:
    two = served(replica(2, 0, 4, 1, 1, nodes=(4,)), replica(3, 0, 4, 1, 1, nodes=(5,)), unserved=4)
    t = TriggerFacts(7, "repair", True, NOW_MS, waits=[retry_wait(4, child=14), retry_wait(5, child=15)])
    u = unit(Facts(two, {2: lacking(4, []), 3: lacking(4, [])}, triggers=[t]))
    assert (u.reason, u.task_id, u.child_task_id, u.node_id) == (qc.EXPLAIN_REASON_RETRYING, 7, 15, 5)
    assert (u.error, u.retry_count) == ("boom", 3) and "failed on node 5 (attempt 3): boom" in u.reason_text


def test_a_trigger_then_offline_members_then_the_checker() -> None:
    queued = TriggerFacts(7, "repair", False, NOW_MS, waits=[qc.TaskWait(kind=qc.WAIT_KIND_COLLECTION,
                                                                          text="queued behind task #6")])
    u = unit(Facts(YELLOW, YELLOW_MISSING, triggers=[queued]))
    assert u.reason == qc.EXPLAIN_REASON_TRIGGER and u.task_id == 7
    assert "task #7 (repair, queued)" in u.reason_text and "queued behind task #6" in u.reason_text
    gone = served(replica(2, 4, 4, 1, 1, nodes=(4,)), replica(3, 0, 4, 0, 1, offline=(5,)))
    u = unit(Facts(gone, {3: lacking(4, ["c"])}))
    assert u.reason == qc.EXPLAIN_REASON_WAITING_FOR_NODE and list(u.offline_node_ids) == [5]
    assert "node 5 of the replica lost its session" in u.reason_text
    u = unit(Facts(YELLOW, YELLOW_MISSING, checker_interval=30))
    assert u.reason == qc.EXPLAIN_REASON_CHECKER and "every 30s" in u.next and "no online node" in u.reason_text


# ----- health ---------------------------------------------------------------------------------------------------
def test_health_says_what_is_missing_and_the_worst_state_wins() -> None:
    h = collection_health(YELLOW, YELLOW_MISSING, "c1")
    assert (h.state, h.percentage, h.name) == (qc.HEALTH_STATE_YELLOW, 50, "c1")
    assert [r.whole for r in h.replicas] == [True, False] and list(h.replicas[1].missing_channels) == CHANNELS
    assert h.missing == ("replica 3 lacks 400 of 400 segments and DM channels by-dev-rootcoord-dml_0_1v0, "
                         "by-dev-rootcoord-dml_1_1v0 (no online node)")
    red = served(replica(2, 0, 4, 0, 1, offline=(4,)), unserved=4, unserved_channels=1)
    assert collection_health(red, {2: lacking(4, ["c"])}).missing == (
        "4 segments and 1 DM channel held by no replica; replica 2 lacks 4 of 4 segments and DM channel c "
        "(node 4 offline)")
    assert worst([qc.HEALTH_STATE_GREEN, qc.HEALTH_STATE_RED, qc.HEALTH_STATE_YELLOW]) == qc.HEALTH_STATE_RED
    assert worst([]) == qc.HEALTH_STATE_GREEN
    assert coordinator_metrics.HEALTH_LABELS == HEALTH_STATES, "the gauge's labels are the served view's states"


async def test_missing_lists_what_the_figures_count(kv: MetaKV) -> None:
    """The ids listed are exactly the ones the figures count as missing (the same judge), lowest first."""
    meta = await two_replica_meta(kv)
    missing = missing_by_replica(meta, 1, {2, 3, 4})  # node 1 (segments 100 and 102 of replica 7) is offline
    assert missing is not None
    assert (missing[7].segment_ids, missing[7].segments, missing[7].channels) == ([100, 102], 2, [])
    assert (missing[8].segment_ids, missing[8].segments) == ([], 0)
    capped = missing_by_replica(meta, 1, {3}, limit=1)  # replica 7 has no online node; replica 8 lacks 101
    assert capped is not None and capped[7].segment_ids == [100] and capped[7].segments == 3
    assert capped[7].channels == ["c0"] and capped[8].segment_ids == [101] and capped[8].channels == ["c0"]
    channels_only = missing_by_replica(meta, 1, {3}, segments=False)
    assert channels_only is not None and channels_only[7].segments == 0 and channels_only[7].channels == ["c0"]
    assert missing_by_replica(meta, 2, {1}) is None, "not loaded"


# ----- what a running trigger waits for -------------------------------------------------------------------------
class _Child:
    def __init__(self, cid: int, node: int, attempt: int, error: str = ""):
        self.id, self.node_id = cid, node
        self.rec = type("Rec", (), {"retry_count": attempt, "error": error})()

    def summary(self) -> str:
        return f"load 20 segments of collection {self.id}"


def test_waits_say_queued_planning_paused_or_which_children_and_failures_first() -> None:
    notes = Waits()
    queued = TriggerState(7, running=False, planned=False, since_ms=NOW_MS, blocked_by=6, collection_id=1)
    [w] = trigger_waits(queued, notes)
    assert (w.kind, w.blocking_task_id) == (qc.WAIT_KIND_COLLECTION, 6) and "task #6" in w.text
    [w] = trigger_waits(TriggerState(7, False, False, NOW_MS, slots_taken=8, slots=8), notes)
    assert w.kind == qc.WAIT_KIND_SLOT and "8 of 8" in w.text
    [w] = trigger_waits(TriggerState(7, True, False, NOW_MS), notes)
    assert w.kind == qc.WAIT_KIND_PLANNING
    [w] = trigger_waits(TriggerState(7, True, True, NOW_MS, paused_since=1.0), notes)
    assert w.kind == qc.WAIT_KIND_SPACE and w.since_ms == 1000

    for i in range(MAX_WAITS + 3):
        notes.calling(7, _Child(100 + i, 4, 1))  # type: ignore[arg-type]
    notes.backing_off(7, _Child(120, 5, 2, "boom"), 0.5)  # type: ignore[arg-type]
    waits = trigger_waits(TriggerState(7, True, True, NOW_MS), notes)
    assert len(waits) == MAX_WAITS + 1 and waits[0].kind == qc.WAIT_KIND_RETRY
    assert (waits[0].child_task_id, waits[0].node_id, waits[0].attempt, waits[0].error) == (120, 5, 2, "boom")
    assert waits[0].until_ms > waits[0].since_ms and waits[1].kind == qc.WAIT_KIND_CHILD
    assert waits[-1].text == "and 4 more children at work"
    notes.forget(7)
    assert trigger_waits(TriggerState(7, True, True, NOW_MS), notes) == []


# ----- the README's examples, drawn from the records they show --------------------------------------------------
def readme_block(project_root: Path, command: str) -> list[str]:
    """The lines a README code block shows after ``$ <command>`` (up to the next ``$`` line or the block's end)."""
    text = (project_root / "README.md").read_text()
    m = re.search(rf"^\$ {re.escape(command)}\n(.*?)(?=^\$ |^```)", text, re.S | re.M)
    assert m is not None, f"no `$ {command}` example in README.md"
    return m.group(1).rstrip("\n").split("\n")


def example_health() -> qc.CheckHealthResponse:
    green = served(replica(5, 200, 200, 1, 1, nodes=(4, 5)), cid=6)
    return qc.CheckHealthResponse(state=qc.HEALTH_STATE_YELLOW, collections=[
        collection_health(YELLOW, YELLOW_MISSING, "c1"), collection_health(green, {5: ReplicaMissing()}, "c2")])


def example_explain() -> qc.ExplainResponse:
    parked = Parked(1, 3, NO_NODE, "replica 3 has no online query node and no spare node is online: waiting for a "
                    "query node to join", since=(NOW_MS - 41_000) / 1000)
    return qc.ExplainResponse(collection_id=1, name="c1", state=qc.HEALTH_STATE_YELLOW,
                              units=explain_units(Facts(YELLOW, YELLOW_MISSING, parked={3: parked})))


def example_task() -> qc.TaskTree:
    trigger = qc.TaskInfo(task_id=12, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_DONE, collection_id=6,
                          trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST)
    error = "query node 5 LoadSegments: UNEXPECTED_ERROR: injected failure"
    kids = [qc.TaskInfo(task_id=13, kind=qc.TASK_KIND_WATCH_DM_CHANNEL, state=qc.TASK_STATE_DONE, node_id=5,
                        retry_count=1, summary="watch dm by-dev-rootcoord-dml_0_6v0"),
            qc.TaskInfo(task_id=14, kind=qc.TASK_KIND_LOAD_SEGMENT, state=qc.TASK_STATE_UNDO, node_id=5,
                        retry_count=3, error=error, summary="load 200 segments of collection 6")]
    wait = qc.TaskWait(kind=qc.WAIT_KIND_RETRY, child_task_id=14, node_id=5, attempt=3, error=error,
                       since_ms=NOW_MS - 100, until_ms=NOW_MS + 300,
                       text=f"child #14 (load 200 segments of collection 6) failed on node 5 (attempt 3); it tries "
                            f"again there: {error}")
    return qc.TaskTree(trigger=trigger, children=kids, waits=[wait],
                       child_counts=qc.ChildStateCounts(total=2, undo=1, done=1))


@pytest.mark.parametrize(("command", "lines"), [
    ("querycoord health", lambda: health_lines(health_record(example_health()))),
    ("querycoord explain c1", lambda: explain_lines(explain_record(example_explain()), NOW_MS)),
    ("querycoord tasks show 12", lambda: [*draw.draw_tree(example_task()), "waiting for:",
                                          *(f"  {draw.wait_line(w, NOW_MS)}" for w in example_task().waits)]),
])
def test_readme_examples_are_what_the_commands_draw(project_root: Path, command: str, lines) -> None:
    assert lines() == readme_block(project_root, command)
