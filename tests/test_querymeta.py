"""QueryMeta against a real etcd: round trips, one-txn releases, batching, fencing, indexes.

Every test writes through a leader's ``FencedKV`` (as the coordinator does)
and checks with ``assert_mirrors`` that a standby's fresh ``QueryMeta`` on a
plain ``MetaKV``, after ``reload``, sees exactly what the writer has in
memory, and that etcd holds exactly those keys and bytes: memory and etcd
never diverge, whatever the write.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

import pytest

from meta.errors import NotLeader, RequestTooLarge
from meta.fence import Fence
from meta.kv import MAX_TXN_OPS, MetaKV
from proto import data_pb2
from querycoord.querymeta import (
    CollectionNotLoaded,
    CorruptRecord,
    LoadTypeConflict,
    PartitionNotLoaded,
    QueryMeta,
)
from querycoord.querymeta import keys as K
from querycoord.querymeta.batch import _MAX_TXNS_IN_FLIGHT
from querycoord.querymeta.copies import copies
from querycoord.querymeta.records import loaded_record
from tests.leader import leader_fence

PART = data_pb2.LOAD_TYPE_PARTITION
COLL = data_pb2.LOAD_TYPE_COLLECTION
IN_MEMORY = data_pb2.PARTITION_STATE_IN_MEMORY
PARTIAL = data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY


def seg(sid: int, cid: int = 1, pid: int = 10, node: int = 1, mem: int = 100, **kw: object) -> data_pb2.SegmentInfo:
    return data_pb2.SegmentInfo(
        segment_id=sid,
        collection_id=cid,
        partition_id=pid,
        node_id=node,
        mem_size=mem,
        num_rows=mem // 10,
        state=data_pb2.SEGMENT_STATE_SEALED,
        **kw,  # type: ignore[arg-type]
    )


def watch(cid: int, channel: str, node: int, pids: tuple[int, ...] = ()) -> data_pb2.DmChannelWatchInfo:
    return data_pb2.DmChannelWatchInfo(collection_id=cid, dm_channel=channel, node_id=node, partition_ids=pids)


@pytest.fixture
async def fence(kv: MetaKV) -> Fence:
    return await leader_fence(kv)


@pytest.fixture
async def meta(kv: MetaKV, fence: Fence) -> QueryMeta:
    """The leader's QueryMeta: every write fenced."""
    m = QueryMeta(kv.fenced(fence))
    await m.reload()
    return m


async def stored_records(kv: MetaKV) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for prefix in K.ALL_PREFIXES:
        out.update((await kv.load_prefix(prefix)).as_dict())
    return out


async def count_keys(kv: MetaKV, cid: int | None = None) -> dict[str, int]:
    """Keys under each prefix (of one collection when ``cid`` is given)."""
    if cid is None:
        return {p: await kv.count_prefix(p) for p in K.ALL_PREFIXES}
    return {
        "collection": await kv.count_prefix(K.collection_key(cid)),  # prefix of ".../12" too, so only used for 12
        "segments": await kv.count_prefix(K.segment_collection_prefix(cid)),
        "dm": await kv.count_prefix(K.dm_channel_prefix(cid)),
        "delta": await kv.count_prefix(K.delta_channel_prefix(cid)),
    }


async def assert_mirrors(meta: QueryMeta, kv: MetaKV) -> QueryMeta:
    """A standby's fresh reload equals the writer's memory, and etcd holds exactly those records."""
    await meta.drain()
    fresh = QueryMeta(kv)
    await fresh.reload()
    assert fresh.corrupt_keys == {}
    records = meta.records()
    assert fresh.records() == records
    assert await stored_records(kv) == {k: v.SerializeToString() for k, v in records.items()}
    assert fresh.collections() == meta.collections()
    assert fresh.segment_count_by_node() == meta.segment_count_by_node()
    assert fresh.channel_count_by_node() == meta.channel_count_by_node()
    assert fresh.known_node_ids() == meta.known_node_ids()
    for node in meta.known_node_ids():
        assert fresh.node_memory_usage(node) == meta.node_memory_usage(node)
        assert fresh.segments_on_node(node) == meta.segments_on_node(node)
        assert fresh.channels_on_node(node) == meta.channels_on_node(node)
    for cid in meta.collection_ids():
        assert fresh.segments_of(cid) == meta.segments_of(cid)
        assert fresh.dm_channels_of(cid) == meta.dm_channels_of(cid)
        assert fresh.get_delta_channels(cid) == meta.get_delta_channels(cid)
    return fresh


async def test_collection_round_trip_and_getters(meta: QueryMeta, kv: MetaKV) -> None:
    info = await meta.add_collection(1, PART, [10, 11, 10])
    assert [p.partition_id for p in info.partitions] == [10, 11]
    assert all(p.state == data_pb2.PARTITION_STATE_NOT_PRESENT and p.in_memory_percentage == 0 for p in info.partitions)
    await meta.add_collection(2, COLL, [20], replica_number=1)
    await meta.add_partitions(1, [12])
    await meta.set_partition_state(1, 10, IN_MEMORY, 100)
    fresh = await assert_mirrors(meta, kv)
    for m in (meta, fresh):
        assert m.collection_ids() == [1, 2]
        assert m.has_collection(1) and not m.has_collection(3)
        assert m.has_partition(1, 12) and not m.has_partition(1, 20)
        assert m.partition_ids(1) == [10, 11, 12]
        assert m.get_load_type(1) == PART and m.get_load_type(2) == COLL
        got = m.get_partition(1, 10)
        assert got is not None and got.in_memory_percentage == 100
        assert m.get_collection(1).in_memory_percentage == 33  # type: ignore[union-attr]
        assert m.get_collection(3) is None
    assert meta.get_load_type(3) == data_pb2.LOAD_TYPE_UNSPECIFIED  # falsy: "not loaded"
    # Getters hand out copies: changing one changes nothing inside.
    meta.get_collection(1).partitions[0].in_memory_percentage = 7  # type: ignore[union-attr]
    assert meta.get_partition(1, 10).in_memory_percentage == 100  # type: ignore[union-attr]
    assert QueryMeta.query_channels(5) == ("query-5", "query-result-5")


async def test_extend_conflict_and_no_op_writes(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10])
    await meta.set_partition_state(1, 10, IN_MEMORY, 100)
    before = meta.records()
    with pytest.raises(LoadTypeConflict, match="release it first"):
        await meta.add_collection(1, COLL, [10, 11])
    with pytest.raises(CollectionNotLoaded):
        await meta.add_partitions(9, [1])
    with pytest.raises(ValueError):
        await meta.add_collection(0, PART, [1])
    with pytest.raises(ValueError):
        await meta.add_collection(2, data_pb2.LOAD_TYPE_UNSPECIFIED, [1])
    assert meta.records() == before
    txns = meta.txn_count
    await meta.add_collection(1, PART, [10])  # already loaded: nothing to write
    await meta.add_collection(1, PART, [])  # a re-run whose partitions are all loaded
    assert meta.txn_count == txns
    info = await meta.add_collection(1, PART, [11])  # extends, keeps partition 10's state
    assert [(p.partition_id, p.in_memory_percentage) for p in info.partitions] == [(10, 100), (11, 0)]
    assert info.in_memory_percentage == 50
    await assert_mirrors(meta, kv)


async def test_percentage_reaches_100_only_when_every_partition_is_100(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [1, 2, 3])
    assert (await meta.set_partition_state(1, 1, IN_MEMORY, 100)).in_memory_percentage == 33
    info = await meta.set_partition_states(1, {2: (IN_MEMORY, 100), 3: (PARTIAL, 99)})
    assert info.in_memory_percentage == 99
    assert (await meta.set_partition_state(1, 3, IN_MEMORY, 100)).in_memory_percentage == 100
    # A newly loaded partition pulls it back down; releasing that partition restores it.
    assert (await meta.add_partitions(1, [4])).in_memory_percentage == 75
    await meta.release_partitions(1, [4])
    assert meta.get_collection(1).in_memory_percentage == 100  # type: ignore[union-attr]
    before = meta.records()
    with pytest.raises(ValueError):
        await meta.set_partition_state(1, 1, IN_MEMORY, 101)
    with pytest.raises(PartitionNotLoaded):
        await meta.set_partition_states(1, {1: (IN_MEMORY, 50), 9: (IN_MEMORY, 50)})
    assert meta.records() == before  # the valid half of a refused batch was not applied either
    await assert_mirrors(meta, kv)


async def test_progress_reports_are_persisted_in_the_background_and_never_go_back(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [1, 2])
    for pct in (10, 30, 20, 50):  # called from sync callbacks: no await; coalesced, monotonic
        meta.set_progress(1, 1, pct)
    meta.set_progress(1, 2, 99)
    meta.set_progress(1, 9, 50)  # not loaded: ignored
    await meta.drain()
    p1, p2 = meta.get_partition(1, 1), meta.get_partition(1, 2)
    assert p1 is not None and (p1.state, p1.in_memory_percentage) == (PARTIAL, 50)
    assert p2 is not None and p2.in_memory_percentage == 99
    assert meta.get_collection(1).in_memory_percentage == 74  # type: ignore[union-attr]
    await meta.set_partition_states(1, {1: (IN_MEMORY, 100), 2: (IN_MEMORY, 100)})
    meta.set_progress(1, 1, 99)  # a late report cannot undo the final state
    await meta.drain()
    assert meta.get_collection(1).in_memory_percentage == 100  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        meta.set_progress(1, 1, 101)
    await assert_mirrors(meta, kv)


async def populate(meta: QueryMeta, cid: int, pids: list[int], n_per_partition: int, first_sid: int) -> None:
    await meta.add_collection(cid, PART, pids)
    sid = first_sid
    segs = []
    for pid in pids:
        for _ in range(n_per_partition):
            segs.append(seg(sid, cid, pid, node=1 + sid % 3))
            sid += 1
    await meta.save_segments(segs)
    await meta.save_dm_channel_watch([watch(cid, f"dml-{cid}-0", 1, tuple(pids)), watch(cid, f"dml-{cid}-1", 2)])
    await meta.set_delta_channels(
        cid, [data_pb2.VChannelInfo(collection_id=cid, channel_name=f"delta-{cid}-{i}") for i in range(2)]
    )


async def test_release_collection_removes_every_key_in_one_txn(meta: QueryMeta, kv: MetaKV) -> None:
    # Collection 12 shares the text prefix "1" with collection 1: range deletes must not touch it.
    await populate(meta, 1, [10, 11], 300, first_sid=1)
    await populate(meta, 12, [120], 5, first_sid=10_000)
    assert await count_keys(kv) == {
        K.COLLECTION_PREFIX: 2,
        K.SEGMENT_PREFIX: 605,
        K.DM_CHANNEL_PREFIX: 4,
        K.DELTA_CHANNEL_PREFIX: 4,
    }
    other_before = await count_keys(kv, 12)
    txns, revision = meta.txn_count, await kv.revision()
    await meta.release_collection(1)
    assert meta.txn_count == txns + 1
    assert await kv.revision() == revision + 1  # etcd committed exactly one txn
    assert await count_keys(kv) == {
        K.COLLECTION_PREFIX: 1,
        K.SEGMENT_PREFIX: 5,
        K.DM_CHANNEL_PREFIX: 2,
        K.DELTA_CHANNEL_PREFIX: 2,
    }
    assert await count_keys(kv, 12) == other_before
    assert not meta.has_collection(1) and meta.segments_of(1) == [] and meta.dm_channels_of(1) == []
    assert meta.get_delta_channels(1) == [] and meta.collection_ids() == [12]
    assert sum(meta.segment_count_by_node().values()) == 5
    await assert_mirrors(meta, kv)
    # Releasing again (not loaded) is success and still one harmless txn.
    await meta.release_collection(1)


async def test_release_collection_clears_records_memory_does_not_know(meta: QueryMeta, kv: MetaKV) -> None:
    await populate(meta, 1, [10], 3, first_sid=1)
    await kv.save(K.segment_key(1, 10, 99), b"\xff\xff\xff")  # corrupt: skipped by reload
    await kv.save(K.segment_key(1, 77, 98), seg(98, 1, 77).SerializeToString())  # orphan partition
    await meta.reload()
    assert list(meta.corrupt_keys) == [K.segment_key(1, 10, 99)]
    assert meta.get_segment(98) is not None  # orphans are kept: they are what etcd holds
    await meta.release_collection(1)
    assert await count_keys(kv) == dict.fromkeys(K.ALL_PREFIXES, 0)


async def test_release_partitions_of_a_partition_load(meta: QueryMeta, kv: MetaKV) -> None:
    # Partitions 10 and 100 share a text prefix: the range delete of 10 must not touch 100.
    await meta.add_collection(1, PART, [10, 100, 11])
    await meta.save_segments([seg(1, pid=10), seg(2, pid=100), seg(3, pid=100), seg(4, pid=11)])
    await meta.save_dm_channel_watch([watch(1, "dml-a", 1, (10, 100)), watch(1, "dml-b", 2, (11,))])
    await meta.set_delta_channels(1, [data_pb2.VChannelInfo(collection_id=1, channel_name="delta-a")])

    assert await meta.release_partitions(1, [100, 999]) is False  # 999 was never loaded: ignored
    assert meta.partition_ids(1) == [10, 11]
    assert [s.segment_id for s in meta.segments_of(1)] == [1, 4]
    assert list(meta.get_dm_channel(1, "dml-a").partition_ids) == [10]  # type: ignore[union-attr]
    assert list(meta.get_collection(1).released_partition_ids) == []  # type: ignore[union-attr]
    await assert_mirrors(meta, kv)

    assert await meta.release_partitions(1, [11]) is False
    assert meta.get_dm_channel(1, "dml-b") is None  # it served only partition 11
    assert meta.channels_on_node(2) == []
    await assert_mirrors(meta, kv)

    assert await meta.release_partitions(1, []) is False
    assert await meta.release_partitions(1, [10]) is True  # the last partition takes the collection with it
    assert not meta.has_collection(1)
    assert await count_keys(kv) == dict.fromkeys(K.ALL_PREFIXES, 0)
    await assert_mirrors(meta, kv)
    assert await meta.release_partitions(1, [10]) is False  # not loaded: success, nothing to do


async def test_release_partitions_of_a_collection_load(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, COLL, [10, 11, 12])
    await meta.save_segments([seg(1, pid=10), seg(2, pid=11), seg(3, pid=12)])
    await meta.save_dm_channel_watch([watch(1, "dml-a", 1)])  # no partition ids: serves the whole collection
    await meta.release_partitions(1, [11])
    await meta.release_partitions(1, [12, 11])
    info = meta.get_collection(1)
    assert info is not None and list(info.released_partition_ids) == [11, 12]
    assert meta.get_dm_channel(1, "dml-a") is not None
    assert [s.segment_id for s in meta.segments_of(1)] == [1]
    await assert_mirrors(meta, kv)
    # Loading a released partition again takes it off the released list.
    info = await meta.add_partitions(1, [12])
    assert list(info.released_partition_ids) == [11]
    with pytest.raises(PartitionNotLoaded):
        await meta.save_segments([seg(2, pid=11)])
    await assert_mirrors(meta, kv)
    assert await meta.release_partitions(1, [10, 12]) is True
    assert await count_keys(kv) == dict.fromkeys(K.ALL_PREFIXES, 0)


async def test_release_of_many_partitions_splits_with_the_collection_record_last(meta: QueryMeta, kv: MetaKV) -> None:
    pids = list(range(1, 201))
    await meta.add_collection(1, PART, pids)
    await meta.save_segments([seg(p, pid=p) for p in pids])
    txns = meta.txn_count
    await meta.release_partitions(1, pids[:150])
    assert meta.txn_count - txns == 2  # 150 range deletes + 1 put do not fit in one 128-op txn
    assert meta.partition_ids(1) == pids[150:]
    assert [s.segment_id for s in meta.segments_of(1)] == pids[150:]
    await assert_mirrors(meta, kv)


async def test_save_5000_segments_splits_into_txns_and_reloads(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, COLL, [10, 11])
    segs = [seg(i, pid=10 + i % 2, node=1 + i % 4, mem=1000 + i) for i in range(1, 5001)]
    txns = meta.txn_count
    assert await meta.save_segments(segs) == math.ceil(5000 / MAX_TXN_OPS)
    assert meta.txn_count - txns == math.ceil(5000 / MAX_TXN_OPS)
    assert await kv.count_prefix(K.SEGMENT_PREFIX) == 5000
    assert meta.segment_count_by_node() == {1: 1250, 2: 1250, 3: 1250, 4: 1250}
    for node in range(1, 5):
        assert meta.node_memory_usage(node) == sum(s.mem_size for s in segs if s.node_id == node)
    assert len(meta.segments_of(1, 10)) == 2500
    assert meta.segment_ids_of(1, 11) == list(range(1, 5001, 2))
    fresh = await assert_mirrors(meta, kv)
    assert len(fresh.segments_of(1)) == 5000
    # A paged reload with small pages sees the same.
    paged = QueryMeta(kv)
    await paged.reload(page_size=333)
    assert paged.records() == meta.records()


async def test_a_load_of_new_records_and_other_saves_in_one_call_mirror_etcd(meta: QueryMeta, kv: MetaKV) -> None:
    """``save_segments`` takes new one-copy records (every segment of a load) by a path of their own; mixed
    with records that exist, records on no node, a partition move and removals, memory still equals a reload,
    and the replica of a new copy is its node's."""
    r1 = data_pb2.ReplicaInfo(replica_id=71, collection_id=1, node_ids=[1, 2])
    r2 = data_pb2.ReplicaInfo(replica_id=72, collection_id=1, node_ids=[3])
    await meta.add_collection(1, COLL, [10, 11], replica_number=2, replicas=[r1, r2])
    await meta.save_segments([seg(i, node=1 + i % 3) for i in range(1, 301)])
    mixed = [
        *[seg(i, pid=10 + i % 2, node=1 + i % 3) for i in range(301, 700)],  # new
        seg(4, node=3),  # exists on node 2 (replica 71): a second copy, in replica 72
        seg(6, pid=11, node=2),  # exists in partition 10: moved
        seg(900, node=0),  # new, on no node
    ]
    await meta.save_segments_and_remove(mixed, [7, 8])
    assert meta.segment_copies(4) == {71: 2, 72: 3}
    assert meta.segment_copies(6) == {71: 2} and meta.segment_ids_of(1, 11).count(6) == 1
    assert meta.segment_copies(301) == {71: 2} and meta.segment_copies(302) == {72: 3}
    assert meta.get_segment(7) is None and meta.get_segment(900) is not None
    assert len(meta.segment_ids_of(1)) == 300 - 2 + 399 + 1
    assert meta.node_memory_usage(3) == sum(
        100 for i in [*range(1, 301), *range(301, 700)] if 1 + i % 3 == 3 and i not in (7, 8)
    ) + 100  # segment 4's second copy
    await assert_mirrors(meta, kv)
    # A new record's bytes (its copy lists appended to the rest, serialized apart) are the record serialized.
    for sid in (301, 302, 699):
        ((_key, raw),) = (await kv.load_prefix(K.segment_key(1, 10 + sid % 2, sid))).items()
        parsed = data_pb2.SegmentInfo.FromString(raw)
        assert raw == parsed.SerializeToString() and len(parsed.node_ids) == len(parsed.replica_ids) == 1


async def test_save_loaded_stores_each_loaded_record_byte_for_byte(meta: QueryMeta, kv: MetaKV) -> None:
    """``save_loaded`` serializes a load's new records from one message whose fields it sets per segment: each
    stored record is the ``loaded_record`` with its one copy, byte for byte (a field left over from the segment
    before, compaction sources or a channel, would show), and a segment recorded already gets a second copy."""
    r1 = data_pb2.ReplicaInfo(replica_id=71, collection_id=1, node_ids=[1, 2])
    r2 = data_pb2.ReplicaInfo(replica_id=72, collection_id=1, node_ids=[3])
    await meta.add_collection(1, COLL, [10, 11], replica_number=2, replicas=[r1, r2])
    await meta.save_segments([seg(5, pid=11, node=3)])  # replica 72 holds segment 5 already
    infos = [
        data_pb2.SegmentLoadInfo(
            segment_id=i, collection_id=1, partition_id=10 + i % 2, num_rows=i, mem_size=10 * i,
            insert_channel=f"dml_{i % 3}" if i % 4 else "", compaction_from=[100 + i, 200 + i] if i % 5 == 0 else [],
            binlog_paths=[f"log/{i}"])
        for i in range(1, 40)
    ]
    assert await meta.save_loaded(infos, 2, 0) == 1
    stored = await stored_records(kv)
    for info in infos:
        if info.segment_id == 5:
            continue
        want = loaded_record(info, 2, 71)  # replica 0: the node's replica
        want.node_ids.append(2)
        want.replica_ids.append(71)
        assert stored[K.segment_key(1, info.partition_id, info.segment_id)] == want.SerializeToString()
    assert meta.segment_copies(5) == {71: 2, 72: 3}
    assert meta.node_memory_usage(2) == sum(10 * i for i in range(1, 40))
    await assert_mirrors(meta, kv)
    # Refused as save_segments refuses: nothing written.
    before = await stored_records(kv)
    with pytest.raises(PartitionNotLoaded):
        await meta.save_loaded([data_pb2.SegmentLoadInfo(segment_id=77, collection_id=1, partition_id=12)], 2, 0)
    with pytest.raises(ValueError, match="segment"):
        await meta.save_loaded([infos[0], infos[0]], 2, 0)
    with pytest.raises(ValueError, match="node id"):
        await meta.save_loaded(infos[:1], 0, 0)
    assert await stored_records(kv) == before


async def test_two_replicas_saving_the_same_segments_at_once_keep_both_copies(meta: QueryMeta, kv: MetaKV) -> None:
    """Saves of one collection run side by side (shared lock), but two saves of one segment never do: each
    adds its copy to what the other wrote (without the claims, both took the new-record path and the second
    put replaced the first copy)."""
    r1 = data_pb2.ReplicaInfo(replica_id=71, collection_id=1, node_ids=[1])
    r2 = data_pb2.ReplicaInfo(replica_id=72, collection_id=1, node_ids=[2])
    await meta.add_collection(1, COLL, [10], replica_number=2, replicas=[r1, r2])
    ids = range(1, 601)  # several txns each: the saves interleave at their round trips

    def infos(segment_ids: Iterable[int]) -> list[data_pb2.SegmentLoadInfo]:
        return [data_pb2.SegmentLoadInfo(segment_id=i, collection_id=1, partition_id=10, mem_size=100)
                for i in segment_ids]

    await asyncio.gather(  # what each replica's load children save (save_loaded), and a save of the general path
        meta.save_loaded(infos(ids), 1, 71),
        meta.save_loaded(infos(reversed(ids)), 2, 0),
        meta.save_segments([seg(i, node=1) for i in range(1000, 1300)]),  # other segments
    )
    assert all(meta.segment_copies(i) == {71: 1, 72: 2} for i in ids)
    assert meta.segment_copies(1000) == {71: 1}
    assert meta.node_memory_usage(1) == 100 * 900 and meta.node_memory_usage(2) == 100 * 600
    await assert_mirrors(meta, kv)


async def test_a_channel_watch_save_runs_beside_segment_saves_and_holds_none_back(meta: QueryMeta, kv: MetaKV) -> None:
    """A load's DM channel watch is saved while its segment saves are in flight, and a segment save that comes
    after it goes through too. The channel save does not take the collection's lock exclusively: it would wait for
    every save in flight, and every save queued behind it would wait with it."""
    r1 = data_pb2.ReplicaInfo(replica_id=71, collection_id=1, node_ids=[1])
    r2 = data_pb2.ReplicaInfo(replica_id=72, collection_id=1, node_ids=[2])
    await meta.add_collection(1, COLL, [10], replica_number=2, replicas=[r1, r2])
    async with meta.collection_lock(1).shared():  # a segment save in flight holds the lock so until etcd answers it
        async with asyncio.timeout(30):  # the failure mode is waiting for ever: bounded, not timed
            await asyncio.gather(
                meta.save_dm_channel_watch([watch(1, "dml-0", 1)]),
                meta.save_loaded([data_pb2.SegmentLoadInfo(segment_id=5, collection_id=1, partition_id=10)], 1, 0),
            )
    assert meta.get_dm_channel(1, "dml-0") is not None and meta.segment_copies(5) == {71: 1}
    # Two replicas' watches of one channel saved at once: the record is claimed, so each adds its copy.
    await asyncio.gather(*(meta.save_dm_channel_watch([watch(1, f"dml-{i}", node)])
                           for i in range(1, 9) for node in (1, 2)))
    assert all(copies(meta.get_dm_channel(1, f"dml-{i}")) == {71: 1, 72: 2} for i in range(1, 9))
    await assert_mirrors(meta, kv)


async def test_a_release_waits_for_the_saves_before_it_and_the_saves_after_it_find_it_released(
    meta: QueryMeta, kv: MetaKV
) -> None:
    """Shared and exclusive holders queue in one FIFO: the release neither runs beside a save nor lets a save
    that came after it overtake it (that save would have been written, then wiped, and reported as saved)."""
    await meta.add_collection(1, COLL, [10])
    before = asyncio.create_task(meta.save_segments([seg(i) for i in range(1, 700)]))
    await asyncio.sleep(0)  # the save holds the lock shared, its txns in flight
    release = asyncio.create_task(meta.release_collection(1))
    await asyncio.sleep(0)
    after = asyncio.create_task(meta.save_segments([seg(i) for i in range(700, 800)]))
    saved, _, late = await asyncio.gather(before, release, after, return_exceptions=True)
    assert saved == 6  # 699 records: every txn of it went through
    assert isinstance(late, CollectionNotLoaded)
    assert not meta.has_collection(1) and meta.get_segment(1) is None
    assert await stored_records(kv) == {}
    await assert_mirrors(meta, kv)


async def test_byte_limit_splits_txns_and_an_oversized_record_is_refused(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10])
    big = "x" * 40_000
    used = await meta.save_segments([seg(i, dm_channel=big) for i in range(1, 101)])  # about 4 MB
    assert used == 3  # 100 records fit 128 ops, but not 1.5 MiB
    await assert_mirrors(meta, kv)
    before, txns = meta.records(), meta.txn_count
    huge = seg(500, dm_channel="y" * (1600 * 1024))
    with pytest.raises(RequestTooLarge):
        await meta.save_segments([seg(400), huge])  # checked before anything is sent: seg 400 not written
    assert meta.txn_count == txns and meta.records() == before
    with pytest.raises(RequestTooLarge):  # one txn by contract, and 200 puts do not fit
        await meta.set_delta_channels(
            1, [data_pb2.VChannelInfo(collection_id=1, channel_name=f"d{i}") for i in range(200)]
        )
    assert meta.records() == before
    await assert_mirrors(meta, kv)


async def test_writes_after_the_fence_is_gone_raise_not_leader_and_change_nothing(
    meta: QueryMeta, kv: MetaKV, fence: Fence
) -> None:
    await populate(meta, 1, [10, 11], 20, first_sid=1)
    await meta.add_collection(2, COLL, [20])
    before = meta.records()
    stored = await stored_records(kv)
    # Another coordinator becomes leader: same key, new create revision.
    await kv.remove("election/leader")
    await kv.save("election/leader", "other")
    writes = [
        meta.add_collection(3, PART, [30]),
        meta.add_collection(1, PART, [12]),
        meta.add_partitions(2, [21]),
        meta.set_partition_state(1, 10, IN_MEMORY, 100),
        meta.save_segments([seg(10_000 + i, node=9) for i in range(300)]),
        meta.save_segments_and_remove([seg(1, node=7)], [2, 3]),
        meta.remove_segments([4, 5]),
        meta.save_dm_channel_watch([watch(1, "dml-new", 5)]),
        meta.remove_dm_channels(1, ["dml-1-0"]),
        meta.set_delta_channels(1, []),
        meta.release_partitions(1, [10]),
        meta.release_partitions(1, [10, 11]),
        meta.release_collection(1),
        meta.remove_node(1),
    ]
    for write in writes:
        with pytest.raises(NotLeader):
            await write
    assert meta.records() == before
    assert await stored_records(kv) == stored
    assert not meta.needs_reload  # NotLeader is definite: nothing was written
    # A standby (plain KV) still reads the same state.
    standby = QueryMeta(kv)
    await standby.reload()
    assert standby.records() == before


async def test_node_indexes_follow_moves_handoff_and_node_removal(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10, 11])
    await meta.save_segments([seg(i, node=1 if i <= 3 else 2, mem=100 * i) for i in range(1, 7)])
    await meta.save_dm_channel_watch([watch(1, "dml-0", 1), watch(1, "dml-1", 2)])
    assert meta.segment_count_by_node() == {1: 3, 2: 3}
    assert meta.node_memory_usage(1) == 600 and meta.node_memory_usage(2) == 1500

    # Balance: move segments 1 and 2 from node 1 to node 3 (same keys, new node).
    txns, revision = meta.txn_count, await kv.revision()
    await meta.save_segments_and_remove([seg(1, node=3, mem=100), seg(2, node=3, mem=200)], [])
    assert meta.txn_count == txns + 1 and await kv.revision() == revision + 1
    assert [s.segment_id for s in meta.segments_on_node(1)] == [3]
    assert [s.segment_id for s in meta.segments_on_node(3)] == [1, 2]
    assert meta.node_memory_usage(1) == 300 and meta.node_memory_usage(3) == 300

    # Handoff: compacted segment 7 replaces 4 and 5 on node 2, in one txn.
    revision = await kv.revision()
    await meta.save_segments_and_remove([seg(7, node=2, mem=50, compaction_from=[4, 5])], [4, 5, 404])
    assert await kv.revision() == revision + 1
    assert [s.segment_id for s in meta.segments_on_node(2)] == [6, 7]
    assert meta.node_memory_usage(2) == 650

    # A segment whose partition changed: the old key goes in the same txn.
    await meta.save_segments([seg(6, pid=11, node=2, mem=600)])
    assert await kv.get(K.segment_key(1, 10, 6)) is None
    assert [s.segment_id for s in meta.segments_of(1, 11)] == [6]
    fresh = await assert_mirrors(meta, kv)
    assert fresh.segment_count_by_node() == {1: 1, 2: 2, 3: 2}

    # Node 2 dies; the balance moved dml-1 to node 3 already; the rest is removed.
    await meta.save_dm_channel_watch([watch(1, "dml-1", 3)])
    assert meta.channel_count_by_node() == {1: 1, 3: 1}
    assert await meta.remove_node(2) == 1
    assert meta.segments_on_node(2) == [] and meta.node_memory_usage(2) == 0
    assert 2 not in meta.segment_count_by_node() and meta.known_node_ids() == {1, 3}
    assert await meta.remove_node(1) == 1
    assert meta.channels_on_node(1) == [] and meta.known_node_ids() == {3}
    await assert_mirrors(meta, kv)


async def test_remove_node_with_thousands_of_records_uses_few_txns(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10])
    await meta.add_collection(2, PART, [20])
    await meta.save_segments([seg(i, node=1 + i % 2) for i in range(1, 1001)])
    await meta.save_segments([seg(i, cid=2, pid=20, node=1) for i in range(2001, 2301)])
    assert await meta.remove_node(1) == math.ceil(800 / MAX_TXN_OPS)
    assert meta.segment_count_by_node() == {2: 500}
    await assert_mirrors(meta, kv)


async def test_channels_and_delta_channels(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10])
    with pytest.raises(CollectionNotLoaded):
        await meta.save_dm_channel_watch([watch(2, "dml-x", 1)])
    with pytest.raises(PartitionNotLoaded):
        await meta.save_dm_channel_watch([watch(1, "dml-x", 1, (11,))])
    with pytest.raises(ValueError):
        await meta.save_dm_channel_watch([watch(1, "", 1)])
    await meta.save_dm_channel_watch([watch(1, "dml/0", 1, (10,)), watch(1, "dml-1", 1)])
    await meta.save_dm_channel_watch([watch(1, "dml-1", 2)])  # re-watched on node 2
    assert [w.dm_channel for w in meta.channels_on_node(1)] == ["dml/0"]
    assert [w.dm_channel for w in meta.dm_channels_of(1)] == ["dml-1", "dml/0"]
    await meta.remove_dm_channels(1, ["dml/0", "unknown"])
    assert meta.channel_count_by_node() == {2: 1}

    delta = data_pb2.VChannelInfo(
        collection_id=1,
        channel_name="delta-0",
        unflushed_segment_ids=[5],
        flushed_segment_ids=[1, 2],
        dropped_segment_ids=[3],
        seek_position=data_pb2.MsgPosition(channel_name="delta-0", timestamp=42),
    )
    await meta.set_delta_channels(1, [delta, data_pb2.VChannelInfo(collection_id=1, channel_name="delta-1")])
    stored = meta.get_delta_channels(1)
    assert [d.channel_name for d in stored] == ["delta-0", "delta-1"]
    assert list(stored[0].flushed_segment_ids) == [] and list(stored[0].dropped_segment_ids) == []
    assert list(stored[0].unflushed_segment_ids) == [5] and stored[0].seek_position.timestamp == 42
    await meta.set_delta_channels(1, [data_pb2.VChannelInfo(collection_id=1, channel_name="delta-2")])
    assert [d.channel_name for d in meta.get_delta_channels(1)] == ["delta-2"]
    with pytest.raises(ValueError):
        await meta.set_delta_channels(1, [data_pb2.VChannelInfo(collection_id=2, channel_name="delta-x")])
    with pytest.raises(CollectionNotLoaded):
        await meta.set_delta_channels(2, [])
    await assert_mirrors(meta, kv)


async def test_segment_saves_are_validated_before_anything_is_written(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10])
    with pytest.raises(CollectionNotLoaded):
        await meta.save_segments([seg(1), seg(2, cid=2)])
    with pytest.raises(PartitionNotLoaded):
        await meta.save_segments([seg(1), seg(2, pid=11)])
    with pytest.raises(ValueError, match="twice"):
        await meta.save_segments([seg(1), seg(1)])
    with pytest.raises(ValueError, match="both saved and removed"):
        await meta.save_segments_and_remove([seg(1)], [1])
    with pytest.raises(ValueError):
        await meta.save_segments([seg(0)])
    assert await kv.count_prefix(K.SEGMENT_PREFIX) == 0 and meta.segments_of(1) == []
    # Index file paths are stripped (the catalog has them); the rest is kept.
    index = data_pb2.IndexInfo(field_id=100, index_id=7, index_name="ivf", index_file_paths=["a", "b"], index_size=9)
    await meta.save_segments([seg(1, index_infos=[index])])
    stored = meta.get_segment(1)
    assert stored is not None and stored.index_infos[0].index_id == 7
    assert list(stored.index_infos[0].index_file_paths) == []
    await assert_mirrors(meta, kv)


async def test_reload_skips_corrupt_records_or_refuses_them_when_strict(meta: QueryMeta, kv: MetaKV) -> None:
    await populate(meta, 1, [10], 3, first_sid=1)
    bad = {
        K.segment_key(1, 10, 50): b"\xff\xff\xff",  # not protobuf
        K.segment_key(1, 10, 51): seg(52).SerializeToString(),  # record of segment 52 under 51's key
        K.collection_key(7): data_pb2.CollectionLoadInfo(collection_id=8).SerializeToString(),
        K.dm_channel_key(1, "x"): watch(1, "", 1).SerializeToString(),  # no channel name
    }
    await kv.multi_save(bad)
    good = meta.records()
    fresh = QueryMeta(kv)
    await fresh.reload()
    assert set(fresh.corrupt_keys) == set(bad)
    assert fresh.records() == good
    with pytest.raises(CorruptRecord):
        await QueryMeta(kv).reload(strict=True)
    leader = QueryMeta(meta.kv)
    await leader.reload()
    assert await leader.purge_corrupt() == len(bad)
    assert leader.corrupt_keys == {}
    await assert_mirrors(leader, kv)


async def test_a_cancelled_write_still_completes_in_etcd_and_memory(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, PART, [10])
    # Three times the txns the writer keeps in flight: when the test sees the first land (a loop turn later at
    # most), the third wave cannot have been answered (each wave is sent only as the one before lands).
    wave = MAX_TXN_OPS * _MAX_TXNS_IN_FLIGHT
    n = 3 * wave + 100
    task = asyncio.create_task(meta.save_segments([seg(i) for i in range(1, n + 1)]))
    while not meta.segments_of(1):  # wait until the first txn has landed, then cancel mid-batch
        await asyncio.sleep(0)
    landed = len(meta.segments_of(1))
    assert landed % MAX_TXN_OPS == 0 and landed < n  # memory follows etcd txn by txn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await meta.drain()
    assert len(meta.segments_of(1)) == n
    assert await kv.count_prefix(K.SEGMENT_PREFIX) == n
    await assert_mirrors(meta, kv)
