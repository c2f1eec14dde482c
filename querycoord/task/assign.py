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

from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import Message

from proto import data_pb2
from querycoord.cluster.allocator import Usage
from querycoord.task.model import TaskEnv

M = TypeVar("M", bound=Message)


def query_channels(collection_id: int) -> tuple[str, str]:
    return f"query-{collection_id}", f"query-result-{collection_id}"


# What a load is planned from: the catalog's binlogs, or a load info that was already filled (a reschedule).
Planned = data_pb2.SegmentLoadInfo | data_pb2.SegmentBinlogs


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


def segment_load_info(b: data_pb2.SegmentBinlogs) -> data_pb2.SegmentLoadInfo:
    """What a node needs to load a catalog segment: every field of its binlogs."""
    return fill_load_info(data_pb2.SegmentLoadInfo(), b)


def strip_segment(info: Planned) -> data_pb2.SegmentLoadInfo:
    """The load info as persisted: without binlog and index file paths (refetched before the call)."""
    out = data_pb2.SegmentLoadInfo()
    if isinstance(info, data_pb2.SegmentBinlogs):  # built without the paths rather than copied and cut
        out.segment_id = info.segment_id
        out.partition_id = info.partition_id
        out.collection_id = info.collection_id
        out.num_rows = info.num_rows
        out.mem_size = info.mem_size
        out.insert_channel = info.insert_channel
        if info.compaction_from:
            out.compaction_from.extend(info.compaction_from)
        if not info.index_infos:
            return out
        out.index_infos.extend(info.index_infos)
    else:
        out.CopyFrom(info)
        del out.binlog_paths[:]
    for idx in out.index_infos:
        del idx.index_file_paths[:]
    return out


def strip_channel(info: data_pb2.VChannelInfo) -> data_pb2.VChannelInfo:
    out = data_pb2.VChannelInfo()
    out.CopyFrom(info)
    del out.flushed_segment_ids[:]
    del out.dropped_segment_ids[:]
    return out


def merge_by_size(infos: Sequence[M], limit: int, *, max_items: int = 0) -> list[list[M]]:
    """Consecutive groups whose wire size stays within ``limit`` bytes and, when given, ``max_items``
    messages (a single larger message goes alone)."""
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
