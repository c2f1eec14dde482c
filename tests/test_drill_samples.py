"""The chaos drill's continuous invariants, judged over plain data (``placement``, ``samples``): whether a unit
could be placed agrees with the coordinator's allocator; false full answers, blocked units and blocked releases
are found, and what faults or unknowable states excuse is not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proto import data_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.allocator import NoAvailableNode, Usage, allocate_segments
from querycoord.cluster.nodes import Node, NodeState
from querycoord.tooling.drill.invariants import (
    CatalogColl,
    Expected,
    MetaColl,
    MetaView,
    NodeView,
    check,
    replica_changes,
)
from querycoord.tooling.drill.placement import (
    NO_NODE,
    NO_ROOM,
    PLACEABLE,
    Lack,
    Room,
    TargetView,
    Unit,
    units_of,
    weigh,
)
from querycoord.tooling.drill.sampler import leader_answers, merged, target_of
from querycoord.tooling.drill.samples import (
    Disturbances,
    ReleaseCall,
    RoomWaits,
    Sessions,
    Shown,
    ShownReplica,
    UnitClock,
    blocked_releases,
    false_full,
)

MB = 1 << 20
CID = 7


def _view(*sids: int, chans: tuple[str, ...] = ("ch1",), cid: int = CID) -> NodeView:
    return NodeView(segments={s: (cid, 1) for s in sids}, dm_channels={(cid, c) for c in chans})


TARGET = TargetView({1: MB, 2: MB, 3: MB}, frozenset({"ch1"}))


# ----- placement ---------------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 8 * MB), min_size=1, max_size=12),
       nodes=st.lists(st.tuples(st.integers(4 * MB, 32 * MB), st.integers(0, 24 * MB)), min_size=1, max_size=4))
def test_placement_agrees_with_the_allocator(sizes: list[int], nodes: list[tuple[int, int]]) -> None:
    """``weigh`` restates the coordinator's rule: a unit it calls placeable is one ``allocate_segments`` places."""
    ids = list(range(1, len(nodes) + 1))
    members = [Node(i, "", cap, NodeState.ONLINE, client=None)  # type: ignore[arg-type]
               for i, (cap, _used) in zip(ids, nodes, strict=True)]
    usage = Usage(memory={i: used for i, (_cap, used) in zip(ids, nodes, strict=True)}, channels={})
    segs = [(100 + k, s) for k, s in enumerate(sizes)]
    try:
        allocate_segments(segs, members, usage, include=ids)
        fits = True
    except NoAvailableNode:
        fits = False
    unit = Unit(CID, 1, Lack(dict(segs)), tuple(ids), ())
    rooms = {i: Room(used, cap) for i, (cap, used) in zip(ids, nodes, strict=True)}
    assert (weigh([unit], rooms)[unit.key] == PLACEABLE) == fits


def test_units_no_node_no_room_and_spares_shared_in_order() -> None:
    # Replica 1 lost its only node (3); replica 2 holds everything on node 2; node 9 is a spare.
    replicas = {1: frozenset({3}), 2: frozenset({2})}
    views = {2: _view(1, 2, 3), 9: NodeView()}
    units, unknown = units_of(CID, TARGET, replicas, {2, 9}, views)
    assert unknown == [] and [u.key for u in units] == [(CID, 1)] and units[0].spares == (9,)
    assert weigh(units, {2: Room(3 * MB, 64 * MB), 9: Room(0, 3 * MB)}) == {(CID, 1): NO_ROOM}
    assert weigh(units, {2: Room(3 * MB, 64 * MB), 9: Room(0, 8 * MB)}) == {(CID, 1): PLACEABLE}
    assert weigh(units_of(CID, TARGET, replicas, {2}, views)[0], {}) == {(CID, 1): NO_NODE}
    # Two units wanting the one spare's room: the first (by collection, replica) gets it.
    other = Unit(CID + 1, 1, units[0].lack, (), (9,))
    assert weigh([other, units[0]], {9: Room(0, 5 * MB)}) == {(CID, 1): PLACEABLE, (CID + 1, 1): NO_ROOM}
    # A node of the replica that did not report: the replica is not judged.
    assert units_of(CID, TARGET, {1: frozenset({3})}, {3}, {}) == ([], [1])


# ----- false full ---------------------------------------------------------------------------------------------------
def _shown(pct: int, *replicas: tuple[int, int, frozenset[int]]) -> Shown:
    return Shown(CID, pct, frozenset({1}), tuple(ShownReplica(r, p, n) for r, p, n in replicas))


def test_false_full_replica_and_collection() -> None:
    views = {1: _view(1, 2, 3), 2: _view(1, 2)}  # node 2 (replica 2) lost segment 3
    whole = _shown(100, (1, 100, frozenset({1})), (2, 100, frozenset({2})))
    found = false_full(whole, TARGET, views, {1, 2})
    assert len(found) == 2 and "replica 2" in found[0] and "collection 7 shown at 100 %" in found[1], found
    honest = _shown(83, (1, 100, frozenset({1})), (2, 66, frozenset({2})))
    assert false_full(honest, TARGET, views, {1, 2}) == []
    # A DM channel watched by no node of the replica counts as much as a segment.
    assert false_full(_shown(50, (1, 100, frozenset({1}))), TARGET, {1: _view(1, 2, 3, chans=())}, {1})


def test_false_full_offline_and_unknown_nodes() -> None:
    shown = _shown(100, (1, 100, frozenset({1, 2})))
    views = {1: _view(1, 2), 2: _view(3)}
    assert false_full(shown, TARGET, views, {1, 2}) == []
    # Node 2's session is gone (past the grace): its copies no longer count.
    assert false_full(shown, TARGET, views, {1})
    # Node 2 online but unknown (killed, session not lapsed): not knowable, not judged.
    assert false_full(shown, TARGET, {1: _view(1, 2), 2: None}, {1, 2}) == []


def test_sessions_count_as_online_for_the_grace() -> None:
    s = Sessions(grace=1.0)
    s.observe(0.0, {1: 10, 2: 11})
    s.observe(5.0, {1: 10})
    assert s.online_at(5.5) == {1, 2} and s.online_at(6.0) == {1}
    s.observe(7.0, {1: 10, 2: 12})  # back (a new incarnation)
    assert s.online_at(20.0) == {1, 2} and s.unsure_at(7.5) == {2} and s.unsure_at(8.0) == set()
    s.observe(9.0, {1: 11, 2: 12})  # node 1 restarted between two reads: its id never looked gone
    assert s.unsure_at(9.5) == {1}


# ----- blocked units ---------------------------------------------------------------------------------------------
def test_unit_clock_counts_calm_seconds_once_per_episode() -> None:
    clock = UnitClock(window=10.0)
    key = (CID, 1)
    assert clock.observe(0.0, {key: PLACEABLE}, 0.0) == []
    assert clock.observe(9.0, {key: PLACEABLE}, 0.0) == []
    assert len(clock.observe(10.5, {key: PLACEABLE}, 0.0)) == 1
    assert clock.observe(30.0, {key: PLACEABLE}, 0.0) == []  # the same episode: once
    clock.observe(31.0, {}, 0.0)  # held again: the episode ends
    assert clock.observe(32.0, {key: PLACEABLE}, 0.0) == []
    # A fault window restarts the count; no room is no block.
    clock = UnitClock(window=10.0)
    clock.observe(0.0, {key: PLACEABLE}, 0.0)
    assert clock.observe(5.0, {key: PLACEABLE}, None) == []
    assert clock.observe(14.0, {key: PLACEABLE}, 6.0) == []
    assert clock.observe(20.0, {key: NO_ROOM}, 6.0) == [] and clock.blocked == []


def test_disturbances_calm_and_overlap() -> None:
    d = Disturbances()
    w = d.open(10.0)
    assert d.calm_since(5.0) == 0.0 and d.calm_since(11.0) is None
    d.close(w, 15.0)
    d.add(14.0, 20.0)
    assert d.calm_since(21.0) == 20.0 and d.calm_since(18.0) is None
    assert d.overlap(0.0, 30.0) == 10.0 and d.overlap(12.0, 16.0) == 4.0


# ----- blocked releases ------------------------------------------------------------------------------------------
def test_blocked_releases_need_a_room_wait_and_a_slow_answer_outside_faults() -> None:
    waits = RoomWaits()
    waits.add(5.0, "replica 1 of collection 7 lacks 3 segments")
    calm = Disturbances()
    slow = ReleaseCall("#1 ReleaseCollection coll 7", 1.0, 14.0, "SUCCESS")
    timeout = ReleaseCall("#2 ReleaseCollection coll 7", 1.0, 6.0, "TIMEOUT")
    quick = ReleaseCall("#3 ReleaseCollection coll 7", 4.0, 5.5, "SUCCESS")
    assert len(blocked_releases([slow, timeout, quick], waits, calm)) == 2
    assert blocked_releases([slow, timeout], RoomWaits(), calm) == []  # no unit waited for room
    faults = Disturbances()
    faults.add(2.0, 8.0)  # a leader kill during the call: its seconds do not count
    assert blocked_releases([slow], waits, faults) == []
    assert len(blocked_releases([ReleaseCall("#4", 1.0, None)], waits, calm, now=20.0)) == 1


# ----- the quiescent check and replicas over time ------------------------------------------------------------------
def test_check_excuses_unplaceable_units_unless_meta_shows_them_whole() -> None:
    expected = {CID: Expected("collection", frozenset({1}), "#1 LoadCollection")}
    catalog = {CID: CatalogColl({1: frozenset({1, 2, 3})}, frozenset({"ch1"}))}
    nodes = {1: _view(1, 2, 3)}
    meta = MetaView(collections={CID: MetaColl("collection", 50, frozenset({1}), {1: frozenset({1}),
                                                                                   2: frozenset()})},
                    segments={s: (CID, 1, {1: 1}) for s in (1, 2, 3)}, channels={(CID, "ch1"): {1: 1}})
    lost = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[])
    assert lost.lost_tasks == 1, lost.details
    excused = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[],
                    unplaceable={(CID, 2): "no_node"})
    assert excused.lost_tasks == 0 and excused.invariant_violations == 0 and excused.notes, excused.details
    meta.collections[CID].percentage = 100
    shown_whole = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[],
                        unplaceable={(CID, 2): "no_node"})
    assert shown_whole.lost_tasks == 1 and "100 %" in shown_whole.details[0]


def test_replica_changes_accept_a_node_reborn_under_its_id() -> None:
    before = {CID: MetaColl("collection", 100, frozenset({1}), {1: frozenset({1, 2}), 2: frozenset({3})})}
    after = {CID: MetaColl("collection", 100, frozenset({1}), {1: frozenset({1}), 2: frozenset({2, 3})})}
    problems, suspects = replica_changes(before, after, live={1, 2, 3})
    assert problems and suspects
    assert replica_changes(before, after, live={1, 2, 3}, reborn={2}) == ([], {})


# ----- one sample's reads ------------------------------------------------------------------------------------------
def _info(cid: int, parts: tuple[int, ...], pct: int = 100) -> data_pb2.CollectionLoadInfo:
    return data_pb2.CollectionLoadInfo(
        collection_id=cid, in_memory_percentage=pct,
        partitions=[data_pb2.PartitionLoadInfo(partition_id=p) for p in parts],
        replicas=[data_pb2.ReplicaInfo(replica_id=1, node_ids=[1], in_memory_percentage=pct)])


async def test_a_getreplicas_answer_is_judged_only_when_both_showcollections_agree_on_its_partitions() -> None:
    shows = [[_info(7, (1,)), _info(8, (1,))], [_info(7, (1,)), _info(8, (1, 2))]]

    async def ask(method: str, request: object) -> object:
        if method == "ShowCollections":
            return qc.ShowCollectionsResponse(collections=shows.pop(0))
        return qc.GetReplicasResponse(replicas=[data_pb2.ReplicaInfo(replica_id=1, node_ids=[1],
                                                                     in_memory_percentage=100)])

    answers = await leader_answers(ask)
    assert answers is not None
    assert [(a.collection_id, a.surface) for a in answers if a.surface == "GetReplicas"] == [(7, "GetReplicas")]
    assert len([a for a in answers if a.surface == "ShowCollections"]) == 4


def test_a_target_is_what_both_catalog_reads_have_of_the_loaded_partitions_and_copies_held_in_either_read() -> None:
    before = {CID: ({1: (10, MB), 2: (10, MB), 3: (11, MB)}, frozenset({"a", "b"}))}
    after = {CID: ({2: (10, MB), 3: (11, MB), 4: (10, 2 * MB)}, frozenset({"a"}))}  # 1 compacted into 4
    assert target_of(CID, frozenset({10}), before, after) == TargetView({2: MB}, frozenset({"a"}))
    assert target_of(CID + 1, frozenset({10}), before, after) is None
    views, rooms = merged({1: (_view(1), Room(1, 8))}, {1: (_view(2), Room(2, 8)), 2: (_view(3), Room(0, 8))})
    v1 = views[1]
    assert v1 is not None and set(v1.segments) == {1, 2}
    assert rooms == {1: Room(2, 8), 2: Room(0, 8)}


def test_compaction_sources_may_stay_held_while_what_they_became_is_held_nowhere_in_a_replica() -> None:
    """Segment 4 was compacted from 1 and 2; replica 2 has no room for it (parked): 1 and 2 still serve there."""
    expected = {CID: Expected("collection", frozenset({1}), "#1 LoadCollection")}
    catalog = {CID: CatalogColl({1: frozenset({3, 4})}, frozenset({"ch1"}), sources={4: (1, 2)})}
    nodes = {1: _view(3, 4), 2: _view(1, 2, 3)}
    meta = MetaView(collections={CID: MetaColl("collection", 50, frozenset({1}), {1: frozenset({1}),
                                                                                   2: frozenset({2})})},
                    segments={3: (CID, 1, {1: 1, 2: 2}), 4: (CID, 1, {1: 1}), 1: (CID, 1, {2: 2}),
                              2: (CID, 1, {2: 2})}, channels={(CID, "ch1"): {1: 1, 2: 2}})
    res = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[], unplaceable={(CID, 2): "no_room"})
    assert res.invariant_violations == 0 and res.lost_tasks == 0 and res.kept_sources == {1, 2}, res.details
    nodes[2].segments[4] = (CID, 1)  # loaded there too: the sources are stale now
    meta.segments[4] = (CID, 1, {1: 1, 2: 2})
    res = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[])
    assert any("compacted away" in d for d in res.details), res.details


def test_a_chain_s_older_sources_may_stay_held_too_while_its_result_is_held_nowhere_in_a_replica() -> None:
    """5 and 8 became 27, which became 28 (from 27 and 11) before it was ever loaded: the catalog records only
    28's direct sources, yet 5 and 8 serve the rows 28 holds. While 28 is held by no node of replica 2, every
    segment of its partition the catalog no longer lists may stay held, as the checker keeps them."""
    expected = {CID: Expected("collection", frozenset({1}), "#1 LoadCollection")}
    catalog = {CID: CatalogColl({1: frozenset({3, 28})}, frozenset({"ch1"}), sources={28: (27, 11)})}
    nodes = {1: _view(3, 28), 2: _view(3, 5, 8)}
    meta = MetaView(collections={CID: MetaColl("collection", 50, frozenset({1}), {1: frozenset({1}),
                                                                                   2: frozenset({2})})},
                    segments={3: (CID, 1, {1: 1, 2: 2}), 28: (CID, 1, {1: 1}), 5: (CID, 1, {2: 2}),
                              8: (CID, 1, {2: 2})}, channels={(CID, "ch1"): {1: 1, 2: 2}})
    res = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[], unplaceable={(CID, 2): "no_room"})
    assert res.invariant_violations == 0 and {5, 8} <= res.kept_sources, res.details
    nodes[2].segments[28] = (CID, 1)  # loaded there too: the whole chain is stale now
    meta.segments[28] = (CID, 1, {1: 1, 2: 2})
    res = check(expected, catalog, meta, nodes, task_keys={}, unanswered=[])
    assert any("compacted away" in d for d in res.details), res.details
