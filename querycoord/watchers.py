"""The leader's observers: catalog handoff and node changes, feeding the scheduler and the checker.

``balance_away`` is what a node going down queues.

Both run for the whole leadership and must never die on one error (a dead
handoff loop silently stops loading new segments): a failure is logged,
counted, and the loop starts again.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from meta.errors import NotLeader
from meta.kv import MetaKV
from proto import data_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.broker import Broker
from querycoord.catalog.store import SegmentResync
from querycoord.checker import Checker
from querycoord.cluster.nodes import NodeManager
from querycoord.querymeta import QueryMeta
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import HandoffTask, LoadBalanceTask

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
            logger.opt(exception=exc).warning("handoff: the catalog watch failed ({} so far): {}; restarting",
                                              errors, exc)
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


async def balance_away(scheduler: Scheduler, meta: QueryMeta, node_id: int) -> None:
    """A node is down: queue a NodeDown balance of what meta places on it, or forget it if meta places nothing
    there."""
    if not meta.segments_on_node(node_id) and not meta.channels_on_node(node_id):
        await scheduler.env.nodes.remove(node_id)
        return
    req = qc.LoadBalanceRequest(source_node_ids=[node_id], reason=qc.BALANCE_REASON_NODE_DOWN)
    task = LoadBalanceTask.new(scheduler.env, req, trigger_condition=qc.TRIGGER_CONDITION_NODE_DOWN)
    await scheduler.enqueue(task)
    logger.info("node {} down: queued balance task {}", node_id, task.id)
