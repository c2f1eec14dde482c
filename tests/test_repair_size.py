"""A repair larger than one etcd write is done in parts (``checkers.repair_size``), and the parts add up."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import data_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.checkers.repair_size import bound_repair
from querycoord.task.history import TaskHistory
from tests.cluster import QueryCluster, fast_scheduler, wait_until
from tests.truth import held_by

SEGMENTS = 200_000  # 100,000 on the node that is lost: ~1.7 MB as one repair record, over etcd's 1.5 MiB


def _request(missing: int, adopt: int, forget: int, release: list[int]) -> task_pb2.RepairRequest:
    req = task_pb2.RepairRequest(reason="x")
    req.missing_segments.extend(data_pb2.SegmentInfo(segment_id=10_000_000 + i, collection_id=7, partition_id=9,
                                                     node_id=3, replica_id=2) for i in range(missing))
    req.adopt.extend(data_pb2.SegmentInfo(segment_id=20_000_000 + i, collection_id=7, partition_id=9, node_id=4,
                                          num_rows=10_000, mem_size=5 << 20) for i in range(adopt))
    req.forget_segment_ids.extend(30_000_000 + i for i in range(forget))
    for node, count in enumerate(release, start=1):
        req.release_segments.add(node_id=node, segment_ids=[40_000_000 + node * 100_000 + i for i in range(count)])
    return req


@settings(max_examples=60, deadline=None)
@given(missing=st.integers(0, 3000), adopt=st.integers(0, 500), forget=st.integers(0, 3000),
       release=st.lists(st.integers(0, 800), max_size=4), budget=st.integers(256, 40_000))
def test_a_bound_repair_fits_and_keeps_a_prefix_of_each_list(missing: int, adopt: int, forget: int,
                                                            release: list[int], budget: int) -> None:
    whole = _request(missing, adopt, forget, release)
    req = task_pb2.RepairRequest()
    req.CopyFrom(whole)
    left = bound_repair(req, budget)
    if whole.ByteSize() <= budget:
        assert req == whole and left == 0
        return
    assert req.ByteSize() <= budget
    for name in ("missing_segments", "adopt", "forget_segment_ids"):
        kept, every = list(getattr(req, name)), list(getattr(whole, name))
        assert kept == every[:len(kept)], name
    kept_release = {ns.node_id: list(ns.segment_ids) for ns in req.release_segments}
    every_release = {ns.node_id: list(ns.segment_ids) for ns in whole.release_segments}
    assert all(ids == every_release[node][:len(ids)] for node, ids in kept_release.items())
    counted = (len(whole.missing_segments) + len(whole.adopt) + len(whole.forget_segment_ids)
               + sum(len(ns.segment_ids) for ns in whole.release_segments))
    kept_count = (len(req.missing_segments) + len(req.adopt) + len(req.forget_segment_ids)
                  + sum(len(ns.segment_ids) for ns in req.release_segments))
    assert left == counted - kept_count


async def test_a_node_lost_with_more_segments_than_one_etcd_write_holds_is_repaired(etcd: EtcdCluster,
                                                                                    root_path: str) -> None:
    """One replica on two nodes holding 200,000 segments; one node is lost. Its 100,000 segments as one repair
    record were refused by etcd at every pass, so nothing was ever repaired; in parts, the other node holds every
    segment again (as it reports), each part said in its reason, and no trigger failed."""
    # Sessions of 10 s, the coordinator's and the nodes': on a loaded machine a 2 s session lapsed while 200,000
    # segments loaded (the in-process nodes share this event loop with the coordinator), and each new term read
    # them all again, or the survivor was lost too; what is tested here is the repair, not a failover.
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(trigger_timeout=600.0), session_ttl=10.0) as c:
        await c.start_coordinator()
        await c.wait_leader()
        cid = await c.create_collection("big", partitions=4, segments=SEGMENTS)  # before the nodes: it takes a while
        for _ in range(2):
            node = await c.add_node(capacity=1 << 42, ttl=10.0)
            await c.wait_node_online(node.node_id)
        await c.load_collection(cid, timeout=300)
        victim = max(c.nodes, key=lambda n: len(n.state.distribution().segments))
        survivor = next(n for n in c.nodes if n is not victim)
        await victim.crash(revoke=True)
        c.nodes.remove(victim)
        await wait_until(lambda: len(held_by(c, {survivor.node_id})[0]) == SEGMENTS,
                         "the survivor holds every segment again", timeout=600)
        assert c.kv is not None
        page = await TaskHistory(MetaKV(c.kv.client, c.kv.root)).page(after=0, newest_first=False, want=1000)
        assert not [t.trigger.summary for t in page if t.trigger.state == qc.TASK_STATE_FAILED]
        repairs = [t.trigger.summary for t in page if t.trigger.kind == qc.TASK_KIND_REPAIR]
        assert any("more in a later repair" in s for s in repairs), repairs
