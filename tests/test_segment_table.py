"""SegmentTable: query meta's segment records kept serialized, with their places shared (pure, no etcd needed)."""

from __future__ import annotations

import random

from proto import data_pb2
from querycoord.querymeta.copies import set_copies
from querycoord.querymeta.index import MetaIndex, SegmentTable


def record(sid: int, pid: int, copies: dict[int, int], mem: int = 100) -> data_pb2.SegmentInfo:
    return set_copies(data_pb2.SegmentInfo(segment_id=sid, collection_id=7, partition_id=pid, mem_size=mem,
                                           num_rows=10, state=data_pb2.SEGMENT_STATE_SEALED), copies)


def test_a_record_reads_back_equal_and_each_read_is_the_callers_own() -> None:
    table = SegmentTable()
    rec = record(1, 10, {1000: 3, 1001: 4})
    table.put(rec)
    rec.mem_size = 999  # changing the caller's message afterwards changes nothing stored
    got = table[1]
    assert got == record(1, 10, {1000: 3, 1001: 4})
    got.node_id = 42
    assert table[1].node_id == 3 and table.get(1) == table[1] and table.get(2) is None
    assert table.place(1) == (7, 10, (1000, 3, 1001, 4))
    assert 1 in table and 2 not in table and len(table) == 1 and list(table) == [1]


def test_places_are_shared_between_segments_with_the_same_values() -> None:
    table = SegmentTable()
    for sid in range(100):
        table.put(record(sid, 10 + sid % 2, {1000: 1 + sid % 3}))
    places = table.places()
    assert len({id(p) for p in places.values()}) == 6  # 2 partitions x 3 nodes
    assert table.pop(5) is not None and table.pop(5) is None and 5 not in places


def test_the_shared_places_stay_bounded_after_churn() -> None:
    """Places of released collections are forgotten: the sharing dict never outgrows the records by much."""
    table = SegmentTable()
    for sid in range(20_000):  # every segment its own place, then dropped
        table.put(record(sid, sid, {1000: 1}))
        table.pop(sid)
    assert table.distinct_places <= 4097
    assert len(table) == 0


def test_the_index_keeps_node_memory_and_partitions_from_records_it_does_not_hold_as_objects() -> None:
    index = MetaIndex()
    index.put_segment(record(1, 10, {1000: 3}, mem=100))
    index.put_segment(record(2, 10, {1000: 3, 1001: 4}, mem=50))
    index.put_segment(record(1, 11, {1000: 5}, mem=70))  # moved partition and node
    assert index.memory_by_node == {3: 50, 4: 50, 5: 70}
    assert index.segments_by_partition == {7: {10: {2}, 11: {1}}}
    index.drop_segment(2)
    assert index.memory_by_node == {5: 70} and index.segments_by_node == {5: {1}}


def _indexes(index: MetaIndex) -> tuple[object, ...]:
    return (dict(index.segments.places()), {s: index.segments[s] for s in index.segments},
            index.segments_by_partition, index.segments_by_node, index.memory_by_node, index.copies_by_node)


def test_put_new_segments_indexes_as_put_segment_does_and_replaces_what_is_there() -> None:
    """The load path's bulk insert must leave every index exactly as one ``put_segment`` per record would,
    also for a segment recorded meanwhile (replaced, its old node's memory given back)."""
    records = [record(sid, 10 + sid % 2, {1000 + sid % 2: 1 + sid % 3}, mem=100 + sid) for sid in range(1, 300)]
    one_by_one, bulk = MetaIndex(), MetaIndex()
    for index in (one_by_one, bulk):
        index.put_segment(record(5, 12, {1000: 9}, mem=7))  # there already, elsewhere
    for rec in records:
        one_by_one.put_segment(rec)
    rows = [(r.segment_id, 7, r.partition_id, r.replica_ids[0], r.node_ids[0], r.mem_size, r.SerializeToString())
            for r in records]
    bulk.put_new_segments(rows, 0, 100)
    bulk.put_new_segments(rows, 100, len(rows))
    assert _indexes(bulk) == _indexes(one_by_one)
    assert 9 not in bulk.memory_by_node and 12 not in bulk.segments_by_partition[7]


def test_put_new_segments_replacing_records_of_every_shape_indexes_as_put_segment_does() -> None:
    """A repair's saves replace records (the lost node's copy) by place, not one ``drop_segment`` each: after random
    records of one to three copies, several collections and partitions, and bulk saves that replace some of them
    (in the same partition, another partition or collection, on the same or another node), every index equals the
    one a ``put_segment`` per record builds."""
    rng = random.Random(11)
    for _round in range(40):
        one_by_one, bulk = MetaIndex(), MetaIndex()
        for sid in rng.sample(range(500), 250):
            nodes = rng.choices(range(1, 7), k=rng.randint(1, 3))  # a node twice too (never in a valid replica set)
            rec = set_copies(data_pb2.SegmentInfo(segment_id=sid, collection_id=rng.choice((7, 8)),
                                                  partition_id=10 + rng.randrange(3), mem_size=rng.randint(1, 900),
                                                  state=data_pb2.SEGMENT_STATE_SEALED),
                             {1000 + i: n for i, n in enumerate(nodes)})
            for index in (one_by_one, bulk):
                index.put_segment(rec)
        for _save in range(rng.randint(1, 4)):
            cid, pid, node = rng.choice((7, 8)), 10 + rng.randrange(3), rng.randrange(1, 8)
            start = rng.randrange(500)
            rows = []
            for sid in range(start, min(start + rng.randint(1, 120), 500)):
                rec = set_copies(data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=pid,
                                                      mem_size=rng.randint(1, 900),
                                                      state=data_pb2.SEGMENT_STATE_SEALED), {1001: node})
                one_by_one.put_segment(rec)
                rows.append((sid, cid, pid, 1001, node, rec.mem_size, rec.SerializeToString()))
            bulk.put_new_segments(rows, 0, len(rows))
        assert _indexes(bulk) == _indexes(one_by_one)


def _counted(index: MetaIndex) -> dict[int, dict[int, int]]:
    """``copies_by_node`` recomputed from the records."""
    out: dict[int, dict[int, int]] = {}
    for sid in index.segments:
        seg = index.segments[sid]
        for node in set(seg.node_ids):
            per = out.setdefault(node, {})
            per[seg.collection_id] = per.get(seg.collection_id, 0) + 1
    return out


def test_the_copies_counted_by_node_and_collection_follow_every_change() -> None:
    """``copies_by_node`` answers a lost node's forget and each part of its repair without a walk over its copies:
    after random puts, moves, bulk inserts and drops over three collections it equals a count from the records."""
    rng = random.Random(7)
    index = MetaIndex()
    for step in range(3000):
        sid, cid = rng.randrange(400), rng.choice((7, 8, 9))
        roll = rng.random()
        if roll < 0.5:
            nodes = rng.sample(range(1, 6), rng.randint(1, 3))
            index.put_segment(set_copies(
                data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=10 + sid % 3, mem_size=100,
                                     state=data_pb2.SEGMENT_STATE_SEALED),
                {1000 + i: n for i, n in enumerate(nodes)}))
        elif roll < 0.7:
            node = rng.randrange(1, 6)
            rows = [(s, cid, 10, 1000, node, 100, set_copies(
                data_pb2.SegmentInfo(segment_id=s, collection_id=cid, partition_id=10, mem_size=100,
                                     state=data_pb2.SEGMENT_STATE_SEALED), {1000: node}).SerializeToString())
                    for s in range(sid, min(sid + rng.randint(1, 20), 400))]
            index.put_new_segments(rows, 0, len(rows))
        else:
            index.drop_segment(sid)
        if step % 100 == 0:
            assert index.copies_by_node == _counted(index)
    assert index.copies_by_node == _counted(index)
    for sid in list(index.segments):
        index.drop_segment(sid)
    assert index.copies_by_node == {}
