"""What online nodes serve (``querycoord.served``): percentages and health derived from query meta, the online
nodes and the catalog's target, on a real etcd; never from what a plan intended."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from meta.kv import MetaKV
from proto import data_pb2
from querycoord.catalog.store import CatalogStore
from querycoord.querymeta import QueryMeta
from querycoord.served.persist import persist_lowered
from querycoord.served.state import GREEN, RED, YELLOW, ServedView, collection_served
from tests.catalog_helpers import followed_catalog
from tests.leader import leader_fence

COLL = data_pb2.LOAD_TYPE_COLLECTION
IN_MEMORY = data_pb2.PARTITION_STATE_IN_MEMORY


@dataclass
class FixedNodes:
    """The node manager's two members the view reads, set by the test (the online ids are the fact under test)."""

    online: set[int] = field(default_factory=set)
    version: int = 0

    def serving_ids(self) -> set[int]:
        return set(self.online)

    def set(self, *ids: int) -> None:
        self.online = set(ids)
        self.version += 1


def seg(sid: int, pid: int, node: int, replica: int) -> data_pb2.SegmentInfo:
    return data_pb2.SegmentInfo(segment_id=sid, collection_id=1, partition_id=pid, node_id=node, replica_id=replica,
                                mem_size=100, state=data_pb2.SEGMENT_STATE_SEALED)


async def two_replica_meta(kv: MetaKV) -> QueryMeta:
    """Collection 1, partitions 10 and 11, replicas 7 (nodes 1, 2) and 8 (nodes 3, 4); every segment held once
    per replica, channel c0 watched in both, everything at 100 % as a finished load leaves it."""
    meta = QueryMeta(kv.fenced(await leader_fence(kv)))
    replicas = [data_pb2.ReplicaInfo(replica_id=7, collection_id=1, node_ids=[1, 2]),
                data_pb2.ReplicaInfo(replica_id=8, collection_id=1, node_ids=[3, 4])]
    await meta.add_collection(1, COLL, [10, 11], replicas=replicas, replica_number=2)
    await meta.save_segments([seg(100, 10, 1, 7), seg(101, 10, 2, 7), seg(102, 11, 1, 7)])
    await meta.save_segments([seg(100, 10, 3, 8), seg(101, 10, 4, 8), seg(102, 11, 3, 8)])
    await meta.save_dm_channel_watch([
        data_pb2.DmChannelWatchInfo(collection_id=1, dm_channel="c0", node_id=2, replica_id=7)])
    await meta.save_dm_channel_watch([
        data_pb2.DmChannelWatchInfo(collection_id=1, dm_channel="c0", node_id=4, replica_id=8)])
    await meta.set_partition_states(1, {10: (IN_MEMORY, 100), 11: (IN_MEMORY, 100)})
    return meta


async def test_a_lost_nodes_copies_stop_counting_the_moment_it_is_offline(kv: MetaKV) -> None:
    meta = await two_replica_meta(kv)
    nodes = FixedNodes({1, 2, 3, 4})
    view = ServedView(meta, nodes)
    whole = view.collection(1)
    assert whole is not None and whole.health == GREEN and whole.percentage == 100
    assert view.shown(meta.get_collection(1)).in_memory_percentage == 100  # type: ignore[arg-type]

    nodes.set(2, 3, 4)  # node 1 (segments 100 and 102 of replica 7) lost its session: nothing written yet
    lost = view.collection(1)
    assert lost is not None
    assert lost.replicas[7].held == 1 and lost.replicas[7].percentage == 33 and not lost.replicas[7].whole
    assert lost.replicas[8].whole and lost.replicas[8].percentage == 100
    assert lost.health == YELLOW, "every segment is still held by replica 8"
    shown = view.shown(meta.get_collection(1))  # type: ignore[arg-type]
    assert shown.in_memory_percentage < 100 and {p.state for p in shown.partitions} == {
        data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY}
    assert {r.replica_id: r.in_memory_percentage for r in shown.replicas} == {7: 33, 8: 100}
    replicas = {r.replica_id: r.in_memory_percentage for r in view.shown_replicas(meta.replicas_of(1))}
    assert replicas == {7: 33, 8: 100}

    nodes.set(2, 4)  # node 3 too: segments 100 and 102 (on nodes 1 and 3) are held by no replica now
    assert view.collection(1).health == RED  # type: ignore[union-attr]
    assert view.collection(1).unserved_segments == 2  # type: ignore[union-attr]


async def test_an_unwatched_channel_keeps_every_figure_below_100(kv: MetaKV) -> None:
    meta = await two_replica_meta(kv)
    nodes = FixedNodes({1, 2, 3, 4})
    view = ServedView(meta, nodes)
    await meta.remove_dm_channels(1, ["c0"])
    await meta.save_dm_channel_watch([
        data_pb2.DmChannelWatchInfo(collection_id=1, dm_channel="c0", node_id=2, replica_id=7)])
    served = view.collection(1)
    assert served is not None and served.replicas[7].whole and not served.replicas[8].whole
    assert served.replicas[8].percentage == 99, "every segment is held, but not the channel"
    assert served.percentage == 99 and served.health == YELLOW


async def test_a_node_serving_another_replica_does_not_count(kv: MetaKV) -> None:
    """A copy recorded on a node that is not a member of the copy's replica is not that replica's."""
    meta = await two_replica_meta(kv)
    await meta.save_segments([seg(101, 10, 3, 7)])  # replica 7's copy of 101 on node 3, a node of replica 8
    served = collection_served(meta, 1, {1, 2, 3, 4})
    assert served is not None and served.replicas[7].held == 2 and served.replicas[8].held == 3


async def test_the_catalogs_target_counts_what_meta_never_recorded(kv: MetaKV) -> None:
    """With the followed catalog copy, a segment of a loaded partition that no record places anywhere counts as
    missing (meta's records alone would call the remainder 100 %)."""
    catalog = CatalogStore(kv)
    desc, _ = await catalog.create_bulk_collection("c", num_partitions=1, num_segments=4, num_channels=1)
    async with followed_catalog(kv) as targets:
        cid, pid = desc.collection_id, desc.partitions[0].partition_id
        _chans, binlogs = await catalog.get_recovery_info(cid, pid)
        meta = QueryMeta(kv.fenced(await leader_fence(kv)))
        await meta.add_collection(cid, COLL, [pid], replicas=[
            data_pb2.ReplicaInfo(replica_id=5, collection_id=cid, node_ids=[1])])
        await meta.save_segments([data_pb2.SegmentInfo(segment_id=b.segment_id, collection_id=cid, partition_id=pid,
                                                       node_id=1, replica_id=5, mem_size=1) for b in binlogs[:3]])
        await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(
            collection_id=cid, dm_channel=desc.dm_channels[0], node_id=1, replica_id=5)])
        await meta.set_partition_states(cid, {pid: (IN_MEMORY, 100)})
        nodes = FixedNodes({1})
        assert collection_served(meta, cid, {1}).percentage == 100  # type: ignore[union-attr]
        served = ServedView(meta, nodes, targets).collection(cid)
        assert served is not None and served.target_from_catalog
        assert served.percentage == 75 and served.unserved_segments == 1 and served.health == RED


async def test_a_record_in_another_partition_than_its_target_counts_for_nothing_and_stays_counted_right(
        kv: MetaKV) -> None:
    """A target segment whose record says another partition (a catalog fix the checker has not applied) is not
    counted as served: a partition's count reads that partition's records only, so that a save into another
    partition keeps it (it is not recounted) and it still equals a count from scratch."""
    catalog = CatalogStore(kv)
    desc, _ = await catalog.create_bulk_collection("c", num_partitions=2, num_segments=8, num_channels=1)
    async with followed_catalog(kv) as targets:
        cid = desc.collection_id
        p0, p1 = (p.partition_id for p in desc.partitions)
        meta = QueryMeta(kv.fenced(await leader_fence(kv)))
        await meta.add_collection(cid, COLL, [p0, p1], replicas=[
            data_pb2.ReplicaInfo(replica_id=5, collection_id=cid, node_ids=[1])])
        recorded = []
        for pid in (p0, p1):
            _chans, binlogs = await catalog.get_recovery_info(cid, pid)
            recorded += [(b.segment_id, pid) for b in binlogs]
        stray = recorded[0][0]  # a segment of p0 recorded under p1
        await meta.save_segments([data_pb2.SegmentInfo(
            segment_id=sid, collection_id=cid, partition_id=p1 if sid == stray else pid, node_id=1, replica_id=5,
            mem_size=1) for sid, pid in recorded])
        await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(
            collection_id=cid, dm_channel=desc.dm_channels[0], node_id=1, replica_id=5)])
        view = ServedView(meta, FixedNodes({1}), targets)
        served = view.collection(cid)
        assert served is not None and served.target_from_catalog
        in_p0 = sum(1 for _, pid in recorded if pid == p0)
        assert served.partitions[p0] == (in_p0 - 1, in_p0) and served.unserved_segments == 1
        # the stray record's copy goes (a release on node 1): only p1's count is made again, and both still
        # equal a count from scratch
        await meta.remove_segment_copies(1, [stray])
        again = view.collection(cid)
        fresh = QueryMeta(kv)
        await fresh.reload()
        scratch = collection_served(fresh, cid, {1}, targets)
        assert again is not None and scratch is not None and again.partitions == scratch.partitions
        assert again.partitions[p0] == (in_p0 - 1, in_p0)


async def test_figures_are_recomputed_only_when_something_changed(kv: MetaKV) -> None:
    meta = await two_replica_meta(kv)
    nodes = FixedNodes({1, 2, 3, 4})
    view = ServedView(meta, nodes)
    for _ in range(5):
        view.collection(1)
    assert view.computed == 1
    nodes.set(1, 2, 3)
    assert view.collection(1).replicas[8].held == 2  # type: ignore[union-attr]
    await meta.save_segments([seg(101, 10, 3, 8)])
    assert view.collection(1).replicas[8].held == 3  # type: ignore[union-attr]
    assert view.computed == 3


@pytest.mark.parametrize("lost", [1, 3])
async def test_persisted_percentages_are_lowered_never_raised(kv: MetaKV, lost: int) -> None:
    """What a standby reads from etcd follows a lost node too, and a lower live figure never raises the record."""
    meta = await two_replica_meta(kv)
    nodes = FixedNodes({1, 2, 3, 4} - {lost})
    view = ServedView(meta, nodes)
    assert await persist_lowered(meta, [1], view.collection) == 1
    standby = QueryMeta(kv)
    await standby.reload()
    info = standby.get_collection(1)
    assert info is not None and info.in_memory_percentage < 100
    hurt = 7 if lost == 1 else 8
    assert {r.replica_id: r.in_memory_percentage for r in info.replicas}[hurt] == 33
    nodes.set(1, 2, 3, 4)
    assert await persist_lowered(meta, [1], view.collection) == 0, "back online: nothing is raised here"
