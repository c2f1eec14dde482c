"""Jobs: what each mutating QueryCoord request does (Milvus v2's ``querycoordv2/job/``).

A job validates its request against the query meta and the pending triggers,
joins an identical trigger already pending (a client retry must be answered
as the first call is, not start a second load), else builds and submits its
trigger and waits as the API promises: a load answers once its plan is
persisted (the client follows progress with ShowCollections or GetTask), a
release once it is done, a balance once it is queued. The gRPC service only
decodes, runs a job and encodes; the scheduler only runs triggers. Refusals
are ``CoordError``s carrying the code the caller sees.

Each job's ``check`` runs first, before the leadership is even asked: the
request's fields against ``Limits`` (ids positive, lists bounded, enums known,
see ``querycoord.common.validate``), so a malformed request is refused with
ILLEGAL_ARGUMENT naming the field and nothing is queued or written. Lists a
mutation acts on refuse duplicate ids.
"""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import Generic, TypeVar

from proto import data_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.errors import TIMEOUT_REASON, Conflict, DeadlinePassed, IllegalArgument, NotFound
from querycoord.common.limits import Limits
from querycoord.common.replica_number import asked_replicas, check_replicas, loaded_replicas, replica_number
from querycoord.common.validate import InvalidField, check_enum, check_id, check_ids
from querycoord.leader.balance import may_serve
from querycoord.task.admission import admit_load, eligible_nodes
from querycoord.task.model import TaskEnv
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import (
    LoadBalanceTask,
    LoadCollectionTask,
    LoadPartitionsTask,
    ReleaseCollectionTask,
    ReleasePartitionsTask,
    TriggerTask,
)

COLLECTION, PARTITION = data_pb2.LOAD_TYPE_COLLECTION, data_pb2.LOAD_TYPE_PARTITION
RELEASE_KINDS = (qc.TASK_KIND_RELEASE_COLLECTION, qc.TASK_KIND_RELEASE_PARTITION)
GRPC = qc.TRIGGER_CONDITION_GRPC_REQUEST
R = TypeVar("R")
CollectionRequest = (
    qc.LoadCollectionRequest | qc.ReleaseCollectionRequest | qc.LoadPartitionsRequest | qc.ReleasePartitionsRequest
)


def partition_ids(call: str, request: qc.LoadPartitionsRequest | qc.ReleasePartitionsRequest) -> list[int]:
    """The partitions a partitions call names; naming none is an illegal argument."""
    pids = list(request.partition_ids)
    if not pids:
        raise IllegalArgument(f"{call} needs at least one partition id")
    return pids


def check_partitions_request(request: qc.LoadPartitionsRequest | qc.ReleasePartitionsRequest, limits: Limits) -> None:
    """A partitions mutation: a positive collection id, 1..max_partitions distinct positive partition ids."""
    check_id("collection_id", request.collection_id)
    check_ids("partition_ids", request.partition_ids, limits.max_partitions, required=True)


class Until(Enum):
    """How long a request waits for its trigger (the API contract of each call)."""

    QUEUED = "queued"
    PLANNED = "planned"
    FINISHED = "finished"


class Job(Generic[R]):
    """One request's work on the leader: ``run`` returns the trigger's id (0: nothing to do)."""

    def __init__(self, scheduler: Scheduler, request: R, budget: float | None = None):
        self.scheduler = scheduler
        self.request = request
        self.env: TaskEnv = scheduler.env
        self.meta = scheduler.env.meta
        self.budget = budget  # seconds the caller still waits (None: no deadline)

    @staticmethod
    def check(request: R, limits: Limits) -> None:
        """Refuse a malformed request (``InvalidField``) before anything runs; see the module docstring."""
        raise NotImplementedError

    async def run(self) -> int:
        raise NotImplementedError

    async def _submit(self, task: TriggerTask, until: Until) -> int:
        await self.scheduler.enqueue(task)
        return await self._wait(task, until)

    async def _submit_new(self, kind: type[TriggerTask], request: CollectionRequest, until: Until) -> int:
        """Submit a new trigger of ``kind`` (a copy of ``request``) on the request's collection; its id."""
        task = kind.new(self.env, request, trigger_condition=GRPC, collection_id=request.collection_id)
        return await self._submit(task, until)

    async def _wait(self, task: TriggerTask, until: Until) -> int:
        """Wait for ``task`` as the first caller waits (also when joining it); its id."""
        if until is not Until.QUEUED:
            fut = task.planned if until is Until.PLANNED else task.finished
            try:
                await asyncio.wait_for(asyncio.shield(fut), self.budget)
            except TimeoutError:
                raise DeadlinePassed(f"{TIMEOUT_REASON}: `querycoord tasks` shows it") from None
        return task.id

    def _pending_load(self, cid: int, kind: int, partition_ids: set[int] | None = None) -> TriggerTask | None:
        """A queued or running load of ``kind`` that a new request would repeat (not one being cancelled):
        for partitions, one whose partitions include ``partition_ids``."""
        for t in self.scheduler.pending(cid, (kind,), cancelled=False):
            if partition_ids is None or partition_ids <= set(t.request.partition_ids):
                return t
        return None

    def _releasing(self, cid: int) -> bool:
        return bool(self.scheduler.pending(cid, RELEASE_KINDS))

    async def _admit(self, request: qc.LoadCollectionRequest | qc.LoadPartitionsRequest,
                     partitions: list[int]) -> None:
        """Load admission (``task.admission``): refuse at once a load that cannot fit the nodes' memory. A load
        queued behind a release of its collection is not weighed: the memory it needs frees when the release
        runs, and the trigger still meets what admission cannot foresee."""
        cid = request.collection_id
        if self._releasing(cid):
            return
        await admit_load(self.env, cid, partitions, replica_number(request, self.meta.get_collection(cid)))

    def _check_replica_number(self, request: qc.LoadCollectionRequest | qc.LoadPartitionsRequest) -> None:
        """Milvus's refusals: another number than the collection is loaded (or being loaded) with, or more
        replicas than there are online nodes to give each its own."""
        cid = request.collection_id
        asked = asked_replicas(request) or 0
        if self._releasing(cid):
            current = 0  # a new load follows the release: it starts afresh
        else:
            current = loaded_replicas(self.meta.get_collection(cid))
            for t in self.scheduler.pending(cid, (qc.TASK_KIND_LOAD_COLLECTION, qc.TASK_KIND_LOAD_PARTITION),
                                            cancelled=False):
                if not current:
                    current = replica_number(t.request, None)
        if current:
            if asked and asked != current:
                raise InvalidField("replica_number", asked,
                                   f"differs from the {current} replicas collection {cid} is loaded with; "
                                   "a resize applies to the whole collection: UpdateLoadConfig "
                                   "(querycoord collection resize)")
            return
        online = len(eligible_nodes(self.env))  # a cordoned node joins no new replica
        cordoned = len(self.env.nodes.online_ids() & self.env.nodes.cordoned.keys())
        also = f" and {cordoned} cordoned" if cordoned else ""
        if asked > 1 and asked > online:  # one replica on no node is NO_AVAILABLE_NODE, as before replicas
            raise InvalidField("replica_number", asked,
                               f"is more than the online query nodes: not enough nodes to create replicas "
                               f"({online} online{also}, each replica needs its own)", online)


class LoadCollectionJob(Job[qc.LoadCollectionRequest]):
    @staticmethod
    def check(request: qc.LoadCollectionRequest, limits: Limits) -> None:
        check_id("collection_id", request.collection_id)
        check_replicas(request, limits)

    async def run(self) -> int:
        cid = self.request.collection_id
        await self.env.broker.describe_collection(cid)  # NOT_FOUND if unknown
        load_type = self.meta.get_load_type(cid)
        if load_type == PARTITION or self._pending_load(cid, qc.TASK_KIND_LOAD_PARTITION):
            raise Conflict(f"collection {cid} is loaded as partitions: release partitions first")
        self._check_replica_number(self.request)
        pending = self._pending_load(cid, qc.TASK_KIND_LOAD_COLLECTION)
        if pending is not None:  # a retry of a load in progress: answer as the first call is answered
            return await self._wait(pending, Until.PLANNED)
        if load_type == COLLECTION and not self._releasing(cid):
            return 0  # loaded; whatever a node lost since, the checker loads again
        await self._admit(self.request, await self.env.broker.show_partitions(cid))
        return await self._submit_new(LoadCollectionTask, self.request, Until.PLANNED)


class ReleaseCollectionJob(Job[qc.ReleaseCollectionRequest]):
    @staticmethod
    def check(request: qc.ReleaseCollectionRequest, limits: Limits) -> None:
        check_id("collection_id", request.collection_id)

    async def run(self) -> int:
        cid = self.request.collection_id
        if not self.meta.has_collection(cid) and not self.scheduler.pending(cid):
            return 0  # releasing what is not loaded is success
        return await self._submit_new(ReleaseCollectionTask, qc.ReleaseCollectionRequest(collection_id=cid),
                                      Until.FINISHED)


class LoadPartitionsJob(Job[qc.LoadPartitionsRequest]):
    @staticmethod
    def check(request: qc.LoadPartitionsRequest, limits: Limits) -> None:
        check_partitions_request(request, limits)
        check_replicas(request, limits)

    async def run(self) -> int:
        cid, pids = self.request.collection_id, partition_ids("LoadPartitions", self.request)
        desc = await self.env.broker.describe_collection(cid)
        # Refused here, not by the trigger: an unknown partition must leave no task record behind.
        known = {p.partition_id for p in desc.partitions}
        unknown = [p for p in pids if p not in known]
        if unknown:
            raise NotFound(f"partitions {unknown[:20]} do not exist in collection {cid}")
        if self.meta.get_load_type(cid) == COLLECTION:
            raise Conflict(f"collection {cid} is loaded as a whole; release it before loading partitions")
        if self._pending_load(cid, qc.TASK_KIND_LOAD_COLLECTION):
            raise Conflict(f"collection {cid} is being loaded as a whole; release it before loading partitions")
        self._check_replica_number(self.request)
        pending = self._pending_load(cid, qc.TASK_KIND_LOAD_PARTITION, set(pids))
        if pending is not None:  # a retry of a load in progress: answer as the first call is answered
            return await self._wait(pending, Until.PLANNED)
        in_flight = {p for t in self.scheduler.pending(cid, (qc.TASK_KIND_LOAD_PARTITION,), cancelled=False)
                     for p in t.request.partition_ids}
        releasing = self._releasing(cid)  # then a new load runs after the release
        loaded = [p for p in pids if self.meta.has_partition(cid, p) and p not in in_flight and not releasing]
        if len(loaded) == len(pids):
            return 0
        if loaded:
            raise Conflict(f"partitions {loaded} of collection {cid} are already loaded while "
                           f"{[p for p in pids if p not in loaded]} are not; load only the new ones")
        await self._admit(self.request, pids)
        return await self._submit_new(LoadPartitionsTask, self.request, Until.PLANNED)


class ReleasePartitionsJob(Job[qc.ReleasePartitionsRequest]):
    @staticmethod
    def check(request: qc.ReleasePartitionsRequest, limits: Limits) -> None:
        check_partitions_request(request, limits)

    async def run(self) -> int:
        cid, pids = self.request.collection_id, partition_ids("ReleasePartitions", self.request)
        if self.meta.get_load_type(cid) == COLLECTION:
            raise Conflict(f"collection {cid} is loaded as a whole; release the collection instead")
        if self._pending_load(cid, qc.TASK_KIND_LOAD_COLLECTION):
            raise Conflict(f"collection {cid} is being loaded as a whole; release the collection instead")
        info = self.meta.get_collection(cid)
        loaded = {p.partition_id for p in info.partitions} if info else set()
        loading = {p for t in self.scheduler.pending(cid, (qc.TASK_KIND_LOAD_PARTITION,))
                   for p in t.request.partition_ids}
        to_release = [p for p in pids if p in loaded or p in loading]
        if not to_release:  # none of them is loaded or being loaded: nothing to do, nothing to cancel
            return 0
        if loaded and loaded <= set(pids) and loading <= set(pids):  # every partition goes: the collection goes
            return await self._submit_new(ReleaseCollectionTask, qc.ReleaseCollectionRequest(collection_id=cid),
                                          Until.FINISHED)
        return await self._submit_new(ReleasePartitionsTask,
                                      qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=to_release),
                                      Until.FINISHED)


class LoadBalanceJob(Job[qc.LoadBalanceRequest]):
    @staticmethod
    def check(request: qc.LoadBalanceRequest, limits: Limits) -> None:
        """Nodes: 1..max sources, 0..max destinations, distinct, none both; segments distinct; a known reason.
        Whether the nodes are online is checked by ``run`` (NOT_FOUND at once, never retried)."""
        sources = check_ids("source_node_ids", request.source_node_ids, limits.max_nodes_per_request, required=True)
        dsts = check_ids("dst_node_ids", request.dst_node_ids, limits.max_nodes_per_request)
        both = set(sources).intersection(dsts)
        if both:
            raise InvalidField("dst_node_ids", min(both), "is also a source node: sources and destinations differ")
        check_ids("sealed_segment_ids", request.sealed_segment_ids, limits.max_ids_per_request)
        check_enum("reason", request.reason, qc.BalanceReason)
        check_id("collection_id", request.collection_id, optional=True)

    def _check_within_replicas(self, views: list[data_pb2.SegmentInfo]) -> None:
        """A copy moves within its replica: destinations that all serve other replicas of its collection are
        refused here (the balance could only fail)."""
        dsts = list(self.request.dst_node_ids)
        if not dsts:
            return
        for s in _moved(self.request, views):
            if not any(may_serve(self.meta, s.collection_id, s.replica_id, d) for d in dsts):
                raise InvalidField("dst_node_ids", dsts,
                                   f"all serve other replicas of collection {s.collection_id} than replica "
                                   f"{s.replica_id}, which holds segment {s.segment_id} on node {s.node_id}; "
                                   "a segment moves within its replica (or to a node in no replica)")

    async def run(self) -> int:
        request = self.request
        if not request.source_node_ids:
            raise IllegalArgument("LoadBalance needs at least one source node id")
        for t in self.scheduler.pending(None, (qc.TASK_KIND_LOAD_BALANCE,)):  # a retry of a balance joins it
            if same_balance(t.request, request):
                return t.id
        cid = request.collection_id
        if cid and not self.meta.has_collection(cid) and not self.scheduler.pending(cid):
            raise NotFound(f"collection {cid} is not loaded (or does not exist): no segment of it is on a query "
                           "node to move")
        for nid in [*request.source_node_ids, *request.dst_node_ids]:
            if not self.env.nodes.is_online(nid):
                raise NotFound(f"query node {nid} is unknown or offline")
        for nid in request.dst_node_ids:
            state = self.env.nodes.cordoned.get(nid)
            if state is not None:
                raise Conflict(f"query node {nid} is {state}: it is given nothing new; uncordon it first "
                               f"(querycoord node uncordon {nid})")
        views = [s for n in request.source_node_ids for s in await self.meta.read_segments_on_node(n)]
        on_sources = {s.segment_id for s in views}
        missing = sorted(set(request.sealed_segment_ids) - on_sources)
        if missing:
            raise NotFound(f"segments {missing} are not loaded on source nodes {list(request.source_node_ids)}")
        self._check_within_replicas(views)
        req = qc.LoadBalanceRequest()
        req.CopyFrom(request)
        req.reason = qc.BALANCE_REASON_USER
        task = LoadBalanceTask.new(self.env, req, trigger_condition=qc.TRIGGER_CONDITION_LOAD_BALANCE)
        return await self._submit(task, Until.QUEUED)


def _moved(request: qc.LoadBalanceRequest, views: list[data_pb2.SegmentInfo]) -> list[data_pb2.SegmentInfo]:
    wanted = set(request.sealed_segment_ids)
    return [s for s in views if (not wanted or s.segment_id in wanted)
            and (not request.collection_id or s.collection_id == request.collection_id)]


def same_balance(a: qc.LoadBalanceRequest, b: qc.LoadBalanceRequest) -> bool:
    """The same user balance asked again (order of ids does not matter)."""
    return (a.reason in (qc.BALANCE_REASON_USER, qc.BALANCE_REASON_UNSPECIFIED)
            and set(a.source_node_ids) == set(b.source_node_ids) and set(a.dst_node_ids) == set(b.dst_node_ids)
            and set(a.sealed_segment_ids) == set(b.sealed_segment_ids) and a.collection_id == b.collection_id)


__all__ = [
    "Job",
    "LoadBalanceJob",
    "LoadCollectionJob",
    "LoadPartitionsJob",
    "ReleaseCollectionJob",
    "ReleasePartitionsJob",
    "Until",
    "check_partitions_request",
    "same_balance",
]
