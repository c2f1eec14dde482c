"""A stream action is level-triggered: sent again in every reply until the node's report shows its effect.

A start or a runner update put in a reply can be lost (the node timed out, or planning raised and replaced the whole
reply); it is sent again, so a trigger never stays INIT, or on its old top runners, for want of one message. The
nodes are the reference stream node's state machine under real sessions (``tests.real_stream_nodes``).
"""

from __future__ import annotations

import random

from meta.idalloc import IdAllocator
from meta.kv import MetaKV
from proto import common_pb2
from querycoord.stream.plan import Slot, expected_counts, plan_stream, task_layout
from querycoord.stream.runtime import ManagerState
from querycoord.stream.store import TASK_ID_KEY, StreamStore
from tests.real_stream_nodes import (
    RUNNING,
    SNODES_APART,
    TWO_NODES,
    RealNode,
    create_req,
    create_streams,
    lose_runner_snode,
    manager,
    node_by_id,
    real_nodes,
    round_,
    run_until,
    running,
    running_streams,
    sp,
    summary,
    tasks_of,
)
from tests.streams import Clock


async def test_lost_start_is_sent_again_until_the_trigger_runs(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        (sdef,) = await create_streams(store, nodes, 1)
        mgr = await manager(store, kv, clock)
        lost: list[sp.HeartbeatReply] = []

        def lose_first_start(_: RealNode, reply: sp.HeartbeatReply) -> bool:
            if reply.starts and not lost:
                lost.append(reply)  # the node timed out: the reply never reached it
                return True
            return False

        for _ in range(30):
            await round_(mgr, nodes, clock, lose_first_start)
            if running(mgr):
                break
        assert lost, "the start was never sent"
        assert running(mgr), f"the trigger never started after its start was lost: {summary(mgr)}"
        trig = next(t for n in nodes for t in n.state.tasks.values() if t.is_trigger)
        assert trig.started and trig.status == RUNNING
        assert mgr.resent_actions >= 1 and mgr.show_streams().streams[0].deploy_times == 1
        assert sdef.id in mgr.streams


async def test_planning_error_does_not_lose_the_start_of_another_stream(store: StreamStore, kv: MetaKV) -> None:
    """Planning a new stream raises (its id allocator key is corrupt in etcd) on every heartbeat for a while. Before
    the fix the exception replaced the whole reply, and with it the start of a stream that was due: that stream
    then stayed DEPLOYING forever, even after planning worked again."""
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        (first,) = await create_streams(store, nodes, 1)
        # Reserve task ids exactly as needed, so planning the next stream must read the allocator key in etcd.
        store.task_ids = IdAllocator(store.kv, TASK_ID_KEY, block_size=1)
        mgr = await manager(store, kv, clock)
        rt = mgr.streams[first.id]
        await run_until(mgr, nodes, clock, lambda: bool(rt.tasks) and not rt.pending, what="first stream handed out")
        await kv.save(TASK_ID_KEY, "corrupt")
        second = await store.create_stream(create_req("second"), [n.state.snode_id for n in nodes])
        mgr.put_stream(second)
        for _ in range(15):
            replies = await round_(mgr, nodes, clock)
            assert all(r.status.error_code == common_pb2.SUCCESS for r in replies), replies
        assert running(mgr, [first.id]), f"the first stream did not start while planning failed: {summary(mgr)}"
        assert mgr.errors >= 1 and not mgr.streams[second.id].tasks
        await kv.save(TASK_ID_KEY, str(10**6))  # repaired: the second stream is planned on the next heartbeat
        await run_until(mgr, nodes, clock, lambda: running(mgr))


async def test_lost_runner_update_is_sent_again_until_the_trigger_reports_it(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 8, SNODES_APART, runner_deploys=3) as (nodes, _, mgr):
        lost_node, stream_id, alive = await lose_runner_snode(mgr, kv, nodes)
        assert mgr.node_lost(lost_node.node_id)
        rt = mgr.streams[stream_id]
        assert rt.runner_update
        lost: list[sp.HeartbeatReply] = []

        def lose_first_update(_: RealNode, reply: sp.HeartbeatReply) -> bool:
            if any(u.stream_id == stream_id for u in reply.runner_updates) and not lost:
                lost.append(reply)
                return True
            return False

        for _ in range(20):
            await round_(mgr, alive, clock, lose_first_update)
        assert lost, "no runner update was sent"
        trig = rt.trigger()
        assert trig is not None
        held = node_by_id(alive, trig.node_id).state.tasks[(stream_id, trig.task.task_id)]
        tops = sorted((t.task for t in rt.tasks.values() if t.task.kind == sp.RUNNER and t.task.top),
                      key=lambda task: task.deploy_id)
        want = [(task.task_id, task.sid) for task in tops]
        assert [(t.task_id, t.sid) for t in held.top_runners] == want, "the trigger feeds stale top runners"
        assert any(sid > 1 for _, sid in want)
        assert not rt.runner_update and mgr.resent_actions >= 1


async def test_runner_update_lost_before_a_leader_change_is_sent_by_the_next_leader(
    store: StreamStore, kv: MetaKV
) -> None:
    """The old leader moved runners and died before its update reached the trigger: the new leader adopts the
    stream as it runs and sees from the trigger's report that it feeds old top runners."""
    clock = Clock()
    async with running_streams(store, kv, clock, 8, SNODES_APART, runner_deploys=3) as (nodes, _, old):
        lost_node, stream_id, alive = await lose_runner_snode(old, kv, nodes)
        old.node_lost(lost_node.node_id)
        def no_update_gets_out(_: RealNode, reply: sp.HeartbeatReply) -> bool:
            del reply.runner_updates[:]  # the old leader dies before any update reaches a trigger
            return False

        for _ in range(10):  # the moved runners are handed out and run
            await round_(old, alive, clock, no_update_gets_out)
        moved = {k: t for k, t in tasks_of(old).items() if k[0] == stream_id and t[0].kind == sp.RUNNER}
        assert any(task.sid == 2 for task, _ in moved.values())
        mgr = await manager(store, kv, clock, revision=200)
        await run_until(mgr, alive, clock, lambda: mgr.state is ManagerState.NORMAL and running(mgr, [stream_id]))
        rt = mgr.streams[stream_id]
        assert mgr.adopted >= 1 and rt.deploy_times == 0, "adopted as it ran"
        for _ in range(5):
            await round_(mgr, alive, clock)
        trig = rt.trigger()
        assert trig is not None
        held = node_by_id(alive, trig.node_id).state.tasks[(stream_id, trig.task.task_id)]
        want = sorted((task.deploy_id, task.task_id, task.sid) for task, _ in moved.values() if task.top)
        assert [(t.task_id, t.sid) for t in held.top_runners] == [(tid, sid) for _, tid, sid in want]
        assert not rt.runner_update


def test_plan_fills_exactly_the_task_layout() -> None:
    """``plan_stream`` and ``task_layout`` (what adoption restores and checks against) never disagree."""
    sdefs = [
        sp.StreamDef(id=1, name="a", source_vgroup_ids=[3, 1, 2], num_calc_scan_plans=3, num_calc_subplans=2,
                     runner_deploys=2, main_snode_id=1),
        sp.StreamDef(id=2, name="b", source_vgroup_ids=[5, 4], trigger_vgroup_id=4, num_calc_scan_plans=2,
                     num_calc_subplans=1, runner_deploys=3, main_snode_id=1),
        sp.StreamDef(id=3, name="c", source_vgroup_ids=[7], runner_deploys=1, main_snode_id=1),
    ]
    for sdef in sdefs:
        ids = iter(range(1, 1000))
        plan = plan_stream(sdef, None, {1, 2}, {1: 2}, lambda n, ids=ids: [next(ids) for _ in range(n)],
                           random.Random(1))
        layout = task_layout(sdef)
        slots = {(p.kind, p.deploy_id, p.task_idx): Slot(p.vgroup_id, p.scan_plan_idx, p.top) for p in plan.tasks()}
        assert slots == layout and len(plan.tasks()) == len(layout) == expected_counts(sdef).total
