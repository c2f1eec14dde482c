"""Node maintenance: cordon and uncordon, persisted by node id across leader changes and node restarts.

Real etcd, a real coordinator (its gRPC service called as clients call it), real in-process query nodes; every
placement fact is what the nodes themselves hold.
"""

from __future__ import annotations

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.lifecycle import PREFIX
from querycoord.nodes.querynode import QueryNode
from tests.cluster import QueryCluster, running_cluster, wait_until


async def lifecycle_call(c: QueryCluster, method: str, node_id: int, **kw: bool) -> qc.NodeLifecycleResponse:
    assert c.client is not None
    return await c.client.query(method, qc.NodeLifecycleRequest(node_id=node_id, **kw))


async def shown(c: QueryCluster, node_id: int) -> qc.NodeInfo:
    assert c.client is not None
    resp = await c.client.query("ShowNodes", qc.ShowNodesRequest())
    return next(n for n in resp.nodes if n.node_id == node_id)


async def test_cordoned_node_keeps_what_it_holds_and_gets_nothing_new(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None, None]) as c:
        assert c.client is not None
        a, b = c.nodes
        first = await c.create_collection("first", partitions=1, segments=8)
        await c.load_collection(first)
        await c.wait_idle()
        held_by_a = set(a.state.segments)
        assert held_by_a, "both nodes hold part of the first collection"

        r = await lifecycle_call(c, "CordonNode", a.node_id)
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        assert r.node.lifecycle == qc.NODE_LIFECYCLE_CORDONED and r.node.state == "online"
        # A cordoned node gets nothing new: a new load goes to the other node only ...
        second = await c.create_collection("second", partitions=1, segments=6)
        await c.load_collection(second)
        await c.wait_idle()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        second_ids = set(lead.meta.segment_ids_of(second))
        assert second_ids <= set(b.state.segments) and not second_ids & set(a.state.segments)
        # ... and it keeps serving what it held.
        assert held_by_a <= set(a.state.segments)
        assert (await shown(c, a.node_id)).lifecycle == qc.NODE_LIFECYCLE_CORDONED

        # A LoadBalance naming it as destination is refused with CONFLICT naming its state.
        r2 = await c.client.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[b.node_id],
                                                                        dst_node_ids=[a.node_id]))
        assert r2.status.error_code == common_pb2.CONFLICT and "cordoned" in r2.status.reason, r2.status

        # A repair does not use it either: a third node dies, its copies go to the ACTIVE one.
        c_node = await c.add_node()
        r3 = await c.client.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[b.node_id],
                                                                        dst_node_ids=[c_node.node_id],
                                                                        collection_id=second))
        assert r3.status.error_code == common_pb2.SUCCESS, r3.status
        await wait_until(lambda: second_ids <= set(c_node.state.segments), "the balance moved the second collection")
        await c.wait_idle()
        await c_node.stop()
        await wait_until(lambda: second_ids <= set(b.state.segments), "the lost copies are loaded again on b")
        assert not second_ids & set(a.state.segments), "the repair put nothing on the cordoned node"

        r = await lifecycle_call(c, "UncordonNode", a.node_id)
        assert r.status.error_code == common_pb2.SUCCESS and r.node.lifecycle == qc.NODE_LIFECYCLE_ACTIVE
        assert await c.kv.count_prefix(PREFIX) == 0 if c.kv else False


async def test_lifecycle_survives_leader_change_and_node_restart(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        assert c.kv is not None
        node = QueryNode(c.kv, capacity_bytes=1 << 30, ttl=2.0, node_id=4711)
        await node.start()
        c.nodes.append(node)
        await c.wait_node_online(4711)
        r = await lifecycle_call(c, "CordonNode", 4711)
        assert r.status.error_code == common_pb2.SUCCESS, r.status

        # A standby takes over when the leader stops: it reads the record back.
        await c.start_coordinator()
        await c.coords[0].stop()
        new = await c.wait_leader()
        assert new is c.coords[1]
        await c.wait_node_online(4711)
        assert (await shown(c, 4711)).lifecycle == qc.NODE_LIFECYCLE_CORDONED

        # The node restarts under its id: an operator's cordon stays.
        await node.stop()
        c.nodes.remove(node)
        again = QueryNode(c.kv, capacity_bytes=1 << 30, ttl=2.0, node_id=4711)
        await again.start()
        c.nodes.append(again)
        await c.wait_node_online(4711)
        lead = new.coord.leadership
        assert lead is not None
        await wait_until(lambda: lead.nodes.get(4711) is not None and lead.nodes.get(4711).online, "back online")
        lead.checker.kick()
        assert new.coord.catalog is not None
        desc, _ = await new.coord.catalog.create_bulk_collection("after_restart", num_partitions=1, num_segments=2)
        cid = desc.collection_id
        other = await c.add_node()
        await c.load_collection(cid)
        assert (await shown(c, 4711)).lifecycle == qc.NODE_LIFECYCLE_CORDONED
        assert not again.state.segments and set(other.state.segments) == set(lead.meta.segment_ids_of(cid))


async def test_bad_input_is_refused_and_writes_nothing(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.kv is not None
        for method in ("CordonNode", "UncordonNode", "DrainNode"):
            r = await lifecycle_call(c, method, 999_999)
            assert r.status.error_code == common_pb2.NOT_FOUND and "999999" in r.status.reason, r.status
            r = await lifecycle_call(c, method, 0)
            assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "node_id" in r.status.reason, r.status
        assert await c.kv.count_prefix(PREFIX) == 0
        # Uncordoning an active node is harmless; cordoning twice is one record.
        nid = c.nodes[0].node_id
        assert (await lifecycle_call(c, "UncordonNode", nid)).node.lifecycle == qc.NODE_LIFECYCLE_ACTIVE
        for _ in range(2):
            assert (await lifecycle_call(c, "CordonNode", nid)).node.lifecycle == qc.NODE_LIFECYCLE_CORDONED
        assert await c.kv.count_prefix(PREFIX) == 1
