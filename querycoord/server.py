"""The QueryCoord gRPC service: validation and error cases of Milvus's ``impl.go``, then the scheduler.

Every answer carries a Status; no exception reaches gRPC. Loads answer once
their plan is persisted (the client follows progress with ShowCollections or
GetTask); releases answer once done. While this coordinator is not the
leader, every call but GetComponentStates answers NOT_LEADER naming the leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from loguru import logger

from meta.errors import MetaError, MetaUnavailable, NotLeader
from proto import common_pb2, data_pb2, querycoord_pb2, querycoord_pb2_grpc, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.broker import BrokerError
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.client import NodeError
from querycoord.coordinator import Coordinator, Leadership
from querycoord.querymeta import QueryMeta
from querycoord.task.model import TaskError, record_info
from querycoord.task.store import TaskStore
from querycoord.task.triggers import (
    LoadBalanceTask,
    LoadCollectionTask,
    LoadPartitionsTask,
    ReleaseCollectionTask,
    ReleasePartitionsTask,
    TriggerTask,
)

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)
COLLECTION, PARTITION = data_pb2.LOAD_TYPE_COLLECTION, data_pb2.LOAD_TYPE_PARTITION


class Refused(Exception):
    def __init__(self, code: int, reason: str):
        self.code, self.reason = code, reason
        super().__init__(reason)


def status(code: int, reason: str) -> common_pb2.Status:
    return common_pb2.Status(error_code=code, reason=reason)


class QueryCoordServicer(querycoord_pb2_grpc.QueryCoordServicer):
    def __init__(self, coord: Coordinator):
        self.coord = coord

    # ----- plumbing -------------------------------------------------------------------------------------------
    async def _lead(self, context: grpc.aio.ServicerContext | None = None) -> Leadership:
        """The leadership, or (on a standby) gRPC UNAVAILABLE naming the leader, so clients move on."""
        lead = self.coord.leadership
        if lead is None or lead.scheduler.stopped or not self.coord.is_leader:
            message = await self.coord.not_leader_message()
            if context is not None:
                await context.abort(grpc.StatusCode.UNAVAILABLE, message)
            raise Refused(common_pb2.NOT_LEADER, message)
        return lead

    async def _standby_meta(self) -> QueryMeta:
        """A standby answers reads from etcd: a fresh, read-only query meta."""
        assert self.coord.kv is not None
        meta = QueryMeta(self.coord.kv)
        await meta.reload()
        return meta

    async def _answer(self, response_cls: type, fn: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await fn()
        except grpc.aio.AbortError:
            raise  # context.abort(): the status is already set
        except Refused as exc:
            return response_cls(status=status(exc.code, exc.reason))
        except TaskError as exc:
            return response_cls(status=status(exc.code, exc.reason))
        except NoAvailableNode as exc:
            return response_cls(status=status(exc.code, str(exc)))
        except BrokerError as exc:
            return response_cls(status=status(exc.code, str(exc)))
        except NotLeader:
            return response_cls(status=status(common_pb2.NOT_LEADER, await self.coord.not_leader_message()))
        except MetaUnavailable as exc:
            return response_cls(status=status(common_pb2.META_UNAVAILABLE, str(exc)))
        except MetaError as exc:
            return response_cls(status=status(common_pb2.UNEXPECTED_ERROR, str(exc)))
        except TimeoutError:
            return response_cls(status=status(common_pb2.TIMEOUT, "the request did not finish before its deadline; "
                                              "it may still complete: check ListTasks"))
        except Exception as exc:  # a bug must not crash the server or leave the caller hanging
            logger.exception("unexpected error in {}", response_cls.__name__)
            return response_cls(status=status(common_pb2.UNEXPECTED_ERROR, f"internal error: {exc!r}"))

    @staticmethod
    def _budget(context: grpc.aio.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else max(0.1, remaining - 0.2)

    async def _submit(self, lead: Leadership, task: TriggerTask, wait_done: bool,
                      context: grpc.aio.ServicerContext) -> int:
        await lead.scheduler.enqueue(task)
        fut = task.finished if wait_done else task.planned
        await asyncio.wait_for(asyncio.shield(fut), self._budget(context))
        return task.id

    # ----- collections ----------------------------------------------------------------------------------------
    async def ShowCollections(self, request, context):
        async def run():
            lead = self.coord.leadership if self.coord.is_leader else None
            meta = lead.meta if lead is not None else await self._standby_meta()
            ids = list(request.collection_ids) or sorted(c.collection_id for c in meta.collections())
            out = []
            for cid in ids:
                info = meta.get_collection(cid)
                if info is None:
                    raise Refused(common_pb2.NOT_FOUND, f"collection {cid} has not been loaded")
                out.append(info)
            return qc.ShowCollectionsResponse(status=OK, collections=out)

        return await self._answer(qc.ShowCollectionsResponse, run)

    async def LoadCollection(self, request, context):
        async def run():
            lead = await self._lead(context)
            cid = request.collection_id
            await self.coord.broker.describe_collection(cid)  # NOT_FOUND if unknown  # type: ignore[union-attr]
            load_type = lead.meta.get_load_type(cid)
            if load_type == PARTITION or self._pending_load(lead, cid, qc.TASK_KIND_LOAD_PARTITION):
                raise Refused(common_pb2.CONFLICT,
                              f"collection {cid} is loaded as partitions: release partitions first")
            pending = self._pending_load(lead, cid, qc.TASK_KIND_LOAD_COLLECTION)
            if pending is not None:  # a retry of a load in progress: answer as the first call is answered
                return qc.LoadCollectionResponse(status=OK, task_id=await self._join(pending, context))
            if load_type == COLLECTION and not self._pending_release(lead, cid):
                # Loaded; whatever a node lost since, the checker loads again.
                return qc.LoadCollectionResponse(status=OK, task_id=0)
            req = qc.LoadCollectionRequest()
            req.CopyFrom(request)
            task = LoadCollectionTask.new(lead.env, req, trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST,
                                          collection_id=cid)
            tid = await self._submit(lead, task, False, context)  # type: ignore[arg-type]
            return qc.LoadCollectionResponse(status=OK, task_id=tid)

        return await self._answer(qc.LoadCollectionResponse, run)

    @staticmethod
    def _pending(lead: Leadership, cid: int) -> bool:
        return any(t.collection_id == cid for t in lead.scheduler.triggers.values())

    @staticmethod
    def _pending_load(lead: Leadership, cid: int, kind: int, partition_ids: set[int] | None = None
                      ) -> TriggerTask | None:
        """A queued or running load of ``kind`` that a new request would repeat (not one being cancelled):
        for partitions, one whose partitions include ``partition_ids``."""
        sched = lead.scheduler
        for t in sorted(sched.triggers.values(), key=lambda t: t.id):
            if t.collection_id != cid or t.KIND != kind or sched.is_cancelled(t):
                continue
            if partition_ids is None or partition_ids <= set(t.request.partition_ids):
                return t
        return None

    @staticmethod
    def _pending_release(lead: Leadership, cid: int) -> bool:
        kinds = (qc.TASK_KIND_RELEASE_COLLECTION, qc.TASK_KIND_RELEASE_PARTITION)
        return any(t.collection_id == cid and t.KIND in kinds for t in lead.scheduler.triggers.values())

    async def _join(self, task: TriggerTask, context: grpc.aio.ServicerContext) -> int:
        """Wait as the original caller waits (for the plan) and answer with the same task id."""
        await asyncio.wait_for(asyncio.shield(task.planned), self._budget(context))
        return task.id

    async def ReleaseCollection(self, request, context):
        async def run():
            lead = await self._lead(context)
            cid = request.collection_id
            if not lead.meta.has_collection(cid) and not self._pending(lead, cid):
                return qc.ReleaseCollectionResponse(status=OK, task_id=0)
            req = qc.ReleaseCollectionRequest(collection_id=cid)
            task = ReleaseCollectionTask.new(lead.env, req, trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST,
                                             collection_id=cid)
            tid = await self._submit(lead, task, True, context)  # type: ignore[arg-type]
            return qc.ReleaseCollectionResponse(status=OK, task_id=tid)

        return await self._answer(qc.ReleaseCollectionResponse, run)

    # ----- partitions -----------------------------------------------------------------------------------------
    def _loaded_partitions(self, lead: Leadership, cid: int) -> dict[int, data_pb2.PartitionLoadInfo]:
        info = lead.meta.get_collection(cid)
        if info is None:
            raise Refused(common_pb2.NOT_FOUND, f"collection {cid} has not been loaded")
        return {p.partition_id: p for p in info.partitions}

    async def _partition_states(self, request, context) -> list[data_pb2.PartitionLoadInfo]:
        """The asked (or all) loaded partitions; NOT_FOUND naming those that are not loaded."""
        lead = await self._lead(context)
        loaded = self._loaded_partitions(lead, request.collection_id)
        ids = list(request.partition_ids) or sorted(loaded)
        missing = [p for p in ids if p not in loaded]
        if missing:
            raise Refused(common_pb2.NOT_FOUND,
                          f"partitions {missing} of collection {request.collection_id} have not been loaded")
        return [loaded[p] for p in ids]

    async def ShowPartitions(self, request, context):
        async def run():
            return qc.ShowPartitionsResponse(status=OK, partitions=await self._partition_states(request, context))

        return await self._answer(qc.ShowPartitionsResponse, run)

    async def GetPartitionStates(self, request, context):
        async def run():
            states = await self._partition_states(request, context)
            return qc.GetPartitionStatesResponse(status=OK, partition_descriptions=states)

        return await self._answer(qc.GetPartitionStatesResponse, run)

    async def LoadPartitions(self, request, context):
        async def run():
            lead = await self._lead(context)
            cid, pids = request.collection_id, list(request.partition_ids)
            if not pids:
                raise Refused(common_pb2.ILLEGAL_ARGUMENT, "LoadPartitions needs at least one partition id")
            await self.coord.broker.describe_collection(cid)  # type: ignore[union-attr]
            if lead.meta.get_load_type(cid) == COLLECTION:
                raise Refused(common_pb2.CONFLICT,
                              f"collection {cid} is loaded as a whole; release it before loading partitions")
            if self._pending_load(lead, cid, qc.TASK_KIND_LOAD_COLLECTION):
                raise Refused(common_pb2.CONFLICT,
                              f"collection {cid} is being loaded as a whole; release it before loading partitions")
            wanted = set(pids)
            pending = self._pending_load(lead, cid, qc.TASK_KIND_LOAD_PARTITION, wanted)
            if pending is not None:  # a retry of a load in progress: answer as the first call is answered
                return qc.LoadPartitionsResponse(status=OK, task_id=await self._join(pending, context))
            in_flight = {p for t in lead.scheduler.triggers.values()
                         if t.collection_id == cid and t.KIND == qc.TASK_KIND_LOAD_PARTITION
                         and not lead.scheduler.is_cancelled(t) for p in t.request.partition_ids}
            releasing = self._pending_release(lead, cid)  # then a new load runs after the release
            loaded = [p for p in pids if lead.meta.has_partition(cid, p) and p not in in_flight and not releasing]
            if len(loaded) == len(pids):
                return qc.LoadPartitionsResponse(status=OK, task_id=0)
            if loaded:
                raise Refused(common_pb2.CONFLICT,
                              f"partitions {loaded} of collection {cid} are already loaded while "
                              f"{[p for p in pids if p not in loaded]} are not; load only the new ones")
            req = qc.LoadPartitionsRequest()
            req.CopyFrom(request)
            task = LoadPartitionsTask.new(lead.env, req, trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST,
                                          collection_id=cid)
            tid = await self._submit(lead, task, False, context)  # type: ignore[arg-type]
            return qc.LoadPartitionsResponse(status=OK, task_id=tid)

        return await self._answer(qc.LoadPartitionsResponse, run)

    async def ReleasePartitions(self, request, context):
        async def run():
            lead = await self._lead(context)
            cid, pids = request.collection_id, list(request.partition_ids)
            if not pids:
                raise Refused(common_pb2.ILLEGAL_ARGUMENT, "ReleasePartitions needs at least one partition id")
            if lead.meta.get_load_type(cid) == COLLECTION:
                raise Refused(common_pb2.CONFLICT,
                              f"collection {cid} is loaded as a whole; release the collection instead")
            if self._pending_load(lead, cid, qc.TASK_KIND_LOAD_COLLECTION):
                raise Refused(common_pb2.CONFLICT,
                              f"collection {cid} is being loaded as a whole; release the collection instead")
            info = lead.meta.get_collection(cid)
            loaded = {p.partition_id for p in info.partitions} if info else set()
            loading = {p for t in lead.scheduler.triggers.values()
                       if t.collection_id == cid and t.KIND == qc.TASK_KIND_LOAD_PARTITION
                       for p in t.request.partition_ids}
            to_release = [p for p in pids if p in loaded or p in loading]
            if not to_release:  # none of them is loaded or being loaded: nothing to do, nothing to cancel
                return qc.ReleasePartitionsResponse(status=OK, task_id=0)
            if loaded and loaded <= set(pids) and loading <= set(pids):
                task: TriggerTask = ReleaseCollectionTask.new(  # type: ignore[assignment]
                    lead.env, qc.ReleaseCollectionRequest(collection_id=cid),
                    trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid)
            else:
                task = ReleasePartitionsTask.new(  # type: ignore[assignment]
                    lead.env, qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=to_release),
                    trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid)
            tid = await self._submit(lead, task, True, context)
            return qc.ReleasePartitionsResponse(status=OK, task_id=tid)

        return await self._answer(qc.ReleasePartitionsResponse, run)

    # ----- segments and balance -------------------------------------------------------------------------------
    async def GetSegmentInfo(self, request, context):
        async def run():
            lead = await self._lead(context)
            wanted = set(request.segment_ids)
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
                raise Refused(common_pb2.NOT_FOUND, f"segments {sorted(missing)} are not loaded on any online node")
            return qc.GetSegmentInfoResponse(status=OK, infos=out)

        return await self._answer(qc.GetSegmentInfoResponse, run)

    async def LoadBalance(self, request, context):
        async def run():
            lead = await self._lead(context)
            if not request.source_node_ids:
                raise Refused(common_pb2.ILLEGAL_ARGUMENT, "LoadBalance needs at least one source node id")
            for t in lead.scheduler.triggers.values():  # a retry of a balance in progress joins it
                if t.KIND == qc.TASK_KIND_LOAD_BALANCE and same_balance(t.request, request):
                    return qc.LoadBalanceResponse(status=OK, task_id=t.id)
            for nid in [*request.source_node_ids, *request.dst_node_ids]:
                if not lead.nodes.is_online(nid):
                    raise Refused(common_pb2.NOT_FOUND, f"query node {nid} is unknown or offline")
            on_sources = {s.segment_id for n in request.source_node_ids for s in lead.meta.segments_on_node(n)}
            missing = sorted(set(request.sealed_segment_ids) - on_sources)
            if missing:
                raise Refused(common_pb2.NOT_FOUND,
                              f"segments {missing} are not loaded on source nodes {list(request.source_node_ids)}")
            req = qc.LoadBalanceRequest()
            req.CopyFrom(request)
            req.reason = qc.BALANCE_REASON_USER
            task = LoadBalanceTask.new(lead.env, req, trigger_condition=qc.TRIGGER_CONDITION_LOAD_BALANCE)
            await lead.scheduler.enqueue(task)  # type: ignore[arg-type]
            return qc.LoadBalanceResponse(status=OK, task_id=task.id)

        return await self._answer(qc.LoadBalanceResponse, run)

    # ----- health and tasks -----------------------------------------------------------------------------------
    async def GetComponentStates(self, request, context):
        state = common_pb2.HEALTHY if self.coord.is_leader else common_pb2.STANDBY
        return common_pb2.ComponentStates(
            state=common_pb2.ComponentInfo(node_id=self.coord.server_id, role="querycoord", state_code=state),
            status=OK,
        )

    async def ListTasks(self, request, context):
        async def run():
            lead = self.coord.leadership if self.coord.is_leader else None
            limit = min(request.limit or 100, 1000)
            if lead is None:
                assert self.coord.kv is not None
                trees = trees_from_records(await TaskStore(self.coord.kv).load_all(), request.children_limit)
            else:
                sched = lead.scheduler
                trees = [sched.tree(t, request.children_limit)
                         for t in sorted(sched.triggers.values(), key=lambda t: t.id)]
                if request.include_finished:
                    trees = sorted([*sched.finished, *trees], key=lambda tr: tr.trigger.task_id)
            if not request.include_children:
                # Copies: the scheduler keeps the finished trees for later calls.
                trees = [qc.TaskTree(trigger=tr.trigger, child_counts=tr.child_counts) for tr in trees]
            trees = [tr for tr in trees if tr.trigger.task_id > request.after_task_id
                     and (not request.collection_id or tr.trigger.collection_id == request.collection_id)
                     and (not request.states or tr.trigger.state in request.states)]
            page = trees[:limit]
            nxt = page[-1].trigger.task_id if len(trees) > limit else 0
            return qc.ListTasksResponse(status=OK, trees=page, next_after_task_id=nxt)

        return await self._answer(qc.ListTasksResponse, run)

    async def GetTask(self, request, context):
        async def run():
            lead = await self._lead(context)
            t = lead.scheduler.find(request.task_id)
            if t is not None:
                return qc.GetTaskResponse(status=OK, tree=lead.scheduler.tree(t, request.children_limit))
            for tree in lead.scheduler.finished:
                if tree.trigger.task_id == request.task_id or any(c.task_id == request.task_id
                                                                    for c in tree.children):
                    return qc.GetTaskResponse(status=OK, tree=tree)
            raise Refused(common_pb2.NOT_FOUND, f"task {request.task_id} is unknown (finished long ago?)")

        return await self._answer(qc.GetTaskResponse, run)


    async def ShowNodes(self, request, context):
        async def run():
            lead = await self._lead(context)
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

        return await self._answer(qc.ShowNodesResponse, run)


def same_balance(a: qc.LoadBalanceRequest, b: qc.LoadBalanceRequest) -> bool:
    """The same user balance asked again (order of ids does not matter)."""
    return (a.reason in (qc.BALANCE_REASON_USER, qc.BALANCE_REASON_UNSPECIFIED)
            and set(a.source_node_ids) == set(b.source_node_ids) and set(a.dst_node_ids) == set(b.dst_node_ids)
            and set(a.sealed_segment_ids) == set(b.sealed_segment_ids) and a.collection_id == b.collection_id)


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
