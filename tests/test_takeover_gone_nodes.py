"""A takeover while query nodes are down: on a real cluster (real etcd, in-process gRPC query nodes for the survivors,
the victims real node processes killed with SIGKILL, the leader crashed as a killed process would be).

The new leader forgets the nodes gone while no leader watched once the persisted triggers are in, and each forget
queues its node's repair from the records still naming it; its first pass leaves those collections to the repairs.
What must hold, as the query nodes themselves report it (their GetDataDistribution, each load they carried out):
the survivors end holding every target segment and DM channel once per replica, each lost copy loaded once (not by
the takeover's repair and again by a pass's), the new leader's records naming the nodes that hold each copy; and a
survivor that lost copies without losing its session while no leader watched is repaired too (the repairs of the
gone nodes hide nothing from the passes after them).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from meta.ops.etcd_server import EtcdCluster
from meta.session import session_key
from proto import querycoord_pb2 as qc
from proto import querynode_pb2
from querycoord.common.protocol import QUERYNODE_ROLE
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode import QueryNode
from tests.cluster import QueryCluster, fast_scheduler, until, wait_until
from tests.test_repair_lost import assert_held_once, count_loads, distribution, shown_percentage
from tests.truth import target_of

VICTIMS = (911, 912)


async def loaded_with_victims(c: QueryCluster, tmp_path: Path, replicas: int, *,
                              standby: bool = True) -> tuple[int, Counter[int]]:
    """A leader and a standby (unless not ``standby``), two in-process nodes per replica and node processes
    ``VICTIMS``; a collection loaded over them. Returns it and the copies the victims hold (their own
    GetDataDistribution): a segment both hold, in two replicas, counts twice."""
    await c.start_coordinator()
    await c.wait_leader()
    if standby:
        await c.start_coordinator()  # the standby that takes over
    for _ in range(2 * replicas):
        await c.add_node()
    for node_id in VICTIMS:
        await c.start_node_process("--node-id", str(node_id), log_dir=tmp_path)
    cid = await c.create_collection("gone", partitions=2, segments=48, channels=4)
    assert c.client is not None
    r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=replicas))
    assert r.status.error_code == 0, r
    await c.wait_loaded(cid, timeout=90)
    await c.wait_idle()
    lost: Counter[int] = Counter()
    for node_id in VICTIMS:
        lost.update(s.segment_id for s in (await distribution(c, node_id)).segments if s.collection_id == cid)
    assert len(lost) and max(lost.values()) <= replicas, "the load gave the victims segments, one copy per replica"
    return cid, lost


async def kill_victims_and_leader(c: QueryCluster) -> None:
    """SIGKILL both victims, then crash the leader: the victims' sessions lapse while no leader watches."""
    await asyncio.gather(*(p.kill() for p in c.procs if p.node_id in VICTIMS))
    await c.coords[0].crash()


async def takes_over(c: QueryCluster) -> Leadership:
    new = await c.wait_leader(timeout=60)
    assert new is c.coords[1], "the standby took over"
    lead = new.coord.leadership
    assert lead is not None
    await wait_until(lambda: not set(VICTIMS) & lead.meta.bound_node_ids(), "the new leader forgot the victims")
    return lead


async def victims_sessions_gone(c: QueryCluster) -> bool:
    assert c.kv is not None
    return all([await c.kv.get(session_key(QUERYNODE_ROLE, n)) is None for n in VICTIMS])


async def repairs_in_history(c: QueryCluster, cid: int) -> list[int]:
    """The trigger conditions of the collection's repairs, oldest first (ListTasks with the history)."""
    assert c.client is not None
    resp = await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True))
    assert resp.status.error_code == 0, resp.status
    return [t.trigger.trigger_condition for t in resp.trees
            if t.trigger.kind == qc.TASK_KIND_REPAIR and t.trigger.collection_id == cid]


async def whole_on_survivors(c: QueryCluster, cid: int) -> bool:
    target = await target_of(c, cid)
    held: set[int] = set()
    for node in c.nodes:
        held |= {s.segment_id for s in (await distribution(c, node.node_id)).segments if s.collection_id == cid}
    return target[0] <= held and await shown_percentage(c, cid) == 100


async def test_a_takeover_with_two_nodes_down_ends_whole_each_lost_copy_loaded_once(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 0.3  # passes run all along the repairs
        cid, lost = await loaded_with_victims(c, tmp_path, replicas=2)
        loads = count_loads(c.nodes)

        await kill_victims_and_leader(c)
        lead = await takes_over(c)
        await until("the survivors hold everything and the new leader shows 100 %",
                    lambda: whole_on_survivors(c, cid), timeout=90)
        await c.wait_idle()
        runs = lead.checker.runs
        await wait_until(lambda: lead.checker.runs >= runs + 3, "more passes after the repairs")
        await c.wait_idle()
        assert loads == lost, "each lost copy loaded once, by one repair"
        await assert_held_once(c, cid, replicas=2)
        # What the checker asks of a collection a trigger owns: a survivor leaves its ids out, over gRPC.
        ask = querynode_pb2.GetDataDistributionRequest(segment_ids_only=True, skip_collection_ids=[cid])
        asked = await lead.nodes.client(c.nodes[0].node_id).call("GetDataDistribution", ask)
        assert not asked.segment_groups and cid in {v.collection_id for v in asked.versions}


def lose_copies(node: QueryNode, cid: int, count: int) -> set[int]:
    """The node drops ``count`` of its segments of ``cid`` by itself: its session and incarnation stay."""
    ids = sorted(sid for sid, seg in node.state.segments.items() if seg.collection_id == cid)[:count]
    assert len(ids) == count
    dropped = node.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=ids))
    assert dropped == count
    return set(ids)


async def test_a_survivor_that_lost_copies_without_its_session_is_repaired_after_the_takeover(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        cid, lost = await loaded_with_victims(c, tmp_path, replicas=1)
        loads = count_loads(c.nodes)

        await kill_victims_and_leader(c)
        survivor = c.nodes[0]
        dropped = lose_copies(survivor, cid, 3)  # while no leader watches
        await takes_over(c)
        await until("the survivors hold everything and the new leader shows 100 %",
                    lambda: whole_on_survivors(c, cid), timeout=90)
        await c.wait_idle()
        assert loads == lost + Counter(dropped), "each copy of the victims and each the survivor lost loaded once"
        await assert_held_once(c, cid)


async def test_nodes_gone_while_no_leader_watched_are_repaired_by_one_repair_from_the_takeover(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        cid, lost = await loaded_with_victims(c, tmp_path, replicas=2, standby=False)
        loads = count_loads(c.nodes)

        await kill_victims_and_leader(c)
        await until("the victims' sessions lapsed", lambda: victims_sessions_gone(c), timeout=30)
        await c.start_coordinator()  # leads once the crashed leader's lease lapsed: both victims gone by then
        lead = await takes_over(c)
        await until("the survivors hold everything and the new leader shows 100 %",
                    lambda: whole_on_survivors(c, cid), timeout=90)
        await c.wait_idle()
        assert loads == lost, "each lost copy loaded once"
        await assert_held_once(c, cid, replicas=2)
        assert lead.meta.segment_count_on_node(VICTIMS[0]) == lead.meta.segment_count_on_node(VICTIMS[1]) == 0
        assert await repairs_in_history(c, cid) == [qc.TRIGGER_CONDITION_NODE_DOWN], \
            "one node-down repair for both gone nodes, none a pass had to find"
