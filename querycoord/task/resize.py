"""The UPDATE_LOAD_CONFIG trigger: a loaded collection resized in place to another number of replicas.

Grow: the new replicas (``resize_plan``: spare nodes, each replica its own) are added to the collection's record
as *joining* (its ``replica_number`` unchanged, so the collection's figures count only the old replicas), the
children load every segment and DM channel of the collection into them, and only once each new replica is whole
(its online nodes hold the collection's every segment and DM channel) does ``post_execute`` record the new number.
A grow that fails or is cancelled (a release) drops its joining replicas and releases the collection on their
nodes; the old replicas never change.

Shrink: the replicas to drop are chosen (the least complete) and written into this trigger's own record first,
then taken out of the collection's record with the new number in one put (from then on queries count only the
kept ones, which are untouched), then the children release the collection on the dropped replicas' nodes, which
become spares, and their records go.

A grow short of spare nodes first takes nodes from the collection's replicas that can spare them (the plan's
``rehomes``, written into this trigger's record before anything moves): a first phase moves each such node's
copies to the other nodes of its replica (``task.rehome``: each copy held by its destination before the source
releases it) and then takes the node out of its replica, a spare now; the trigger then plans again
(``another_phase``) and the grow goes on as above on the spares, those nodes among them.

Resumed by a new leader either way: before the commit point ``execute`` runs again and finds what it had done in
query meta (joining replicas) or in its own record (the replicas it drops); after it, the persisted children run
on and ``post_execute`` checks the nodes again.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from proto import common_pb2, data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.partition_state import NOT_PRESENT
from querycoord.common.replica_number import joining_replica_ids, loaded_replicas, serving_replica_ids
from querycoord.querymeta.copies import copies
from querycoord.served.state import collection_served
from querycoord.task.assign import Planned
from querycoord.task.children import LoadSegmentsTask, ReleaseCollectionOnNodeTask, plan_children
from querycoord.task.model import Task, TaskEnv, TaskError
from querycoord.task.rehome import finish_move, pending, plan_moves
from querycoord.task.resize_plan import plan_resize
from querycoord.task.triggers import TriggerTask, merge_channel


def resize_request(collection_id: int, number: int, current: int) -> task_pb2.ResizeReplicasRequest:
    """The persisted request of a resize of ``collection_id`` from ``current`` to ``number`` replicas."""
    return task_pb2.ResizeReplicasRequest(collection_id=collection_id, replica_number=number,
                                          from_replica_number=current)


class UpdateLoadConfigTask(TriggerTask, kind=qc.TASK_KIND_UPDATE_LOAD_CONFIG, request="update_load_config"):
    """Resize one loaded collection's replicas (see module docstring)."""

    def __init__(self, env: TaskEnv, rec: task_pb2.TaskRecord):
        super().__init__(env, rec)
        self.replica_total = 0  # segments each new replica must hold
        self.replica_loaded: dict[int, int] = {}  # joining replica -> segments it holds so far

    def summary(self) -> str:
        req = self.request
        return f"resize collection {self.collection_id}: {req.from_replica_number} -> {req.replica_number} replicas"

    def _info(self) -> data_pb2.CollectionLoadInfo:
        info = self.env.meta.get_collection(self.collection_id)
        if info is None:
            raise TaskError(f"collection {self.collection_id} is not loaded (released meanwhile)",
                            common_pb2.NOT_FOUND)
        if not info.replicas:
            raise TaskError(f"collection {self.collection_id} was loaded before replicas existed: release it and "
                            "load it again to change its replica number", common_pb2.CONFLICT)
        return info

    async def execute(self) -> None:
        env, cid, req = self.env, self.collection_id, self.request
        info = self._info()
        self.children = []
        moving = pending(env, cid, req.rehomes)
        if moving:  # the first phase, or its resumption by a new leader: the same nodes
            await self._rehome(moving)
            return
        if req.dropped_replica_ids:  # chosen by a run a leader change interrupted: the same ones
            dropped = list(req.dropped_replica_ids)
            groups: list[list[int]] = []
        else:
            plan = plan_resize(env, info, req.replica_number, rehome=not req.rehomes)
            if plan.rehomes:
                req.rehomes.extend(plan.rehomes)
                await env.store.save(self.rec)  # the choice survives a leader change before anything moves
                await self._rehome(list(plan.rehomes))
                return
            dropped, groups = plan.dropped, plan.new_groups
        if dropped:
            await self._drop(info, dropped)
            info = self._info()
        if groups:
            ids = await env.ids.allocate(len(groups))
            await env.meta.add_replicas(cid, [data_pb2.ReplicaInfo(replica_id=rid, collection_id=cid, node_ids=g)
                                              for rid, g in zip(ids, groups, strict=True)])
            info = self._info()
        joining = joining_replica_ids(info)
        if joining:
            self.children += await self._plan_loads(info, joining)

    async def _rehome(self, moves: list[task_pb2.RehomeNode]) -> None:
        """The first phase of a grow short of spares: move the copies of the nodes taken off them."""
        nodes = ", ".join(f"node {m.node_id} (replica {m.from_replica_id})" for m in moves)
        logger.info("{}: no spare node for every new replica: taking {} from the collection's replicas",
                    self.describe(), nodes)
        self.children = await plan_moves(self.env, self, self.collection_id, moves)

    async def _drop(self, info: data_pb2.CollectionLoadInfo, dropped: list[int]) -> None:
        """Record the replicas to drop and their nodes in this trigger's record, take them out of the collection's
        record, and plan the release of the collection on those nodes."""
        env, cid, req = self.env, self.collection_id, self.request
        if not req.dropped_replica_ids:
            gone = set(dropped)
            nodes = {n for r in info.replicas if r.replica_id in gone for n in r.node_ids}
            for sid in env.meta.segment_ids_of(cid):
                nodes |= {n for r, n in env.meta.segment_copies(sid).items() if r in gone}
            for w in env.meta.dm_channels_of(cid):
                nodes |= {n for r, n in copies(w).items() if r in gone}
            req.dropped_replica_ids.extend(sorted(gone))
            req.dropped_node_ids.extend(sorted(nodes))
            await env.store.save(self.rec)  # the choice survives a leader change before the commit point
        gone = set(req.dropped_replica_ids)
        counted = [r for r in serving_replica_ids(info) if r not in gone]  # joining ones stay joining
        await env.meta.drop_replicas(cid, gone, max(1, len(counted)))
        for node in req.dropped_node_ids:
            if env.nodes.is_online(node):
                self.children.append(ReleaseCollectionOnNodeTask.new(
                    env, querynode_pb2.ReleaseCollectionRequest(collection_id=cid),
                    trigger_condition=self.rec.trigger_condition, collection_id=cid, node_id=node, parent=self))

    async def _plan_loads(self, info: data_pb2.CollectionLoadInfo, joining: list[int]) -> list[Task]:
        """Children that make each joining replica whole: what it lacks of the loaded partitions' segments (the
        catalog's) and DM channels."""
        env, cid = self.env, self.collection_id
        pids = [p.partition_id for p in info.partitions if p.state != NOT_PRESENT]
        recovered = await asyncio.gather(*(env.broker.get_recovery_info(cid, pid) for pid in pids))
        binlogs: list[Planned] = []
        channels: dict[str, data_pb2.VChannelInfo] = {}
        for chans, bins in recovered:
            binlogs += list(bins)
            for c in chans:
                if c.channel_name in channels:
                    merge_channel(channels[c.channel_name], c)
                else:
                    channels[c.channel_name] = c
        self.replica_total = len(binlogs)
        load_type = info.load_type or data_pb2.LOAD_TYPE_COLLECTION
        all_pids = [] if load_type == data_pb2.LOAD_TYPE_COLLECTION else sorted(pids)
        out: list[Task] = []
        for replica in joining:
            todo = [b for b in binlogs if not self._holds(b.segment_id, replica)]
            self.replica_loaded[replica] = len(binlogs) - len(todo)
            watched = {w.dm_channel for w in env.meta.dm_channels_of(cid)
                       if (node := copies(w).get(replica, 0)) and env.nodes.is_online(node)}
            fresh = [c for name, c in sorted(channels.items()) if name not in watched]
            if todo or fresh:
                out += await plan_children(env, self, cid, todo, fresh, load_type=load_type,
                                           partition_ids=all_pids, replica_id=replica)
        return out

    def _holds(self, segment_id: int, replica_id: int) -> bool:
        node = self.env.meta.segment_copies(segment_id).get(replica_id, 0)
        return bool(node) and self.env.nodes.is_online(node)

    def on_child_done(self, child: Task) -> None:
        """A joining replica's progress: the share of the collection's segments it holds, capped at 99 until it
        is checked whole."""
        super().on_child_done(child)
        if not isinstance(child, LoadSegmentsTask) or not self.replica_total:
            return
        replica = child.request.replica_id
        if replica in self.replica_loaded:
            self.replica_loaded[replica] += child.segment_count()
            self.env.meta.set_replica_progress(self.collection_id, replica,
                                               min(99, 100 * self.replica_loaded[replica] // self.replica_total))

    async def post_execute(self) -> None:
        env, cid, req = self.env, self.collection_id, self.request
        moving = pending(env, cid, req.rehomes)
        if moving:  # the first phase is done: the nodes leave their replicas, then the grow plans again
            for move in moving:
                await finish_move(env, cid, move)
            self.another_phase = True
            return
        if req.dropped_node_ids:
            await env.meta.remove_collection_copies(cid, req.dropped_node_ids)
        info = self._info()
        joining = joining_replica_ids(info)
        if not joining:
            return
        served = collection_served(env.meta, cid, env.nodes.online_ids())
        for replica in joining:
            r = served.replicas.get(replica) if served is not None else None
            if r is None or not r.whole:
                held = f"{r.held}/{r.segments} segments, {r.channels_held}/{r.channels} DM channels" if r else "nothing"
                raise TaskError(f"new replica {replica} of collection {cid} is not whole after its loads: its online "
                                f"nodes hold {held}", common_pb2.UNEXPECTED_ERROR)
        await env.meta.set_replica_percentages(cid, {r: 100 for r in joining})
        await env.meta.set_replica_number(cid, len(info.replicas))

    def roll_back(self) -> list[Task]:
        """A failed or cancelled grow: release the collection on its joining replicas' nodes."""
        info = self.env.meta.get_collection(self.collection_id)
        if info is None:
            return []
        joining = set(joining_replica_ids(info))
        nodes = sorted({n for r in info.replicas if r.replica_id in joining for n in r.node_ids})
        return [ReleaseCollectionOnNodeTask.new(
            self.env, querynode_pb2.ReleaseCollectionRequest(collection_id=self.collection_id),
            trigger_condition=self.rec.trigger_condition, collection_id=self.collection_id, node_id=n, parent=self)
            for n in nodes if self.env.nodes.is_online(n)]

    async def after_failure(self) -> None:
        """Drop the joining replicas and their records; a shrink's dropped nodes lose their records too (the
        checker releases whatever such a node still holds: it serves no replica)."""
        env, cid, req = self.env, self.collection_id, self.request
        info = env.meta.get_collection(cid)
        if info is None:
            return
        joining = set(joining_replica_ids(info))
        nodes = {n for r in info.replicas if r.replica_id in joining for n in r.node_ids} | set(req.dropped_node_ids)
        if joining:
            await env.meta.drop_replicas(cid, joining, max(1, loaded_replicas(info)))
        if nodes:
            await env.meta.remove_collection_copies(cid, nodes)
