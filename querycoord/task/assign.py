"""The pieces ``children.plan_children`` plans with: node usage, request merging, what is persisted and sent.

Milvus's ``assignInternalTask``: segments are allocated memory-aware and
merged per (collection, node) into LoadSegments requests of at most
``max_request_bytes`` *as sent* (binlog paths included); DM channels go to
the nodes watching the fewest. Every node that receives work also gets its
delta-channel watch and query channel (idempotent on the node). What is
persisted of a load is its segments by reference (``add_refs``: ids and
partitions; the rest is read from the catalog again after a reload), so a
child's record stays small whatever the segments carry.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add, attrgetter, itemgetter, methodcaller
from typing import TypeVar

from google.protobuf.message import Message

from proto import data_pb2, querynode_pb2
from querycoord.common.messages import LoadItem, copy_without
from querycoord.common.yielding import TURN_EVERY

M = TypeVar("M", bound=Message)
_BYTE_SIZE = methodcaller("ByteSize")
_SEGMENT_ID = attrgetter("segment_id")
_PARTITION_ID = attrgetter("partition_id")
_ID_AND_MEM_SIZE = attrgetter("segment_id", "mem_size")
_FIRST = itemgetter(0)


def query_channels(collection_id: int) -> tuple[str, str]:
    return f"query-{collection_id}", f"query-result-{collection_id}"


# What a load is planned from: the catalog's binlogs, or a load info that was already filled (a reschedule).
Planned = LoadItem


def fill_load_info(info: data_pb2.SegmentLoadInfo, b: data_pb2.SegmentBinlogs) -> data_pb2.SegmentLoadInfo:
    """Write what a node needs to load a catalog segment, every field of its binlogs, into ``info`` (an empty
    message, often one just added to a request: built in place, not copied in). Fields named, not found through
    the descriptors as ``messages.copy_fields`` does: this runs once per segment of every load
    (tests/test_load_plan.py checks it copies every field the two messages share)."""
    info.segment_id = b.segment_id
    info.partition_id = b.partition_id
    info.collection_id = b.collection_id
    info.num_rows = b.num_rows
    info.mem_size = b.mem_size
    info.insert_channel = b.insert_channel
    info.binlog_paths.extend(b.binlog_paths)
    if b.compaction_from:
        info.compaction_from.extend(b.compaction_from)
    if b.index_infos:
        info.index_infos.extend(b.index_infos)
    return info


def add_refs(refs: querynode_pb2.SegmentRefs, planned: Sequence[Planned]) -> None:
    """Reference ``planned`` in ``refs`` (the ``planned`` field of a child's persisted request): their segment
    ids and partitions, in order, each column read and added in C.

    Why references: everything else about a segment is the catalog's, which the child reads again if it has to be
    sent after a reload. A stripped load info per segment cost a message built and written to etcd on the way to
    every load's commit point (tests/test_plan_fast_paths.py checks the references against the plan).
    """
    refs.segment_ids.extend(map(_SEGMENT_ID, planned))
    refs.partition_ids.extend(map(_PARTITION_ID, planned))


def sent_request(persisted: querynode_pb2.LoadSegmentsRequest,
                 planned: Sequence[Planned]) -> querynode_pb2.LoadSegmentsRequest:
    """The request to send for ``persisted`` (a child's record) carrying ``planned``: every field of ``persisted``
    but its references (and the stripped infos of a record written before references existed), and ``planned``
    as its ``binlogs`` when every one is the catalog's (sent as read: one copy in C), else as its ``infos`` (a
    reschedule's or a balance's load infos, filled already; a catalog binlog among them becomes a load info).

    Why binlogs when it can: filling a load info per segment cost more than the node's whole handling of it.
    """
    req = copy_without(persisted, "planned", "infos")
    if set(map(type, planned)) <= {data_pb2.SegmentBinlogs}:
        req.binlogs.extend(planned)
        return req
    infos = req.infos
    for p in planned:
        if type(p) is data_pb2.SegmentBinlogs:
            fill_load_info(infos.add(), p)
        else:
            infos.append(p)
    return req


def segment_load_info(b: data_pb2.SegmentBinlogs) -> data_pb2.SegmentLoadInfo:
    """What a node needs to load a catalog segment: every field of its binlogs."""
    return fill_load_info(data_pb2.SegmentLoadInfo(), b)


def strip_channel(info: data_pb2.VChannelInfo) -> data_pb2.VChannelInfo:
    out = data_pb2.VChannelInfo()
    out.CopyFrom(info)
    del out.flushed_segment_ids[:]
    del out.dropped_segment_ids[:]
    return out


def segment_sizes(segments: Sequence[Planned]) -> list[tuple[int, int]]:
    """(segment id, mem size) of each segment, as the allocator takes them (read in C: once per segment)."""
    return list(map(_ID_AND_MEM_SIZE, segments))


async def segment_sizes_with_turns(segments: Sequence[Planned]) -> list[tuple[int, int]]:
    """``segment_sizes``, with a turn of the event loop every ``8 * TURN_EVERY`` segments (a million of them read
    in one stretch held the loop for a third of a second)."""
    step = 8 * TURN_EVERY
    out: list[tuple[int, int]] = []
    for start in range(0, len(segments), step):
        if start:
            await asyncio.sleep(0)
        out += map(_ID_AND_MEM_SIZE, segments[start:start + step])
    return out


async def segments_by_node(segments: Sequence[Planned], sizes: Sequence[tuple[int, int]],
                           node_of: dict[int, int]) -> dict[int, list[Planned]]:
    """``segments`` by the node ``node_of`` places each on, in their order, with a turn every ``TURN_EVERY``
    segments (a plain loop over slices: an async generator step per segment cost more than the grouping).

    ``sizes`` are ``segment_sizes(segments)``: their ids are read from there, not from the messages again.
    """
    per_node: dict[int, list[Planned]] = {}
    for start in range(0, len(segments), TURN_EVERY):
        end = start + TURN_EVERY
        chunk = segments[start:end]
        for node_id, s in zip(map(node_of.__getitem__, map(_FIRST, sizes[start:end])), chunk, strict=True):
            per_node.setdefault(node_id, []).append(s)
        await asyncio.sleep(0)
    return per_node


def merge_by_size(infos: Sequence[M], limit: int, *, max_items: int = 0) -> list[list[M]]:
    """Consecutive groups whose wire size stays within ``limit`` bytes and, when given, ``max_items``
    messages (a single larger message goes alone).

    Each message counts its ``ByteSize()`` plus 4. The sizes are taken and summed in C, and each group's end is
    found by bisecting the running sums (a group is thousands of messages): a loop adding one message at a time
    was most of this function's cost. ``_merge_by_size_loop`` is that loop, kept as the rule written out (tests
    compare the two).
    """
    items = infos if isinstance(infos, list) else list(infos)
    ends = list(accumulate(map(add, map(_BYTE_SIZE, items), repeat(4)), initial=0))  # ends[k]: first k's size
    groups: list[list[M]] = []
    start, n = 0, len(items)
    while start < n:
        # The largest end whose group fits, at least one message, at most max_items (a negative one means 1, as
        # the loop's ``len(cur) >= max_items`` made it).
        end = max(bisect_right(ends, ends[start] + limit) - 1, start + 1)
        if max_items:
            end = min(end, start + max(max_items, 1))
        groups.append(items[start:end])
        start = end
    return groups


def _merge_by_size_loop(infos: Sequence[M], limit: int, *, max_items: int = 0) -> list[list[M]]:
    """``merge_by_size`` one message at a time: the rule as first written (the reference tests compare with)."""
    groups: list[list[M]] = []
    cur: list[M] = []
    size = 0
    for info in infos:
        s = info.ByteSize() + 4
        if cur and (size + s > limit or (max_items and len(cur) >= max_items)):
            groups.append(cur)
            cur, size = [], 0
        cur.append(info)
        size += s
    if cur:
        groups.append(cur)
    return groups


#: A node's first load request holds at most this share of its first group (and at least ``HEAD_MIN`` segments).
HEAD_SHARE = 8
HEAD_MIN = 64


def head_first(groups: list[list[M]]) -> list[list[M]]:
    """``groups`` (one node's load requests, in order) with a small first request split off the first group.

    Why: a node answers a request once it loaded all of it, and the records of what it loaded are written then.
    With one large request per node, etcd waited idle for the nodes' first answers; a small head is answered
    soon, and its records are written while the node loads the rest (one request in flight per node).
    """
    if not groups or len(groups[0]) < 2 * HEAD_MIN:
        return groups
    first = groups[0]
    cut = max(HEAD_MIN, len(first) // HEAD_SHARE)
    return [first[:cut], first[cut:], *groups[1:]]
