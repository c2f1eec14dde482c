"""The checker's trigger: close one collection's difference between target and distribution.

The checker (``querycoord.checkers``) only observes; everything it wants done
goes through the scheduler as a REPAIR trigger, so it is persisted, shown by
ListTasks with trigger condition CHECKER, serialised with every other trigger
of the collection, and resumed by a new leader like any other tree.

Planning re-checks against current meta (the world may have moved between
the check and the run): a segment someone else loaded meanwhile is not loaded
again, and each release child weighs its copies once more when it runs
(``task.release_guard``): a copy that became its replica's only one stays. What
each replica lacks is planned as one unit: replicas left with no online node
get a spare first (``units.give_spares``), and a unit that cannot be placed is
parked (``task.parking``) while the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from meta.errors import MetaError
from proto import data_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.task.children import (
    ReleaseCollectionOnNodeTask,
    ReleaseDmChannelsTask,
    ReleaseSegmentsTask,
    plan_children,
)
from querycoord.task.model import Task
from querycoord.task.prefetch import CATCH_UP
from querycoord.task.triggers import TriggerTask, park_lost_child, segment_load_info
from querycoord.task.units import give_spares, park_unplaced

# Partitions whose catalog records a repair reads at once.
PARTITION_READS = 8


def _copy_node(places: Mapping[int, tuple[int, int, tuple[int, ...]]], segment_id: int, replica_id: int) -> int:
    """The node of replica ``replica_id``'s recorded copy of the segment (0: none), from its place."""
    place = places.get(segment_id)
    if place is None:
        return 0
    flat = place[2]
    for i in range(0, len(flat), 2):
        if flat[i] == replica_id:
            return flat[i + 1]
    return 0


class RepairTask(TriggerTask, kind=qc.TASK_KIND_REPAIR, request="repair"):
    def summary(self) -> str:
        return f"repair collection {self.collection_id}: {self.request.reason}"

    async def park_unplaced_child(self, child: Task, cause: BaseException | None, error: NoAvailableNode) -> bool:
        """A repair's load or watch whose node was lost, cut off or full, with no other place for it now: its unit
        is parked (DESIGN rule 9) and the repair's other units go on. Failing the repair instead rolled back
        what the others had moved and held the collection until a later pass (the restart drill: a node lost
        just after a takeover left its replica with no online node, and the whole repair FAILED)."""
        return await park_lost_child(self, child, cause, error)

    async def execute(self) -> None:
        env, cid, req = self.env, self.collection_id, self.request
        meta = env.meta
        if req.adopt:
            await meta.save_segments(list(req.adopt))
        forget = [s for s in req.forget_segment_ids if meta.get_segment(s) is not None]
        if forget:
            await meta.remove_segments(forget)
        adopt = self._adoptable_watches()
        if adopt:
            await meta.save_dm_channel_watch(adopt)
        children: list[Task] = []
        cond = self.rec.trigger_condition
        for node_id in req.release_collection_on_nodes:
            if env.nodes.is_online(node_id) and not meta.has_collection(cid):
                children.append(ReleaseCollectionOnNodeTask.new(
                    env, querynode_pb2.ReleaseCollectionRequest(collection_id=cid), trigger_condition=cond,
                    collection_id=cid, node_id=node_id, parent=self))
        for ns in req.release_segments:
            if not env.nodes.is_online(ns.node_id):
                continue
            children.append(ReleaseSegmentsTask.new(
                env, querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=list(ns.segment_ids)),
                trigger_condition=cond, collection_id=cid, node_id=ns.node_id, parent=self))
        for nc in req.release_dm_channels:
            if env.nodes.is_online(nc.node_id) and meta.has_collection(cid):
                unwatch = querynode_pb2.ReleaseDmChannelsRequest(collection_id=cid, channel_names=nc.channel_names)
                children.append(ReleaseDmChannelsTask.new(env, unwatch, trigger_condition=cond, collection_id=cid,
                                                          node_id=nc.node_id, parent=self))
        if meta.has_collection(cid):
            await give_spares(env, cid)
            children += await self._plan_units()
        self.children = children

    def _adoptable_watches(self) -> list[data_pb2.DmChannelWatchInfo]:
        """The DM channel watches to record on the replica watcher the checker kept, still valid now: its replica
        exists, its node is online, and it serves a partition that is still loaded (or the whole collection)."""
        env, cid, meta = self.env, self.collection_id, self.env.meta
        replicas = set(meta.replica_ids(cid))
        out = []
        for w in self.request.adopt_dm_channels:
            parts = [p for p in w.partition_ids if meta.has_partition(cid, p)]
            if w.replica_id in replicas and env.nodes.is_online(w.node_id) and (parts or not w.partition_ids):
                watch = data_pb2.DmChannelWatchInfo()
                watch.CopyFrom(w)
                watch.partition_ids[:] = parts
                out.append(watch)
        return out

    async def _plan_units(self) -> list[Task]:
        """Load what each replica lacks and watch its unwatched DM channels, one replica (a unit) at a time: a
        unit that cannot be placed now is parked with its reason (``task.parking``) and the others go on."""
        env, cid, meta = self.env, self.collection_id, self.env.meta
        # A copy still recorded on the online node the checker saw without the segment is stale: removed, by node,
        # in as few txns as the limits allow. One on an offline node (a lost node's: ``watchers.forget_node``)
        # counts for nothing and stays until the load that replaces it rewrites its record (``with_copy``): a
        # delete now would be a second write of every record that moves. One on another online node means
        # somebody loaded it since: leave it.
        online = env.nodes.is_online
        stale: dict[int, list[int]] = {}
        places = meta.segment_places()
        nodes: dict[tuple[int, int], int] = {}  # (id of a place, replica) -> its copy's node: once per place
        for s in self.request.missing_segments:
            sid, replica = s.segment_id, s.replica_id
            key = (id(places.get(sid)), replica)
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = _copy_node(places, sid, replica)
            if node and node == s.node_id and online(node):
                stale.setdefault(node, []).append(sid)
        for node, ids in sorted(stale.items()):
            await meta.remove_segment_copies(node, ids)
        replicas = set(meta.replica_ids(cid))
        loaded = set(meta.partition_ids(cid))  # asked once: a part names tens of thousands of segments
        missing: dict[int, dict[int, list[int]]] = {}
        places = meta.segment_places()  # after the removals' awaits: the places as they are now
        served: dict[tuple[int, int], bool] = {}  # (id of a place, replica) -> its copy is on an online node
        for s in self.request.missing_segments:
            sid, replica, pid = s.segment_id, s.replica_id, s.partition_id
            if replica not in replicas or pid not in loaded:
                continue
            key = (id(places.get(sid)), replica)
            held = served.get(key)
            if held is None:  # once per place (a lost node's copies of a partition share theirs)
                held = served[key] = online(_copy_node(places, sid, replica))
            if not held:
                missing.setdefault(replica, {}).setdefault(pid, []).append(sid)
        rewatch: dict[int, list[data_pb2.DmChannelWatchInfo]] = {}
        for w in self.request.rewatch:
            if w.replica_id in replicas:  # else the replica is gone (released and loaded again meanwhile)
                rewatch.setdefault(w.replica_id, []).append(w)
        out: list[Task] = []
        for replica in sorted(set(missing) | set(rewatch)):
            infos = await self._load_infos(sorted(missing.get(replica, {}).items()))
            try:
                out += await self._plan_unit(replica, infos, rewatch.get(replica, []))
            except NoAvailableNode as exc:
                park_unplaced(env, cid, replica, infos, [w.dm_channel for w in rewatch.get(replica, [])],
                              by=self.describe(), error=exc)
        return out

    async def _load_infos(self, by_partition: list[tuple[int, list[int]]]) -> list[data_pb2.SegmentLoadInfo]:
        """The catalog records of the segments to load, partition by partition in order: up to
        ``PARTITION_READS`` partitions read at once (each read is a few round trips to etcd, mostly waiting)."""
        env, cid = self.env, self.collection_id
        gate = asyncio.Semaphore(PARTITION_READS)
        ahead = await env.prefetch.take(cid, [s for _, ids in by_partition for s in ids]) if by_partition else {}
        targets = env.targets
        if ahead and targets is not None:  # checked against the copy brought up to etcd's revision: a read now
            try:
                await targets.catch_up(CATCH_UP)
            except (TimeoutError, MetaError):
                ahead = {}

        async def read(pid: int, ids: list[int]) -> list[data_pb2.SegmentLoadInfo]:
            # Records read ahead (``task.prefetch``) of segments the followed catalog copy still holds; the rest
            # (and everything without a copy to check against) read now.
            held = targets.partition_segments(cid, pid) if ahead and targets is not None else None
            known = {s: ahead[s] for s in ids if held is not None and s in held and s in ahead
                     and ahead[s].partition_id == pid}
            rest = [s for s in ids if s not in known]
            if rest:
                async with gate:
                    _, binlogs = await env.broker.get_recovery_info(cid, pid, rest)
                known.update((b.segment_id, b) for b in binlogs)
            env.prefetch.taken += len(ids) - len(rest)
            return [segment_load_info(known[s]) for s in ids if s in known]

        parts = await asyncio.gather(*(read(pid, ids) for pid, ids in by_partition))
        return [info for part in parts for info in part]

    async def _plan_unit(self, replica: int, infos: list[data_pb2.SegmentLoadInfo],
                         watches: list[data_pb2.DmChannelWatchInfo]) -> list[Task]:
        env, cid, meta = self.env, self.collection_id, self.env.meta
        load_type = meta.get_load_type(cid) or data_pb2.LOAD_TYPE_COLLECTION
        out: list[Task] = []
        if infos:
            out += await plan_children(env, self, cid, infos, [], replica_id=replica, load_type=load_type)
        for w in watches:
            chan = data_pb2.VChannelInfo(collection_id=cid, channel_name=w.dm_channel)
            include = [w.node_id] if w.node_id and env.nodes.is_online(w.node_id) else []
            out += await plan_children(env, self, cid, [], [chan], include=include, load_type=load_type,
                                       partition_ids=list(w.partition_ids), replica_id=replica)
        return out
