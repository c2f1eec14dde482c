"""A grow with no spare node takes nodes from the collection's replicas that can spare them (re-homing).

Real etcd, real coordinators, real query nodes on loopback. At every poll while the grow runs, the collection's
original replica (the nodes the leader lists in it at that moment) holds every segment and DM channel, as the
nodes' own distributions report, and so does every replica of another collection sharing those nodes; in the end
two whole replicas on disjoint nodes, recorded in etcd.
"""

from __future__ import annotations

import asyncio

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.task.store import TaskStore
from tests.cluster import QueryCluster, replica_number_recorded, running_cluster
from tests.test_resize import Watch, groups, holds, load, snapshot, update

SLOW = FaultConfig(latency_ms=40)


def replicas_whole(nodes: list[QueryNode], meta: QueryMeta, cid: int, segments: int, channels: int,
                   only: set[int] | None = None) -> bool:
    """Whether each counted replica of ``cid`` (those in ``only`` when given), on the nodes the leader lists in it
    now, holds every segment and DM channel as the nodes report."""
    info = meta.get_collection(cid)
    if info is None:
        return False
    counted = [r for r in info.replicas][:info.replica_number]
    return all(holds(nodes, set(r.node_ids), cid, segments, channels)
               for r in counted if only is None or r.replica_id in only)


async def test_grow_takes_nodes_from_a_replica_that_can_spare_them(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [SLOW] * 4) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("grow", partitions=2, segments=80, channels=2)
        other = await c.create_collection("other", partitions=1, segments=30, channels=2)
        await load(c, cid, 1)  # a first load with one replica takes every online node
        await load(c, other, 2)
        meta = c.coords[0].coord.leadership.meta
        (first, first_nodes), = groups(meta, cid).items()
        assert len(first_nodes) == 4
        other_groups = groups(meta, other)

        def watched() -> bool:
            return (replicas_whole(c.nodes, meta, cid, 80, 2, {first})
                    and replicas_whole(c.nodes, meta, other, 30, 2))

        with Watch(watched).running() as watch:
            r = await update(c.client, cid, 2)
            assert r.status.error_code == common_pb2.SUCCESS and r.task_id, r.status
            await c.wait_idle()
        assert watch.polls > 3 and not watch.broken, (watch.polls, watch.broken)

        after = groups(meta, cid)
        assert len(after) == 2 and first in after
        (new_nodes,) = (v for k, v in after.items() if k != first)
        assert after[first] < first_nodes and new_nodes == first_nodes - after[first], after
        assert len(after[first]) == 2 and len(new_nodes) == 2, "an even share of the nodes each"
        assert holds(c.nodes, after[first], cid, 80, 2) and holds(c.nodes, new_nodes, cid, 80, 2)
        assert groups(meta, other) == other_groups, "the other collection's replicas are untouched"
        assert replicas_whole(c.nodes, meta, other, 30, 2)
        fresh = QueryMeta(c.kv)  # what a new leader reads
        await fresh.reload()
        stored = fresh.get_collection(cid)
        assert stored is not None and stored.replica_number == 2 and groups(fresh, cid) == after
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_EXPIRED and not tree.trigger.error, tree.trigger
        await c.wait_no_task_keys()


async def test_a_grow_that_cannot_fit_even_with_rehoming_is_refused(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 3) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("full", partitions=1, segments=12, channels=2)
        await load(c, cid, 2)  # 2 + 1 nodes
        before = await snapshot(c.kv)
        r = await update(c.client, cid, 4)  # 2 more nodes needed: one replica can give 1
        assert r.status.error_code == common_pb2.NO_AVAILABLE_NODE, r.status
        assert "needs 2 query nodes for 2 new replicas" in r.status.reason, r.status.reason
        assert "0 spare online and 1 its replicas can spare" in r.status.reason, r.status.reason
        assert "start 1 more query node" in r.status.reason, r.status.reason
        assert await snapshot(c.kv) == before
        assert not c.coords[0].coord.leadership.scheduler.triggers


async def test_a_leader_killed_while_nodes_move_is_finished_by_the_new_leader(
        etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        first_leader = await c.wait_leader()
        await c.start_coordinator()
        assert c.client is not None and c.kv is not None
        for _ in range(4):
            await c.add_node(faults=FaultConfig(latency_ms=150))
        for n in c.nodes:
            await c.wait_node_online(n.node_id)
        cid = await c.create_collection("crash", partitions=2, segments=60, channels=2)
        await load(c, cid, 1)
        (first, first_nodes), = groups(first_leader.coord.leadership.meta, cid).items()

        async def stored_moves() -> list[int]:
            for rec in await TaskStore(c.kv).load_all():
                if rec.kind == qc.TASK_KIND_UPDATE_LOAD_CONFIG:
                    return [m.node_id for m in rec.update_load_config.rehomes]
            return []

        def first_whole() -> bool:
            lead = next((p.coord.leadership for p in c.coords if p.coord.is_leader), None)
            return lead is None or replicas_whole(c.nodes, lead.meta, cid, 60, 2, {first})

        with Watch(first_whole).running() as watch:
            r = await update(c.client, cid, 2)
            assert r.status.error_code == common_pb2.SUCCESS and r.task_id, r.status
            moving: list[int] = []
            for _ in range(300):
                moving = await stored_moves()
                if moving:
                    break
                await asyncio.sleep(0.02)
            assert moving, "the plan's nodes are recorded in the trigger's record"
            await first_leader.crash()
            second = await c.wait_leader()
            assert second is not first_leader

            assert await replica_number_recorded(c, cid, 2), "the new leader finished the grow"
            await c.wait_idle()
        assert not watch.broken, (watch.polls, watch.broken)
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        after = groups(fresh, cid)
        assert len(after) == 2 and after[first] == first_nodes - set(moving), (after, moving)
        (new_nodes,) = (v for k, v in after.items() if k != first)
        assert new_nodes == set(moving) and not new_nodes & after[first]
        assert holds(c.nodes, after[first], cid, 60, 2) and holds(c.nodes, new_nodes, cid, 60, 2)
        await c.wait_no_task_keys()
