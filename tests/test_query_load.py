"""Query coordination end to end: real etcd, a real coordinator gRPC server, real query nodes."""

from __future__ import annotations

import pytest

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from tests.cluster import QueryCluster, held_segments, running_cluster


@pytest.fixture
async def cluster(etcd: EtcdCluster, root_path: str):
    async with running_cluster(etcd, root_path, [None] * 3) as c:
        yield c


async def test_load_and_release_collection(cluster: QueryCluster) -> None:
    cid = await cluster.create_collection("c1", partitions=4, segments=200)
    resp = await cluster.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    assert resp.status.error_code == common_pb2.SUCCESS, resp
    assert resp.task_id > 0
    await cluster.wait_loaded(cid)
    await cluster.wait_idle()
    held = [held_segments(n) for n in cluster.nodes]
    all_held = set().union(*held)
    assert len(all_held) == 200 and sum(len(h) for h in held) == 200, "each segment on exactly one node"
    assert all(h for h in held), "segments spread over every node"
    leader = (await cluster.wait_leader()).coord.leadership
    assert {s.segment_id for s in leader.meta.segments_of(cid)} == all_held, "query meta equals the distribution"
    assert await cluster.task_keys() == {k: 0 for k in await cluster.task_keys()}, "a finished tree leaves no key"

    again = await cluster.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    assert again.status.error_code == common_pb2.SUCCESS and again.task_id == 0, "already loaded: nothing queued"

    rel = await cluster.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
    assert rel.status.error_code == common_pb2.SUCCESS, rel
    assert all(not held_segments(n) for n in cluster.nodes)
    assert not leader.meta.has_collection(cid)
    show = await cluster.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    assert show.status.error_code == common_pb2.NOT_FOUND and "has not been loaded" in show.status.reason
    assert all(v == 0 for v in (await cluster.task_keys()).values())


async def test_partitions_load_release_and_api_errors(cluster: QueryCluster) -> None:
    q = cluster.client.query
    cid = await cluster.create_collection("parts", partitions=4, segments=40)
    pids = sorted(p.partition_id for p in (await cluster.coords[0].coord.catalog.show_partitions(cid)))

    bad = await q("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[]))
    assert bad.status.error_code == common_pb2.ILLEGAL_ARGUMENT
    unknown = await q("LoadCollection", qc.LoadCollectionRequest(collection_id=987654))
    assert unknown.status.error_code == common_pb2.NOT_FOUND
    assert (await q("ShowPartitions", qc.ShowPartitionsRequest(collection_id=cid))).status.error_code == \
        common_pb2.NOT_FOUND
    assert (await q("GetPartitionStates", qc.GetPartitionStatesRequest(collection_id=cid))).status.error_code == \
        common_pb2.NOT_FOUND
    assert (await q("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))).status.error_code == \
        common_pb2.SUCCESS, "releasing what is not loaded is success"

    r = await q("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids[:2]))
    assert r.status.error_code == common_pb2.SUCCESS, r
    await cluster.wait_loaded(cid)
    await cluster.wait_idle()
    states = await q("GetPartitionStates", qc.GetPartitionStatesRequest(collection_id=cid))
    assert [(p.partition_id, p.in_memory_percentage) for p in states.partition_descriptions] == \
        [(pids[0], 100), (pids[1], 100)]
    same = await q("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids[:2]))
    assert same.status.error_code == common_pb2.SUCCESS and same.task_id == 0
    mixed = await q("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids[1:3]))
    assert mixed.status.error_code == common_pb2.CONFLICT
    as_coll = await q("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    assert as_coll.status.error_code == common_pb2.CONFLICT and "release partitions first" in as_coll.status.reason

    more = await q("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids[2:3]))
    assert more.status.error_code == common_pb2.SUCCESS
    await cluster.wait_loaded(cid)
    await cluster.wait_idle()
    held = set().union(*(n.state.segments for n in cluster.nodes))
    assert len(held) == 30, "three of four partitions of 40 segments"

    rel = await q("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=[pids[0]]))
    assert rel.status.error_code == common_pb2.SUCCESS, rel
    held = set().union(*(n.state.segments for n in cluster.nodes))
    assert len(held) == 20
    show = await q("ShowPartitions", qc.ShowPartitionsRequest(collection_id=cid))
    assert sorted(p.partition_id for p in show.partitions) == pids[1:3]
    # Releasing every loaded partition releases the collection.
    rel = await q("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=pids))
    assert rel.status.error_code == common_pb2.SUCCESS, rel
    assert not set().union(*(n.state.segments for n in cluster.nodes))
    assert (await q("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))).status.error_code == \
        common_pb2.NOT_FOUND
    assert all(v == 0 for v in (await cluster.task_keys()).values())


async def test_collection_loaded_as_whole_refuses_partition_calls(cluster: QueryCluster) -> None:
    q = cluster.client.query
    cid = await cluster.create_collection("whole", partitions=2, segments=10)
    pids = sorted(p.partition_id for p in (await cluster.coords[0].coord.catalog.show_partitions(cid)))
    await q("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    await cluster.wait_loaded(cid)
    r = await q("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids[:1]))
    assert r.status.error_code == common_pb2.CONFLICT
    r = await q("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=pids[:1]))
    assert r.status.error_code == common_pb2.CONFLICT
    seg = await q("GetSegmentInfo", qc.GetSegmentInfoRequest(collection_id=cid))
    assert seg.status.error_code == common_pb2.SUCCESS and len(seg.infos) == 10
    missing = await q("GetSegmentInfo", qc.GetSegmentInfoRequest(segment_ids=[123456789]))
    assert missing.status.error_code == common_pb2.NOT_FOUND


async def test_load_balance_user_and_errors(cluster: QueryCluster) -> None:
    q = cluster.client.query
    cid = await cluster.create_collection("bal", partitions=1, segments=30)
    await q("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    await cluster.wait_loaded(cid)
    await cluster.wait_idle()
    src, dst = cluster.nodes[0], cluster.nodes[1]
    assert (await q("LoadBalance", qc.LoadBalanceRequest())).status.error_code == common_pb2.ILLEGAL_ARGUMENT
    assert (await q("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[424242]))).status.error_code == \
        common_pb2.NOT_FOUND
    not_there = sorted(dst.state.segments)[:1]
    r = await q("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[src.node_id], sealed_segment_ids=not_there))
    assert r.status.error_code == common_pb2.NOT_FOUND
    moving = sorted(src.state.segments)
    r = await q("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[src.node_id], dst_node_ids=[dst.node_id]))
    assert r.status.error_code == common_pb2.SUCCESS
    await cluster.wait_idle()
    assert not src.state.segments, "every segment moved off the source"
    assert set(moving) <= set(dst.state.segments)
    held = [set(n.state.segments) for n in cluster.nodes]
    assert sum(len(h) for h in held) == 30 == len(set().union(*held)), "moved, not duplicated"
    lead = (await cluster.wait_leader()).coord.leadership
    assert all(lead.meta.get_segment(s).node_id == dst.node_id for s in moving)


async def test_show_nodes_reports_what_meta_places(cluster: QueryCluster) -> None:
    cid = await cluster.create_collection("nodes", partitions=1, segments=12)
    await cluster.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    await cluster.wait_loaded(cid)
    await cluster.wait_idle()
    resp = await cluster.client.query("ShowNodes", qc.ShowNodesRequest())
    assert resp.status.error_code == common_pb2.SUCCESS
    by_id = {n.node_id: n for n in resp.nodes}
    for node in cluster.nodes:
        info = by_id[node.node_id]
        assert info.state == "online" and info.address == node.address
        assert info.segment_count == len(node.state.segments)
    assert sum(n.segment_count for n in resp.nodes) == 12
