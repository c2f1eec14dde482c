"""The reference query node's state, below gRPC: the fast paths of its checks and reads say what the long ones say."""

from __future__ import annotations

import pytest

from proto import data_pb2, querynode_pb2
from querycoord.limits import DEFAULT_LIMITS
from querycoord.nodes.querynode_checks import _paths_ok, check_node_request
from querycoord.nodes.querynode_state import NodeRefusal, QueryNodeState
from querycoord.validate import InvalidField, text_ok

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
