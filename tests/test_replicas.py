"""In-memory replicas (replica_number): disjoint node groups, each holding every segment and DM channel once.

Real etcd, a real coordinator, real query nodes (in-process, or a real process where one must be SIGKILLed).
Each test asserts what must hold once the cluster is idle, never how fast it got there.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.leader.balance import plan_move
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from tests.cluster import QueryCluster, fast_scheduler, running_cluster, wait_until


async def snapshot(kv: MetaKV) -> dict[str, bytes]:
    return {k: v for k, v in (await kv.load_prefix("")).items()}


def replicas(meta: QueryMeta, cid: int) -> dict[int, set[int]]:
    return {r.replica_id: set(r.node_ids) for r in meta.replicas_of(cid)}


def assert_once_per_replica(nodes: list[QueryNode], groups: dict[int, set[int]], segments: int,
                            channels: int) -> None:
    """Every replica's nodes hold every segment exactly once and watch every DM channel exactly once."""
    by_id = {n.node_id: n for n in nodes if n.healthy}
    for rid, members in groups.items():
        held = Counter(s for m in members if m in by_id for s in by_id[m].state.segments)
        assert len(held) == segments and set(held.values()) == {1}, (rid, len(held), Counter(held.values()))
        watched = Counter(ch for m in members if m in by_id for ch in by_id[m].state.dm_channels)
        assert len(watched) == channels and set(watched.values()) == {1}, (rid, watched)


def whole(nodes: list[QueryNode], members: set[int], segments: int, channels: int) -> bool:
    """Whether these nodes (one replica) hold every segment and watch every DM channel."""
    by_id = {n.node_id: n for n in nodes if n.healthy}
    held = {s for m in members if m in by_id for s in by_id[m].state.segments}
    watched = {ch for m in members if m in by_id for ch in by_id[m].state.dm_channels}
    return len(held) == segments and len(watched) == channels


async def load(c: QueryCluster, cid: int, replicas_asked: int) -> qc.LoadCollectionResponse:
    assert c.client is not None
    r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid,
                                                                         replica_number=replicas_asked))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    await c.wait_loaded(cid)
    await c.wait_idle()
    return r


async def test_two_replicas_hold_every_segment_and_channel_once_each(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 4) as c:
        cid = await c.create_collection("twice", partitions=2, segments=60, channels=3)
        await load(c, cid, 2)
        meta = c.coords[0].coord.leadership.meta
        groups = replicas(meta, cid)
        assert len(groups) == 2 and all(len(g) == 2 for g in groups.values()), groups
        a, b = groups.values()
        assert not a & b, "replicas never share a node"
        assert_once_per_replica(c.nodes, groups, 60, 3)
        shown = meta.replicas_of(cid)
        assert [r.in_memory_percentage for r in shown] == [100, 100]
        assert [r.segment_count for r in shown] == [60, 60] and all(len(r.dm_channels) == 3 for r in shown)
        info = meta.get_collection(cid)
        assert info is not None and info.replica_number == 2 and info.in_memory_percentage == 100
        for seg in meta.segments_of(cid):
            assert sorted(seg.replica_ids) == sorted(groups) and len(set(seg.node_ids)) == 2, seg
        assert all(v == 0 for v in (await c.task_keys()).values())

        # Reloaded from etcd (what a new leader reads): the same replicas and copies.
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        assert replicas(fresh, cid) == groups
        assert {s.segment_id: sorted(s.node_ids) for s in fresh.segments_of(cid)} == \
            {s.segment_id: sorted(s.node_ids) for s in meta.segments_of(cid)}


async def test_refusals_leave_nothing_written(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 3) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("refused", partitions=1, segments=6)
        before = await snapshot(c.kv)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=4))
        assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT, r.status
        assert "not enough nodes to create replicas" in r.status.reason and "3 online" in r.status.reason
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(
            collection_id=cid, partition_ids=[(await c.coords[0].coord.catalog.show_partitions(cid))[0].partition_id],
            replica_number=-1))
        assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "replica_number" in r.status.reason
        assert await snapshot(c.kv) == before, "a refused load writes nothing"

        await load(c, cid, 2)
        loaded = await snapshot(c.kv)
        # Another number resizes in place (tests/test_resize.py); here no spare node is left for two more replicas,
        # and the replicas can spare one node between them (tests/test_resize_rehome.py).
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=4))
        assert r.status.error_code == common_pb2.NO_AVAILABLE_NODE, r.status
        assert "needs 2 query nodes" in r.status.reason
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id == 0, "omitted: the loaded number"
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id == 0
        assert await snapshot(c.kv) == loaded

        # Released, it may be loaded again with another number.
        r = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        await load(c, cid, 3)
        assert len(replicas(c.coords[0].coord.leadership.meta, cid)) == 3


async def test_a_dead_nodes_copies_are_loaded_again_within_its_replica(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]
) -> None:
    async with running_cluster(etcd, root_path, [None] * 3) as c:
        proc, ready = await c.start_node_process(env=subprocess_env)
        dead = ready["node_id"]
        cid = await c.create_collection("down", partitions=2, segments=40, channels=2)
        await load(c, cid, 2)
        meta = c.coords[0].coord.leadership.meta
        groups = replicas(meta, cid)
        victim_replica = next(r for r, g in groups.items() if dead in g)
        other = next(r for r in groups if r != victim_replica)
        survivors = groups[victim_replica] - {dead}
        untouched = {n.node_id: set(n.state.segments) for n in c.nodes if n.node_id in groups[other]}
        assert meta.segments_on_node(dead), "the node process holds copies"

        await proc.kill()  # SIGKILL: its session lapses after the TTL, its copies are forgotten, the checker repairs
        await wait_until(lambda: not meta.segments_on_node(dead) and not meta.channels_on_node(dead),
                         "the dead node's copies forgotten")
        # Forgotten at once, loaded again by a repair the checker queues a moment later: waiting for an idle
        # scheduler alone could return in between (seen under load).
        await wait_until(lambda: whole(c.nodes, replicas(meta, cid)[victim_replica], 40, 2),
                         "the dead node's copies loaded again within its replica")
        await c.wait_idle()
        after = replicas(meta, cid)
        assert after[victim_replica] == survivors and after[other] == groups[other], after
        assert_once_per_replica(c.nodes, after, 40, 2)
        assert {n.node_id: set(n.state.segments) for n in c.nodes if n.node_id in groups[other]} == untouched, \
            "the other replica kept serving, untouched"
        assert all(v == 0 for v in (await c.task_keys()).values())


async def test_a_spare_node_joins_a_replica_left_without_nodes(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]
) -> None:
    async with running_cluster(etcd, root_path, [None] * 2) as c:
        proc, ready = await c.start_node_process(env=subprocess_env)
        dead = ready["node_id"]
        cid = await c.create_collection("spare", partitions=1, segments=20, channels=2)
        # Three nodes, two replicas: the process node alone in one of them? Not guaranteed: choose by the result.
        await load(c, cid, 3)
        meta = c.coords[0].coord.leadership.meta
        groups = replicas(meta, cid)
        assert sorted(len(g) for g in groups.values()) == [1, 1, 1]
        lonely = next(r for r, g in groups.items() if g == {dead})
        spare = await c.add_node()
        await c.wait_node_online(spare.node_id)
        assert meta.replica_of_node(cid, spare.node_id) == 0, "a new node serves no replica until one needs it"

        await proc.kill()
        await wait_until(lambda: spare.node_id in replicas(meta, cid)[lonely], "the spare joined the replica")
        await c.wait_idle()
        after = replicas(meta, cid)
        assert after[lonely] == {spare.node_id}
        assert_once_per_replica(c.nodes, after, 20, 2)
        assert all(v == 0 for v in (await c.task_keys()).values())


async def test_the_checker_repairs_one_replica_and_releases_a_copy_outside_it(etcd: EtcdCluster,
                                                                             root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 4, scheduler=fast_scheduler(),
                               checker_interval=0.3) as c:
        cid = await c.create_collection("heal", partitions=1, segments=16, channels=2)
        await load(c, cid, 2)
        meta = c.coords[0].coord.leadership.meta
        groups = replicas(meta, cid)
        r1, r2 = sorted(groups)
        by_id = {n.node_id: n for n in c.nodes}
        # A node of replica 1 loses three segments; a node of replica 2 gets a copy of one it holds in replica 1
        # on top of its own (a second copy within replica 2 is a stray: replica 2 already holds that segment).
        loser = by_id[min(groups[r1], key=lambda n: -len(by_id[n].state.segments))]
        lost = sorted(loser.state.segments)[:3]
        loser.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=lost))
        gainer_id = next(n for n in sorted(groups[r2]) if lost[0] not in by_id[n].state.segments)
        gainer = by_id[gainer_id]
        extra = querynode_pb2.LoadSegmentsRequest(collection_id=cid, infos=[data_pb2.SegmentLoadInfo(
            segment_id=lost[0], collection_id=cid, partition_id=meta.get_segment(lost[0]).partition_id,
            mem_size=10)])
        extra.node_id = gainer_id
        gainer.state.load_segments(extra)

        def repaired() -> bool:
            held = {r: Counter(s for m in g for s in by_id[m].state.segments) for r, g in groups.items()}
            return all(len(h) == 16 and set(h.values()) == {1} for h in held.values())

        await wait_until(repaired, "the checker reloaded replica 1's copies and released replica 2's extra")
        await c.wait_idle()
        assert replicas(meta, cid) == groups, "repairs stay within the replicas"
        assert_once_per_replica(c.nodes, groups, 16, 2)
        # The checker counted replica 1 short while it lacked copies; its next look counts it whole again.
        await wait_until(lambda: [r.in_memory_percentage for r in meta.replicas_of(cid)] == [100, 100],
                         "both replicas back at 100 %")


async def test_balance_moves_within_a_replica_only(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 4) as c:
        assert c.client is not None
        cid = await c.create_collection("bal", partitions=1, segments=20, channels=2)
        await load(c, cid, 2)
        meta = c.coords[0].coord.leadership.meta
        groups = replicas(meta, cid)
        r1, r2 = sorted(groups)
        src, mate = sorted(groups[r1])
        foreign = min(groups[r2])
        r = await c.client.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[src],
                                                                      dst_node_ids=[foreign]))
        assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "within its replica" in r.status.reason, r
        moved = [s.segment_id for s in meta.segments_on_node(src)][:3]
        r = await c.client.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[src], dst_node_ids=[mate],
                                                                      sealed_segment_ids=moved))
        assert r.status.error_code == common_pb2.SUCCESS, r
        await wait_until(lambda: all(meta.segment_copies(s).get(r1) == mate for s in moved), "the move")
        await c.wait_idle()
        assert replicas(meta, cid) == groups
        assert_once_per_replica(c.nodes, groups, 20, 2)


def test_auto_balance_plans_only_moves_its_predicate_allows() -> None:
    rates = {1: (900, 1000), 2: (100, 1000)}
    sizes = {1: [(10, 200), (11, 200), (12, 100)], 2: []}
    assert plan_move(rates, sizes, spread=0.3, memory_limit=0.9) is not None
    allowed = plan_move(rates, sizes, spread=0.3, memory_limit=0.9, movable=lambda src, seg, dst: seg == 12)
    assert allowed == (1, 2, [12])
    assert plan_move(rates, sizes, spread=0.3, memory_limit=0.9, movable=lambda *_: False) is None


async def test_replicas_survive_a_leader_change(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        first = await c.start_coordinator()
        await c.wait_leader()
        second = await c.start_coordinator()
        for _ in range(4):
            await c.add_node()
        cid = await c.create_collection("survive", partitions=1, segments=24, channels=2)
        await load(c, cid, 2)
        groups = replicas(first.coord.leadership.meta, cid)
        held = {n.node_id: set(n.state.segments) for n in c.nodes}
        await first.stop()
        leader = await c.wait_leader()
        assert leader is second
        await c.wait_idle()
        meta = second.coord.leadership.meta
        assert replicas(meta, cid) == groups
        assert {n.node_id: set(n.state.segments) for n in c.nodes} == held, "nothing moved on takeover"
        assert_once_per_replica(c.nodes, groups, 24, 2)


async def test_partitions_and_handoff_are_served_once_per_replica(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 4) as c:
        assert c.client is not None
        cid = await c.create_collection("parts", partitions=2, segments=20, channels=2)
        catalog = c.coords[0].coord.catalog
        p0, p1 = sorted(p.partition_id for p in await catalog.show_partitions(cid))
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p0],
                                                                            replica_number=2))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        await c.wait_idle()
        meta = c.coords[0].coord.leadership.meta
        groups = replicas(meta, cid)
        assert_once_per_replica(c.nodes, groups, 10, 2)
        # More partitions, number omitted: the loaded collection's two replicas take them.
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1]))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        await c.wait_idle()
        assert replicas(meta, cid) == groups
        assert_once_per_replica(c.nodes, groups, 20, 2)

        # A handoff: the compacted segment is loaded in each replica, its sources released in each.
        _, binlogs = await catalog.get_recovery_info(cid, p1)
        sources = [b.segment_id for b in binlogs[:2]]
        new_ids = await catalog.add_segments([data_pb2.SegmentBinlogs(
            collection_id=cid, partition_id=p1, num_rows=100, mem_size=1 << 20, binlog_paths=["x"],
            compaction_from=sources)])
        by_id = {n.node_id: n for n in c.nodes}

        def handed_off() -> bool:
            for g in groups.values():
                held = Counter(s for m in g for s in by_id[m].state.segments)
                if held.get(new_ids[0]) != 1 or any(s in held for s in sources):
                    return False
            return True

        await wait_until(handed_off, "the new segment in both replicas, its sources in neither")
        await c.wait_idle()
        assert sorted(meta.segment_copies(new_ids[0])) == sorted(groups)
        assert all(not meta.segment_copies(s) for s in sources)

        # Releasing one partition releases it in both replicas.
        r = await c.client.query("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid,
                                                                                  partition_ids=[p0]))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_idle()
        left = {s for n in c.nodes for s in n.state.segments}
        assert left == {s.segment_id for s in meta.segments_of(cid)} and len(left) == 9  # p1: 10 - 2 + 1
        assert_once_per_replica(c.nodes, groups, 9, 2)


async def test_each_replica_reports_its_own_progress_during_a_load(etcd: EtcdCluster, root_path: str) -> None:
    # Nodes of different speeds: a replica's two children finish far apart, and its progress shows the half.
    async with running_cluster(etcd, root_path, [FaultConfig(latency_ms=ms) for ms in (100, 400, 900, 1400)]) as c:
        assert c.client is not None
        cid = await c.create_collection("progress", partitions=1, segments=100, channels=1)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        meta = c.coords[0].coord.leadership.meta
        seen: list[tuple[int, ...]] = []
        while True:
            pct = tuple(x.in_memory_percentage for x in meta.replicas_of(cid))
            if not seen or seen[-1] != pct:
                seen.append(pct)
            info = meta.get_collection(cid)
            if info is not None and info.in_memory_percentage == 100:
                break
            await asyncio.sleep(0.02)
        await c.wait_idle()
        assert seen[-1] == (100, 100), seen
        assert all(len(p) == 2 for p in seen)
        for a, b in itertools.pairwise(seen):
            assert all(x <= y for x, y in zip(a, b, strict=True)), f"a replica's progress went down: {seen}"
        assert any(0 < x < 100 for p in seen for x in p), f"no progress was reported before the end: {seen}"


async def test_a_replica_with_no_node_is_parked_and_never_holds_up_a_release(
        etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]) -> None:
    """A replica left with no node and no spare is parked with its reason, never waited on: the other replica
    keeps serving, and a release of the collection (which needs no room) answers at once."""
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.client is not None
        proc, ready = await c.start_node_process(env=subprocess_env)
        cid = await c.create_collection("stuck", partitions=1, segments=10, channels=2)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        await c.wait_idle()
        lead = c.coords[0].coord.leadership
        meta = lead.meta
        assert sorted(len(x.node_ids) for x in meta.replicas_of(cid)) == [1, 1]
        orphan = meta.replica_of_node(cid, ready["node_id"])
        await proc.kill()  # its replica is left with no node, and there is no spare
        deadline = time.monotonic() + 30
        while lead.env.parked.get(cid, orphan) is None:
            assert time.monotonic() < deadline, "the replica with no node was never parked"
            await asyncio.sleep(0.05)
        parked = lead.env.parked.get(cid, orphan)
        assert parked.code == "no_node" and "no online query node" in parked.reason, parked
        assert meta.replica_nodes(cid, orphan) == [], "the dead node left its replica"
        reps = await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
        by_id = {x.replica_id: x.in_memory_percentage for x in reps.replicas}
        assert by_id[orphan] == 0 and max(by_id.values()) == 100, by_id
        assert not lead.scheduler.pending(), "nothing is queued for a replica that cannot be placed"
        r = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_idle()
        assert all(v == 0 for v in (await c.task_keys()).values())
        assert not c.nodes[0].state.segments and not c.nodes[0].state.dm_channels
        assert lead.env.parked.get(cid, orphan) is None
