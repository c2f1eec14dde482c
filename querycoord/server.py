"""The QueryCoord gRPC service: decodes a request, runs its job (``querycoord.jobs``), encodes the answer.

The rules of each mutating call (Milvus's ``impl.go`` error cases, joining a
retried request, what the caller waits for) live in the jobs; reads are
answered here from the leader's meta, nodes and scheduler. Every answer
carries a Status (``querycoord.gate``). While this coordinator is not the
leader, every call but GetComponentStates, ShowCollections and ListTasks
(answered from etcd) aborts UNAVAILABLE naming the leader.

Every request is checked against the configured ``Limits`` first
(``querycoord.validate``; mutations by their job's ``check``): a malformed
one is answered ILLEGAL_ARGUMENT naming the field, its value and the limit,
before anything is queued or written. Id lists that only filter a read drop
repeated ids.
"""

from __future__ import annotations

from typing import Any

import grpc
from loguru import logger

from proto import common_pb2, data_pb2, querycoord_pb2, querycoord_pb2_grpc, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.client import NodeError
from querycoord.coordinator import Coordinator
from querycoord.errors import NotFound
from querycoord.gate import LeaderGate, Rpc, answered, budget
from querycoord.jobs import (
    Job,
    LoadBalanceJob,
    LoadCollectionJob,
    LoadPartitionsJob,
    ReleaseCollectionJob,
    ReleasePartitionsJob,
)
from querycoord.limits import Limits
from querycoord.protocol import QUERYCOORD_ROLE
from querycoord.querymeta import QueryMeta
from querycoord.switchover import coordinator_state, step_back, switch_over
from querycoord.task.model import record_info
from querycoord.task.store import TaskStore
from querycoord.validate import check_enums, check_id, check_ids, check_name, check_range

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)


def _job_call(job: type[Job[Any]], response_cls: type) -> Rpc:
    """A mutating call: its job (``querycoord.jobs``) runs on the leader; the answer carries the trigger's id."""

    @answered(response_cls)
    async def call(servicer: QueryCoordServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        job.check(request, servicer.limits)  # before anything is queued or written
        lead = await servicer.gate.lead(context)
        return response_cls(status=OK, task_id=await job(lead.scheduler, request, budget(context)).run())

    return call


class QueryCoordServicer(querycoord_pb2_grpc.QueryCoordServicer):
    def __init__(self, coord: Coordinator):
        self.coord = coord
        self.gate = LeaderGate(coord)
        self.limits: Limits = coord.config.limits

    async def _standby_meta(self) -> QueryMeta:
        """A standby answers reads from etcd: a fresh, read-only query meta."""
        assert self.coord.kv is not None
        meta = QueryMeta(self.coord.kv)
        await meta.reload()
        return meta

    # ----- mutating calls ---------------------------------------------------------------------------------------
    LoadCollection = _job_call(LoadCollectionJob, qc.LoadCollectionResponse)
    ReleaseCollection = _job_call(ReleaseCollectionJob, qc.ReleaseCollectionResponse)
    LoadPartitions = _job_call(LoadPartitionsJob, qc.LoadPartitionsResponse)
    ReleasePartitions = _job_call(ReleasePartitionsJob, qc.ReleasePartitionsResponse)
    LoadBalance = _job_call(LoadBalanceJob, qc.LoadBalanceResponse)

    # ----- collections and partitions -------------------------------------------------------------------------
    @answered(qc.ShowCollectionsResponse)
    async def ShowCollections(self, request, context):
        wanted = check_ids("collection_ids", request.collection_ids, self.limits.max_ids_per_request,
                           duplicates="drop")
        lead = self.gate.leadership()
        meta = lead.meta if lead is not None else await self._standby_meta()
        ids = wanted or sorted(c.collection_id for c in meta.collections())
        out = []
        for cid in ids:
            info = meta.get_collection(cid)
            if info is None:
                raise NotFound(f"collection {cid} has not been loaded")
            out.append(info)
        return qc.ShowCollectionsResponse(status=OK, collections=out)

    async def _partition_states(self, request, context) -> list[data_pb2.PartitionLoadInfo]:
        """The asked (or all) loaded partitions; NOT_FOUND naming those that are not loaded."""
        cid = check_id("collection_id", request.collection_id)
        wanted = check_ids("partition_ids", request.partition_ids, self.limits.max_partitions, duplicates="drop")
        lead = await self.gate.lead(context)
        info = lead.meta.get_collection(cid)
        if info is None:
            raise NotFound(f"collection {cid} has not been loaded")
        loaded = {p.partition_id: p for p in info.partitions}
        ids = wanted or sorted(loaded)
        missing = [p for p in ids if p not in loaded]
        if missing:
            raise NotFound(f"partitions {missing[:20]} of collection {cid} have not been loaded")
        return [loaded[p] for p in ids]

    @answered(qc.ShowPartitionsResponse)
    async def ShowPartitions(self, request, context):
        return qc.ShowPartitionsResponse(status=OK, partitions=await self._partition_states(request, context))

    @answered(qc.GetPartitionStatesResponse)
    async def GetPartitionStates(self, request, context):
        states = await self._partition_states(request, context)
        return qc.GetPartitionStatesResponse(status=OK, partition_descriptions=states)

    # ----- segments -------------------------------------------------------------------------------------------
    @answered(qc.GetSegmentInfoResponse)
    async def GetSegmentInfo(self, request, context):
        check_id("collection_id", request.collection_id, optional=True)
        wanted = set(check_ids("segment_ids", request.segment_ids, self.limits.max_ids_per_request,
                               duplicates="drop"))
        lead = await self.gate.lead(context)
        out: list[data_pb2.SegmentInfo] = []
        for node in lead.nodes.online():
            try:
                resp = await node.client.call("GetSegmentInfo", querynode_pb2.GetSegmentInfoRequest(
                    segment_ids=list(wanted), collection_id=request.collection_id))
            except NodeError as exc:
                logger.warning("GetSegmentInfo: {}", exc)
                continue
            out += [s for s in resp.infos if not wanted or s.segment_id in wanted]
        missing = wanted - {s.segment_id for s in out}
        if missing:
            raise NotFound(f"segments {sorted(missing)[:20]} are not loaded on any online node")
        return qc.GetSegmentInfoResponse(status=OK, infos=out)

    # ----- health and tasks -----------------------------------------------------------------------------------
    async def GetComponentStates(self, request, context):
        state = common_pb2.HEALTHY if self.coord.is_leader else common_pb2.STANDBY
        return common_pb2.ComponentStates(
            state=common_pb2.ComponentInfo(node_id=self.coord.server_id, role=QUERYCOORD_ROLE, state_code=state),
            status=OK,
        )

    @answered(qc.ListTasksResponse)
    async def ListTasks(self, request, context):
        check_id("collection_id", request.collection_id, optional=True)
        states = set(check_enums("states", request.states, qc.TaskState, self.limits.max_ids_per_request))
        # A larger page than the limit is capped (as the proto says); a negative one is refused.
        limit = min(check_range("limit", request.limit, 0, 2**31 - 1) or 100, self.limits.max_list_tasks)
        check_range("after_task_id", request.after_task_id, 0, 2**63 - 1)
        check_range("children_limit", request.children_limit, 0, 2**31 - 1)
        lead = self.gate.leadership()
        if lead is None:
            assert self.coord.kv is not None
            trees = trees_from_records(await TaskStore(self.coord.kv).load_all(), request.children_limit)
        else:
            sched = lead.scheduler
            trees = [sched.tree(t, request.children_limit) for t in sched.pending()]
            if request.include_finished:
                trees = sorted([*sched.finished, *trees], key=lambda tr: tr.trigger.task_id)
        if not request.include_children:
            # Copies: the scheduler keeps the finished trees for later calls.
            trees = [qc.TaskTree(trigger=tr.trigger, child_counts=tr.child_counts) for tr in trees]
        trees = [tr for tr in trees if tr.trigger.task_id > request.after_task_id
                 and (not request.collection_id or tr.trigger.collection_id == request.collection_id)
                 and (not states or tr.trigger.state in states)]
        page = trees[:limit]
        nxt = page[-1].trigger.task_id if len(trees) > limit else 0
        return qc.ListTasksResponse(status=OK, trees=page, next_after_task_id=nxt)

    @answered(qc.GetTaskResponse)
    async def GetTask(self, request, context):
        check_id("task_id", request.task_id)
        check_range("children_limit", request.children_limit, 0, 2**31 - 1)
        lead = await self.gate.lead(context)
        t = lead.scheduler.find(request.task_id)
        if t is not None:
            return qc.GetTaskResponse(status=OK, tree=lead.scheduler.tree(t, request.children_limit))
        for tree in lead.scheduler.finished:
            if tree.trigger.task_id == request.task_id or any(c.task_id == request.task_id
                                                                for c in tree.children):
                return qc.GetTaskResponse(status=OK, tree=tree)
        raise NotFound(f"task {request.task_id} is unknown (finished long ago?)")

    @answered(qc.ShowNodesResponse)
    async def ShowNodes(self, request, context):
        lead = await self.gate.lead(context)
        meta = lead.meta
        out = [
            qc.NodeInfo(
                node_id=n.node_id, address=n.address, state=n.state.value, memory_capacity=n.capacity,
                memory_used=meta.node_memory_usage(n.node_id), segment_count=len(meta.segments_on_node(n.node_id)),
                dm_channel_count=len(meta.channels_on_node(n.node_id)),
            )
            for n in sorted(lead.nodes.nodes.values(), key=lambda n: n.node_id)
        ]
        return qc.ShowNodesResponse(status=OK, nodes=out)

    # ----- coordinators: status and switchover (querycoord/switchover.py) ---------------------------------------
    @answered(qc.SwitchoverResponse)
    async def Switchover(self, request, context):
        check_name("target", request.target, self.limits.max_name_length, required=False)
        return await switch_over(self.coord, await self.gate.lead(context), request.target)

    @answered(qc.StepBackResponse)
    async def StepBack(self, request, context):
        check_name("requested_by", request.requested_by, self.limits.max_name_length, required=False)
        return qc.StepBackResponse(status=OK, election_revision=await step_back(self.coord, request.requested_by))

    async def GetCoordinatorState(self, request, context):
        return coordinator_state(self.coord)


def trees_from_records(records: list, children_limit: int = 0) -> list[qc.TaskTree]:
    """Task trees as persisted in etcd (what a standby can show)."""
    children: dict[int, list[qc.TaskInfo]] = {}
    triggers = []
    for r in sorted(records, key=lambda r: r.id):
        info = record_info(r)
        if r.parent_id:
            children.setdefault(r.parent_id, []).append(info)
        else:
            triggers.append(info)
    out = []
    for t in triggers:
        kids = children.get(t.task_id, [])
        counts = qc.ChildStateCounts(total=len(kids))
        for k in kids:
            name = qc.TaskState.Name(k.state).removeprefix("TASK_STATE_").lower()
            setattr(counts, name, getattr(counts, name) + 1)
        out.append(qc.TaskTree(trigger=t, children=kids[:children_limit] if children_limit else kids,
                               child_counts=counts))
    return out


def add_to_server(server: grpc.aio.Server, coord: Coordinator) -> None:
    querycoord_pb2_grpc.add_QueryCoordServicer_to_server(QueryCoordServicer(coord), server)


__all__ = ["QueryCoordServicer", "add_to_server", "querycoord_pb2"]
