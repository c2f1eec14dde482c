"""Parked units: a replica that lacks something no node can take now is parked with its reason (``task.parking``)
instead of queuing a repair that would fail pass after pass; it is weighed again at every pass."""

from __future__ import annotations

from loguru import logger

from proto import data_pb2, task_pb2
from querycoord.checkers.scan import describe
from querycoord.cluster.allocator import Usage
from querycoord.task.model import TaskEnv
from querycoord.task.units import assess, spare_plan


def _by_replica(req: task_pb2.RepairRequest) -> tuple[dict[int, list[data_pb2.SegmentInfo]],
                                                      dict[int, list[data_pb2.DmChannelWatchInfo]]]:
    missing: dict[int, list[data_pb2.SegmentInfo]] = {}
    for s in req.missing_segments:
        missing.setdefault(s.replica_id, []).append(s)
    rewatch: dict[int, list[data_pb2.DmChannelWatchInfo]] = {}
    for w in req.rewatch:
        rewatch.setdefault(w.replica_id, []).append(w)
    return missing, rewatch


def weigh_units(env: TaskEnv, cid: int, req: task_pb2.RepairRequest, usage: Usage,
                parked_now: dict[tuple[int, int], str]) -> set[int]:
    """Keep in ``req`` only the units (replicas) that can be placed now; park the others with their reason (also
    in ``parked_now``). Returns the replicas that lack something, placeable or not."""
    missing, rewatch = _by_replica(req)
    units = set(missing) | set(rewatch)
    if not units:
        return units
    spares = spare_plan(env, cid)
    placeable: set[int] = set()
    for replica in sorted(units):
        before = env.parked.get(cid, replica)
        parked = assess(env, cid, replica, missing.get(replica, []),
                        [w.dm_channel for w in rewatch.get(replica, [])], usage,
                        planned=[spares[replica]] if replica in spares else [])
        if parked is None:
            placeable.add(replica)
            if env.parked.unpark(cid, replica) is not None:
                logger.info("checker: replica {} of collection {} can be placed now", replica, cid)
            continue
        env.parked.park(parked)
        parked_now[(cid, replica)] = parked.reason
        if before is None or before.code != parked.code:
            logger.warning("checker: replica {} of collection {} parked: {}", replica, cid, parked.reason)
    kept_missing = [s for s in req.missing_segments if s.replica_id in placeable]
    kept_rewatch = [w for w in req.rewatch if w.replica_id in placeable]
    del req.missing_segments[:]
    req.missing_segments.extend(kept_missing)
    del req.rewatch[:]
    req.rewatch.extend(kept_rewatch)
    req.reason = describe(req)
    return units
