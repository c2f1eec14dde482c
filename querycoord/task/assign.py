"""Plan child tasks for segments and channels: allocate nodes, merge requests, strip what is persisted.

Milvus's ``assignInternalTask``: segments are allocated memory-aware and
merged per (collection, node) into LoadSegments requests of at most
``max_request_bytes`` *as sent* (binlog paths included); DM channels go to
the nodes watching the fewest. Every node that receives work also gets its
delta-channel watch and query channel (idempotent on the node). What is
persisted is stripped of binlog paths (refetched before the call), so a
child's record stays small whatever the segments carry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TypeVar

from google.protobuf.message import Message

from proto import data_pb2, querynode_pb2
from querycoord.cluster.allocator import Usage, allocate_channels, allocate_segments, allocate_waiting
from querycoord.task.model import Task, TaskEnv

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


async def plan_children(
    env: TaskEnv,
    parent: Task,
    collection_id: int,
    segments: Sequence[data_pb2.SegmentLoadInfo],
    channels: Sequence[data_pb2.VChannelInfo],
    *,
    exclude: Sequence[int] = (),
    include: Sequence[int] = (),
    wait: bool = False,
    source_node_id: int = 0,
    load_type: int = data_pb2.LOAD_TYPE_COLLECTION,
    partition_ids: Sequence[int] = (),
) -> list[Task]:
    """Children (without ids) that load ``segments`` and watch ``channels``; see module docstring."""
    from querycoord.task.children import (
        LoadSegmentsTask,
        WatchDeltaChannelsTask,
        WatchDmChannelsTask,
        WatchQueryChannelTask,
    )

    cfg = env.config
    deadline = getattr(parent, "deadline", time.monotonic() + cfg.trigger_timeout)
    sizes = [(s.segment_id, s.mem_size) for s in segments]

    def attempt() -> dict:
        usage = usage_of(env)
        placed_segments = (
            allocate_segments(sizes, env.nodes.nodes.values(), usage, exclude=exclude, include=include,
                              memory_limit=cfg.memory_limit)
            if sizes else {}
        )
        placed_channels = (
            allocate_channels([c.channel_name for c in channels], env.nodes.nodes.values(), usage,
                              exclude=exclude, include=include)
            if channels else {}
        )
        return {"segments": placed_segments, "channels": placed_channels}

    placed = await allocate_waiting(attempt, wait=wait, deadline=deadline, wait_interval=cfg.wait_interval)
    cond = parent.rec.trigger_condition
    excluded = list(exclude)
    children: list[Task] = []

    per_node: dict[int, list[data_pb2.SegmentLoadInfo]] = {}
    for s in segments:
        per_node.setdefault(placed["segments"][s.segment_id], []).append(s)
    for node_id, infos in sorted(per_node.items()):
        for group in merge_by_size(infos, cfg.max_request_bytes):
            req = querynode_pb2.LoadSegmentsRequest(
                collection_id=collection_id,
                infos=[strip_segment(i) for i in group],
                source_node_id=source_node_id,
                load_type=load_type,
            )
            child = LoadSegmentsTask.new(env, req, trigger_condition=cond, collection_id=collection_id,
                                         node_id=node_id, parent=parent, excluded=excluded)
            child.full_infos = group  # type: ignore[attr-defined]
            children.append(child)

    for ch in channels:
        node_id = placed["channels"][ch.channel_name]
        req = querynode_pb2.WatchDmChannelsRequest(
            collection_id=collection_id, partition_ids=list(partition_ids), infos=[strip_channel(ch)],
            load_type=load_type,
        )
        children.append(WatchDmChannelsTask.new(env, req, trigger_condition=cond, collection_id=collection_id,
                                                node_id=node_id, parent=parent, excluded=excluded))

    receivers = sorted(set(per_node) | set(placed["channels"].values()))
    delta = env.meta.get_delta_channels(collection_id)
    query, result = query_channels(collection_id)
    for node_id in receivers:
        if delta and node_id in per_node:
            req = querynode_pb2.WatchDeltaChannelsRequest(collection_id=collection_id, infos=list(delta))
            children.append(WatchDeltaChannelsTask.new(env, req, trigger_condition=cond,
                                                       collection_id=collection_id, node_id=node_id, parent=parent,
                                                       excluded=excluded))
        qreq = querynode_pb2.AddQueryChannelRequest(
            collection_id=collection_id, query_channel=query, query_result_channel=result
        )
        children.append(WatchQueryChannelTask.new(env, qreq, trigger_condition=cond, collection_id=collection_id,
                                                  node_id=node_id, parent=parent, excluded=excluded))
    return children

