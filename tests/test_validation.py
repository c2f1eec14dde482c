"""Validation at the edge: every service refuses malformed requests up front, and writes nothing.

Real etcd, a real coordinator (its gRPC server in this process) and real query
nodes; every request goes through the generated stubs. Each refusal must be
ILLEGAL_ARGUMENT naming the field (and the limit when there is one), and the
keys under the root must be exactly what they were before. Session values in
etcd are input too: garbage under the session prefixes is ignored and the
watchers keep seeing real nodes. The pure validators are also checked with
hypothesis (any value: refused with the field named, or inside its bounds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session, SessionInfo
from proto import (
    catalog_pb2,
    catalog_pb2_grpc,
    common_pb2,
    data_pb2,
    querycoord_pb2_grpc,
    querynode_pb2,
    querynode_pb2_grpc,
    stream_pb2,
    stream_pb2_grpc,
)
from proto import querycoord_pb2 as qc
from querycoord.catalog.service import check_create_collection
from querycoord.catalog.store import CatalogStore, InvalidArgument
from querycoord.cli import build_parser
from querycoord.common.limits import Limits
from querycoord.common.validate import InvalidField, check_ids, check_name, shown
from querycoord.nodes.querynode import QueryNode
from querycoord.serving.stream_service import check_heartbeat
from querycoord.settings.config_file import apply_layers
from querycoord.settings.coord_options import config_from_args
from tests.cluster import MiB, QueryCluster
from tests.stream_client import wait_for

ILLEGAL = common_pb2.ILLEGAL_ARGUMENT
INT64_MAX = 2**63 - 1
# Keys that move on their own (leases, elections): everything else under the root must stay byte for byte.
_MOVING = ("session/", "election/")


async def snapshot(kv: MetaKV) -> dict[str, bytes]:
    items = (await kv.load_prefix("")).as_dict()
    return {k: v for k, v in items.items() if not k.startswith(_MOVING)}


def assert_refused(status: common_pb2.Status, field: str, limit: str | None = None) -> None:
    """ILLEGAL_ARGUMENT whose reason names ``field`` (and ``limit``), and is short whatever was sent."""
    assert status.error_code == ILLEGAL, status
    assert f"invalid {field}:" in status.reason, status.reason
    if limit is not None:
        assert limit in status.reason, status.reason
    assert len(status.reason) < 600, status.reason


@contextlib.asynccontextmanager
async def cluster(etcd: EtcdCluster, root: str, *, nodes: int = 0, limits: Limits | None = None
                  ) -> AsyncIterator[QueryCluster]:
    async with QueryCluster(etcd, root) as c:
        if limits is not None:
            c.config.limits = limits
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(nodes):
            node = await c.add_node(capacity=1024 * MiB)
            await c.wait_node_online(node.node_id)
        yield c


@contextlib.asynccontextmanager
async def channel(address: str) -> AsyncIterator[grpc.aio.Channel]:
    ch = grpc.aio.insecure_channel(address)
    try:
        yield ch
    finally:
        await ch.close()


# ----- Catalog --------------------------------------------------------------------------------------------------------
async def test_catalog_refuses_bad_requests_and_writes_nothing(etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    async with cluster(etcd, root_path) as c, channel(c.coords[0].address) as ch:
        stub = catalog_pb2_grpc.CatalogStub(ch)
        ok = await stub.CreateCollection(catalog_pb2.CreateCollectionRequest(collection_name="c1", num_partitions=2))
        assert ok.status.error_code == common_pb2.SUCCESS, ok.status
        cid, pid = ok.collection.collection_id, ok.collection.partitions[0].partition_id
        before = await snapshot(kv)

        field = catalog_pb2.FieldSchema
        cr = catalog_pb2.CreateCollectionRequest
        seg = data_pb2.SegmentBinlogs
        cases: list[tuple[Any, Any, str, str | None]] = [
            (stub.CreateCollection, cr(collection_name="c2", num_partitions=2**31 - 1), "num_partitions", "4096"),
            (stub.CreateCollection, cr(collection_name="c2", num_partitions=-1), "num_partitions", "4096"),
            (stub.CreateCollection, cr(collection_name="c2", partition_names=[f"p{i}" for i in range(5000)]),
             "partition_names", "4096"),
            (stub.CreateCollection, cr(collection_name="x" * 100_000), "collection_name", "255"),
            (stub.CreateCollection, cr(collection_name="a\x00b"), "collection_name", None),
            (stub.CreateCollection, cr(collection_name="c2", partition_names=["ok", "bad\nname"]), "partition_names",
             None),
            (stub.CreateCollection, cr(collection_name="c2", num_dm_channels=2**31 - 1), "num_dm_channels", "64"),
            (stub.CreateCollection, cr(collection_name="c2", schema=catalog_pb2.CollectionSchema(
                fields=[field(name="f", data_type=999)])), "schema.fields.data_type", None),  # type: ignore[arg-type]
            (stub.CreateCollection, cr(collection_name="c2", schema=catalog_pb2.CollectionSchema(
                fields=[field(name=f"f{i}", data_type=catalog_pb2.DATA_TYPE_INT64) for i in range(100)])),
             "schema.fields", "64"),
            (stub.DescribeCollection, catalog_pb2.DescribeCollectionRequest(collection_id=-5), "collection_id", None),
            (stub.DropCollection, catalog_pb2.DropCollectionRequest(collection_name="y" * 1000), "collection_name",
             "255"),
            (stub.ShowPartitions, catalog_pb2.ShowPartitionsRequest(collection_id=-1), "collection_id", None),
            (stub.AddSegments, catalog_pb2.AddSegmentsRequest(collection_id=cid), "segments", None),
            (stub.AddSegments, catalog_pb2.AddSegmentsRequest(
                collection_id=cid, segments=[seg(partition_id=pid) for _ in range(10_001)]), "segments", "10000"),
            (stub.AddSegments, catalog_pb2.AddSegmentsRequest(
                collection_id=cid, segments=[seg(partition_id=-3)]), "segments.partition_id", None),
            (stub.AddSegments, catalog_pb2.AddSegmentsRequest(
                collection_id=cid, segments=[seg(partition_id=pid, binlog_paths=["a\x01b"])]),
             "segments.binlog_paths", None),
            (stub.AddSegments, catalog_pb2.AddSegmentsRequest(
                collection_id=cid, segments=[seg(partition_id=pid, compaction_from=[5, 5])]),
             "segments.compaction_from", None),
            (stub.AddSegments, catalog_pb2.AddSegmentsRequest(
                collection_id=cid, segments=[seg(partition_id=pid, num_rows=-1)]), "segments.num_rows", None),
            (stub.GetRecoveryInfo, catalog_pb2.GetRecoveryInfoRequest(collection_id=cid, partition_id=pid,
                                                                      page_size=-1), "page_size", None),
            (stub.GetRecoveryInfo, catalog_pb2.GetRecoveryInfoRequest(collection_id=cid, partition_id=0),
             "partition_id", None),
            (stub.GetRecoveryInfo, catalog_pb2.GetRecoveryInfoRequest(
                collection_id=cid, partition_id=pid, segment_ids=range(1, 70_002)), "segment_ids", "65536"),
        ]
        for method, request, name, limit in cases:
            resp = await method(request)
            assert_refused(resp.status, name, limit)
        assert await snapshot(kv) == before, "a refused catalog request wrote something"
        # The coordinator is alive and still serves.
        again = await stub.CreateCollection(catalog_pb2.CreateCollectionRequest(collection_name="c2"))
        assert again.status.error_code == common_pb2.SUCCESS, again.status
        assert c.coords[0].coord.is_leader


async def test_two_billion_partitions_are_refused_before_anything_is_built(
        etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    """The request that took the coordinator to 23 GB: refused, naming num_partitions and the limit, whether it
    comes over gRPC or straight to the store; the process stays up and nothing is written."""
    async with cluster(etcd, root_path) as c, channel(c.coords[0].address) as ch:
        stub = catalog_pb2_grpc.CatalogStub(ch)
        before = await snapshot(kv)
        resp = await stub.CreateCollection(
            catalog_pb2.CreateCollectionRequest(collection_name="huge", num_partitions=2**31 - 1), timeout=30)
        assert_refused(resp.status, "num_partitions", "1..4096, or 0 for the default")
        with pytest.raises(InvalidArgument, match="at most 4096"):
            await CatalogStore(kv).create_collection("huge", num_partitions=2**31 - 1)
        with pytest.raises(InvalidArgument, match=r"at most 10 \(limit max_partitions\)"):
            await CatalogStore(kv, limits=Limits(max_partitions=10)).create_collection("huge", num_partitions=11)
        assert await snapshot(kv) == before
        assert c.coords[0].coord.is_leader
        shown_ = await stub.ShowCollections(catalog_pb2.ShowCollectionsRequest())
        assert shown_.status.error_code == common_pb2.SUCCESS and not shown_.collections


# ----- QueryCoord -----------------------------------------------------------------------------------------------------
async def test_querycoord_refuses_bad_requests_and_queues_nothing(
        etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    async with cluster(etcd, root_path, nodes=1) as c, channel(c.coords[0].address) as ch:
        stub = querycoord_pb2_grpc.QueryCoordStub(ch)
        cid = await c.create_collection("q", partitions=2, segments=4)
        pids = [p.partition_id for p in (await CatalogStore(kv).describe_collection(cid)).partitions]
        nid = c.nodes[0].node_id
        before = await snapshot(kv)

        cases: list[tuple[Any, Any, str, str | None]] = [
            (stub.LoadCollection, qc.LoadCollectionRequest(collection_id=0), "collection_id", None),
            (stub.LoadCollection, qc.LoadCollectionRequest(collection_id=-7), "collection_id", None),
            (stub.LoadCollection, qc.LoadCollectionRequest(collection_id=cid, replica_number=-1), "replica_number",
             "1..16"),
            (stub.LoadCollection, qc.LoadCollectionRequest(collection_id=cid, replica_number=2**31 - 1),
             "replica_number", "1..16"),
            (stub.ReleaseCollection, qc.ReleaseCollectionRequest(collection_id=-7), "collection_id", None),
            (stub.LoadPartitions, qc.LoadPartitionsRequest(collection_id=cid), "partition_ids", None),
            (stub.LoadPartitions, qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[pids[0], pids[0]]),
             "partition_ids", None),
            (stub.LoadPartitions, qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[-1]), "partition_ids",
             None),
            (stub.LoadPartitions, qc.LoadPartitionsRequest(collection_id=cid, partition_ids=range(1, 5000)),
             "partition_ids", "4096"),
            (stub.LoadPartitions, qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids, replica_number=-3),
             "replica_number", "1..16"),
            (stub.ReleasePartitions, qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=[pids[1]] * 2),
             "partition_ids", None),
            (stub.LoadBalance, qc.LoadBalanceRequest(), "source_node_ids", None),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=[nid, nid]), "source_node_ids", None),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=[nid], dst_node_ids=[nid]), "dst_node_ids",
             None),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=[nid], reason=99), "reason",  # type: ignore
             None),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=[nid], sealed_segment_ids=[0]),
             "sealed_segment_ids", None),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=range(1, 2000)), "source_node_ids", "1024"),
            (stub.ShowCollections, qc.ShowCollectionsRequest(collection_ids=[-1]), "collection_ids", None),
            (stub.ShowPartitions, qc.ShowPartitionsRequest(collection_id=0), "collection_id", None),
            (stub.GetPartitionStates, qc.GetPartitionStatesRequest(collection_id=cid, partition_ids=[0]),
             "partition_ids", None),
            (stub.GetSegmentInfo, qc.GetSegmentInfoRequest(segment_ids=[0]), "segment_ids", None),
            (stub.GetSegmentInfo, qc.GetSegmentInfoRequest(segment_ids=range(1, 70_000)), "segment_ids", "65536"),
            (stub.GetReplicas, qc.GetReplicasRequest(collection_id=0), "collection_id", None),
            (stub.ListTasks, qc.ListTasksRequest(limit=-1), "limit", None),
            (stub.ListTasks, qc.ListTasksRequest(states=[77]), "states", None),  # type: ignore[list-item]
            (stub.ListTasks, qc.ListTasksRequest(children_limit=-1), "children_limit", None),
            (stub.GetTask, qc.GetTaskRequest(task_id=-1), "task_id", None),
            (stub.Switchover, qc.SwitchoverRequest(target="a\x00b"), "target", None),
            (stub.StepBack, qc.StepBackRequest(requested_by="z" * 10_000), "requested_by", "255"),
        ]
        for method, request, name, limit in cases:
            resp = await method(request)
            assert_refused(resp.status, name, limit)

        # Well-formed ids the cluster does not know: a fast NOT_FOUND, never a trigger retried until its deadline.
        for method, request in [
            (stub.LoadPartitions, qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[987_654_321])),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=[nid], dst_node_ids=[424_242])),
            (stub.LoadBalance, qc.LoadBalanceRequest(source_node_ids=[INT64_MAX])),
            (stub.LoadCollection, qc.LoadCollectionRequest(collection_id=INT64_MAX)),
        ]:
            resp = await method(request, timeout=30)
            assert resp.status.error_code == common_pb2.NOT_FOUND, resp.status
        assert await snapshot(kv) == before, "a refused request queued or wrote something"
        assert not (await c.wait_leader()).coord.leadership.scheduler.triggers  # type: ignore[union-attr]

        # A page larger than the limit is capped, not refused (the proto says so).
        page = await stub.ListTasks(qc.ListTasksRequest(limit=2**31 - 1))
        assert page.status.error_code == common_pb2.SUCCESS
        await c.load_collection(cid)


async def test_replica_number_zero_is_refused_and_one_is_one_copy(etcd: EtcdCluster, kv: MetaKV,
                                                                   root_path: str) -> None:
    """Before replicas, 0 silently meant one copy; Milvus refuses it, and so do we now (omitted still means 1)."""
    async with cluster(etcd, root_path, nodes=1) as c:
        cid = await c.create_collection("r", partitions=1, segments=2)
        assert c.client is not None
        before = await snapshot(kv)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=0))
        assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "replica_number" in r.status.reason, r.status
        assert await snapshot(kv) == before
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=1))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id == 0, r


# ----- StreamMgmt -----------------------------------------------------------------------------------------------------
async def test_stream_mgmt_refuses_bad_requests_and_writes_nothing(
        etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    async with cluster(etcd, root_path) as c, channel(c.coords[0].address) as ch:
        stub = stream_pb2_grpc.StreamMgmtStub(ch)
        before = await snapshot(kv)
        sp = stream_pb2

        def create(**kw: Any) -> sp.CreateStreamRequest:
            fields: dict[str, Any] = dict(name="s1", source_db="db", source_vgroup_ids=[1, 2], num_calc_scan_plans=1,
                                          num_calc_subplans=2)
            fields.update(kw)
            return sp.CreateStreamRequest(**fields)

        report = sp.TaskStatusReport
        cases: list[tuple[Any, Any, str, str | None]] = [
            (stub.CreateStream, create(name="n" * 10_000), "name", "255"),
            (stub.CreateStream, create(source_db="my db"), "source_db", None),
            (stub.CreateStream, create(source_vgroup_ids=[3, 3]), "source_vgroup_ids", None),
            (stub.CreateStream, create(source_vgroup_ids=[-3]), "source_vgroup_ids", None),
            (stub.CreateStream, create(source_vgroup_ids=range(1, 5000)), "source_vgroup_ids", "4096"),
            (stub.CreateStream, create(num_calc_scan_plans=2**31 - 1), "num_calc_scan_plans", "0..256"),
            (stub.CreateStream, create(runner_deploys=-1), "runner_deploys", None),
            (stub.CreateStream, create(trigger_vgroup_id=-1), "trigger_vgroup_id", None),
            (stub.CreateStream, create(source_vgroup_ids=range(1, 4000), num_calc_scan_plans=256),
             "tasks of the stream", "10000"),
            (stub.DropStream, sp.DropStreamRequest(stream=sp.StreamRef(stream_id=-1)), "stream.stream_id", None),
            (stub.StopStream, sp.StopStreamRequest(stream=sp.StreamRef(name="q" * 1000)), "stream.name", "255"),
            (stub.StartStream, sp.StartStreamRequest(stream=sp.StreamRef(name="\x07")), "stream.name", None),
            (stub.ShowStreams, sp.ShowStreamsRequest(streams=[sp.StreamRef(stream_id=i) for i in range(1, 5000)]),
             "streams", "4096"),
            (stub.CreateSnode, sp.CreateSnodeRequest(node_id=0), "node_id", None),
            (stub.DropSnode, sp.DropSnodeRequest(snode_id=-2), "snode_id", None),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=-1), "node_id", None),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, vgroup_ids=[0]), "vgroup_ids", None),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, num_stream_groups=5000), "num_stream_groups",
             "1024"),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, num_stream_groups=2, stream_group=2),
             "stream_group", "0..1"),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, tasks=[report(stream_id=1, task_id=1, kind=99)]),
             "tasks.kind", None),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, tasks=[report(stream_id=1, task_id=1, status=42)]),
             "tasks.status", None),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, tasks=[
                report(stream_id=1, task_id=1, error_message="e" * 10_000)]), "tasks.error_message", "4096"),
            (stub.StreamHeartbeat, sp.HeartbeatRequest(node_id=5, tasks=[report(stream_id=0, task_id=1)]),
             "tasks.stream_id", None),
        ]
        for method, request, name, limit in cases:
            resp = await method(request)
            assert_refused(resp.status, name, limit)
        assert await snapshot(kv) == before, "a refused stream request wrote something"


async def test_snodes_are_bounded_by_the_configured_limit(etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    # Snodes go only on live stream nodes: three stream-node sessions under fixed ids stand for them.
    async with cluster(etcd, root_path, limits=Limits(max_snodes=2)) as c, channel(c.coords[0].address) as ch, \
            contextlib.AsyncExitStack() as nodes:
        for node_id in (11, 12, 13):
            await nodes.enter_async_context(Session(kv, "streamnode", "stream-node", ttl=10, server_id=node_id))
        stub = stream_pb2_grpc.StreamMgmtStub(ch)
        for node_id in (11, 12):
            created = await stub.CreateSnode(stream_pb2.CreateSnodeRequest(node_id=node_id))
            assert created.status.error_code == common_pb2.SUCCESS, created.status
        before = await snapshot(kv)
        third = await stub.CreateSnode(stream_pb2.CreateSnodeRequest(node_id=13))
        assert_refused(third.status, "snodes", "2")
        assert await snapshot(kv) == before


# ----- QueryNode ------------------------------------------------------------------------------------------------------
async def test_query_node_refuses_out_of_bound_requests_and_holds_nothing(kv: MetaKV) -> None:
    node = await QueryNode(kv, capacity_bytes=1024 * MiB, ttl=2.0).start()
    try:
        async with channel(node.address) as ch:
            stub = querynode_pb2_grpc.QueryNodeStub(ch)
            qn = querynode_pb2
            nid = node.node_id
            info = data_pb2.SegmentLoadInfo
            cases: list[tuple[Any, Any, str, str | None]] = [
                (stub.LoadSegments, qn.LoadSegmentsRequest(node_id=nid, collection_id=1, infos=[
                    info(segment_id=i + 1, collection_id=1) for i in range(10_001)]), "infos", "10000"),
                (stub.LoadSegments, qn.LoadSegmentsRequest(node_id=nid, collection_id=1, infos=[
                    info(segment_id=1, binlog_paths=["p\x00"])]), "infos.binlog_paths", None),
                (stub.LoadSegments, qn.LoadSegmentsRequest(node_id=nid, collection_id=1, infos=[
                    info(segment_id=0)]), "infos.segment_id", None),
                (stub.LoadSegments, qn.LoadSegmentsRequest(node_id=nid, collection_id=1, load_type=9,  # type: ignore
                                                           infos=[info(segment_id=1)]), "load_type", None),
                (stub.ReleasePartitions, qn.ReleasePartitionsRequest(node_id=nid, collection_id=1,
                                                                     partition_ids=range(1, 5000)),
                 "partition_ids", "4096"),
                (stub.WatchDmChannels, qn.WatchDmChannelsRequest(node_id=nid, collection_id=1, infos=[
                    data_pb2.VChannelInfo(channel_name="c" * 1000)]), "infos.channel_name", "255"),
                (stub.AddQueryChannel, qn.AddQueryChannelRequest(node_id=nid, collection_id=1,
                                                                 query_channel="a b"), "query_channel", None),
                (stub.ReleaseSegments, qn.ReleaseSegmentsRequest(node_id=nid, segment_ids=[-1]), "segment_ids", None),
                (stub.GetSegmentInfo, qn.GetSegmentInfoRequest(node_id=-1), "node_id", None),
                (stub.GetDataDistribution, qn.GetDataDistributionRequest(task_id=-1), "task_id", None),
            ]
            calls = node.injector.mutating_calls
            for method, request, name, limit in cases:
                resp = await method(request)
                assert_refused(resp.status, name, limit)
            assert not node.state.segments and not node.state.channels()
            assert node.injector.mutating_calls == calls, "a refused call counted as a mutating call"
            ok = await stub.LoadSegments(qn.LoadSegmentsRequest(node_id=nid, collection_id=1, infos=[
                info(segment_id=1, collection_id=1, mem_size=10)]))
            assert ok.status.error_code == common_pb2.SUCCESS, ok.status
    finally:
        await node.stop()


# ----- sessions are input ---------------------------------------------------------------------------------------------
GARBAGE: list[bytes] = [
    b"garbage",
    b"",
    b"[" * 100_000 + b"]" * 100_000,  # nested past the parser's recursion limit
    b'["a list"]',
    json.dumps({"ServerID": "abc", "ServerName": "querynode", "Address": "127.0.0.1:1"}).encode(),
    json.dumps({"ServerID": True, "ServerName": "querynode", "Address": "127.0.0.1:1"}).encode(),
    json.dumps({"ServerID": 2**70, "ServerName": "querynode", "Address": "127.0.0.1:1"}).encode(),
    json.dumps({"ServerID": 1.5, "ServerName": "querynode", "Address": "127.0.0.1:1"}).encode(),
    json.dumps({"ServerID": 901, "ServerName": "querynode", "Address": "a b\x00"}).encode(),
    json.dumps({"ServerID": 902, "ServerName": "querynode", "Address": "127.0.0.1:1", "Extra": "x"}).encode(),
    b"\xff\xfe not utf-8",
]


async def put_garbage(kv: MetaKV, role: str, tag: str) -> list[str]:
    """Every value of ``GARBAGE`` under ``role``'s session prefix, plus a valid value claiming another id."""
    keys = []
    for i, value in enumerate(GARBAGE):
        key = f"session/{role}-{tag}{i}"
        await kv.save(key, value)
        keys.append(key)
    impostor = SessionInfo(5, role, "127.0.0.1:1", {"capacity_bytes": 1 << 30})
    await kv.save(f"session/{role}-{tag}99", impostor.to_json())  # the key names another id than the value
    keys.append(f"session/{role}-{tag}99")
    await kv.save(f"session/{role}-903", SessionInfo(903, role, "127.0.0.1:1",
                                                      {"capacity_bytes": "lots"}).to_json())
    return keys


async def test_garbage_query_node_sessions_are_ignored_and_the_watch_goes_on(
        etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    await put_garbage(kv, "querynode", "1")  # before the leader starts: its first snapshot holds them
    async with cluster(etcd, root_path) as c:
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        first = await c.add_node()
        await c.wait_node_online(first.node_id)
        await put_garbage(kv, "querynode", "2")  # while it watches: events
        second = await c.add_node()
        await c.wait_node_online(second.node_id)
        assert set(lead.nodes.nodes) == {first.node_id, second.node_id}, lead.nodes.nodes
        assert lead.nodes.watch_errors == 0
        assert lead.nodes.rejected >= 1  # the session with a capacity that is not a number
        cid = await c.create_collection("after", partitions=1, segments=4)
        await c.load_collection(cid)


async def test_garbage_stream_node_sessions_are_ignored_and_real_nodes_are_heard(
        etcd: EtcdCluster, kv: MetaKV, root_path: str) -> None:
    await put_garbage(kv, "streamnode", "1")
    async with cluster(etcd, root_path) as c, channel(c.coords[0].address) as ch:
        stub = stream_pb2_grpc.StreamMgmtStub(ch)
        await put_garbage(kv, "streamnode", "2")
        async with Session(kv, "streamnode", "stream-node", ttl=10) as session:
            request = stream_pb2.HeartbeatRequest(node_id=session.server_id, num_stream_groups=1)

            async def heard() -> tuple[bool, Any]:
                hb = await stub.StreamHeartbeat(request)
                return hb.status.error_code == common_pb2.SUCCESS, hb.status

            await wait_for(heard, "the leader hearing the real stream node", timeout=20)
            # The impostor (a valid value under another id's key) is not a live node.
            forged = await stub.StreamHeartbeat(stream_pb2.HeartbeatRequest(node_id=5, num_stream_groups=1))
            assert forged.status.error_code == common_pb2.NOT_FOUND, forged.status
        lead = c.coords[0].coord.leadership
        assert lead is not None and lead.streams is not None
        assert lead.streams.live_nodes is not None and 5 not in lead.streams.live_nodes


def test_session_parse_is_strict_and_logs_one_line_per_bad_value(caplog: pytest.LogCaptureFixture) -> None:
    good = SessionInfo(7, "querynode", "127.0.0.1:5", {"capacity_bytes": 1})
    assert SessionInfo.parse(good.key, good.to_json()) == good
    for i, value in enumerate(GARBAGE):
        key = f"session/querynode-x{i}"
        assert SessionInfo.parse(key, value) is None
        assert SessionInfo.parse(key, value) is None  # the same value again: not logged again
    assert SessionInfo.parse("session/querynode-8", good.to_json()) is None  # a value naming another key
    lines = [r for r in caplog.records if "session key" in r.getMessage()]
    assert len(lines) == len(GARBAGE) + 1, [r.getMessage() for r in lines]
    assert all(len(r.getMessage()) < 400 and "\n" not in r.getMessage() for r in lines)


# ----- the validators, for any value ----------------------------------------------------------------------------------
LIMITS = Limits()
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(num_partitions=int32s, num_dm_channels=int32s, names=st.lists(st.text(max_size=300), max_size=20),
       collection_name=st.text(max_size=400))
def test_create_collection_check_refuses_exactly_what_is_out_of_bounds(
        num_partitions: int, num_dm_channels: int, names: list[str], collection_name: str) -> None:
    request = catalog_pb2.CreateCollectionRequest(collection_name=collection_name, num_partitions=num_partitions,
                                                  num_dm_channels=num_dm_channels, partition_names=names)
    inside = (0 <= num_partitions <= LIMITS.max_partitions and 0 <= num_dm_channels <= LIMITS.max_dm_channels
              and all(_good_name(n) for n in [collection_name, *names]))
    try:
        check_create_collection(request, LIMITS)
    except InvalidField as exc:
        assert not inside, exc
        assert exc.field in str(exc) and len(str(exc)) < 600
    else:
        assert inside


def _good_name(name: str) -> bool:
    return 0 < len(name) <= LIMITS.max_name_length and name.isprintable() and not any(c.isspace() for c in name)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(int64s, max_size=50), limit=st.integers(min_value=1, max_value=60))
def test_id_lists_are_bounded_positive_and_deduplicated(values: list[int], limit: int) -> None:
    try:
        out = check_ids("ids", values, limit, duplicates="drop")
    except InvalidField as exc:
        assert exc.field == "ids" and "invalid ids:" in str(exc)
        assert len(values) > limit or any(v <= 0 for v in values)
    else:
        assert out == list(dict.fromkeys(values)) and all(v > 0 for v in out) and len(values) <= limit
    if len(set(values)) != len(values) and len(values) <= limit and all(v > 0 for v in values):
        with pytest.raises(InvalidField, match="appears twice"):
            check_ids("ids", values, limit)


@settings(max_examples=300, deadline=None)
@given(node_id=int64s, snode_id=int64s, groups=int32s, group=int32s,
       kinds=st.lists(int32s, max_size=5), statuses=st.lists(int32s, max_size=5))
def test_heartbeat_check_refuses_with_the_field_named(node_id: int, snode_id: int, groups: int, group: int,
                                                      kinds: list[int], statuses: list[int]) -> None:
    tasks = [stream_pb2.TaskStatusReport(stream_id=1, task_id=i + 1, kind=k, status=s)  # type: ignore[arg-type]
             for i, (k, s) in enumerate(zip(kinds, statuses, strict=False))]
    request = stream_pb2.HeartbeatRequest(node_id=node_id, snode_id=snode_id, num_stream_groups=groups,
                                          stream_group=group, tasks=tasks)
    inside = (node_id > 0 and snode_id >= 0 and 0 <= groups <= LIMITS.max_stream_groups and group >= 0
              and (groups == 0 or group < groups)
              and all(t.kind in stream_pb2.TaskKind.values() and t.status in stream_pb2.TaskStatus.values()
                      for t in tasks))
    try:
        check_heartbeat(request, LIMITS)
    except InvalidField as exc:
        assert not inside, exc
        assert f"invalid {exc.field}:" in str(exc)
    else:
        assert inside


@given(st.text(max_size=5000))
def test_reasons_never_echo_a_long_value(value: str) -> None:
    assert len(shown(value)) <= 120
    with contextlib.suppress(InvalidField):
        check_name("name", value, 255)


def test_limits_are_configurable_and_checked(tmp_path: Path) -> None:
    """Each limit is a flag, a [coord] key and a QUERYCOORD_COORD_* variable; a limit below 1 names its option."""
    assert dataclasses.replace(Limits(), max_partitions=10).max_partitions == 10
    with pytest.raises(ValueError, match="max_partitions"):
        Limits(max_partitions=0)
    file = tmp_path / "q.toml"
    file.write_text("[coord]\nmax-partitions = 100\nmax_snodes = 3\n[etcd]\nendpoints = [\"127.0.0.1:2379\"]\n")
    env = {"QUERYCOORD_COORD_MAX_SEGMENTS_PER_REQUEST": "500"}
    args = apply_layers(build_parser().parse_args(["coord", "--config", str(file), "--max-replicas", "3"]), env)
    limits = config_from_args(args).limits
    assert (limits.max_partitions, limits.max_snodes, limits.max_segments_per_request, limits.max_replicas) == (
        100, 3, 500, 3)
    assert limits.max_dm_channels == Limits().max_dm_channels
    bad = apply_layers(build_parser().parse_args(["coord", "--config", str(file), "--max-fields", "0"]), {})
    with pytest.raises(ValueError, match="--max-fields"):
        config_from_args(bad)
