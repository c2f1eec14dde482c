"""Replicas left with no node never wait for ever while another replica of the collection has nodes to give.

Spares that come online while a repair is already planning are shared between the replicas with no online node
(``units.spare_share``), and a parked replica with no node gets a node re-homed from a sibling replica that can
spare one (``checkers.rehome_parked``), through a persisted REHOME_NODE trigger that a new leader finishes.

Real etcd, real coordinators, real in-process query nodes. What is asserted is what the nodes report through
their GetDataDistribution RPC, for the replicas as the leader lists them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from _pytest.monkeypatch import MonkeyPatch

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from proto import querynode_pb2
from querycoord.cluster.nodes import NodeManager
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.task.store import TaskStore
from tests.cluster import QueryCluster, fast_scheduler, running_cluster, until, wait_until
from tests.test_drain_rehome import balance_to
from tests.test_resize import groups, load
from tests.truth import target_of

LONG = fast_scheduler(trigger_timeout=600.0)


async def reported(nodes: NodeManager, node_ids: Iterable[int], cid: int) -> tuple[set[int], set[str]]:
    """The segments and DM channels of ``cid`` that these nodes report holding (their GetDataDistribution)."""
    segs: set[int] = set()
    chans: set[str] = set()
    for n in sorted(node_ids):
        if not nodes.is_online(n):
            continue
        try:
            d = await nodes.client(n).call("GetDataDistribution", querynode_pb2.GetDataDistributionRequest())
        except Exception:  # a node going away between the check and the call holds nothing we can count
            continue
        segs |= {s.segment_id for s in d.segments if s.collection_id == cid}
        segs |= {i for g in d.segment_groups if g.collection_id == cid for i in g.segment_ids}
        chans |= {ch.channel_name for ch in d.channels
                  if ch.collection_id == cid and ch.kind == querynode_pb2.CHANNEL_KIND_DM}
    return segs, chans


def leader_of(c: QueryCluster) -> Leadership | None:
    return next((p.coord.leadership for p in c.coords if p.coord.is_leader), None)


async def every_replica_whole(c: QueryCluster, cid: int, target: tuple[set[int], set[str]]) -> bool:
    """Every replica of ``cid`` has nodes of its own (no node in two replicas) and those nodes report every target
    segment and DM channel."""
    lead = leader_of(c)
    if lead is None:
        return False
    replicas = groups(lead.meta, cid)
    members = [n for nodes in replicas.values() for n in nodes]
    if not replicas or len(members) != len(set(members)):
        return False
    for nodes in replicas.values():
        segs, chans = await reported(lead.nodes, nodes, cid)
        if not nodes or target[0] - segs or target[1] - chans:
            return False
    return True


async def stop_node(c: QueryCluster, node: QueryNode) -> None:
    await node.stop()
    c.nodes.remove(node)


def node_by_id(c: QueryCluster, node_id: int) -> QueryNode:
    return next(n for n in c.nodes if n.node_id == node_id)


class RepairGate:
    """Holds the leader's catalog reads of named segments of one collection (the reads a repair makes when it plans
    a unit, after it gave out spares) until opened: the test then changes the cluster under the waiting repair."""

    def __init__(self, broker: Any, cid: int):
        self.original = broker.get_recovery_info
        self.cid = cid
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def get_recovery_info(self, collection_id: int, partition_id: int, segment_ids: Any = None) -> Any:
        if collection_id == self.cid and segment_ids is not None:
            self.entered.set()
            await self.opened.wait()
        return await self.original(collection_id, partition_id, segment_ids)


async def test_spares_back_while_a_repair_plans_are_shared_with_the_parked_replica(
        etcd: EtcdCluster, root_path: str, monkeypatch: MonkeyPatch) -> None:
    """The restart drill's sequence: one replica parked with no node and no spare, the other's repair planning
    when its last node goes too and three spares come online: both replicas end whole, each on its own nodes."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node()
        cid = await c.create_collection("shared", partitions=1, segments=24, channels=2)
        await load(c, cid, 2)
        target = await target_of(c, cid)
        lead = leader_of(c)
        assert lead is not None
        (ra, (a,)), (rb, (b,)) = sorted((r, sorted(n)) for r, n in groups(lead.meta, cid).items())

        await stop_node(c, node_by_id(c, b))  # replica rb: no node, no spare
        await wait_until(lambda: lead.env.parked.get(cid, rb) is not None, "the replica with no node is parked")
        assert lead.env.parked.get(cid, rb).code == "no_node"  # type: ignore[union-attr]

        gate = RepairGate(lead.env.broker, cid)
        monkeypatch.setattr(lead.env.broker, "get_recovery_info", gate.get_recovery_info)
        held = sorted(node_by_id(c, a).state.segments)
        await lead.nodes.client(a).call("ReleaseSegments", querynode_pb2.ReleaseSegmentsRequest(
            collection_id=cid, segment_ids=held))  # replica ra lacks them: the checker queues its repair
        await asyncio.wait_for(gate.entered.wait(), 60)  # planning ra's unit, no spare given out (none online)

        await stop_node(c, node_by_id(c, a))  # every node lost
        await wait_until(lambda: not lead.meta.replica_nodes(cid, ra), "the lost node left its replica")
        spares = [await c.add_node() for _ in range(3)]
        for n in spares:
            await c.wait_node_online(n.node_id)
        gate.opened.set()

        assert await until("both replicas whole, each on its own nodes",
                           lambda: every_replica_whole(c, cid, target), timeout=90)
        after = groups(lead.meta, cid)
        assert after[ra] and after[rb] and not after[ra] & after[rb], after
        assert after[ra] | after[rb] <= {n.node_id for n in spares}, after
        await c.wait_idle()


async def test_a_parked_replica_gets_a_node_a_sibling_can_spare(etcd: EtcdCluster, root_path: str) -> None:
    """Every spare already in one replica (a balance moved them there), the other replica's only node lost: a
    node of the first moves to it (its copies first loaded on the first replica's other nodes), and both end whole
    on their own nodes with no node added."""
    async with running_cluster(etcd, root_path, [None] * 2, scheduler=LONG) as c:
        assert c.client is not None
        cid = await c.create_collection("rehomed", partitions=2, segments=24, channels=2)
        await load(c, cid, 2)
        target = await target_of(c, cid)
        lead = leader_of(c)
        assert lead is not None
        (ra, (a,)), (rb, (b,)) = sorted((r, sorted(n)) for r, n in groups(lead.meta, cid).items())
        for _ in range(2):  # both spares join replica ra
            spare = await c.add_node()
            await c.wait_node_online(spare.node_id)
            moved = sorted(s.segment_id for s in lead.meta.segments_on_node(a))[:4]
            await balance_to(c, cid, a, spare.node_id, moved)
        first = groups(lead.meta, cid)
        assert {r: len(n) for r, n in first.items()} == {ra: 3, rb: 1}, first

        await stop_node(c, node_by_id(c, b))
        assert await until("both replicas whole, each on its own nodes",
                           lambda: every_replica_whole(c, cid, target), timeout=90)
        await c.wait_idle()
        after = groups(lead.meta, cid)
        assert len(after[rb]) == 1 and after[rb] < first[ra] and after[ra] == first[ra] - after[rb], (first, after)
        listed = await c.client.query("ListTasks", qc.ListTasksRequest(collection_id=cid, include_finished=True))
        rehomes = [t.trigger for t in listed.trees if t.trigger.kind == qc.TASK_KIND_REHOME_NODE]
        assert len(rehomes) == 1 and rehomes[0].state == qc.TASK_STATE_EXPIRED, rehomes
        assert f"from replica {ra} to replica {rb}: replica {rb} has no online query node" in rehomes[0].summary, \
            rehomes[0].summary


async def test_a_parked_replica_no_sibling_can_help_says_so(etcd: EtcdCluster, root_path: str) -> None:
    """Two replicas of one node each, one node lost: the other replica cannot spare its only node, so the lost
    one's replica stays parked and its reason says so; a node that joins then takes it."""
    async with running_cluster(etcd, root_path, [None] * 2, scheduler=LONG) as c:
        cid = await c.create_collection("alone", partitions=1, segments=8, channels=2)
        await load(c, cid, 2)
        target = await target_of(c, cid)
        lead = leader_of(c)
        assert lead is not None
        (ra, (a,)), (rb, (b,)) = sorted((r, sorted(n)) for r, n in groups(lead.meta, cid).items())
        await stop_node(c, node_by_id(c, b))

        def says_why() -> bool:
            unit = lead.env.parked.get(cid, rb)
            return unit is not None and "can spare a node" in unit.reason

        await wait_until(says_why, "the parked replica says no sibling can spare a node")
        unit = lead.env.parked.get(cid, rb)
        assert unit is not None and unit.code == "no_node", unit
        assert "waiting for a query node to join" in unit.reason, unit.reason
        assert f"no other replica of collection {cid} can spare a node" in unit.reason, unit.reason
        assert groups(lead.meta, cid) == {ra: {a}, rb: set()}, "nothing moved"
        assert not [t for t in lead.scheduler.triggers.values() if t.KIND == qc.TASK_KIND_REHOME_NODE]

        await c.add_node()
        assert await until("both replicas whole once a node joined",
                           lambda: every_replica_whole(c, cid, target), timeout=90)


async def test_a_leader_killed_while_a_node_moves_to_a_parked_replica_is_finished_by_the_new_leader(
        etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        first_leader = await c.start_coordinator()
        await c.wait_leader()
        await c.start_coordinator()
        assert c.client is not None and c.kv is not None
        for _ in range(2):
            await c.add_node(faults=FaultConfig(latency_ms=150))
        cid = await c.create_collection("moving", partitions=2, segments=24, channels=2)
        await load(c, cid, 2)
        target = await target_of(c, cid)
        lead = first_leader.coord.leadership
        assert lead is not None
        (ra, (a,)), (rb, (b,)) = sorted((r, sorted(n)) for r, n in groups(lead.meta, cid).items())
        for _ in range(2):
            spare = await c.add_node(faults=FaultConfig(latency_ms=150))
            await c.wait_node_online(spare.node_id)
            moved = sorted(s.segment_id for s in lead.meta.segments_on_node(a))[:4]
            await balance_to(c, cid, a, spare.node_id, moved)
        first = groups(lead.meta, cid)
        assert {r: len(n) for r, n in first.items()} == {ra: 3, rb: 1}, first

        store = TaskStore(c.kv)

        async def stored_move() -> list[int]:
            return [rec.rehome_node.move.node_id for rec in await store.load_all()
                    if rec.kind == qc.TASK_KIND_REHOME_NODE]

        await stop_node(c, node_by_id(c, b))
        moving = await until("the re-home is recorded in etcd", stored_move, timeout=60)
        await first_leader.crash()
        second = await c.wait_leader()
        assert second is not first_leader

        assert await until("both replicas whole, each on its own nodes, under the new leader",
                           lambda: every_replica_whole(c, cid, target), timeout=90)
        await c.wait_idle()
        await c.wait_no_task_keys()
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        after = groups(fresh, cid)
        assert after[rb] == set(moving) and after[ra] == first[ra] - set(moving), (first, after, moving)
