"""The pieces ``children.plan_children`` plans with: node usage, request merging, stripping what is persisted.

Milvus's ``assignInternalTask``: segments are allocated memory-aware and
merged per (collection, node) into LoadSegments requests of at most
``max_request_bytes`` *as sent* (binlog paths included); DM channels go to
the nodes watching the fewest. Every node that receives work also gets its
delta-channel watch and query channel (idempotent on the node). What is
persisted is stripped of binlog paths (refetched before the call), so a
child's record stays small whatever the segments carry.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, repeat
from operator import add, attrgetter, itemgetter, methodcaller
from typing import TypeVar

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import Message

from proto import data_pb2, querynode_pb2
from querycoord.cluster.allocator import Usage
from querycoord.messages import LoadItem
from querycoord.task.model import TaskEnv
from querycoord.yielding import TURN_EVERY

M = TypeVar("M", bound=Message)
_BYTE_SIZE = methodcaller("ByteSize")
_SEGMENT_ID = attrgetter("segment_id")
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


def fill_stripped(infos: RepeatedCompositeFieldContainer[data_pb2.SegmentLoadInfo], planned: Sequence[Planned]) -> bool:
    """Give back to ``infos`` (a copy of a request ``add_stripped`` built from ``planned``) the paths stripping
    removed, in place; False, with ``infos`` unchanged, when they do not pair up one to one (the caller rebuilds).

    Why: rebuilding every load info from its binlogs (``fill_load_info``) set seven fields per segment, while
    the stripped copy already holds all but the paths (tests/test_plan_fast_paths.py compares the two).
    """
    if not _pairs_up(infos, planned):
        return False
    binlogs = data_pb2.SegmentBinlogs
    for info, p in zip(infos, planned, strict=True):
        if type(p) is binlogs:
            info.binlog_paths.extend(p.binlog_paths)
            if p.index_infos:
                del info.index_infos[:]
                info.index_infos.extend(p.index_infos)
        else:
            info.CopyFrom(p)
    return True


def binlogs_request(stripped: querynode_pb2.LoadSegmentsRequest,
                    planned: Sequence[Planned]) -> querynode_pb2.LoadSegmentsRequest | None:
    """The request to send for ``stripped`` (a request ``add_stripped`` built from ``planned``) when every one of
    ``planned`` is the catalog's binlogs: ``stripped``'s fields but its infos, and ``planned`` as its ``binlogs``
    (a node loads each as the load info of the same fields). None when they do not pair up, or some were
    already load infos (a reschedule): the caller fills the infos instead (``fill_stripped``).

    Why: the binlogs go out as the catalog gave them, one copy in C, where filling the paths into every load info
    cost more than the node's whole handling of a segment (tests/test_plan_fast_paths.py compares the two).
    """
    if not planned or not _pairs_up(stripped.infos, planned) or set(map(type, planned)) != {data_pb2.SegmentBinlogs}:
        return None
    req = querynode_pb2.LoadSegmentsRequest()
    req.CopyFrom(stripped)  # every field, whichever the message has; the stripped infos go (copied in C: cheap)
    del req.infos[:]
    req.binlogs.extend(planned)
    return req


def _pairs_up(infos: Sequence[data_pb2.SegmentLoadInfo], planned: Sequence[Planned]) -> bool:
    """Whether ``infos`` are still those stripped from ``planned``, one to one.

    They pair up by construction (the request was built from ``planned``, in order, and never changes); the
    count and the ends are checked so that a request changed since is rebuilt rather than mixed up.
    """
    return len(infos) == len(planned) and (not infos or (infos[0].segment_id == planned[0].segment_id
                                                         and infos[-1].segment_id == planned[-1].segment_id))


def segment_load_info(b: data_pb2.SegmentBinlogs) -> data_pb2.SegmentLoadInfo:
    """What a node needs to load a catalog segment: every field of its binlogs."""
    return fill_load_info(data_pb2.SegmentLoadInfo(), b)


def strip_segment(info: Planned) -> data_pb2.SegmentLoadInfo:
    """The load info as persisted: without binlog and index file paths (refetched before the call)."""
    out = data_pb2.SegmentLoadInfo()
    _strip_into(out, info)
    return out


def add_stripped(infos: RepeatedCompositeFieldContainer[data_pb2.SegmentLoadInfo], planned: Sequence[Planned]) -> None:
    """Append ``strip_segment`` of each of ``planned`` to ``infos`` (a request's repeated field), each built in
    place: building messages apart and handing them to the request copied every one of them again (a third of
    planning a load's CPU; tests/test_plan_fast_paths.py checks the result is ``strip_segment``'s)."""
    new = infos.add
    binlogs = data_pb2.SegmentBinlogs
    for info in planned:
        if type(info) is binlogs:  # the common case (a planned load): every field given to ``add`` at once
            out = new(segment_id=info.segment_id, partition_id=info.partition_id,
                      collection_id=info.collection_id, num_rows=info.num_rows, mem_size=info.mem_size,
                      insert_channel=info.insert_channel)
            if info.compaction_from:
                out.compaction_from.extend(info.compaction_from)
            if info.index_infos:
                _strip_indexes(out, info.index_infos)
        else:
            _strip_into(new(), info)


def _strip_into(out: data_pb2.SegmentLoadInfo, info: Planned) -> None:
    """Write ``info`` without its paths into the empty ``out``."""
    if isinstance(info, data_pb2.SegmentBinlogs):  # built without the paths rather than copied and cut
        out.segment_id = info.segment_id
        out.partition_id = info.partition_id
        out.collection_id = info.collection_id
        out.num_rows = info.num_rows
        out.mem_size = info.mem_size
        out.insert_channel = info.insert_channel
        if info.compaction_from:
            out.compaction_from.extend(info.compaction_from)
        if info.index_infos:
            _strip_indexes(out, info.index_infos)
        return
    out.CopyFrom(info)
    del out.binlog_paths[:]
    for idx in out.index_infos:
        del idx.index_file_paths[:]


def _strip_indexes(out: data_pb2.SegmentLoadInfo, index_infos: Sequence[data_pb2.IndexInfo]) -> None:
    """Copy ``index_infos`` into ``out`` without their file paths."""
    out.index_infos.extend(index_infos)
    for idx in out.index_infos:
        del idx.index_file_paths[:]


def strip_channel(info: data_pb2.VChannelInfo) -> data_pb2.VChannelInfo:
    out = data_pb2.VChannelInfo()
    out.CopyFrom(info)
    del out.flushed_segment_ids[:]
    del out.dropped_segment_ids[:]
    return out


def segment_sizes(segments: Sequence[Planned]) -> list[tuple[int, int]]:
    """(segment id, mem size) of each segment, as the allocator takes them (read in C: once per segment)."""
    return list(map(_ID_AND_MEM_SIZE, segments))


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


def usage_of(env: TaskEnv) -> Usage:
    nodes = [n.node_id for n in env.nodes.online()]
    return Usage(
        memory={n: env.meta.node_memory_usage(n) for n in nodes},
        channels={n: len(env.meta.channels_on_node(n)) for n in nodes},
    )
