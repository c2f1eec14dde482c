"""A lost node's segment records are moved by the repair, not deleted first: on a real cluster, through a leader
change between the forget and the repair.

What must hold: from the moment the node is lost its copies count for nothing (ShowCollections and the persisted
percentage are below 100, its replica no longer names it), though its records still name it until the repair
loads each copy elsewhere; the repair rewrites each such record once (its key is never deleted, so etcd's create
revision of it stays); and a new leader that takes over before any repair finishes it, the nodes holding
everything and the collection shown at 100 %.
"""

from __future__ import annotations

import asyncio

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.cluster.incarnations import incarnation_key
from querycoord.leader.coordinator import Leadership
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.keys import SEGMENT_PREFIX
from querycoord.serving.coordinator_metrics import coordinator_families
from tests.cluster import QueryCluster, fast_scheduler, until, wait_until
from tests.truth import held_by, target_of


async def pause_checker(lead: Leadership) -> None:
    """Stop the leader's checker loop (and what kicks it) and the repair a lost node's forget queues: nothing
    repairs until another leader takes over."""
    lead.checker.repair_at_forget = False
    loops = [t for t in lead.tasks if t.get_name() in ("checker", "checker-kicks")]
    for t in loops:
        t.cancel()
    await asyncio.gather(*loops, return_exceptions=True)


async def shown_percentage(c: QueryCluster, cid: int) -> int:
    assert c.client is not None
    show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    assert show.status.error_code == 0, show.status
    return show.collections[0].in_memory_percentage


async def create_revisions(c: QueryCluster, cid: int) -> dict[str, int]:
    assert c.kv is not None
    snap = await c.kv.load_prefix(f"{SEGMENT_PREFIX}{cid}/")
    return {kv.key: kv.create_revision for kv in snap.kvs}


async def whole_on_survivors(c: QueryCluster, cid: int, what: str) -> None:
    """Until the running nodes hold the whole target (as they report it) and the collection is shown at 100 %."""
    target = await target_of(c, cid)
    alive = {n.node_id for n in c.nodes}

    async def whole() -> bool:
        segs, chans = held_by(c, alive)
        return target[0] <= segs and target[1] <= chans and await shown_percentage(c, cid) == 100

    await until(what, whole)


async def loaded(c: QueryCluster, name: str, *, nodes: int, partitions: int, segments: int) -> int:
    """A leader, ``nodes`` query nodes and collection ``name`` loaded on them, nothing left to do; its id."""
    await c.start_coordinator()
    await c.wait_leader()
    for _ in range(nodes):
        await c.add_node()
    cid = await c.create_collection(name, partitions=partitions, segments=segments, channels=2)
    await c.load_collection(cid)
    await c.wait_idle()
    return cid


async def test_a_lost_nodes_records_count_for_nothing_and_a_new_leader_moves_them(etcd: EtcdCluster,
                                                                                root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 0.3
        cid = await loaded(c, "moved", nodes=3, partitions=2, segments=30)
        await c.start_coordinator()  # the standby that takes over
        lead = c.coords[0].coord.leadership
        assert lead is not None
        await pause_checker(lead)  # the forget happens; the repair never does under this leader
        victim = max(c.nodes, key=lambda n: len(n.state.segments))
        on_victim = set(victim.state.segments)
        assert on_victim
        revisions = await create_revisions(c, cid)

        await victim.crash(revoke=True)  # dead at once: its session is revoked
        c.nodes.remove(victim)
        await wait_until(lambda: victim.node_id not in lead.meta.bound_node_ids(), "the leader forgot the node")

        # Lost: it counts for nothing, although the records that the repair will move still name it.
        assert await shown_percentage(c, cid) < 100
        assert c.kv is not None
        persisted = QueryMeta(c.kv)  # what a standby or the next leader reads
        await persisted.reload()
        assert {s.segment_id for s in persisted.segments_on_node(victim.node_id)} == on_victim
        assert all(victim.node_id not in persisted.replica_nodes(cid, r) for r in persisted.replica_ids(cid))
        info = persisted.get_collection(cid)
        assert info is not None and info.in_memory_percentage < 100

        # The leader dies between the forget and the repair: the new one repairs.
        await c.coords[0].stop()
        new = await c.wait_leader()
        assert new is c.coords[1]
        await whole_on_survivors(c, cid, "the new leader repaired the collection")
        await c.wait_idle()
        lead1 = new.coord.leadership
        assert lead1 is not None
        assert not lead1.meta.segments_on_node(victim.node_id) and victim.node_id not in lead1.meta.known_node_ids()
        # Every record names the node that holds the copy, as that node reports it.
        for node_id, dist in c.distribution().items():  # GetDataDistribution as each node answers it
            held = {s.segment_id for s in dist.segments if s.collection_id == cid}
            assert held == {s.segment_id for s in lead1.meta.segments_on_node(node_id)
                            if s.collection_id == cid}
        # Each moved record was rewritten, never deleted and put again.
        after = await create_revisions(c, cid)
        assert after == revisions


async def test_a_lost_node_shows_nothing_while_its_records_wait_for_the_repair(etcd: EtcdCluster,
                                                                              root_path: str) -> None:
    """A cordoned node stays listed after it is lost (its lifecycle is kept), but it holds nothing: ShowNodes and
    the per-node gauges must not count the records that still name it until the repair moves them."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        await loaded(c, "shown", nodes=2, partitions=1, segments=12)
        lead = c.coords[0].coord.leadership
        assert lead is not None and c.client is not None
        victim = max(c.nodes, key=lambda n: len(n.state.segments))
        assert victim.state.segments
        cordoned = await c.client.query("CordonNode", qc.NodeLifecycleRequest(node_id=victim.node_id))
        assert cordoned.status.error_code == 0, cordoned.status
        await pause_checker(lead)  # no repair moves the records under this leader

        await victim.crash(revoke=True)
        c.nodes.remove(victim)
        await wait_until(lambda: victim.node_id not in lead.meta.bound_node_ids(), "the leader forgot the node")
        assert lead.meta.segment_count_on_node(victim.node_id) > 0  # the records still name it

        nodes = await c.client.query("ShowNodes", qc.ShowNodesRequest())
        lost = next(n for n in nodes.nodes if n.node_id == victim.node_id)
        assert (lost.state, lost.segment_count, lost.memory_used, lost.dm_channel_count) == ("offline", 0, 0, 0)
        families = await coordinator_families(c.coords[0].coord)
        labelled = {s.labels.get("node_id") for f in families
                    if f.name in ("querycoord_node_segments", "querycoord_node_memory_used_bytes")
                    for s in f.samples}
        assert str(victim.node_id) not in labelled
        assert {str(n.node_id) for n in c.nodes} <= labelled


async def test_a_lost_nodes_incarnation_record_goes_once_the_repair_moved_its_records(etcd: EtcdCluster,
                                                                                    root_path: str) -> None:
    """The record of a lost node's incarnation is kept while segment records name it, then dropped: node ids that
    never come back (a fresh id per start) leave no key behind, under this leader or the next one."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 0.3
        cid = await loaded(c, "pruned", nodes=3, partitions=1, segments=24)
        assert c.kv is not None
        victim = max(c.nodes, key=lambda n: len(n.state.segments))
        key = incarnation_key(victim.node_id)
        assert await c.kv.get(key) is not None

        await victim.crash(revoke=True)
        c.nodes.remove(victim)
        await whole_on_survivors(c, cid, "the lost node's copies repaired")
        await c.wait_idle()
        await until("its incarnation record dropped", lambda: _absent(c, key))

        # A record a leader left behind for a node nothing names any more goes at the next takeover.
        stale = incarnation_key(4242)
        await c.kv.save(stale, b"7")
        await c.start_coordinator()
        await c.coords[0].stop()
        await c.wait_leader()
        await until("the stale record dropped at takeover", lambda: _absent(c, stale))
        for node in c.nodes:  # the live nodes keep theirs
            assert await c.kv.get(incarnation_key(node.node_id)) is not None, node.node_id


async def _absent(c: QueryCluster, key: str) -> bool:
    assert c.kv is not None
    return await c.kv.get(key) is None
