"""Recovery: a coordinator killed mid-load, thousands of persisted triggers, a node crashing mid-load, auto balance."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from meta.idalloc import IdAllocator
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.leader.balance import plan_move
from querycoord.nodes.querynode import FaultConfig
from querycoord.task.model import Task
from tests.cluster import MiB, QueryCluster, fast_scheduler, wait_in_memory, wait_until
from tests.spawn import MID_LOAD_FLAGS, spawn_coordinator


async def test_coordinator_killed_mid_load_then_restarted_finishes_the_load(
    etcd: EtcdCluster, root_path: str, tmp_path: Path
) -> None:
    async with QueryCluster(etcd, root_path) as c:
        slow = FaultConfig(latency_ms=150)
        for _ in range(3):
            await c.add_node(faults=slow)
        first = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-first")
        try:
            await first.next_event("leader", timeout=60)
            from querycoord.catalog.store import CatalogStore
            from querycoord.net.client import QueryCoordClient

            desc, _ = await CatalogStore(c.kv).create_bulk_collection("crash", num_partitions=4, num_segments=300)
            cid = desc.collection_id
            client = QueryCoordClient([first.address], deadline=60)
            r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
            assert r.status.error_code == common_pb2.SUCCESS, r
            # Let some children finish, then kill -9 the coordinator mid-load.
            while sum(len(n.state.segments) for n in c.nodes) < 30:
                await asyncio.sleep(0.05)
            await first.kill()
            held_at_kill = sum(len(n.state.segments) for n in c.nodes)
            assert held_at_kill < 300, "the load was still running when the coordinator died"
            assert await c.kv.get(f"queryCoord-triggerTask/{r.task_id}") is not None, \
                "the persisted tree survives the crash"

            second = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-second")
            try:
                await second.next_event("leader", timeout=60)
                client2 = QueryCoordClient([second.address], deadline=60)
                await wait_in_memory(client2, cid, timeout=90)
                held = [set(n.state.segments) for n in c.nodes]
                assert sum(len(h) for h in held) == 300 == len(set().union(*held)), "each segment exactly once"
                await c.wait_no_task_keys(timeout=60)
                await client.close()
                await client2.close()
            finally:
                await second.stop(timeout=30)
        finally:
            await first.kill()


async def test_reload_of_5000_persisted_triggers_does_not_block_start_up(
        etcd: EtcdCluster, root_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Milvus blocked start-up past 1,024 persisted triggers; here they are all queued at once. While they drain,
    the checker's passes (one kicked as each ends) do not ask each queued trigger for its collections: they did,
    O(n) asks a pass and O(n) passes, and this drain took over a minute of the leader's CPU (``task.owners``)."""
    asks = 0
    plain = Task.collections

    def counted(self: Task) -> set[int]:
        nonlocal asks
        asks += 1
        return plain(self)

    monkeypatch.setattr(Task, "collections", counted)
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(max_concurrent_triggers=4)) as c:
        ids = await IdAllocator(c.kv, "idalloc/task").allocate(5000)
        recs = []
        for i in ids:
            rec = task_pb2.TaskRecord(id=i, kind=qc.TASK_KIND_RELEASE_COLLECTION, collection_id=100000 + i,
                                      trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST)
            rec.release_collection.collection_id = 100000 + i
            recs.append(rec)
        # Written as a bulk import, like an old leader would have left them.
        await c.kv.chunked_save_non_atomic({k: v for r in recs for k, v in _keys(r).items()})
        coord = await c.start_coordinator()
        started = time.monotonic()
        await c.wait_leader(timeout=60)
        print(f"leader with 5000 persisted triggers after {time.monotonic() - started:.2f}s")
        assert coord.coord.is_leader
        # Start-up did not wait for them; they drain afterwards.
        health = await c.client.query("GetComponentStates", qc.GetComponentStatesRequest())
        assert health.state.state_code == common_pb2.HEALTHY
        await c.wait_idle(timeout=240)
        assert all(v == 0 for v in (await c.task_keys()).values())
        assert asks <= 10 * len(ids), f"{asks} asks for the collections of {len(ids)} triggers"


def _keys(rec: task_pb2.TaskRecord) -> dict[str, bytes]:
    from querycoord.task.store import save_unit

    return save_unit(rec).saves


async def test_node_crashing_mid_load_is_replaced(etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        await c.add_node()
        await c.add_node()
        c.config.scheduler.max_request_bytes = 3000
        proc, ready = await c.start_node_process("--crash-after", "4", log_dir=tmp_path)
        lead = c.coords[0].coord.leadership
        cid = await c.create_collection("crashy", partitions=2, segments=120)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        await c.wait_loaded(cid, timeout=90)
        assert await proc.wait(timeout=30) == 137, "the node crashed during the load"
        # Its last answered loads stay in meta until its session expires; then they are forgotten at once and the
        # checker's next pass loads them on the survivors (what the survivors hold is the fact waited for).
        await wait_until(lambda: not lead.meta.segments_on_node(ready["node_id"])
                         and lead.nodes.get(ready["node_id"]) is None, "the crashed node was forgotten")

        def survivors_hold_everything() -> bool:
            held = [set(n.state.segments) for n in c.nodes]
            return len(set().union(*held)) == 120

        await wait_until(survivors_hold_everything, "the survivors hold every segment", timeout=90)
        await c.wait_idle(timeout=90)
        held = [set(n.state.segments) for n in c.nodes]
        assert sum(len(h) for h in held) == 120 == len(set().union(*held))
        assert not lead.meta.segments_on_node(ready["node_id"])
        assert all(v == 0 for v in (await c.task_keys()).values())


def test_plan_move_narrows_the_spread() -> None:
    rates = {1: (800 * MiB, 1000 * MiB), 2: (100 * MiB, 1000 * MiB)}
    sizes = {1: [(i, 100 * MiB) for i in range(8)], 2: [(100, 100 * MiB)]}
    src, dst, segs = plan_move(rates, sizes, spread=0.3, memory_limit=0.9)
    assert (src, dst) == (1, 2) and 2 <= len(segs) <= 4
    assert plan_move({1: (500, 1000), 2: (400, 1000)}, {1: [(1, 100)]}, spread=0.3, memory_limit=0.9) is None


async def test_auto_balance_moves_segments_to_a_new_empty_node(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.auto_balance_interval = 0.5
        await c.start_coordinator()
        await c.wait_leader()
        first = await c.add_node(capacity=200 * MiB)
        cid = await c.create_collection("auto", partitions=1, segments=24)  # ~5 MB each: ~62 % of node 1
        await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        await c.wait_loaded(cid)
        second = await c.add_node(capacity=200 * MiB)
        deadline = time.monotonic() + 30
        while not second.state.segments:
            assert time.monotonic() < deadline, "auto balance never moved anything"
            await asyncio.sleep(0.1)
        await c.wait_idle()
        a, b = set(first.state.segments), set(second.state.segments)
        assert not a & b and len(a | b) == 24, "moved, not copied"
        assert abs(len(a) - len(b)) < 12
