"""Reads of a node's copies that a checker pass, a drain or a balance makes often: without a view per copy, or with
turns of the event loop while the views are built.

Against a real etcd: ``read_segments_on_node`` answers what ``segments_on_node`` answers (one collection's copies
when asked) and gives the loop turns while it builds them (a coroutine beside it ran in between); the id and size
reads agree with the views.
"""

from __future__ import annotations

import asyncio

import pytest

from meta.fence import Fence
from meta.kv import MetaKV
from proto import data_pb2
from querycoord.common.yielding import TURN_EVERY
from querycoord.querymeta import QueryMeta
from tests.leader import leader_fence
from tests.test_querymeta import COLL

SEGMENTS = 2 * TURN_EVERY + 500  # three chunks on node 2


@pytest.fixture
async def meta(kv: MetaKV) -> QueryMeta:
    """The leader's QueryMeta with collection 1 (SEGMENTS on node 2, 50 on node 3) and collection 2 (20 on
    node 2)."""
    fence: Fence = await leader_fence(kv)
    m = QueryMeta(kv.fenced(fence))
    await m.reload()
    await m.add_collection(1, COLL, [10, 11])
    await m.add_collection(2, COLL, [20])
    await m.save_loaded(infos(1, 1, SEGMENTS), 2, 0)
    await m.save_loaded(infos(1, SEGMENTS + 1, 50), 3, 0)
    await m.save_loaded(infos(2, 100_000, 20, partitions=(20,)), 2, 0)
    return m


def infos(cid: int, first: int, count: int, *, partitions: tuple[int, ...] = (10, 11)
          ) -> list[data_pb2.SegmentLoadInfo]:
    return [data_pb2.SegmentLoadInfo(segment_id=i, collection_id=cid, partition_id=partitions[i % len(partitions)],
                                     num_rows=i, mem_size=7 * i, insert_channel="dml_0")
            for i in range(first, first + count)]


async def test_the_read_answers_the_views_of_segments_on_node(meta: QueryMeta) -> None:
    assert await meta.read_segments_on_node(2) == meta.segments_on_node(2)
    assert await meta.read_segments_on_node(2, 1) == [s for s in meta.segments_on_node(2) if s.collection_id == 1]
    assert [s.segment_id for s in await meta.read_segments_on_node(2, 2)] == list(range(100_000, 100_020))
    assert await meta.read_segments_on_node(2, 99) == []
    assert await meta.read_segments_on_node(77) == []


async def test_the_read_gives_the_loop_turns_while_it_builds_the_views(meta: QueryMeta) -> None:
    reading = asyncio.create_task(meta.read_segments_on_node(2, 1))
    turns = 0
    while not reading.done():  # this coroutine runs only when the read gives the loop a turn
        turns += 1
        await asyncio.sleep(0)
    assert len(await reading) == SEGMENTS
    assert turns >= 2, "one turn per chunk of TURN_EVERY views"


async def test_ids_and_sizes_agree_with_the_views(meta: QueryMeta) -> None:
    views = meta.segments_on_node(2)
    by_coll: dict[int, list[int]] = {}
    for s in views:
        by_coll.setdefault(s.collection_id, []).append(s.segment_id)
    assert meta.segment_ids_by_collection_on_node(2) == by_coll
    assert meta.segment_ids_on_node_of(2, 1) == by_coll[1]
    assert meta.segment_sizes_on_node(2, 2) == [(s.segment_id, s.mem_size) for s in views if s.collection_id == 2]
    assert meta.segment_ids_by_collection_on_node(77) == {} and meta.segment_sizes_on_node(77, 1) == []
