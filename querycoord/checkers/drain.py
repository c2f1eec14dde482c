"""Draining nodes: every copy a DRAINING node holds is loaded elsewhere in its replica before the node lets go
of it; once it holds nothing it leaves its replicas and is DRAINED (``cluster.lifecycle``).

At every checker pass, for each draining node and each collection it holds copies of that no trigger owns:

* segments: one LoadBalance trigger (trigger condition CHECKER: the checker's repair priority) moving that
  collection's copies off the node. A balance loads each copy on another node of the same replica (or on a spare
  that joins it; the node itself is cordoned, so never a destination) and releases the source copy only once
  the destination holds it, so no replica ever holds a segment fewer times than before. It is queued only when
  the unit can be placed now (``units.assess``, the same rule the planner uses): otherwise nothing is queued,
  the node keeps serving its copies, and the drain's progress says why it waits (DESIGN rule 9: the other
  collections, loads and repairs go on);
* a node that is the only one of its replica (or whose replica has no room), with no spare: one REHOME_NODE
  trigger (``task.rehome``) takes a node from another replica of the collection that can spare it (its copies
  loaded on that replica's other nodes first) into the draining node's replica; the drain's next pass moves the
  copies there. When no replica can spare such a node, the drain waits and says what would make it move;
* DM channels (once the collection's segments are moved): a REPAIR re-watching them in the same replica on
  another node; that watch is recorded on its new node, and the checker's channel step then releases the
  draining node's second watch.

A draining node that holds nothing (query meta places nothing on it and its own report agrees) leaves every
replica (``QueryMeta.remove_node``) and becomes DRAINED. An offline draining node holds nothing (its copies were
forgotten with its session): it is DRAINED at once.
"""

from __future__ import annotations

from collections.abc import Callable

from loguru import logger

from proto import data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.client import NodeError
from querycoord.cluster.lifecycle import DrainStatus, NodeLifecycles
from querycoord.task.rehome import RehomeNodeTask
from querycoord.task.rehome_plan import donor_for_drain
from querycoord.task.repair import RepairTask
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import LoadBalanceTask
from querycoord.task.units import assess, usage_of


def is_drain_move(trigger: object) -> bool:
    """Whether a trigger is a drain's move (a LoadBalance the checker queued)."""
    rec = getattr(trigger, "rec", None)
    return (getattr(trigger, "KIND", None) == qc.TASK_KIND_LOAD_BALANCE and rec is not None
            and rec.trigger_condition == qc.TRIGGER_CONDITION_CHECKER)


async def drain_nodes(scheduler: Scheduler, lifecycles: NodeLifecycles, busy: Callable[[], set[int]]) -> int:
    """One pass over the draining nodes (see module docstring); returns the triggers queued."""
    await lifecycles.back_from_stop()
    queued = 0
    for node_id in lifecycles.draining():
        if scheduler.stopped:
            break
        queued += await _drain_one(scheduler, lifecycles, node_id, busy)
    return queued


async def _drain_one(scheduler: Scheduler, lifecycles: NodeLifecycles, node_id: int,
                     busy: Callable[[], set[int]]) -> int:
    env = scheduler.env
    meta = env.meta
    # Ids by collection from the places: a view per copy is built only for a collection about to move (at every
    # pass, views of every copy the node holds held the event loop for seconds at a million segments).
    ids_of = meta.segment_ids_by_collection_on_node(node_id)
    segs = any(ids_of.values())
    chans = meta.channels_on_node(node_id)
    status = lifecycles.status.setdefault(node_id, DrainStatus())
    status.copies_left = sum(map(len, ids_of.values())) + len(chans)
    if not env.nodes.is_online(node_id):
        if not segs and not chans:
            await _leave_replicas(scheduler, lifecycles, node_id)
        else:
            status.waiting = "the node is offline: its copies are forgotten, then it is drained"
        return 0
    if not segs and not chans:
        dist = await _distribution(scheduler, node_id)
        if dist is not None and await _holds_nothing(scheduler, node_id, dist):
            await _leave_replicas(scheduler, lifecycles, node_id)
            return 0
        status.waiting = "the node still reports copies query meta does not place on it: they are released"
        return 0 if dist is None else await _release_leftovers(scheduler, node_id, dist, busy)
    chans_of: dict[int, list[data_pb2.DmChannelWatchInfo]] = {}
    for w in chans:
        chans_of.setdefault(w.collection_id, []).append(w)
    waits: list[str] = []
    queued = 0
    usage = usage_of(env)
    for cid in sorted(set(ids_of) | set(chans_of)):
        if cid in busy() or scheduler.stopped:
            continue
        moving = await meta.read_segment_sizes_on_node(node_id, cid) if cid in ids_of else []
        if cid in busy() or scheduler.stopped:  # a trigger took the collection during the read's turns
            continue
        replica = meta.replica_of_node(cid, node_id)
        watches = [] if moving else chans_of.get(cid, [])
        parked = assess(env, cid, replica, moving, [w.dm_channel for w in watches], usage)
        if parked is not None:
            move, why = donor_for_drain(env, cid, replica, moving, [w.dm_channel for w in watches], usage)
            if move is None:
                waits.append(f"collection {cid}: {parked.reason}" + (f"; {why}" if why else ""))
                continue
            rehome = RehomeNodeTask.new(
                env, task_pb2.RehomeNodeRequest(collection_id=cid, move=move, reason=f"drain of node {node_id}"),
                trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
            await scheduler.enqueue(rehome)
            queued += 1
            logger.info("drain of query node {}: replica {} of collection {} takes node {} from replica {} (task "
                        "{}), since {}", node_id, replica, cid, move.node_id, move.from_replica_id, rehome.id,
                        parked.reason)
            continue
        if moving:
            req = qc.LoadBalanceRequest(source_node_ids=[node_id], collection_id=cid,
                                        reason=qc.BALANCE_REASON_DRAIN)
            task: LoadBalanceTask | RepairTask = LoadBalanceTask.new(
                env, req, trigger_condition=qc.TRIGGER_CONDITION_CHECKER)
            what = f"{len(moving)} segments"
        else:
            rewatch = [data_pb2.DmChannelWatchInfo(collection_id=cid, dm_channel=w.dm_channel, node_id=0,
                                                   replica_id=replica, partition_ids=list(w.partition_ids))
                       for w in watches]
            repair = task_pb2.RepairRequest(rewatch=rewatch,
                                            reason=f"{len(rewatch)} DM channels moved off draining node {node_id}")
            task = RepairTask.new(env, repair, trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
            what = f"{len(watches)} DM channels"
        await scheduler.enqueue(task)
        queued += 1
        logger.info("drain of query node {}: moving {} of collection {} within replica {} (task {})", node_id,
                    what, cid, replica, task.id)
    status.waiting = "; ".join(waits) if waits and not queued else ""
    return queued


async def _distribution(scheduler: Scheduler, node_id: int) -> querynode_pb2.GetDataDistributionResponse | None:
    """The node's own report of what it holds (segment ids only); None when it does not answer."""
    try:
        return await scheduler.env.nodes.client(node_id).call(
            "GetDataDistribution", querynode_pb2.GetDataDistributionRequest(segment_ids_only=True))
    except NodeError as exc:
        logger.info("drain of query node {}: it did not report its distribution: {}", node_id, exc)
        return None


async def _holds_nothing(scheduler: Scheduler, node_id: int,
                         dist: querynode_pb2.GetDataDistributionResponse) -> bool:
    """The node's own report (``dist``): no segment, no DM channel (a node that does not answer is not taken as
    empty). The delta and query channel watches left (they only served the segments it held) are released with a
    ReleaseCollection per collection, best effort: the node serves nothing of it any more."""
    client = scheduler.env.nodes.client(node_id)
    held = sum(len(g.segment_ids) for g in dist.segment_groups) + len(dist.segments)
    if held or any(ch.kind == querynode_pb2.CHANNEL_KIND_DM for ch in dist.channels):
        return False
    for cid in sorted({ch.collection_id for ch in dist.channels}):
        try:
            await client.call("ReleaseCollection", querynode_pb2.ReleaseCollectionRequest(collection_id=cid))
        except NodeError as exc:
            logger.info("drain of query node {}: releasing what is left of collection {} failed: {}", node_id,
                        cid, exc)
    return True


async def _release_leftovers(scheduler: Scheduler, node_id: int, dist: querynode_pb2.GetDataDistributionResponse,
                             busy: Callable[[], set[int]]) -> int:
    """Query meta places nothing on the draining node, yet it still holds some copies (the second watch of a DM
    channel a drain's repair watched on another node, a segment a balance could not release): one REPAIR per
    collection no trigger owns releases them from it now, rather than after the checker's next comparison. A DM
    channel is released only while query meta records its watch on another online node of the collection (else
    it is left to the checker); each segment release weighs its copies again when it runs
    (``task.release_guard``), so a copy that is its replica's only one stays. Returns the triggers queued."""
    env = scheduler.env
    meta = env.meta
    segments: dict[int, list[int]] = {}
    for g in dist.segment_groups:
        segments.setdefault(g.collection_id, []).extend(g.segment_ids)
    for s in dist.segments:
        segments.setdefault(s.collection_id, []).append(s.segment_id)
    channels: dict[int, list[str]] = {}
    for ch in dist.channels:
        if ch.kind != querynode_pb2.CHANNEL_KIND_DM or not meta.has_collection(ch.collection_id):
            continue
        watchers = meta.dm_channel_copies(ch.collection_id).get(ch.channel_name, {}).values()
        if any(n != node_id and env.nodes.is_online(n) for n in watchers):
            channels.setdefault(ch.collection_id, []).append(ch.channel_name)
    queued = 0
    for cid in sorted(set(segments) | set(channels)):
        if cid in busy() or scheduler.stopped:
            continue
        req = task_pb2.RepairRequest(reason=f"copies left on draining node {node_id} released")
        if segments.get(cid):
            req.release_segments.append(task_pb2.NodeSegments(node_id=node_id, segment_ids=sorted(segments[cid])))
        if channels.get(cid):
            req.release_dm_channels.append(task_pb2.NodeChannels(node_id=node_id,
                                                                 channel_names=sorted(channels[cid])))
        task = RepairTask.new(env, req, trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
        await scheduler.enqueue(task)
        queued += 1
        logger.info("drain of query node {}: releasing what it still holds of collection {} (task {})", node_id,
                    cid, task.id)
    return queued


async def _leave_replicas(scheduler: Scheduler, lifecycles: NodeLifecycles, node_id: int) -> None:
    if node_id in scheduler.env.meta.known_node_ids():
        await scheduler.env.meta.remove_node(node_id)
    await lifecycles.drained(node_id)
