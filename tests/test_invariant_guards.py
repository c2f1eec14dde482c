"""Invariants that no other test guards against a mutation of the code, each against real etcd.

1. The plan's commit point (DESIGN.md rule 2, ``task.store``): however a plan's write is cut short, a reload
   never finds a trigger committed (DONE) without all of its children.
2. The fence compare (rule 1, ``meta.kv.FencedKV``): a fence is its leader key's create revision exactly; a leader
   key deleted and created again under the same name is another leader, and the old fence's writes are refused,
   in process and for a real coordinator process.
3. The checker leaves busy collections out (``Checker.check_once``): the real checker, on a real cluster, queues
   no repair for a collection whose trigger is in flight, and does for one that has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from meta.client import EtcdClient
from meta.election import Election, current_leader, election_prefix
from meta.errors import NotLeader
from meta.fence import Fence
from meta.idalloc import IdAllocator
from meta.kv import FencedKV, MetaKV, TxnResult
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from meta.txn import put
from meta.watch import WatchBatch, watch_prefix
from proto import data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.broker import LocalBroker
from querycoord.catalog.store import CatalogStore
from querycoord.cluster.nodes import NodeManager
from querycoord.common.protocol import QUERYCOORD_ELECTION
from querycoord.leader.view import Leadership
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.task.model import DOING, DONE, UNDO, TaskEnv
from querycoord.task.scheduler import Scheduler
from querycoord.task.store import ACTIVE_PREFIX, INFO_PREFIX, TRIGGER_PREFIX, TaskStore
from tests.cluster import QueryCluster, running_cluster
from tests.spawn import MID_LOAD_FLAGS, spawn_coordinator

# ----- 1. the plan's commit point ------------------------------------------------------------------------------------
# Enough children that the plan takes several txns (two keys per child, 128 operations per txn): the commit point
# matters only between txns.
CHILDREN = 150


class TakeoverBeforeTxn(FencedKV):
    """A leader's fenced view during which another candidate takes over (a real election on the real etcd) just
    before the ``at``-th txn is sent: etcd itself refuses that txn and every later one, as when a leader is paused
    or partitioned between two txns of one write."""

    def __init__(self, base: MetaKV, fence: Fence, at: int, takeover: Callable[[], Awaitable[object]]):
        super().__init__(base, fence)
        self.at = at
        self.takeover = takeover
        self.sent = 0

    async def txn(self, *args: Any, **kwargs: Any) -> TxnResult:
        self.sent += 1
        if self.sent == self.at:
            await self.takeover()
        return await super().txn(*args, **kwargs)


def plan(cid: int, trigger_id: int, child_ids: range) -> tuple[task_pb2.TaskRecord, list[task_pb2.TaskRecord]]:
    """A LoadCollection trigger as the scheduler has it when it commits its plan (DOING, persisted), and its
    load children."""
    trigger = task_pb2.TaskRecord(id=trigger_id, kind=qc.TASK_KIND_LOAD_COLLECTION, state=UNDO, collection_id=cid,
                                  trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST,
                                  load_collection=qc.LoadCollectionRequest(collection_id=cid))
    children = [task_pb2.TaskRecord(
        id=i, parent_id=trigger_id, kind=qc.TASK_KIND_LOAD_SEGMENT, state=UNDO, collection_id=cid, node_id=1,
        trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST,
        load_segments=querynode_pb2.LoadSegmentsRequest(collection_id=cid, infos=[
            data_pb2.SegmentLoadInfo(segment_id=i, collection_id=cid, partition_id=7, mem_size=1 << 20)]))
        for i in child_ids]
    return trigger, children


async def candidates(kv: MetaKV) -> tuple[list[Session], Fence, asyncio.Task[Fence]]:
    """A leader and a standby queued behind it (real sessions, a real election): the leader's fence and the
    standby's campaign, which returns its fence once the leader's key is gone."""
    sessions = [Session(kv, "candidate", name, ttl=30) for name in ("leader", "standby")]
    for s in sessions:
        await s.start()
    fence = await Election(kv, sessions[0], "e").campaign("leader")
    standby = asyncio.create_task(Election(kv, sessions[1], "e").campaign("standby"))
    while await kv.count_prefix(election_prefix("e")) < 2:  # queued: it leads as soon as the leader's key goes
        await asyncio.sleep(0.01)
    return sessions, fence, standby


def new_leader_env(kv: MetaKV, fence: Fence) -> TaskEnv:
    """What a new leader reloads tasks with: its own fenced view (reload removes garbage through it)."""
    fenced = kv.fenced(fence)
    return TaskEnv(meta=QueryMeta(fenced), nodes=NodeManager(kv), broker=LocalBroker(CatalogStore(kv)),
                   store=TaskStore(fenced), ids=IdAllocator(fenced, "idalloc/task"))


async def commit_cut_before(kv: MetaKV, at: int | None) -> tuple[list[int], Scheduler]:
    """Persist a trigger as the scheduler does (UNDO, then DOING), commit its plan with the leader deposed before
    txn ``at`` of the commit (None: never), then reload as the new leader. Returns the planned child ids and the
    new leader's scheduler, reloaded (not started)."""
    sessions, fence, standby = await candidates(kv)
    try:
        store = TaskStore(kv.fenced(fence))
        trigger, children = plan(cid=5, trigger_id=100, child_ids=range(1000, 1000 + CHILDREN))
        await store.add_trigger(trigger)
        trigger.state = DOING
        await store.save(trigger)

        async def takeover() -> None:
            await sessions[0].close(revoke=True)  # its election key goes with its lease; the standby leads
            await asyncio.wait_for(asyncio.shield(standby), 30)

        cut = TaskStore(TakeoverBeforeTxn(kv, fence, at or 0, takeover))
        trigger.state = DONE
        if at is None:
            await cut.commit_children(trigger, children)
            await takeover()
        else:
            with pytest.raises(NotLeader):
                await cut.commit_children(trigger, children)
        scheduler = Scheduler(new_leader_env(kv, standby.result()))
        assert await scheduler.reload() == 1
        return [c.id for c in children], scheduler
    finally:
        standby.cancel()
        for s in sessions:
            await s.close()


async def txns_of_a_commit(kv: MetaKV) -> int:
    trigger, children = plan(cid=5, trigger_id=100, child_ids=range(1000, 1000 + CHILDREN))
    store = TaskStore(kv)
    await store.commit_children(trigger, children)
    return store.txns


async def test_a_plan_cut_between_any_two_txns_reloads_whole_or_not_at_all(client: EtcdClient,
                                                                           root_path: str) -> None:
    """DESIGN.md rule 2. The leader is deposed (a standby takes over through the real election) just before each
    txn of a plan's commit in turn; etcd refuses that txn and the rest. Whatever was written, the new leader's
    reload finds the trigger either DONE with every planned child, or not committed with no child left (the
    written children are garbage it removes). A trigger committed first (DONE in an earlier txn than its last
    child) would be resumed with part of its plan, and the rest never loaded."""
    n = await txns_of_a_commit(MetaKV(client, f"{root_path}/count"))
    assert n >= 3, "the plan must take several txns for the order of its writes to matter"
    for at in [*range(1, n + 1), None]:
        kv = MetaKV(client, f"{root_path}/cut-{at}")
        planned, scheduler = await commit_cut_before(kv, at)
        (t,) = scheduler.triggers.values()
        kept = sorted(c.id for c in t.children)
        # The invariant: committed means the whole plan is there.
        assert t.state != DONE or kept == planned, (
            f"cut before txn {at} of {n}: the trigger reloads DONE with {len(kept)} of its {len(planned)} children")
        left = {p: await kv.count_prefix(p) for p in (TRIGGER_PREFIX, ACTIVE_PREFIX, INFO_PREFIX)}
        if at is None:
            assert t.state == DONE and kept == planned
            assert left == {TRIGGER_PREFIX: 1, ACTIVE_PREFIX: CHILDREN, INFO_PREFIX: 1 + CHILDREN}
        else:
            # Refused before its last txn: not committed; the new leader runs the trigger again from its request.
            assert t.state == DOING and kept == [], f"cut before txn {at} of {n}"
            assert left == {TRIGGER_PREFIX: 1, ACTIVE_PREFIX: 0, INFO_PREFIX: 1}, f"cut before txn {at}: {left}"
        await scheduler.stop()


# ----- 2. the fence compare ------------------------------------------------------------------------------------------
async def test_a_fence_whose_leader_key_was_created_again_is_refused(kv: MetaKV) -> None:
    """DESIGN.md rule 1. The leader's key is deleted and the same candidate campaigns again: the same key, created
    at a later revision. That is a new leadership; whatever still writes through the first one (a component of the
    earlier term) is refused by etcd, naming the new revision, and nothing of it lands. The fence is the create
    revision exactly, not "at least"."""
    session = Session(kv, "candidate", "c", ttl=30)
    await session.start()
    try:
        election = Election(kv, session, "e")
        first = await election.campaign("c")
        old = kv.fenced(first)
        meta = QueryMeta(old)
        await meta.reload()
        store = TaskStore(old)
        trigger, children = plan(cid=5, trigger_id=100, child_ids=range(1000, 1003))
        await store.add_trigger(trigger)  # while it leads, it writes
        await meta.add_collection(5, data_pb2.LOAD_TYPE_COLLECTION, [7])

        await kv.remove(kv.rel_key(first.leader_key.encode()))
        second = await election.campaign("c")
        assert second.leader_key == first.leader_key, "the same key, created again"
        assert second.revision > first.revision
        before = await kv.revision()

        trigger.state = DONE
        writes: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("a save", lambda: old.save("k", "v")),
            ("a txn", lambda: old.txn([], [put("k", "v")])),
            ("the task store's commit", lambda: store.commit_children(trigger, children)),
            ("a query meta write", lambda: meta.add_collection(6, data_pb2.LOAD_TYPE_COLLECTION, [8])),
            ("an id block", lambda: IdAllocator(old, "idalloc/task").allocate(1)),
            ("the fence check", old.check),
        ]
        for what, write in writes:
            try:
                await write()
            except NotLeader as exc:
                assert exc.current_revision == second.revision, what
            else:
                pytest.fail(f"{what} through the earlier term's fence was accepted after its key was created again")
        assert await kv.revision() == before, "a write of the earlier term landed"
        assert await kv.get("k") is None
        assert await kv.count_prefix(ACTIVE_PREFIX) == 0

        # The new term writes.
        await kv.fenced(second).save("k", "new term")
        assert await kv.get("k") == b"new term"
    finally:
        await session.close()


async def written_since(kv: MetaKV, revision: int) -> list[str]:
    """Every key put or deleted under the root after ``revision`` until now (etcd's history: a marker key written
    now ends the read)."""
    marker = await kv.save("test-marker", "end")
    out: list[str] = []
    async with contextlib.aclosing(watch_prefix(kv, "", revision + 1)) as items:
        async for item in items:
            assert isinstance(item, WatchBatch), "etcd compacted the history the test reads"
            out.extend(e.key for e in item.events if e.mod_revision < marker)
            if item.revision >= marker:
                return out
    raise AssertionError("the watch ended")


# Keys a coordinator writes without its fence: its session (and its server id) and its campaign; the catalog is the
# test's own.
UNFENCED = ("session/", "idalloc/server-id", "election/", "catalog/")


async def test_a_coordinator_whose_leader_key_is_created_again_writes_nothing_more(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """DESIGN.md rule 1 with a real coordinator process. It leads and loads a collection; while it is paused
    (SIGSTOP) its leader key is deleted and put again under the same name by someone else, created at a later
    revision. Resumed, it is asked to load another collection: etcd refuses its fenced writes, so from the key's
    re-creation on it writes no task, query meta or id key, and it stands by with its refused writes counted."""
    async with QueryCluster(etcd, root_path) as c:
        assert c.kv is not None
        for _ in range(2):
            await c.add_node()
        coord = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord")
        try:
            await coord.next_event("leader", timeout=60)
            catalog = CatalogStore(c.kv)
            first, _ = await catalog.create_bulk_collection("before", num_partitions=1, num_segments=20)
            second, _ = await catalog.create_bulk_collection("after", num_partitions=1, num_segments=20)
            async with QueryCoordClient([coord.address], deadline=60, call_timeout=10) as client:
                r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=first.collection_id))
                assert r.status.error_code == 0, r
                leader = await current_leader(c.kv, election_prefix(QUERYCOORD_ELECTION))
                assert leader is not None and leader.value.decode() == coord.address

                coord.signal(signal.SIGSTOP)
                try:
                    await c.kv.remove(leader.key)
                    recreated = await c.kv.save(leader.key, "someone else")
                finally:
                    coord.signal(signal.SIGCONT)
                assert (await c.kv.get_kv(leader.key)).create_revision == recreated > leader.create_revision

            async with QueryCoordClient([coord.address], deadline=5, call_timeout=5) as client:
                try:
                    r = await client.query("LoadCollection",
                                           qc.LoadCollectionRequest(collection_id=second.collection_id))
                    answer = f"{r.status.error_code}: {r.status.reason}"
                except Exception as exc:  # it no longer leads: a client may give up however it likes
                    answer = repr(exc)
            fenced_writes = [k for k in await written_since(c.kv, recreated) if not k.startswith(UNFENCED)]
            assert fenced_writes == [], (f"the deposed coordinator wrote {len(fenced_writes)} keys after its leader "
                                         f"key was created again, e.g. {fenced_writes[:5]} (load answered {answer})")

            standby = await coord.next_event("standby", timeout=60)
            previous = standby["previous"]
            assert previous["fence_revision"] == leader.create_revision
            assert previous["refused_writes"] >= 1
            assert 0 < previous["last_write_revision"] < recreated
        finally:
            await coord.kill()


# ----- 3. the checker leaves busy collections out --------------------------------------------------------------------
def hold_calls(nodes: list[QueryNode], kinds: set[str], cid: int, gate: asyncio.Event,
               arrived: asyncio.Event) -> None:
    """The nodes hold every call of ``kinds`` for collection ``cid`` until ``gate`` is set (a slow disk): its
    trigger stays in flight for as long as the test needs, whatever the machine's speed. ``arrived``: one came."""
    for node in nodes:
        mutate = node.mutate

        async def held(kind: str, request: Any, *args: Any, mutate: Any = mutate) -> Any:
            if kind in kinds and request.collection_id == cid:
                arrived.set()
                await gate.wait()
            return await mutate(kind, request, *args)

        node.mutate = held


def only_the_pass_under_test(c: QueryCluster) -> Leadership:
    """The leader, with its periodic checker loop (kicked at takeover and node joins) stopped: the passes a test
    runs are the only ones."""
    lead = c.coords[0].coord.leadership
    assert lead is not None and lead.checker is not None
    for t in lead.tasks:
        if t.get_name() == "checker":
            t.cancel()
    return lead


async def loaded_then_lost(c: QueryCluster, name: str, lost: int) -> int:
    """A collection loaded whole, then ``lost`` of its copies released behind the leader's back."""
    cid = await c.create_collection(name, partitions=1, segments=12)
    await c.load_collection(cid)
    await c.wait_idle()
    node = max(c.nodes, key=lambda n: sum(h.collection_id == cid for h in n.state.segments.values()))
    held = sorted(s for s, h in node.state.segments.items() if h.collection_id == cid)[:lost]
    node.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=held))
    return cid


async def repaired_collections(c: QueryCluster) -> list[int]:
    assert c.client is not None
    trees = (await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True, limit=1000))).trees
    return sorted(t.trigger.collection_id for t in trees if t.trigger.kind == qc.TASK_KIND_REPAIR)


async def test_the_checker_queues_no_repair_for_a_collection_with_a_trigger_in_flight(
        etcd: EtcdCluster, root_path: str) -> None:
    """The real checker's pass on a real cluster: collection ``idle`` lost copies and has no trigger, collection
    ``busy`` is mid-load (its children held at the nodes, so its segments are held by no node). The pass queues a
    repair for ``idle`` and nothing for ``busy``: its load owns it until it ends."""
    async with running_cluster(etcd, root_path, [None, None], checker_interval=3600) as c:
        assert c.client is not None
        lead = only_the_pass_under_test(c)
        idle = await loaded_then_lost(c, "idle", 3)
        busy = await c.create_collection("busy", partitions=1, segments=12)
        gate, arrived = asyncio.Event(), asyncio.Event()
        hold_calls(c.nodes, {"LoadSegments"}, busy, gate, arrived)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=busy))
        assert r.status.error_code == 0, r
        await asyncio.wait_for(arrived.wait(), 60)
        (load,) = lead.scheduler.pending(busy)
        assert load.KIND == qc.TASK_KIND_LOAD_COLLECTION and lead.scheduler.is_running(load.id)

        assert lead.checker is not None
        try:
            report = await lead.checker.check_once()
            pending = [t.id for t in lead.scheduler.pending(busy)]
        finally:
            gate.set()
        assert busy not in report.repairs, f"a repair was queued for a collection mid-load: {report.repairs[busy]}"
        assert pending == [load.id]
        assert "3 segments held by no node" in report.repairs.get(idle, ""), report.repairs

        await c.wait_loaded(busy)
        await c.wait_idle()
        assert await repaired_collections(c) == [idle]
        held = [s for n in c.nodes for s in n.state.segments]
        assert len(held) == len(set(held)) == 24, "every segment once: none lost, none doubled"


async def test_the_checker_queues_no_repair_for_a_collection_whose_trigger_began_during_the_pass(
        etcd: EtcdCluster, root_path: str) -> None:
    """The window inside a pass: ``first`` and ``second`` both lost copies; while the pass queues ``first``'s
    repair (its etcd writes awaited), a user's release of ``second`` arrives. The pass found ``second`` idle when it
    compared, but by the time it would queue ``second``'s repair the release owns it: nothing is queued for it."""
    async with running_cluster(etcd, root_path, [None, None], checker_interval=3600) as c:
        assert c.client is not None
        lead = only_the_pass_under_test(c)
        first = await loaded_then_lost(c, "first", 2)
        second = await loaded_then_lost(c, "second", 2)
        assert first < second, "the pass queues repairs in collection order"
        sched, client = lead.scheduler, c.client
        gate, arrived = asyncio.Event(), asyncio.Event()
        hold_calls(c.nodes, {"ReleaseCollection", "ReleaseSegments", "ReleasePartitions"}, second, gate, arrived)
        enqueue = sched.enqueue
        releases: list[asyncio.Task[Any]] = []

        async def release_arrives_meanwhile(trigger: Any) -> Any:
            if trigger.KIND == qc.TASK_KIND_REPAIR and trigger.collection_id == first and not releases:
                releases.append(asyncio.create_task(
                    client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=second))))
                await asyncio.wait_for(arrived.wait(), 60)  # running: its calls are at the nodes
            return await enqueue(trigger)

        sched.enqueue = release_arrives_meanwhile
        assert lead.checker is not None
        try:
            report = await lead.checker.check_once()
        finally:
            sched.enqueue = enqueue
            gate.set()
        assert releases, "the pass queued no repair for the first collection"
        assert second not in report.repairs, f"a repair was queued behind a release: {report.repairs[second]}"
        assert "2 segments held by no node" in report.repairs.get(first, ""), report.repairs
        r = await releases[0]
        assert r.status.error_code == 0, r
        await c.wait_idle()
        assert await repaired_collections(c) == [first]
