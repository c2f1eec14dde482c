"""The checker's releases, weighed again when they run: never drop what has become a replica's only copy.

A repair is planned from one pass's view (``checkers.diff``) and runs later: behind other triggers of its
collection, or after a failover from its persisted record. Meanwhile the node that made a copy redundant may have
died (its copies are forgotten at once: ``watchers.forget_node``), or the node holding the copy may have joined
the replica as a spare. Releasing then would drop the last copy a replica holds of a segment it still serves,
and the replica would stop serving it until a reload. So a release child asks, when it runs:

* is the node in a replica of the collection now (any node for a collection loaded before replicas)? A copy on
  a node in no replica is no replica's: released.
* does another online node of that replica hold the segment? Asked of that node (query meta names it), not
  taken from meta: a node that lost its copy since would make meta answer yes. No answer counts as no.
* is the segment still one the replica must serve (a loaded partition's segment the catalog still has)? A
  released partition's copy, or a compaction source whose result is held, is released as planned: keeping it
  would make every pass plan the same release again.

A copy is kept only when its node serves a replica, no other node of it confirms a copy, and the replica still
serves the segment; the next pass sees it held and records it (``adopt``). DM channel
watches get the same rule from query meta alone (``dm_channels_to_keep``): no node call reports one channel's
watch, and a node does not drop a watch on its own, so meta's record of it (forgotten with a lost node) is what
the checker saw.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loguru import logger

from proto import querynode_pb2
from querycoord.cluster.client import NodeError
from querycoord.common.limits import DEFAULT_LIMITS
from querycoord.task.model import TaskEnv

# Ids per GetSegmentInfo call: well under a node's limit (``max_ids_per_request``), so that an answer of full
# SegmentInfos stays a megabyte or two. Long lists are rare here: a release the checker plans is of leftovers.
_IDS_PER_CALL = min(16_384, DEFAULT_LIMITS.max_ids_per_request)


def _replica_now(env: TaskEnv, collection_id: int, node_id: int) -> int | None:
    """The replica the node serves now (0 for a collection loaded before replicas); None when it serves none (or
    the collection is not loaded): nothing it holds is a replica's copy."""
    replicas = env.meta.replica_ids(collection_id)
    if not replicas:
        return None
    if replicas == [0]:
        return 0
    return env.meta.replica_of_node(collection_id, node_id) or None


def _peers(env: TaskEnv, collection_id: int, replica: int, node_id: int) -> set[int]:
    """The other online nodes that may hold the replica's copies."""
    online = env.nodes.online_ids()
    members = online if replica == 0 else set(env.meta.replica_nodes(collection_id, replica))
    return {n for n in members if n in online and n != node_id}


async def _infos(env: TaskEnv, node_id: int, collection_id: int, ids: Sequence[int]) -> dict[int, int]:
    """segment -> partition of the segments among ``ids`` the node holds; NodeError when it does not answer."""
    held: dict[int, int] = {}
    client = env.nodes.client(node_id)
    for start in range(0, len(ids), _IDS_PER_CALL):
        resp = await client.call("GetSegmentInfo", querynode_pb2.GetSegmentInfoRequest(
            segment_ids=ids[start:start + _IDS_PER_CALL], collection_id=collection_id))
        held.update((i.segment_id, i.partition_id) for i in resp.infos)
    return held


async def _targeted(env: TaskEnv, collection_id: int, partitions: dict[int, int]) -> set[int]:
    """The segments (id -> partition) of loaded partitions that the catalog still has."""
    by_partition: dict[int, list[int]] = {}
    for sid, pid in partitions.items():
        if env.meta.has_partition(collection_id, pid):
            by_partition.setdefault(pid, []).append(sid)
    out: set[int] = set()
    for pid, ids in sorted(by_partition.items()):
        _, binlogs = await env.broker.get_recovery_info(collection_id, pid, ids)
        out.update(b.segment_id for b in binlogs)
    return out


async def segments_to_keep(env: TaskEnv, collection_id: int, node_id: int, segment_ids: Iterable[int]) -> set[int]:
    """The segments among ``segment_ids`` whose copy on ``node_id`` must not be released now (module docstring).

    Raises ``NodeError`` when ``node_id`` itself does not answer (its release would fail the same way)."""
    replica = _replica_now(env, collection_id, node_id)
    if replica is None:
        return set()
    peers = _peers(env, collection_id, replica, node_id)
    alone: list[int] = []
    elsewhere: dict[int, list[int]] = {}
    for sid in segment_ids:
        other = env.meta.segment_copies(sid).get(replica, 0)
        if other in peers:
            elsewhere.setdefault(other, []).append(sid)
        else:
            alone.append(sid)
    for other, ids in sorted(elsewhere.items()):
        try:
            confirmed = await _infos(env, other, collection_id, ids)
        except NodeError as exc:
            logger.info("release guard: node {} did not confirm its copies ({}); they count as not held", other, exc)
            confirmed = {}
        alone += [sid for sid in ids if sid not in confirmed]
    if not alone:
        return set()
    held_here = await _infos(env, node_id, collection_id, sorted(alone))
    return await _targeted(env, collection_id, held_here) if held_here else set()


def dm_channels_to_keep(env: TaskEnv, collection_id: int, node_id: int, channels: Iterable[str]) -> set[str]:
    """The DM channels among ``channels`` whose watch on ``node_id`` must not be released now: the node serves a
    replica of the collection, and no other online node of that replica is recorded watching the channel for it
    (module docstring)."""
    replica = _replica_now(env, collection_id, node_id)
    if replica is None:
        return set()
    peers = _peers(env, collection_id, replica, node_id)
    recorded = env.meta.dm_channel_copies(collection_id)
    return {name for name in channels if recorded.get(name, {}).get(replica, 0) not in peers}


__all__ = ["dm_channels_to_keep", "segments_to_keep"]
