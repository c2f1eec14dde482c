"""The checker: the rules of ``diff`` over a real query meta, and repairs on a real cluster."""

from __future__ import annotations

import asyncio
import time

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.checkers import Held, diff
from querycoord.common.target import Target, TargetSegment
from querycoord.querymeta import QueryMeta
from tests.cluster import MiB, QueryCluster, fast_scheduler

COLL = data_pb2.LOAD_TYPE_COLLECTION


def seg(sid: int, cid: int, pid: int, node: int) -> data_pb2.SegmentInfo:
    return data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=pid, node_id=node,
                                state=data_pb2.SEGMENT_STATE_SEALED)


def held_of(placement: dict[int, tuple[int, int, set[int]]], channels: dict[tuple[int, str], set[int]] | None = None
            ) -> Held:
    """segment -> (collection, partition, nodes)."""
    h = Held(channels=dict(channels or {}))
    for sid, (cid, pid, nodes) in placement.items():
        h.segments[sid] = set(nodes)
        h.segment_collection[sid] = (cid, pid)
    return h


async def loaded_meta(kv: MetaKV) -> QueryMeta:
    meta = QueryMeta(kv)
    await meta.reload()
    await meta.add_collection(1, COLL, [10, 11])
    await meta.save_segments([seg(100, 1, 10, 1), seg(101, 1, 10, 2), seg(102, 1, 11, 1)])
    return meta


TARGET = {1: Target(segments={100: TargetSegment(100, 10), 101: TargetSegment(101, 10),
                              102: TargetSegment(102, 11)}, channels=set())}


async def test_a_lost_segment_is_missing_and_progress_shows_it(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    held = held_of({100: (1, 10, {1}), 102: (1, 11, {1})})  # node 2 lost 101
    d = diff(meta, TARGET, held, reachable={1, 2}, online={1, 2}, busy=set())
    assert [s.segment_id for s in d.repairs[1].missing_segments] == [101]
    assert d.repairs[1].missing_segments[0].node_id == 2, "the stale record's node travels with it"
    assert d.progress[1] == {10: (1, 2), 11: (1, 1)}


async def test_duplicates_and_copies_of_released_partitions_are_released(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    held = held_of({100: (1, 10, {1, 2}), 101: (1, 10, {2}), 102: (1, 11, {1}), 199: (1, 12, {2})})
    d = diff(meta, TARGET, held, reachable={1, 2}, online={1, 2}, busy=set())
    release = {ns.node_id: sorted(ns.segment_ids) for ns in d.repairs[1].release_segments}
    assert release == {2: [100, 199]}, "the copy meta does not name, and the segment of an unloaded partition"
    assert not d.repairs[1].missing_segments


async def test_what_a_silent_node_holds_is_unknown_not_missing(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    held = held_of({100: (1, 10, {1}), 102: (1, 11, {1})})
    d = diff(meta, TARGET, held, reachable={1}, online={1, 2}, busy=set())
    assert 1 not in d.repairs, "node 2 did not answer: its segment 101 is neither missing nor extra"
    assert d.progress[1] == {10: (2, 2), 11: (1, 1)}


async def test_busy_collections_are_left_to_their_trigger_and_strays_are_released(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    held = held_of({100: (1, 10, {1}), 500: (5, 50, {2})}, channels={(6, "dml-6-0"): {1}})
    d = diff(meta, TARGET, held, reachable={1, 2}, online={1, 2}, busy={1})
    assert 1 not in d.repairs and 1 not in d.progress
    assert list(d.repairs[5].release_collection_on_nodes) == [2]
    assert list(d.repairs[6].release_collection_on_nodes) == [1]


async def test_compaction_sources_are_served_until_their_result_is_loaded(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    target = {1: Target(segments={102: TargetSegment(102, 11), 103: TargetSegment(103, 10, (100, 101))})}
    held = held_of({100: (1, 10, {1}), 101: (1, 10, {2}), 102: (1, 11, {1})})
    d = diff(meta, target, held, reachable={1, 2}, online={1, 2}, busy=set())
    assert [s.segment_id for s in d.repairs[1].missing_segments] == [103]
    assert not d.repairs[1].release_segments, "100 and 101 still serve until 103 is held"


async def test_compaction_sources_are_served_through_chains_until_the_final_result_is_held(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    # 100 was compacted into 150, and 150 into 103 before 150 was ever loaded: only 103's record names a source
    # (150, held by no node); nothing on record links 100 to 103. 199 is a leftover of partition 11.
    target = {1: Target(segments={101: TargetSegment(101, 10), 102: TargetSegment(102, 11),
                                  103: TargetSegment(103, 10, (150,))})}
    held = held_of({100: (1, 10, {1}), 101: (1, 10, {2}), 102: (1, 11, {1}), 199: (1, 11, {2})})
    d = diff(meta, target, held, reachable={1, 2}, online={1, 2}, busy=set())
    assert [s.segment_id for s in d.repairs[1].missing_segments] == [103]
    release = {ns.node_id: sorted(ns.segment_ids) for ns in d.repairs[1].release_segments}
    assert release == {2: [199]}, "100 serves 103's rows until 103 is held; partition 11 waits for nothing"
    held = held_of({100: (1, 10, {1}), 101: (1, 10, {2}), 102: (1, 11, {1}), 103: (1, 10, {2})})
    d = diff(meta, target, held, reachable={1, 2}, online={1, 2}, busy=set())
    release = {ns.node_id: sorted(ns.segment_ids) for ns in d.repairs[1].release_segments}
    assert release == {1: [100]}, "the final result is held: the chain's first source goes"


async def test_an_unwatched_channel_is_watched_again(kv: MetaKV) -> None:
    meta = await loaded_meta(kv)
    await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(collection_id=1, dm_channel="dml-1-0",
                                                                  node_id=1)])
    target = {1: Target(segments=dict(TARGET[1].segments), channels={"dml-1-0", "dml-1-1"})}
    held = held_of({100: (1, 10, {1}), 101: (1, 10, {2}), 102: (1, 11, {1})}, channels={(1, "dml-1-1"): {2}})
    d = diff(meta, target, held, reachable={1, 2}, online={1, 2}, busy=set())
    assert [(w.dm_channel, w.node_id) for w in d.repairs[1].rewatch] == [("dml-1-0", 1)]


async def test_one_dm_channel_watcher_per_replica_the_recorded_one(kv: MetaKV) -> None:
    meta = QueryMeta(kv)
    await meta.reload()
    await meta.add_collection(1, COLL, [10], replicas=[
        data_pb2.ReplicaInfo(replica_id=7, collection_id=1, node_ids=[1, 2]),
        data_pb2.ReplicaInfo(replica_id=8, collection_id=1, node_ids=[3, 4])])
    await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(collection_id=1, dm_channel="dml-1-0", node_id=2,
                                                                  replica_id=7)])
    await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(collection_id=1, dm_channel="dml-1-0", node_id=9,
                                                                  replica_id=8)])
    target = {1: Target(channels={"dml-1-0"})}
    # Replica 7: its recorded node 2 and node 1 watch; replica 8: nodes 3 and 4 watch, meta records node 9 (which
    # does not); node 5 is in no replica.
    held = held_of({}, channels={(1, "dml-1-0"): {1, 2, 3, 4, 5}})
    d = diff(meta, target, held, reachable={1, 2, 3, 4, 5}, online={1, 2, 3, 4, 5}, busy=set())
    req = d.repairs[1]
    assert {nc.node_id: list(nc.channel_names) for nc in req.release_dm_channels} == {
        1: ["dml-1-0"], 4: ["dml-1-0"], 5: ["dml-1-0"]}, "the recorded watcher stays, else the lowest id"
    assert [(w.replica_id, w.node_id) for w in req.adopt_dm_channels] == [(8, 3)]
    assert not req.rewatch and "3 DM channel watches to release" in req.reason


async def test_the_checker_reloads_what_a_node_lost_and_releases_strays(etcd: EtcdCluster, root_path: str) -> None:
    """Outside hands change what nodes hold; the checker repairs it through CHECKER triggers."""
    c = QueryCluster(etcd, root_path, scheduler=fast_scheduler())
    c.config.checker_interval = 0.3
    await c.__aenter__()
    try:
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node()
        cid = await c.create_collection("lost", partitions=1, segments=12)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        await c.wait_loaded(cid)
        await c.wait_idle()
        node = max(c.nodes, key=lambda n: len(n.state.segments))
        lost = sorted(node.state.segments)[:3]
        node.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=lost))
        other = next(n for n in c.nodes if n is not node)
        stray = querynode_pb2.LoadSegmentsRequest(collection_id=cid + 1000, infos=[data_pb2.SegmentLoadInfo(
            segment_id=987654, collection_id=cid + 1000, partition_id=1, mem_size=10)])
        stray.node_id = other.node_id
        other.state.load_segments(stray)
        deadline = time.monotonic() + 30
        while not (set(lost) <= set(node.state.segments) | set(other.state.segments)
                   and 987654 not in other.state.segments):
            assert time.monotonic() < deadline, "the checker did not repair"
            await asyncio.sleep(0.1)
        await c.wait_idle()
        all_held = [s for n in c.nodes for s in n.state.segments]
        assert len(all_held) == len(set(all_held)) == 12
        trees = (await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True, limit=1000))).trees
        repairs = [t for t in trees if t.trigger.trigger_condition == qc.TRIGGER_CONDITION_CHECKER]
        assert repairs and all(t.trigger.state == qc.TASK_STATE_EXPIRED for t in repairs)
        assert any("held by no node" in t.trigger.summary for t in repairs)
        keys = await c.task_keys()
        assert all(v == 0 for v in keys.values()), keys
    finally:
        await c.__aexit__(None, None, None)


async def test_a_repair_forgets_a_nodes_stale_copies_in_few_txns(etcd: EtcdCluster, root_path: str) -> None:
    """A node that lost everything it held (its memory, not its session) while meta still records it: the
    repair forgets those copies before loading them again, by node and in as few txns as the limits allow,
    never a txn per segment (thousands of segments would wait that long to be loaded again)."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 0.3
        await c.start_coordinator()
        await c.wait_leader()
        node = await c.add_node(capacity=8192 * MiB)  # 600 segments of about 5 MB
        cid = await c.create_collection("forgot", partitions=2, segments=600)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        before = lead.kv.writes
        node.state.release_collection(querynode_pb2.ReleaseCollectionRequest(collection_id=cid))
        deadline = time.monotonic() + 60
        while len(node.state.segments) < 600:
            assert time.monotonic() < deadline, "the checker did not load the lost segments again"
            await asyncio.sleep(0.1)
        await c.wait_idle()
        writes = lead.kv.writes - before
        assert writes < 100, f"{writes} txns to repair 600 segments"
