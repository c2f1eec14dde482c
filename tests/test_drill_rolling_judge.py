"""The rolling drill's judgement and move counts over hand-made data (``rolling_judge``, ``rolling_moves``): what
is served, unserved or unknown, how the two reads of a sample combine, the stretches, the JSON line's verdict,
and which triggers' copies are moves of which kind."""

from __future__ import annotations

import pytest

from proto import querycoord_pb2 as qc
from querycoord.tooling.drill import _run
from querycoord.tooling.drill.options import RollingOptions
from querycoord.tooling.drill.restart_judge import Holding, Target
from querycoord.tooling.drill.rolling_judge import (
    SERVED,
    UNKNOWN,
    UNSERVED,
    NodeStep,
    Outage,
    Tally,
    failures,
    merge,
    serving,
    summary,
)
from querycoord.tooling.drill.rolling_moves import count_moves, kind_of

# Collection 1: segments 10..13 and channels a, b; replicas on nodes {1, 2} and {3}.
TARGET = Target(frozenset({10, 11, 12, 13}), frozenset({"a", "b"}), replicas=2)
REPLICAS = (frozenset({1, 2}), frozenset({3}))


def holding(segments: set[int], channels: set[str]) -> Holding:
    return Holding({1: frozenset(segments)}, {1: frozenset(channels)})


WHOLE = {1: holding({10, 11}, {"a"}), 2: holding({12, 13}, {"b"}), 3: holding({10, 11, 12, 13}, {"a", "b"})}


def test_one_whole_replica_serves_the_collection() -> None:
    assert serving(1, TARGET, REPLICAS, WHOLE, frozenset())[0] == SERVED
    without_3 = {n: h for n, h in WHOLE.items() if n != 3}  # node 3 stopped: replica {1, 2} still whole
    assert serving(1, TARGET, REPLICAS, without_3, frozenset())[0] == SERVED


def test_no_whole_replica_is_unserved_and_says_what_each_lacks() -> None:
    nodes = {1: holding({10, 11}, {"a"}), 2: holding({12}, {"b"}), 3: holding({10, 11, 12, 13}, {"a"})}
    verdict, why = serving(1, TARGET, REPLICAS, nodes, frozenset())
    assert verdict == UNSERVED
    assert why == "nodes [1, 2] lack 1 segment, 0 DM channels; nodes [3] lack 0 segments, 1 DM channel"


def test_a_silent_node_makes_an_unserved_look_unknown_but_never_hides_a_whole_replica() -> None:
    nodes = {1: holding({10, 11}, {"a"}), 3: holding({10}, set())}
    assert serving(1, TARGET, REPLICAS, nodes, frozenset({2}))[0] == UNKNOWN
    assert serving(1, TARGET, REPLICAS, WHOLE, frozenset({2}))[0] == SERVED
    assert serving(1, TARGET, None, WHOLE, frozenset())[0] == UNKNOWN  # no membership known yet
    assert serving(1, TARGET, (), WHOLE, frozenset())[0] == UNSERVED  # the leader lists no replica


def test_a_copy_held_in_either_read_counts() -> None:
    """Segment 11 moving from node 1 to node 2 (loaded there, then released): the first read sees it on node 1,
    the second on node 2; merged, both count and replica {1, 2} holds it."""
    first = {1: holding({10, 11}, {"a"}), 2: holding({12, 13}, {"b"})}
    second = {1: holding({10}, {"a"}), 2: holding({11, 12, 13}, {"b"})}
    merged = merge(first, second)
    assert merged[1].segments[1] == {10, 11} and merged[2].segments[1] == {11, 12, 13}
    assert serving(1, TARGET, (frozenset({1, 2}),), merged, frozenset())[0] == SERVED
    assert merge({}, {4: Holding()}) == {4: Holding({}, {})}


def test_stretches_run_from_the_first_unserved_sample_to_the_next_served_one() -> None:
    o = Outage()
    for at, verdict in [(1.0, SERVED), (1.1, UNSERVED), (1.2, UNKNOWN), (1.3, UNSERVED), (1.5, SERVED),
                        (2.0, UNSERVED), (2.1, SERVED), (3.0, UNSERVED)]:
        o.observe(at, verdict)
    assert o.stretches == 3 and o.longest == pytest.approx(0.4) and o.total == pytest.approx(0.5)
    o.end(3.25)  # the run ended while unserved
    assert o.longest == pytest.approx(0.4) and o.total == pytest.approx(0.75)


def test_an_unserved_sample_is_one_with_a_two_replica_collection_unserved() -> None:
    t = Tally(two=frozenset({1}), one=frozenset({2}))
    assert t.add(1.0, {1: (SERVED, ""), 2: (UNSERVED, "x")}) == []
    assert t.add(1.1, {1: (UNSERVED, "nodes [1] lack 1 segment"), 2: (SERVED, "")}) == [
        "collection 1: nodes [1] lack 1 segment"]
    assert t.add(1.2, {1: (UNKNOWN, ""), 2: (SERVED, "")}) == []
    t.finish()
    assert (t.samples, t.unserved_samples, t.unknown_samples) == (3, 1, 1)
    assert t.unserved == ["at 1.10s: collection 1: nodes [1] lack 1 segment"]
    assert t.longest(t.one) == pytest.approx(0.1) and t.longest(t.two) == pytest.approx(0.1)


def test_the_json_line_has_the_issues_keys_first_and_fails_on_what_the_issue_says() -> None:
    t = Tally(two=frozenset({1}), one=frozenset({2}))
    t.add(1.0, {1: (SERVED, ""), 2: (UNSERVED, "")})
    t.add(1.5, {1: (SERVED, ""), 2: (SERVED, "")})
    steps = [NodeStep(101, 0.0, stopped=1.0, started=1.5, online=2.0, whole=2.5), NodeStep(102, 3.0, stopped=4.0)]
    s = summary(t, steps, {"moves": 7, "recovery": 2, "balance": 1, "drain": 4}, duration_s=9.04, extra={"x": 1})
    assert list(s)[:8] == ["nodes_restarted", "samples", "unserved_samples", "one_replica_unserved_s_max", "moves",
                           "recovery_moves", "balance_moves", "duration_s"]
    assert (s["nodes_restarted"], s["samples"], s["unserved_samples"], s["one_replica_unserved_s_max"]) == (1, 2, 0,
                                                                                                          0.5)
    assert (s["moves"], s["recovery_moves"], s["balance_moves"], s["drain_moves"], s["duration_s"]) == (7, 2, 1, 4,
                                                                                                        9.0)
    assert s["x"] == 1 and s["never_whole"] == 0
    assert failures(s, nodes=2) == ["only 1 of 2 query nodes were restarted and back online"]
    bad = {**s, "nodes_restarted": 2, "unserved_samples": 3, "exited_on_their_own": 1, "nodes_not_active": 1,
           "drains_unfinished": 1, "never_whole": 1}
    assert len(failures(bad, nodes=2)) == 5
    assert failures({**s, "nodes_restarted": 2}, nodes=2) == []


def _trigger(kind: int, condition: int, summary: str = "") -> qc.TaskInfo:
    return qc.TaskInfo(kind=kind, trigger_condition=condition, summary=summary)


def _child(kind: int, summary: str, state: int = qc.TASK_STATE_DONE) -> qc.TaskInfo:
    return qc.TaskInfo(kind=kind, state=state, summary=summary)


def test_moves_are_copies_loaded_by_balances_and_repairs_by_kind() -> None:
    lb, rep = qc.TASK_KIND_LOAD_BALANCE, qc.TASK_KIND_REPAIR
    assert kind_of(_trigger(rep, qc.TRIGGER_CONDITION_CHECKER, "repair collection 5: 3 segments lost")) == "recovery"
    assert kind_of(_trigger(rep, qc.TRIGGER_CONDITION_CHECKER,
                            "repair collection 5: 2 DM channels moved off draining node 101")) == "drain"
    assert kind_of(_trigger(lb, qc.TRIGGER_CONDITION_CHECKER, "balance (user) from nodes [101]")) == "drain"
    assert kind_of(_trigger(lb, qc.TRIGGER_CONDITION_NODE_DOWN, "balance (node_down) from nodes [3]")) == "recovery"
    assert kind_of(_trigger(lb, qc.TRIGGER_CONDITION_LOAD_BALANCE, "balance (auto) from nodes [3]")) == "balance"
    assert kind_of(_trigger(qc.TASK_KIND_LOAD_COLLECTION, qc.TRIGGER_CONDITION_GRPC_REQUEST)) is None
    trees = [
        qc.TaskTree(trigger=_trigger(lb, qc.TRIGGER_CONDITION_LOAD_BALANCE, "balance (auto) from nodes [1]"),
                    children=[_child(qc.TASK_KIND_LOAD_SEGMENT, "load 12 segments of collection 5"),
                              _child(qc.TASK_KIND_RELEASE_SEGMENT, "release 12 segments"),
                              _child(qc.TASK_KIND_LOAD_SEGMENT, "load 3 segments of collection 5",
                                     qc.TASK_STATE_FAILED)],
                    child_counts=qc.ChildStateCounts(total=4)),
        qc.TaskTree(trigger=_trigger(rep, qc.TRIGGER_CONDITION_CHECKER, "repair collection 5: lost"),
                    children=[_child(qc.TASK_KIND_WATCH_DM_CHANNEL, "watch dm ch-1, ch-2"),
                              _child(qc.TASK_KIND_LOAD_SEGMENT, "load 4 segments of collection 5",
                                     qc.TASK_STATE_EXPIRED)]),
        qc.TaskTree(trigger=_trigger(qc.TASK_KIND_LOAD_COLLECTION, qc.TRIGGER_CONDITION_GRPC_REQUEST),
                    children=[_child(qc.TASK_KIND_LOAD_SEGMENT, "load 50 segments of collection 6")]),
    ]
    assert count_moves(trees) == {"moves": 18, "recovery": 6, "balance": 12, "drain": 0, "unlisted_children": 1}


@pytest.mark.parametrize(("changes", "message"), [
    ({"nodes": 2}, "--nodes must be >= 3"),
    ({"collections_two": 0, "collections_one": 0}, "one of them >= 1"),
    ({"fill": 0.95}, "--fill must be > 0 and below the memory limit 0.9"),
    ({"sample_interval": 0}, "--sample-interval, --drain-timeout, --drain-stall and --whole-timeout must be > 0"),
])
def test_bad_options_are_one_line_and_exit_2(changes: dict[str, object], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    async def never(_opts: RollingOptions) -> int:
        raise AssertionError("the drill must not run")

    assert _run(RollingOptions(**changes), never) == 2  # type: ignore[arg-type]
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
