"""Load progress after a repair or a drain's move: raised as soon as the nodes hold the data, never before.

Real etcd, real coordinators, real in-process query nodes (one of them failing every LoadSegments); what the
nodes hold is what they answer to GetDataDistribution, and the percentage is what ShowCollections answers.

What must hold: ShowCollections never says 100 % while the surviving nodes do not hold every target segment and
DM channel (a node whose loads fail is never counted); it reaches 100 % once they do; a leader that stops between
the repair's children and the progress update leaves the next leader to reach 100 %; a drain ends DRAINED with
every copy held elsewhere.
"""

from __future__ import annotations

import asyncio

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from proto import querynode_pb2
from querycoord.leader.settle import ProgressAfterMoves
from querycoord.nodes.querynode_faults import FaultConfig
from querycoord.querymeta import QueryMeta
from querycoord.task.triggers import TriggerTask
from tests.cluster import QueryCluster, drain, fast_scheduler, node_info, until
from tests.truth import target_of


async def shown(c: QueryCluster, cid: int) -> int:
    assert c.client is not None
    show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    assert show.status.error_code == 0, show.status
    return show.collections[0].in_memory_percentage


def reported(c: QueryCluster, node_ids: set[int], cid: int) -> tuple[set[int], set[str]]:
    """Segments and DM channels of ``cid`` the nodes ``node_ids`` report (GetDataDistribution)."""
    segs: set[int] = set()
    chans: set[str] = set()
    for node_id, dist in c.distribution().items():
        if node_id in node_ids:
            segs |= {s.segment_id for s in dist.segments if s.collection_id == cid}
            chans |= {ch.channel_name for ch in dist.channels
                      if ch.collection_id == cid and ch.kind == querynode_pb2.CHANNEL_KIND_DM}
    return segs, chans


async def test_progress_is_100_once_the_nodes_hold_everything_and_never_before(etcd: EtcdCluster,
                                                                                root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        await c.start_coordinator()
        await c.wait_leader()
        a = await c.add_node()
        b = await c.add_node()
        cid = await c.create_collection("watched", partitions=2, segments=30, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        # A node that joins after the load and fails every LoadSegments: the repair may try it; never counted.
        broken = await c.add_node(faults=FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"})))
        target = await target_of(c, cid)
        victim = a if len(a.state.segments) >= len(b.state.segments) else b
        healthy = {n.node_id for n in (a, b) if n is not victim}
        early: list[str] = []
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                if await shown(c, cid) == 100:
                    segs, chans = reported(c, healthy, cid)
                    if not (target[0] <= segs and target[1] <= chans):
                        early.append(f"100 % while the nodes held {len(segs)} of {len(target[0])} segments")
                await asyncio.sleep(0.02)

        await victim.crash(revoke=True)
        c.nodes.remove(victim)
        # Judged from when the leader knows the victim is gone: until its session watch delivers the delete, the
        # leader counts what the victim held (nothing can tell it sooner; under a CPU hog the first sample came
        # first once).
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None

        async def victim_offline() -> bool:
            return not lead.nodes.is_online(victim.node_id)

        await until("the leader saw the victim's session end", victim_offline)
        watcher = asyncio.create_task(watch())
        try:
            async def whole() -> bool:
                segs, chans = reported(c, healthy, cid)
                return target[0] <= segs and target[1] <= chans and await shown(c, cid) == 100

            await until("the collection is whole and shown at 100 %", whole)
        finally:
            stop.set()
            await watcher
        assert not early, early[:3]
        assert not [s for s in c.distribution()[broken.node_id].segments if s.collection_id == cid]


async def test_a_leader_stopped_before_the_progress_update_leaves_the_next_one_to_reach_100(
        etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 30.0  # passes only when kicked: the repair's end kicks none (removed below)
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(3):
            await c.add_node()
        cid = await c.create_collection("handed", partitions=2, segments=24, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        await c.start_coordinator()  # the standby that takes over
        old = c.coords[0]
        lead = old.coord.leadership
        assert lead is not None
        hooks = lead.scheduler.finish_hooks
        repaired = asyncio.Event()

        def stop_instead(t: TriggerTask) -> None:
            if t.KIND == qc.TASK_KIND_REPAIR:
                repaired.set()

        # The repair's end neither raises the progress nor kicks a pass: the leader stops in that window.
        hooks[:] = [h for h in hooks if not isinstance(getattr(h, "__self__", None), ProgressAfterMoves)
                    and getattr(h, "__self__", None) is not lead.checker] + [stop_instead]
        target = await target_of(c, cid)
        victim = max(c.nodes, key=lambda n: len(n.state.segments))
        await victim.crash(revoke=True)
        c.nodes.remove(victim)
        alive = {n.node_id for n in c.nodes}
        await asyncio.wait_for(repaired.wait(), 60)
        await old.stop()
        segs, chans = reported(c, alive, cid)
        assert target[0] <= segs and target[1] <= chans, "the repair's children ended: the nodes hold everything"
        assert c.kv is not None
        persisted = QueryMeta(c.kv)
        await persisted.reload()
        info = persisted.get_collection(cid)
        assert info is not None and info.in_memory_percentage < 100, "the stopped leader never raised it"

        new = await c.wait_leader()
        assert new is c.coords[1]
        await until("the new leader shows the collection at 100 %", lambda: _is_100(c, cid))
        await persisted.reload()
        info = persisted.get_collection(cid)
        assert info is not None and info.in_memory_percentage == 100
        segs, chans = reported(c, alive, cid)
        assert target[0] <= segs and target[1] <= chans


async def _is_100(c: QueryCluster, cid: int) -> bool:
    return await shown(c, cid) == 100


async def test_a_drain_ends_drained_with_every_copy_elsewhere_and_progress_100(etcd: EtcdCluster,
                                                                               root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 30.0  # the drain's steps follow its moves, not the interval
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(3):
            await c.add_node()
        cid = await c.create_collection("drained", partitions=2, segments=24, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        target = await target_of(c, cid)
        victim = next((n for n in c.nodes if n.state.dm_channels and n.state.segments), c.nodes[0])
        others = {n.node_id for n in c.nodes if n is not victim}
        await drain(c, victim.node_id)

        async def drained() -> bool:
            return (await node_info(c, victim.node_id)).lifecycle == qc.NODE_LIFECYCLE_DRAINED

        await until("the node is drained", drained)
        dist = c.distribution()[victim.node_id]
        dm = [ch for ch in dist.channels if ch.kind == querynode_pb2.CHANNEL_KIND_DM]
        assert not dist.segments and not dm, "it holds nothing"
        segs, chans = reported(c, others, cid)
        assert target[0] <= segs and target[1] <= chans, "every copy is held elsewhere"
        await until("the collection is shown at 100 %", lambda: _is_100(c, cid))
