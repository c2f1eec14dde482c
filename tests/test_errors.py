"""One error base, one mapping to the wire, one gate: codes survive from wherever they are raised.

The unit tests pin ``errors.status_of`` and ``gate.LeaderGate``; the cluster
test drives a real coordinator and real nodes to show that a query-meta
refusal raised inside a trigger reaches the gRPC caller with its own code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from meta.errors import MetaUnavailable, NotLeader, RequestTooLarge
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.broker import BrokerError
from querycoord.catalog.store import CollectionNotFound
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.client import NodeError
from querycoord.common.errors import TIMEOUT_REASON, Conflict, CoordError, NotLeading, status_of
from querycoord.nodes.querynode_state import NodeRefusal
from querycoord.querymeta import CorruptRecord, LoadTypeConflict, PartitionNotLoaded, QueryMetaError
from querycoord.serving.gate import LeaderGate
from querycoord.stream.store import NoSnodeAvailable
from querycoord.task.model import TaskCancelled, TaskError
from tests.cluster import QueryCluster, fast_scheduler


# ----- the mapping ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc, code", [
    (CollectionNotFound("collection 7 does not exist in the catalog"), common_pb2.NOT_FOUND),
    (BrokerError(common_pb2.TIMEOUT, "slow"), common_pb2.TIMEOUT),
    (NoSnodeAvailable("no snode"), common_pb2.NO_AVAILABLE_NODE),
    (TaskError("boom"), common_pb2.UNEXPECTED_ERROR),
    (TaskCancelled("cancelled by release"), common_pb2.CANCELLED),
    (NodeError(3, "LoadSegments", common_pb2.STALE_LEADER, "fenced"), common_pb2.STALE_LEADER),
    (NodeRefusal(common_pb2.ILLEGAL_ARGUMENT, "no ids"), common_pb2.ILLEGAL_ARGUMENT),
    (NoAvailableNode("no online query node"), common_pb2.NO_AVAILABLE_NODE),
    (LoadTypeConflict(1, data_pb2.LOAD_TYPE_COLLECTION, data_pb2.LOAD_TYPE_PARTITION), common_pb2.CONFLICT),
    (PartitionNotLoaded(1, 2), common_pb2.NOT_FOUND),
    (Conflict("loaded as a whole"), common_pb2.CONFLICT),
])
def test_every_error_family_is_a_coord_error_and_keeps_its_code(exc: CoordError, code: int) -> None:
    assert isinstance(exc, CoordError)
    status = status_of(exc)
    assert (status.error_code, status.reason) == (code, str(exc))
    assert exc.status() == status


def test_errors_that_add_context_keep_the_raisers_reason() -> None:
    node = NodeError(3, "LoadSegments", common_pb2.NO_AVAILABLE_NODE, "out of memory")
    assert node.reason == "out of memory" and str(node) == "query node 3 LoadSegments: NO_AVAILABLE_NODE: out of memory"
    broker = BrokerError(common_pb2.NOT_FOUND, "collection 7 does not exist in the catalog")
    assert broker.reason.startswith("collection 7") and str(broker).startswith("NOT_FOUND: collection 7")
    corrupt = CorruptRecord("querymeta/collections/1", "not a CollectionLoadInfo")
    assert corrupt.reason == "not a CollectionLoadInfo" and "purge_corrupt" in str(corrupt)
    assert isinstance(corrupt, QueryMetaError) and corrupt.code == common_pb2.UNEXPECTED_ERROR


def test_errors_without_a_code_are_mapped_by_kind_and_named_by_source() -> None:
    too_large = status_of(RequestTooLarge(200, 10, 128, 5))
    assert too_large.error_code == common_pb2.REQUEST_TOO_LARGE
    assert status_of(NotLeader("election/x", 5, 0)).error_code == common_pb2.NOT_LEADER
    down = status_of(MetaUnavailable(["127.0.0.1:1"], "txn", 1.0, None), source="the catalog")
    assert down.error_code == common_pb2.META_UNAVAILABLE and down.reason.startswith("the catalog: etcd unavailable")
    assert status_of(TimeoutError()) == common_pb2.Status(error_code=common_pb2.TIMEOUT, reason=TIMEOUT_REASON)
    bug = status_of(ZeroDivisionError("x"), source="the stream store")
    assert bug.error_code == common_pb2.UNEXPECTED_ERROR
    assert bug.reason == "internal error in the stream store: ZeroDivisionError: x"


# ----- the gate -----------------------------------------------------------------------------------------------------
@dataclass
class FakeScheduler:
    lost: list[BaseException] = field(default_factory=list)

    def leadership_lost(self, exc: BaseException) -> None:
        self.lost.append(exc)


class FakeCoordinator:
    """What the gate reads of a coordinator: its leadership and its not-leader message."""

    def __init__(self, revision: int | None):
        self.scheduler = FakeScheduler()
        self.leadership: Any = None
        if revision is not None:
            self.leadership = SimpleNamespace(fence=SimpleNamespace(revision=revision), scheduler=self.scheduler)

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None

    async def not_leader_message(self) -> str:
        return "this coordinator (a:1) is not the leader; the leader is at b:2"


async def test_a_standby_refuses_with_the_leader_named() -> None:
    gate = LeaderGate(FakeCoordinator(None))  # type: ignore[arg-type]
    with pytest.raises(NotLeading, match="the leader is at b:2") as info:
        await gate.lead(None)
    assert info.value.code == common_pb2.NOT_LEADER

    async def run() -> qc.GetTaskResponse:
        await gate.lead(None)
        raise AssertionError("unreachable")

    resp = await gate.answer(qc.GetTaskResponse, run)
    assert resp.status.error_code == common_pb2.NOT_LEADER and "the leader is at b:2" in resp.status.reason


async def test_a_refused_fenced_write_deposes_only_the_leadership_it_was_made_under() -> None:
    coord = FakeCoordinator(revision=5)
    gate = LeaderGate(coord, source="the stream store")  # type: ignore[arg-type]

    def refused(revision: int) -> Any:
        async def run() -> qc.GetTaskResponse:
            raise NotLeader("election/querycoord/1", revision, 9)
        return run

    stale = await gate.answer(qc.GetTaskResponse, refused(4))  # a write of an earlier term: not ours to stop
    assert stale.status.error_code == common_pb2.NOT_LEADER and coord.scheduler.lost == []
    ours = await gate.answer(qc.GetTaskResponse, refused(5))
    assert ours.status.error_code == common_pb2.NOT_LEADER and "the leader is at b:2" in ours.status.reason
    assert len(coord.scheduler.lost) == 1

    async def bug() -> qc.GetTaskResponse:
        raise ZeroDivisionError("x")

    resp = await gate.answer(qc.GetTaskResponse, bug)
    assert resp.status.error_code == common_pb2.UNEXPECTED_ERROR and "in the stream store" in resp.status.reason


# ----- end to end -----------------------------------------------------------------------------------------------------
async def test_a_query_meta_refusal_inside_a_trigger_reaches_the_caller_with_its_code(
        etcd: EtcdCluster, root_path: str) -> None:
    """A LoadPartitions whose plan meets a load-type conflict answers CONFLICT with the query meta's words.

    The service and the trigger's ``pre_execute`` both check the load type
    first, so the plan only meets the conflict when the load type changes
    after those checks: here the collection is loaded as a whole while the
    trigger reads the catalog. The caller gets the conflict's own error, not
    UNEXPECTED_ERROR ("internal error: LoadTypeConflict(...)") as for a bug.
    """
    c = QueryCluster(etcd, root_path, scheduler=fast_scheduler())
    await c.__aenter__()
    try:
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None and c.client is not None
        for _ in range(2):
            await c.add_node()
        cid = await c.create_collection("raced", partitions=2, segments=8)
        pid = (await lead.env.broker.show_partitions(cid))[0]
        broker: Any = lead.env.broker
        catalog_read = broker.show_partitions

        async def show_partitions_while_the_collection_is_loaded_as_a_whole(collection_id: int) -> list[int]:
            if lead.meta.get_collection(collection_id) is None:
                await lead.meta.add_collection(collection_id, data_pb2.LOAD_TYPE_COLLECTION, [])
            return await catalog_read(collection_id)

        broker.show_partitions = show_partitions_while_the_collection_is_loaded_as_a_whole
        resp = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[pid]))
        broker.show_partitions = catalog_read

        assert resp.status.error_code == common_pb2.CONFLICT, resp
        assert "cannot be loaded as LOAD_TYPE_PARTITION; release it first" in resp.status.reason
        await c.wait_idle()
        tasks = await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True, collection_id=cid))
        (tree,) = tasks.trees
        assert tree.trigger.state == qc.TASK_STATE_FAILED and tree.trigger.error_code == common_pb2.CONFLICT
        assert not any(n.state.segments for n in c.nodes), "the failed load left nothing on the nodes"

        released = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert released.status.error_code == common_pb2.SUCCESS, released
        await asyncio.wait_for(c.wait_idle(), 60)
        assert all(v == 0 for v in (await c.task_keys()).values())
    finally:
        await c.__aexit__(None, None, None)
