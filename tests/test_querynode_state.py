"""The reference query node's state, below gRPC: the fast paths of its checks and reads say what the long ones say."""

from __future__ import annotations

from collections.abc import Callable
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto import data_pb2, querynode_pb2
from querycoord.common.limits import DEFAULT_LIMITS, Limits
from querycoord.common.validate import InvalidField, text_ok
from querycoord.nodes import querynode_checks
from querycoord.nodes.querynode_checks import (
    _check_load_info,
    _check_load_infos,
    _paths_ok,
    _printable,
    check_node_request,
)
from querycoord.nodes.querynode_state import EC, HeldSegment, LoadColumns, NodeRefusal, QueryNodeState

PATHS = [
    [], ["a"], ["files/insert_log/1/2/3/0", "files/insert_log/1/2/3/1"], [""], ["a", ""], ["a\nb"], ["tab\there"],
    ["\x00"], ["ok", "bad\x7f"], ["x" * 10], ["x" * 11], ["é/ü/中文"], ["a b"], ["\u2028"], ["ok", "x" * 11],
]


@pytest.mark.parametrize("paths", PATHS)
def test_paths_fast_test_agrees_with_the_per_path_test(paths: list[str]) -> None:
    assert _paths_ok(paths, 10) == all(p and text_ok(p, 10) for p in paths)


@pytest.mark.parametrize("paths", [[""], ["bad\x00"], ["x" * (DEFAULT_LIMITS.max_text_length + 1)]])
def test_a_bad_path_is_still_refused(paths: list[str]) -> None:
    req = querynode_pb2.LoadSegmentsRequest(collection_id=1, node_id=1, infos=[
        data_pb2.SegmentLoadInfo(segment_id=5, collection_id=1, partition_id=2, binlog_paths=paths)])
    with pytest.raises(InvalidField):
        check_node_request("LoadSegments", req)


def load(state: QueryNodeState, coll: int, ids: list[int], compaction_from: tuple[int, ...] = ()) -> None:
    state.load_segments(querynode_pb2.LoadSegmentsRequest(collection_id=coll, infos=[
        data_pb2.SegmentLoadInfo(segment_id=i, collection_id=coll, partition_id=2, num_rows=10, mem_size=100,
                                 insert_channel="dml_0", compaction_from=compaction_from) for i in ids]))


def test_distribution_lists_every_segment_by_id_and_reuses_its_message() -> None:
    state = QueryNodeState(10_000, node_id=3)
    load(state, 1, [9, 4, 7])
    load(state, 2, [5])
    first = state.distribution()
    assert [s.segment_id for s in first.segments] == [4, 5, 7, 9]
    assert all(s.node_id == 3 and s.state == data_pb2.SEGMENT_STATE_SEALED for s in first.segments)
    assert [s.segment_id for s in state.segment_infos([], 1)] == [4, 7, 9]
    assert [s.segment_id for s in state.segment_infos([9, 4, 9], 0)] == [4, 9, 9], "asked ids as before: repeats kept"
    assert state.segment_infos([], 0)[0] is state.segment_infos([], 0)[0], "built once per held segment"
    state.node_id = 8  # a restarted node registering under a new id answers with it
    assert {s.node_id for s in state.distribution().segments} == {8}
    assert first.segments[0].node_id == 3, "an answer already given is a copy"


def test_a_negative_field_is_refused_by_name() -> None:
    state = QueryNodeState(10_000, node_id=3)
    for name in ("partition_id", "num_rows", "mem_size"):
        info = data_pb2.SegmentLoadInfo(segment_id=1, collection_id=1, partition_id=2, num_rows=1, mem_size=1)
        setattr(info, name, -1)
        with pytest.raises(NodeRefusal, match=f"{name} must be >= 0, got -1"):
            state.load_segments(querynode_pb2.LoadSegmentsRequest(collection_id=1, infos=[info]))
    assert not state.segments
    load(state, 1, [1], compaction_from=(7, 8))
    held = state.segments[1]
    assert (held.partition_id, held.num_rows, held.mem_size, held.insert_channel, held.compaction_from) == \
        (2, 10, 100, "dml_0", (7, 8))
    assert state.memory_used == 100
    assert list(state.distribution().segments[0].compaction_from) == [7, 8]


# ----- the bulk paths of a load (querynode_checks._check_load_infos, QueryNodeState._plain_new_segments) --------
SMALL = Limits(max_name_length=8, max_text_length=10, max_files_per_segment=2, max_ids_per_request=3, max_fields=2)
INT64_MAX = 2**63 - 1


def _index(name: str, paths: list[str]) -> data_pb2.IndexInfo:
    return data_pb2.IndexInfo(index_id=1, index_name=name, index_file_paths=paths)


# Infos the checks and the load accept (ids from a few, so that some repeat or are held), and any infos.
_valid_infos = st.builds(
    data_pb2.SegmentLoadInfo,
    segment_id=st.integers(1, 6),
    collection_id=st.sampled_from([1, 0]),
    partition_id=st.sampled_from([5, 6]),
    num_rows=st.sampled_from([10, 0]),
    mem_size=st.sampled_from([100, 0]),
    binlog_paths=st.sampled_from([["p/1", "p/2"], ["a"], []]),
    insert_channel=st.sampled_from(["dml_0", "dml_1", ""]),
)
_any_infos = st.builds(
    data_pb2.SegmentLoadInfo,
    segment_id=st.sampled_from([1, 2, 3, 4, 0, -1, INT64_MAX]),
    collection_id=st.sampled_from([1, 0, 2, -1]),
    partition_id=st.sampled_from([5, 6, 0, -1]),
    num_rows=st.sampled_from([10, 0, -1]),
    mem_size=st.sampled_from([100, 0, -1, 2**40]),
    binlog_paths=st.sampled_from([*PATHS, ["a", "b", "c"]]),
    insert_channel=st.sampled_from(["dml_0", "", "dml_1", "a b", "x" * 9, "\x00", "é", "\u2028"]),
    compaction_from=st.sampled_from([[], [], [7], [-1], [1, 2, 3, 4]]),
    index_infos=st.sampled_from([[], [], [_index("i", ["p"])], [_index("a b", [])], [_index("i", [""])],
                                 [_index("i", [])] * 3]),
)
_infos = st.one_of(_valid_infos, _valid_infos, _any_infos)


def _outcome(fn: Callable[[], object]) -> str:
    try:
        fn()
    except (InvalidField, NodeRefusal) as exc:
        return f"{type(exc).__name__} {getattr(exc, 'code', '')}: {exc}"
    return "ok"


@settings(max_examples=400, deadline=None)
@given(st.lists(_infos, max_size=6), st.booleans())
def test_the_bulk_check_of_load_infos_refuses_what_the_per_info_check_refuses(
        infos: list[data_pb2.SegmentLoadInfo], shared: bool) -> None:
    request = querynode_pb2.LoadSegmentsRequest(collection_id=1, node_id=1, infos=infos)

    def per_info() -> None:
        for info in request.infos:
            _check_load_info(info, SMALL)

    columns = LoadColumns.of(request.infos) if shared else None
    assert _outcome(lambda: _check_load_infos(request.infos, SMALL, columns)) == _outcome(per_info)
    got = _outcome(lambda: check_node_request("LoadSegments", request, SMALL, columns=columns))
    with patch.object(querynode_checks, "_plain_infos_ok", lambda *_: False):
        assert got == _outcome(lambda: check_node_request("LoadSegments", request, SMALL))


_BAD_VALUES = [("segment_id", 0), ("segment_id", -1), ("collection_id", -1), ("collection_id", 2),
               ("partition_id", -1), ("num_rows", -1), ("mem_size", -1), ("binlog_paths", [""]),
               ("binlog_paths", ["a", "b", "c"]), ("binlog_paths", ["x" * 11]), ("binlog_paths", ["tab\there"]),
               ("binlog_paths", ["a\x7f"]), ("insert_channel", "a b"), ("insert_channel", "x" * 9),
               ("insert_channel", "\x00"), ("insert_channel", "\u2028"), ("compaction_from", [7]),
               ("compaction_from", [-1]), ("compaction_from", [1, 2, 3, 4]), ("index_infos", [_index("i", ["p"])]),
               ("index_infos", [_index("a b", [])]), ("index_infos", [_index("i", [])] * 3)]


@pytest.mark.parametrize(("field", "value"), _BAD_VALUES)
@pytest.mark.parametrize("position", [0, 1, 2])
def test_one_odd_field_anywhere_gets_the_per_info_answer(field: str, value: object, position: int) -> None:
    infos = [data_pb2.SegmentLoadInfo(segment_id=i + 1, collection_id=1, partition_id=5, num_rows=1, mem_size=1,
                                      binlog_paths=["p/1"], insert_channel="dml_0") for i in range(3)]
    info = infos[position]
    if isinstance(value, list):
        getattr(info, field).extend(value)
    else:
        setattr(info, field, value)
    request = querynode_pb2.LoadSegmentsRequest(collection_id=1, node_id=1, infos=infos)
    columns = LoadColumns.of(request.infos)
    with patch.object(querynode_checks, "_plain_infos_ok", lambda *_: False):
        want = _outcome(lambda: check_node_request("LoadSegments", request, SMALL))
    assert _outcome(lambda: check_node_request("LoadSegments", request, SMALL, columns=columns)) == want
    bulk, per_info = QueryNodeState(100, node_id=1), QueryNodeState(100, node_id=1)
    got = _outcome(lambda: bulk.load_segments(request, columns=columns))
    with patch.object(QueryNodeState, "_plain_new_segments", lambda *_: None):
        assert got == _outcome(lambda: per_info.load_segments(request))
    assert bulk.segments == per_info.segments and bulk.memory_used == per_info.memory_used


def _state(held: list[data_pb2.SegmentLoadInfo]) -> QueryNodeState:
    state = QueryNodeState(2**40 + 300, node_id=1)
    if held:
        state.load_segments(querynode_pb2.LoadSegmentsRequest(collection_id=1, infos=held))
    return state


@settings(max_examples=400, deadline=None)
@given(st.lists(_infos, max_size=6), st.lists(_valid_infos, max_size=3), st.booleans())
def test_a_bulk_load_does_what_the_per_info_load_does(
        infos: list[data_pb2.SegmentLoadInfo], held: list[data_pb2.SegmentLoadInfo], shared: bool) -> None:
    try:
        bulk, per_info = _state(held), _state(held)
    except NodeRefusal:
        return  # not a state to start from
    request = querynode_pb2.LoadSegmentsRequest(collection_id=1, infos=infos)
    columns = LoadColumns.of(request.infos) if shared else None
    got = _outcome(lambda: bulk.load_segments(request, columns=columns))
    with patch.object(QueryNodeState, "_plain_new_segments", lambda *_: None):
        want = _outcome(lambda: per_info.load_segments(request))
    assert got == want
    assert bulk.segments == per_info.segments and list(bulk.segments) == list(per_info.segments)
    assert bulk.memory_used == per_info.memory_used
    mine, theirs = bulk.distribution(), per_info.distribution()
    mine.ClearField("incarnation")  # a random id of each state: the rest must agree, versions included
    theirs.ClearField("incarnation")
    assert mine == theirs


def test_a_plain_load_builds_the_segments_a_per_info_load_builds() -> None:
    infos = [data_pb2.SegmentLoadInfo(segment_id=i, collection_id=c, partition_id=5, num_rows=i, mem_size=3 * i,
                                      insert_channel=f"dml_{i % 2}", binlog_paths=["p"]) for i, c in [(4, 1), (2, 0)]]
    state = _state(infos)
    assert state.segments == {4: HeldSegment(4, 1, 5, 4, 12, "dml_0"), 2: HeldSegment(2, 1, 5, 2, 6, "dml_0")}
    assert all(type(s) is HeldSegment for s in state.segments.values())
    assert state.segments[2].compaction_from == () and state.segments[2].index_infos == ()
    assert state.memory_used == 18


@pytest.mark.parametrize("text", [chr(c) for c in range(256)] + ["", "files/a b", "a\tb", "é\x00", "中文", "\u2028"])
def test_the_fast_printable_test_is_isprintable(text: str) -> None:
    assert _printable(text) == text.isprintable()
    assert _printable(f"plain/{text}/path") == f"plain/{text}/path".isprintable()


def test_a_segment_released_and_loaded_again_is_read_as_loaded_the_second_time() -> None:
    state = QueryNodeState(10_000, node_id=3)
    load(state, 1, [1, 2])
    assert [s.partition_id for s in state.segment_infos([], 0)] == [2, 2]
    state.release_segments(querynode_pb2.ReleaseSegmentsRequest(segment_ids=[1]))
    state.load_segments(querynode_pb2.LoadSegmentsRequest(collection_id=4, infos=[
        data_pb2.SegmentLoadInfo(segment_id=1, partition_id=9, mem_size=1)]))
    assert [(s.collection_id, s.partition_id) for s in state.segment_infos([1, 2], 0)] == [(4, 9), (1, 2)]
    state.segments[2] = state.segments[2]._replace(num_rows=77)  # a held segment replaced in place
    assert state.segment_infos([2], 0)[0].num_rows == 77


def test_a_load_of_held_segments_adds_the_new_ones_and_refuses_a_move_of_partition() -> None:
    state = QueryNodeState(10_000, node_id=3)
    load(state, 1, [1, 2])
    load(state, 1, [1, 3, 3, 2])  # held or repeated: idempotent
    assert sorted(state.segments) == [1, 2, 3] and state.memory_used == 300
    moved = querynode_pb2.LoadSegmentsRequest(collection_id=1, infos=[
        data_pb2.SegmentLoadInfo(segment_id=4, collection_id=1, partition_id=2, mem_size=1),
        data_pb2.SegmentLoadInfo(segment_id=3, collection_id=1, partition_id=9, mem_size=1)])
    with pytest.raises(NodeRefusal, match=r"^segment 3 is held as collection 1 partition 2, but the request says "
                                          r"collection 1 partition 9; nothing loaded$") as refusal:
        state.load_segments(moved)
    assert refusal.value.code == EC.CONFLICT
    assert sorted(state.segments) == [1, 2, 3] and state.memory_used == 300


def test_a_dm_channel_release_drops_only_the_collections_named_watches() -> None:
    state = QueryNodeState(10_000, node_id=3)
    load(state, 1, [4])

    def watch(coll: int, name: str) -> None:
        state.watch_dm_channels(querynode_pb2.WatchDmChannelsRequest(collection_id=coll, infos=[
            data_pb2.VChannelInfo(collection_id=coll, channel_name=name)]))

    watch(1, "dml_0")
    watch(1, "dml_1")
    watch(2, "dml_2")
    dropped = state.release_dm_channels(querynode_pb2.ReleaseDmChannelsRequest(
        collection_id=1, channel_names=["dml_0", "dml_2", "absent"]))
    assert dropped == 1, "another collection's watch and an absent one are not this request's to drop"
    assert sorted(state.dm_channels) == ["dml_1", "dml_2"] and set(state.segments) == {4}
    with pytest.raises(NodeRefusal):
        state.release_dm_channels(querynode_pb2.ReleaseDmChannelsRequest(collection_id=1, channel_names=[""]))
    assert sorted(state.dm_channels) == ["dml_1", "dml_2"]
