"""The failover drill: its schedule is a function of the seed, its checks count what they should (per replica),
and a small run against real processes (2 coordinators, 5 nodes, 2 replicas, 2 leader kills, 2 node kills, a
SIGSTOP round) passes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.tooling.drill import invariants
from querycoord.tooling.drill.invariants import CatalogColl, Expected, MetaColl, MetaView, NodeView
from querycoord.tooling.drill.options import DrillOptions
from querycoord.tooling.drill.schedule import KillLeader, Op, Pause, make_schedule
from querycoord.tooling.drill.stale import Change, Window, count_refusals, is_coordination_key
from tests.cluster import QueryCluster, running_cluster

OPTS = DrillOptions(collections=20, partitions=2, nodes=5, kills=10, node_kills=2, etcd_kills=3, etcd_members=3)


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    a, b, c = make_schedule(7, OPTS), make_schedule(7, OPTS), make_schedule(8, OPTS)
    assert a.steps == b.steps and a.digest() == b.digest()
    assert a.digest() != c.digest()
    for s in (a, c):
        assert s.leader_kills == 10 and s.count(Pause) == 1
    # Some kills hit a LoadCollection (answered or in flight), i.e. a task tree being persisted or run.
    attached = [st.action for st in a.steps if isinstance(st.action, Op) and st.action.kill]
    assert all(op.kind == "load" for op in attached)
    assert len(attached) + a.count(KillLeader) == 10


def test_schedule_requests_follow_the_predicted_state() -> None:
    """Loads of released collections, releases of loaded ones: not a stream of CONFLICTs."""
    for seed in range(5):
        state: dict[int, frozenset[int] | None] = {}
        for st in make_schedule(seed, OPTS).steps:
            op = st.action
            if not isinstance(op, Op) or op.kind == "balance":
                continue
            now = state.get(op.coll)
            if op.kind == "load":
                assert now is None
                state[op.coll] = frozenset({0, 1})
            elif op.kind == "release":
                state[op.coll] = None
            elif op.kind == "load_partitions":
                assert now != frozenset({0, 1}) and op.parts
                state[op.coll] = (now or frozenset()) | frozenset(op.parts)
            else:
                assert now is not None and set(op.parts) <= now
                state[op.coll] = (now - frozenset(op.parts)) or None


def _healthy() -> tuple[dict[int, Expected], dict[int, CatalogColl], MetaView, dict[int, NodeView]]:
    expected = {1: Expected("collection", frozenset({10, 11}), "#1 LoadCollection"),
                2: Expected("released", frozenset(), "#2 ReleaseCollection"),
                3: Expected("partitions", frozenset({30}), "#3 LoadPartitions")}
    catalog = {1: CatalogColl({10: frozenset({100, 101}), 11: frozenset({110})}, frozenset({"ch1"})),
               2: CatalogColl({20: frozenset({200})}, frozenset({"ch2"})),
               3: CatalogColl({30: frozenset({300}), 31: frozenset({310})}, frozenset({"ch3"}))}
    meta = MetaView(
        collections={1: MetaColl("collection", 100, frozenset({10, 11})), 3: MetaColl("partitions", 100,
                                                                                      frozenset({30}))},
        segments={100: (1, 10, 7), 101: (1, 10, 8), 110: (1, 11, 8), 300: (3, 30, 7)},
        channels={(1, "ch1"): 7, (3, "ch3"): 8})
    nodes = {7: NodeView(segments={100: (1, 10), 300: (3, 30)}, dm_channels={(1, "ch1")}),
             8: NodeView(segments={101: (1, 10), 110: (1, 11)}, dm_channels={(3, "ch3")})}
    return expected, catalog, meta, nodes


def test_invariants_pass_on_a_consistent_cluster() -> None:
    res = invariants.check(*_healthy(), task_keys={"queryCoord-triggerTask/": 0}, unanswered=[])
    assert (res.lost_tasks, res.duplicate_segments, res.invariant_violations) == (0, 0, 0), res.details
    assert all(ok for ok, _ in res.checks.values())


def test_invariants_count_each_kind_of_failure() -> None:
    expected, catalog, meta, nodes = _healthy()
    nodes[8].segments[100] = (1, 10)  # a duplicate (and a copy meta does not know)
    del nodes[8].segments[110]  # a lost segment of a loaded collection (meta still places it)
    nodes[7].segments[200] = (2, 20)  # a released collection still held
    nodes[7].dm_channels.add((3, "ch3"))  # a channel watched twice
    res = invariants.check(expected, catalog, meta, nodes, task_keys={"queryCoord-activeTask/": 2}, unanswered=["#9 x"],
                unclear=["#4 ReleaseCollection coll 1: UNEXPECTED_ERROR boom"])
    assert res.duplicate_segments == 1
    assert res.lost_tasks == 2  # collection 1 (segment 110) and collection 2 (segment 200)
    text = "\n".join(res.details)
    assert "DM channel ch3 of collection 3 watched by nodes [7, 8]" in text
    assert "keys left under queryCoord-activeTask/" in text and "unanswered call: #9 x" in text
    assert "not a clear error: #4 ReleaseCollection" in text
    assert "meta places segment 110" in text and "node 8 holds segment 100, meta says node 7" in text
    assert not res.checks["no segment on more than one node of a replica"][0]


def _two_replicas() -> tuple[dict[int, Expected], dict[int, CatalogColl], MetaView, dict[int, NodeView]]:
    """Collection 1 loaded with 2 replicas: replica 51 on nodes 7 and 8, replica 52 on node 9; node 6 a spare."""
    expected = {1: Expected("collection", frozenset({10}), "#1 LoadCollection")}
    catalog = {1: CatalogColl({10: frozenset({100, 101})}, frozenset({"ch1"}))}
    meta = MetaView(
        collections={1: MetaColl("collection", 100, frozenset({10}), {51: frozenset({7, 8}), 52: frozenset({9})})},
        segments={100: (1, 10, {51: 7, 52: 9}), 101: (1, 10, {51: 8, 52: 9})},
        channels={(1, "ch1"): {51: 8, 52: 9}})
    nodes = {6: NodeView(),
             7: NodeView(segments={100: (1, 10)}),
             8: NodeView(segments={101: (1, 10)}, dm_channels={(1, "ch1")}),
             9: NodeView(segments={100: (1, 10), 101: (1, 10)}, dm_channels={(1, "ch1")})}
    return expected, catalog, meta, nodes


def test_invariants_hold_once_per_replica() -> None:
    res = invariants.check(*_two_replicas(), task_keys={}, unanswered=[], replica_number=2)
    assert (res.lost_tasks, res.duplicate_segments, res.invariant_violations) == (0, 0, 0), res.details
    assert all(ok for ok, _ in res.checks.values())
    res = invariants.check(*_two_replicas(), task_keys={}, unanswered=[], replica_number=1)
    assert res.invariant_violations == 1 and "has 2 replicas [51, 52], loaded with replica_number 1" in res.details[0]


def test_invariants_per_replica_count_each_kind_of_failure() -> None:
    expected, catalog, meta, nodes = _two_replicas()
    del nodes[9].segments[101]  # replica 52 lacks a segment that replica 51 holds: lost, whatever 51 holds
    meta.segments[101] = (1, 10, {51: 8})
    nodes[7].segments[101] = (1, 10)  # twice in replica 51 (meta knows one)
    nodes[7].dm_channels.add((1, "ch1"))  # watched twice in replica 51
    nodes[6].segments[100] = (1, 10)  # a spare holding a copy (meta knows nothing of it)
    res = invariants.check(expected, catalog, meta, nodes, task_keys={}, unanswered=[])
    text = "\n".join(res.details)
    assert res.lost_tasks == 1 and "segments on no online node of replica 52: [101]" in text, text
    assert res.duplicate_segments == 1 and "segment 101 held by nodes [7, 8] of replica 51" in text
    assert "DM channel ch1 of collection 1 watched by nodes [7, 8] of replica 51" in text
    assert "nodes [6] hold copies of it but are in none of its replicas" in text
    assert "node 7 holds segment 101, meta says node 8" in text and "node 7 watches DM channel ch1" in text
    assert res.invariant_violations == 4, text

    expected, catalog, meta, nodes = _two_replicas()
    meta.collections[1].replicas[52] = frozenset({8, 9, 5})  # node 8 in both; node 5 not online
    meta.segments[100] = (1, 10, {51: 7, 52: 7})  # replica 52's copy placed on a node of replica 51
    res = invariants.check(expected, catalog, meta, nodes, task_keys={}, unanswered=[])
    text = "\n".join(res.details)
    assert "node 8 is in replicas 51 and 52" in text and "replica 52 lists nodes [5], which are not online" in text
    assert "meta places replica 52's copy of segment 100 (collection 1) on node 7, which is in replica 51" in text


def test_replica_changes_only_a_death_or_a_release_explains() -> None:
    def coll(percentage: int = 100, **replicas: set[int]) -> MetaColl:
        return MetaColl("collection", percentage, frozenset({10}),
                        {int(r[1:]): frozenset(ns) for r, ns in replicas.items()})

    before = {1: coll(r51={7, 8}, r52={9}), 2: coll(r61={7}, r62={8, 9})}
    # Node 9 died: replica 52 took spare 6; collection 2 lost it from replica 62 and kept the rest.
    after = {1: coll(r51={7, 8}, r52={6}), 2: coll(r61={7}, r62={8})}
    assert invariants.replica_changes(before, after, live={6, 7, 8}) == ([], {})
    # A live node moved between replicas; replica ids changed; a live node left its replica (a suspect).
    after = {1: coll(r51={7}, r52={8, 9}), 2: coll(r63={7}, r64={8, 9})}
    problems, suspects = invariants.replica_changes(before, after, live={6, 7, 8, 9})
    assert problems == ["collection 1: node 8 moved from replica 51 to replica 52",
                        "collection 2: replicas [61, 62] became [63, 64] with no release in between"], problems
    assert suspects == {8: "node 8 left replica 51 of collection 1 while running"}
    # Released (and loaded again) in between, or a first load still running with a load request: not compared.
    assert invariants.replica_changes(before, after, live={6, 7, 8, 9}, released={1, 2}) == ([], {})
    loading = {1: coll(40, r51={7, 8}, r52={9}), 2: before[2]}
    assert invariants.replica_changes(loading, {1: coll(r53={7}, r54={8}), 2: before[2]}, live={7, 8, 9},
                                      loading={1}) == ([], {})
    # A node re-homed from a sibling to a parked replica (REHOME_NODE on collection 1): explained there only.
    rehomed = {1: coll(r51={7}, r52={8}), 2: coll(r61={8}, r62={7})}
    problems, suspects = invariants.replica_changes(before, rehomed, live={7, 8}, rehomed={1})
    assert problems == ["collection 2: node 8 moved from replica 62 to replica 61",
                        "collection 2: node 7 moved from replica 61 to replica 62"], problems
    assert set(suspects) == {7, 8}


def test_stale_writes_are_changes_outside_sessions_and_election() -> None:
    assert is_coordination_key("session/querycoord-3") and is_coordination_key("election/querycoord/1f")
    assert is_coordination_key("idalloc/server-id") and not is_coordination_key("idalloc/task")
    w = Window(10, 14, [Change(11, "put", "session/querycoord-9"), Change(12, "put", "election/querycoord/a"),
                        Change(13, "put", "queryCoord-segmentMeta/1/2/3"),
                        Change(14, "delete", "queryCoord-taskInfo/5")])
    assert [c.revision for c in w.stale] == [13, 14]
    log = "x\nWARNING query meta write ... failed: not leader: fence a@3 no longer holds\nnothing\n"
    assert count_refusals(log) == 1


# The drill takes ~30 s on an idle 2-core machine and ~35 s with eight CPU hogs beside it: this budget is for
# a machine loaded by other suites too. A run that needs it all is stuck, not slow; the progress lines (-v)
# then show the step it is stuck at, and the drill's work dir (its first line) keeps every child's log.
DRILL_BUDGET_S = 420


@pytest.mark.timeout(DRILL_BUDGET_S + 60)
def test_failover_drill_small(project_root: Path, subprocess_env: dict[str, str]) -> None:
    """2 leader kills, 2 node kills and a SIGSTOP round against real processes, every load with 2 replicas (two
    nodes each, and one more: each killed node is replaced): every count 0, exit 0."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "querycoord.cli", "drill", "failover", "--coordinators", "2", "--nodes", "5",
         "--replicas", "2", "--collections", "4", "--kills", "2", "--seed", "1", "-v"],
        cwd=project_root, env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=DRILL_BUDGET_S)
    except subprocess.TimeoutExpired:
        proc.kill()  # its children die with it (pdeathsig)
        out, err = proc.communicate()
        pytest.fail(f"the drill did not finish within {DRILL_BUDGET_S}s (stuck, not slow); its last lines:\n"
                    f"{out[-6000:]}\n{err[-3000:]}")
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"drill failed ({proc.returncode}):\n{out[-6000:]}\n{err[-3000:]}"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["kills"] == 2 and summary["seed"] == 1 and summary["replicas"] == 2
    assert summary["node_kills"] == 2, "a killed node's copies come back within its replica"
    for key in ("lost_tasks", "duplicate_segments", "stale_writes", "invariant_violations", "unanswered_calls"):
        assert summary[key] == 0, (key, out[-4000:])
    assert summary["takeover_max_s"] is not None and summary["pauses"] == 1
    assert "leader kills" in out and "invariants" in out
    assert "[PASS] replicas kept their ids and nodes across kills" in out
    print(f"drill took {elapsed:.1f}s; takeover p50 {summary['takeover_p50_s']}s max {summary['takeover_max_s']}s")


async def test_release_right_after_a_node_crash_keeps_meta_and_nodes_in_agreement(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]
) -> None:
    """A deterministic reproduction of the race ``drill failover --seed 2`` plays.

    A node process is SIGKILLed; within its TTL the collection is released, then loaded again. What
    must hold whatever the timing: the reload is accepted, every segment ends up on exactly one
    surviving node, query meta places them where the nodes hold them, and nothing on the dead node.
    """
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        await c.add_node()
        await c.add_node()
        proc, ready = await c.start_node_process(env=subprocess_env)
        dead = ready["node_id"]
        cid = await c.create_collection("x", partitions=1, segments=30)
        assert c.client is not None
        await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        await c.wait_loaded(cid)
        await c.wait_idle()
        await proc.kill()  # SIGKILL, and reaped
        # Within the node's TTL: its release child cannot reach it (and retries until its session lapses).
        release = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        load = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        said = (f"release answered {common_pb2.ErrorCode.Name(release.status.error_code)} "
                f"{release.status.reason[:160]!r}; load answered {common_pb2.ErrorCode.Name(load.status.error_code)} "
                f"{load.status.reason[:160]!r} (task {load.task_id})")
        assert all(n.healthy for n in c.nodes), f"a surviving node lost its session: {said}"
        assert load.status.error_code == common_pb2.SUCCESS, said
        await c.wait_loaded(cid)
        await c.wait_idle()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        held = {n.node_id: set(n.state.segments) for n in c.nodes}
        in_meta = {n.node_id: {s.segment_id for s in lead.meta.segments_on_node(n.node_id)} for n in c.nodes}
        assert in_meta == held, f"{said}: meta {in_meta} but nodes hold {held}"
        every = [s for h in held.values() for s in h]
        assert len(every) == len(set(every)) == 30, f"{said}: each of the 30 segments once, nodes hold {held}"
        assert not lead.meta.segments_on_node(dead) and not lead.meta.channels_on_node(dead), said


async def test_a_fence_lost_during_a_request_is_answered_not_leader_and_ends_leadership(
    etcd: EtcdCluster, root_path: str
) -> None:
    from meta.election import current_leader, election_prefix
    from proto import querycoord_pb2_grpc

    async with running_cluster(etcd, root_path, [None]) as c:
        coord = await c.wait_leader()
        cid = await c.create_collection("x", partitions=1, segments=4)
        assert c.kv is not None
        leader = await current_leader(c.kv, election_prefix("querycoord"))
        assert leader is not None
        await c.kv.remove(leader.key)  # what etcd does when the leader's lease expires
        async with grpc.aio.insecure_channel(coord.address) as ch:
            try:
                r = await querycoord_pb2_grpc.QueryCoordStub(ch).LoadCollection(
                    qc.LoadCollectionRequest(collection_id=cid), timeout=10)
                code = common_pb2.ErrorCode.Name(r.status.error_code)
            except grpc.aio.AioRpcError as exc:
                code = "NOT_LEADER" if exc.code() == grpc.StatusCode.UNAVAILABLE else exc.code().name
        assert code == "NOT_LEADER", f"answered {code}: the client helper would not retry on the new leader"
        deadline = time.monotonic() + 5
        while coord.coord.is_leader:
            assert time.monotonic() < deadline, "the coordinator kept leading with a fence that no longer holds"
            await asyncio.sleep(0.05)


async def test_cancelled_catalog_point_reads_do_not_crash_etcd(tmp_path: Path) -> None:
    """Its own etcd: if the bug is there, this one dies, not the session's shared member."""
    from meta.client import connect
    from meta.kv import MetaKV
    from querycoord.catalog.store import CatalogStore

    cluster = EtcdCluster(tmp_path / "etcd", size=1).start()
    client = await connect(cluster.config())
    try:
        store = CatalogStore(MetaKV(client, "drill-etcd-crash"))
        desc, ids = await store.create_bulk_collection("c", num_partitions=1, num_segments=1000, rows_per_segment=10)
        pid = desc.partitions[0].partition_id
        for _ in range(30):  # a leader losing its leadership cancels its triggers' catalog reads like this
            reads = [asyncio.create_task(store.get_recovery_info(desc.collection_id, pid, ids[i:i + 100]))
                     for i in range(0, len(ids), 100)]
            await asyncio.sleep(0.002)
            for r in reads:
                r.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
            await asyncio.sleep(0.01)
            assert cluster.members[0].running, "etcd crashed: see the panic at the end of its log"
    finally:
        await client.close()
        cluster.stop()
