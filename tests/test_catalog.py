"""The catalog against a real etcd and a real grpc.aio server: store, service, and both brokers.

What these tests pin down: names are unique even under concurrent creates;
bad input is refused with the right code and leaves nothing in etcd; a
compacted segment and what replaced it never coexist (one revision), and two
compactions cannot consume the same source; bulk catalogs are written in
multi-op txns; recovery info pages and filters correctly; the watch reports
additions and compaction removals; the gRPC service never lets an exception
escape; the local and remote brokers give the same answers, and a dead or
stuck remote catalog costs at most one timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from meta.errors import RequestTooLarge
from meta.kv import MetaKV
from proto import catalog_pb2, catalog_pb2_grpc, common_pb2, data_pb2
from querycoord.catalog import (
    Broker,
    BrokerError,
    CatalogServicer,
    CatalogStore,
    CollectionExists,
    CollectionNotFound,
    Conflict,
    GrpcBroker,
    InvalidArgument,
    LocalBroker,
    NotFound,
    PartitionNotFound,
    SegmentChange,
    SegmentIdTaken,
    start_catalog_server,
)
from querycoord.catalog.store import (
    COLLECTIONS_PREFIX,
    NAMES_PREFIX,
    SEGMENTS_PREFIX,
    AddSegmentsIncomplete,
    segment_prefix,
)

SCHEMA = catalog_pb2.CollectionSchema(
    fields=[
        catalog_pb2.FieldSchema(name="pk", data_type=catalog_pb2.DATA_TYPE_INT64, is_primary_key=True),
        catalog_pb2.FieldSchema(name="emb", data_type=catalog_pb2.DATA_TYPE_FLOAT_VECTOR, dim=8),
    ]
)


@pytest.fixture
def store(kv: MetaKV) -> CatalogStore:
    return CatalogStore(kv)


@pytest.fixture
async def server(store: CatalogStore) -> AsyncIterator[int]:
    srv, port = await start_catalog_server(store)
    yield port
    await srv.stop(None)


@pytest.fixture
async def stub(server: int) -> AsyncIterator[catalog_pb2_grpc.CatalogStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server}") as channel:
        yield catalog_pb2_grpc.CatalogStub(channel)


def seg(pid: int, rows: int = 100, *, cid: int = 0, sid: int = 0, channel: str = "", sources: tuple[int, ...] = ()):
    return data_pb2.SegmentBinlogs(
        segment_id=sid,
        collection_id=cid,
        partition_id=pid,
        num_rows=rows,
        mem_size=rows * 40,
        binlog_paths=[f"log/{pid}/{rows}/a", f"log/{pid}/{rows}/b"],
        insert_channel=channel,
        compaction_from=list(sources),
    )


async def keys_under(kv: MetaKV, prefix: str) -> list[str]:
    return [k.key for k in (await kv.load_prefix(prefix, keys_only=True)).kvs]


# ----- collections ----------------------------------------------------------------------------------------------------
async def test_create_describe_show_drop(store: CatalogStore, kv: MetaKV) -> None:
    desc = await store.create_collection("books", SCHEMA, partition_names=["p_a", "p_b"], num_channels=3)
    cid = desc.collection_id
    assert [p.name for p in desc.partitions] == ["p_a", "p_b"]
    assert len({cid, *(p.partition_id for p in desc.partitions)}) == 3, "one id space for every kind of id"
    assert desc.dm_channels == [f"by-dev-rootcoord-dml_{i}_{cid}v0" for i in range(3)]
    assert [f.field_id for f in desc.schema.fields] == [100, 101] and desc.schema.name == "books"
    assert await store.describe_collection(cid) == desc
    assert await store.describe_collection("books") == desc
    assert [p.partition_id for p in await store.show_partitions(cid)] == [p.partition_id for p in desc.partitions]

    other = await store.create_collection("films", num_partitions=4)
    assert [p.name for p in other.partitions] == [f"partition_{i}" for i in range(4)]
    assert len(other.dm_channels) == 2, "0 channels means 2, as in Milvus"
    default = await store.create_collection("music")
    assert [p.name for p in default.partitions] == ["_default"]

    pid = desc.partitions[0].partition_id
    await store.add_segments([seg(pid, 10), seg(pid, 32)], collection_id=cid)
    shown = {c.name: c for c in await store.show_collections()}
    assert set(shown) == {"books", "films", "music"}
    assert (shown["books"].num_partitions, shown["books"].num_segments, shown["books"].num_rows) == (2, 2, 42)

    dropped = await store.drop_collection(cid)
    assert dropped == desc
    with pytest.raises(CollectionNotFound, match=f"collection {cid} does not exist"):
        await store.describe_collection(cid)
    with pytest.raises(CollectionNotFound, match="'books' does not exist"):
        await store.describe_collection("books")
    assert await keys_under(kv, segment_prefix(cid)) == [], "drop removes the segments with the collection"
    assert len(await keys_under(kv, COLLECTIONS_PREFIX)) == 2
    assert sorted(await keys_under(kv, NAMES_PREFIX)) == [NAMES_PREFIX + "films", NAMES_PREFIX + "music"]
    with pytest.raises(CollectionNotFound):
        await store.drop_collection(cid)
    again = await store.create_collection("books")
    assert again.collection_id > cid, "a dropped name can be reused; ids never are"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "collection name is empty"),
        ({"name": "1abc"}, "must start with a letter"),
        ({"name": "a/b"}, "only letters, digits"),
        ({"name": "x" * 256}, "limit 255"),
        ({"partition_names": ["a", "a"]}, "repeated: a"),
        ({"partition_names": ["a"], "num_partitions": 3}, "give one or the other"),
        ({"num_partitions": 5000}, "at most 4096"),
        ({"num_channels": 65}, r"0\.\.64"),
        ({"num_partitions": -1}, ">= 0"),
    ],
)
async def test_create_refuses_bad_arguments(store: CatalogStore, kv: MetaKV, kwargs: dict, message: str) -> None:
    args = {"name": "c", **kwargs}
    name = args.pop("name")
    with pytest.raises(InvalidArgument, match=message):
        await store.create_collection(name, **args)
    assert await kv.count_prefix("catalog/collections/") == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ([("v", catalog_pb2.DATA_TYPE_FLOAT_VECTOR, 0, False)], "needs a dim"),
        ([("v", catalog_pb2.DATA_TYPE_BINARY_VECTOR, 12, False)], "divisible by 8"),
        ([("a", catalog_pb2.DATA_TYPE_INT64, 0, True), ("b", catalog_pb2.DATA_TYPE_INT64, 0, True)], "one primary"),
        ([("a", catalog_pb2.DATA_TYPE_INT64, 0, False), ("a", catalog_pb2.DATA_TYPE_BOOL, 0, False)], "repeated"),
        ([("a", catalog_pb2.DATA_TYPE_NONE, 0, False)], "no valid data type"),
        ([("a", catalog_pb2.DATA_TYPE_INT64, 4, False)], "must not have a dim"),
    ],
)
async def test_create_refuses_bad_schema(store: CatalogStore, fields: list, message: str) -> None:
    schema = catalog_pb2.CollectionSchema(
        fields=[catalog_pb2.FieldSchema(name=n, data_type=t, dim=d, is_primary_key=pk) for n, t, d, pk in fields]
    )
    with pytest.raises(InvalidArgument, match=message):
        await store.create_collection("c", schema)


async def test_duplicate_name_refused_even_when_concurrent(store: CatalogStore, kv: MetaKV) -> None:
    first = await store.create_collection("dup")
    with pytest.raises(CollectionExists, match=f"already used by collection {first.collection_id}"):
        await store.create_collection("dup")

    # Eight creates of one name from four independent stores (own id allocators), all at once.
    stores = [CatalogStore(kv) for _ in range(4)]
    results = await asyncio.gather(
        *(stores[i % 4].create_collection("race", num_partitions=2) for i in range(8)), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, catalog_pb2.CollectionDescription)]
    losers = [r for r in results if not isinstance(r, catalog_pb2.CollectionDescription)]
    assert len(winners) == 1, results
    assert all(isinstance(e, CollectionExists) for e in losers), losers
    assert (await store.describe_collection("race")).collection_id == winners[0].collection_id
    assert await kv.count_prefix(COLLECTIONS_PREFIX) == 2, "the losers wrote no collection record"


async def test_create_survives_a_retried_txn_whose_answer_was_lost(store: CatalogStore) -> None:
    """The etcd client retries a txn whose answer was lost; the retry's failed compare must not read as a conflict."""
    real = store.guarded_txn

    async def applied_then_retried(operation, compares, ops) -> bool:
        await real(operation, compares, ops)  # applied, answer "lost"
        return await real(operation, compares, ops)  # the retry: its compare now fails

    store.guarded_txn = applied_then_retried  # type: ignore[method-assign]
    desc = await store.create_collection("lost_answer", num_partitions=2)
    store.guarded_txn = real  # type: ignore[method-assign]
    assert (await store.describe_collection("lost_answer")) == desc


# ----- segments -------------------------------------------------------------------------------------------------------
async def test_add_segments_validation_writes_nothing(store: CatalogStore, kv: MetaKV) -> None:
    desc = await store.create_collection("v", num_partitions=2)
    other = await store.create_collection("w")
    cid, pid, pid2 = desc.collection_id, desc.partitions[0].partition_id, desc.partitions[1].partition_id
    existing = (await store.add_segments([seg(pid)], collection_id=cid))[0]
    before = await kv.load_prefix(SEGMENTS_PREFIX)

    cases: list[tuple[list[data_pb2.SegmentBinlogs], int, type[Exception], str]] = [
        ([], cid, InvalidArgument, "no segments"),
        ([seg(pid)], 0, InvalidArgument, "names no collection"),
        ([seg(pid)], 999_999, CollectionNotFound, "collection 999999 does not exist"),
        ([seg(pid, cid=other.collection_id)], cid, InvalidArgument, "request is for collection"),
        ([seg(other.partitions[0].partition_id)], cid, PartitionNotFound, "does not exist in collection"),
        ([seg(pid, -1)], cid, InvalidArgument, "must be >= 0"),
        ([seg(pid, channel="dml_nope")], cid, InvalidArgument, "not a DM channel"),
        ([seg(pid, sid=-5)], cid, InvalidArgument, "segment_id must be >= 0"),
        ([seg(pid, sid=77), seg(pid, sid=77)], cid, InvalidArgument, "appears twice"),
        ([seg(pid, sources=(123456,))], cid, NotFound, "compaction sources 123456 are not in partition"),
        ([seg(pid2, sources=(existing,))], cid, NotFound, "compaction stays within a partition"),
        ([seg(pid, sid=90), seg(pid, sources=(90,))], cid, InvalidArgument, "added by this same request"),
        ([seg(pid, sources=(existing, existing))], cid, InvalidArgument, "distinct positive ids"),
        ([seg(pid), seg(pid, rows=-3)], cid, InvalidArgument, r"segment #1: num_rows"),
    ]
    for segments, coll, error, message in cases:
        with pytest.raises(error, match=message):
            await store.add_segments(segments, collection_id=coll)
    mem = seg(pid)
    mem.mem_size = -1
    with pytest.raises(InvalidArgument, match="mem_size must be >= 0"):
        await store.add_segments([mem], collection_id=cid)
    assert (await kv.load_prefix(SEGMENTS_PREFIX)).as_dict() == before.as_dict(), "a refused request writes nothing"

    with pytest.raises(SegmentIdTaken, match=f"segment id {existing} is already held by partition {pid} "
                                             r"\(with other binlogs\)") as taken:
        await store.add_segments([seg(pid, 5, sid=existing)], collection_id=cid)
    assert taken.value.code == common_pb2.ALREADY_EXISTS
    # Re-sending exactly what is stored (an explicit id) is an idempotent no-op, not a conflict.
    assert await store.add_segments([seg(pid, sid=existing)], collection_id=cid) == [existing]


async def test_insert_channel_assigned_round_robin_and_ids_in_request_order(store: CatalogStore) -> None:
    desc = await store.create_collection("rr", num_channels=4)
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    ids = await store.add_segments([seg(pid, rows=i) for i in range(8)] + [seg(pid, channel=desc.dm_channels[3])], cid)
    _, binlogs = await store.get_recovery_info(cid, pid)
    by_id = {b.segment_id: b for b in binlogs}
    assert [by_id[i].num_rows for i in ids[:8]] == list(range(8)), "ids come back in request order"
    assert {by_id[i].insert_channel for i in ids[:8]} == set(desc.dm_channels), "spread over every channel"
    assert by_id[ids[8]].insert_channel == desc.dm_channels[3], "a given channel is kept"


async def test_compaction_replaces_sources_in_the_same_txn(store: CatalogStore, kv: MetaKV) -> None:
    desc = await store.create_collection("compact", num_partitions=1)
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    a, b, c = await store.add_segments([seg(pid, 10), seg(pid, 20), seg(pid, 30)], collection_id=cid)

    rev = await kv.revision()
    (merged,) = await store.add_segments([seg(pid, 30, sources=(a, b))], collection_id=cid)
    _, binlogs = await store.get_recovery_info(cid, pid)
    assert sorted(x.segment_id for x in binlogs) == sorted([c, merged])
    # One txn: the new segment and the removal of both sources carry one revision, with nothing in between.
    assert await kv.revision() == rev + 1
    new_key = next(k for k in (await kv.load_prefix(segment_prefix(cid, pid))).kvs if k.key.endswith(f"{merged:019d}"))
    assert new_key.mod_revision == rev + 1

    with pytest.raises(NotFound, match=f"compaction sources {a} are not in partition"):
        await store.add_segments([seg(pid, sources=(a,))], collection_id=cid)

    # Two compactions race for the same source: exactly one may consume it.
    results = await asyncio.gather(
        *(store.add_segments([seg(pid, 30, sources=(c,))], collection_id=cid) for _ in range(4)),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, list)]
    assert len(won) == 1, results
    assert all(isinstance(r, NotFound | Conflict) for r in results if not isinstance(r, list)), results
    _, binlogs = await store.get_recovery_info(cid, pid)
    assert sorted(x.segment_id for x in binlogs) == sorted([merged, won[0][0]])


async def test_compaction_retried_after_a_lost_answer_is_success(store: CatalogStore) -> None:
    desc = await store.create_collection("retry")
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    (a,) = await store.add_segments([seg(pid)], collection_id=cid)
    real = store.guarded_txn

    async def applied_then_retried(operation, compares, ops) -> bool:
        await real(operation, compares, ops)
        return await real(operation, compares, ops)  # sources are gone now: the compare fails

    store.guarded_txn = applied_then_retried  # type: ignore[method-assign]
    (b,) = await store.add_segments([seg(pid, sources=(a,))], collection_id=cid)
    store.guarded_txn = real  # type: ignore[method-assign]
    _, binlogs = await store.get_recovery_info(cid, pid)
    assert [x.segment_id for x in binlogs] == [b]


async def test_large_batch_is_chunked_and_compaction_groups_stay_whole(store: CatalogStore, kv: MetaKV) -> None:
    desc = await store.create_collection("chunks")
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    olds = await store.add_segments([seg(pid) for _ in range(300)], collection_id=cid)
    calls: list[int] = []
    real = store.guarded_txn

    async def counting(operation, compares, ops) -> bool:
        calls.append(len(ops))
        return await real(operation, compares, ops)

    store.guarded_txn = counting  # type: ignore[method-assign]
    # 60 new segments, each replacing 5 of the old ones (12 ops per group: each segment's key and its id's index
    # key): 720 ops, several txns.
    new = await store.add_segments(
        [seg(pid, sources=tuple(olds[5 * i : 5 * i + 5])) for i in range(60)], collection_id=cid
    )
    store.guarded_txn = real  # type: ignore[method-assign]
    assert len(calls) == 6 and all(n <= 128 and n % 12 == 0 for n in calls), calls
    _, binlogs = await store.get_recovery_info(cid, pid)
    assert sorted(b.segment_id for b in binlogs) == sorted(new)

    huge = seg(pid)
    huge.binlog_paths[:] = ["x" * 1000] * 1700  # 1.7 MB: more than one etcd request may carry
    with pytest.raises(RequestTooLarge, match="request too large"):
        await store.add_segments([huge], collection_id=cid)
    assert await kv.count_prefix(segment_prefix(cid)) == 60


async def test_add_segments_racing_a_drop_leaves_no_orphans(store: CatalogStore, kv: MetaKV) -> None:
    desc = await store.create_collection("dropme", num_partitions=2)
    cid = desc.collection_id
    batch = [seg(desc.partitions[i % 2].partition_id) for i in range(2000)]
    add = asyncio.create_task(store.add_segments(batch, collection_id=cid))
    await asyncio.sleep(0.02)
    await store.drop_collection(cid)
    try:
        await add
    except (CollectionNotFound, AddSegmentsIncomplete) as exc:
        assert exc.code == common_pb2.NOT_FOUND
    assert await kv.count_prefix(segment_prefix(cid)) == 0, "no segment outlives its collection"


# ----- recovery info ------------------------------------------------------------------------------------------------
async def test_recovery_info_channels_filter_and_pages(store: CatalogStore) -> None:
    desc = await store.create_collection("rec", num_partitions=2, num_channels=2)
    cid, p0, p1 = desc.collection_id, desc.partitions[0].partition_id, desc.partitions[1].partition_id
    ch0, ch1 = desc.dm_channels
    ids0 = await store.add_segments([seg(p0, i + 1, channel=(ch0, ch1)[i % 2]) for i in range(10)], cid)
    ids1 = await store.add_segments([seg(p1, 5, channel=ch1) for _ in range(3)], collection_id=cid)

    channels, binlogs = await store.get_recovery_info(cid, p0)
    assert [b.segment_id for b in binlogs] == sorted(ids0)
    assert [c.channel_name for c in channels] == [ch0, ch1]
    assert list(channels[0].flushed_segment_ids) == ids0[0::2]
    assert list(channels[1].flushed_segment_ids) == ids0[1::2]
    assert all(c.collection_id == cid for c in channels)
    assert binlogs[0].binlog_paths == seg(p0, 1).binlog_paths

    channels, binlogs = await store.get_recovery_info(cid, p1)
    assert [b.segment_id for b in binlogs] == ids1 and list(channels[0].flushed_segment_ids) == []

    # Filtered by ids: ids of another partition or unknown are simply absent.
    _, picked = await store.get_recovery_info(cid, p0, [ids0[3], ids0[7], ids1[0], 999_999])
    assert [b.segment_id for b in picked] == [ids0[3], ids0[7]]
    channels, none = await store.get_recovery_info(cid, p0, [])
    assert none == [] and len(channels) == 2

    # Pages of 3 walk every segment once, in id order, for both unfiltered and filtered lookups.
    for wanted in (None, ids0[::2]):
        after, seen = 0, []
        while True:
            page = await store.get_recovery_page(cid, p0, wanted, after_segment_id=after, page_size=3)
            assert len(page.binlogs) <= 3
            seen += [b.segment_id for b in page.binlogs]
            after = page.next_after_segment_id
            if not after:
                break
        assert seen == sorted(wanted or ids0)

    with pytest.raises(PartitionNotFound, match=f"partition 424242 does not exist in collection {cid}"):
        await store.get_recovery_info(cid, 424242)
    with pytest.raises(CollectionNotFound):
        await store.get_recovery_info(424242, p0)


async def test_bulk_collection_16_partitions_10k_segments(store: CatalogStore, kv: MetaKV) -> None:
    started = time.perf_counter()
    desc, ids = await store.create_bulk_collection("bulk", num_partitions=16, num_segments=10_000)
    elapsed = time.perf_counter() - started
    print(f"\nbulk catalog: 16 partitions x 10,000 segments written in {elapsed:.2f}s")
    assert len(ids) == len(set(ids)) == 10_000
    assert await kv.count_prefix(segment_prefix(desc.collection_id)) == 10_000

    started = time.perf_counter()
    results = await asyncio.gather(
        *(store.get_recovery_info(desc.collection_id, p.partition_id) for p in desc.partitions)
    )
    print(f"recovery info of the 16 partitions read in {time.perf_counter() - started:.2f}s")
    got: list[int] = []
    for part, (channels, binlogs) in zip(desc.partitions, results, strict=True):
        assert len(binlogs) == 625 and all(b.partition_id == part.partition_id for b in binlogs)
        assert sum(len(c.flushed_segment_ids) for c in channels) == 625
        got += [b.segment_id for b in binlogs]
    assert sorted(got) == sorted(ids)
    (summary,) = await store.show_collections()
    assert (summary.num_segments, summary.num_rows) == (10_000, 10_000 * 10_000)


# ----- watch ------------------------------------------------------------------------------------------------------
async def test_watch_segments_sees_additions_and_compaction_removals(store: CatalogStore) -> None:
    desc = await store.create_collection("watched", num_partitions=2)
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    start = await store.revision() + 1
    changes: list[SegmentChange] = []

    async def collect(until: int) -> None:
        async for item in store.watch_segments(start):
            assert isinstance(item, SegmentChange)
            changes.append(item)
            if len(changes) == until:
                return

    watcher = asyncio.create_task(collect(3))
    a, b = await store.add_segments([seg(pid), seg(pid)], collection_id=cid)
    (merged,) = await store.add_segments([seg(pid, sources=(a, b))], collection_id=cid)
    await store.drop_collection(cid)
    await asyncio.wait_for(watcher, 30)

    added, compaction, drop = changes
    assert [s.segment_id for s in added.added] == [a, b] and added.removed == []
    assert [s.segment_id for s in compaction.added] == [merged]
    assert list(compaction.added[0].compaction_from) == [a, b]
    assert sorted(r.segment_id for r in compaction.removed) == [a, b], "the sources' removal comes in the same change"
    assert all((r.collection_id, r.partition_id) == (cid, pid) for r in compaction.removed)
    assert drop.added == [] and [r.segment_id for r in drop.removed] == [merged]


# ----- gRPC service -----------------------------------------------------------------------------------------------
async def test_grpc_service_answers_and_error_statuses(stub: catalog_pb2_grpc.CatalogStub) -> None:
    created = await stub.CreateCollection(
        catalog_pb2.CreateCollectionRequest(collection_name="remote", schema=SCHEMA, num_partitions=3)
    )
    assert created.status.error_code == common_pb2.SUCCESS, created.status.reason
    cid = created.collection.collection_id
    pid = created.collection.partitions[0].partition_id

    dup = await stub.CreateCollection(catalog_pb2.CreateCollectionRequest(collection_name="remote"))
    assert dup.status.error_code == common_pb2.CONFLICT and "already used" in dup.status.reason
    bad = await stub.CreateCollection(catalog_pb2.CreateCollectionRequest(collection_name="no such name!"))
    assert bad.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "invalid" in bad.status.reason

    described = await stub.DescribeCollection(catalog_pb2.DescribeCollectionRequest(collection_name="remote"))
    assert described.collection == created.collection
    missing = await stub.DescribeCollection(catalog_pb2.DescribeCollectionRequest(collection_id=cid + 10_000))
    assert missing.status.error_code == common_pb2.NOT_FOUND and "does not exist" in missing.status.reason
    unnamed = await stub.DescribeCollection(catalog_pb2.DescribeCollectionRequest())
    assert unnamed.status.error_code == common_pb2.ILLEGAL_ARGUMENT

    parts = await stub.ShowPartitions(catalog_pb2.ShowPartitionsRequest(collection_id=cid))
    assert [p.partition_id for p in parts.partitions] == [p.partition_id for p in created.collection.partitions]

    added = await stub.AddSegments(
        catalog_pb2.AddSegmentsRequest(collection_id=cid, segments=[seg(pid, 7) for _ in range(25)])
    )
    assert added.status.error_code == common_pb2.SUCCESS and len(added.segment_ids) == 25
    refused = await stub.AddSegments(catalog_pb2.AddSegmentsRequest(collection_id=cid, segments=[seg(pid + 999)]))
    assert refused.status.error_code == common_pb2.NOT_FOUND and f"partition {pid + 999}" in refused.status.reason
    too_big = seg(pid)
    too_big.binlog_paths[:] = ["y" * 1000] * 1700
    big = await stub.AddSegments(catalog_pb2.AddSegmentsRequest(collection_id=cid, segments=[too_big]))
    assert big.status.error_code == common_pb2.REQUEST_TOO_LARGE

    pages, after = [], 0
    while True:
        req = catalog_pb2.GetRecoveryInfoRequest(
            collection_id=cid, partition_id=pid, after_segment_id=after, page_size=10
        )
        page = await stub.GetRecoveryInfo(req)
        assert page.status.error_code == common_pb2.SUCCESS and len(page.channels) == 2
        pages.append([b.segment_id for b in page.binlogs])
        after = page.next_after_segment_id
        if not after:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [sid for p in pages for sid in p] == sorted(added.segment_ids)
    whole = await stub.GetRecoveryInfo(catalog_pb2.GetRecoveryInfoRequest(collection_id=cid, partition_id=pid))
    assert [b.segment_id for b in whole.binlogs] == sorted(added.segment_ids) and whole.next_after_segment_id == 0
    bad_part = await stub.GetRecoveryInfo(catalog_pb2.GetRecoveryInfoRequest(collection_id=cid, partition_id=1))
    assert bad_part.status.error_code == common_pb2.NOT_FOUND

    shown = await stub.ShowCollections(catalog_pb2.ShowCollectionsRequest())
    assert [(c.name, c.num_segments, c.num_rows) for c in shown.collections] == [("remote", 25, 175)]
    dropped = await stub.DropCollection(catalog_pb2.DropCollectionRequest(collection_name="remote"))
    assert dropped.status.error_code == common_pb2.SUCCESS
    again = await stub.DropCollection(catalog_pb2.DropCollectionRequest(collection_id=cid))
    assert again.status.error_code == common_pb2.NOT_FOUND


async def test_grpc_service_reports_etcd_outage_as_meta_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog whose etcd is unreachable (nothing listens on its port) answers META_UNAVAILABLE naming it."""
    from meta.client import EtcdClient
    from meta.config import EtcdConfig
    from meta.ops.etcd_server import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    client = EtcdClient(EtcdConfig(endpoints=(endpoint,), call_timeout=0.3, deadline=1.0))
    await client.connect()  # opens the channel lazily: nothing is contacted yet
    dead = CatalogStore(MetaKV(client, "catalog-outage"))
    srv, port = await start_catalog_server(dead)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = catalog_pb2_grpc.CatalogStub(channel)
            resp = await stub.DescribeCollection(catalog_pb2.DescribeCollectionRequest(collection_id=5), timeout=30)
            assert resp.status.error_code == common_pb2.META_UNAVAILABLE and endpoint in resp.status.reason

            # A bug in the store (not etcd) must not escape to gRPC either.
            async def bug(*args: object, **kwargs: object) -> None:
                raise ZeroDivisionError("boom")

            monkeypatch.setattr(dead, "describe_collection", bug)
            resp = await stub.DescribeCollection(catalog_pb2.DescribeCollectionRequest(collection_id=5), timeout=30)
            assert resp.status.error_code == common_pb2.UNEXPECTED_ERROR and "ZeroDivisionError" in resp.status.reason
    finally:
        await srv.stop(None)
        await client.close()


# ----- brokers ----------------------------------------------------------------------------------------------------
async def test_local_and_grpc_brokers_agree(store: CatalogStore, server: int) -> None:
    desc = await store.create_collection("brokered", SCHEMA, num_partitions=3, num_channels=3)
    cid = desc.collection_id
    for i, part in enumerate(desc.partitions):
        await store.add_segments([seg(part.partition_id, 10 * i + j) for j in range(20 + i)], collection_id=cid)
    local = LocalBroker(store)
    remote = GrpcBroker(f"127.0.0.1:{server}", page_size=7)  # small pages: merged answers must equal whole ones
    assert isinstance(local, Broker) and isinstance(remote, Broker)
    try:
        assert await local.describe_collection(cid) == await remote.describe_collection(cid) == desc
        assert await local.show_partitions(cid) == await remote.show_partitions(cid)
        for part in desc.partitions:
            pid = part.partition_id
            l_ch, l_bin = await local.get_recovery_info(cid, pid)
            r_ch, r_bin = await remote.get_recovery_info(cid, pid)
            assert (l_ch, l_bin) == (r_ch, r_bin) and len(l_bin) >= 20
            some = [b.segment_id for b in l_bin[::3]] + [987_654]
            assert await local.get_recovery_info(cid, pid, some) == await remote.get_recovery_info(cid, pid, some)
            assert await local.get_recovery_info(cid, pid, []) == await remote.get_recovery_info(cid, pid, [])

        for call in (
            lambda b: b.describe_collection(cid + 5000),
            lambda b: b.show_partitions(cid + 5000),
            lambda b: b.get_recovery_info(cid, 1),
            lambda b: b.describe_collection(0),
        ):
            errors = []
            for broker in (local, remote):
                with pytest.raises(BrokerError) as info:
                    await call(broker)
                errors.append((info.value.code, info.value.reason))
            assert errors[0] == errors[1], errors
        with pytest.raises(BrokerError, match=f"NOT_FOUND: collection {cid + 5000} does not exist in the catalog"):
            await remote.describe_collection(cid + 5000)

        with pytest.raises(NotImplementedError):
            remote.watch_segments(0)
    finally:
        await remote.close()


async def test_grpc_broker_fails_fast_when_the_catalog_is_down_or_stuck(store: CatalogStore) -> None:
    srv, port = await start_catalog_server(store)
    broker = GrpcBroker(f"127.0.0.1:{port}", timeout=1.0)
    try:
        desc = await store.create_collection("gone")
        assert (await broker.describe_collection(desc.collection_id)).name == "gone"
        await srv.stop(None)
        started = time.perf_counter()
        with pytest.raises(BrokerError) as info:
            await asyncio.wait_for(broker.describe_collection(desc.collection_id), 10)  # hang guard, not a timing test
        print(f"\nstopped catalog: BrokerError after {time.perf_counter() - started:.3f}s: {info.value}")
        assert info.value.code in (common_pb2.META_UNAVAILABLE, common_pb2.TIMEOUT) and info.value.transient
        assert f"127.0.0.1:{port}" in info.value.reason
    finally:
        await broker.close()

    class Stuck(CatalogServicer):
        async def DescribeCollection(self, request, context):  # type: ignore[override]
            await asyncio.sleep(3600)

    stuck = grpc.aio.server()
    catalog_pb2_grpc.add_CatalogServicer_to_server(Stuck(store), stuck)
    port = stuck.add_insecure_port("127.0.0.1:0")
    await stuck.start()
    broker = GrpcBroker(f"127.0.0.1:{port}", timeout=0.5)
    try:
        with pytest.raises(BrokerError) as info:
            await asyncio.wait_for(broker.describe_collection(1), 10)
        assert info.value.code == common_pb2.TIMEOUT and "within 0.5s" in info.value.reason
    finally:
        await broker.close()
        await stuck.stop(None)


async def test_local_broker_maps_errors_and_watches(store: CatalogStore) -> None:
    broker = LocalBroker(store)
    with pytest.raises(BrokerError, match="NOT_FOUND: collection 7 does not exist in the catalog") as info:
        await broker.describe_collection(7)
    assert info.value.code == common_pb2.NOT_FOUND and not info.value.transient

    desc = await store.create_collection("lw")
    start = await store.revision() + 1
    stream = broker.watch_segments(start)
    (sid,) = await store.add_segments([seg(desc.partitions[0].partition_id)], collection_id=desc.collection_id)
    item = await asyncio.wait_for(anext(stream), 30)
    await stream.aclose()
    assert isinstance(item, SegmentChange) and [s.segment_id for s in item.added] == [sid]
