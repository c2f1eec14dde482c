"""Resizing a loaded collection's replicas in place (UpdateLoadConfig, LoadCollection with another number).

Real etcd, real coordinators (in-process, or real processes where the leader is SIGKILLed mid-grow), real query
nodes on loopback. What is asserted is what the nodes themselves report (their GetDataDistribution) and what etcd
holds, at every poll while a resize runs and once it is done; never how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.common.replica_number import joining_replica_ids
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.served.health import collection_health, missing_text
from querycoord.served.state import GREEN, YELLOW, ServedView
from tests.cluster import (
    MiB,
    QueryCluster,
    fast_scheduler,
    replica_number_recorded,
    running_cluster,
    wait_in_memory,
    wait_until,
)
from tests.spawn import MID_LOAD_FLAGS, spawn_coordinator
from tests.test_served import FixedNodes, seg, two_replica_meta

SLOW = FaultConfig(latency_ms=40)  # a new replica's nodes: its loads take many polls


async def snapshot(kv: MetaKV) -> dict[str, bytes]:
    """Every key under the root but the sessions' (their leases are renewed meanwhile)."""
    return {k: v for k, v in (await kv.load_prefix("")).items() if "session" not in k.lower()}


def holds(nodes: list[QueryNode], members: set[int], cid: int, segments: int, channels: int) -> bool:
    """Whether these nodes, as their GetDataDistribution reports, hold every segment and DM channel of ``cid``."""
    seg: set[int] = set()
    chans: set[str] = set()
    for n in nodes:
        if n.node_id in members and n.healthy:
            d = n.state.distribution()
            seg |= {s.segment_id for s in d.segments if s.collection_id == cid}
            chans |= {c.channel_name for c in d.channels
                      if c.collection_id == cid and c.kind == querynode_pb2.CHANNEL_KIND_DM}
    return len(seg) == segments and len(chans) == channels


def holds_nothing(nodes: list[QueryNode], members: set[int], cid: int) -> bool:
    for n in nodes:
        if n.node_id in members and n.healthy:
            d = n.state.distribution()
            if any(s.collection_id == cid for s in d.segments) or any(c.collection_id == cid for c in d.channels):
                return False
    return True


class Watch:
    """Polls ``check`` every few milliseconds while a resize runs; ``polls`` counts them, ``broken`` the failures."""

    def __init__(self, check: Callable[[], bool]):
        self.check = check
        self.polls = 0
        self.broken: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.polls += 1
            if not self.check():
                self.broken.append(self.polls)
            await asyncio.sleep(0.02)

    @contextlib.contextmanager
    def running(self) -> Iterator[Watch]:
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            yield self
        finally:
            self._task.cancel()


def groups(meta: QueryMeta, cid: int) -> dict[int, set[int]]:
    return {r.replica_id: set(r.node_ids) for r in meta.replicas_of(cid)}


async def update(client: QueryCoordClient, cid: int, number: int) -> qc.UpdateLoadConfigResponse:
    return await client.query("UpdateLoadConfig", qc.UpdateLoadConfigRequest(collection_ids=[cid],
                                                                            replica_number=number))


async def load(c: QueryCluster, cid: int, number: int) -> None:
    assert c.client is not None
    r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=number))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    await c.wait_loaded(cid)
    await c.wait_idle()


async def test_a_joining_replica_shows_its_progress_but_the_collection_counts_the_others(kv: MetaKV) -> None:
    """A grow's new replica (past the record's replica_number) is listed, lacks what it lacks, and is counted
    neither in the collection's percentage nor its health; recorded, it counts."""
    meta = await two_replica_meta(kv)
    await meta.drop_replicas(1, [8], 1)  # replica 8 gone: the collection has one replica, 7
    await meta.remove_collection_copies(1, [3, 4])
    await meta.add_replicas(1, [data_pb2.ReplicaInfo(replica_id=9, collection_id=1, node_ids=[5])])
    await meta.save_segments([seg(100, 10, 5, 9)])  # the new replica holds one segment of three
    info = meta.get_collection(1)
    assert info is not None and info.replica_number == 1 and joining_replica_ids(info) == [9]
    view = ServedView(meta, FixedNodes({1, 2, 5}))
    served = view.collection(1)
    assert served is not None and served.joining == {9}
    assert served.percentage == 100 and served.health == GREEN
    assert served.replicas[9].held == 1 and not served.replicas[9].whole
    assert missing_text(served, {}) == ""
    health = collection_health(served, {})
    assert {r.replica_id: r.whole for r in health.replicas} == {7: True, 9: False}
    await meta.set_replica_number(1, 2)  # recorded: now it counts, and the collection lacks what it lacks
    served = view.collection(1)
    assert served is not None and not served.joining and served.health == YELLOW and served.percentage < 100


async def test_grow_1_to_2_keeps_the_first_replica_whole_at_every_poll(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 2) as c:
        assert c.client is not None
        cid = await c.create_collection("grow", partitions=2, segments=120, channels=3)
        await load(c, cid, 1)
        meta = c.coords[0].coord.leadership.meta
        (first, first_nodes), = groups(meta, cid).items()
        for _ in range(2):
            node = await c.add_node(faults=SLOW)
            await c.wait_node_online(node.node_id)

        shown: list[tuple[int, int]] = []  # (collection %, replicas listed) from ShowCollections / GetReplicas
        progress: list[int] = []  # the new replica's percentage at each poll

        def first_whole() -> bool:
            return holds(c.nodes, first_nodes, cid, 120, 3)

        with Watch(first_whole).running() as watch:
            r = await update(c.client, cid, 2)
            assert r.status.error_code == common_pb2.SUCCESS and r.task_id and list(r.task_ids) == [r.task_id], r
            while c.coords[0].coord.leadership.scheduler.triggers:
                coll = (await c.client.query("ShowCollections", qc.ShowCollectionsRequest(
                    collection_ids=[cid]))).collections[0]
                reps = (await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))).replicas
                shown.append((coll.in_memory_percentage, len(reps)))
                progress += [r.in_memory_percentage for r in reps if r.replica_id != first]
                await asyncio.sleep(0.05)
            await c.wait_idle()
        assert watch.polls > 3 and not watch.broken, (watch.polls, watch.broken)
        assert shown and all(pct == 100 for pct, _ in shown), "the collection stayed served while it grew"
        assert any(n == 2 for _, n in shown), "the new replica was listed while it loaded"
        assert any(p < 100 for p in progress), ("the new replica showed its own progress", progress)

        after = groups(meta, cid)
        assert len(after) == 2 and after[first] == first_nodes
        (new, new_nodes), = ((k, v) for k, v in after.items() if k != first)
        assert not new_nodes & first_nodes and new > first
        assert holds(c.nodes, first_nodes, cid, 120, 3) and holds(c.nodes, new_nodes, cid, 120, 3)
        info = meta.get_collection(cid)
        assert info is not None and info.replica_number == 2
        fresh = QueryMeta(c.kv)  # what a new leader reads
        await fresh.reload()
        stored = fresh.get_collection(cid)
        assert stored is not None and stored.replica_number == 2 and groups(fresh, cid) == after
        reps = (await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))).replicas
        assert [x.in_memory_percentage for x in reps] == [100, 100]
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.summary == f"resize collection {cid}: 1 -> 2 replicas", tree.trigger
        assert tree.trigger.kind == qc.TASK_KIND_UPDATE_LOAD_CONFIG and not tree.trigger.error

        # Asked again: the same number, nothing queued.
        before = await snapshot(c.kv)
        r = await update(c.client, cid, 2)
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id == 0
        r2 = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r2.status.error_code == common_pb2.SUCCESS and r2.task_id == 0
        assert await snapshot(c.kv) == before


async def test_shrink_3_to_1_keeps_one_replica_untouched_and_frees_the_others(
        etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 3) as c:
        assert c.client is not None
        cid = await c.create_collection("shrink", partitions=1, segments=90, channels=2)
        await load(c, cid, 3)
        meta = c.coords[0].coord.leadership.meta
        before = groups(meta, cid)
        kept = min(before)  # all whole: ties go to the lowest id
        kept_nodes = before[kept]
        held = {n.node_id: set(n.state.segments) for n in c.nodes if n.node_id in kept_nodes}
        dropped_nodes = set().union(*(g for r, g in before.items() if r != kept))

        def kept_whole() -> bool:
            return holds(c.nodes, kept_nodes, cid, 90, 2)

        with Watch(kept_whole).running() as watch:
            # LoadCollection of the loaded collection with another number resizes it.
            r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=1))
            assert r.status.error_code == common_pb2.SUCCESS and r.task_id, r.status
            await c.wait_idle()
            await wait_until(lambda: holds_nothing(c.nodes, dropped_nodes, cid), "the dropped nodes released it")
        assert watch.polls > 1 and not watch.broken, (watch.polls, watch.broken)
        assert groups(meta, cid) == {kept: kept_nodes}
        assert {n.node_id: set(n.state.segments) for n in c.nodes if n.node_id in kept_nodes} == held, "untouched"
        info = meta.get_collection(cid)
        assert info is not None and info.replica_number == 1
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        assert groups(fresh, cid) == {kept: kept_nodes}
        assert not any(set(s.node_ids) & dropped_nodes for s in fresh.segments_of(cid)), "no record names them"
        assert not any(w.node_id in dropped_nodes for w in fresh.dm_channels_of(cid))
        assert all(meta.replica_of_node(cid, n) == 0 for n in dropped_nodes), "they are spares now"
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.summary == f"resize collection {cid}: 3 -> 1 replicas"


async def test_a_grow_that_cannot_fit_is_refused_and_writes_nothing(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("tight", partitions=1, segments=40, channels=2)
        await load(c, cid, 1)
        before = await snapshot(c.kv)
        r = await update(c.client, cid, 2)  # the one node serves the one replica: no spare, none to take
        assert r.status.error_code == common_pb2.NO_AVAILABLE_NODE, r.status
        assert "needs 1 query node" in r.status.reason and "0 spare online and 0 its replicas can spare" in \
            r.status.reason, r.status.reason
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=3))
        assert r.status.error_code == common_pb2.NO_AVAILABLE_NODE, r.status
        assert await snapshot(c.kv) == before

        small = await c.add_node(capacity=1 * MiB)  # a spare far too small for 40 segments of 1 MiB
        await c.wait_node_online(small.node_id)
        before = await snapshot(c.kv)
        r = await update(c.client, cid, 2)
        assert r.status.error_code == common_pb2.RESOURCE_EXHAUSTED, r.status
        assert "does not fit" in r.status.reason and f"node {small.node_id}" in r.status.reason, r.status.reason
        assert await snapshot(c.kv) == before
        assert holds_nothing(c.nodes, {small.node_id}, cid)
        assert not c.coords[0].coord.leadership.scheduler.triggers


async def test_bad_numbers_and_unknown_collections_are_refused(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 2) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("bad", partitions=2, segments=10, channels=2)
        other = await c.create_collection("unloaded", partitions=1, segments=4, channels=1)
        await load(c, cid, 1)
        before = await snapshot(c.kv)
        for number in (0, -1, 17):
            r = await update(c.client, cid, number)
            assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "replica_number" in r.status.reason, number
        r = await c.client.query("UpdateLoadConfig", qc.UpdateLoadConfigRequest(replica_number=2))
        assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "collection_ids" in r.status.reason
        r = await update(c.client, other, 1)
        assert r.status.error_code == common_pb2.NOT_FOUND and "not loaded" in r.status.reason
        r = await c.client.query("UpdateLoadConfig", qc.UpdateLoadConfigRequest(collection_ids=[cid, other],
                                                                                replica_number=1))
        assert r.status.error_code == common_pb2.NOT_FOUND, "checked whole before anything is queued"
        assert await snapshot(c.kv) == before

        # Partitions: another number than the collection's is refused (a resize is of the whole collection).
        pids = [p.partition_id for p in await c.coords[0].coord.catalog.show_partitions(other)]
        await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=other, partition_ids=pids,
                                                                         replica_number=1))
        await c.wait_idle()
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=other, partition_ids=pids,
                                                                            replica_number=2))
        assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT and "UpdateLoadConfig" in r.status.reason


async def test_a_release_racing_a_grow_wins_and_leaves_nothing_loaded(etcd: EtcdCluster, root_path: str) -> None:
    small_requests = fast_scheduler(max_request_bytes=3000, max_concurrent_children=2)
    async with running_cluster(etcd, root_path, [None] * 1, scheduler=small_requests) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("race", partitions=1, segments=150, channels=2)
        await load(c, cid, 1)
        slow = await c.add_node(faults=FaultConfig(latency_ms=80))
        await c.wait_node_online(slow.node_id)
        r = await update(c.client, cid, 2)
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id
        await wait_until(lambda: bool(slow.state.segments), "the new replica's node started loading")
        rel = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert rel.status.error_code == common_pb2.SUCCESS, rel.status
        await c.wait_idle()
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        assert tree.trigger.error_code == common_pb2.CANCELLED, tree.trigger
        assert holds_nothing(c.nodes, {n.node_id for n in c.nodes}, cid)
        assert c.coords[0].coord.leadership.meta.get_collection(cid) is None
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        assert fresh.get_collection(cid) is None and not fresh.segments_of(cid)


async def test_a_leader_killed_mid_grow_is_finished_by_the_new_leader(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        assert c.kv is not None
        for _ in range(2):
            await c.add_node()
        a = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-a")
        b = None
        try:
            await a.next_event("leader", timeout=60)
            b = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-b")
            desc, _ = await CatalogStore(c.kv).create_bulk_collection("takeover", num_partitions=2,
                                                                       num_segments=200, num_channels=2)
            cid = desc.collection_id
            client = QueryCoordClient([a.address, b.address], deadline=60, call_timeout=10)
            r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=1))
            assert r.status.error_code == common_pb2.SUCCESS, r.status
            await wait_in_memory(client, cid)
            original = {n.node_id for n in c.nodes}
            new_nodes = []
            for _ in range(2):
                new_nodes.append(await c.add_node(faults=FaultConfig(latency_ms=100)))

            with Watch(lambda: holds(c.nodes, original, cid, 200, 2)).running() as watch:
                for _ in range(300):  # the leader learns of the new nodes through their sessions
                    shown = await client.query("ShowNodes", qc.ShowNodesRequest())
                    if sum(n.state == "online" for n in shown.nodes) == 4:
                        break
                    await asyncio.sleep(0.1)
                r = await update(client, cid, 2)
                assert r.status.error_code == common_pb2.SUCCESS, r.status
                await wait_until(lambda: any(n.state.segments for n in new_nodes), "the grow is loading")
                a.signal(signal.SIGKILL)
                await b.next_event("leader", timeout=60)

                assert await replica_number_recorded(c, cid, 2), "the new leader recorded 2 replicas"
            assert not watch.broken, (watch.polls, watch.broken)
            fresh = QueryMeta(c.kv)
            await fresh.reload()
            after = groups(fresh, cid)
            assert len(after) == 2
            a_nodes, b_nodes = after.values()
            assert not a_nodes & b_nodes
            assert original in (a_nodes, b_nodes), "the original replica kept its nodes"
            assert holds(c.nodes, a_nodes, cid, 200, 2) and holds(c.nodes, b_nodes, cid, 200, 2)
            await client.close()
        finally:
            await a.kill()
            if b is not None:
                await b.kill()


async def test_a_shrink_interrupted_by_a_leader_crash_is_finished_by_the_new_leader(
        etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        first = await c.wait_leader()
        await c.start_coordinator()
        assert c.client is not None and c.kv is not None
        for _ in range(3):
            await c.add_node(faults=FaultConfig(latency_ms=300))  # a release call takes a while: room to crash
        cid = await c.create_collection("shrink_crash", partitions=1, segments=30, channels=2)
        await load(c, cid, 3)
        before = groups(first.coord.leadership.meta, cid)

        r = await update(c.client, cid, 1)
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id

        async def stored() -> dict[int, set[int]]:
            fresh = QueryMeta(c.kv)
            await fresh.reload()
            return groups(fresh, cid)

        for _ in range(300):  # until the dropped replicas left the record: the shrink is under way
            if len(await stored()) == 1:
                break
            await asyncio.sleep(0.02)
        await first.crash()
        second = await c.wait_leader()
        assert second is not first
        kept = await stored()
        assert len(kept) == 1 and kept.items() <= before.items(), (kept, before)
        (kept_id, kept_nodes), = kept.items()
        dropped = set().union(*(g for rid, g in before.items() if rid != kept_id))
        await wait_until(lambda: holds_nothing(c.nodes, dropped, cid), "the dropped nodes released the collection")
        await c.wait_idle()
        await c.wait_no_task_keys()
        assert holds(c.nodes, kept_nodes, cid, 30, 2)
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        info = fresh.get_collection(cid)
        assert info is not None and info.replica_number == 1 and groups(fresh, cid) == kept
        assert not any(set(seg.node_ids) & dropped for seg in fresh.segments_of(cid)), "no record names them"


async def test_partitions_grow_and_a_resize_queued_behind_it(etcd: EtcdCluster, root_path: str) -> None:
    small_requests = fast_scheduler(max_request_bytes=3000, max_concurrent_children=2)
    async with running_cluster(etcd, root_path, [None], scheduler=small_requests) as c:
        assert c.client is not None
        cid = await c.create_collection("parts", partitions=2, segments=60, channels=2)
        pids = [p.partition_id for p in await c.coords[0].coord.catalog.show_partitions(cid)]
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids[:1],
                                                                            replica_number=1))
        assert r.status.error_code == common_pb2.SUCCESS
        await c.wait_loaded(cid)
        await c.wait_idle()
        meta = c.coords[0].coord.leadership.meta
        (first, first_nodes), = groups(meta, cid).items()
        wanted = len(meta.segment_ids_of(cid))  # the loaded partition's segments
        spare = await c.add_node(faults=FaultConfig(latency_ms=60))
        await c.wait_node_online(spare.node_id)

        grow = await update(c.client, cid, 2)
        assert grow.status.error_code == common_pb2.SUCCESS and grow.task_id
        shrink = await update(c.client, cid, 1)  # compared with the pending resize's 2: queued behind it
        assert shrink.status.error_code == common_pb2.SUCCESS and shrink.task_id > grow.task_id
        again = await update(c.client, cid, 1)
        assert again.task_id == shrink.task_id, "the same resize asked again joins the pending one"
        await c.wait_idle()
        for task_id, summary in ((grow.task_id, "1 -> 2"), (shrink.task_id, "2 -> 1")):
            tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=task_id))).tree
            assert tree.trigger.state == qc.TASK_STATE_EXPIRED and not tree.trigger.error, tree.trigger
            assert tree.trigger.summary == f"resize collection {cid}: {summary} replicas"
        assert groups(meta, cid) == {first: first_nodes}, "both whole: the lowest id is kept"
        assert holds(c.nodes, first_nodes, cid, wanted, 2)
        assert holds_nothing(c.nodes, {spare.node_id}, cid)
        info = meta.get_collection(cid)
        assert info is not None and info.replica_number == 1 and [p.partition_id for p in info.partitions] == pids[:1]
