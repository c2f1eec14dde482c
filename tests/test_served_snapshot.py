"""The served figures of a takeover's gone nodes are counted once for all their forgets (``ServedSnapshot``), on
the premise that a forget of an offline node changes none of them: random states on a real etcd, the figures with
the nodes offline against the figures after ``remove_node(keep_segments=True)`` of each (what the forget writes)."""

from __future__ import annotations

import random
from collections.abc import Set
from typing import Any, cast

import pytest

from meta.kv import MetaKV
from proto import data_pb2
from querycoord.querymeta import QueryMeta
from querycoord.served.snapshot import ServedSnapshot
from querycoord.served.state import CollectionServed, ServedView, collection_served
from tests.leader import leader_fence
from tests.test_served import FixedNodes

COLL = data_pb2.LOAD_TYPE_COLLECTION
NODES = (1, 2, 3, 4, 5, 6)


class Targets:
    """The followed catalog copy's reads the figures use: every segment the test recorded (and one never loaded),
    channels c0 and c1."""

    def __init__(self, meta: QueryMeta):
        self.meta = meta

    def partition_segment_ids(self, cid: int, pid: int) -> Set[int]:
        return set(self.meta.partition_segment_ids(cid, pid)) | {cid * 1000 + 999}

    def dm_channels(self, cid: int) -> tuple[str, ...]:
        return ("c0", "c1")

    def change_mark(self, cid: int) -> tuple[int, int]:
        return (0, 0)


def figures(served: CollectionServed | None) -> tuple[object, ...]:
    """Every figure a reader of the view may use, without the replicas' lists of offline members (a forget takes
    the node out of them: the one thing that changes, and nobody judges by it)."""
    assert served is not None
    replicas = {r: (s.held, s.segments, s.channels_held, s.channels, s.whole, s.percentage, s.nodes)
                for r, s in served.replicas.items()}
    return (served.partitions, replicas, served.segments, served.unserved_segments, served.channels,
            served.unserved_channels, served.percentage, served.health,
            {p: served.partition_percentage(p) for p in served.partitions})


async def random_collection(meta: QueryMeta, rng: random.Random, cid: int) -> None:
    """A collection of 1-3 replicas over random nodes (1-2 each), random copies (some of a replica on a node
    outside it, some segments with no copy) and channel watches."""
    pool = rng.sample(NODES, len(NODES))  # each node in one replica at most
    replicas = {cid * 10 + r: sorted(pool[2 * r:2 * r + rng.randint(1, 2)]) for r in range(rng.randint(1, 3))}
    await meta.add_collection(cid, COLL, [10, 11], replica_number=len(replicas), replicas=[
        data_pb2.ReplicaInfo(replica_id=r, collection_id=cid, node_ids=n) for r, n in replicas.items()])
    segments = []
    for i in range(rng.randint(1, 12)):
        for r, members in replicas.items():
            if rng.random() < 0.8:
                node = rng.choice(members) if rng.random() < 0.9 else rng.choice(NODES)
                segments.append(data_pb2.SegmentInfo(segment_id=cid * 1000 + i, collection_id=cid,
                                                     partition_id=rng.choice((10, 11)), node_id=node, replica_id=r,
                                                     mem_size=1, state=data_pb2.SEGMENT_STATE_SEALED))
    seen: dict[tuple[int, int], data_pb2.SegmentInfo] = {(s.segment_id, s.replica_id): s for s in segments}
    by_segment: dict[int, int] = {}
    for s in seen.values():  # one partition per segment, whatever copy was drawn first
        s.partition_id = by_segment.setdefault(s.segment_id, s.partition_id)
        await meta.save_segments([s])
    for name in ("c0", "c1"):
        for r, members in replicas.items():
            if rng.random() < 0.8:
                await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(
                    collection_id=cid, dm_channel=name, node_id=rng.choice(members), replica_id=r)])


@pytest.mark.parametrize("seed", range(12))
async def test_forgetting_offline_nodes_changes_no_served_figure(kv: MetaKV, seed: int) -> None:
    rng = random.Random(seed)
    meta = QueryMeta(kv.fenced(await leader_fence(kv)))
    cids = list(range(1, 4))
    for cid in cids:
        await random_collection(meta, rng, cid)
    gone = set(rng.sample(NODES, rng.randint(1, 3)))
    online = set(NODES) - gone
    targets = cast(Any, Targets(meta))
    before = {cid: figures(collection_served(meta, cid, online, targets)) for cid in cids}
    nodes = FixedNodes(set(online))
    once = ServedSnapshot(ServedView(meta, nodes, targets))
    held = {cid: once.collection(cid) for cid in cids}
    from_meta = {cid: collection_served(meta, cid, online) for cid in cids}
    for node_id in sorted(gone):
        await meta.remove_node(node_id, keep_segments=True)
        assert {cid: once.collection(cid) for cid in cids} == held, "the snapshot answers as first computed"
        assert {cid: figures(collection_served(meta, cid, online, targets)) for cid in cids} == before
        for cid in cids:  # without a catalog copy, meta's records stand in: the snapshot never says more
            fresh, first = collection_served(meta, cid, online), from_meta[cid]
            assert fresh is not None and first is not None
            assert first.percentage <= fresh.percentage
            assert all(not r.whole or fresh.replicas[rid].whole for rid, r in first.replicas.items())
    assert not meta.bound_node_ids() & gone


async def test_a_snapshot_computes_each_collection_once(kv: MetaKV) -> None:
    meta = QueryMeta(kv.fenced(await leader_fence(kv)))
    await random_collection(meta, random.Random(1), 1)
    view = ServedView(meta, FixedNodes({1, 2, 3}))
    once = ServedSnapshot(view)
    first = once.collection(1)
    await meta.remove_node(4, keep_segments=True)
    for _ in range(3):
        assert once.collection(1) is first
    assert view.computed == 1
    assert once.collection(2) is None  # not loaded
