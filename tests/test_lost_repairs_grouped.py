"""A lost node's repair built per record place (``checkers.lost``) holds exactly what the per-segment rule gives, for
one lost node or several together (a takeover's gone nodes): random records over collections, partitions (loaded or
not), replicas (existing or not) and targets (a segment compacted away, a partition the catalog lacks), on a real
query meta index and a real followed catalog copy's reads (``CatalogTargets`` shape, in memory)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from meta.kv import MetaKV
from proto import data_pb2
from querycoord.checkers.lost import READ_AHEAD_PARTS, lost_copy_count, lost_repairs, replica_of_copy
from querycoord.common.target import TargetSegment
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import set_copies

NODES = (1, 2, 3, 4)
REPLICAS = (7, 8)
COLLECTIONS = (1, 2)
PARTITIONS = (10, 11, 12)  # 12 is never loaded


class Targets:
    """What ``lost`` reads of the followed catalog copy: a partition's segments, a collection's DM channels."""

    def __init__(self, segments: dict[tuple[int, int], dict[int, TargetSegment]]):
        self.segments = segments

    def partition_segments(self, cid: int, pid: int) -> Mapping[int, TargetSegment] | None:
        part = self.segments.get((cid, pid))
        return None if part is None else MappingProxyType(part)

    def dm_channels(self, cid: int) -> tuple[str, ...] | None:
        return (f"dml-{cid}",)


def reference(meta: QueryMeta, targets: Targets, node_id: int, skip: set[int]) -> set[tuple[int, ...]]:
    """The per-segment rule: every copy on ``node_id`` of a target segment of a loaded partition, in a replica that
    exists, of a collection not skipped; as (collection, segment, partition, node, replica, size)."""
    out: set[tuple[int, ...]] = set()
    places = meta.segment_places()
    for sid in meta.segment_ids_on_node(node_id):
        cid, pid, flat = places[sid]
        replica = replica_of_copy(flat, node_id)
        if cid in skip or replica is None or replica not in meta.replica_ids(cid) or not meta.has_partition(cid, pid):
            continue
        part = targets.partition_segments(cid, pid)
        seg = part.get(sid) if part is not None else None
        if seg is not None:
            out.add((cid, sid, pid, node_id, replica, seg.mem_size))
    return out


def entries(repairs: Mapping[int, Any]) -> list[tuple[int, ...]]:
    return [(cid, s.segment_id, s.partition_id, s.node_id, s.replica_id, s.mem_size)
            for cid, req in repairs.items() for s in req.missing_segments]


records = st.lists(st.tuples(
    st.sampled_from(COLLECTIONS), st.sampled_from(PARTITIONS),
    st.dictionaries(st.sampled_from((*REPLICAS, 9)), st.sampled_from(NODES), min_size=1, max_size=2),
    st.booleans(), st.integers(1, 1 << 20)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(records=records, lost=st.sets(st.sampled_from(NODES), min_size=1), skip=st.sets(st.sampled_from(COLLECTIONS)),
       replicas_of=st.dictionaries(st.sampled_from(COLLECTIONS), st.sets(st.sampled_from(REPLICAS))),
       budget=st.sampled_from((0, 0, 40, 200, 1000)))
def test_the_grouped_build_gives_what_the_per_segment_rule_gives(
        records: list[tuple[int, int, dict[int, int], bool, int]], lost: set[int], skip: set[int],
        replicas_of: dict[int, set[int]], budget: int) -> None:
    meta = QueryMeta(cast(MetaKV, None))  # never written: only the in-memory index is read
    for cid in COLLECTIONS:
        info = data_pb2.CollectionLoadInfo(collection_id=cid, load_type=data_pb2.LOAD_TYPE_COLLECTION)
        for pid in PARTITIONS[:2]:
            info.partitions.add(partition_id=pid, state=data_pb2.PARTITION_STATE_IN_MEMORY)
        for r in sorted(replicas_of.get(cid, set(REPLICAS))):
            info.replicas.add(replica_id=r, collection_id=cid)
        meta.index.put_collection(info)
    segments: dict[tuple[int, int], dict[int, TargetSegment]] = {(cid, 10): {} for cid in COLLECTIONS}  # 11: none
    for i, (cid, pid, copies, in_target, size) in enumerate(records):
        sid = 1000 + i
        meta.index.put_segment(set_copies(data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=pid,
                                                               state=data_pb2.SEGMENT_STATE_SEALED), copies))
        if in_target and (cid, pid) in segments:
            segments[(cid, pid)][sid] = TargetSegment(sid, pid, (), size)
    targets = Targets(segments)
    built = lost_repairs(meta, cast(Any, targets), sorted(lost), [], skip, budget=budget)
    assert built.copies == {cid: n for cid in COLLECTIONS
                            if cid not in skip and (n := lost_copy_count(meta, sorted(lost), cid))}
    together = entries(built.requests)
    expected = set().union(*(reference(meta, targets, n, skip) for n in lost))
    assert len(together) == len(set(together)), "each copy once"
    if budget and built.later:  # cut at the budget: a part of what the rule gives, the rest counted for later
        assert set(together) <= expected
        for cid, later in built.later.items():
            assert later > 0 and built.requests[cid].missing_segments, "a cut request holds something"
            parts = built.ahead.get(cid, [])
            size = len(built.requests[cid].missing_segments)
            assert 0 < len(parts) <= READ_AHEAD_PARTS
            assert all(0 < sum(map(len, part.values())) <= size for part in parts), "each part at most a request"
            named = [sid for part in parts for ids in part.values() for sid in ids]
            assert len(named) == len(set(named)) == min(later, size * READ_AHEAD_PARTS), "the first later copies"
            assert not {sid for c, sid, *_r in together if c == cid} & set(named), "named later: not built now"
    else:
        assert set(together) == expected
    for n in lost:
        assert set(entries(lost_repairs(meta, cast(Any, targets), [n], [], skip).requests)) == reference(
            meta, targets, n, skip)
    assert all(cid not in skip for cid, *_rest in together)
