"""The checker's rules of issue 24 §2, on a real cluster (real etcd, real gRPC nodes in this process).

What nodes hold is read from the nodes themselves (``node.state``), never from what the coordinator believes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from meta.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.querymeta import QueryMeta
from tests.cluster import QueryCluster, running_cluster


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        await asyncio.sleep(0.1)


async def replica_nodes_shown(c: QueryCluster, cid: int) -> set[int]:
    assert c.client is not None
    r = await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    return {n for rep in r.replicas for n in rep.node_ids}


async def test_a_replica_member_that_held_nothing_leaves_its_replica_when_it_dies(etcd: EtcdCluster,
                                                                                 root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None], checker_interval=0.3) as c:
        cid = await c.create_collection("empty_member", partitions=1, segments=4, channels=1)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = c.coords[0].coord.leadership
        assert lead is not None
        meta = lead.meta
        (replica,) = meta.replica_ids(cid)
        spare = await c.add_node()
        await c.wait_node_online(spare.node_id)
        # A spare joins the replica (as ``plan_children`` makes one join) and is given nothing to hold.
        await meta.add_replica_nodes(cid, replica, [spare.node_id])
        assert spare.node_id in await replica_nodes_shown(c, cid)
        assert not spare.state.segments and not spare.state.dm_channels

        await spare.stop()
        c.nodes.remove(spare)
        await wait_until(lambda: spare.node_id not in meta.replica_nodes(cid, replica), "the dead member left")
        assert spare.node_id not in await replica_nodes_shown(c, cid)
        assert c.kv is not None
        persisted = QueryMeta(c.kv)  # what a standby or the next leader reads from etcd
        await persisted.reload()
        assert spare.node_id not in persisted.replica_nodes(cid, replica)
        assert spare.node_id not in persisted.known_node_ids()

        # A member that died while nobody watched (no node-down event reaches this leader): the checker's pass
        # forgets it all the same, although it holds nothing the pass could have noticed missing.
        ghost = max(meta.known_node_ids() | {n.node_id for n in c.nodes}) + 100
        await meta.add_replica_nodes(cid, replica, [ghost])
        await wait_until(lambda: ghost not in meta.replica_nodes(cid, replica), "the checker forgot the ghost")
        assert ghost not in await replica_nodes_shown(c, cid)
