"""A segment id is unique within its collection, across partitions (querycoord/catalog/segment_ids.py).

Real etcd: a clash is refused with ALREADY_EXISTS naming the partition that holds the id, before anything is
written (one txn or many, point reads or a range read); two concurrent adds of one id cannot both win; drops and
compactions take the index keys with the segments; a collection written before the index gets it built at its
next add; the gRPC service and the clients carry the code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import pytest

from meta.kv import MetaKV
from proto import catalog_pb2, catalog_pb2_grpc, common_pb2, data_pb2
from querycoord.catalog import CatalogStore, SegmentIdTaken, start_catalog_server
from querycoord.catalog.broker import BrokerError
from querycoord.catalog.segment_ids import INDEX_PREFIX, index_key, index_prefix, marker_key
from querycoord.catalog.store import InvalidArgument, segment_prefix
from querycoord.common.errors import status_of
from querycoord.console.actions import Refusal, check
from querycoord.metatool.owners import owner_of


def seg(pid: int, sid: int = 0, rows: int = 10, sources: Sequence[int] = ()) -> data_pb2.SegmentBinlogs:
    return data_pb2.SegmentBinlogs(segment_id=sid, partition_id=pid, num_rows=rows, mem_size=rows * 8,
                                   binlog_paths=[f"log/{pid}/{sid}/{rows}"], compaction_from=list(sources))


async def segment_keys(kv: MetaKV, cid: int) -> dict[str, bytes]:
    return (await kv.load_prefix(segment_prefix(cid))).as_dict()


async def index_of(kv: MetaKV, cid: int) -> dict[int, int]:
    """Segment id -> partition, as the collection's index holds them (the marker left out)."""
    items = (await kv.load_prefix(index_prefix(cid))).items()
    return {int(k.rsplit("/", 1)[1]): int(v) for k, v in items if k.rsplit("/", 1)[1].isdigit()}


async def two_partitions(store: CatalogStore, name: str) -> tuple[int, int, int]:
    desc = await store.create_collection(name, num_partitions=2)
    return desc.collection_id, desc.partitions[0].partition_id, desc.partitions[1].partition_id


async def test_an_id_held_by_another_partition_is_refused_naming_it_and_nothing_is_written(kv: MetaKV) -> None:
    store = CatalogStore(kv)
    cid, p0, p1 = await two_partitions(store, "clash")
    await store.add_segments([seg(p0, 500)], collection_id=cid)
    before = await segment_keys(kv, cid)
    # One txn, many txns (200 segments: 2 keys each), and more ids than are read one by one (a range read).
    for request in ([seg(p1, 501), seg(p1, 500)],
                    [seg(p1, 1000 + i) for i in range(200)] + [seg(p1, 500)],
                    [seg(p1, 500)] + [seg(p1, 2000 + i) for i in range(1100)]):
        with pytest.raises(SegmentIdTaken) as taken:
            await store.add_segments(request, collection_id=cid)
        assert taken.value.code == common_pb2.ALREADY_EXISTS
        assert f"segment id 500 is already held by partition {p0}" in taken.value.reason
        assert "nothing of this request was written" in taken.value.reason
        assert await segment_keys(kv, cid) == before, "a refused request writes nothing"
        assert await index_of(kv, cid) == {500: p0}
    _, binlogs = await store.get_recovery_info(cid, p1)
    assert binlogs == [], "the partition that asked holds nothing"
    # Ids spread over many held ones: the range read stops after a few keys per id, the rest are read one by one.
    await store.add_segments([seg(p0, 3000 + i) for i in range(200)], collection_id=cid)
    before = await segment_keys(kv, cid)
    with pytest.raises(SegmentIdTaken, match=f"segment id 3150 is already held by partition {p0}"):
        await store.add_segments([seg(p1, 2000), seg(p1, 3150)] + [seg(p1, 4000 + i) for i in range(18)],
                                 collection_id=cid)
    assert await segment_keys(kv, cid) == before

    # Re-sending what is stored is still a no-op (an explicit id, as stored), alone or beside new segments.
    assert await store.add_segments([seg(p0, 500)], collection_id=cid) == [500]
    assert await store.add_segments([seg(p0, 500), seg(p1, 501)], collection_id=cid) == [500, 501]
    assert {k: v for k, v in (await index_of(kv, cid)).items() if k < 1000} == {500: p0, 501: p1}
    # The same id in two partitions of one request is refused as a malformed request.
    with pytest.raises(InvalidArgument, match="appears twice"):
        await store.add_segments([seg(p0, 600), seg(p1, 600)], collection_id=cid)
    # Another collection may use the id: unique within a collection.
    other, q0, _ = await two_partitions(store, "other")
    assert await store.add_segments([seg(q0, 500)], collection_id=other) == [500]


async def test_two_concurrent_adds_of_one_id_in_two_partitions_cannot_both_win(kv: MetaKV) -> None:
    """Both requests pass the read before writing (held at a barrier at their txn), so the txn's compare on the
    index key is what decides: exactly one wins, the other is told which partition holds the id."""
    stores = [CatalogStore(kv), CatalogStore(kv)]  # two processes writing one catalog
    cid, p0, p1 = await two_partitions(stores[0], "race")
    for round_ in range(5):
        sid = 700 + round_
        barrier = asyncio.Barrier(2)
        for store in stores:
            store.guarded_txn = _after(barrier, store.guarded_txn)  # type: ignore[method-assign]
        results = await asyncio.gather(*(store.add_segments([seg(pid, sid)], collection_id=cid)
                                         for store, pid in zip(stores, (p0, p1), strict=True)),
                                       return_exceptions=True)
        for store in stores:
            del store.guarded_txn  # the class's method again
        won = [i for i, r in enumerate(results) if r == [sid]]
        assert len(won) == 1, results
        lost = results[1 - won[0]]
        holder = (p0, p1)[won[0]]
        assert isinstance(lost, SegmentIdTaken), lost
        assert f"segment id {sid} is already held by partition {holder}" in lost.reason
        assert (await index_of(kv, cid))[sid] == holder
        keys = [k for k in await segment_keys(kv, cid) if k.endswith(f"/{sid:019d}")]
        assert keys == [f"{segment_prefix(cid, holder)}{sid:019d}"], "one partition holds it"


def _after(barrier: asyncio.Barrier, txn: Callable[..., Awaitable[bool]]) -> Callable[..., Awaitable[bool]]:
    async def held(*args: Any) -> bool:
        await barrier.wait()
        return await txn(*args)
    return held


async def test_compaction_and_drop_take_the_index_keys_with_the_segments(kv: MetaKV) -> None:
    store = CatalogStore(kv)
    cid, p0, p1 = await two_partitions(store, "tidy")
    a, b = await store.add_segments([seg(p0), seg(p0)], collection_id=cid)
    (merged,) = await store.add_segments([seg(p0, sources=(a, b))], collection_id=cid)
    assert await index_of(kv, cid) == {merged: p0}, "the sources' ids are free again"
    assert await store.add_segments([seg(p1, a)], collection_id=cid) == [a], "a compacted id may be used again"
    assert await kv.get(marker_key(cid)) is not None
    await store.drop_collection(cid)
    assert await kv.count_prefix(index_prefix(cid)) == 0, "the drop removes the index and its marker"
    assert owner_of(index_key(cid, a)) == "catalog", "meta verify knows whose keys these are"
    assert await kv.count_prefix(INDEX_PREFIX) == 0


async def test_a_collection_written_before_the_index_gets_it_at_its_next_add(kv: MetaKV) -> None:
    writer = CatalogStore(kv)
    cid, p0, p1 = await two_partitions(writer, "legacy")
    await writer.add_segments([seg(p0, 800), seg(p0, 801), seg(p1, 802)], collection_id=cid)
    # As a catalog written before the index looks: segments, no index keys, no marker.
    await kv.remove_prefix(index_prefix(cid))
    store = CatalogStore(kv)  # a process that has not seen the collection yet
    with pytest.raises(SegmentIdTaken, match=f"segment id 801 is already held by partition {p0}"):
        await store.add_segments([seg(p1, 801)], collection_id=cid)
    assert await index_of(kv, cid) == {800: p0, 801: p0, 802: p1}
    assert await kv.get(marker_key(cid)) is not None
    assert await store.add_segments([seg(p1, 803)], collection_id=cid) == [803], "new ids are still added"
    assert await index_of(kv, cid) == {800: p0, 801: p0, 802: p1, 803: p1}


async def test_the_service_and_the_clients_carry_already_exists(kv: MetaKV) -> None:
    store = CatalogStore(kv)
    cid, p0, p1 = await two_partitions(store, "wire")
    await store.add_segments([seg(p0, 900)], collection_id=cid)
    server, port = await start_catalog_server(store)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            resp = await catalog_pb2_grpc.CatalogStub(channel).AddSegments(
                catalog_pb2.AddSegmentsRequest(collection_id=cid, segments=[seg(p1, 900)]))
    finally:
        await server.stop(None)
    assert resp.status.error_code == common_pb2.ALREADY_EXISTS
    assert f"already held by partition {p0}" in resp.status.reason and not resp.segment_ids
    with pytest.raises(Refusal) as refused:  # what the CLI prints as `error: <reason>`, exiting 1
        check(resp, "add segments")
    assert refused.value.code == common_pb2.ALREADY_EXISTS and refused.value.reason == resp.status.reason
    broker = BrokerError.from_status(resp.status)
    assert str(broker).startswith("ALREADY_EXISTS: collection") and not broker.transient
    assert status_of(SegmentIdTaken("x")).error_code == common_pb2.ALREADY_EXISTS
