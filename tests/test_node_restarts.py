"""Node loss, node restarts and whole-cluster restarts: the leader shows only what online nodes hold,
and repairs whatever can be placed without waiting on what cannot.

Each test gives its triggers a 600 s deadline and waits at most a minute: work that waited for that
deadline fails the test. What is asserted is what the in-process nodes themselves hold (``tests.truth``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from types import SimpleNamespace

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.cluster.incarnations import Incarnations
from querycoord.cluster.nodes import Node, NodeManager
from querycoord.leader.watchers import forget_node, record_joined
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.task.history import TaskHistory
from tests.cluster import MiB, QueryCluster, fast_scheduler
from tests.leader import leader_fence
from tests.truth import failed_triggers, false_full, held_by, target_of, until_true

LONG = fast_scheduler(trigger_timeout=600.0)


async def load(c: QueryCluster, cid: int, replicas: int) -> None:
    assert c.client is not None
    r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=replicas))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    await c.wait_loaded(cid)


async def whole(c: QueryCluster, cid: int) -> bool:
    """Every replica's online nodes hold every target segment and channel, by the nodes' own state."""
    lead = (await c.wait_leader()).coord.leadership
    if lead is None:
        return False
    target = await target_of(c, cid)
    for r in lead.meta.replicas_of(cid):
        segs, chans = held_by(c, set(r.node_ids))
        if target[0] - segs or target[1] - chans:
            return False
    return bool(lead.meta.replicas_of(cid))


class Sampler:
    """Samples ``false_full`` of some collections until stopped; keeps what it found."""

    def __init__(self, c: QueryCluster, cids: list[int]):
        self.c, self.cids = c, cids
        self.found: list[str] = []
        self.samples = 0
        self._targets: dict[int, tuple[set[int], set[str]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sampler:
        """One sample before returning and one in ``__aexit__``: a block that ends before the background loop
        first runs still has samples at both its ends (the loop alone left ``samples`` at 0 once)."""
        self._targets = {cid: await target_of(self.c, cid) for cid in self.cids}
        await self.sample()

        async def run() -> None:
            while True:
                await self.sample()
                await asyncio.sleep(0.05)

        self._task = asyncio.create_task(run())
        return self

    async def sample(self) -> None:
        for cid in self.cids:
            try:
                bad = await false_full(self.c, cid, self._targets[cid])
            except Exception:  # a leader change mid-sample: not a verdict
                bad = None
            self.samples += 1
            if bad:
                self.found.append(bad)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.sample()


async def test_a_whole_cluster_restarted_with_new_nodes_regains_every_replica(etcd: EtcdCluster,
                                                                             root_path: str) -> None:
    """A two-replica and a one-replica collection, every process stopped, three
    fresh nodes: each replica gets a node, everything is loaded again, nothing is shown whole before it is, and
    no trigger fails."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(4):
            await c.add_node()
        two = await c.create_collection("two", partitions=2, segments=40)
        one = await c.create_collection("one", partitions=1, segments=30)
        await load(c, two, 2)
        await load(c, one, 1)
        await c.coords[0].stop()
        for n in list(c.nodes):
            await n.stop()
        c.nodes.clear()
        for _ in range(3):
            await c.add_node()
        await c.start_coordinator()
        async with Sampler(c, [two, one]) as sampler:
            await until_true("both collections whole again on the new nodes",
                             lambda: _both(c, two, one), timeout=60)
        assert not sampler.found, sampler.found[:3]
        assert sampler.samples > 0
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        assert all(r.node_ids for r in lead.meta.replicas_of(two)), "every replica regained a node"
        assert not await failed_triggers(c)


async def _both(c: QueryCluster, a: int, b: int) -> bool:
    return await whole(c, a) and await whole(c, b)


async def _fixed_node(c: QueryCluster, node_id: int, *, capacity_bytes: int = 1024 * MiB) -> QueryNode:
    """A query node under a fixed id (as a restarted process keeps it), started and owned by the cluster."""
    assert c.kv is not None
    node = QueryNode(c.kv, capacity_bytes=capacity_bytes, ttl=2.0, node_id=node_id)
    await node.start()
    c.nodes.append(node)
    return node


async def test_a_node_restarted_under_its_id_is_used_at_once(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        assert c.kv is not None
        fixed = await _fixed_node(c, 4242)
        await c.add_node()
        cid = await c.create_collection("back", partitions=1, segments=30)
        await load(c, cid, 2)  # two nodes, two replicas: node 4242 alone holds one of them
        assert fixed.state.segments
        await fixed.stop()
        c.nodes.remove(fixed)
        again = await _fixed_node(c, 4242)
        await until_true("the restarted node serves its replica again", lambda: whole(c, cid), timeout=60)
        assert again.state.segments
        assert not await failed_triggers(c)


async def test_a_late_forget_of_a_node_back_under_its_id_leaves_it_online(etcd: EtcdCluster, root_path: str) -> None:
    """Two forgets of one lost node may run at once (the node-down hook and the checker's pass); the later one ended
    after the node was back under its fixed id and took the new incarnation out of the online nodes for good: its
    replica stayed parked "no online node" (seen under load in the test above)."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert c.kv is not None and lead is not None
        fixed = QueryNode(c.kv, capacity_bytes=64 * MiB, ttl=2.0, node_id=4545)
        await fixed.start()
        await c.wait_node_online(4545)
        await fixed.stop()

        async def forgotten() -> bool:
            return lead.nodes.get(4545) is None

        await until_true("the leader forgot the stopped node", forgotten)
        await _fixed_node(c, 4545, capacity_bytes=64 * MiB)
        await c.wait_node_online(4545)
        await lead.nodes.remove(4545)  # the second forget of the old incarnation, ending late
        assert lead.nodes.is_online(4545), "the node back under its id stays online"


async def test_a_node_restarted_while_no_leader_watched_is_not_taken_for_its_old_self(
        etcd: EtcdCluster, root_path: str) -> None:
    """Its session is a new incarnation: the new leader forgets what the old process held before anything
    counts it, instead of showing 100 % until the checker's first pass hears from the node (slow here)."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        assert c.kv is not None
        node = await _fixed_node(c, 4343)
        cid = await c.create_collection("unseen", partitions=1, segments=20)
        await load(c, cid, 1)
        await c.coords[0].stop()
        await node.stop()
        c.nodes.remove(node)
        slow = QueryNode(c.kv, capacity_bytes=1024 * MiB, ttl=2.0, node_id=4343,
                         faults=FaultConfig(latency_ms=1500))  # every call, GetDataDistribution too
        await slow.start()
        c.nodes.append(slow)
        coord = await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None and coord.coord.is_leader
        assert not lead.meta.segments_on_node(4343), "the old process's copies were forgotten at takeover"
        assert c.client is not None
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.collections[0].in_memory_percentage < 100
        await until_true("the restarted node loaded its segments again", lambda: whole(c, cid), timeout=60)


async def test_one_collection_that_cannot_be_placed_never_holds_back_another(etcd: EtcdCluster,
                                                                            root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        big_node = await c.add_node(capacity=1024 * MiB)
        big = await c.create_collection("big", partitions=1, segments=20)  # ~5 MB each: 100 MB
        small = await c.create_collection("small", partitions=1, segments=2)
        await load(c, big, 1)
        await load(c, small, 1)
        room = await c.add_node(capacity=40 * MiB)  # room for "small", not for "big"
        await c.wait_node_online(room.node_id)
        await big_node.stop()
        c.nodes.remove(big_node)
        await until_true("the collection that fits is whole again", lambda: whole(c, small), timeout=60)
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        parked = lead.env.parked.get(big, lead.meta.replica_ids(big)[0])
        assert parked is not None and parked.code == "no_room", parked
        assert not await failed_triggers(c)


async def test_a_partition_release_never_waits_behind_a_handoff_that_needs_its_room(
        etcd: EtcdCluster, root_path: str) -> None:
    """A segment handed off to a full node does not wait for room while holding the collection: the release that
    would free that room would queue behind it and time out. The handoff parks what it cannot place, the release
    runs at once, and the freed room takes the new segment."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        node = await c.add_node(capacity=70 * MiB)  # 12 segments of ~5 MB: about 90 % full
        cid = await c.create_collection("full", partitions=2, segments=12)
        assert c.kv is not None and c.client is not None
        cat = CatalogStore(c.kv)
        pids = [p.partition_id for p in await cat.show_partitions(cid)]
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        [new] = await cat.add_segments([data_pb2.SegmentBinlogs(
            partition_id=pids[0], num_rows=100, mem_size=20 * MiB, binlog_paths=["x"])], collection_id=cid)
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        await until_true("the handed-off segment is parked for want of room",
                         lambda: _parked(lead, cid), timeout=60)
        began = time.monotonic()
        r = await c.client.query("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid,
                                                                                  partition_ids=[pids[1]]))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        assert time.monotonic() - began < 30, "the release did not wait for a deadline"
        await until_true("the new segment loaded in the room the release freed",
                         lambda: _holds(node, new), timeout=60)


async def _parked(lead: object, cid: int) -> bool:
    env = lead.env  # type: ignore[attr-defined]
    return any(u.code == "no_room" for u in env.parked.of(cid))


async def _holds(node: QueryNode, sid: int) -> bool:
    return sid in node.state.segments


async def test_a_resumed_load_waits_for_nodes_to_register(etcd: EtcdCluster, root_path: str) -> None:
    """A load cut by a coordinator stop, resumed by a coordinator that leads before any node is back: it waits for
    nodes instead of failing with NO_AVAILABLE_NODE, and finishes."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        assert c.client is not None
        for _ in range(2):
            await c.add_node(faults=FaultConfig(latency_ms=300))
        cid = await c.create_collection("resumed", partitions=4, segments=200)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        task_id = r.task_id
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        await until_true("the load is under way", lambda: _some_loaded(c), timeout=30, every=0.02)
        await c.coords[0].stop()
        for n in list(c.nodes):
            await n.stop()
        c.nodes.clear()
        await c.start_coordinator()
        await c.wait_leader()
        await asyncio.sleep(1.0)  # the new leader resumed the tree with no node online
        for _ in range(2):
            await c.add_node()
        await c.wait_loaded(cid, timeout=60)
        assert c.kv is not None
        record = await TaskHistory(c.kv).find(task_id)
        assert record is not None and record.trigger.state != qc.TASK_STATE_FAILED, record


async def _some_loaded(c: QueryCluster) -> bool:
    return any(n.state.segments for n in c.nodes)


async def test_a_node_whose_session_outlived_it_counts_nothing_at_takeover(etcd: EtcdCluster,
                                                                          root_path: str) -> None:
    """etcd renews every lease it recovers when it restarts, so a node that died with the cluster keeps its
    session for a TTL, and a leader elected meanwhile must not show that node's replica at 100 %.
    Here a SIGKILLed node's session outlives it the same way (a long TTL): the new leader counts nothing of it,
    and counts at once what the node that answers holds."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        dead, _ = await c.start_node_process("--ttl", "30")
        alive = await c.add_node()
        cid = await c.create_collection("outlived", partitions=1, segments=20)
        await load(c, cid, 2)  # one replica on each node
        await c.coords[0].stop()
        await dead.kill()  # SIGKILL: its session lives on for 30 s
        await c.start_coordinator()
        await c.wait_leader()
        assert c.client is not None
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        reps = await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
        assert show.status.error_code == reps.status.error_code == common_pb2.SUCCESS
        by_node = {n: r.in_memory_percentage for r in reps.replicas for n in r.node_ids}
        assert by_node == {dead.node_id: 0, alive.node_id: 100}, reps
        assert show.collections[0].in_memory_percentage < 100, show


async def test_a_node_silent_at_takeover_counts_once_it_answers_the_checker(etcd: EtcdCluster,
                                                                           root_path: str) -> None:
    """A node that does not answer the new leader in time (SIGSTOPped here) is not counted, and is counted again
    once it answers the checker: unheard is a state it leaves, not a verdict."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        frozen, _ = await c.start_node_process("--ttl", "30")
        cid = await c.create_collection("frozen", partitions=1, segments=20)
        await load(c, cid, 1)
        await c.coords[0].stop()
        frozen.signal(signal.SIGSTOP)
        try:
            await c.start_coordinator()
            await c.wait_leader()
            assert c.client is not None
            show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
            assert show.collections[0].in_memory_percentage < 100, show
        finally:
            frozen.signal(signal.SIGCONT)
        await c.wait_loaded(cid, timeout=60)
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None and not lead.nodes.unheard
        assert lead.meta.segments_on_node(frozen.node_id), "its copies were kept, not loaded elsewhere"


async def test_a_node_back_under_its_id_while_its_old_self_is_forgotten_stays_known(kv: MetaKV) -> None:
    """A new leader forgets a node no session names (its records are an earlier process's) while that node
    registers again under its fixed id. The forget leaves the node that has just joined in the node manager, with
    its incarnation record: otherwise it would be a live node the leader never used again.
    Here the node registers while the forget is removing its old copies."""
    meta = QueryMeta(kv.fenced(await leader_fence(kv)))
    replica = data_pb2.ReplicaInfo(replica_id=7, collection_id=1, node_ids=[4545])
    await meta.add_collection(1, data_pb2.LOAD_TYPE_COLLECTION, [10], replicas=[replica], replica_number=1)
    await meta.save_segments([data_pb2.SegmentInfo(segment_id=100, collection_id=1, partition_id=10, node_id=4545,
                                                   replica_id=7, mem_size=100)])
    incarnations = Incarnations(meta.kv)
    env = SimpleNamespace(meta=meta)

    async def joined(node: Node) -> None:  # as the leader's node manager is told (``coordinator``)
        await record_joined(node, env=env, incarnations=incarnations,  # type: ignore[arg-type]
                            checker=SimpleNamespace(kick=lambda: None))  # type: ignore[arg-type]

    nodes = NodeManager(kv, on_node_up=joined)
    env.nodes = nodes
    await nodes.start()
    node = QueryNode(kv, capacity_bytes=1024 * MiB, ttl=2.0, node_id=4545)
    remove_node = meta.remove_node

    async def remove_while_it_comes_back(node_id: int, **kw: bool) -> int:
        if not nodes.is_online(node_id):
            await node.start()
            await until_true("the node is online again", lambda: _online(nodes, node_id), timeout=30)
        return await remove_node(node_id, **kw)

    meta.remove_node = remove_while_it_comes_back  # type: ignore[method-assign]
    try:
        await forget_node(env, 4545, incarnations=incarnations)  # type: ignore[arg-type]
        await until_true("the node that came back counts", lambda: _serving(nodes, 4545), timeout=30)
        assert not meta.segments_on_node(4545), "the old process's copies are forgotten"
        assert nodes.is_online(4545), "the process that came back is still known"
        created = nodes.nodes[4545].created
        assert (await incarnations.load()).get(4545) == created, "and so is its incarnation"
    finally:
        await node.stop()
        await nodes.stop()


async def _online(nodes: NodeManager, node_id: int) -> bool:
    return nodes.is_online(node_id)


async def test_a_node_joining_under_an_id_meta_still_places_copies_on_counts_none_of_them(kv: MetaKV) -> None:
    """A node back under its fixed id while a new leader takes over may join before the takeover's forget
    reaches it; its previous process's copies must not stay in query meta and count as served (nor cost a repair
    a txn per segment). A session that appears during the leadership is a
    new process: what meta places on its id is forgotten before the node counts at all."""
    meta = QueryMeta(kv.fenced(await leader_fence(kv)))
    replica = data_pb2.ReplicaInfo(replica_id=7, collection_id=1, node_ids=[4747])
    await meta.add_collection(1, data_pb2.LOAD_TYPE_COLLECTION, [10], replicas=[replica], replica_number=1)
    await meta.save_segments([data_pb2.SegmentInfo(segment_id=100 + i, collection_id=1, partition_id=10,
                                                   node_id=4747, replica_id=7, mem_size=100) for i in range(5)])
    incarnations = Incarnations(meta.kv)
    counted_while_stale: list[bool] = []
    env = SimpleNamespace(meta=meta)
    nodes = NodeManager(kv, on_node_up=lambda node: record_joined(
        node, env=env, incarnations=incarnations, checker=SimpleNamespace(kick=lambda: None)))  # type: ignore[arg-type]
    env.nodes = nodes
    remove_node = meta.remove_node

    async def remove_and_look(node_id: int) -> int:
        counted_while_stale.append(node_id in nodes.serving_ids())
        return await remove_node(node_id)

    meta.remove_node = remove_and_look  # type: ignore[method-assign]
    await nodes.start()  # no session yet: nothing is inherited
    node = QueryNode(kv, capacity_bytes=1024 * MiB, ttl=2.0, node_id=4747)
    await node.start()
    try:
        await until_true("the node counts", lambda: _serving(nodes, 4747), timeout=30)
        assert counted_while_stale == [False], "forgotten before it counted"
        assert not meta.segments_on_node(4747) and 4747 not in meta.known_node_ids()
        assert (await incarnations.load()).get(4747) == nodes.nodes[4747].created
    finally:
        await node.stop()
        await nodes.stop()


async def _serving(nodes: NodeManager, node_id: int) -> bool:
    return node_id in nodes.serving_ids()


async def test_a_node_lost_beside_one_whose_session_outlived_it_is_repaired_without_a_failed_trigger(
        etcd: EtcdCluster, root_path: str) -> None:
    """The restart drill's failure: after a takeover, one node of a replica is silent (its session outlived its
    process) and the other is then lost. The lost node's repair must not place its work on the silent node
    (that work failed once the silent node's session lapsed, and with no other node in the replica the
    repair FAILED): it parks until a node joins, and then the collection is whole, as the nodes report, with
    no trigger failed."""
    async with QueryCluster(etcd, root_path, scheduler=LONG) as c:
        await c.start_coordinator()
        await c.wait_leader()
        silent, _ = await c.start_node_process("--ttl", "15")
        lost, _ = await c.start_node_process()
        cid = await c.create_collection("outlived_and_lost", partitions=1, segments=24)
        await load(c, cid, 1)  # one replica on both nodes
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        assert set(lead.meta.replica_node_ids(cid)) == {silent.node_id, lost.node_id}
        assert lead.meta.segments_on_node(lost.node_id), "the lost node held copies to repair"
        await c.coords[0].stop()
        await silent.kill()  # SIGKILL: its session lives on for 15 s
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None and silent.node_id in lead.nodes.unheard
        await lost.kill()  # its session lapses at once (2 s): its repair has only the silent node in its replica

        async def lost_repair_ended() -> bool:
            """The lost node is forgotten and its work parked, or its repair ran (and failed): no node has joined
            yet."""
            assert c.kv is not None and lead is not None
            if lost.node_id in lead.meta.replica_node_ids(cid) or \
                    any(t.collection_id == cid for t in lead.scheduler.triggers.values()):
                return False
            if lead.env.parked.of(cid):
                return True
            page = await TaskHistory(c.kv).page(after=0, newest_first=False, want=1000)
            return any(t.trigger.kind == qc.TASK_KIND_REPAIR for t in page)

        await until_true("the lost node's repair ended", lost_repair_ended, timeout=60)
        assert await failed_triggers(c) == []
        await c.add_node()
        await until_true("the collection is whole on the nodes", lambda: whole(c, cid), timeout=90)
        assert await failed_triggers(c) == []
