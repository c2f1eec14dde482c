"""Scheduler rules against real etcd and real nodes: splitting, limits, waits, standbys, reload, priority."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from meta.errors import RequestTooLarge
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.nodes.querynode import FaultConfig
from querycoord.task.assign import merge_by_size
from querycoord.task.model import DONE, UNDO
from querycoord.task.store import TaskStore, save_unit
from tests.cluster import MiB, QueryCluster, running_cluster, wait_until


def test_requests_are_split_at_200kb_on_the_wire() -> None:
    infos = [data_pb2.SegmentLoadInfo(segment_id=i, collection_id=1, partition_id=2, mem_size=1 << 20,
                                      binlog_paths=[f"files/1/2/{i}/{f}/binlog-{'x' * 40}" for f in range(4)])
             for i in range(3000)]
    groups = merge_by_size(infos, 200_000)
    assert len(groups) > 3
    assert [i.segment_id for g in groups for i in g] == list(range(3000)), "every segment once, in order"
    for g in groups:
        req = querynode_pb2.LoadSegmentsRequest(collection_id=1, infos=g)
        assert req.ByteSize() <= 200_000 + 64


async def test_a_child_over_the_etcd_limit_is_refused_before_sending(kv) -> None:
    store = TaskStore(kv)
    parent = task_pb2.TaskRecord(id=1, kind=qc.TASK_KIND_LOAD_COLLECTION, state=DONE)
    parent.load_collection.collection_id = 1
    child = task_pb2.TaskRecord(id=2, parent_id=1, kind=qc.TASK_KIND_LOAD_SEGMENT, state=UNDO)
    child.load_segments.infos.add(segment_id=1, binlog_paths=["x" * 1_700_000])
    with pytest.raises(RequestTooLarge):
        await store.commit_children(parent, [child])
    assert all(v == 0 for v in (await store.count_keys()).values()), "nothing half-written"


async def test_a_child_done_rewrites_only_its_info_and_reloads_done_with_its_request(kv) -> None:
    """``save_state`` (a child done) writes the info key alone; the request key keeps its bytes (its revision does
    not move) and a reload joins the DONE state with that request."""
    store = TaskStore(kv)
    parent = task_pb2.TaskRecord(id=1, kind=qc.TASK_KIND_LOAD_COLLECTION, state=DONE)
    parent.load_collection.collection_id = 1
    child = task_pb2.TaskRecord(id=2, parent_id=1, kind=qc.TASK_KIND_LOAD_SEGMENT, state=UNDO)
    child.load_segments.collection_id = 1
    child.load_segments.infos.add(segment_id=7, partition_id=3, mem_size=5)
    await store.commit_children(parent, [child])
    before = (await kv.load_prefix("queryCoord-activeTask/")).kvs
    child.state = DONE
    child.retry_count = 1
    txns = store.txns
    await store.save_state(child)
    assert store.txns == txns + 1
    after = (await kv.load_prefix("queryCoord-activeTask/")).kvs
    assert [(x.key, x.value, x.mod_revision) for x in after] == [(x.key, x.value, x.mod_revision) for x in before]
    reloaded = {r.id: r for r in await store.load_all()}
    assert reloaded[2] == child and reloaded[1] == parent
    assert store.orphan_request_keys == []


def count_load_calls(nodes: list[Any]) -> dict[int, int]:
    """The most LoadSegments calls each node has had in flight at once, kept up to date as the nodes answer."""
    in_flight: dict[int, int] = {}
    most: dict[int, int] = {}
    for node in nodes:
        mutate = node.mutate

        async def counted(kind: str, *args: Any, node: Any = node, mutate: Any = mutate) -> Any:
            if kind != "LoadSegments":
                return await mutate(kind, *args)
            nid = node.node_id
            in_flight[nid] = in_flight.get(nid, 0) + 1
            most[nid] = max(most.get(nid, 0), in_flight[nid])
            try:
                return await mutate(kind, *args)
            finally:
                in_flight[nid] -= 1

        node.mutate = counted
    return most


async def test_a_node_gets_one_load_call_at_a_time_and_the_load_finishes(etcd: EtcdCluster, root_path: str) -> None:
    """``node_load_concurrency`` 1 (the default): however many load children a node has, it never has two
    LoadSegments calls in flight from the leader; with 2, two at once (the children start together and each call
    waits 300 ms on the node). Counted inside the node."""
    slow = FaultConfig(latency_ms=300)
    for concurrency in (1, 2):
        async with running_cluster(etcd, f"{root_path}/{concurrency}", [slow, slow]) as c:
            c.config.scheduler.max_request_bytes = 2000  # several small load children per node
            c.config.scheduler.node_load_concurrency = concurrency
            most = count_load_calls(c.nodes)
            cid = await c.create_collection("gated", partitions=2, segments=60)
            await c.load_collection(cid)
            await c.wait_idle()
            assert sum(len(n.state.segments) for n in c.nodes) == 60
            assert set(most) == {n.node_id for n in c.nodes}, most
            assert max(most.values()) == concurrency, most


async def test_node_load_concurrency_is_an_option_of_at_least_one() -> None:
    import argparse

    from querycoord.settings.coord_options import add_coord_options, config_from_args

    p = argparse.ArgumentParser()
    add_coord_options(p)
    etcd = ["--etcd-endpoints", "127.0.0.1:2379"]
    assert config_from_args(p.parse_args(etcd)).scheduler.node_load_concurrency == 1
    assert config_from_args(p.parse_args([*etcd, "--node-load-concurrency", "4"])).scheduler.node_load_concurrency == 4
    with pytest.raises(ValueError, match="--node-load-concurrency must be at least 1, got 0"):
        config_from_args(p.parse_args([*etcd, "--node-load-concurrency", "0"]))


async def test_load_with_no_node_fails_clearly(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        cid = await c.create_collection("lonely", partitions=1, segments=5)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.NO_AVAILABLE_NODE, r
        assert "no online query node" in r.status.reason
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.status.error_code == common_pb2.NOT_FOUND
        assert all(v == 0 for v in (await c.task_keys()).values())


async def test_a_node_down_with_no_room_parks_its_unit_and_a_new_node_takes_it(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]
) -> None:
    """Nothing waits for room: the dead node's copies that fit nowhere are parked with their reason (no trigger
    holds a slot or persists a key meanwhile, no failing repair is queued pass after pass), and a node that joins
    takes them."""
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        small = await c.add_node(capacity=8 * MiB)  # cannot take the big node's segments
        proc, ready = await c.start_node_process("--capacity-mb", "1024", env=subprocess_env)
        cid = await c.create_collection("big", partitions=1, segments=20)  # ~5 MB each
        await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        await c.wait_loaded(cid)
        await c.wait_idle()
        on_big = {s.segment_id for s in lead.meta.segments_on_node(ready["node_id"])}
        assert len(on_big) >= 19
        await proc.kill()  # SIGKILL, and reaped
        deadline = time.monotonic() + 30
        while lead.env.parked.get(cid, lead.meta.replica_ids(cid)[0]) is None:
            assert time.monotonic() < deadline, "the unit that cannot be placed was never parked"
            await asyncio.sleep(0.1)
        parked = lead.env.parked.get(cid, lead.meta.replica_ids(cid)[0])
        assert parked is not None and parked.code == "no_room" and "no room for" in parked.reason, parked
        runs = lead.checker.runs if lead.checker else 0
        while (lead.checker.runs if lead.checker else 0) < runs + 2:  # two more passes: still nothing queued
            lead.checker.kick() if lead.checker else None
            await asyncio.sleep(0.05)
        keys = await c.task_keys()
        assert all(v == 0 for v in keys.values()), f"nothing waits inside a trigger: {keys}"
        assert not lead.scheduler.pending(), "no repair is queued while the unit cannot be placed"
        assert not set(small.state.segments) & on_big
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.collections[0].in_memory_percentage < 100, "what no node holds is not shown as loaded"
        newcomer = await c.add_node(capacity=1024 * MiB)
        await c.wait_loaded(cid, timeout=60)
        await c.wait_idle(timeout=60)
        assert on_big <= set(newcomer.state.segments) | set(small.state.segments)
        assert lead.env.parked.get(cid, lead.meta.replica_ids(cid)[0]) is None
        assert all(v == 0 for v in (await c.task_keys()).values()), "no trigger key remains"


async def test_a_standby_answers_reads_from_etcd_and_sends_the_rest_to_the_leader(
    etcd: EtcdCluster, root_path: str
) -> None:
    async with running_cluster(etcd, root_path, [None]) as c:
        leader = await c.wait_leader()
        cid = await c.create_collection("seen", partitions=1, segments=4)
        await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        await c.wait_loaded(cid)
        standby = await c.start_coordinator()
        await asyncio.sleep(0.3)
        assert not standby.coord.is_leader
        import grpc

        from proto import querycoord_pb2_grpc
        from querycoord.net.client import QueryCoordClient

        async with grpc.aio.insecure_channel(standby.address) as ch:
            stub = querycoord_pb2_grpc.QueryCoordStub(ch)
            for method, req in [
                ("LoadCollection", qc.LoadCollectionRequest(collection_id=1)),
                ("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=1)),
                ("LoadPartitions", qc.LoadPartitionsRequest(collection_id=1, partition_ids=[1])),
                ("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=1, partition_ids=[1])),
                ("ShowPartitions", qc.ShowPartitionsRequest(collection_id=1)),
                ("GetPartitionStates", qc.GetPartitionStatesRequest(collection_id=1)),
                ("GetSegmentInfo", qc.GetSegmentInfoRequest()),
                ("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[1])),
                ("ShowNodes", qc.ShowNodesRequest()),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await getattr(stub, method)(req, timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE, method
                assert f"the leader is at {leader.address}" in (e.value.details() or ""), method
            # Reads a standby answers from etcd.
            show = await stub.ShowCollections(qc.ShowCollectionsRequest(), timeout=5)
            assert show.status.error_code == common_pb2.SUCCESS
            assert [(x.collection_id, x.in_memory_percentage) for x in show.collections] == [(cid, 100)]
            tasks = await stub.ListTasks(qc.ListTasksRequest(), timeout=5)
            assert tasks.status.error_code == common_pb2.SUCCESS
            got = await stub.GetTask(qc.GetTaskRequest(task_id=10**15), timeout=5)  # running trees and history
            assert got.status.error_code == common_pb2.NOT_FOUND, got.status
            health = await stub.GetComponentStates(qc.GetComponentStatesRequest(), timeout=5)
            assert health.state.state_code == common_pb2.STANDBY
        # The client helper, pointed at the standby first, follows to the leader.
        follower = QueryCoordClient([standby.address], deadline=10)
        resp = await follower.query("ShowNodes", qc.ShowNodesRequest())
        assert resp.status.error_code == common_pb2.SUCCESS and follower.leader_changes == 1
        await follower.close()


async def test_reload_adopts_committed_children_and_drops_uncommitted_ones(etcd: EtcdCluster, root_path: str) -> None:
    """Done trigger: its Done child is not re-run, its Undo child is; Undo trigger: its children are garbage."""
    async with QueryCluster(etcd, root_path) as c:
        # Prepare meta as a dead leader would have left it: a collection being loaded on node N.
        node = await c.add_node()
        store = TaskStore(c.kv)
        from meta.idalloc import IdAllocator

        ids = list(await IdAllocator(c.kv, "idalloc/task").allocate(6))
        done_trigger = task_pb2.TaskRecord(id=ids[0], kind=qc.TASK_KIND_RELEASE_COLLECTION, state=DONE,
                                           collection_id=777, trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST)
        done_trigger.release_collection.collection_id = 777
        ran = task_pb2.TaskRecord(id=ids[1], parent_id=ids[0], kind=qc.TASK_KIND_RELEASE_COLLECTION, state=DONE,
                                  node_id=node.node_id, collection_id=777)
        ran.release_collection_on_node.collection_id = 777
        pending = task_pb2.TaskRecord(id=ids[2], parent_id=ids[0], kind=qc.TASK_KIND_RELEASE_COLLECTION,
                                      state=UNDO, node_id=node.node_id, collection_id=777)
        pending.release_collection_on_node.collection_id = 777
        uncommitted_trigger = task_pb2.TaskRecord(id=ids[3], kind=qc.TASK_KIND_RELEASE_COLLECTION, state=UNDO,
                                                  collection_id=778,
                                                  trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST)
        uncommitted_trigger.release_collection.collection_id = 778
        stray = task_pb2.TaskRecord(id=ids[4], parent_id=ids[3], kind=qc.TASK_KIND_RELEASE_COLLECTION, state=UNDO,
                                    node_id=node.node_id, collection_id=778)
        stray.release_collection_on_node.collection_id = 778
        half_resched = task_pb2.TaskRecord(id=ids[5], parent_id=ids[0], kind=qc.TASK_KIND_RELEASE_COLLECTION,
                                           state=UNDO, node_id=node.node_id, collection_id=777,
                                           replaces_task_id=ids[2])
        half_resched.release_collection_on_node.collection_id = 777
        recs = [done_trigger, ran, pending, uncommitted_trigger, stray, half_resched]
        keys = {k: v for r in recs for k, v in save_unit(r).saves.items()}
        keys["queryCoord-activeTask/999999999"] = b"a request whose record was lost"  # an orphan
        await c.kv.chunked_save_non_atomic(keys)
        assert (await store.count_keys())["queryCoord-activeTask/"] == 5

        await c.start_coordinator()
        await c.wait_leader()
        await c.wait_idle()
        assert all(v == 0 for v in (await c.task_keys()).values())
        # The Done trigger kept its committed children (the replacement whose predecessor still existed is
        # dropped); the Undo trigger was planned again, without its stray child.
        finished = {t.trigger.task_id: t for t in c.coords[0].coord.leadership.scheduler.finished}
        assert finished[ids[0]].trigger.state == qc.TASK_STATE_EXPIRED
        assert {ch.task_id for ch in finished[ids[0]].children} == {ids[1], ids[2]}
        assert finished[ids[3]].trigger.state == qc.TASK_STATE_EXPIRED
        assert ids[4] not in {ch.task_id for ch in finished[ids[3]].children}, "uncommitted child dropped"


async def test_queue_order_is_priority_then_fifo(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        sched = lead.scheduler
        # A new leader starts dispatching once, after its checker's first pass (``_dispatch_after_first_pass``):
        # stopped before that, the scheduler was started again under this test, which then saw its triggers run
        # instead of queued. So that start comes first, then the stop.
        await wait_until(lambda: sched.dispatching, "the leader dispatching")
        await sched.stop()  # stop dispatching; inspect the heap order only
        sched.stopped = False
        from querycoord.task.triggers import HandoffTask, LoadBalanceTask, ReleaseCollectionTask

        made = []
        for cls, req, cond in [
            (HandoffTask, task_pb2.HandoffSegmentsRequest(), qc.TRIGGER_CONDITION_HANDOFF),
            (ReleaseCollectionTask, qc.ReleaseCollectionRequest(collection_id=5), qc.TRIGGER_CONDITION_GRPC_REQUEST),
            (LoadBalanceTask, qc.LoadBalanceRequest(source_node_ids=[9]), qc.TRIGGER_CONDITION_LOAD_BALANCE),
            (LoadBalanceTask, qc.LoadBalanceRequest(source_node_ids=[8], reason=qc.BALANCE_REASON_NODE_DOWN),
             qc.TRIGGER_CONDITION_NODE_DOWN),
            (ReleaseCollectionTask, qc.ReleaseCollectionRequest(collection_id=6), qc.TRIGGER_CONDITION_GRPC_REQUEST),
        ]:
            t = cls.new(lead.env, req, trigger_condition=cond)
            await sched.enqueue(t)
            made.append(t)
        order = sched.queue.queued_order()
        by_id = {t.id: t for t in made}
        assert [by_id[i].rec.trigger_condition for i in order] == [
            qc.TRIGGER_CONDITION_NODE_DOWN, qc.TRIGGER_CONDITION_GRPC_REQUEST, qc.TRIGGER_CONDITION_GRPC_REQUEST,
            qc.TRIGGER_CONDITION_LOAD_BALANCE, qc.TRIGGER_CONDITION_HANDOFF]
        assert order[1] < order[2], "FIFO within one priority"
        sched.stopped = True
