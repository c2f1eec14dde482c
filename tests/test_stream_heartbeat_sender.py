"""A heartbeat is checked against its sender.

Only nodes with a live stream-node session are heard, an snode only from the node recorded for it, a vgroup stays
with its holder until it lets go (no flapping), and WATCH adopts under the session-verified node id. The nodes are
the reference stream node's state machine under real sessions (``tests.real_stream_nodes``); one test runs the
whole path: a coordinator and in-process stream nodes over gRPC.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from querycoord.nodes.streamnode import StreamNode
from querycoord.nodes.streamnode_state import StreamNodeState
from querycoord.stream.runtime import ManagerState
from querycoord.stream.store import StreamStore
from tests.real_stream_nodes import (
    MANAGER_LOG,
    RUNNING,
    TWO_NODES,
    RealNode,
    create_req,
    create_streams,
    deliver,
    feed_sessions,
    manager,
    real_nodes,
    round_,
    run_until,
    running,
    running_streams,
    sp,
    tasks_of,
)
from tests.stream_client import stub_for, wait_for
from tests.streams import Clock
from tests.test_stream_service import coordinator, wait_leader


async def test_heartbeat_without_a_live_session_is_refused(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        await create_streams(store, nodes, 2)
        ghost = await RealNode.start(kv)
        await ghost.session.close()  # its session is gone, the node keeps heartbeating
        never = StreamNodeState(max(n.node_id for n in nodes) + 1000)  # an id no session ever had
        mgr = await manager(store, kv, clock)
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        for impostor in (ghost.state, never):
            impostor.snode_id = nodes[0].state.snode_id  # claims a real snode and every vgroup
            impostor.vgroups = {1, 2, 3}
            for _ in range(3):
                reply = await deliver(mgr, impostor.build_heartbeat())
                assert reply.status.error_code == common_pb2.NOT_FOUND, reply
                assert "no live stream node session" in reply.status.reason
                assert not (reply.deploys or reply.starts or reply.runner_updates or reply.undeploys)
        assert mgr.rejected_heartbeats == 6
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 2, "logged once per node, not once per heartbeat"
        assert mgr.snodes == {} and mgr.vgroups == {}, "a refused heartbeat claims nothing"
        await run_until(mgr, nodes, clock, lambda: running(mgr))
        legit = {n.node_id for n in nodes}
        assert {node for _, node in tasks_of(mgr).values()} <= legit


async def test_snode_claim_must_match_the_snode_record(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with real_nodes(kv, [([1, 2], True), ([3], False), ([], False)]) as nodes:
        owner, thief = nodes[0], nodes[2]
        await create_streams(store, nodes, 2)
        thief.state.snode_id = owner.state.snode_id  # a live node claims another node's snode
        mgr = await manager(store, kv, clock)
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        for _ in range(3):
            reply = await thief.beat(mgr, clock)
            assert reply.status.error_code == common_pb2.SUCCESS  # the node itself is live: heard, claim ignored
            assert not reply.deploys, "snode tasks handed to a node that does not own the snode"
        assert owner.state.snode_id not in mgr.snodes
        await run_until(mgr, nodes, clock, lambda: running(mgr))
        assert not thief.state.tasks
        assert mgr.snodes[owner.state.snode_id].node_id == owner.node_id
        assert mgr.rejected_claims >= 3
        claims = [r for r in caplog.records if f"claims snode {owner.state.snode_id}" in r.getMessage()]
        assert len(claims) == 1


async def test_two_claimants_of_a_vgroup_do_not_make_readers_flap(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    layout = [([], True), ([1, 2, 3], False), ([], False), ([], False)]
    async with running_streams(store, kv, clock, 2, layout) as (nodes, _, mgr):
        holder, rival, third = nodes[1], nodes[2], nodes[3]
        on_3 = {k: node for k, (task, node) in tasks_of(mgr).items() if task.vgroup_id == 3}
        assert on_3 and set(on_3.values()) == {holder.node_id}
        before = holder.held()
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        rival.state.lead_vgroup(3)  # both claim vgroup 3 now
        for _ in range(10):
            await round_(mgr, [rival, holder, *nodes], clock)
        assert holder.held() == before and not rival.state.tasks, "the readers moved between the claimants"
        assert {k: node for k, (task, node) in tasks_of(mgr).items() if task.vgroup_id == 3} == on_3
        assert mgr.vgroups[3].node_id == holder.node_id and running(mgr)
        assert len([r for r in caplog.records if "claims vgroup 3" in r.getMessage()]) == 1
        # The holder lets go: the rival takes the vgroup, its readers move once (SID + 1).
        holder.state.drop_vgroup(3)
        await run_until(mgr, nodes, clock, lambda: running(mgr) and not any(
            k[1] in {t for _, t in on_3} for k in holder.state.tasks), what="readers moved to the rival")
        moved = {k: t for k, t in tasks_of(mgr).items() if k in on_3}
        assert {node for _, node in moved.values()} == {rival.node_id}
        assert {task.sid for task, _ in moved.values()} == {2}
        # A third claimant waits while the rival holds it, and takes over once the rival's session goes.
        third.state.lead_vgroup(3)
        for _ in range(5):
            await round_(mgr, nodes, clock)
        assert mgr.vgroups[3].node_id == rival.node_id
        await rival.session.close()
        await feed_sessions(mgr, kv)
        mgr.node_lost(rival.node_id)
        alive = [n for n in nodes if n is not rival]
        await run_until(mgr, alive, clock, lambda: mgr.vgroups[3].node_id == third.node_id and running(mgr))
        assert {node for k, (_, node) in tasks_of(mgr).items() if k in on_3} == {third.node_id}


async def test_watch_adopts_under_the_session_verified_node_id(store: StreamStore, kv: MetaKV) -> None:
    """A node whose reports name another node (a bug, or a lie): the new leader adopts the tasks where they run.

    WATCH does not trust the report's node id: the tasks would be adopted on the other node, then found
    "stale" on their real node, undeployed and redeployed."""
    clock = Clock()
    async with running_streams(store, kv, clock, 3) as (nodes, _, old):
        deployed = tasks_of(old)
        held = {n.node_id: n.held() for n in nodes}
        liar, other = nodes
        mgr = await manager(store, kv, clock, revision=200)
        assert mgr.state is ManagerState.WATCH

        def forge(req: sp.HeartbeatRequest) -> None:
            for rep in req.tasks:
                rep.node_id = other.node_id

        await liar.beat(mgr, clock, edit=forge)
        await other.beat(mgr, clock)
        assert mgr.state is ManagerState.NORMAL and mgr.adopted == 3
        assert tasks_of(mgr) == deployed
        for _ in range(10):
            await liar.beat(mgr, clock, edit=forge)
            await other.beat(mgr, clock)
            mgr.tick()
            clock.advance(0.1)
        assert {n.node_id: n.held() for n in nodes} == held and mgr.redeploys == 0 and running(mgr)


async def test_forged_heartbeat_over_grpc_is_refused_while_real_nodes_run(
    etcd: EtcdCluster, kv: MetaKV, root_path: str
) -> None:
    """The whole path: a coordinator (feeding the manager from its session watch) and in-process stream nodes."""
    async with coordinator(etcd, root_path) as proc, stub_for(proc.address) as stub:
        await wait_leader(proc)
        nodes = [StreamNode(kv, coordinators=[proc.address], vgroups=[v], discover_snode=True, heartbeat_ms=50,
                            groups=2, init_delay_s=0.05, ttl=10) for v in (1, 2)]
        try:
            for node in nodes:
                await node.start()
                created = await stub.CreateSnode(sp.CreateSnodeRequest(node_id=node.node_id))
                assert created.status.error_code == common_pb2.SUCCESS, created
            snode = created.snode
            forged = sp.HeartbeatRequest(node_id=nodes[-1].node_id + 1000, snode_id=snode.id, vgroup_ids=[1, 2],
                                         num_stream_groups=1)

            async def create() -> tuple[bool, Any]:
                resp = await stub.CreateStream(create_req("s1", source_vgroup_ids=[1, 2], num_calc_scan_plans=1))
                return resp.status.error_code == common_pb2.SUCCESS, resp.status

            await wait_for(create, "a live snode", timeout=20)
            reply = await stub.StreamHeartbeat(forged)  # right after the create: its deploys are pending
            assert reply.status.error_code == common_pb2.NOT_FOUND, reply
            assert not reply.deploys

            async def runs() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                info = show.streams[0]
                ok = info.state == sp.STREAM_RUNNING and all(t.status == RUNNING for t in info.tasks)
                return ok, summary_of(show)

            await wait_for(runs, "the stream RUNNING on the real nodes", timeout=30)
            show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
            assert {t.task.node_id for t in show.streams[0].tasks} == {n.node_id for n in nodes}
            lead = proc.coord.leadership
            assert lead is not None and lead.streams is not None and lead.streams.rejected_heartbeats >= 1
        finally:
            for node in nodes:
                await node.stop()
            await asyncio.sleep(0)


def summary_of(show: sp.ShowStreamsResponse) -> list[tuple[str, str]]:
    return [(s.stream.name, sp.StreamState.Name(s.state)) for s in show.streams]
