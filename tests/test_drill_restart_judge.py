"""The restart drill's judgement and plan over hand-made data (``restart_judge``, ``restart_plan``): what is whole,
what is a false full, what is excused or unclear, and the counts and verdict of the JSON line."""

from __future__ import annotations

import itertools
import math

import pytest

from querycoord.tooling.drill import _run, restart_judge
from querycoord.tooling.drill.options import RestartOptions
from querycoord.tooling.drill.restart_judge import CollectionShown, Holding, ReplicaShown, RoundTally, Sample, Target
from querycoord.tooling.drill.restart_plan import ETCD, SIGKILL, SIGTERM, START_ORDERS, plan_rounds

# Collection 1: segments 10..13 and channels a, b, in two replicas: 7 on nodes 1 and 2, 8 on node 3.
TARGETS = {1: Target(frozenset({10, 11, 12, 13}), frozenset({"a", "b"}), replicas=2)}


def holding(segments: set[int], channels: set[str]) -> Holding:
    return Holding({1: frozenset(segments)}, {1: frozenset(channels)})


WHOLE = {1: holding({10, 11}, {"a"}), 2: holding({12, 13}, {"b"}), 3: holding({10, 11, 12, 13}, {"a", "b"})}


def shown(pct: int = 100, r7: int = 100, r8: int = 100, r8_nodes: frozenset[int] = frozenset({3})
          ) -> dict[int, CollectionShown]:
    return {1: CollectionShown(pct, (ReplicaShown(7, frozenset({1, 2}), r7), ReplicaShown(8, r8_nodes, r8)))}


def sample(shows: dict[int, CollectionShown], holdings: dict[int, Holding], *, asked: float = 10.0,
           silent: frozenset[int] = frozenset()) -> Sample:
    return Sample(asked=asked, read=asked + 0.1, leader="c0.0", shown=shows, holdings=holdings, silent=silent)


def test_every_replica_holding_everything_is_whole_and_true() -> None:
    v = restart_judge.judge(sample(shown(), WHOLE), TARGETS, {}, 1.0)
    assert v.whole and not v.false_full and not v.excused and not v.inconclusive


def test_a_replica_shown_full_that_its_nodes_do_not_hold_is_false() -> None:
    nodes = {**WHOLE, 3: Holding()}  # node 3 answered, holding nothing (a restarted process)
    v = restart_judge.judge(sample(shown(pct=99, r8=100), nodes), TARGETS, {}, 1.0)
    assert not v.whole
    assert len(v.false_full) == 1 and "replica 8" in v.false_full[0] and "4 segments, 2 DM channels" in v.false_full[0]


def test_a_collection_shown_full_while_a_replica_lacks_a_channel_is_false() -> None:
    nodes = {**WHOLE, 2: holding({12, 13}, set())}  # channel b is nowhere in replica 7
    v = restart_judge.judge(sample(shown(pct=100, r7=99), nodes), TARGETS, {}, 1.0)
    assert not v.whole
    assert v.false_full == (f"collection 1 shown at 100 % while (segments, DM channels) lacking by replica: "
                            f"{ {7: (0, 1)} }",)


def test_figures_below_100_are_never_false() -> None:
    v = restart_judge.judge(sample(shown(pct=50, r7=0, r8=99), {}), TARGETS, {}, 1.0)
    assert not v.whole and not v.false_full


def test_a_node_that_answered_nothing_or_is_gone_holds_nothing() -> None:
    """A node missing from the holdings (not running, not serving) counts as holding nothing."""
    v = restart_judge.judge(sample(shown(), {n: h for n, h in WHOLE.items() if n != 2}), TARGETS, {}, 1.0)
    assert not v.whole and len(v.false_full) == 2  # replica 7 and the collection


@pytest.mark.parametrize(("lost_at", "verdict"), [(9.5, "excused"), (10.5, "excused"), (math.inf, "excused"),
                                                 (8.5, "false")])
def test_a_loss_younger_than_the_grace_is_excused(lost_at: float, verdict: str) -> None:
    """Node 3 lost at ``lost_at``, the leader asked at 10.0 with a grace of 1 s (inf: etcd still down)."""
    nodes = {n: h for n, h in WHOLE.items() if n != 3}
    v = restart_judge.judge(sample(shown(pct=99, r8=100), nodes), TARGETS, {3: lost_at}, 1.0)
    assert bool(v.excused) == (verdict == "excused")
    assert bool(v.false_full) == (verdict == "false")


def test_a_claim_resting_on_a_silent_node_is_unclear() -> None:
    nodes = {n: h for n, h in WHOLE.items() if n != 3}
    v = restart_judge.judge(sample(shown(pct=99, r8=100), nodes, silent=frozenset({3})), TARGETS, {}, 1.0)
    assert v.inconclusive and not v.false_full and not v.whole


def test_replicas_missing_or_sharing_nodes_are_not_whole() -> None:
    one = {1: CollectionShown(100, (ReplicaShown(7, frozenset({1, 2, 3}), 100),))}
    v = restart_judge.judge(sample(one, WHOLE), TARGETS, {}, 1.0)
    assert not v.whole and "1 replica shown of 2" in v.false_full[0]
    shared = restart_judge.judge(sample(shown(r8_nodes=frozenset({2, 3})), WHOLE), TARGETS, {}, 1.0)
    assert not shared.whole and "sharing nodes" in shared.false_full[0]


def test_no_leader_no_verdict() -> None:
    v = restart_judge.judge(Sample(asked=1.0, read=1.1, holdings=WHOLE), TARGETS, {}, 1.0)
    assert not v.whole and not v.false_full


def test_a_collection_the_leader_does_not_show_is_not_whole() -> None:
    v = restart_judge.judge(sample({}, WHOLE), TARGETS, {}, 1.0)
    assert not v.whole and not v.false_full


def test_a_round_is_whole_only_from_a_sample_asked_once_everything_was_down() -> None:
    r = RoundTally(1, began=100.0)
    whole = restart_judge.judge(sample(shown(), WHOLE, asked=100.5), TARGETS, {}, 1.0)
    r.add(sample(shown(), WHOLE, asked=100.5), whole)  # the old cluster, still up
    assert r.whole_at is None
    r.stopped = 103.0
    r.add(sample(shown(), WHOLE, asked=109.0), whole)
    assert r.whole_at == pytest.approx(109.1) and r.back_whole_s == pytest.approx(6.1)
    assert r.down_s == pytest.approx(3.0) and r.samples == 2 and r.answered == 2


def _round(n: int, back: float | None, *, false_full: int = 0) -> RoundTally:
    r = RoundTally(n, began=0.0, stopped=1.0, whole_at=None if back is None else 1.0 + back)
    r.false_full_samples = false_full
    return r


def test_the_json_line_and_its_verdict() -> None:
    rounds = [_round(0, 0.3), _round(1, 7.5), _round(2, 4.25, false_full=1)]
    s = restart_judge.summary(rounds, ttl=2.0, collections=3, segments=20000, failed_triggers=0, seed=5)
    assert list(s)[:7] == ["restarts", "collections", "segments", "back_whole_s_max", "false_full_samples",
                           "failed_triggers", "never_whole"]
    assert s["restarts"] == 2 and s["back_whole_s_max"] == 7.5 and s["back_whole_s"] == [7.5, 4.25]
    assert s["false_full_samples"] == 1 and s["never_whole"] == 0 and s["ttl_s"] == 2.0
    assert restart_judge.failures(s, restarts=2) == ["1 samples showed 100 % that the nodes did not hold"]
    slow = restart_judge.summary([_round(1, 12.5), _round(2, None)], ttl=2.0, collections=3, segments=1,
                                 failed_triggers=2, seed=0)
    assert slow["never_whole"] == 1 and slow["back_whole_s_max"] == 12.5
    assert restart_judge.failures(slow, restarts=3) == [
        "only 2 of 3 restarts ran", "2 triggers FAILED", "1 restarts never got whole again",
        "back whole after 12.5s, more than the session TTL + 10 s (12s)"]
    ok = restart_judge.summary([_round(1, 11.9)], ttl=2.0, collections=3, segments=1, failed_triggers=0, seed=0)
    assert restart_judge.failures(ok, restarts=1) == []


def test_the_plan_alternates_signals_and_is_the_seeds() -> None:
    plan = plan_rounds(7, 5)
    assert plan == plan_rounds(7, 5) and [r.n for r in plan] == [1, 2, 3, 4, 5]
    signals = [r.signal for r in plan]
    assert set(signals) == {SIGTERM, SIGKILL} and all(a != b for a, b in itertools.pairwise(signals))
    assert all(sorted(r.stop_order) == sorted((ETCD, "coordinators", "nodes")) for r in plan)
    assert all(r.start_order in START_ORDERS for r in plan)
    assert {r.signal for r in plan_rounds(0, 2)} == {SIGTERM, SIGKILL}
    assert any(plan_rounds(s, 3) != plan_rounds(0, 3) for s in range(1, 5))


def test_options_split_the_segments_and_refuse_what_cannot_run() -> None:
    o = RestartOptions()
    assert o.segments_of() == [1000, 9500, 9500] and o.replicas_of() == [2, 1, 1]
    assert RestartOptions(segments=2000, replicated_segments=200, collections=4).segments_of() == [200, 600, 600,
                                                                                                   600]
    assert "querycoord drill restart --restarts 3 --seed 0" == o.command()
    for bad in (dict(restarts=0), dict(collections=1), dict(replicas=5, nodes=4), dict(replicated_segments=20000),
                dict(segments=1001, collections=3), dict(sample_interval=0), dict(ttl=1)):
        with pytest.raises(ValueError):
            RestartOptions(**bad).validate()  # type: ignore[arg-type]
    o.validate()


def test_json_only_prints_the_json_line_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """Every drill's --json-only: the table and progress lines are dropped, the exit code is the drill's."""

    async def drill(opts: RestartOptions) -> int:
        print("[   0.00s] progress")
        print("table")
        print('{"restarts": 3}')
        return 1

    assert _run(RestartOptions(json_only=True), drill) == 1
    assert capsys.readouterr().out == '{"restarts": 3}\n'
    assert _run(RestartOptions(), drill) == 1
    assert capsys.readouterr().out.splitlines() == ["[   0.00s] progress", "table", '{"restarts": 3}']
