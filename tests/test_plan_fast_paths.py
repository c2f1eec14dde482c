"""Planning's fast paths give what the plain per-segment forms gave, on random inputs (hypothesis).

Each fast path (bulk catalog parse, per-channel flushed ids, merging by bisected running sums, references and the
request sent, the held filter, channel merging with kept sets) is compared with the loop or the messages it replaced.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from proto import data_pb2, querynode_pb2
from querycoord.catalog import binlogs as catalog_binlogs
from querycoord.task import triggers
from querycoord.task.assign import (
    Planned,
    _merge_by_size_loop,
    add_refs,
    fill_load_info,
    merge_by_size,
    sent_request,
)
from querycoord.task.triggers import _LoadTrigger, merge_channel

CHANNELS = ["dml_0", "dml_1", "dml_2"]
ids = st.integers(min_value=0, max_value=2**62)


@st.composite
def segment_binlogs(draw: st.DrawFn) -> data_pb2.SegmentBinlogs:
    """A catalog segment, sometimes with compaction sources, indexes, long paths or an unknown channel."""
    b = data_pb2.SegmentBinlogs(
        segment_id=draw(ids), collection_id=draw(ids), partition_id=draw(st.integers(0, 3)),
        num_rows=draw(ids), mem_size=draw(ids), insert_channel=draw(st.sampled_from([*CHANNELS, "", "other"])),
        binlog_paths=draw(st.lists(st.text(min_size=1, max_size=300), max_size=3)),
        compaction_from=draw(st.lists(ids, max_size=2)),
    )
    for _ in range(draw(st.integers(0, 2))):
        b.index_infos.add(field_id=draw(ids), index_name=draw(st.text(max_size=5)),
                          index_file_paths=draw(st.lists(st.text(max_size=20), max_size=2)))
    return b


def _old_flushed(channels: list[data_pb2.VChannelInfo], binlogs: list[data_pb2.SegmentBinlogs]) -> None:
    """get_recovery_page's loop as it was."""
    by_name = {c.channel_name: c for c in channels}
    for seg in binlogs:
        ch = by_name.get(seg.insert_channel)
        if ch is not None:
            ch.flushed_segment_ids.append(seg.segment_id)


@settings(max_examples=60, deadline=None)
@given(st.lists(segment_binlogs(), max_size=40), st.integers(1, 7))
def test_bulk_parse_gives_the_messages_of_parsing_each_record(binlogs: list[data_pb2.SegmentBinlogs],
                                                              chunk: int) -> None:
    values = [b.SerializeToString() for b in binlogs]
    saved = catalog_binlogs.PARSE_CHUNK
    catalog_binlogs.PARSE_CHUNK = chunk  # pages of records cross chunk boundaries
    try:
        parsed = catalog_binlogs.parse_binlogs(values)
    finally:
        catalog_binlogs.PARSE_CHUNK = saved
    assert parsed == catalog_binlogs.parse_each(values) == binlogs
    assert [p.SerializeToString() for p in parsed] == values


def test_a_record_over_16_kib_is_framed_with_a_three_byte_length() -> None:
    big = data_pb2.SegmentBinlogs(segment_id=1, binlog_paths=["p" * 40_000])
    values = [big.SerializeToString(), data_pb2.SegmentBinlogs(segment_id=2).SerializeToString()]
    assert catalog_binlogs.parse_binlogs(values) == catalog_binlogs.parse_each(values)


def test_an_unreadable_record_fails_the_parse_as_it_did_alone() -> None:
    good = data_pb2.SegmentBinlogs(segment_id=1).SerializeToString()
    values = [good, b"\x0a\xff", good]
    with pytest.raises(DecodeError) as alone:
        catalog_binlogs.parse_each(values)
    with pytest.raises(DecodeError) as bulk:
        catalog_binlogs.parse_binlogs(values)
    assert str(bulk.value) == str(alone.value)


@settings(max_examples=60, deadline=None)
@given(st.lists(segment_binlogs(), max_size=40), st.lists(st.sampled_from(CHANNELS), max_size=4))
def test_flushed_ids_per_channel_are_the_per_segment_loops(binlogs: list[data_pb2.SegmentBinlogs],
                                                           names: list[str]) -> None:
    new = [data_pb2.VChannelInfo(collection_id=1, channel_name=n) for n in names]
    old = [data_pb2.VChannelInfo(collection_id=1, channel_name=n) for n in names]
    catalog_binlogs.add_flushed(new, binlogs)
    _old_flushed(old, binlogs)
    assert new == old


def _sized(n: int) -> data_pb2.SegmentBinlogs:
    return data_pb2.SegmentBinlogs(segment_id=n, binlog_paths=["x" * (n % 300)])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2000), max_size=60), st.integers(-10, 3000), st.integers(-2, 8))
def test_merge_by_size_groups_as_the_loop(sizes: list[int], limit: int, max_items: int) -> None:
    infos = [_sized(n) for n in sizes]
    assert merge_by_size(infos, limit, max_items=max_items) == _merge_by_size_loop(infos, limit, max_items=max_items)
    assert merge_by_size(tuple(infos), limit) == _merge_by_size_loop(infos, limit)


def _planned(items: list[tuple[data_pb2.SegmentBinlogs, bool]]) -> list[Planned]:
    """Catalog binlogs, and some filled load infos as a reschedule plans from."""
    return [data_pb2.SegmentLoadInfo(segment_id=b.segment_id, partition_id=b.partition_id,
                                     binlog_paths=b.binlog_paths, index_infos=b.index_infos) if as_info else b
            for b, as_info in items]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(segment_binlogs(), st.booleans()), max_size=20))
def test_references_are_the_planned_segments_in_order(items: list[tuple[data_pb2.SegmentBinlogs, bool]]) -> None:
    planned = _planned(items)
    before = [p.SerializeToString() for p in planned]
    refs = querynode_pb2.SegmentRefs()
    add_refs(refs, planned)
    assert list(refs.segment_ids) == [p.segment_id for p in planned]
    assert list(refs.partition_ids) == [p.partition_id for p in planned]
    assert [p.SerializeToString() for p in planned] == before, "the planned messages are left as they were"


@st.composite
def records(draw: st.DrawFn) -> querynode_pb2.LoadSegmentsRequest:
    """A child's persisted request: its fields, its references, and sometimes the stripped infos of a record
    written before references existed."""
    rec = querynode_pb2.LoadSegmentsRequest(collection_id=draw(ids), replica_id=draw(ids), task_id=draw(ids),
                                            source_node_id=draw(ids), node_id=draw(ids),
                                            load_type=draw(st.sampled_from([data_pb2.LOAD_TYPE_COLLECTION,
                                                                            data_pb2.LOAD_TYPE_PARTITION])))
    if draw(st.booleans()):
        rec.fence.leader_revision = draw(ids)
    rec.planned.segment_ids.extend(draw(st.lists(ids, max_size=4)))
    if draw(st.booleans()):
        rec.infos.add(segment_id=1, partition_id=2)
    return rec


FIELDS = ("segment_id", "collection_id", "partition_id", "num_rows", "mem_size", "binlog_paths", "insert_channel",
          "compaction_from", "index_infos")


@settings(max_examples=100, deadline=None)
@given(records(), st.lists(st.tuples(segment_binlogs(), st.booleans()), max_size=12))
def test_the_sent_request_is_every_field_of_the_record_and_the_planned_segments(
        rec: querynode_pb2.LoadSegmentsRequest, items: list[tuple[data_pb2.SegmentBinlogs, bool]]) -> None:
    """``sent_request``: the record's every field but its references and infos; the catalog's binlogs sent as
    planned, or (a filled load info among them) every segment as the load info a node would read the binlogs as."""
    planned = _planned(items)
    before = rec.SerializeToString()
    sent = sent_request(rec, planned)
    rest = querynode_pb2.LoadSegmentsRequest()
    rest.CopyFrom(rec)
    rest.ClearField("planned")
    del rest.infos[:]
    shown = querynode_pb2.LoadSegmentsRequest()
    shown.CopyFrom(sent)
    del shown.infos[:]
    del shown.binlogs[:]
    assert shown == rest
    assert not sent.HasField("planned")
    as_infos = [fill_load_info(data_pb2.SegmentLoadInfo(), p) if isinstance(p, data_pb2.SegmentBinlogs) else p
                for p in planned]
    if all(isinstance(p, data_pb2.SegmentBinlogs) for p in planned):
        assert list(sent.binlogs) == planned and not sent.infos
        # A node reads each binlog as the load info it would otherwise have been sent (the same field names).
        assert [[getattr(b, f) for f in FIELDS] for b in sent.binlogs] == [[getattr(i, f) for f in FIELDS]
                                                                            for i in as_infos]
    else:
        assert list(sent.infos) == as_infos and not sent.binlogs
    assert rec.SerializeToString() == before, "the record is left as it was"


def _old_merge_channel(into: data_pb2.VChannelInfo, other: data_pb2.VChannelInfo) -> None:
    for field in ("unflushed_segment_ids", "flushed_segment_ids", "dropped_segment_ids"):
        have = set(getattr(into, field))
        getattr(into, field).extend(x for x in getattr(other, field) if x not in have)


small_ids = st.lists(st.integers(0, 12), max_size=8)
channel_infos = st.builds(lambda u, f, d: data_pb2.VChannelInfo(channel_name="c", unflushed_segment_ids=u,
                                                              flushed_segment_ids=f, dropped_segment_ids=d),
                          small_ids, small_ids, small_ids)


@settings(max_examples=100, deadline=None)
@given(st.lists(channel_infos, min_size=1, max_size=6))
def test_merging_with_kept_sets_is_merging_afresh(chans: list[data_pb2.VChannelInfo]) -> None:
    new, old = data_pb2.VChannelInfo(), data_pb2.VChannelInfo()
    new.CopyFrom(chans[0])
    old.CopyFrom(chans[0])
    known: dict[str, set[int]] = {}
    for c in chans[1:]:
        merge_channel(new, c, known)
        _old_merge_channel(old, c)
        assert new == old
    merge_channel(new, chans[-1])
    _old_merge_channel(old, chans[-1])
    assert new == old


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), max_size=50), st.dictionaries(st.integers(1, 30),
       st.lists(st.tuples(st.integers(1, 3), st.integers(0, 4)), max_size=3), max_size=15), st.integers(1, 3),
       st.integers(1, 7))
def test_the_held_filter_is_held_segment_by_segment(seg_ids: list[int], recorded: dict[int, list[tuple[int, int]]],
                                                    replica: int, every: int) -> None:
    """A slice none of whose segments meta records is taken whole; any other is asked segment by segment."""
    places = {sid: (1, 1, tuple(x for pair in copies for x in pair)) for sid, copies in recorded.items()}
    meta = SimpleNamespace(
        segment_places=lambda: places,
        segment_copies=lambda sid: dict(zip(places[sid][2][::2], places[sid][2][1::2], strict=True))
        if sid in places else {},
    )
    nodes = SimpleNamespace(is_online=lambda node: node in (1, 2))
    trig = SimpleNamespace(env=SimpleNamespace(meta=meta, nodes=nodes))
    trig.replica_holds = lambda sid, rid: _LoadTrigger.replica_holds(trig, sid, rid)  # type: ignore[arg-type]
    binlogs = [data_pb2.SegmentBinlogs(segment_id=s) for s in seg_ids]
    out: list[Planned] = []
    saved = triggers.TURN_EVERY
    triggers.TURN_EVERY = every
    try:
        held = asyncio.run(_LoadTrigger.not_held(trig, binlogs, replica, out))  # type: ignore[arg-type]
    finally:
        triggers.TURN_EVERY = saved
    expected = [b for b in binlogs if not _LoadTrigger.replica_holds(trig, b.segment_id, replica)]  # type: ignore[arg-type]
    assert out == expected
    assert held == len(binlogs) - len(expected)
