"""The reference query node against real etcd and real gRPC on loopback (in-process and as a process)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import list_sessions, session_key
from proto import common_pb2, data_pb2, querynode_pb2, querynode_pb2_grpc
from querycoord.nodes.querynode import QueryNode, add_querynode_parser, cmd_querynode
from querycoord.nodes.querynode_faults import CRASH_EXIT_CODE, FaultConfig, FaultInjector
from tests.spawn import spawn_query_node

EC = common_pb2.ErrorCode
qn = querynode_pb2

NodeFactory = Callable[..., Awaitable[tuple[QueryNode, querynode_pb2_grpc.QueryNodeStub]]]


@pytest.fixture
async def make_node(kv: MetaKV) -> AsyncIterator[NodeFactory]:
    """Start in-process nodes with a stub each; everything is stopped at teardown."""
    nodes: list[QueryNode] = []
    channels: list[grpc.aio.Channel] = []

    async def factory(**kwargs: Any) -> tuple[QueryNode, querynode_pb2_grpc.QueryNodeStub]:
        # These tests drive the fence ordering rules with made-up revisions (no election runs): fences are not
        # checked against etcd here; test_trigger_rules checks that with real elections.
        kwargs.setdefault("verify_fences", False)
        node = QueryNode(kv, **kwargs)
        await node.start()
        nodes.append(node)
        channel = grpc.aio.insecure_channel(node.address)
        channels.append(channel)
        return node, querynode_pb2_grpc.QueryNodeStub(channel)

    yield factory
    for ch in channels:
        await ch.close()
    for node in nodes:
        await node.stop()


def fence(revision: int, coordinator: int = 1) -> qn.CoordFence:
    return qn.CoordFence(leader_revision=revision, coordinator_id=coordinator)


def seg(sid: int, part: int, mem: int, rows: int = 100, coll: int = 1) -> data_pb2.SegmentLoadInfo:
    return data_pb2.SegmentLoadInfo(
        segment_id=sid, partition_id=part, collection_id=coll, num_rows=rows, mem_size=mem,
        binlog_paths=[f"binlog/{sid}/0"], insert_channel=f"dml-{coll}-0",
    )


def load(node: QueryNode, coll: int, *infos: data_pb2.SegmentLoadInfo, rev: int = 1) -> qn.LoadSegmentsRequest:
    return qn.LoadSegmentsRequest(fence=fence(rev), node_id=node.node_id, task_id=7, collection_id=coll,
                                  infos=list(infos))


def chans(coll: int, *names: str) -> list[data_pb2.VChannelInfo]:
    return [data_pb2.VChannelInfo(collection_id=coll, channel_name=n) for n in names]


async def dist(stub: querynode_pb2_grpc.QueryNodeStub) -> qn.GetDataDistributionResponse:
    resp = await stub.GetDataDistribution(qn.GetDataDistributionRequest())
    assert resp.status.error_code == EC.SUCCESS, resp.status.reason
    return resp


def held(resp: qn.GetDataDistributionResponse) -> set[int]:
    return {s.segment_id for s in resp.segments}


# ----- in-process node --------------------------------------------------------
async def test_session_registered_with_address_and_capacity(kv: MetaKV, make_node: NodeFactory) -> None:
    node, stub = await make_node(capacity_bytes=123_456)
    assert node.address == f"127.0.0.1:{node.port}" and node.port > 0
    snap = await list_sessions(kv, "querynode")
    info = snap.sessions[node.node_id]
    assert info.address == node.address
    assert info.extra == {"capacity_bytes": 123_456}
    states = await stub.GetComponentStates(qn.GetComponentStatesRequest())
    assert states.state.node_id == node.node_id and states.state.role == "querynode"
    assert states.state.state_code == common_pb2.HEALTHY
    await node.stop()
    assert await kv.get(session_key("querynode", node.node_id)) is None, "stop revokes the session at once"


async def test_load_and_release_are_idempotent(make_node: NodeFactory) -> None:
    node, stub = await make_node(capacity_bytes=10_000)
    req = load(node, 1, seg(1, 10, 100, rows=11), seg(2, 10, 200, rows=22))
    assert (await stub.LoadSegments(req)).status.error_code == EC.SUCCESS
    assert (await stub.LoadSegments(req)).status.error_code == EC.SUCCESS, "a repeated load is success"
    # A request overlapping held segments loads only the new one (and counts it once even if listed twice).
    again = load(node, 1, seg(2, 10, 200), seg(3, 11, 300), seg(3, 11, 300))
    assert (await stub.LoadSegments(again)).status.error_code == EC.SUCCESS
    d = await dist(stub)
    assert held(d) == {1, 2, 3} and d.memory_used == 600
    assert {(s.segment_id, s.num_rows, s.mem_size, s.node_id) for s in d.segments if s.segment_id < 3} == {
        (1, 11, 100, node.node_id), (2, 22, 200, node.node_id)}

    rel = qn.ReleaseSegmentsRequest(fence=fence(1), node_id=node.node_id, collection_id=1, segment_ids=[1, 99])
    assert (await stub.ReleaseSegments(rel)).status.error_code == EC.SUCCESS, "absent segment 99 is fine"
    assert (await stub.ReleaseSegments(rel)).status.error_code == EC.SUCCESS, "a repeated release is success"
    # Release scoped to a partition the segment is not in leaves it alone.
    scoped = qn.ReleaseSegmentsRequest(fence=fence(1), node_id=node.node_id, collection_id=1, partition_ids=[10],
                                       segment_ids=[3])
    assert (await stub.ReleaseSegments(scoped)).status.error_code == EC.SUCCESS
    d = await dist(stub)
    assert held(d) == {2, 3} and d.memory_used == 500

    # The same segment id claimed for another partition is a conflict, and nothing of that request loads.
    clash = load(node, 1, seg(4, 10, 1), seg(2, 11, 200))
    resp = await stub.LoadSegments(clash)
    assert resp.status.error_code == EC.CONFLICT and "segment 2" in resp.status.reason
    assert held(await dist(stub)) == {2, 3}


async def test_a_load_of_catalog_binlogs_holds_what_the_same_load_infos_hold(make_node: NodeFactory) -> None:
    """A planned load sends the catalog's binlogs instead of load infos (same field names): the node holds the
    same segments either way; a request with both, or a bad binlog, is refused and holds nothing."""
    by_infos, infos_stub = await make_node(capacity_bytes=10_000)
    by_binlogs, binlogs_stub = await make_node(capacity_bytes=10_000)
    infos = [seg(1, 10, 100, rows=11), seg(2, 11, 200, rows=22)]
    infos[1].compaction_from.extend([7, 8])
    binlogs = [data_pb2.SegmentBinlogs(
        segment_id=i.segment_id, collection_id=i.collection_id, partition_id=i.partition_id, num_rows=i.num_rows,
        mem_size=i.mem_size, binlog_paths=i.binlog_paths, insert_channel=i.insert_channel,
        compaction_from=i.compaction_from) for i in infos]
    assert (await infos_stub.LoadSegments(load(by_infos, 1, *infos))).status.error_code == EC.SUCCESS
    req = load(by_binlogs, 1)
    req.binlogs.extend(binlogs)
    assert (await binlogs_stub.LoadSegments(req)).status.error_code == EC.SUCCESS
    a, b = await dist(infos_stub), await dist(binlogs_stub)
    assert a.memory_used == b.memory_used == 300
    shown = [(s.segment_id, s.collection_id, s.partition_id, s.num_rows, s.mem_size, s.dm_channel,
              list(s.compaction_from)) for s in sorted(a.segments, key=lambda s: s.segment_id)]
    assert shown == [(s.segment_id, s.collection_id, s.partition_id, s.num_rows, s.mem_size, s.dm_channel,
                      list(s.compaction_from)) for s in sorted(b.segments, key=lambda s: s.segment_id)]

    both = load(by_binlogs, 1, seg(3, 10, 1))
    both.binlogs.add(segment_id=4, collection_id=1, partition_id=10)
    resp = await binlogs_stub.LoadSegments(both)
    assert resp.status.error_code == EC.ILLEGAL_ARGUMENT and "not both" in resp.status.reason
    bad = load(by_binlogs, 1)
    bad.binlogs.add(segment_id=5, collection_id=1, partition_id=10, mem_size=-1)
    resp = await binlogs_stub.LoadSegments(bad)
    assert resp.status.error_code == EC.ILLEGAL_ARGUMENT and "binlogs.mem_size" in resp.status.reason
    assert held(await dist(binlogs_stub)) == {1, 2}


async def test_out_of_memory_refuses_the_whole_request(make_node: NodeFactory) -> None:
    node, stub = await make_node(capacity_bytes=1000)
    assert (await stub.LoadSegments(load(node, 1, seg(1, 10, 600)))).status.error_code == EC.SUCCESS
    resp = await stub.LoadSegments(load(node, 1, seg(2, 10, 300), seg(3, 10, 200)))
    assert resp.status.error_code == EC.NO_AVAILABLE_NODE
    assert resp.status.reason.startswith("out of memory: need 500 bytes, 600 of 1000 used"), resp.status.reason
    d = await dist(stub)
    assert held(d) == {1} and d.memory_used == 600, "a refused load loads nothing of the request"
    # Held segments cost nothing again; filling the capacity exactly fits.
    resp = await stub.LoadSegments(load(node, 1, seg(1, 10, 600), seg(2, 10, 400)))
    assert resp.status.error_code == EC.SUCCESS, resp.status.reason
    assert (await dist(stub)).memory_used == 1000
    rel = qn.ReleaseSegmentsRequest(fence=fence(1), node_id=node.node_id, segment_ids=[1])
    assert (await stub.ReleaseSegments(rel)).status.error_code == EC.SUCCESS
    assert (await stub.LoadSegments(load(node, 1, seg(3, 10, 500)))).status.error_code == EC.SUCCESS, \
        "a release gives its memory back"


async def test_release_partitions_and_collection(make_node: NodeFactory) -> None:
    node, stub = await make_node()
    nid = node.node_id
    ok = EC.SUCCESS
    assert (await stub.LoadSegments(load(node, 1, seg(1, 10, 5), seg(2, 11, 5)))).status.error_code == ok
    assert (await stub.LoadSegments(load(node, 2, seg(3, 20, 5, coll=2)))).status.error_code == ok
    watch = [
        qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1, partition_ids=[10],
                                  infos=chans(1, "dml-1-a")),
        qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1, partition_ids=[10, 11],
                                  infos=chans(1, "dml-1-b")),
        qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=2, infos=chans(2, "dml-2-a")),
    ]
    for w in watch:
        assert (await stub.WatchDmChannels(w)).status.error_code == ok
    for c in (1, 2):
        r = await stub.WatchDeltaChannels(qn.WatchDeltaChannelsRequest(
            fence=fence(1), node_id=nid, collection_id=c, infos=chans(c, f"delta-{c}")))
        assert r.status.error_code == ok
        r = await stub.AddQueryChannel(qn.AddQueryChannelRequest(
            fence=fence(1), node_id=nid, collection_id=c, query_channel=f"query-{c}", query_result_channel=f"res-{c}"))
        assert r.status.error_code == ok

    r = await stub.ReleasePartitions(qn.ReleasePartitionsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                                 partition_ids=[10]))
    assert r.status.error_code == ok
    d = await dist(stub)
    assert held(d) == {2, 3}
    by_name = {c.channel_name: c for c in d.channels}
    assert "dml-1-a" not in by_name, "a DM watch serving only released partitions is dropped"
    assert list(by_name["dml-1-b"].partition_ids) == [11]
    assert {"delta-1", "query-1", "dml-2-a", "delta-2", "query-2"} <= set(by_name)

    r = await stub.ReleaseCollection(qn.ReleaseCollectionRequest(fence=fence(1), node_id=nid, collection_id=1))
    assert r.status.error_code == ok
    d = await dist(stub)
    assert held(d) == {3} and d.memory_used == 5
    assert all(c.collection_id == 2 for c in d.channels) and len(d.channels) == 3
    for coll in (1, 99):  # releasing what is not held is success
        r = await stub.ReleaseCollection(qn.ReleaseCollectionRequest(fence=fence(1), node_id=nid, collection_id=coll))
        assert r.status.error_code == ok


async def test_distribution_and_segment_info_report_what_is_held(make_node: NodeFactory) -> None:
    node, stub = await make_node(capacity_bytes=5000)
    nid = node.node_id
    await stub.LoadSegments(load(node, 1, seg(1, 10, 100, rows=7), seg(2, 11, 200, rows=8), rev=3))
    await stub.LoadSegments(load(node, 2, seg(5, 20, 50, coll=2), rev=3))
    await stub.WatchDmChannels(qn.WatchDmChannelsRequest(fence=fence(3), node_id=nid, collection_id=1,
                                                         partition_ids=[11, 10], infos=chans(1, "dml")))
    await stub.WatchDmChannels(qn.WatchDmChannelsRequest(fence=fence(3), node_id=nid, collection_id=1,
                                                         infos=chans(1, "dml-all")))
    await stub.WatchDeltaChannels(qn.WatchDeltaChannelsRequest(fence=fence(3), node_id=nid, collection_id=1,
                                                               infos=chans(1, "delta")))
    await stub.AddQueryChannel(qn.AddQueryChannelRequest(fence=fence(3, 42), node_id=nid, collection_id=1,
                                                         query_channel="q", query_result_channel="qr"))
    d = await dist(stub)
    assert d.node_id == nid and d.memory_used == 350 and d.memory_capacity == 5000
    assert (d.highest_fence.leader_revision, d.highest_fence.coordinator_id) == (3, 1)
    s1 = next(s for s in d.segments if s.segment_id == 1)
    assert (s1.collection_id, s1.partition_id, s1.num_rows, s1.mem_size, s1.dm_channel) == (1, 10, 7, 100, "dml-1-0")
    assert s1.state == data_pb2.SEGMENT_STATE_SEALED
    channels = {(c.channel_name, c.kind, tuple(c.partition_ids)) for c in d.channels}
    assert channels == {
        ("dml", qn.CHANNEL_KIND_DM, (10, 11)),
        ("dml-all", qn.CHANNEL_KIND_DM, ()),
        ("delta", qn.CHANNEL_KIND_DELTA, ()),
        ("q", qn.CHANNEL_KIND_QUERY, ()),
    }
    info = await stub.GetSegmentInfo(qn.GetSegmentInfoRequest(node_id=nid, segment_ids=[2, 5, 404]))
    assert info.status.error_code == EC.SUCCESS
    assert [s.segment_id for s in info.infos] == [2, 5], "unknown ids are left out"
    info = await stub.GetSegmentInfo(qn.GetSegmentInfoRequest(collection_id=1))
    assert [s.segment_id for s in info.infos] == [1, 2]
    # Ids only (the checker's pass): the same segments, grouped by partition, and no SegmentInfo built.
    ids = await stub.GetDataDistribution(qn.GetDataDistributionRequest(node_id=nid, segment_ids_only=True))
    assert ids.status.error_code == EC.SUCCESS and not ids.segments
    assert [(g.collection_id, g.partition_id, list(g.segment_ids)) for g in ids.segment_groups] == [
        (1, 10, [1]), (1, 11, [2]), (2, 20, [5])]
    assert {c.channel_name for c in ids.channels} == {c.channel_name for c in d.channels}


async def test_fencing_refuses_lower_revisions_and_never_reads(make_node: NodeFactory) -> None:
    node, stub = await make_node()
    nid = node.node_id
    # Before any fence, an unfenced call (revision 0) is accepted.
    r = await stub.LoadSegments(qn.LoadSegmentsRequest(node_id=nid, collection_id=1, infos=[seg(1, 10, 1)]))
    assert r.status.error_code == EC.SUCCESS
    assert (await stub.LoadSegments(load(node, 1, seg(2, 10, 1), rev=5))).status.error_code == EC.SUCCESS

    stale = await stub.LoadSegments(load(node, 1, seg(3, 10, 1), rev=3))
    assert stale.status.error_code == EC.STALE_LEADER
    assert stale.status.reason.startswith("stale coordinator: fence revision 3 < 5 already seen from coordinator 1")
    unfenced = await stub.ReleaseSegments(qn.ReleaseSegmentsRequest(node_id=nid, segment_ids=[1]))
    assert unfenced.status.error_code == EC.STALE_LEADER, "once fenced, a missing fence (revision 0) is refused"
    assert "carried no fence" in unfenced.status.reason
    assert held(await dist(stub)) == {1, 2}, "refused calls changed nothing"

    assert (await stub.LoadSegments(load(node, 1, seg(3, 10, 1), rev=5))).status.error_code == EC.SUCCESS
    newer = qn.ReleaseCollectionRequest(fence=fence(7, coordinator=2), node_id=nid, collection_id=9)
    assert (await stub.ReleaseCollection(newer)).status.error_code == EC.SUCCESS
    old = qn.ReleasePartitionsRequest(fence=fence(5), node_id=nid, collection_id=1, partition_ids=[10])
    r = await stub.ReleasePartitions(old)
    assert r.status.error_code == EC.STALE_LEADER and "5 < 7 already seen from coordinator 2" in r.status.reason

    # Reads are never refused for their fence.
    d = await stub.GetDataDistribution(qn.GetDataDistributionRequest(fence=fence(1), node_id=nid))
    assert d.status.error_code == EC.SUCCESS and held(d) == {1, 2, 3}
    assert (d.highest_fence.leader_revision, d.highest_fence.coordinator_id) == (7, 2)
    info = await stub.GetSegmentInfo(qn.GetSegmentInfoRequest(fence=fence(2), node_id=nid))
    assert info.status.error_code == EC.SUCCESS and len(info.infos) == 3
    states = await stub.GetComponentStates(qn.GetComponentStatesRequest())
    assert states.status.error_code == EC.SUCCESS


async def test_addressing_and_bad_input_answer_illegal_argument(make_node: NodeFactory) -> None:
    node, stub = await make_node()
    nid = node.node_id
    ill = EC.ILLEGAL_ARGUMENT
    r = await stub.LoadSegments(qn.LoadSegmentsRequest(fence=fence(1), node_id=nid + 1000, collection_id=1,
                                                       infos=[seg(1, 10, 1)]))
    assert r.status.error_code == ill and f"this is query node {nid}" in r.status.reason
    r = await stub.LoadSegments(qn.LoadSegmentsRequest(fence=fence(1), collection_id=1, infos=[seg(1, 10, 1)]))
    assert r.status.error_code == ill and "node_id is not set" in r.status.reason
    r = await stub.GetDataDistribution(qn.GetDataDistributionRequest(node_id=nid + 1000))
    assert r.status.error_code == ill, "a read addressed to another node would report the wrong node's data"

    bad: list[tuple[str, Any]] = [
        ("LoadSegments", load(node, 1)),
        ("LoadSegments", load(node, 1, seg(1, 10, -1))),
        ("LoadSegments", load(node, 1, seg(0, 10, 1))),
        ("LoadSegments", load(node, 0, seg(1, 10, 1, coll=0))),
        ("LoadSegments", load(node, 1, seg(1, 10, 1, coll=2))),
        ("LoadSegments", load(node, 1, seg(1, 10, 1, rows=-5))),
        ("ReleaseSegments", qn.ReleaseSegmentsRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("WatchDmChannels", qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("WatchDmChannels", qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                      infos=chans(1, ""))),
        ("WatchDeltaChannels", qn.WatchDeltaChannelsRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("AddQueryChannel", qn.AddQueryChannelRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("ReleasePartitions", qn.ReleasePartitionsRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("ReleaseCollection", qn.ReleaseCollectionRequest(fence=fence(1), node_id=nid)),
        ("ReleaseDmChannels", qn.ReleaseDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("ReleaseDmChannels", qn.ReleaseDmChannelsRequest(fence=fence(1), node_id=nid, channel_names=["d"])),
        ("ReleaseDmChannels", qn.ReleaseDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                          channel_names=["bad name"])),
        ("LoadSegments", load(node, 1, seg(1, 10, 1), rev=-1)),
    ]
    for method, req in bad:
        r = await getattr(stub, method)(req)
        assert r.status.error_code == ill, f"{method} {req}: {r.status}"
        assert r.status.reason
    d = await dist(stub)
    assert not d.segments and not d.channels and d.memory_used == 0
    states = await stub.GetComponentStates(qn.GetComponentStatesRequest())
    assert states.state.state_code == common_pb2.HEALTHY, "bad input never takes the node down"

    r = await stub.WatchDmChannels(qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                             infos=chans(1, "dml")))
    assert r.status.error_code == EC.SUCCESS
    r = await stub.WatchDmChannels(qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=2,
                                                             infos=chans(2, "dml")))
    assert r.status.error_code == EC.CONFLICT, "one channel cannot serve two collections"


async def test_failure_rate_one_fails_every_mutating_call(make_node: NodeFactory) -> None:
    node, stub = await make_node(faults=FaultConfig(failure_rate=1.0, seed=3))
    nid = node.node_id
    calls: list[tuple[str, Any]] = [
        ("LoadSegments", load(node, 1, seg(1, 10, 1))),
        ("ReleaseSegments", qn.ReleaseSegmentsRequest(fence=fence(1), node_id=nid, segment_ids=[1])),
        ("WatchDmChannels", qn.WatchDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                      infos=chans(1, "d"))),
        ("WatchDeltaChannels", qn.WatchDeltaChannelsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                            infos=chans(1, "x"))),
        ("AddQueryChannel", qn.AddQueryChannelRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                      query_channel="q")),
        ("ReleaseCollection", qn.ReleaseCollectionRequest(fence=fence(1), node_id=nid, collection_id=1)),
        ("ReleasePartitions", qn.ReleasePartitionsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                          partition_ids=[10])),
        ("ReleaseDmChannels", qn.ReleaseDmChannelsRequest(fence=fence(1), node_id=nid, collection_id=1,
                                                          channel_names=["d"])),
    ]
    for _ in range(3):
        for method, req in calls:
            r = await getattr(stub, method)(req)
            assert (r.status.error_code, r.status.reason) == (EC.UNEXPECTED_ERROR, "injected failure"), method
    d = await dist(stub)
    assert not d.segments and not d.channels, "an injected failure applies nothing"
    assert node.injector.injected_failures == 3 * len(calls)


async def test_failure_restricted_to_one_kind(make_node: NodeFactory) -> None:
    node, stub = await make_node(
        faults=FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"}), latency_ms=20)
    )
    r = await stub.LoadSegments(load(node, 1, seg(1, 10, 1)))
    assert r.status.reason == "injected failure"
    r = await stub.WatchDmChannels(qn.WatchDmChannelsRequest(fence=fence(1), node_id=node.node_id, collection_id=1,
                                                             infos=chans(1, "d")))
    assert r.status.error_code == EC.SUCCESS


def test_fault_config_is_checked_and_the_rng_is_seeded() -> None:
    for bad in ({"failure_rate": 1.5}, {"latency_ms": -1}, {"crash_after": -2}, {"fail_kinds": {"GetSegmentInfo"}}):
        with pytest.raises(ValueError):
            FaultConfig(**bad)  # type: ignore[arg-type]

    def draws(seed: int) -> list[bool]:
        inj = FaultInjector(FaultConfig(failure_rate=0.5, seed=seed))
        return [inj.should_fail("LoadSegments") for _ in range(64)]

    assert draws(11) == draws(11), "the same seed fails the same calls"
    assert 0 < sum(draws(11)) < 64


async def test_crash_after_reply_in_process(make_node: NodeFactory) -> None:
    crashed: list[tuple[int, str, int]] = []
    node, stub = await make_node(faults=FaultConfig(crash_after=2), crash=lambda *a: crashed.append(a))
    assert (await stub.LoadSegments(load(node, 1, seg(1, 10, 1)))).status.error_code == EC.SUCCESS
    assert not crashed
    assert (await stub.LoadSegments(load(node, 1, seg(2, 10, 1)))).status.error_code == EC.SUCCESS, \
        "the Nth call is answered before the crash"
    for _ in range(100):
        if crashed:
            break
        await asyncio.sleep(0.05)
    assert crashed == [(node.node_id, "LoadSegments", 2)]


async def test_lost_session_refuses_work_and_reports_abnormal(kv: MetaKV, make_node: NodeFactory) -> None:
    node, stub = await make_node()
    await kv.remove(session_key("querynode", node.node_id))
    await asyncio.wait_for(node.session.lost.wait(), 10)
    r = await stub.LoadSegments(load(node, 1, seg(1, 10, 1)))
    assert r.status.error_code == EC.NOT_READY and "lost its session" in r.status.reason
    states = await stub.GetComponentStates(qn.GetComponentStatesRequest())
    assert states.state.state_code == common_pb2.ABNORMAL


def test_cli_parser_and_bad_options() -> None:
    parser = argparse.ArgumentParser()
    add_querynode_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["querynode", "--etcd-endpoints", "127.0.0.1:1", "--root", "r", "--capacity-mb", "2",
                              "--failure-rate", "0.25", "--fail-kinds", "LoadSegments", "--crash-after", "3",
                              "--seed", "9"])
    assert args.func is cmd_querynode
    assert (args.capacity_mb, args.failure_rate, args.crash_after, args.seed) == (2, 0.25, 3, 9)
    assert args.listen == "127.0.0.1:0" and args.latency_ms == 0
    for flag, value in (("--fail-kinds", "Nope"), ("--capacity-mb", "0")):
        bad = parser.parse_args(["querynode", "--etcd-endpoints", "127.0.0.1:1", "--root", "r", flag, value])
        assert cmd_querynode(bad) == 2, flag
    # Numbers out of their rule (querycoord.settings.setting_rules) are usage errors: argparse names the flag, exit 2.
    for flag, value in (("--failure-rate", "2"), ("--ttl", "1"), ("--ttl", "nan"), ("--latency-ms", "inf")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["querynode", "--etcd-endpoints", "127.0.0.1:1", "--root", "r", flag, value])
        assert e.value.code == 2, flag


# ----- the node as a process --------------------------------------------------
# No election runs here, so these calls carry no fence (accepted while the node has seen none); a process
# checks a fence against the election (test_trigger_rules, test_fuzz).
async def wait_gone(kv: MetaKV, key: str, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await kv.get(key) is None:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_process_prints_ready_line_and_sigterm_revokes_session(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, tmp_path: Path
) -> None:
    node = await spawn_query_node(etcd, root_path, tmp_path, "--capacity-mb", "2", "--ttl", "60")
    try:
        ready = node.ready
        assert ready["event"] == "ready" and ready["pid"] == node.pid
        info = (await list_sessions(kv, "querynode")).sessions[ready["node_id"]]
        assert info.address == ready["address"] and info.address.startswith("127.0.0.1:")
        assert info.extra == {"capacity_bytes": 2 * 1024 * 1024}
        async with grpc.aio.insecure_channel(ready["address"]) as ch:
            stub = querynode_pb2_grpc.QueryNodeStub(ch)
            r = await stub.LoadSegments(qn.LoadSegmentsRequest(node_id=ready["node_id"],
                                                               collection_id=1, infos=[seg(1, 10, 1024)]))
            assert r.status.error_code == EC.SUCCESS
        node.signal(signal.SIGTERM)
        assert await node.wait(20) == 0, node.tail()
        # TTL is 60 s: the key being gone now means the lease was revoked, not expired.
        assert await kv.get(session_key("querynode", ready["node_id"])) is None
    finally:
        await node.kill()


async def test_process_crashes_after_n_calls_and_its_session_expires(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, tmp_path: Path
) -> None:
    node = await spawn_query_node(etcd, root_path, tmp_path, "--crash-after", "3", "--ttl", "4")
    try:
        nid = node.ready["node_id"]
        async with grpc.aio.insecure_channel(node.ready["address"]) as ch:
            stub = querynode_pb2_grpc.QueryNodeStub(ch)
            for i in range(3):
                r = await stub.LoadSegments(qn.LoadSegmentsRequest(node_id=nid, collection_id=1,
                                                                   infos=[seg(i + 1, 10, 1)]))
                assert r.status.error_code == EC.SUCCESS, f"call {i + 1} of 3 is answered"
            assert await node.wait(20) == CRASH_EXIT_CODE, node.tail()
        key = session_key("querynode", nid)
        assert await kv.get(key) is not None, "a crash does not revoke the lease"
        assert await wait_gone(kv, key, 20), "the session must expire after its TTL"
    finally:
        await node.kill()


async def test_process_crash_mid_call_gives_a_transport_error(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, tmp_path: Path
) -> None:
    node = await spawn_query_node(etcd, root_path, tmp_path, "--crash-after", "1", "--crash-mode", "mid-call",
                                  "--ttl", "2")
    try:
        async with grpc.aio.insecure_channel(node.ready["address"]) as ch:
            stub = querynode_pb2_grpc.QueryNodeStub(ch)
            req = qn.WatchDmChannelsRequest(node_id=node.ready["node_id"], collection_id=1,
                                            infos=chans(1, "dml"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.WatchDmChannels(req, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await node.wait(20) == CRASH_EXIT_CODE, node.tail()
        assert await wait_gone(kv, session_key("querynode", node.ready["node_id"]), 20)
    finally:
        await node.kill()


async def test_process_exits_when_its_session_is_lost(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, tmp_path: Path
) -> None:
    node = await spawn_query_node(etcd, root_path, tmp_path, "--ttl", "60")
    try:
        await kv.remove(session_key("querynode", node.node_id))
        assert await node.wait(20) == 1, "a node whose session is gone must not keep serving under that id"
        assert "lost its session" in node.log_tail(40)
    finally:
        await node.kill()
