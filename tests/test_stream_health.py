"""StreamManager's health check: slots, snode loss, vgroup loss and moves, and node_lost().

Same harness as ``test_stream_manager`` (tests/streams.py: simulated stream nodes, a real etcd
store, a fake clock), with scaled durations: a health check every 0.3 s over
10 slots (each snode and vgroup checked every 3 s), isolation 3 s, streams on
a lost vgroup stopped 15 s after it was declared lost. The layout keeps snodes
and vgroups on different nodes so that losing one never loses the other:
snodes on nodes 11, 12 and 14; vgroups 2 and 3 led by node 13, vgroup 4 by
node 15.
"""

from __future__ import annotations

import dataclasses

from proto import stream_pb2
from querycoord.stream.manager import StreamManager
from querycoord.stream.runtime import STOP_SNODE_LOST, STOP_VGROUP_LOST, ManagerState
from querycoord.stream.store import StreamStore
from tests.streams import (
    HEALTH_CONFIG,
    Clock,
    Node,
    create_req,
    new_manager,
    round_,
    run_until_running,
    running_manager,
    snapshot,
)

# A stopped stream stays stopped for the whole test.
CONFIG = dataclasses.replace(HEALTH_CONFIG, error_retry_delay=100.0, max_retry_delay=100.0, vgroup_lost_stop=15.0)
RUNNER, TRIGGER = stream_pb2.RUNNER, stream_pb2.TRIGGER
READERS = (stream_pb2.TRIGGER_READER, stream_pb2.CALC_READER)


async def setup(store: StreamStore, n_streams: int, **kw: object) -> tuple[list[Node], list[stream_pb2.StreamDef]]:
    snodes = [await store.create_snode(n) for n in (11, 12, 14)]
    ids = [s.id for s in snodes]
    nodes = [Node(11, [], ids[0]), Node(12, [], ids[1]), Node(14, [], ids[2]), Node(13, [2, 3]), Node(15, [4])]
    sdefs = [await store.create_stream(create_req(f"s{i}", **kw), ids) for i in range(n_streams)]
    return nodes, sdefs


def node_of(nodes: list[Node], node_id: int) -> Node:
    return next(n for n in nodes if n.node_id == node_id)


def trigger_snode(mgr: StreamManager, stream_id: int) -> int:
    trig = mgr.streams[stream_id].trigger()
    assert trig is not None
    return trig.task.snode_id


def runner_snodes(mgr: StreamManager, stream_id: int) -> set[int]:
    return {t.task.snode_id for t in mgr.streams[stream_id].tasks.values() if t.task.kind == RUNNER}


async def health_ticks(mgr: StreamManager, nodes: list[Node], clock: Clock, n: int) -> None:
    """n health checks (one per health_interval), the given nodes heartbeating before each."""
    for _ in range(n):
        clock.advance(CONFIG.health_interval)
        await round_(mgr, nodes)
        mgr.tick()


def states(mgr: StreamManager) -> dict[int, tuple[int, int]]:
    return {s.stream.id: (s.state, s.stop_error_code) for s in mgr.show_streams().streams}


# ----- slots ----------------------------------------------------------------------------------------------------------
async def test_health_check_slots(store: StreamStore) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 1)
    mgr = await running_manager(store, clock, nodes, CONFIG)
    slots = CONFIG.health_slots
    alive = [n for n in nodes if n.node_id != 15]  # vgroup 4's leader goes silent
    silent_since = clock()
    lost_at: list[tuple[float, int]] = []
    for _ in range(3 * slots):
        clock.advance(CONFIG.health_interval)
        await round_(mgr, alive)
        before = mgr.health_slot
        mgr.tick()
        assert mgr.health_slot == (before + 1) % slots  # one slot per health_interval
        mgr.tick()  # a second tick within the interval does not run the check again
        assert mgr.health_slot == (before + 1) % slots
        if 4 in mgr.lost_vgroups and not lost_at:
            lost_at.append((clock() - silent_since, mgr.health_slot))
    # Declared lost by the first check of its slot (4 % 10) once silent for the isolation, not before.
    assert len(lost_at) == 1
    silent, slot = lost_at[0]
    assert slot == 4 % slots
    assert CONFIG.isolation <= silent < CONFIG.isolation + slots * CONFIG.health_interval + 1e-6
    # The vgroups and snodes that kept reporting are never lost.
    assert set(mgr.lost_vgroups) == {4} and not mgr.lost_snodes


async def test_no_health_check_without_streams(store: StreamStore) -> None:
    clock = Clock()
    mgr = await new_manager(store, clock, config=CONFIG)
    await mgr.handle_heartbeat(stream_pb2.HeartbeatRequest(node_id=13, vgroup_ids=[4]))
    for _ in range(3 * CONFIG.health_slots):
        clock.advance(CONFIG.health_interval)
        mgr.tick()
    assert mgr.health_slot == 0 and not mgr.lost_vgroups


# ----- snode loss -----------------------------------------------------------------------------------------------------
async def snode_loss_setup(
    store: StreamStore, clock: Clock
) -> tuple[StreamManager, list[Node], int, list[int], list[int]]:
    """Streams running; returns the manager, nodes, the snode to lose, streams triggered there, streams with only
    runners there."""
    nodes, sdefs = await setup(store, 8)
    mgr = await running_manager(store, clock, nodes, CONFIG)
    lost = node_of(nodes, 12).snode_id
    triggered = [s.id for s in sdefs if trigger_snode(mgr, s.id) == lost]
    runners_only = [s.id for s in sdefs if trigger_snode(mgr, s.id) != lost and lost in runner_snodes(mgr, s.id)]
    assert triggered and runners_only, "the seeded placement must give both cases"
    return mgr, nodes, lost, triggered, runners_only


async def test_snode_lost_stops_triggered_streams_and_moves_runners(store: StreamStore) -> None:
    clock = Clock()
    mgr, nodes, lost, triggered, runners_only = await snode_loss_setup(store, clock)
    before = {sid: {t.task.task_id: t.task for t in mgr.streams[sid].tasks.values()} for sid in runners_only}
    alive = [n for n in nodes if n.node_id != 12]
    await health_ticks(mgr, alive, clock, 3 * CONFIG.health_slots)  # lost within isolation + a slot cycle
    assert lost in mgr.lost_snodes
    st = states(mgr)
    for sid in triggered:  # SNODE_LOST, not TASK_LOST: task silence leaves the silent snode's tasks to its handling
        assert st[sid] == (stream_pb2.STREAM_STOPPED_BY_ERROR, STOP_SNODE_LOST)
    for sid in runners_only:
        assert st[sid] == (stream_pb2.STREAM_RUNNING, 0)
        now = {t.task.task_id: t.task for t in mgr.streams[sid].tasks.values()}
        assert set(now) == set(before[sid])  # same task ids
        for task_id, old in before[sid].items():
            new = now[task_id]
            if old.kind == RUNNER and old.snode_id == lost:
                assert new.sid == old.sid + 1 and new.snode_id != lost
                assert (new.deploy_id, new.task_idx, new.top) == (old.deploy_id, old.task_idx, old.top)
            else:
                assert new == old  # nothing else moved
        assert mgr.show_streams().streams[0].deploy_times == 1
    # Nothing of the running streams is placed on the lost snode any more.
    assert not any(lost in runner_snodes(mgr, sid) for sid in runners_only)
    # The lost node comes back with its old instances: every one is undeployed as stale (old SID or stopped stream).
    back = node_of(nodes, 12)
    await round_(mgr, [*alive, back])
    await run_until_running(mgr, [*alive, back], clock, set(runners_only))
    for (stream_id, task_id), r in back.tasks.items():
        t = mgr.streams[stream_id].tasks.get(task_id)
        assert t is not None and t.task.sid == r.sid and t.node_id == 12


async def test_runner_update_reaches_trigger_after_runner_redeploy(store: StreamStore) -> None:
    clock = Clock()
    mgr, nodes, _, _, runners_only = await snode_loss_setup(store, clock)
    alive = [n for n in nodes if n.node_id != 12]
    # Log every reply in order: (sequence, node, reply).
    log: list[tuple[int, int, stream_pb2.HeartbeatReply]] = []
    for _ in range(3 * CONFIG.health_slots):
        clock.advance(CONFIG.health_interval)
        for reply, n in zip(await round_(mgr, alive), alive, strict=True):
            log.append((len(log), n.node_id, reply))
        mgr.tick()
    for sid in runners_only:
        rt = mgr.streams[sid]
        trig = rt.trigger()
        assert trig is not None and not rt.runner_update  # sent, and the flag cleared
        updates = [(i, node, u) for i, node, r in log for u in r.runner_updates if u.stream_id == sid]
        assert len(updates) == 1, "exactly one runner update per redeploy"
        seq, node, upd = updates[0]
        assert node == trig.node_id  # reached the trigger's node
        assert (upd.trigger.task_id, upd.trigger.sid) == (trig.task.task_id, trig.task.sid)
        tops = sorted(
            (t for t in rt.tasks.values() if t.task.kind == RUNNER and t.task.top), key=lambda t: t.task.deploy_id
        )
        assert [(t.task_id, t.sid, t.snode_id, t.node_id) for t in upd.top_runners] == [
            (t.task.task_id, t.task.sid, t.task.snode_id, t.node_id) for t in tops
        ]
        assert any(t.sid == 2 for t in upd.top_runners)
        # The moved runners were handed out in an earlier reply than the update.
        deploys = [i for i, _, r in log for d in r.deploys if d.stream_id == sid and d.runners]
        assert deploys and max(deploys) < seq
    # The moved runners run where the manager placed them: the streams keep running without a stop.
    assert {states(mgr)[sid] for sid in runners_only} == {(stream_pb2.STREAM_RUNNING, 0)}
    running = snapshot(alive)
    for sid in runners_only:
        for t in mgr.streams[sid].tasks.values():
            assert (sid, t.task.task_id, t.task.sid, t.task.deploy_id, t.task.task_idx, t.node_id) in running


async def test_runner_update_waits_for_the_runner_deploy(store: StreamStore) -> None:
    clock = Clock()
    mgr, nodes, _, _, runners_only = await snode_loss_setup(store, clock)
    sid = runners_only[0]
    assert mgr.node_lost(12)
    rt = mgr.streams[sid]
    assert rt.runner_update
    trig = rt.trigger()
    assert trig is not None
    trig_node = node_of(nodes, trig.node_id)
    # Only the trigger's node reports: the update waits while runners bound for other nodes are pending.
    pending_elsewhere = any(
        rt.tasks[i].task.kind == RUNNER and rt.tasks[i].task.snode_id != trig_node.snode_id for i in rt.pending
    )
    reply = await mgr.handle_heartbeat(trig_node.request())
    trig_node.apply(reply)
    assert not [u for u in reply.runner_updates if u.stream_id == sid]  # never with (or before) the deploy
    if pending_elsewhere:
        reply = await mgr.handle_heartbeat(trig_node.request())
        trig_node.apply(reply)
        assert not [u for u in reply.runner_updates if u.stream_id == sid] and rt.runner_update
    alive = [n for n in nodes if n.node_id != 12]
    replies = await round_(mgr, alive)
    replies += await round_(mgr, alive)
    assert len([u for r in replies for u in r.runner_updates if u.stream_id == sid]) == 1


# ----- vgroup loss and moves ------------------------------------------------------------------------------------------
async def test_vgroup_lost_stops_streams_after_delay(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 2)
    other = await store.create_stream(create_req("on23", source_vgroup_ids=[2, 3]), [nodes[0].snode_id])
    mgr = await running_manager(store, clock, nodes, CONFIG)
    alive = [n for n in nodes if n.node_id != 15]
    await health_ticks(mgr, alive, clock, 2 * CONFIG.health_slots)
    assert 4 in mgr.lost_vgroups
    since = mgr.lost_vgroups[4]
    # Lost, but not yet stopped: the readers there wait (task silence does not stop anything).
    assert {states(mgr)[s.id][0] for s in sdefs} <= {stream_pb2.STREAM_RUNNING, stream_pb2.STREAM_DEPLOYING}
    while clock() - since < CONFIG.vgroup_lost_stop - CONFIG.health_interval * CONFIG.health_slots:
        await health_ticks(mgr, alive, clock, 1)
        assert all(not mgr.streams[s.id].error_stopped for s in sdefs)
    await health_ticks(mgr, alive, clock, 2 * CONFIG.health_slots)
    st = states(mgr)
    assert {st[s.id] for s in sdefs} == {(stream_pb2.STREAM_STOPPED_BY_ERROR, STOP_VGROUP_LOST)}
    assert st[other.id] == (stream_pb2.STREAM_RUNNING, 0)  # no task on vgroup 4


async def test_vgroup_move_redeploys_readers_on_new_leader(store: StreamStore) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 2)
    mgr = await running_manager(store, clock, nodes, CONFIG)
    old_leader, new_leader = node_of(nodes, 15), node_of(nodes, 13)
    moved = {k: r.sid for k, r in old_leader.tasks.items()}
    assert moved and all(r.vgroup_id == 4 and r.kind in READERS for r in old_leader.tasks.values())
    # Leadership of vgroup 4 moves to node 13 (node 15 stays up, still reporting its old readers).
    old_leader.vgroups, new_leader.vgroups = [], [2, 3, 4]
    # Node 13 claims it before node 15 let go: refused, node 15 keeps it (two claimants never make readers flap).
    reply = await mgr.handle_heartbeat(new_leader.request())
    new_leader.apply(reply)
    assert not reply.deploys and mgr.vgroups[4].node_id == 15 and mgr.rejected_claims == 1
    # Node 15's heartbeat leaves vgroup 4 out: released, and node 13's next claim takes it.
    replies = await round_(mgr, [old_leader, new_leader])
    assert not replies[0].undeploys
    got = {(t.task.stream_id, t.task.task_id): t.task.sid for d in replies[1].deploys for t in d.readers}
    assert got == {k: sid + 1 for k, sid in moved.items()}  # same ids, SID + 1, on the new leader
    reply = await mgr.handle_heartbeat(old_leader.request())
    old_leader.apply(reply)
    undone = {(t.stream_id, t.task_id): t.sid for u in reply.undeploys for t in u.tasks}
    assert undone == moved  # the old instances, undeployed from the old node
    assert not old_leader.tasks
    await run_until_running(mgr, nodes, clock)
    for k, sid in moved.items():
        assert new_leader.tasks[k].sid == sid + 1 and mgr.streams[k[0]].tasks[k[1]].node_id == 13
    assert all(s.deploy_times == 1 for s in mgr.show_streams().streams)
    assert len(snapshot(nodes)) == 2 * 16


# ----- node_lost ------------------------------------------------------------------------------------------------------
async def test_node_lost_acts_at_once_and_is_damped(store: StreamStore) -> None:
    clock = Clock()
    mgr, nodes, lost, triggered, runners_only = await snode_loss_setup(store, clock)
    assert lost in mgr.live_snode_ids()
    assert mgr.node_lost(12)  # no silence waited for
    assert lost in mgr.lost_snodes and lost not in mgr.live_snode_ids()  # nothing new is placed there
    st = states(mgr)
    assert {st[s] for s in triggered} == {(stream_pb2.STREAM_STOPPED_BY_ERROR, STOP_SNODE_LOST)}
    assert all(mgr.streams[s].runner_update for s in runners_only)
    tasks = {s: dict(mgr.streams[s].tasks) for s in runners_only}
    sids = {s: {i: t.task.sid for i, t in tasks[s].items()} for s in runners_only}
    redeploys = mgr.redeploys
    # Damped: a second call within the isolation does nothing (no second SID bump, no second stop).
    clock.advance(CONFIG.isolation / 2)
    assert not mgr.node_lost(12)
    assert mgr.redeploys == redeploys
    assert {s: {i: t.task.sid for i, t in mgr.streams[s].tasks.items()} for s in runners_only} == sids
    # The health check does not handle the already-lost snode again either.
    alive = [n for n in nodes if n.node_id != 12]
    await health_ticks(mgr, alive, clock, 2 * CONFIG.health_slots)
    assert mgr.redeploys == redeploys
    assert {states(mgr)[s] for s in runners_only} == {(stream_pb2.STREAM_RUNNING, 0)}
    # Past the isolation it acts again (a new session that died again).
    assert mgr.node_lost(12)


async def test_node_lost_vgroups_then_stop(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 1)
    mgr = await running_manager(store, clock, nodes, CONFIG)
    assert mgr.node_lost(15)
    assert 4 in mgr.lost_vgroups and mgr.lost_vgroups[4] == clock()
    assert 15 not in (mgr.live_nodes or set())
    alive = [n for n in nodes if n.node_id != 15]
    while clock() - mgr.lost_vgroups[4] < CONFIG.vgroup_lost_stop + CONFIG.health_slots * CONFIG.health_interval:
        await health_ticks(mgr, alive, clock, 1)
        if mgr.streams[sdefs[0].id].error_stopped:
            break
    assert clock() - mgr.lost_vgroups[4] >= CONFIG.vgroup_lost_stop
    assert states(mgr)[sdefs[0].id] == (stream_pb2.STREAM_STOPPED_BY_ERROR, STOP_VGROUP_LOST)
    # The vgroup reported again (by a new leader): no longer lost.
    node_of(nodes, 13).vgroups = [2, 3, 4]
    await round_(mgr, alive)
    assert 4 not in mgr.lost_vgroups


async def test_node_lost_in_watch_is_handled_after_watch(store: StreamStore) -> None:
    clock = Clock()
    _, nodes, lost, triggered, runners_only = await snode_loss_setup(store, clock)
    # A new leader; node 12 dies while it watches.
    mgr = await new_manager(store, clock, revision=200, config=CONFIG)
    assert mgr.state is ManagerState.WATCH
    mgr.set_live_nodes([n.node_id for n in nodes])
    alive = [n for n in nodes if n.node_id != 12]
    await round_(mgr, [node_of(nodes, 12)])  # node 12 reports (its tasks are recorded), then its session ends
    assert mgr.node_lost(12) and not mgr.lost_snodes  # in WATCH: only marked silent, no action yet
    assert not mgr.node_lost(12)  # damped in WATCH too
    await round_(mgr, alive)  # every remaining live node reported: WATCH ends early, every stream adopted
    assert mgr.state is ManagerState.NORMAL and mgr.adopted == len(mgr.streams)
    # The first health check of the snode's slot declares it lost and handles it as usual.
    await health_ticks(mgr, alive, clock, CONFIG.health_slots)
    assert lost in mgr.lost_snodes
    st = states(mgr)
    assert {st[s] for s in triggered} == {(stream_pb2.STREAM_STOPPED_BY_ERROR, STOP_SNODE_LOST)}
    await run_until_running(mgr, alive, clock, set(runners_only))
    assert not any(lost in runner_snodes(mgr, s) for s in runners_only)
    assert all(mgr.streams[s].deploy_times == 0 for s in runners_only)  # adopted, then only runners moved
