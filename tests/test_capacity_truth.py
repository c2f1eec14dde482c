"""What capacity pressure must not do, each against a real cluster: a release waiting on a lost node never
shows its collection whole; a load answered SUCCESS is not rolled back whole when one replica's work has
nowhere left to go; two forgets of one node keep its new incarnation in the leader's view.

What is asserted is what the in-process nodes themselves hold (``tests.truth``), never timing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.cluster.incarnations import Incarnations
from querycoord.leader.watchers import forget_node
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta.copies import copies
from querycoord.tooling.drill.sampler import Sampler
from tests.cluster import MiB, QueryCluster, fast_scheduler, wait_until
from tests.truth import InProcessSources, failed_triggers, held_by, target_of, until_true

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


def _gate(node: QueryNode, holds: Callable[[str, Any], bool]) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the node's mutating calls that ``holds`` picks until the second event is set; the first is set when
    one is held. The calls are the node's own (its state changes only once let through)."""
    reached, go = asyncio.Event(), asyncio.Event()
    plain = node.mutate

    async def gated(kind: str, request: Any, *args: Any) -> Any:
        if holds(kind, request) and not go.is_set():
            reached.set()
            await go.wait()
        return await plain(kind, request, *args)

    node.mutate = gated  # type: ignore[method-assign]
    return reached, go


async def test_a_release_meeting_a_failed_load_in_its_rollback_leaves_the_load_its_own_answer(
        etcd: EtcdCluster, root_path: str) -> None:
    """A LoadPartitions of p1 passes admission (nodes a and b, large, are online) and waits behind a load of p0 of
    the same collection (held on node a until p1 is queued). Then a and b leave (their sessions revoked): p1's
    plan finds only node c, too small, and fails (NO_AVAILABLE_NODE), which admission could not foresee. Its
    rollback releases p1 on c; that call is held until a release of p1 reached the leader and cancelled the load
    mid-rollback. The cancellation does not cut the rollback short: the rollback ends, the caller gets the load's
    own answer (not UNEXPECTED_ERROR, "internal error: CancelledError()"), the release succeeds, and nothing of
    p1 is left in meta or on the node."""
    async with QueryCluster(etcd, root_path) as c:
        leader = await c.start_coordinator()
        await c.wait_leader()
        a, b = await c.add_node(), await c.add_node()
        small = await c.add_node(capacity=16 * MiB)  # a partition's 10 segments need 52 MB
        cid = await c.create_collection("big", partitions=3, segments=30)
        assert c.client is not None and c.kv is not None
        p0, p1 = [p.partition_id for p in await CatalogStore(c.kv).show_partitions(cid)][:2]
        lead = leader.coord.leadership
        assert lead is not None
        queue = lead.scheduler.queue
        p1_queued = _gate(a, lambda kind, req: getattr(req, "collection_id", 0) == cid)[1]
        rollback, release_met = _gate(small, lambda kind, req: kind == "ReleasePartitions"
                                      and p1 in req.partition_ids)
        first = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid,
                                                                                partition_ids=[p0]))
        assert first.status.error_code == common_pb2.SUCCESS, first.status
        load = asyncio.create_task(c.client.query("LoadPartitions", qc.LoadPartitionsRequest(
            collection_id=cid, partition_ids=[p1])))

        def p1_load() -> int:
            return next((t.id for t in queue.triggers.values() if t.KIND == qc.TASK_KIND_LOAD_PARTITION
                         and list(t.request.partition_ids) == [p1]), 0)

        await wait_until(lambda: p1_load() != 0 or load.done(), "the load of p1 admitted and queued")
        assert not load.done(), load.result().status
        p1_id = p1_load()
        assert first.task_id in queue.triggers and p1_id not in queue.started, "p1 waits behind the load of p0"
        for n in (a, b):
            await n.crash(revoke=True)
            c.nodes.remove(n)
        p1_queued.set()
        await asyncio.wait_for(rollback.wait(), 60)
        assert p1_id in queue.failing, "p1's plan failed and it rolls back"
        release = asyncio.create_task(c.client.query("ReleasePartitions", qc.ReleasePartitionsRequest(
            collection_id=cid, partition_ids=[p1])))
        await wait_until(lambda: p1_id in queue.cancel_reason or release.done(), "the release met the rollback")
        assert p1_id in queue.failing, "the release cancelled the load while it rolled back"
        release_met.set()
        got = await load
        assert got.status.error_code in (common_pb2.NO_AVAILABLE_NODE, common_pb2.CANCELLED), got.status
        rel = await release
        assert rel.status.error_code == common_pb2.SUCCESS, rel.status
        await c.wait_idle()
        show = await c.client.query("ShowPartitions", qc.ShowPartitionsRequest(collection_id=cid))
        assert p1 not in {p.partition_id for p in show.partitions}, "nothing of the failed load is left in meta"
        assert not lead.meta.has_partition(cid, p1)
        held = small.state.distribution()
        assert not [s.segment_id for s in held.segments if s.partition_id == p1], held
        assert not [ch.channel_name for ch in held.channels if p1 in ch.partition_ids], held


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


async def test_a_repair_whose_node_is_lost_midway_parks_its_unit_instead_of_failing(etcd: EtcdCluster,
                                                                                    root_path: str) -> None:
    """One replica on nodes a and b. Node a is lost: its repair loads a's copies on b, and b is lost while that
    load waits on it. With no node left in the replica and no spare, the repair's unit is parked (DESIGN rule
    9), not the repair FAILED (it did, "could not be rescheduled: replica ... has no online node"); a node that
    joins then gets the whole collection, as it reports, and no trigger failed."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(trigger_timeout=600.0)) as c:
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        a, b = await c.add_node(), await c.add_node()
        cid = await c.create_collection("repaired", partitions=1, segments=20)
        await c.load_collection(cid)
        assert a.state.segments and b.state.segments
        reached, go = _gate(b, lambda kind, req: kind == "LoadSegments")
        await a.crash(revoke=True)  # etcd learns at once: a's repair loads its copies on b
        await asyncio.wait_for(reached.wait(), 60)
        await b.crash(revoke=True)  # lost while the repair's load waits on it
        go.set()
        c.nodes[:] = []

        async def repairs_ended() -> bool:
            return not ({a.node_id, b.node_id} & set(lead.meta.replica_node_ids(cid))) and not any(
                t.collection_id == cid for t in lead.scheduler.triggers.values())

        await until_true("both lost nodes forgotten, no trigger left", repairs_ended, timeout=60)
        assert lead.env.parked.of(cid), "the lost nodes' work waits for a node, parked"
        assert await failed_triggers(c) == []
        await c.add_node()
        target = await target_of(c, cid)

        async def whole() -> bool:
            reps = lead.meta.replicas_of(cid)
            return bool(reps) and all(not (target[0] - held_by(c, set(x.node_ids))[0]) for x in reps)

        await until_true("the collection loaded on the node that joined", whole, timeout=60)
        assert await failed_triggers(c) == []

