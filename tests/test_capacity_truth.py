"""What capacity pressure must not do, each against a real cluster: a release waiting on a lost node never
shows its collection whole; a load answered SUCCESS is not rolled back whole when one replica's work has
nowhere left to go; two forgets of one node keep its new incarnation in the leader's view.

What is asserted is what the in-process nodes themselves hold (``tests.truth``), never timing.
"""

from __future__ import annotations

import asyncio
import time

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.cluster.incarnations import Incarnations
from querycoord.leader.watchers import forget_node
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta.copies import copies
from querycoord.tooling.drill.sampler import Sampler
from tests.cluster import MiB, QueryCluster, fast_scheduler
from tests.truth import InProcessSources, held_by, target_of, until_true

SEGMENT = 10_000 * (128 * 4 + 8)  # bytes accounted per segment of ``create_bulk_collection``


async def stop_serving(n: QueryNode) -> None:
    """The node stops answering at once, as a dead process would; its session lapses after its TTL."""
    await n.crash(revoke=False)


async def test_a_release_waiting_on_a_lost_node_never_shows_its_collection_whole(etcd: EtcdCluster,
                                                                                root_path: str) -> None:
    """Node b stops answering; a release is asked: node a drops its copies at once, the release's child for b
    retries until b's session lapses. Meanwhile the leader showed the collection (and its replica) at 100 %."""
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        a, b = await c.add_node(), await c.add_node()
        cid = await c.create_collection("going", partitions=1, segments=20)
        await c.load_collection(cid)
        assert a.state.segments and b.state.segments
        sources = InProcessSources(c, [cid], nodes=lambda: [a, b])
        sampler = Sampler(sources, now=time.monotonic)
        await stop_serving(b)  # b still holds its copies; its session stays for its TTL
        assert c.client is not None
        release = asyncio.create_task(c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(
            collection_id=cid)))
        found: list[str] = []
        while not release.done():
            found += await sampler.sample_once()
            await asyncio.sleep(0.05)
        await sources.close()
        assert (await release).status.error_code == common_pb2.SUCCESS
        assert not a.state.segments, "node a released at once"
        assert sampler.stats.judged > 0
        assert not found, found


async def test_a_load_whose_node_is_lost_midway_keeps_its_collection_and_parks_what_has_no_room(
        etcd: EtcdCluster, root_path: str) -> None:
    """Two nodes, each with room for about two thirds of the collection; one stops answering while the load
    (answered SUCCESS) runs. The survivor cannot take its share: the unit is parked, the collection stays loaded
    and is shown below 100 %, and a node that joins gets the rest. Before, the load failed and rolled back the
    whole collection its caller had been told was loaded."""
    slow = FaultConfig(latency_ms=150)
    room = int(14 * SEGMENT / 0.9) + MiB  # 13 segments fit under the 90 % limit, not 20
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(max_request_bytes=600,
                                                                      max_concurrent_children=2)) as c:
        await c.start_coordinator()
        await c.wait_leader()
        a = await c.add_node(capacity=room, faults=slow)
        await c.add_node(capacity=room, faults=slow)
        cid = await c.create_collection("kept", partitions=1, segments=20)
        assert c.client is not None
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await stop_serving(a)
        c.nodes.remove(a)
        await c.wait_idle()
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.status.error_code == common_pb2.SUCCESS, "the collection its caller was told is loaded stays"
        assert show.collections[0].in_memory_percentage < 100
        task = await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))
        assert task.tree.trigger.state != qc.TASK_STATE_FAILED, task.tree.trigger.error
        await c.add_node(capacity=room)
        target = await target_of(c, cid)

        async def whole() -> bool:
            lead = (await c.wait_leader()).coord.leadership
            reps = lead.meta.replicas_of(cid) if lead is not None else []
            return bool(reps) and all(not (target[0] - held_by(c, set(x.node_ids))[0]) for x in reps)

        await until_true("the parked unit loaded on the node that joined", whole, timeout=60)
        await c.wait_loaded(cid)


async def test_a_release_meeting_a_failed_load_in_its_rollback_leaves_the_load_its_own_answer(
        etcd: EtcdCluster, root_path: str) -> None:
    """A LoadPartitions with no room fails at once and rolls back on every node (slow nodes: a second); a release
    of the same partition arrives meanwhile and cancels the load. The cancellation does not cut the rollback short:
    the rollback ends and the caller gets the load's own answer, not UNEXPECTED_ERROR ("internal error:
    CancelledError()")."""
    slow = FaultConfig(latency_ms=1000)
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node(capacity=16 * MiB, faults=slow)  # a partition's 10 segments need 52 MB
        cid = await c.create_collection("big", partitions=3, segments=30)
        assert c.client is not None and c.kv is not None
        pid = (await CatalogStore(c.kv).show_partitions(cid))[0].partition_id
        load = asyncio.create_task(c.client.query("LoadPartitions", qc.LoadPartitionsRequest(
            collection_id=cid, partition_ids=[pid])))
        await asyncio.sleep(0.3)  # the load failed at its plan and rolls back (a second on each node)
        rel = await c.client.query("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid,
                                                                                    partition_ids=[pid]))
        got = await load
        # Load admission refuses it at once (RESOURCE_EXHAUSTED) when it sees no room; NO_AVAILABLE_NODE when its
        # plan met none; CANCELLED when the release came first.
        assert got.status.error_code in (common_pb2.NO_AVAILABLE_NODE, common_pb2.CANCELLED,
                                         common_pb2.RESOURCE_EXHAUSTED), got.status
        assert rel.status.error_code == common_pb2.SUCCESS, rel.status
        await c.wait_idle()
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.status.error_code == common_pb2.NOT_FOUND, "nothing of the failed load is left in meta"


async def test_a_watch_retried_through_its_nodes_restart_is_not_done_on_the_new_incarnation(
        etcd: EtcdCluster, root_path: str) -> None:
    """Node 5151 stops answering just before a load that plans DM channel watches on it; the watches retry while
    it is online, and it comes back under its id as soon as its old session lapses. A watch must not succeed on
    the new process and be recorded for the replica the old one served, which the new one is not in: the channel
    would stay watched twice in a replica, for good. Retries two seconds apart, as on a slow
    machine: the one after the old session lapsed usually finds the new process there."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(retry_backoff=0.5, retry_backoff_max=2.0)) as c:
        await c.start_coordinator()
        leader = await c.wait_leader()
        assert c.kv is not None and c.client is not None
        old = QueryNode(c.kv, capacity_bytes=1024 * MiB, ttl=2.0, node_id=5151)
        await old.start()
        c.nodes.append(old)
        await c.add_node()
        cid = await c.create_collection("watched", partitions=1, segments=4, channels=4)
        await stop_serving(old)  # gone; its session lapses after its TTL
        c.nodes.remove(old)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        back = QueryNode(c.kv, capacity_bytes=1024 * MiB, ttl=2.0, node_id=5151)
        await back.start()  # registers as soon as the old session lapsed
        c.nodes.append(back)
        await c.wait_idle()
        lead = leader.coord.leadership
        assert lead is not None
        wrong = [(w.dm_channel, r_, n) for w in lead.meta.dm_channels_of(cid) for r_, n in copies(w).items()
                 if n not in lead.meta.replica_nodes(cid, r_)]
        assert not wrong, f"watches recorded on nodes outside their replica: {wrong}"
        await c.wait_loaded(cid)


async def test_a_late_forget_of_a_node_back_under_its_id_leaves_it_online(etcd: EtcdCluster, root_path: str) -> None:
    """The session watch and a checker pass may forget a lost node at once. A node back under its fixed id joins
    when the first forget is done; the second, which saw the node offline when it began, must not then drop the
    new incarnation from the leader's nodes: the leader would never see it again (no new session event comes),
    and a replica waiting for it would wait for ever (seen in tests/test_node_restarts.py under load)."""
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        leader = await c.wait_leader()
        lead = leader.coord.leadership
        assert lead is not None and c.kv is not None
        lead.nodes.on_node_down = None  # the test forgets the node itself
        old = QueryNode(c.kv, capacity_bytes=64 * MiB, ttl=2.0, node_id=4545)
        await old.start()
        await c.wait_node_online(4545)
        await old.stop()  # revoked: offline at once
        await until_true("the leader saw the node go", lambda: _offline(lead.nodes, 4545), timeout=30)
        new = QueryNode(c.kv, capacity_bytes=64 * MiB, ttl=2.0, node_id=4545)
        await new.start()
        c.nodes.append(new)
        await forget_node(lead.env, 4545, incarnations=Incarnations(lead.kv))  # the first forget: it joins
        assert lead.nodes.is_online(4545)
        await lead.nodes.remove(4545)  # the end of the second forget, which began while the node was offline
        assert lead.nodes.is_online(4545), "the new incarnation is still known to the leader"


async def _offline(nodes: object, node_id: int) -> bool:
    return not nodes.is_online(node_id)  # type: ignore[attr-defined]
