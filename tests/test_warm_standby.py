"""The warm standby: a copy of the query meta followed by one watch equals a reload, and a takeover uses it.

Real etcd (the suite's embedded one), real writes through a leader's fenced
``QueryMeta``; the copy is compared with a fresh ``reload`` record by record,
after writes of every kind (moves between partitions, releases with range
deletes, node removal, a corrupt record put by hand).
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from meta.kv import MetaKV, PrefixSnapshot
from meta.watch import watch_prefix
from proto import data_pb2
from querycoord.catalog.store import CatalogStore
from querycoord.common.target import Target, TargetSegment
from querycoord.querymeta import QueryMeta
from querycoord.querymeta import keys as K
from querycoord.querymeta.mirror import MetaMirror
from tests.catalog_helpers import followed_catalog
from tests.cluster import QueryCluster
from tests.leader import leader_fence
from tests.test_querymeta import COLL, PART, seg, watch


async def test_progress_request_answers_an_idle_watch(kv: MetaKV) -> None:
    """An idle watch hears, on request, that it has everything up to etcd's revision (nothing else would say so)."""
    await kv.save("idle/a", b"1")
    now = await kv.revision()
    wanted = asyncio.Event()
    wanted.set()
    stream = watch_prefix(kv, "idle/", now + 1, progress_wanted=wanted)
    batch = await asyncio.wait_for(anext(stream), 10)
    assert batch.events == [] and batch.revision >= now
    await stream.aclose()


async def test_the_copy_equals_a_reload_after_every_kind_of_write(kv: MetaKV) -> None:
    fence = await leader_fence(kv)
    leader = QueryMeta(kv.fenced(fence))
    await leader.reload()
    await leader.add_collection(1, PART, [10, 11])
    await leader.save_segments([seg(100, pid=10, node=1), seg(101, pid=11, node=2)])
    mirror = MetaMirror(kv)  # started with records already there: the read, then the watch
    mirror.start()
    await asyncio.wait_for(mirror.catch_up(10), 15)
    await leader.add_collection(2, COLL, [20])
    await leader.save_segments([seg(200 + i, cid=2, pid=20, node=1 + i % 3) for i in range(50)])
    await leader.save_dm_channel_watch([watch(2, "dml-0", 1), watch(2, "dml-1", 2)])
    await leader.set_delta_channels(2, [data_pb2.VChannelInfo(collection_id=2, channel_name="delta-0")])
    await leader.save_segments([seg(101, pid=10, node=3)])  # moved to another partition: a put and a delete
    await leader.release_partitions(1, [11])
    await leader.remove_node(2)
    await kv.save(K.segment_key(2, 20, 999), b"\xff not a record")  # what a reload skips as corrupt
    await leader.save_segments([seg(300, cid=2, pid=20, node=3)])
    await leader.release_partitions(1, [10])  # the last partition: the collection goes
    await leader.drain()
    taken = await mirror.take()
    assert taken is not None, "the copy was not usable"
    index, corrupt, revision = taken
    assert revision >= await kv.revision() - 1
    assert mirror.events > 0, "the copy was read after the writes, not followed"
    fresh = QueryMeta(kv)
    await fresh.reload()
    adopted = QueryMeta(kv.fenced(fence))
    adopted.adopt(index, corrupt)
    assert adopted.records() == fresh.records()
    assert adopted.corrupt_keys == fresh.corrupt_keys == {K.segment_key(2, 20, 999): adopted.corrupt_keys[
        K.segment_key(2, 20, 999)]}
    assert adopted.segment_count_by_node() == fresh.segment_count_by_node()
    assert adopted.known_node_ids() == fresh.known_node_ids()
    for node in fresh.known_node_ids():
        assert adopted.node_memory_usage(node) == fresh.node_memory_usage(node)
    # The adopted meta is a leader's: it writes, and a reload agrees again.
    await adopted.save_segments([seg(301, cid=2, pid=20, node=1)])
    await fresh.reload()
    assert adopted.records() == fresh.records()


async def test_take_before_the_copy_exists_asks_for_a_reload(kv: MetaKV) -> None:
    mirror = MetaMirror(kv)
    assert await mirror.take() is None  # never started
    assert not mirror.ready


@pytest.mark.parametrize("warm", [1, 0])
async def test_a_standby_takes_over_from_its_copy(etcd: object, root_path: str, warm: int) -> None:
    """Two coordinators: the standby follows a loaded collection; when the leader stops, the new leader's meta
    comes from its copy (no reload) and equals what etcd holds. ``--warm-standby 0``: the same, by a reload."""
    async with QueryCluster(etcd, root_path) as c:  # type: ignore[arg-type]
        c.config.warm_standby = warm
        first, second, cid = await c.leader_and_standby("warm")
        await first.stop()
        c.coords.remove(first)
        leader = await c.wait_leader()
        assert leader is second
        expected = "warm standby copy" if warm else "reload"
        assert second.coord.last_takeover.get("meta_source") == expected, second.coord.last_takeover
        lead = second.coord.leadership
        assert lead is not None
        assert c.kv is not None
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        assert lead.meta.records() == fresh.records()
        assert len(lead.meta.segment_ids_of(cid)) == 40
        await c.wait_loaded(cid)


async def broker_target(catalog: CatalogStore, cid: int, pids: list[int]) -> Target:
    """The target as the checker reads it from a catalog without a copy (the remote-catalog path)."""
    target = Target()
    for pid in pids:
        chans, binlogs = await catalog.get_recovery_info(cid, pid)
        part = target.partitions.setdefault(pid, {})
        for b in binlogs:
            part[b.segment_id] = target.segments[b.segment_id] = TargetSegment(
                b.segment_id, pid, tuple(b.compaction_from), b.mem_size)
        target.channels.update(c.channel_name for c in chans)
    return target


async def test_the_catalog_copy_gives_the_targets_a_catalog_read_gives(kv: MetaKV) -> None:
    catalog = CatalogStore(kv)
    first, _ = await catalog.create_bulk_collection("t1", num_partitions=3, num_segments=30, num_channels=2)
    async with followed_catalog(kv) as targets:
        cid = first.collection_id
        pids = [p.partition_id for p in first.partitions]
        assert targets.target(cid, pids) == await broker_target(catalog, cid, pids)
        # Changes after the read: a second collection, new segments, a compaction replacing two segments.
        second, _ = await catalog.create_bulk_collection("t2", num_partitions=1, num_segments=5, num_channels=1)
        await catalog.add_segments([data_pb2.SegmentBinlogs(partition_id=pids[0], num_rows=10, mem_size=100)],
                                   collection_id=cid)
        _chans, binlogs = await catalog.get_recovery_info(cid, pids[1])
        sources = [b.segment_id for b in binlogs[:2]]
        await catalog.add_segments([data_pb2.SegmentBinlogs(partition_id=pids[1], num_rows=20, mem_size=200,
                                                            compaction_from=sources)], collection_id=cid)
        await targets.catch_up(15)
        for pick in (pids, pids[:1], pids[1:]):
            assert targets.target(cid, pick) == await broker_target(catalog, cid, pick)
        spids = [p.partition_id for p in second.partitions]
        assert targets.target(second.collection_id, spids) == await broker_target(catalog, second.collection_id,
                                                                                   spids)
        assert not set(sources) & set(targets.target(cid, pids).segments)  # type: ignore[union-attr]
        # A partition or collection the catalog lacks: no target (the checker leaves the collection alone).
        assert targets.target(cid, [*pids, 987654]) is None
        await catalog.drop_collection(second.collection_id)
        await targets.catch_up(15)
        assert targets.target(second.collection_id, spids) is None


async def test_a_follower_keeps_its_copy_not_the_raw_read(kv: MetaKV) -> None:
    """The first read's raw records (a million KeyValues at scale) are freed once the copy is built: the catalog's
    follower lives as long as the process, and kept them for ever."""
    catalog = CatalogStore(kv)
    await catalog.create_bulk_collection("raw", num_partitions=1, num_segments=50, num_channels=1)
    async with followed_catalog(kv):  # the follower alive, its first read done
        gc.collect()
        assert not [o for o in gc.get_objects() if isinstance(o, PrefixSnapshot)], "a raw read is still referenced"


async def test_a_standby_stopped_while_it_takes_over_stops(etcd: object, root_path: str) -> None:
    """The leader stops; the standby starts taking over from its copy and is stopped at once (a cluster shutting
    down). Its stop must end: a cancellation swallowed during the takeover (asyncio.wait_for on Python 3.11, a
    suppress(CancelledError) around the mirror's task) let it go on to lead while stop waited for it for ever."""
    for round_ in range(4):
        async with QueryCluster(etcd, f"{root_path}/{round_}") as c:  # type: ignore[arg-type]
            first = await c.start_coordinator()
            await c.wait_leader()
            await c.add_node()
            second = await c.start_coordinator()
            for _ in range(500):  # the copy is started once its session is registered
                if second.coord.mirror is not None and second.coord.mirror.ready:
                    break
                await asyncio.sleep(0.02)
            assert second.coord.mirror is not None and second.coord.mirror.ready
            await first.stop()
            c.coords.remove(first)
            for _ in range(round_):  # stop it at a different point of its takeover each round
                await asyncio.sleep(0)
            await asyncio.wait_for(second.stop(), 10)
            c.coords.remove(second)
            assert not second.coord.is_leader


async def test_replicas_read_through_the_copy_follow_every_write(kv: MetaKV) -> None:
    """GetReplicas on a standby derives each collection's replicas once per change (at 100k segments the walk
    took seconds per call under 48 readers): after every kind of write the copy's answer equals a reload's."""
    fence = await leader_fence(kv)
    leader = QueryMeta(kv.fenced(fence))
    await leader.reload()
    await leader.add_collection(2, COLL, [20])
    await leader.save_segments([seg(200 + i, cid=2, pid=20, node=1 + i % 3) for i in range(30)])
    mirror = MetaMirror(kv)
    mirror.start()
    try:
        async def same_as_a_reload() -> None:
            await leader.drain()
            await asyncio.wait_for(mirror.catch_up(10), 15)
            assert mirror.index is not None
            standby = QueryMeta.reading(kv, mirror.index)
            fresh = QueryMeta(kv)
            await fresh.reload()
            first = standby.replicas_of(2)
            assert first == fresh.replicas_of(2)
            assert standby.replicas_of(2) == first, "a second read without a write answers the same"

        await same_as_a_reload()
        await leader.save_dm_channel_watch([watch(2, "dml-0", 1), watch(2, "dml-1", 4)])
        await same_as_a_reload()
        await leader.save_segments([seg(200, cid=2, pid=20, node=5)])  # a move
        await same_as_a_reload()
        await leader.save_segments_and_remove([seg(250, cid=2, pid=20, node=2)], [201, 202])  # a handoff
        await same_as_a_reload()
        await leader.remove_node(3)
        await same_as_a_reload()
        await leader.release_collection(2)
        await same_as_a_reload()
        await leader.add_collection(2, COLL, [20])  # loaded again: nothing of the first load is shown
        await leader.save_segments([seg(400, cid=2, pid=20, node=6)])
        await same_as_a_reload()
    finally:
        await mirror.stop()
