"""``save_loaded``'s streamed path: a load's new records sent a txn at a time while the next are built.

Against a real etcd: the records stored byte for byte and mirrored in memory, a record too large for a txn
refused with nothing written, and a fence lost mid-stream leaving memory exactly what etcd holds.
"""

from __future__ import annotations

import pytest

from meta.errors import NotLeader, RequestTooLarge
from meta.fence import Fence
from meta.kv import MAX_TXN_OPS, MetaKV
from proto import data_pb2
from querycoord.querymeta import QueryMeta
from querycoord.querymeta import keys as K
from querycoord.querymeta.records import loaded_record
from tests.leader import leader_fence
from tests.test_querymeta import COLL, assert_mirrors, stored_records

SEGMENTS = 1000  # several chunks


@pytest.fixture
async def meta(kv: MetaKV) -> QueryMeta:
    """The leader's QueryMeta: every write fenced."""
    fence: Fence = await leader_fence(kv)
    m = QueryMeta(kv.fenced(fence))
    await m.reload()
    return m


def infos(first: int, count: int, *, channel: str = "dml_0") -> list[data_pb2.SegmentLoadInfo]:
    return [
        data_pb2.SegmentLoadInfo(segment_id=i, collection_id=1, partition_id=10 + i % 3, num_rows=i, mem_size=10 * i,
                                 insert_channel=channel, binlog_paths=[f"log/{i}"])
        for i in range(first, first + count)
    ]


async def test_a_streamed_save_stores_every_record_byte_for_byte(meta: QueryMeta, kv: MetaKV) -> None:
    await meta.add_collection(1, COLL, [10, 11, 12])
    batch = infos(1, SEGMENTS)
    txns = await meta.save_loaded(batch, 2, 0)
    assert txns >= SEGMENTS // MAX_TXN_OPS
    stored = await stored_records(kv)
    replica = meta.replica_ids(1)[0] if meta.replica_ids(1) else 0
    for info in batch:
        want = loaded_record(info, 2, replica)
        want.node_ids.append(2)
        want.replica_ids.append(replica)
        assert stored[K.segment_key(1, info.partition_id, info.segment_id)] == want.SerializeToString()
    assert meta.node_memory_usage(2) == sum(10 * i for i in range(1, SEGMENTS + 1))
    await assert_mirrors(meta, kv)


async def test_a_record_too_large_for_a_txn_refuses_the_save_with_nothing_written(
    meta: QueryMeta, kv: MetaKV
) -> None:
    await meta.add_collection(1, COLL, [10, 11, 12])
    batch = infos(1, SEGMENTS)
    batch[-1].insert_channel = "x" * (2 << 20)  # alone more than etcd takes in a request
    before = await stored_records(kv)
    with pytest.raises(RequestTooLarge):
        await meta.save_loaded(batch, 2, 0)
    assert await stored_records(kv) == before
    assert not meta.segment_ids_of(1)
    await assert_mirrors(meta, kv)


async def test_a_fence_lost_mid_stream_leaves_memory_as_etcd_holds_it(
    meta: QueryMeta, kv: MetaKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    await meta.add_collection(1, COLL, [10, 11, 12])
    await meta.save_loaded(infos(1, 300), 1, 0)
    fenced = meta.kv  # what its writer sends through
    send = fenced.txn
    sent = 0

    async def txn_then_lose_the_fence(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal sent
        result = await send(*args, **kwargs)
        sent += 1
        if sent == 2:  # another coordinator becomes leader (same key, new create revision) mid-stream
            await kv.remove("election/leader")
            await kv.save("election/leader", "other")
        return result

    monkeypatch.setattr(fenced, "txn", txn_then_lose_the_fence)
    with pytest.raises(NotLeader):
        await meta.save_loaded(infos(10_000, 5000), 2, 0)  # more txns than the writer keeps in flight
    written = {s.segment_id for s in meta.segments_on_node(2)}
    assert written and len(written) < 5000, "some txns went through before the fence was lost, not all"
    assert len(meta.segments_on_node(1)) == 300
    await assert_mirrors(meta, kv)  # memory shows exactly the txns etcd accepted
