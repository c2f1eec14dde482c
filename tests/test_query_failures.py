"""Failures: rescheduling, rollback, release retries, node loss, cancellation, handoff (real nodes)."""

from __future__ import annotations

import asyncio

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord.nodes.querynode import FaultConfig
from tests.cluster import running_cluster, wait_until


def no_keys(keys: dict[str, int]) -> bool:
    return all(v == 0 for v in keys.values())


async def test_failing_node_children_are_rescheduled_to_healthy_ones(etcd: EtcdCluster, root_path: str) -> None:
    broken = FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"}))
    async with running_cluster(etcd, root_path, [broken, None, None]) as c:
        cid = await c.create_collection("resched", partitions=2, segments=60)
        r = await c.load_collection(cid)
        await c.wait_idle()
        assert not c.nodes[0].state.segments, "the failing node holds nothing"
        held = set(c.nodes[1].state.segments) | set(c.nodes[2].state.segments)
        assert len(held) == 60
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_EXPIRED
        replaced = [ch for ch in tree.children if ch.replaces_task_id]
        assert replaced, "rescheduled children are recorded with the child they replace"
        assert all(c.nodes[0].node_id in ch.excluded_node_ids for ch in replaced)
        assert no_keys(await c.task_keys())


async def test_failure_on_every_node_fails_and_rolls_back(etcd: EtcdCluster, root_path: str) -> None:
    broken = FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"}))
    async with running_cluster(etcd, root_path, [broken, broken]) as c:
        cid = await c.create_collection("doomed", partitions=1, segments=10)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, "the plan was persisted; the failure comes later"
        await c.wait_idle()
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_FAILED
        assert "could not be rescheduled" in tree.trigger.error
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.status.error_code == common_pb2.NOT_FOUND, "rolled back: not loaded"
        assert all(not n.state.segments and not n.state.dm_channels for n in c.nodes), "rolled back on the nodes"
        assert no_keys(await c.task_keys())


async def test_release_retries_until_the_node_succeeds(etcd: EtcdCluster, root_path: str) -> None:
    flaky = FaultConfig(failure_rate=0.6, seed=7, fail_kinds=frozenset({"ReleaseCollection"}))
    async with running_cluster(etcd, root_path, [flaky, None]) as c:
        cid = await c.create_collection("flaky", partitions=1, segments=20)
        await c.load_collection(cid)
        await c.wait_idle()
        r = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r
        assert not c.nodes[0].state.segments and not c.nodes[1].state.segments
        assert c.nodes[0].injector.injected_failures > 0, "the flaky node did refuse some releases"


async def test_release_cancels_a_running_load(etcd: EtcdCluster, root_path: str) -> None:
    slow = FaultConfig(latency_ms=300)
    async with running_cluster(etcd, root_path, [slow, slow]) as c:
        cid = await c.create_collection("slow", partitions=4, segments=120)
        c.config.scheduler.max_request_bytes = 2000  # many small children, so the load takes a while
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        rel = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert rel.status.error_code == common_pb2.SUCCESS, rel
        load = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree.trigger
        assert load.state == qc.TASK_STATE_FAILED and load.error_code == common_pb2.CANCELLED
        assert "cancelled by release" in load.error
        await c.wait_idle()
        assert all(not n.state.segments for n in c.nodes)
        assert no_keys(await c.task_keys())


async def test_node_down_moves_segments_and_channels_to_survivors(etcd: EtcdCluster, root_path: str,
                                                                  subprocess_env: dict[str, str]) -> None:
    async with running_cluster(etcd, root_path, [None, None]) as c:
        proc, ready = await c.start_node_process(env=subprocess_env)
        cid = await c.create_collection("down", partitions=2, segments=90, channels=3)
        await c.load_collection(cid)
        await c.wait_idle()
        meta = c.coords[0].coord.leadership.meta
        dead = ready["node_id"]
        on_dead = {s.segment_id for s in meta.segments_on_node(dead)}
        assert on_dead, "the node process got segments"
        await proc.kill()  # SIGKILL, and reaped
        # Its session expires after the TTL; the coordinator forgets its copies at once and the
        # checker's next pass repairs them on the survivors (the nodes' own state is the fact).
        await wait_until(lambda: not meta.segments_on_node(dead) and not meta.channels_on_node(dead),
                         "the coordinator forgot the dead node's copies")

        def survivors_hold_everything() -> bool:
            held = set(c.nodes[0].state.segments) | set(c.nodes[1].state.segments)
            return on_dead <= held and len(held) == 90 and sum(len(n.state.dm_channels) for n in c.nodes) >= 3

        await wait_until(survivors_hold_everything, "the survivors hold every segment and channel")
        await c.wait_idle()
        watched = [ch for n in c.nodes for ch in n.state.dm_channels]
        assert len(watched) == 3, f"every DM channel watched by exactly one survivor: {watched}"
        assert no_keys(await c.task_keys())


async def test_handoff_loads_new_segments_and_releases_compaction_sources(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None, None]) as c:
        cid = await c.create_collection("hand", partitions=1, segments=6)
        await c.load_collection(cid)
        await c.wait_idle()
        catalog = c.coords[0].coord.catalog
        pid = (await catalog.show_partitions(cid))[0].partition_id
        _, binlogs = await catalog.get_recovery_info(cid, pid)
        sources = [b.segment_id for b in binlogs[:2]]
        new_ids = await catalog.add_segments([data_pb2.SegmentBinlogs(
            collection_id=cid, partition_id=pid, num_rows=100, mem_size=1 << 20, binlog_paths=["x"],
            compaction_from=sources)])
        for _ in range(200):
            held = set(c.nodes[0].state.segments) | set(c.nodes[1].state.segments)
            if new_ids[0] in held and not set(sources) & held:
                break
            await asyncio.sleep(0.05)
        await c.wait_idle()
        held = set(c.nodes[0].state.segments) | set(c.nodes[1].state.segments)
        assert new_ids[0] in held, "the compacted segment was handed off to a node"
        assert not set(sources) & held, "its compaction sources were released"
        meta = c.coords[0].coord.leadership.meta
        assert meta.get_segment(new_ids[0]) is not None and all(meta.get_segment(s) is None for s in sources)
