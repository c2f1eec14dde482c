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


def strip_segment(info: data_pb2.SegmentLoadInfo) -> data_pb2.SegmentLoadInfo:
    out = data_pb2.SegmentLoadInfo()
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
