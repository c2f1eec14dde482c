"""The leader's observers: catalog handoff and node changes, feeding the scheduler and the checker.

``forget_node`` is what a node going down gets; ``forget_restarted`` and ``record_joined`` keep the nodes'
incarnations (``cluster.incarnations``) so a node restarted while no leader watched is not taken for the one
that held its records.

Both run for the whole leadership and must never die on one error (a dead
handoff loop silently stops loading new segments): a failure is logged,
counted, and the loop starts again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from loguru import logger

from meta.errors import NotLeader
from meta.kv import MetaKV
from meta.loops import loop_failed
from proto import data_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.broker import Broker
from querycoord.catalog.store import SegmentResync
from querycoord.catalog.targets import CatalogTargets
from querycoord.checkers import Checker
from querycoord.checkers.left import LeftNodes, forget_copies
from querycoord.cluster.incarnations import Incarnations
from querycoord.cluster.nodes import Node, NodeManager
from querycoord.querymeta import QueryMeta
from querycoord.served.persist import persist_lowered
from querycoord.served.state import ServedView, collection_served
from querycoord.task.model import TaskEnv
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import HandoffTask

# The catalog revision up to which every sealed segment has been handed off (a leader gap resumes there).
HANDOFF_REVISION_KEY = "queryCoord-handoffRevision"
RESTART_DELAY = 1.0


async def run_handoff(broker: Broker, kv: MetaKV, scheduler: Scheduler, meta: QueryMeta, checker: Checker) -> None:
    """Follow the catalog's segment changes forever; restart after any failure."""
    errors = 0
    while not scheduler.stopped:
        try:
            if not await _handoff(broker, kv, scheduler, meta, checker):
                return  # the catalog cannot be watched (remote): nothing to follow
            logger.warning("handoff: the catalog watch ended; restarting it")
        except asyncio.CancelledError:
            raise
        except NotLeader:
            return  # the scheduler has already been told
        except Exception as exc:
            errors += 1
            if loop_failed("handoff", exc, kv.client):
                return
        await asyncio.sleep(RESTART_DELAY)


async def _start_revision(kv: MetaKV, meta: QueryMeta) -> int:
    raw = await meta.kv.get(HANDOFF_REVISION_KEY)
    if raw:
        try:
            return int(raw) + 1
        except ValueError:
            logger.warning("handoff: ignoring a malformed {} value {!r}", HANDOFF_REVISION_KEY, raw[:40])
    return await kv.revision() + 1


async def _handoff(broker: Broker, kv: MetaKV, scheduler: Scheduler, meta: QueryMeta, checker: Checker) -> bool:
    """New sealed segments of loaded collections become Handoff triggers.

    The watch resumes from the revision persisted after the last handoff was
    queued, so segments sealed while no leader watched are not skipped. After
    a compaction of the watch's history (``SegmentResync``) the catalog's full
    list is compared with query meta instead. False when the catalog cannot be
    watched at all.
    """
    try:
        async for item in broker.watch_segments(await _start_revision(kv, meta)):
            if isinstance(item, SegmentResync):
                added = [b for b in item.segments if meta.get_segment(b.segment_id) is None
                         and not any(t.collection_id == b.collection_id for t in scheduler.triggers.values())]
            else:
                added = item.added
            by_coll: dict[int, list[data_pb2.SegmentInfo]] = {}
            for b in added:
                if meta.has_partition(b.collection_id, b.partition_id):
                    by_coll.setdefault(b.collection_id, []).append(data_pb2.SegmentInfo(
                        segment_id=b.segment_id, collection_id=b.collection_id, partition_id=b.partition_id,
                        compaction_from=list(b.compaction_from)))
            for cid, infos in by_coll.items():
                req = task_pb2.HandoffSegmentsRequest(segment_infos=infos)
                t = HandoffTask.new(scheduler.env, req, trigger_condition=qc.TRIGGER_CONDITION_HANDOFF,
                                    collection_id=cid)
                await scheduler.enqueue(t)
            if by_coll or isinstance(item, SegmentResync):
                await meta.kv.save(HANDOFF_REVISION_KEY, str(item.revision).encode())
                checker.kick()
    except NotImplementedError:
        logger.info("the catalog is remote and cannot be watched: handoff is off (the checker still loads "
                    "new segments)")
        return False
    return True


async def kick_on_node_changes(nodes: NodeManager, checker: Checker) -> None:
    """A node joined or left: check at once rather than at the next interval."""
    while True:
        await nodes.changed.wait()
        nodes.changed.clear()
        checker.kick()


async def forget_node(env: TaskEnv, node_id: int, *, incarnations: Incarnations,
                      served: ServedView | None = None, left: LeftNodes | None = None,
                      checker: Checker | None = None,
                      lowered: bool = False) -> list[data_pb2.DmChannelWatchInfo] | None:
    """A query node's session is gone: it leaves its replicas and its DM channel watches now, and its id is free
    for the node's next incarnation (``NodeManager.remove``). The segment records naming it stay, counting for
    nothing (it is offline and in no replica): the repair that loads each copy elsewhere rewrites its record once,
    instead of a delete of every record now and a put moments later (``QueryMeta.remove_node``).

    Why at once and not through a trigger: the node holds nothing any more, so there is nothing to wait for, and
    a trigger would hold the lock of every collection the node served until the last of them could be repaired
    (DESIGN rule 9). What it held is loaded again by the checker, one (collection, replica) at a time, each
    placed, or parked with its reason, on its own. The persisted percentages are lowered first (for readers of
    etcd: standbys, the next leader); the leader's own answers count only online nodes anyway.

    With ``left`` (``checkers.left``), a node whose every collection keeps a whole replica elsewhere is not
    forgotten before its delay is over; one back under its id meanwhile is taken in as its replicas' member.

    With ``checker``, the forget that took the node out of its replicas queues the repair of its copies and DM
    channel watches at once (``Checker.repair_lost``): the records still naming it are what it took with it, so no
    pass has to compare every segment to find them. A failure there is logged: the next pass repairs instead.

    ``lowered``: the caller already lowered the persisted percentages with this node offline (a takeover forgetting
    several gone nodes lowers once for all of them: what online nodes serve is the same before each forget).

    Returns the node's DM channel watches as recorded before the forget when this forget took it out of its
    replicas (what its repair rewatches), else None: a caller without ``checker`` queues the repair itself
    (``Checker.repair_lost_nodes``: a takeover, one repair per collection for all its gone nodes).
    """
    meta, nodes = env.meta, env.nodes
    if nodes.is_online(node_id):
        return None
    if left is not None and node_id in left.left and nodes.returning(node_id):
        logger.info("query node {} is back within its re-replication delay: it stays in its replicas", node_id)
        await incarnations.drop(node_id)
        await nodes.remove(node_id)  # takes the new session in: ``record_joined`` keeps its replicas
        return None
    if served is not None and not lowered:
        await persist_lowered(meta, meta.collection_ids(), served.collection)
    if left is not None and await left.hold(node_id, meta, served):
        return None
    watches: list[data_pb2.DmChannelWatchInfo] | None = None  # set once this forget took the node out
    if node_id in meta.bound_node_ids():
        before = meta.channels_on_node(node_id)  # what its replicas lack once the forget drops them
        txns = await meta.remove_node(node_id, keep_segments=True)
        if txns:  # else a forget running beside this one took it out, and queues its repair
            watches = before
        logger.info("query node {} forgotten: it left its replicas and its DM channel watches ({} txns); the "
                    "repair moves its {} segment copies", node_id, txns, meta.segment_count_on_node(node_id))
    # Two forgets of one node may run at once (the session watch's, a checker pass's): the first one's
    # ``nodes.remove`` lets a node back under its fixed id join, and this one must then leave that incarnation be
    # (its record and its place in the node map), or the leader would never see it again.
    if nodes.is_online(node_id):
        logger.info("query node {} came back while its previous process was forgotten: the new one stays", node_id)
        return None
    if left is not None:
        await left.drop(node_id)
    if node_id not in meta.known_node_ids():
        await incarnations.drop(node_id)
    else:
        # Kept while segment records still name it: a process back under its id while no leader watched is then
        # told from the lost one (``forget_restarted``), and what those records say is forgotten. Dropped once
        # the repair moved them (``prune_incarnations``).
        incarnations.deferred.add(node_id)
    await nodes.remove(node_id)
    if checker is not None and watches is not None:
        await queue_lost_repair(checker, {node_id: watches})
    return watches


async def queue_lost_repair(checker: Checker, lost: dict[int, list[data_pb2.DmChannelWatchInfo]]) -> None:
    """Queue the repair of the ``lost`` nodes' copies and watches (``Checker.repair_lost_nodes``); a failure is
    logged: the next checker pass repairs instead."""
    try:
        await checker.repair_lost_nodes(lost)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # NotLeader included: the scheduler was told, and the next leader's pass repairs
        logger.warning("query nodes {} lost: their repair was not queued ({}); the next checker pass repairs it",
                       sorted(lost), exc)


async def forget_restarted(env: TaskEnv, *, incarnations: Incarnations, targets: CatalogTargets | None,
                           left: LeftNodes | None = None) -> list[int]:
    """At takeover: online nodes whose session is not the incarnation the previous leader recorded restarted
    while no leader watched (``cluster.incarnations``): they hold nothing of what query meta places on them, so
    that is forgotten before anything counts it. Every online node's incarnation is recorded. Returns the
    restarted nodes."""
    meta, nodes = env.meta, env.nodes
    known = await incarnations.load()
    online = {n.node_id: n for n in nodes.online()}
    restarted = sorted(n for n, node in online.items()
                       if known.get(n) not in (None, node.created) and node.created)
    if restarted:
        logger.warning("query nodes {} restarted while no leader watched them: what their previous processes "
                       "held is forgotten", restarted)
        alive = set(online) - set(restarted)
        await persist_lowered(meta, meta.collection_ids(),
                              lambda cid: collection_served(meta, cid, alive, targets))
        for n in restarted:
            if left is not None and n in left.left:  # back within its re-replication delay: keeps its replicas
                await forget_copies(meta, n)
                await left.drop(n)
            elif n in meta.known_node_ids():
                await meta.remove_node(n)
    for n, node in sorted(online.items()):
        if known.get(n) != node.created and node.created:
            await incarnations.save(n, node.created)
    await incarnations.drop_unnamed(meta.known_node_ids(), set(online), keep=set(left.left) if left else set(),
                                    recorded=set(known))
    return restarted


def prune_incarnations(env: TaskEnv, incarnations: Incarnations, left: LeftNodes | None) -> Callable[[Any], None]:
    """A scheduler finish hook: after a repair, the records of lost nodes it moved every copy off are dropped
    (``Incarnations.drop_unnamed``), in a task of their own; a failure is logged and left to the next repair or
    the next leader's takeover."""
    running: list[asyncio.Task[None]] = []

    async def prune() -> None:
        try:
            await incarnations.drop_unnamed(env.meta.known_node_ids(), env.nodes.online_ids(),
                                            keep=set(left.left) if left is not None else set())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NotLeader, MetaUnavailable: the records stay until a later prune
            logger.info("node incarnations: lost nodes' records not dropped now ({})", exc)

    def after_trigger(trigger: Any) -> None:
        if trigger.KIND != qc.TASK_KIND_REPAIR or not incarnations.deferred:
            return
        if running and not running[0].done():
            return
        running[:] = [asyncio.get_running_loop().create_task(prune(), name="prune-incarnations")]

    return after_trigger


async def record_joined(node: Node, *, env: TaskEnv, incarnations: Incarnations, checker: Checker,
                        served: ServedView | None = None, left: LeftNodes | None = None) -> None:
    """A node came online during this leadership: forget what query meta still places on its id, record its
    incarnation, and check at once (it may be the spare a replica waits for).

    A session created now is a new process, which holds nothing; records on its id are an earlier process's, one
    whose session ended before this leader looked and that no forget has reached yet (a node back under its fixed
    id during a takeover: the restart drill saw them counted, and a repair then spent seconds on them). The node
    counts (``NodeManager.serving_ids``) only once this is done.
    """
    meta = env.meta
    if left is not None and node.node_id in left.left:
        # Back within its re-replication delay (``checkers.left``): still its replicas' member; what its previous
        # process held is forgotten, and the checker loads what its replicas lack on their own nodes (it among them).
        logger.info("query node {} is back within its re-replication delay: it keeps its place in its replicas",
                    node.node_id)
        if served is not None:
            await persist_lowered(meta, meta.collection_ids(), served.collection)
        await forget_copies(meta, node.node_id)
        await left.drop(node.node_id)
    elif node.node_id in meta.known_node_ids():
        logger.warning("query node {} joined while query meta still places copies on it: they are an earlier "
                       "process's and are forgotten", node.node_id)
        if served is not None:
            await persist_lowered(meta, meta.collection_ids(), served.collection)
        await meta.remove_node(node.node_id)
    if node.created:
        await incarnations.save(node.node_id, node.created)
    checker.kick()
