"""Reconciliation: before a new leader resumes, make query meta and the nodes agree.

Query meta says what should be where; ``GetDataDistribution`` says what each
online node actually holds. A leader that died mid-way can leave them apart
(a load answered by a node but not yet recorded, a release recorded but not
yet sent). Rules, for collections that no resumed trigger is working on
(a resumed trigger re-sends its own idempotent calls):

* a segment a node holds whose collection or partition is not loaded, or
  that meta places on another node, is released there (a duplicate);
* a segment a node holds that meta does not know, of a loaded partition,
  is adopted (recorded on that node);
* a segment meta places on an online node that does not hold it is
  forgotten and loaded again through a handoff trigger;
* a DM channel meta assigns to an online node that does not watch it is
  watched again there; a DM channel a node watches for a collection that
  is not loaded is released with the collection.

Offline nodes are left to their NodeDown balance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loguru import logger

from proto import data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.client import NodeError
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import HandoffTask

SEALED = data_pb2.SEGMENT_STATE_SEALED


@dataclass
class ReconcileReport:
    released: dict[int, list[int]] = field(default_factory=dict)  # node -> segment ids
    adopted: list[int] = field(default_factory=list)
    reloaded: list[int] = field(default_factory=list)
    rewatched: list[str] = field(default_factory=list)
    released_collections: dict[int, list[int]] = field(default_factory=dict)  # node -> collection ids
    unreachable: list[int] = field(default_factory=list)

    def changed(self) -> bool:
        return bool(self.released or self.adopted or self.reloaded or self.rewatched or self.released_collections)


async def reconcile(scheduler: Scheduler) -> ReconcileReport:
    env = scheduler.env
    meta, nodes = env.meta, env.nodes
    busy = {c for t in scheduler.triggers.values() for c in t.collections()} | {
        t.collection_id for t in scheduler.triggers.values()}
    report = ReconcileReport()
    dists: dict[int, querynode_pb2.GetDataDistributionResponse] = {}
    for node in nodes.online():
        try:
            dists[node.node_id] = await node.client.call("GetDataDistribution",
                                                         querynode_pb2.GetDataDistributionRequest())
        except NodeError as exc:
            logger.warning("reconcile: node {} did not report its distribution: {}", node.node_id, exc)
            report.unreachable.append(node.node_id)

    held_by: dict[int, set[int]] = {}
    adopt: list[data_pb2.SegmentInfo] = []
    for node_id, dist in dists.items():
        release: list[int] = []
        release_colls: set[int] = set()
        for s in dist.segments:
            if s.collection_id in busy:
                continue
            held_by.setdefault(s.segment_id, set()).add(node_id)
            if not meta.has_collection(s.collection_id):
                release_colls.add(s.collection_id)
                continue
            if not meta.has_partition(s.collection_id, s.partition_id):
                release.append(s.segment_id)
                continue
            known = meta.get_segment(s.segment_id)
            if known is None:
                if not any(a.segment_id == s.segment_id for a in adopt):
                    rec = data_pb2.SegmentInfo()
                    rec.CopyFrom(s)
                    rec.node_id, rec.state = node_id, SEALED
                    adopt.append(rec)
                else:
                    release.append(s.segment_id)  # a second copy of a segment being adopted
            elif known.node_id != node_id:
                release.append(s.segment_id)
        for ch in dist.channels:
            if ch.collection_id not in busy and not meta.has_collection(ch.collection_id):
                release_colls.add(ch.collection_id)
        client = nodes.client(node_id)
        for cid in sorted(release_colls):
            try:
                await client.call("ReleaseCollection", querynode_pb2.ReleaseCollectionRequest(collection_id=cid))
                report.released_collections.setdefault(node_id, []).append(cid)
            except NodeError as exc:
                logger.warning("reconcile: releasing collection {} on node {} failed: {}", cid, node_id, exc)
        if release:
            by_coll: dict[int, list[int]] = {}
            for sid in release:
                seg = next(s for s in dist.segments if s.segment_id == sid)
                by_coll.setdefault(seg.collection_id, []).append(sid)
            for cid, sids in by_coll.items():
                try:
                    await client.call("ReleaseSegments",
                                      querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=sids))
                    report.released.setdefault(node_id, []).extend(sids)
                except NodeError as exc:
                    logger.warning("reconcile: releasing {} on node {} failed: {}", sids, node_id, exc)
    if adopt:
        await meta.save_segments(adopt)
        report.adopted = [s.segment_id for s in adopt]

    # Segments meta places on an online node that does not hold them: forget and load again.
    missing: dict[int, list[data_pb2.SegmentInfo]] = {}
    for node_id in dists:
        for seg in meta.segments_on_node(node_id):
            if seg.collection_id in busy or node_id in held_by.get(seg.segment_id, set()):
                continue
            missing.setdefault(seg.collection_id, []).append(seg)
    for cid, segs in missing.items():
        await meta.remove_segments([s.segment_id for s in segs])
        req = task_pb2.HandoffSegmentsRequest(segment_infos=[
            data_pb2.SegmentInfo(segment_id=s.segment_id, collection_id=cid, partition_id=s.partition_id)
            for s in segs])
        t = HandoffTask.new(env, req, trigger_condition=qc.TRIGGER_CONDITION_HANDOFF, collection_id=cid)
        await scheduler.enqueue(t)  # type: ignore[arg-type]
        report.reloaded += [s.segment_id for s in segs]

    # DM channels meta assigns to an online node that lost them.
    for node_id, dist in dists.items():
        watched = {c.channel_name for c in dist.channels if c.kind == querynode_pb2.CHANNEL_KIND_DM}
        for w in meta.channels_on_node(node_id):
            if w.collection_id in busy or w.dm_channel in watched:
                continue
            req = querynode_pb2.WatchDmChannelsRequest(
                collection_id=w.collection_id, partition_ids=list(w.partition_ids),
                infos=[data_pb2.VChannelInfo(collection_id=w.collection_id, channel_name=w.dm_channel)],
                load_type=meta.get_load_type(w.collection_id) or data_pb2.LOAD_TYPE_COLLECTION)
            try:
                await nodes.client(node_id).call("WatchDmChannels", req)
                report.rewatched.append(w.dm_channel)
            except NodeError as exc:
                logger.warning("reconcile: re-watching {} on node {} failed: {}", w.dm_channel, node_id, exc)
    if report.changed():
        logger.info("reconcile: {}", report)
    return report
