"""The rules every trigger keeps off the happy path: races between loads, releases and balances, retries,
rollbacks, leader changes and nodes that fail or vanish mid-call.

Real etcd, real coordinators and real query nodes (in-process gRPC servers
with real sessions). Every test ends by checking the rules every trigger
keeps: callers answered, no trigger left in the scheduler, no task key left.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

from meta.election import Election, publish_leader_record
from meta.errors import MetaUnavailable
from meta.idalloc import IdAllocator
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import common_pb2, data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.cluster.client import NodeError, QueryNodeClient
from querycoord.cluster.nodes import NodeManager
from querycoord.common.protocol import QUERYCOORD_ELECTION, QUERYCOORD_ROLE
from querycoord.nodes.querynode import FaultConfig
from querycoord.querymeta import QueryMeta
from querycoord.task.store import TaskStore
from querycoord.task.triggers import LoadPartitionsTask
from tests.cluster import MiB, QueryCluster, fast_scheduler, running_cluster, wait_until

SLOW = FaultConfig(latency_ms=300)


def started(etcd: EtcdCluster, root: str, faults: list[FaultConfig | None], *, capacity: int = 1024 * MiB,
            trigger_timeout: float = 60.0, checker_interval: float = 0.5) -> AbstractAsyncContextManager[QueryCluster]:
    """``running_cluster`` with the checker every 0.5 s and a minute for each trigger unless a test says otherwise."""
    return running_cluster(etcd, root, faults, capacity=capacity,
                           scheduler=fast_scheduler(trigger_timeout=trigger_timeout), checker_interval=checker_interval)


async def settled(c: QueryCluster) -> None:
    """The rules after any exit: nothing left in the scheduler, no task key left in etcd.

    "Eventually": the enqueue of a caller that gave up runs on (shielded) and may still be persisting its
    trigger when the scheduler first looks idle; that trigger is then queued and runs to its end. An orphan (a key
    never queued) stays for ever and fails ``wait_no_task_keys``.
    """
    await c.wait_idle(timeout=60)
    await c.wait_no_task_keys(timeout=60)
    await c.wait_idle(timeout=60)


async def finished_cancelled_by_release(load: Any, otherwise: str) -> None:
    """The load's trigger finished with a release's cancellation; ``otherwise`` when it finished as if not cancelled."""
    try:
        await asyncio.wait_for(asyncio.shield(load.finished), 20)
    except Exception as exc:
        assert "cancelled by release" in str(exc), exc
    else:
        raise AssertionError(otherwise)


def held_once(c: QueryCluster) -> dict[int, int]:
    """segment -> holder; fails if any segment is held twice."""
    out: dict[int, int] = {}
    for n in c.nodes:
        if not n.healthy:
            continue
        for sid in n.state.segments:
            assert sid not in out, f"segment {sid} held by nodes {out[sid]} and {n.node_id}"
            out[sid] = n.node_id
    return out


async def partitions(c: QueryCluster, cid: int) -> list[int]:
    assert c.kv is not None
    return [p.partition_id for p in await CatalogStore(c.kv).show_partitions(cid)]


async def catalog_segments(c: QueryCluster, cid: int, pid: int | None = None) -> set[int]:
    assert c.kv is not None
    cat = CatalogStore(c.kv)
    pids = [pid] if pid else await partitions(c, cid)
    out: set[int] = set()
    for p in pids:
        _, binlogs = await cat.get_recovery_info(cid, p)
        out |= {b.segment_id for b in binlogs}
    return out


async def test_a_second_release_during_a_cancelled_loads_rollback_answers_everyone(
        etcd: EtcdCluster, root_path: str) -> None:
    """A second release arriving while a cancelled load rolls back waits for the rollback: both callers are
    answered and the load leaves the scheduler, rather than staying there forever."""
    async with started(etcd, root_path, [SLOW, SLOW]) as c:
        cid = await c.create_collection("twice", partitions=2, segments=40)
        load = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert load.status.error_code == common_pb2.SUCCESS
        first = asyncio.create_task(c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid)))
        await asyncio.sleep(0.15)  # the load is rolling back (node calls take 300 ms)
        second = asyncio.create_task(c.client.query("ReleaseCollection",
                                                    qc.ReleaseCollectionRequest(collection_id=cid)))
        r1, r2 = await asyncio.wait_for(asyncio.gather(first, second), 60)
        assert r1.status.error_code == common_pb2.SUCCESS, r1
        assert r2.status.error_code == common_pb2.SUCCESS, r2
        await settled(c)
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=load.task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_FAILED
        assert tree.trigger.error_code == common_pb2.CANCELLED
        assert not held_once(c), "released: no node holds anything"
        show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.status.error_code == common_pb2.NOT_FOUND


async def test_a_load_whose_leader_died_before_its_commit_point_is_done_by_the_next(
        etcd: EtcdCluster, root_path: str) -> None:
    """Partitions an uncommitted trigger wrote to meta are not taken for loaded ones: the next leader does the load."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        coord = await c.start_coordinator()
        await c.wait_leader()
        cid = await c.create_collection("uncommitted", partitions=2, segments=20)
        await coord.stop()  # the leader is gone; write what it would have left behind
        assert c.kv is not None
        cat_pids = await partitions(c, cid)
        meta = QueryMeta(c.kv)
        await meta.reload()
        await meta.add_collection(cid, data_pb2.LOAD_TYPE_COLLECTION, cat_pids)
        (tid,) = await IdAllocator(c.kv, "idalloc/task").allocate(1)
        rec = task_pb2.TaskRecord(id=tid, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_DOING,
                                  trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid,
                                  load_collection=qc.LoadCollectionRequest(collection_id=cid))
        await TaskStore(c.kv).add_trigger(rec)
        for _ in range(2):
            await c.add_node()
        c.coords.clear()
        c.client = None
        await c.start_coordinator()
        await c.wait_leader()
        await c.wait_loaded(cid, timeout=60)
        await settled(c)
        assert set(held_once(c)) == await catalog_segments(c, cid)


async def test_a_node_down_repair_that_finds_no_room_counts_the_dead_copies_for_nothing_and_reloads(
        etcd: EtcdCluster, root_path: str) -> None:
    """A node-down repair with no room leaves the dead node's copies counting for nothing (the node is forgotten:
    in no replica), so 100 % is not shown, and the checker loads them again once room appears."""
    async with started(etcd, root_path, [None, None], capacity=40 * MiB, trigger_timeout=6.0) as c:
        cid = await c.create_collection("tight", partitions=1, segments=10)
        await c.load_collection(cid)
        await settled(c)
        victim = max(c.nodes, key=lambda n: len(n.state.segments))
        assert victim.state.segments
        await victim.stop()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        deadline = time.monotonic() + 60
        while True:  # the balance gives up at its deadline; the checker reports what nodes really hold
            show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
            pct = show.collections[0].in_memory_percentage
            if pct < 100 and victim.node_id not in lead.meta.bound_node_ids():
                break
            assert time.monotonic() < deadline, f"still {pct} % or the dead node still in a replica"
            await asyncio.sleep(0.2)
        await c.add_node(capacity=40 * MiB)  # capacity returns: the checker loads the rest
        await c.wait_loaded(cid, timeout=60)
        await settled(c)
        assert set(held_once(c)) == await catalog_segments(c, cid)


async def test_a_session_offering_no_capacity_is_ignored_and_loads_go_on(etcd: EtcdCluster, root_path: str) -> None:
    """A session offering capacity 0 is ignored: the allocator never divides by it and triggers keep running."""
    async with started(etcd, root_path, [None]) as c:
        assert c.kv is not None
        bogus = Session(c.kv, "querynode", "127.0.0.1:1", ttl=2.0, extra={"capacity_bytes": 0})
        await bogus.start()
        try:
            cid = await c.create_collection("zero", partitions=1, segments=8)
            r = await asyncio.wait_for(c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid)),
                                       30)
            assert r.status.error_code == common_pb2.SUCCESS, r
            await c.wait_loaded(cid)
            await settled(c)
            assert len(held_once(c)) == 8
        finally:
            await bogus.close()


async def test_a_malformed_session_value_stops_neither_the_node_watch_nor_a_takeover(
        etcd: EtcdCluster, root_path: str) -> None:
    """A garbage session value is skipped: the node watch keeps running and a new leader still finds its nodes."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        assert c.kv is not None
        await c.kv.save("session/querynode-999999", b"{not json")
        await c.start_coordinator()
        await c.wait_leader(timeout=30)
        await c.kv.save("session/querynode-999998", b'{"ServerID": "x"}')
        await c.add_node()  # seen although garbage came before it
        cid = await c.create_collection("garbage", partitions=1, segments=6)
        await c.load_collection(cid)
        await settled(c)


async def test_a_failure_inside_failure_handling_still_answers_and_unlocks(
        etcd: EtcdCluster, root_path: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """MetaUnavailable raised while undoing a failed trigger stays inside the runner: the caller is answered and
    the collection's lock released."""
    async with started(etcd, root_path, [None]) as c:
        cid = await c.create_collection("undo", partitions=2, segments=6)

        async def broken(self: LoadPartitionsTask) -> None:
            raise MetaUnavailable("etcd went away while undoing (injected)")

        monkeypatch.setattr(LoadPartitionsTask, "after_failure", broken)
        bad = await asyncio.wait_for(c.client.query(
            "LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[987654])), 30)
        assert bad.status.error_code == common_pb2.NOT_FOUND, bad
        monkeypatch.undo()
        r = await asyncio.wait_for(c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid)), 30)
        assert r.status.error_code == common_pb2.SUCCESS, r
        await c.wait_loaded(cid)
        await settled(c)


async def test_a_node_that_vanished_is_a_node_error(etcd: EtcdCluster, root_path: str, kv) -> None:  # type: ignore[no-untyped-def]
    """A node gone between planning and the call is a NodeError, which the retry paths handle (not a KeyError)."""
    nodes = NodeManager(kv)
    try:
        nodes.client(424242)
    except NodeError as exc:
        assert exc.node_id == 424242 and exc.transport
    else:
        raise AssertionError("expected NodeError")


async def test_releasing_an_unrelated_partition_does_not_cancel_a_load(etcd: EtcdCluster, root_path: str) -> None:
    """ReleasePartitions of a partition nobody loads leaves the load of another partition alone."""
    async with started(etcd, root_path, [SLOW, SLOW]) as c:
        cid = await c.create_collection("unrelated", partitions=3, segments=30)
        p1, p2, _ = await partitions(c, cid)
        load = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1]))
        assert load.status.error_code == common_pb2.SUCCESS
        rel = await c.client.query("ReleasePartitions",
                                   qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=[p2]))
        assert rel.status.error_code == common_pb2.SUCCESS, rel
        await settled(c)
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=load.task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_EXPIRED, tree.trigger
        states = await c.client.query("GetPartitionStates",
                                      qc.GetPartitionStatesRequest(collection_id=cid, partition_ids=[p1]))
        assert states.partition_descriptions[0].in_memory_percentage == 100
        assert set(held_once(c)) == await catalog_segments(c, cid, p1)


async def test_a_retried_load_partitions_joins_the_one_in_progress(etcd: EtcdCluster, root_path: str) -> None:
    """The identical retry of a LoadPartitions in progress joins it instead of answering CONFLICT about itself."""
    async with started(etcd, root_path, [SLOW]) as c:
        cid = await c.create_collection("retry", partitions=2, segments=20)
        p1, _ = await partitions(c, cid)
        req = qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1])
        first = await c.client.query("LoadPartitions", req)
        again = await c.client.query("LoadPartitions", req)
        assert first.status.error_code == common_pb2.SUCCESS
        assert again.status.error_code == common_pb2.SUCCESS, again
        assert again.task_id in (first.task_id, 0)
        again_coll = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert again_coll.status.error_code == common_pb2.CONFLICT, "loaded as partitions: a clear conflict"
        await settled(c)
        assert set(held_once(c)) == await catalog_segments(c, cid, p1)


async def _candidate(c: QueryCluster, name: str) -> tuple[Session, Election]:
    """A coordinator's session and election entry, without the coordinator: its fences are real."""
    assert c.kv is not None
    session = Session(c.kv, QUERYCOORD_ROLE, f"127.0.0.1:{name}", ttl=2.0)
    await session.start()
    return session, Election(c.kv, session, QUERYCOORD_ELECTION)


async def test_a_read_by_the_new_leader_fences_off_the_old_one(etcd: EtcdCluster, root_path: str) -> None:
    """GetDataDistribution carries the leader's fence: a node the new leader has only read from refuses a late
    mutation from the deposed leader."""
    async with QueryCluster(etcd, root_path) as c:
        node = await c.add_node()
        (old_s, old_e), (new_s, new_e) = await _candidate(c, "1"), await _candidate(c, "2")
        old_fence = await old_e.campaign("old")
        campaign = asyncio.create_task(new_e.campaign("new"))
        await asyncio.sleep(0.2)  # the new candidate's key is queued behind the old leader's
        await old_e.resign()
        new_fence = await asyncio.wait_for(campaign, 10)
        assert c.kv is not None
        await publish_leader_record(c.kv.fenced(new_fence), QUERYCOORD_ELECTION, "new")  # as a leader does first
        new = QueryNodeClient(node.node_id, node.address)
        new.fence = querynode_pb2.CoordFence(leader_revision=new_fence.revision, coordinator_id=2)
        old = QueryNodeClient(node.node_id, node.address)
        old.fence = querynode_pb2.CoordFence(leader_revision=old_fence.revision, coordinator_id=1)
        try:
            await new.call("GetDataDistribution", querynode_pb2.GetDataDistributionRequest())
            assert node.state.fence.leader_revision == new_fence.revision, "the leader's read raised the mark"
            try:
                await old.call("ReleaseCollection", querynode_pb2.ReleaseCollectionRequest(collection_id=1))
            except NodeError as exc:
                assert exc.code == common_pb2.STALE_LEADER
            else:
                raise AssertionError("the deposed leader's mutation was accepted after the new leader's read")
        finally:
            await new.close()
            await old.close()
            for s in (old_s, new_s):
                await s.close()


async def test_a_made_up_fence_cannot_turn_a_node_against_the_real_leader(
        etcd: EtcdCluster, root_path: str) -> None:
    """A higher fence is adopted only if it is the leading coordinator's election revision. Otherwise one
    ReleaseCollection sent to a node's port with fence revision 2**63-1 (or a standby's revision, higher than the
    leader's) would raise its mark for ever: the node would refuse every real leader with STALE_LEADER, each leader
    would take that for lost leadership and resign, and leadership would change hands every few seconds."""
    async with started(etcd, root_path, [None]) as c:
        cid = await c.create_collection("forged", partitions=1, segments=6)
        leader = await c.wait_leader()
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r
        await c.wait_loaded(cid)
        node = c.nodes[0]
        mark = node.state.fence.leader_revision
        standby_s, standby_e = await _candidate(c, "9")
        queued = asyncio.create_task(standby_e.campaign("standby"))
        try:
            for _ in range(100):  # its key exists (queued behind the leader's)
                if standby_e.fence is not None:
                    break
                await asyncio.sleep(0.05)
            assert standby_e.fence is not None and standby_e.fence.revision > mark
            for revision in (2**63 - 1, standby_e.fence.revision, mark + 1):
                forger = QueryNodeClient(node.node_id, node.address)
                forger.fence = querynode_pb2.CoordFence(leader_revision=revision, coordinator_id=77)
                try:
                    await forger.call("ReleaseCollection", querynode_pb2.ReleaseCollectionRequest(collection_id=cid))
                except NodeError as exc:
                    assert exc.code == common_pb2.ILLEGAL_ARGUMENT and "not held by the leading" in str(exc), exc
                else:
                    raise AssertionError(f"a release with made-up fence revision {revision} was applied")
                # A read with it is answered, but does not raise the mark either.
                await forger.call("GetDataDistribution", querynode_pb2.GetDataDistributionRequest())
                await forger.close()
                assert node.state.fence.leader_revision == mark
            assert len(held_once(c)) == 6, "the forged release released nothing"
            # The real leader still leads and its mutations are accepted.
            r = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
            assert r.status.error_code == common_pb2.SUCCESS, r
            assert (await c.wait_leader()).address == leader.address
            await settled(c)
            assert not held_once(c)
        finally:
            queued.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await queued
            await standby_s.close()


async def test_a_failed_load_partitions_rolls_back_only_its_own_partitions(
        etcd: EtcdCluster, root_path: str) -> None:
    """A LoadPartitions failing on an unknown partition rolls back only its own partitions, never those an earlier
    request loaded."""
    async with started(etcd, root_path, [SLOW, SLOW]) as c:
        cid = await c.create_collection("own", partitions=3, segments=30)
        p0, p1, _ = await partitions(c, cid)
        # p0's load keeps the collection busy, so both requests below queue behind it and p1 is not in meta
        # yet when the second is accepted: the second runs after the first and fails on the unknown id.
        r0 = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p0]))
        assert r0.status.error_code == common_pb2.SUCCESS
        ok_req = qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1])
        bad_req = qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1, 987654])
        ok_t = asyncio.create_task(c.client.query("LoadPartitions", ok_req))
        await asyncio.sleep(0.05)
        bad_t = asyncio.create_task(c.client.query("LoadPartitions", bad_req))
        ok, bad = await asyncio.wait_for(asyncio.gather(ok_t, bad_t), 60)
        assert ok.status.error_code == common_pb2.SUCCESS, ok
        assert bad.status.error_code in (common_pb2.NOT_FOUND, common_pb2.CONFLICT), bad
        await settled(c)
        states = await c.client.query("GetPartitionStates",
                                      qc.GetPartitionStatesRequest(collection_id=cid, partition_ids=[p0, p1]))
        assert [s.in_memory_percentage for s in states.partition_descriptions] == [100, 100]
        want = await catalog_segments(c, cid, p0) | await catalog_segments(c, cid, p1)
        assert set(held_once(c)) == want, "what meta says is loaded is what the nodes hold"


async def test_a_retried_balance_joins_the_one_in_progress(etcd: EtcdCluster, root_path: str) -> None:
    """Idempotence: the retry of a balance in progress joins it instead of failing on its own effect (segments
    moving)."""
    async with started(etcd, root_path, [SLOW, SLOW]) as c:
        cid = await c.create_collection("move", partitions=1, segments=10)
        await c.load_collection(cid)
        await settled(c)
        src, dst = sorted(c.nodes, key=lambda n: -len(n.state.segments))
        req = qc.LoadBalanceRequest(source_node_ids=[src.node_id], dst_node_ids=[dst.node_id],
                                    sealed_segment_ids=sorted(src.state.segments)[:2])
        first = await c.client.query("LoadBalance", req)
        again = await c.client.query("LoadBalance", req)
        assert first.status.error_code == again.status.error_code == common_pb2.SUCCESS, again
        assert again.task_id == first.task_id
        await settled(c)
        assert len(held_once(c)) == 10


async def test_closing_a_node_channel_mid_call_is_a_node_error_not_a_cancellation(
        etcd: EtcdCluster, root_path: str) -> None:
    """grpc.aio cancels calls in flight when their channel closes (a node forgotten once its session ended);
    that CancelledError is a NodeError to the trigger runner, not a cancellation that would stop the runner and
    the leadership loop."""
    async with QueryCluster(etcd, root_path) as c:
        node = await c.add_node(faults=FaultConfig(latency_ms=3000))
        client = QueryNodeClient(node.node_id, node.address)
        call = asyncio.create_task(client.call("GetDataDistribution", querynode_pb2.GetDataDistributionRequest()))
        await asyncio.sleep(0.5)
        await client.close()
        try:
            await asyncio.wait_for(call, 10)
        except NodeError as exc:
            assert exc.transport
        else:
            raise AssertionError("expected NodeError")


async def test_a_load_finishes_when_a_node_with_a_call_in_flight_and_nothing_in_meta_goes(
        etcd: EtcdCluster, root_path: str) -> None:
    """The same cancellation left the load trigger half done and never finished."""
    async with started(etcd, root_path, [None]) as c:
        slow = await c.add_node(faults=FaultConfig(latency_ms=6000))
        cid = await c.create_collection("gone", partitions=1, segments=20)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        await asyncio.sleep(1.0)  # the slow node's calls are in flight; meta has nothing on it yet
        await slow.session.close(revoke=True)  # its session ends: the node is forgotten, its channel closed
        await c.wait_loaded(cid, timeout=60)
        await settled(c)
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_EXPIRED, tree.trigger
        held = {s for n in c.nodes if n is not slow for s in n.state.segments}
        assert held == await catalog_segments(c, cid)


def dm_watchers(c: QueryCluster, cid: int) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for n in c.nodes:
        if n.healthy:
            for name, w in n.state.dm_channels.items():
                if w.collection_id == cid:
                    out.setdefault(name, []).append(n.node_id)
    return out


async def test_a_watch_failing_on_a_live_node_is_retried_there_not_moved(etcd: EtcdCluster, root_path: str) -> None:
    """A watch that fails on a node whose link is cut (session alive) is retried on that node, not moved: the
    first node may still watch the channel and nothing undoes a watch, so a move would leave it doubled."""
    from querycoord.nodes.querynode_faults import FaultInjector

    async with started(etcd, root_path, [None, None]) as c:
        cid = await c.create_collection("watch", partitions=2, segments=10, channels=2)
        p0, p1 = await partitions(c, cid)
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p0]))
        assert r.status.error_code == common_pb2.SUCCESS
        await c.wait_idle()
        watchers = {w for ns in dm_watchers(c, cid).values() for w in ns}
        sick = next(n for n in c.nodes if n.node_id in watchers)
        healthy_injector = sick.injector
        sick.injector = FaultInjector(FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"WatchDmChannels"})))
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1]))
        assert r.status.error_code == common_pb2.SUCCESS
        await asyncio.sleep(2.0)  # far past the retry budget on the node
        sick.injector = healthy_injector
        await settled(c)
        doubled = {name: ns for name, ns in dm_watchers(c, cid).items() if len(ns) > 1}
        assert not doubled, f"DM channels watched twice: {doubled}"
        assert len(dm_watchers(c, cid)) == 2


async def test_concurrent_partition_releases_that_empty_a_collection_release_it_on_the_nodes(
        etcd: EtcdCluster, root_path: str) -> None:
    """Two ReleasePartitions that together release every loaded partition release the collection's channels on
    the nodes too, whichever of them is validated first."""
    async with started(etcd, root_path, [SLOW, SLOW]) as c:
        cid = await c.create_collection("halves", partitions=2, segments=10)
        p0, p1 = await partitions(c, cid)
        r = await c.client.query("LoadPartitions",
                                 qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p0, p1]))
        assert r.status.error_code == common_pb2.SUCCESS
        await c.wait_loaded(cid)
        await settled(c)
        a, b = await asyncio.gather(*(c.client.query("ReleasePartitions", qc.ReleasePartitionsRequest(
            collection_id=cid, partition_ids=[p])) for p in (p0, p1)))
        assert a.status.error_code == b.status.error_code == common_pb2.SUCCESS, (a, b)
        await settled(c)
        for n in c.nodes:
            st = n.state
            assert not st.segments and not st.dm_channels, n.node_id
            assert cid not in st.query_channels and not st.delta_channels, (n.node_id, st.delta_channels)


async def test_a_caller_giving_up_mid_enqueue_leaves_no_orphan_trigger(etcd: EtcdCluster, root_path: str) -> None:
    """A client that gives up cancels the handler between persisting the trigger and queueing it; the trigger is
    still queued, so no key sits in etcd unseen for the next leader to run after a later release."""
    import grpc

    from proto import querycoord_pb2_grpc

    async with started(etcd, root_path, [None]) as c:
        cid = await c.create_collection("abandon", partitions=1, segments=4)
        leader = await c.wait_leader()
        async with grpc.aio.insecure_channel(leader.address) as ch:
            stub = querycoord_pb2_grpc.QueryCoordStub(ch)
            for i in range(40):  # deadlines around the few milliseconds persisting takes
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.LoadCollection(qc.LoadCollectionRequest(collection_id=cid), timeout=0.001 * (1 + i % 20))
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.ReleaseCollection(qc.ReleaseCollectionRequest(collection_id=cid),
                                                 timeout=0.001 * (1 + i % 20))
        r = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        await settled(c)  # every persisted trigger was queued and ran: none is left in etcd
        assert not held_once(c)


async def _persist_balance(c: QueryCluster, cid: int, node_id: int,
                           children: list[tuple[int, dict[str, Any]]]) -> None:
    """A user's balance of a node that is gone, planned and persisted with ``children`` (kind, request field)
    on ``node_id`` not yet run, as a leader that stopped right after its commit point leaves it."""
    assert c.kv is not None
    ids = await IdAllocator(c.kv, "idalloc/task").allocate(1 + len(children))
    trig = task_pb2.TaskRecord(id=ids[0], kind=qc.TASK_KIND_LOAD_BALANCE, state=qc.TASK_STATE_DONE,
                               trigger_condition=qc.TRIGGER_CONDITION_LOAD_BALANCE,
                               load_balance=qc.LoadBalanceRequest(source_node_ids=[node_id + 1000],
                                                                  reason=qc.BALANCE_REASON_USER))
    await TaskStore(c.kv).commit_children(trig, [
        task_pb2.TaskRecord(id=task_id, kind=kind, state=qc.TASK_STATE_UNDO, parent_id=ids[0],
                            trigger_condition=qc.TRIGGER_CONDITION_LOAD_BALANCE, collection_id=cid,
                            node_id=node_id, **request)
        for task_id, (kind, request) in zip(ids[1:], children, strict=True)])


async def test_a_resumed_balance_does_not_load_a_collection_released_meanwhile(
        etcd: EtcdCluster, root_path: str) -> None:
    """A resumed balance skips the segments of a collection released since it was persisted: nothing would
    record such loads (the collection is no longer in meta, and the balance is not serialised with it)."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        assert c.kv is not None
        node = await c.add_node()
        first = await c.start_coordinator()
        await c.wait_leader()
        cid = await c.create_collection("gone", partitions=1, segments=6)
        (pid,) = await partitions(c, cid)
        segs = sorted(await catalog_segments(c, cid))
        await first.stop()
        await _persist_balance(c, cid, node.node_id, [(qc.TASK_KIND_LOAD_SEGMENT, {
            "load_segments": querynode_pb2.LoadSegmentsRequest(collection_id=cid, infos=[
                data_pb2.SegmentLoadInfo(segment_id=s, partition_id=pid, collection_id=cid) for s in segs])})])
        c.coords.clear()
        c.client = None
        await c.start_coordinator()
        await c.wait_leader()
        await settled(c)
        assert not node.state.segments, "segments of a collection that is not loaded were loaded"


async def test_a_load_cancelled_after_dispatch_but_before_it_ran_is_finished(
        etcd: EtcdCluster, root_path: str) -> None:
    """The dispatcher has created the load's asyncio task and a release cancels it before its first step. A task
    cancelled before it starts never runs its body, so the load is finished from outside: otherwise it would keep
    the collection's lock and every later trigger of the collection would wait behind it forever."""
    from querycoord.task.triggers import LoadCollectionTask, ReleaseCollectionTask

    async with started(etcd, root_path, [None]) as c:
        cid = await c.create_collection("unstarted", partitions=1, segments=4)
        sched = (await c.wait_leader()).coord.leadership.scheduler
        env = sched.env
        load = LoadCollectionTask.new(env, qc.LoadCollectionRequest(collection_id=cid),
                                      trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid)
        enqueued = asyncio.create_task(sched.enqueue(load))
        # Looking every loop iteration, this sees the dispatcher's new task before that task takes its first step
        # (it is scheduled behind this one): the window a release's enqueue hit in the full suite.
        while not (load.id and sched.is_running(load.id)):
            await asyncio.sleep(0)
        sched.queue.cancel_loads(cid, "cancelled by release (test)")  # what the release's enqueue does at that moment
        await enqueued
        release = await sched.enqueue(ReleaseCollectionTask.new(
            env, qc.ReleaseCollectionRequest(collection_id=cid), trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST,
            collection_id=cid))
        await asyncio.wait_for(asyncio.shield(release.finished), 20)
        await finished_cancelled_by_release(load, "the load finished as if not cancelled")
        await settled(c)
        assert not held_once(c)


async def test_a_load_persisted_before_a_release_but_queued_after_it_is_cancelled(
        etcd: EtcdCluster, root_path: str) -> None:
    """A load's persist answers after a later release has been queued and cancelled every load it could see. The
    load is older (its id is lower), so it is cancelled rather than queued behind the release and run after it,
    which would load the collection again although it was released last."""
    from querycoord.task.triggers import LoadCollectionTask, ReleaseCollectionTask

    async with started(etcd, root_path, [None]) as c:
        cid = await c.create_collection("late", partitions=1, segments=4)
        sched = (await c.wait_leader()).coord.leadership.scheduler
        env = sched.env
        gate = asyncio.Event()
        persist = env.store.add_trigger

        async def slow_persist(rec: Any) -> Any:  # the real write to etcd, answered once the gate opens
            if rec.kind == qc.TASK_KIND_LOAD_COLLECTION:
                await gate.wait()
            return await persist(rec)

        env.store.add_trigger = slow_persist  # type: ignore[method-assign]
        try:
            load = LoadCollectionTask.new(env, qc.LoadCollectionRequest(collection_id=cid),
                                          trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid)
            enqueued = asyncio.create_task(sched.enqueue(load))
            while not load.id:
                await asyncio.sleep(0)
            release = await sched.enqueue(ReleaseCollectionTask.new(
                env, qc.ReleaseCollectionRequest(collection_id=cid),
                trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid))
            assert load.id < release.id
            await asyncio.wait_for(asyncio.shield(release.finished), 20)
            gate.set()
            await enqueued
        finally:
            env.store.add_trigger = persist  # type: ignore[method-assign]
        await finished_cancelled_by_release(load, "the older load ran after the release")
        await settled(c)
        assert not held_once(c)


async def test_a_persist_etcd_applied_but_never_answered_leaves_no_trigger_behind(
        etcd: EtcdCluster, root_path: str) -> None:
    """etcd applies a load's persist but its answer never arrives (the client's retries run out: MetaUnavailable
    after the write). The caller hears that the load failed, so the keys this leader will never run are removed
    at the next sweep: left, the next leader would load the collection long after the caller moved on."""
    async with started(etcd, root_path, [None]) as c:
        assert c.client is not None
        cid = await c.create_collection("unanswered", partitions=1, segments=4)
        env = (await c.wait_leader()).coord.leadership.scheduler.env
        persist = env.store.add_trigger
        lost: list[int] = []

        async def applied_unanswered(rec: Any) -> None:  # the real write to etcd, then no answer
            await persist(rec)
            env.store.add_trigger = persist  # type: ignore[method-assign]
            lost.append(rec.id)
            raise MetaUnavailable(["127.0.0.1:2379"], "task store", 5.0, None)

        env.store.add_trigger = applied_unanswered  # type: ignore[method-assign]
        try:
            r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        finally:
            env.store.add_trigger = persist  # type: ignore[method-assign]
        assert lost, "the fault never ran"
        await c.wait_no_task_keys(timeout=30)  # the applied trigger's keys are gone
        await settled(c)
        shown = await c.client.query("ShowCollections", qc.ShowCollectionsRequest())
        if r.status.error_code == common_pb2.SUCCESS:  # a retry of the call (not the lost trigger) loaded it
            assert r.task_id != lost[0]
            await c.wait_loaded(cid, 30)
        else:  # what the caller heard is what the nodes hold: nothing
            assert cid not in [s.collection_id for s in shown.collections], (r.status, shown)
            assert not held_once(c)


async def test_a_release_queued_while_a_finished_load_removes_its_keys_leaves_no_key_behind(
        etcd: EtcdCluster, root_path: str) -> None:
    """A load's tree has ended and its keys are being removed when a release of its collection is queued: too late
    to cancel, the release waits for it. Cancelling it interrupted the removal, and the load's whole tree stayed in
    etcd, unknown to the leader, until a next leader ran it again (the chaos drill with tight capacity)."""
    async with started(etcd, root_path, [None]) as c:
        assert c.client is not None
        cid = await c.create_collection("finishing", partitions=1, segments=4)
        sched = (await c.wait_leader()).coord.leadership.scheduler
        env = sched.env
        gate, removing = asyncio.Event(), asyncio.Event()
        remove = env.store.remove_tree

        async def held_remove(trigger: Any, children: Any, history: Any = None) -> None:  # the real removal, held
            if trigger.kind == qc.TASK_KIND_LOAD_COLLECTION:
                removing.set()
                await gate.wait()
            await remove(trigger, children, history)

        env.store.remove_tree = held_remove  # type: ignore[method-assign]
        try:
            load = asyncio.create_task(c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid)))
            await asyncio.wait_for(removing.wait(), 30)
            release = asyncio.create_task(c.client.query("ReleaseCollection",
                                                         qc.ReleaseCollectionRequest(collection_id=cid)))
            await wait_until(lambda: bool(sched.pending(cid, (qc.TASK_KIND_RELEASE_COLLECTION,))),
                             "the release queued", 30)
            gate.set()
            answers = await asyncio.gather(load, release)
        finally:
            gate.set()
            env.store.remove_tree = remove  # type: ignore[method-assign]
        assert [a.status.error_code for a in answers] == [common_pb2.SUCCESS] * 2, answers
        await settled(c)  # no key left: the load's tree was removed, then the release ran
        assert not held_once(c), "released last: the nodes hold nothing"


async def test_a_resumed_balance_does_not_watch_channels_of_a_collection_released_meanwhile(
        etcd: EtcdCluster, root_path: str) -> None:
    """The next leader resumes a balance whose delta and query channel watches name a collection released
    meanwhile: the watches are skipped like its segment loads, since once idle nothing would release that
    collection's channels on the node."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        node = await c.add_node()
        first = await c.start_coordinator()
        await c.wait_leader()
        cid = await c.create_collection("gone", partitions=1, segments=2)
        await first.stop()
        await _persist_balance(c, cid, node.node_id, [
            (qc.TASK_KIND_WATCH_DELTA_CHANNEL, {"watch_delta_channels": querynode_pb2.WatchDeltaChannelsRequest(
                collection_id=cid, infos=[data_pb2.VChannelInfo(
                    collection_id=cid, channel_name=f"by-dev-rootcoord-delta_0_{cid}v0")])}),
            (qc.TASK_KIND_WATCH_QUERY_CHANNEL, {"add_query_channel": querynode_pb2.AddQueryChannelRequest(
                collection_id=cid, query_channel=f"query-{cid}", query_result_channel=f"query-result-{cid}")})])
        c.coords.clear()
        c.client = None
        c.config.checker_interval = 0.3  # and the checker, looking every 0.3 s, does not release them either
        await c.start_coordinator()
        await c.wait_leader()
        await c.wait_idle(timeout=60)
        await asyncio.sleep(2.0)
        assert all(v == 0 for v in (await c.task_keys()).values())
        held = {ch: coll for ch, coll in node.state.delta_channels.items() if coll == cid}
        assert not held and cid not in node.state.query_channels, (
            f"collection {cid} is not loaded, yet the node watches its delta channels {sorted(held)} and query "
            f"channel {node.state.query_channels.get(cid)}")
