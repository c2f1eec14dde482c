"""The copies of each partition counted by place (``served.state.placed``) are kept with the segment records: a
forget or a node's change recounts only the places, a segment record's change recounts its partition, and a warm
standby counts while it follows (``served.warm``) for the leader that adopts its copy. Real etcd, real writes
through a leader's fenced ``QueryMeta``; every figure is compared with a count on a fresh reload (no kept count)."""

from __future__ import annotations

import asyncio
import random

import pytest

from meta.kv import MetaKV
from proto import data_pb2
from querycoord.catalog.store import CatalogStore
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.index import PLACES_ON_NODE
from querycoord.querymeta.mirror import MetaMirror
from querycoord.served.state import PLACED, ServedView, collection_served
from querycoord.served.warm import count_quiet
from tests.catalog_helpers import followed_catalog
from tests.cluster import QueryCluster, wait_until
from tests.leader import leader_fence
from tests.test_served import FixedNodes
from tests.test_served_snapshot import NODES, random_collection

COLL = data_pb2.LOAD_TYPE_COLLECTION


async def fresh_count(kv: MetaKV, cid: int, online: set[int], targets: object = None) -> object:
    """What a leader that kept no count says: the figures on a fresh reload."""
    fresh = QueryMeta(kv)
    await fresh.reload()
    return collection_served(fresh, cid, online, targets)  # type: ignore[arg-type]


def fresh_places(meta: QueryMeta, node: int, cid: int) -> dict[object, list[int]]:
    """A node's copies of ``cid`` grouped by place, from the records one by one (no kept group)."""
    out: dict[object, list[int]] = {}
    for seg in sorted(meta.segments_on_node(node), key=lambda s: s.segment_id):
        if seg.collection_id == cid:
            out.setdefault(meta.segment_places()[seg.segment_id], []).append(seg.segment_id)
    return out


@pytest.mark.parametrize("seed", range(8))
async def test_kept_counts_equal_a_fresh_count_after_every_kind_of_change(kv: MetaKV, seed: int) -> None:
    rng = random.Random(seed)
    meta = QueryMeta(kv.fenced(await leader_fence(kv)))
    cids = [1, 2]
    for cid in cids:
        await random_collection(meta, rng, cid)
    nodes = FixedNodes(set(NODES))
    view = ServedView(meta, nodes)
    for step in range(14):
        op = rng.randrange(5)
        if op == 0:  # a copy loaded (a new segment, or an existing one's copy moved)
            cid = rng.choice(cids)
            replicas = [r.replica_id for r in meta.get_collection(cid).replicas]  # type: ignore[union-attr]
            sid = cid * 1000 + rng.randrange(14)
            old = meta.get_segment(sid)
            moved = old is None or rng.random() < 0.2  # sometimes into the other partition (a catalog fix)
            pid = rng.choice((10, 11)) if moved or old is None else old.partition_id
            touched = {(cid, pid)} | ({(cid, old.partition_id)} if old is not None else set())
            kept = {(c, p) for c in cids for p in meta.partition_ids(c)
                    if meta.has_partition_view(PLACED, c, p, None)} - touched
            await meta.save_segments([data_pb2.SegmentInfo(
                segment_id=sid, collection_id=cid, partition_id=pid, node_id=rng.choice(NODES),
                replica_id=rng.choice(replicas), mem_size=1, state=data_pb2.SEGMENT_STATE_SEALED)])
            # the partitions the save did not touch keep their counts: nothing recounts them
            assert all(meta.has_partition_view(PLACED, c, p, None) for c, p in kept), (step, kept)
        elif op == 1:  # a lost node's forget: no segment record is rewritten, so no partition is counted again
            before = {(cid, pid) for cid in cids for pid in meta.partition_ids(cid)
                      if meta.has_partition_view(PLACED, cid, pid, None)}
            await meta.remove_node(rng.choice(NODES), keep_segments=True)
            assert all(meta.has_partition_view(PLACED, cid, pid, None) for cid, pid in before)
        elif op == 2:
            await meta.remove_node(rng.choice(NODES))
        elif op == 3:
            nodes.set(*rng.sample(NODES, rng.randint(1, len(NODES))))
        else:
            await meta.remove_segments([rng.choice(cids) * 1000 + rng.randrange(14)])
        fresh = QueryMeta(kv)
        await fresh.reload()
        for cid in cids:
            assert view.collection(cid) == collection_served(fresh, cid, nodes.serving_ids(), None), f"step {step}"
            for node in NODES:  # a lost node's copies grouped by place, kept likewise
                kept = meta.places_on_node(node, cid) if cid in meta.collections_on_node(node) else {}
                assert kept == fresh_places(fresh, node, cid), f"step {step}, node {node}"


async def test_a_standby_counts_while_it_follows_for_the_leader_it_becomes(kv: MetaKV) -> None:
    catalog = CatalogStore(kv)
    desc, _ = await catalog.create_bulk_collection("c", num_partitions=2, num_segments=40, num_channels=1)
    cid, pids = desc.collection_id, [p.partition_id for p in desc.partitions]
    async with followed_catalog(kv) as targets:
        leader = QueryMeta(kv.fenced(await leader_fence(kv)))
        await leader.add_collection(cid, COLL, pids, replicas=[
            data_pb2.ReplicaInfo(replica_id=5, collection_id=cid, node_ids=[1, 2, 3])])
        for pid in pids:
            _chans, binlogs = await catalog.get_recovery_info(cid, pid)
            await leader.save_segments([data_pb2.SegmentInfo(
                segment_id=b.segment_id, collection_id=cid, partition_id=pid, node_id=1 + i % 3, replica_id=5,
                mem_size=1) for i, b in enumerate(binlogs[1:])])  # the first of each partition never loaded
        await leader.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(
            collection_id=cid, dm_channel=desc.dm_channels[0], node_id=3, replica_id=5)])
        mirror = MetaMirror(kv)
        mirror.start()
        await asyncio.wait_for(mirror.catch_up(10), 15)
        seen: dict[int, object] = {}
        assert await count_quiet(kv, mirror, targets, seen) == 0, "a first look only notes the marks"
        assert await count_quiet(kv, mirror, targets, seen) == 2, "unchanged for a round: each partition counted"
        _chans, binlogs = await catalog.get_recovery_info(cid, pids[0])
        await leader.save_segments([data_pb2.SegmentInfo(segment_id=binlogs[0].segment_id, collection_id=cid,
                                                         partition_id=pids[0], node_id=2, replica_id=5, mem_size=1)])
        await asyncio.wait_for(mirror.catch_up(10), 15)
        assert await count_quiet(kv, mirror, targets, seen) == 0, "a segment record changed: not counted at once"
        assert await count_quiet(kv, mirror, targets, seen) == 2
        # The leader dies with node 3; the standby takes its copy over, forgets node 3 and counts.
        taken = await mirror.take()
        assert taken is not None
        meta = QueryMeta(kv.fenced(await leader_fence(kv)))
        meta.adopt(taken[0], taken[1])
        mark = targets.change_mark(cid)
        assert all(meta.has_partition_view(PLACED, cid, pid, mark) for pid in pids), "the standby's counts came along"
        await meta.remove_node(3, keep_segments=True)
        assert all(meta.has_partition_view(PLACED, cid, pid, mark) for pid in pids), "a forget keeps them"
        assert all(meta.has_segment_view(PLACES_ON_NODE, cid, node, None) for node in (1, 2, 3)), \
            "the standby grouped each node's copies by place; the forget kept node 3's"
        assert meta.places_on_node(3, cid) == fresh_places(meta, 3, cid) and meta.places_on_node(3, cid)
        served = ServedView(meta, FixedNodes({1, 2}), targets).collection(cid)
        assert served is not None and served.target_from_catalog and served.unserved_segments > 1
        assert served == await fresh_count(kv, cid, {1, 2}, targets)


async def test_a_standby_coordinator_hands_its_counts_to_its_takeover(etcd: object, root_path: str) -> None:
    """Two coordinators: the standby counts the loaded collection while it follows; when the leader stops, the new
    leader's query meta comes with those counts (nothing changed a segment record meanwhile)."""
    async with QueryCluster(etcd, root_path) as c:  # type: ignore[arg-type]
        first, second, cid = await c.leader_and_standby("warm")
        standby = second.coord

        def counted() -> bool:
            mirror, targets = standby.mirror, standby.targets
            index = mirror.index if mirror is not None else None
            if index is None or targets is None or cid not in index.collections:
                return False
            mark = targets.change_mark(cid)
            return all(index.has_partition_view(PLACED, cid, p.partition_id, mark)
                       for p in index.collections[cid].partitions)

        await wait_until(counted, "the standby counted the collection")
        await first.stop()
        c.coords.remove(first)
        assert await c.wait_leader() is second
        lead = standby.leadership
        assert lead is not None and standby.targets is not None
        mark = standby.targets.change_mark(cid)
        assert all(lead.meta.has_partition_view(PLACED, cid, pid, mark) for pid in lead.meta.partition_ids(cid))
        online = lead.nodes.serving_ids()
        assert lead.served.collection(cid) == await fresh_count(lead.meta.kv, cid, online, standby.targets)
