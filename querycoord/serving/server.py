"""The QueryCoord gRPC service: decodes a request, runs its job (``querycoord.leader.jobs``), encodes the answer.

The rules of each mutating call (Milvus's ``impl.go`` error cases, joining a
retried request, what the caller waits for) live in the jobs; reads are
answered here from the leader's meta, nodes and scheduler. Every answer
carries a Status (``querycoord.serving.gate``). While this coordinator is not the
leader, every call but GetComponentStates, ShowCollections, GetReplicas,
ListTasks and GetTask (answered from etcd: the query meta, task records and
the task history; the query meta from the warm standby's copy or one shared
reload, never one per call: ``querycoord.serving.standby_reads``) aborts UNAVAILABLE
naming the leader: CheckHealth and
Explain too, since only the leader knows which nodes are online now, what is
parked and what its triggers wait for (``querycoord.serving.health_rpc``).

Every request is checked against the configured ``Limits`` first
(``querycoord.common.validate``; mutations by their job's ``check``): a malformed
one is answered ILLEGAL_ARGUMENT naming the field, its value and the limit,
before anything is queued or written. Id lists that only filter a read drop
repeated ids.

The heavy reads (GetSegmentInfo, GetReplicas, ListTasks) run a few at a time
per kind (``querycoord.serving.read_slots``): a caller beyond the bound waits a
little, then gets RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from loguru import logger

from meta.kv import MetaKV
from proto import common_pb2, data_pb2, querycoord_pb2, querycoord_pb2_grpc, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.client import NodeError
from querycoord.common.errors import NotFound
from querycoord.common.limits import Limits
from querycoord.common.protocol import QUERYCOORD_ROLE
from querycoord.common.validate import check_enums, check_id, check_ids, check_name, check_range
from querycoord.common.yielding import TURN_EVERY
from querycoord.leader.cancel_job import cancel_task, check_cancel
from querycoord.leader.jobs import (
    Job,
    LoadBalanceJob,
    LoadPartitionsJob,
    ReleaseCollectionJob,
    ReleasePartitionsJob,
)
from querycoord.leader.maintenance import node_info, shown_node_ids
from querycoord.leader.resize_job import LoadOrResizeJob, UpdateLoadConfigJob
from querycoord.leader.switchover import coordinator_state, step_back, switch_over
from querycoord.leader.view import Leadership, Switchable
from querycoord.security.auth import caller
from querycoord.served.missing import SEGMENT_LIMIT_MAX
from querycoord.serving import balance_rpc
from querycoord.serving.gate import LeaderGate, Rpc, answered, budget
from querycoord.serving.health_rpc import CollectionNames, check_health, explain
from querycoord.serving.node_lifecycle_rpc import NodeLifecycleRpcs
from querycoord.serving.read_slots import ReadSlots
from querycoord.serving.standby_reads import StandbyReads
from querycoord.task.history import TaskHistory
from querycoord.task.model import record_info

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)


def _job_call(job: type[Job[Any]], response_cls: type) -> Rpc:
    """A mutating call: its job (``querycoord.leader.jobs``) runs on the leader; the answer carries the trigger's id."""

    @answered(response_cls)
    async def call(servicer: QueryCoordServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        job.check(request, servicer.limits)  # before anything is queued or written
        lead = await servicer.gate.lead(context)
        return response_cls(status=OK, task_id=await job(lead.scheduler, request, budget(context)).run())

    return call


class QueryCoordServicer(NodeLifecycleRpcs, querycoord_pb2_grpc.QueryCoordServicer):
    """The QueryCoord service of one coordinator, which it reads through ``Switchable`` (the reads, and the
    switchover it drives: ``querycoord.leader.view``)."""

    def __init__(self, coord: Switchable):
        self.coord = coord
        self.gate = LeaderGate(coord)
        self.limits: Limits = coord.config.limits
        self.names = CollectionNames()  # collection names for CheckHealth, looked up once each
        self.standby = StandbyReads(coord)  # what a standby reads: the warm copy, or one shared reload
        self.slots = ReadSlots(self.limits.max_heavy_reads, self.limits.max_heavy_reads_waiting)

    # ----- mutating calls ---------------------------------------------------------------------------------------
    LoadCollection = _job_call(LoadOrResizeJob, qc.LoadCollectionResponse)
    ReleaseCollection = _job_call(ReleaseCollectionJob, qc.ReleaseCollectionResponse)
    LoadPartitions = _job_call(LoadPartitionsJob, qc.LoadPartitionsResponse)
    ReleasePartitions = _job_call(ReleasePartitionsJob, qc.ReleasePartitionsResponse)
    LoadBalance = _job_call(LoadBalanceJob, qc.LoadBalanceResponse)

    @answered(qc.UpdateLoadConfigResponse)
    async def UpdateLoadConfig(self, request, context):
        """Resize loaded collections in place (``querycoord.leader.resize_job``): one trigger per collection."""
        UpdateLoadConfigJob.check(request, self.limits)  # before anything is queued or written
        lead = await self.gate.lead(context)
        ids = await UpdateLoadConfigJob(lead.scheduler, request, budget(context)).run_all()
        return qc.UpdateLoadConfigResponse(status=OK, task_id=ids[0] if ids else 0, task_ids=ids)

    # ----- collections and partitions -------------------------------------------------------------------------
    @answered(qc.ShowCollectionsResponse)
    async def ShowCollections(self, request, context):
        wanted = check_ids("collection_ids", request.collection_ids, self.limits.max_ids_per_request,
                           duplicates="drop")
        lead = self.gate.leadership()
        meta = lead.meta if lead is not None else await self.standby.meta()
        # From here on no await: a standby's meta is the warm copy, which changes between awaits.
        ids = wanted or sorted(c.collection_id for c in meta.collections())
        out = []
        for cid in ids:
            info = meta.get_collection(cid)
            if info is None:
                raise NotFound(f"collection {cid} has not been loaded")
            out.append(_shown(lead, info))
        return qc.ShowCollectionsResponse(status=OK, collections=out)

    @answered(qc.GetReplicasResponse)
    async def GetReplicas(self, request, context):
        """The replicas of a loaded collection (nodes, progress, segment count), by replica id; a standby answers
        from etcd as ShowCollections does."""
        cid = check_id("collection_id", request.collection_id)
        async with self.slots.hold("GetReplicas", budget(context)):
            lead = self.gate.leadership()
            meta = lead.meta if lead is not None else await self.standby.meta()
            # From here on no await: a standby's meta is the warm copy, which changes between awaits.
            if meta.get_collection(cid) is None:
                raise NotFound(f"collection {cid} has not been loaded")
            replicas = meta.replicas_of(cid)
            if lead is not None:
                replicas = lead.served.shown_replicas(replicas)
            return qc.GetReplicasResponse(status=OK, replicas=replicas)

    async def _partition_states(self, request, context) -> list[data_pb2.PartitionLoadInfo]:
        """The asked (or all) loaded partitions; NOT_FOUND naming those that are not loaded."""
        cid = check_id("collection_id", request.collection_id)
        wanted = check_ids("partition_ids", request.partition_ids, self.limits.max_partitions, duplicates="drop")
        lead = await self.gate.lead(context)
        info = lead.meta.get_collection(cid)
        if info is None:
            raise NotFound(f"collection {cid} has not been loaded")
        info = _shown(lead, info)
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
        async with self.slots.hold("GetSegmentInfo", budget(context)):
            return await self._segment_info(lead, wanted, request.collection_id)

    async def _segment_info(self, lead: Leadership, wanted: set[int], collection_id: int) -> Any:
        out: list[data_pb2.SegmentInfo] = []
        for node in lead.nodes.online():
            try:
                resp = await node.client.call("GetSegmentInfo", querynode_pb2.GetSegmentInfoRequest(
                    segment_ids=list(wanted), collection_id=collection_id))
            except NodeError as exc:
                logger.warning("GetSegmentInfo: {}", exc)
                continue
            for s in resp.infos:
                if not wanted or s.segment_id in wanted:
                    s.replica_id = lead.meta.replica_of_node(s.collection_id, node.node_id)  # this copy's replica
                    out.append(s)
        missing = wanted - {s.segment_id for s in out}
        if missing:
            raise NotFound(f"segments {sorted(missing)[:20]} are not loaded on any online node")
        # Copied into the answer a chunk at a time with turns between: 65,536 infos copied at once held the event
        # loop for a tenth of a second.
        resp = qc.GetSegmentInfoResponse(status=OK)
        for start in range(0, len(out), 8 * TURN_EVERY):
            if start:
                await asyncio.sleep(0)
            resp.infos.extend(out[start:start + 8 * TURN_EVERY])
        return resp

    # ----- health and explain (serving/health_rpc.py) -----------------------------------------------------------------
    @answered(qc.CheckHealthResponse)
    async def CheckHealth(self, request, context):
        wanted = check_ids("collection_ids", request.collection_ids, self.limits.max_ids_per_request,
                           duplicates="drop")
        lead = await self.gate.lead(context)
        resp = await check_health(lead, wanted, self.names)
        resp.status.CopyFrom(OK)
        return resp

    @answered(qc.ExplainResponse)
    async def Explain(self, request, context):
        check_id("collection_id", request.collection_id, optional=True)
        check_name("collection_name", request.collection_name, self.limits.max_name_length, required=False)
        check_range("segment_limit", request.segment_limit, 0, SEGMENT_LIMIT_MAX)
        resp = await explain(await self.gate.lead(context), request)
        resp.status.CopyFrom(OK)
        return resp

    # ----- component state and tasks ----------------------------------------------------------------------------
    async def GetComponentStates(self, request, context):
        state = common_pb2.HEALTHY if self.coord.is_leader else common_pb2.STANDBY
        return common_pb2.ComponentStates(
            state=common_pb2.ComponentInfo(node_id=self.coord.server_id, role=QUERYCOORD_ROLE, state_code=state),
            status=OK,
        )

    @answered(qc.ListTasksResponse)
    async def ListTasks(self, request, context):
        """Running trees (the leader's memory, or a standby's read of etcd) and, with ``include_finished``, the
        task history in etcd; ordered by trigger id (``newest_first``: descending), paged."""
        async with self.slots.hold("ListTasks", budget(context)):
            return await self._list_tasks(request)

    async def _list_tasks(self, request: qc.ListTasksRequest) -> qc.ListTasksResponse:
        check_id("collection_id", request.collection_id, optional=True)
        states = set(check_enums("states", request.states, qc.TaskState, self.limits.max_ids_per_request))
        # A larger page than the limit is capped (as the proto says); a negative one is refused.
        limit = min(check_range("limit", request.limit, 0, 2**31 - 1) or 100, self.limits.max_list_tasks)
        after = check_range("after_task_id", request.after_task_id, 0, 2**63 - 1)
        check_range("children_limit", request.children_limit, 0, 2**31 - 1)
        desc = request.newest_first

        def wanted(tr: qc.TaskTree) -> bool:
            i = tr.trigger.task_id
            return ((i < after if after else True) if desc else i > after) \
                and (not request.collection_id or tr.trigger.collection_id == request.collection_id) \
                and (not states or tr.trigger.state in states)

        lead = self.gate.leadership()
        finished = []
        if lead is None:
            trees = trees_from_records(await self._task_records(), request.children_limit)
        else:
            sched = lead.scheduler
            trees = [sched.tree(t, request.children_limit) for t in sched.pending()]
            if request.include_finished and sched.cfg.history_keep <= 0:  # no durable history: the memory's
                finished = list(sched.finished)
        if request.include_finished:
            finished += await TaskHistory(self._kv()).page(after=after, newest_first=desc, want=limit + 1,
                                                           keep=wanted)
        # The same id in several sources (a tree finishing while we read): its history record wins.
        by_id = {tr.trigger.task_id: tr for tr in [*trees, *finished] if wanted(tr)}
        ordered = [by_id[i] for i in sorted(by_id, reverse=desc)]
        page: list[qc.TaskTree] = []
        size = 0
        for tr in ordered[:limit]:
            tr = _shaped(tr, request.include_children, request.children_limit)
            size += tr.ByteSize()
            if page and size > _PAGE_BYTES:  # the next page carries it: an answer stays below 4 MiB
                break
            page.append(tr)
        more = len(page) < len(ordered)
        return qc.ListTasksResponse(status=OK, trees=page, next_after_task_id=page[-1].trigger.task_id if more else 0)

    @answered(qc.GetTaskResponse)
    async def GetTask(self, request, context):
        """A running tree (by trigger or child id), else the task history's record; on any coordinator."""
        check_id("task_id", request.task_id)
        check_range("children_limit", request.children_limit, 0, 2**31 - 1)
        tid = request.task_id
        lead = self.gate.leadership()
        tree = None
        if lead is not None:
            t = lead.scheduler.find(tid)
            if t is not None:
                tree = lead.scheduler.tree(t, request.children_limit)
            elif lead.scheduler.cfg.history_keep <= 0:  # no durable history: the memory's
                tree = next((tr for tr in lead.scheduler.finished if tr.trigger.task_id == tid
                             or any(c.task_id == tid for c in tr.children)), None)
        else:
            running = trees_from_records(await self._task_records())
            tree = next((tr for tr in running if tr.trigger.task_id == tid
                         or any(c.task_id == tid for c in tr.children)), None)
        if tree is None:
            tree = await TaskHistory(self._kv()).find(tid)
        if tree is None:
            raise NotFound(f"task {tid} is unknown (neither running nor in the task history)")
        return qc.GetTaskResponse(status=OK, tree=_shaped(tree, True, request.children_limit))

    def _kv(self) -> MetaKV:
        assert self.coord.kv is not None
        return self.coord.kv

    async def _task_records(self) -> list:
        """The persisted task records (what a standby knows of running trees), read once for concurrent callers."""
        return await self.standby.task_records()

    @answered(qc.CancelTaskResponse)
    async def CancelTask(self, request, context):
        """Cancel a queued or running trigger (``querycoord.leader.cancel_job``); the leader answers."""
        check_cancel(request)
        lead = await self.gate.lead(context)
        who = caller()
        name = who.name if who is not None else f"an unauthenticated caller at {context.peer()}"
        task = await cancel_task(lead.scheduler, self._kv(), request, name)
        return qc.CancelTaskResponse(status=OK, task=task)

    @answered(qc.ShowNodesResponse)
    async def ShowNodes(self, request, context):
        lead = await self.gate.lead(context)
        out = [node_info(lead, n) for n in shown_node_ids(lead)]
        return qc.ShowNodesResponse(status=OK, nodes=out)

    # ----- coordinators: status and switchover (leader/switchover.py) -----------------------------------------------
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

    # ----- balance pause and check kinds at runtime (serving/balance_rpc.py) -------------------------------------
    SuspendBalance = balance_rpc.suspend_balance
    ResumeBalance = balance_rpc.resume_balance
    CheckBalanceStatus = balance_rpc.check_balance_status
    ListCheckers = balance_rpc.list_checkers
    ActivateChecker = balance_rpc.activate_checker
    DeactivateChecker = balance_rpc.deactivate_checker



def _shown(lead: Leadership | None, info: data_pb2.CollectionLoadInfo) -> data_pb2.CollectionLoadInfo:
    """A collection's record as the leader shows it: no percentage above what online nodes serve
    (``querycoord.served``). A standby shows the persisted record, which the leader lowers when a node is lost."""
    return info if lead is None else lead.served.shown(info)


# Bytes of trees in one ListTasks answer at most (clients accept 4 MiB); the rest goes to the next page.
_PAGE_BYTES = 3 * 1024 * 1024


def _shaped(tree: qc.TaskTree, include_children: bool, children_limit: int) -> qc.TaskTree:
    """A copy of ``tree`` with the children asked for (none, the first ``children_limit``, or all): trees kept
    by the scheduler or read from the history are never changed in place."""
    kids = list(tree.children) if include_children else []
    if children_limit:
        kids = kids[:children_limit]
    return qc.TaskTree(trigger=tree.trigger, children=kids, child_counts=tree.child_counts, waits=tree.waits)


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


def add_to_server(server: grpc.aio.Server, coord: Switchable) -> None:
    querycoord_pb2_grpc.add_QueryCoordServicer_to_server(QueryCoordServicer(coord), server)


__all__ = ["QueryCoordServicer", "add_to_server", "querycoord_pb2"]
