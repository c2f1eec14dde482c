"""The replica surfaces over gRPC: GetReplicas on the leader and on a standby, GetSegmentInfo's replica_id.

A real cluster (in-process coordinators and query nodes, real etcd): a
collection loaded with replica_number 2 on four nodes is answered as two
replicas on disjoint nodes, each holding every segment once, and every copy
GetSegmentInfo answers names the replica of the node holding it.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from tests.cluster import running_cluster

SEGMENTS = 24


async def test_get_replicas_and_segment_copies_name_their_replica(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 4) as c:
        q = c.client.query
        cid = await c.create_collection("twice", partitions=2, segments=SEGMENTS)

        # Not loaded: the NOT_FOUND ShowCollections answers.
        r = await q("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.NOT_FOUND and str(cid) in r.status.reason, r.status
        show = await q("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        assert show.status.error_code == r.status.error_code

        load = await q("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert load.status.error_code == common_pb2.SUCCESS, load.status
        await c.wait_loaded(cid)
        await c.wait_idle()

        r = await q("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        replicas = list(r.replicas)
        assert len(replicas) == 2 and [x.replica_id for x in replicas] == sorted(x.replica_id for x in replicas)
        nodes = [set(x.node_ids) for x in replicas]
        assert all(nodes) and not nodes[0] & nodes[1], nodes
        assert nodes[0] | nodes[1] <= {n.node_id for n in c.nodes}
        for x in replicas:
            assert x.collection_id == cid and list(x.node_ids) == sorted(x.node_ids)
            assert x.in_memory_percentage == 100 and x.segment_count == SEGMENTS, x
            assert len(x.dm_channels) == 2, x
        replica_of = {n: x.replica_id for x in replicas for n in x.node_ids}

        # GetSegmentInfo: one entry per copy, each with the replica of the node holding it; once per replica.
        seg = await q("GetSegmentInfo", qc.GetSegmentInfoRequest(collection_id=cid))
        assert seg.status.error_code == common_pb2.SUCCESS, seg.status
        assert len(seg.infos) == 2 * SEGMENTS
        for info in seg.infos:
            assert info.replica_id == replica_of[info.node_id], info
        per_replica = Counter((info.segment_id, info.replica_id) for info in seg.infos)
        assert set(per_replica.values()) == {1} and len(per_replica) == 2 * SEGMENTS
        one = seg.infos[0].segment_id
        holders = {n.node_id for n in c.nodes if one in n.state.segments}
        asked = await q("GetSegmentInfo", qc.GetSegmentInfoRequest(segment_ids=[one]))
        assert {(i.node_id, i.replica_id) for i in asked.infos} == {(n, replica_of[n]) for n in holders}
        assert len(holders) == 2, holders

        # A standby answers from etcd, as it answers ShowCollections: the same replicas and nodes.
        standby = await c.start_coordinator()
        await asyncio.sleep(0.3)
        assert not standby.coord.is_leader
        async with grpc.aio.insecure_channel(standby.address) as ch:
            stub = querycoord_pb2_grpc.QueryCoordStub(ch)
            got = await stub.GetReplicas(qc.GetReplicasRequest(collection_id=cid), timeout=10)
            assert got.status.error_code == common_pb2.SUCCESS, got.status
            assert [(x.replica_id, list(x.node_ids)) for x in got.replicas] == \
                [(x.replica_id, list(x.node_ids)) for x in replicas]
            assert [x.segment_count for x in got.replicas] == [SEGMENTS, SEGMENTS]
            gone = await stub.GetReplicas(qc.GetReplicasRequest(collection_id=cid + 10_000), timeout=10)
            assert gone.status.error_code == common_pb2.NOT_FOUND, gone.status

        rel = await q("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
        assert rel.status.error_code == common_pb2.SUCCESS, rel.status
        r = await q("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.NOT_FOUND, r.status
