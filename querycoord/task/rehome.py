"""Re-homing: a node leaves one replica of a collection for another (or for none), with no moment in which that
replica holds a segment or DM channel fewer times than before.

Two steps, as a drain moves a node's copies (``checkers.drain``) and Milvus 2.4's replica observer moves a node out
of a replica once it holds nothing there:

1. ``plan_moves``: children that load the node's copies of the collection on the other nodes of its replica (never
   on a spare, never on another node leaving): each LoadSegments names the node as its source, so the source copy
   is released only once the destination holds it; each DM channel is watched on another node of the replica,
   which query meta then records as the replica's watcher.
2. ``finish_move`` (once those children succeeded): the node holds nothing of the replica in query meta, so it
   releases what is left of the collection there (delta and query channel watches, its second DM watches) and
   leaves the replica, joining the one named (``RehomeNode.to_replica_id``; 0: none) in one write. Other
   collections the node serves are not touched.

Used by a grow short of spare nodes (``task.resize``) and by ``RehomeNodeTask``, the checker's trigger for a drain
whose node is the only one of its replica. The choice of nodes is ``task.rehome_plan``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from loguru import logger

from proto import common_pb2, data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.client import NodeError
from querycoord.common.partition_state import NOT_PRESENT
from querycoord.task.assign import Planned
from querycoord.task.children import plan_children
from querycoord.task.model import Task, TaskEnv, TaskError
from querycoord.task.triggers import TriggerTask, merge_channel


def pending(env: TaskEnv, collection_id: int, moves: Sequence[task_pb2.RehomeNode]) -> list[task_pb2.RehomeNode]:
    """The moves whose node is still in the replica it leaves (the others are done)."""
    return [m for m in moves if env.meta.replica_of_node(collection_id, m.node_id) == m.from_replica_id]


async def plan_moves(env: TaskEnv, parent: Task, collection_id: int,
                     moves: Sequence[task_pb2.RehomeNode]) -> list[Task]:
    """Children that load each moving node's copies on its replica's nodes that stay (see module docstring)."""
    info = env.meta.get_collection(collection_id)
    if info is None or not moves:
        return []
    pids = [p.partition_id for p in info.partitions if p.state != NOT_PRESENT]
    recovered = await asyncio.gather(*(env.broker.get_recovery_info(collection_id, pid) for pid in pids))
    binlogs: dict[int, Planned] = {}
    channels: dict[str, data_pb2.VChannelInfo] = {}
    for chans, bins in recovered:
        binlogs.update({b.segment_id: b for b in bins})
        for c in chans:
            if c.channel_name in channels:
                merge_channel(channels[c.channel_name], c)
            else:
                channels[c.channel_name] = c
    load_type = info.load_type or data_pb2.LOAD_TYPE_COLLECTION
    all_pids = [] if load_type == data_pb2.LOAD_TYPE_COLLECTION else sorted(pids)
    leaving = {m.node_id for m in moves}
    out: list[Task] = []
    for m in moves:
        node, replica = m.node_id, m.from_replica_id
        stay = [n for n in env.meta.replica_nodes(collection_id, replica) if n not in leaving]
        held = await env.meta.read_segments_on_node(node, collection_id)
        gone = [s.segment_id for s in held if s.segment_id not in binlogs]
        if gone:  # compacted away: its replacement arrives through handoff
            logger.info("{}: segments {} left the catalog; dropping them from query meta", parent.describe(), gone)
            await env.meta.remove_segments(gone)
        todo = [binlogs[s.segment_id] for s in held if s.segment_id in binlogs]
        watched = [channels[w.dm_channel] for w in env.meta.channels_on_node(node)
                   if w.collection_id == collection_id and w.dm_channel in channels]
        if not todo and not watched:
            continue
        if not stay:
            raise TaskError(f"node {node} cannot leave replica {replica} of collection {collection_id}: no other "
                            "node of that replica is online", common_pb2.NO_AVAILABLE_NODE)
        logger.info("{}: moving {} segments and {} DM channels of collection {} off node {} within replica {} "
                    "(to nodes {})", parent.describe(), len(todo), len(watched), collection_id, node, replica, stay)
        out += await plan_children(env, parent, collection_id, todo, watched, exclude=sorted(leaving),
                                   include=stay, source_node_id=node, load_type=load_type, partition_ids=all_pids,
                                   replica_id=replica)
    return out


async def finish_move(env: TaskEnv, collection_id: int, move: task_pb2.RehomeNode) -> None:
    """Step 2 (see module docstring); nothing when the node already left. ``TaskError`` when query meta still
    places copies of the replica on the node (its moves did not all land)."""
    node, replica = move.node_id, move.from_replica_id
    if env.meta.replica_of_node(collection_id, node) != replica:
        return
    segs = env.meta.segment_ids_on_node_of(node, collection_id)
    chans = [w.dm_channel for w in env.meta.channels_on_node(node) if w.collection_id == collection_id]
    if segs or chans:
        raise TaskError(f"node {node} still holds {len(segs)} segments and {len(chans)} DM channels of replica "
                        f"{replica} of collection {collection_id}: it stays in that replica",
                        common_pb2.UNEXPECTED_ERROR)
    if env.nodes.is_online(node):
        try:  # what is left serves nothing of the replica now (delta and query channel watches, a second DM watch)
            await env.nodes.client(node).call("ReleaseCollection",
                                              querynode_pb2.ReleaseCollectionRequest(collection_id=collection_id))
        except NodeError as exc:  # the checker releases it later: nothing in query meta places it there
            logger.info("node {} did not release what is left of collection {}: {}", node, collection_id, exc)
    await env.meta.move_replica_node(collection_id, node, replica, move.to_replica_id)
    to = f"joins replica {move.to_replica_id}" if move.to_replica_id else "is a spare of it now"
    logger.info("node {} left replica {} of collection {} and {}", node, replica, collection_id, to)


class RehomeNodeTask(TriggerTask, kind=qc.TASK_KIND_REHOME_NODE, request="rehome_node"):
    """The checker's re-homing of one node (see module docstring): a drain whose node is the only one of its
    replica gets a node from another replica of the collection. Nothing to roll back: moves done stay done (each
    copy is held in its replica as before) and the node stays in its replica until all of them landed."""

    def summary(self) -> str:
        m = self.request.move
        to = f"replica {m.to_replica_id}" if m.to_replica_id else "no replica"
        return (f"move node {m.node_id} of collection {self.collection_id} from replica {m.from_replica_id} to {to}"
                + (f": {self.request.reason}" if self.request.reason else ""))

    async def execute(self) -> None:
        env, cid, m = self.env, self.collection_id, self.request.move
        self.children = []
        if not pending(env, cid, [m]):
            return  # done already (a re-run), or the node left meanwhile
        if m.to_replica_id and m.to_replica_id not in env.meta.replica_ids(cid):
            raise TaskError(f"collection {cid} has no replica {m.to_replica_id} any more", common_pb2.CONFLICT)
        if m.node_id not in env.nodes.eligible_ids():
            raise TaskError(f"node {m.node_id} is offline, cordoned or not heard by this coordinator yet: it is not "
                            "moved", common_pb2.CONFLICT)
        self.children = await plan_moves(env, self, cid, [m])

    async def post_execute(self) -> None:
        await finish_move(self.env, self.collection_id, self.request.move)
