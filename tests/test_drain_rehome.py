"""Draining the only node of a replica: a node another replica of the collection can spare moves into it first
(re-homing), so the drain finishes; with no node to spare, the drain waits and says what would make it move.

Real etcd, a real coordinator, real in-process query nodes; what is checked at every poll is what the nodes report
(their distributions) for the replicas as the leader lists them at that moment.
"""

from __future__ import annotations

import asyncio

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.leader.balance import spare_may_join
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode import QueryNode
from tests.cluster import MiB, QueryCluster, drain, drain_waiting, node_info, running_cluster, wait_until
from tests.test_resize import Watch, groups, holds, load
from tests.test_served import two_replica_meta


def every_replica_whole(lead: Leadership, nodes: list[QueryNode], cid: int, segments: int, channels: int) -> bool:
    return all(holds(nodes, set(r.node_ids), cid, segments, channels) for r in lead.meta.replicas_of(cid))


async def balance_to(c: QueryCluster, cid: int, src: int, dst: int, segments: list[int]) -> None:
    """A user's LoadBalance of ``segments`` from ``src`` onto the spare ``dst``, which joins ``src``'s replica."""
    assert c.client is not None
    r = await c.client.query("LoadBalance", qc.LoadBalanceRequest(
        source_node_ids=[src], dst_node_ids=[dst], sealed_segment_ids=segments, collection_id=cid))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    await c.wait_idle()


async def wait_drained(c: QueryCluster, node_id: int) -> qc.NodeInfo:
    for _ in range(900):
        info = await node_info(c, node_id)
        if info.lifecycle == qc.NODE_LIFECYCLE_DRAINED:
            return info
        await asyncio.sleep(0.1)
    raise AssertionError(f"node {node_id} not drained: {await node_info(c, node_id)}")


async def test_drain_of_a_replicas_only_node_takes_a_node_from_a_replica_of_three(
        etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 2) as c:
        assert c.client is not None
        cid = await c.create_collection("lopsided", partitions=2, segments=24, channels=2)
        await load(c, cid, 2)  # one node each
        lead = c.coords[0].coord.leadership
        assert lead is not None
        (r1, (a,)), (r2, (b,)) = sorted((r, sorted(n)) for r, n in groups(lead.meta, cid).items())
        for _ in range(2):  # two spares join replica r1 (as a balance onto a spare makes them): 3 nodes against 1
            spare = await c.add_node()
            await c.wait_node_online(spare.node_id)
            held = sorted(s.segment_id for s in lead.meta.segments_on_node(a))
            await balance_to(c, cid, a, spare.node_id, held[:4])
        sizes = {r: len(n) for r, n in groups(lead.meta, cid).items()}
        assert sizes == {r1: 3, r2: 1}, sizes

        with Watch(lambda: every_replica_whole(lead, c.nodes, cid, 24, 2)).running() as watch:
            await drain(c, b)
            info = await wait_drained(c, b)
            await c.wait_idle()
        assert watch.polls > 3 and not watch.broken, (watch.polls, watch.broken)
        assert not info.drain.waiting and info.drain.copies_left == 0
        after = groups(lead.meta, cid)
        assert set(after) == {r1, r2} and b not in after[r1] | after[r2]
        assert len(after[r1]) == 2 and len(after[r2]) == 1 and not after[r1] & after[r2], after
        assert holds(c.nodes, after[r1], cid, 24, 2) and holds(c.nodes, after[r2], cid, 24, 2)
        drained = next(n for n in c.nodes if n.node_id == b)
        assert not drained.state.segments and not drained.state.dm_channels
        listed = await c.client.query("ListTasks", qc.ListTasksRequest(collection_id=cid, include_finished=True))
        rehomes = [t.trigger for t in listed.trees if t.trigger.kind == qc.TASK_KIND_REHOME_NODE]
        assert rehomes and all(t.state == qc.TASK_STATE_EXPIRED for t in rehomes), rehomes
        assert f"to replica {r2}: drain of node {b}" in rehomes[0].summary, rehomes[0].summary


async def test_a_drain_no_replica_can_help_waits_and_says_what_would_make_it_move(
        etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 2, capacity=256 * MiB) as c:
        assert c.client is not None
        cid = await c.create_collection("pair", partitions=1, segments=8, channels=2)
        await load(c, cid, 2)
        lead = c.coords[0].coord.leadership
        assert lead is not None
        a, b = c.nodes
        held = set(a.state.segments)
        await drain(c, a.node_id)
        why = await drain_waiting(c, a.node_id)
        assert f"no other replica of collection {cid} can spare a node" in why, why
        assert "add a query node with" in why and "MiB free under 90% of capacity" in why, why
        assert held <= set(a.state.segments), "nothing was dropped while it waits"
        assert {r: len(n) for r, n in groups(lead.meta, cid).items()} == {
            lead.meta.replica_of_node(cid, a.node_id): 1, lead.meta.replica_of_node(cid, b.node_id): 1}

        spare = await c.add_node()  # what it asked for: the drain moves on
        await wait_drained(c, a.node_id)
        await wait_until(lambda: holds(c.nodes, {spare.node_id}, cid, 8, 2), "the new node took the replica")
        assert not a.state.segments


async def test_a_node_moves_between_replicas_in_one_write_and_spares_join_the_smallest(kv: MetaKV) -> None:
    """``move_replica_node`` on real etcd: the node leaves one replica and joins another (or none), other
    collections untouched, a node of a third replica refused; the auto balancer gives a spare only to a replica
    with no more nodes than the collection's others."""
    meta = await two_replica_meta(kv)  # replicas 7 (nodes 1, 2) and 8 (nodes 3, 4)
    assert spare_may_join(meta, 1, 7) and spare_may_join(meta, 1, 8)
    await meta.move_replica_node(1, 2, 7, 8)
    assert groups(meta, 1) == {7: {1}, 8: {2, 3, 4}}
    assert spare_may_join(meta, 1, 7) and not spare_may_join(meta, 1, 8), "8 has more nodes than 7"
    await meta.move_replica_node(1, 2, 7, 8)  # done already: nothing changes
    await meta.move_replica_node(1, 4, 8, 0)  # leaves 8 for no replica: a spare of the collection
    assert groups(meta, 1) == {7: {1}, 8: {2, 3}} and meta.replica_of_node(1, 4) == 0
    for bad in ((3, 7, 0), (1, 9, 8), (1, 7, 9)):
        try:
            await meta.move_replica_node(1, *bad)
        except ValueError:
            continue
        raise AssertionError(f"move {bad} was not refused")
    fresh = type(meta)(kv)
    await fresh.reload()
    assert groups(fresh, 1) == {7: {1}, 8: {2, 3}}, "persisted"
