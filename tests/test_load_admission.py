"""Load admission: a load that cannot fit the query nodes' memory is refused at once (RESOURCE_EXHAUSTED) with
what it needs, what is free, what is missing and how many nodes of the usual size would make it fit; nothing is
written. Real etcd, a real coordinator, real query nodes on loopback with known capacities."""

from __future__ import annotations

import math

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.task.admission import human
from tests.cluster import MiB, QueryCluster, running_cluster

LIMIT = 0.9  # the scheduler's memory limit (its default)


async def _segment_size(c: QueryCluster, cid: int) -> int:
    assert c.kv is not None
    store = CatalogStore(c.kv)
    pid = (await store.show_partitions(cid))[0].partition_id
    _, binlogs = await store.get_recovery_info(cid, pid)
    sizes = {b.mem_size for b in binlogs}
    assert len(sizes) == 1, sizes
    return sizes.pop()


async def _nothing_written(c: QueryCluster, cid: int) -> None:
    assert c.client is not None
    show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    assert show.status.error_code == common_pb2.NOT_FOUND, show.status
    assert all(v == 0 for v in (await c.task_keys()).values())
    hist = await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True, collection_id=cid))
    assert not hist.trees, "a refused load leaves no task, running or finished"
    assert all(not n.state.segments for n in c.nodes), "no node was asked to load anything"


async def test_a_load_too_big_is_refused_at_once_with_what_is_missing(etcd: EtcdCluster, root_path: str) -> None:
    """Two nodes of 64 MiB; two replicas of 20 segments (one node each): each replica lacks memory."""
    async with running_cluster(etcd, root_path, [None] * 2, capacity=64 * MiB) as c:
        cid = await c.create_collection("big", partitions=2, segments=20)
        seg = await _segment_size(c, cid)
        assert c.client is not None
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r.status.error_code == common_pb2.RESOURCE_EXHAUSTED, r.status
        per_replica = 20 * seg
        usable = int(64 * MiB * LIMIT)
        free = 2 * usable
        missing = 2 * per_replica - free
        more = math.ceil(missing / usable)
        assert r.status.reason == (
            f"load of collection {cid} needs 2 replicas x {human(per_replica)}; the nodes that can take them have "
            f"{human(free)} free (under 90% of capacity): {human(missing)} missing, about {more} more "
            f"node{'s' if more > 1 else ''} of {human(64 * MiB)}"), r.status.reason
        await _nothing_written(c, cid)


async def test_each_replica_must_fit_its_own_nodes_not_just_the_sum(etcd: EtcdCluster, root_path: str) -> None:
    """Three nodes of 64 MiB hold more than two copies in sum, but two replicas split them 2 + 1, and one node
    cannot take a whole copy: refused, one node more named."""
    async with running_cluster(etcd, root_path, [None] * 3, capacity=64 * MiB) as c:
        cid = await c.create_collection("split", partitions=1, segments=14)
        seg = await _segment_size(c, cid)
        usable = int(64 * MiB * LIMIT)
        assert 2 * 14 * seg < 3 * usable and 14 * seg > usable, "the sizes this test is built on"
        assert c.client is not None
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r.status.error_code == common_pb2.RESOURCE_EXHAUSTED, r.status
        assert f"needs 2 replicas x {human(14 * seg)}" in r.status.reason, r.status.reason
        assert r.status.reason.endswith(f"about 1 more node of {human(64 * MiB)}"), r.status.reason
        await _nothing_written(c, cid)
        # One replica fits (on the three nodes together): admitted and loaded.
        await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=1))
        await c.wait_loaded(cid)


async def test_partitions_are_estimated_alone_and_a_fitting_load_is_admitted(etcd: EtcdCluster,
                                                                             root_path: str) -> None:
    """Two nodes of 64 MiB, two replicas: one partition of 10 segments fits each node, a second one does not."""
    async with running_cluster(etcd, root_path, [None] * 2, capacity=64 * MiB) as c:
        cid = await c.create_collection("parts", partitions=2, segments=20)
        seg = await _segment_size(c, cid)
        assert c.kv is not None and c.client is not None
        p1, p2 = [p.partition_id for p in await CatalogStore(c.kv).show_partitions(cid)]
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1],
                                                                            replica_number=2))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        await c.wait_idle()
        held = {n.node_id: set(n.state.segments) for n in c.nodes}
        assert all(len(s) == 10 for s in held.values()), held
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p2]))
        assert r.status.error_code == common_pb2.RESOURCE_EXHAUSTED, r.status
        assert r.status.reason.startswith(f"load of collection {cid} needs 2 replicas x {human(10 * seg)};"), \
            r.status.reason
        parts = await c.client.query("ShowPartitions", qc.ShowPartitionsRequest(collection_id=cid))
        assert [p.partition_id for p in parts.partitions] == [p1], "the refused partition is not loaded"
        assert {n.node_id: set(n.state.segments) for n in c.nodes} == held, "the nodes hold what they held"
        # Already loaded and asking nothing new: SUCCESS, as before admission.
        r = await c.client.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=[p1]))
        assert r.status.error_code == common_pb2.SUCCESS and r.task_id == 0, r
