"""Draining a query node: its copies are held elsewhere in their replica before it lets go of them, it ends
DRAINED (holding nothing, in no replica); a drain with no room waits and says why without holding up other
work; a drain survives a leader change.

Real etcd, real coordinators, real in-process query nodes; the copy counts are what the nodes themselves hold,
polled while the drain runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode import QueryNode
from tests.cluster import MiB, QueryCluster, drain, drain_waiting, node_info, running_cluster, wait_until


def replica_copies(lead: Leadership, nodes: list[QueryNode], cid: int) -> dict[int, Counter[int]]:
    """replica -> segment -> copies its member nodes hold now (what the nodes report, members as meta has them)."""
    by_id = {n.node_id: n for n in nodes if n.healthy}
    out: dict[int, Counter[int]] = {}
    for r in lead.meta.replicas_of(cid):
        out[r.replica_id] = Counter(s for m in r.node_ids if m in by_id for s in by_id[m].state.segments)
    return out


def held_everywhere(lead: Leadership, nodes: list[QueryNode], cid: int, segments: set[int]) -> list[str]:
    """What is wrong: a segment some replica's nodes do not hold at least once."""
    return [f"replica {r} holds {len(set(held) & segments)} of {len(segments)}"
            for r, held in replica_copies(lead, nodes, cid).items() if not segments <= set(held)]


async def test_drain_in_two_replicas_never_holds_fewer_copies(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None] * 4) as c:
        assert c.client is not None
        cid = await c.create_collection("drained", partitions=2, segments=24, channels=2)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        await c.wait_loaded(cid)
        await c.wait_idle()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        segments = set(lead.meta.segment_ids_of(cid))
        victim = next(n for n in c.nodes if n.state.segments and n.state.dm_channels) if any(
            n.state.dm_channels for n in c.nodes) else c.nodes[0]
        replica = lead.meta.replica_of_node(cid, victim.node_id)
        before = sum(1 for n in c.nodes if n.node_id != victim.node_id)
        assert before and victim.state.segments

        problems: list[str] = []
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                problems.extend(held_everywhere(lead, c.nodes, cid, segments))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        try:
            r2 = await drain(c, victim.node_id)
            assert r2.node.lifecycle == qc.NODE_LIFECYCLE_DRAINING
            assert r2.node.drain.copies_total == len(victim.state.segments) + len(victim.state.dm_channels)

            async def drained() -> bool:
                return (await node_info(c, victim.node_id)).lifecycle == qc.NODE_LIFECYCLE_DRAINED

            for _ in range(600):
                if await drained():
                    break
                await asyncio.sleep(0.1)
            assert await drained(), await node_info(c, victim.node_id)
        finally:
            stop.set()
            await watcher
        assert not problems, problems[:5]
        # The end state: it holds nothing, is in no replica, and the replica it left still holds everything once.
        assert not victim.state.segments and not victim.state.dm_channels
        assert all(victim.node_id not in r.node_ids for r in lead.meta.replicas_of(cid))
        copies = replica_copies(lead, c.nodes, cid)
        assert set(copies[replica]) == segments and set(copies[replica].values()) == {1}, copies[replica]
        info = await node_info(c, victim.node_id)
        assert info.drain.copies_left == 0 and info.drain.copies_total > 0 and not info.drain.waiting
        # Uncordoned, it is a spare again: a new load may use it.
        r3 = await c.client.query("UncordonNode", qc.NodeLifecycleRequest(node_id=victim.node_id))
        assert r3.node.lifecycle == qc.NODE_LIFECYCLE_ACTIVE and not r3.node.HasField("drain")


async def test_drain_without_room_waits_says_why_and_other_loads_go_on(etcd: EtcdCluster, root_path: str) -> None:
    # Two nodes of 40 MiB (36 under the 90 % limit); ten segments of about 5 MiB fill both to about 25 MiB: the
    # other node has no room for the drained node's half.
    async with running_cluster(etcd, root_path, [None, None], capacity=40 * MiB) as c:
        assert c.client is not None
        big = await c.create_collection("big", partitions=1, segments=10)
        await c.load_collection(big)
        await c.wait_idle()
        a, b = c.nodes
        held_a = set(a.state.segments)
        assert held_a and b.state.segments
        await drain(c, a.node_id)
        why = await drain_waiting(c, a.node_id)
        assert "no room" in why and f"collection {big}" in why, why
        assert held_a <= set(a.state.segments), "a drain never drops a copy with no other home"
        assert (await node_info(c, a.node_id)).lifecycle == qc.NODE_LIFECYCLE_DRAINING

        # An unrelated load is not held up by the waiting drain (and does not go to the draining node).
        small = await c.create_collection("small", partitions=1, segments=1, channels=1)
        await c.load_collection(small)
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        assert set(lead.meta.segment_ids_of(small)) <= set(b.state.segments)

        # Room comes (a node joins): the drain finishes.
        c_node = await c.add_node(capacity=1024 * MiB)
        await wait_until(lambda: lead.lifecycles is not None
                         and lead.lifecycles.state(a.node_id) == qc.NODE_LIFECYCLE_DRAINED, "drained", timeout=90)
        assert not a.state.segments and held_a <= set(b.state.segments) | set(c_node.state.segments)


async def test_drain_survives_a_leader_change(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        first = await c.start_coordinator()
        await c.wait_leader()
        for _ in range(3):
            await c.add_node(capacity=1024 * MiB)
        cid = await c.create_collection("moved", partitions=1, segments=30, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        victim = max(c.nodes, key=lambda n: len(n.state.segments))
        lead = first.coord.leadership
        assert lead is not None
        segments = set(lead.meta.segment_ids_of(cid))
        await c.start_coordinator()
        await drain(c, victim.node_id)
        # The leader goes (mid-drain or just after it began): the standby takes over and finishes it.
        await first.stop()
        new = await c.wait_leader()
        assert new is c.coords[1]
        new_lead = new.coord.leadership
        assert new_lead is not None
        with contextlib.suppress(AssertionError):
            assert new_lead.lifecycles is not None
        await wait_until(lambda: new_lead.lifecycles is not None
                         and new_lead.lifecycles.state(victim.node_id) == qc.NODE_LIFECYCLE_DRAINED,
                         "the new leader finished the drain", timeout=90)
        assert not victim.state.segments and not victim.state.dm_channels
        others = [n for n in c.nodes if n is not victim]
        assert segments <= {s for n in others for s in n.state.segments}
        assert all(victim.node_id not in r.node_ids for r in new_lead.meta.replicas_of(cid))
