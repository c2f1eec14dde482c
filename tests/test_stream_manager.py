"""StreamManager's rules, driven by simulated stream nodes against a real etcd store.

What these prove: deploys go to the node leading each reader's vgroup and to
the node hosting each trigger's and runner's snode, exactly once; a trigger
starts only when its stream is whole and the start delay passed; stale
instances (unknown stream, stopped stream, old SID, wrong node) are
undeployed; a FAILED reader is redeployed alone with SID + 1 while a FAILED
trigger stops the stream and redeploys it after the back-off; silent tasks are
handled; and after a leader change WATCH adopts 50 running streams with
identical task ids and SIDs and zero redeploys, stops and redeploys an
incomplete stream, and ends by its timer even when no node reports.

The nodes are simulated in-process by tests/streams.py (the manager's rules are under test, not
the transport) and time is a fake monotonic clock, so the durations are exact
and the tests do not sleep.
"""

from __future__ import annotations

import pytest

from proto import stream_pb2
from querycoord.console import draw
from querycoord.stream.adoption import Adoption
from querycoord.stream.runtime import STOP_TASK_FAILED, STOP_TASK_LOST, ManagerState
from querycoord.stream.store import StreamStore
from tests.streams import (
    CONFIG,
    RUNNING,
    Clock,
    Node,
    create_req,
    new_manager,
    normal_manager,
    round_,
    run_until_running,
    running_manager,
    snapshot,
)

FAILED = stream_pb2.TASK_FAILED
READERS = (stream_pb2.TRIGGER_READER, stream_pb2.CALC_READER)


async def setup(store: StreamStore, n_streams: int) -> tuple[list[Node], list[stream_pb2.StreamDef]]:
    """Two snodes on nodes 11 and 12; vgroups 2, 3 led by node 11, vgroup 4 by node 13."""
    s1 = await store.create_snode(11)
    s2 = await store.create_snode(12)
    nodes = [Node(11, [2, 3], s1.id), Node(12, [], s2.id), Node(13, [4])]
    sdefs = [await store.create_stream(create_req(f"s{i}"), [s1.id, s2.id]) for i in range(n_streams)]
    return nodes, sdefs


# ----- NORMAL ---------------------------------------------------------------------------------------------------------
async def test_deploy_to_right_nodes_once_and_start_rule(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 2)
    mgr = await normal_manager(store, clock, nodes)
    by_snode = {n.snode_id: n.node_id for n in nodes if n.snode_id}
    by_vgroup = {vg: n.node_id for n in nodes for vg in n.vgroups}
    for _ in range(3):  # every task handed out within these rounds, and never again
        await round_(mgr, nodes)
    deployed = [t for n in nodes for t in n.deploys]
    assert len(deployed) == len({(t.stream_id, t.task_id) for t in deployed}) == 2 * (3 + 6 + 1 + 6)
    for t in deployed:
        want = by_vgroup[t.vgroup_id] if t.kind in READERS else by_snode[t.snode_id]
        assert t.node_id == want and t.sid == 1
    # All tasks are INIT or RUNNING, but the start delay has not passed: no start yet.
    assert not any(n.starts for n in nodes)
    assert {s.state for s in mgr.show_streams().streams} == {stream_pb2.STREAM_DEPLOYING}
    clock.advance(CONFIG.min_start_delay + 0.01)
    await round_(mgr, nodes)
    starts = [s for n in nodes for s in n.starts]
    assert sorted(s.stream_id for s in starts) == sorted(s.id for s in sdefs)
    await round_(mgr, nodes)
    await round_(mgr, nodes)
    assert len([s for n in nodes for s in n.starts]) == 2  # started once
    shown = mgr.show_streams()
    assert {s.state for s in shown.streams} == {stream_pb2.STREAM_RUNNING}
    assert all(s.deploy_times == 1 and len(s.tasks) == 16 for s in shown.streams)
    assert not any(n.undeploys for n in nodes)


async def test_start_waits_for_every_task(store: StreamStore) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 1)
    mgr = await normal_manager(store, clock, nodes)
    # Node 13 (vgroup 4's readers) never reports: the trigger must not start, whatever the delay.
    for _ in range(3):
        await round_(mgr, nodes[:2])
        clock.advance(CONFIG.min_start_delay + 0.01)
    assert not any(n.starts for n in nodes)
    await round_(mgr, nodes)  # node 13 gets its readers now: the delay counts from this deploy
    await round_(mgr, nodes)
    assert not any(n.starts for n in nodes)
    clock.advance(CONFIG.min_start_delay + 0.01)
    await round_(mgr, nodes)
    await round_(mgr, nodes)
    assert len([s for n in nodes for s in n.starts]) == 1


async def test_stale_instances_are_undeployed(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 2)
    mgr = await running_manager(store, clock, nodes)
    node = nodes[0]
    rep = next(r for r in node.tasks.values() if r.kind == stream_pb2.TRIGGER_READER)
    old_sid = stream_pb2.TaskStatusReport()
    old_sid.CopyFrom(rep)
    old_sid.sid = rep.sid + 7
    wrong_node = stream_pb2.TaskStatusReport()
    wrong_node.CopyFrom(rep)
    wrong_node.node_id = 13
    unknown = stream_pb2.TaskStatusReport(stream_id=999_999, task_id=5, sid=1, kind=stream_pb2.RUNNER, status=RUNNING)
    reply = await mgr.handle_heartbeat(stream_pb2.HeartbeatRequest(node_id=11, tasks=[old_sid, unknown]))
    by_stream = {u.stream_id: u for u in reply.undeploys}
    assert [t.sid for t in by_stream[rep.stream_id].tasks] == [old_sid.sid]
    assert by_stream[999_999].cleanup and not by_stream[rep.stream_id].cleanup
    reply = await mgr.handle_heartbeat(stream_pb2.HeartbeatRequest(node_id=13, vgroup_ids=[4], tasks=[wrong_node]))
    assert [t.task_id for u in reply.undeploys for t in u.tasks] == [rep.task_id]
    # The real instance is untouched.
    assert mgr.streams[rep.stream_id].tasks[rep.task_id].task.sid == rep.sid
    # A user-stopped stream: every task is undeployed with checkpoint as it reports.
    stopped = await store.stop_stream(sdefs[0].id)
    mgr.put_stream(stopped)
    await round_(mgr, nodes)
    assert not any(k[0] == sdefs[0].id for n in nodes for k in n.tasks)
    assert all(u.checkpoint for n in nodes for u in n.undeploys if u.stream_id == sdefs[0].id)
    assert any(k[0] == sdefs[1].id for n in nodes for k in n.tasks)
    states = {s.stream.id: s.state for s in mgr.show_streams().streams}
    assert states == {sdefs[0].id: stream_pb2.STREAM_STOPPED_BY_USER, sdefs[1].id: stream_pb2.STREAM_RUNNING}
    # Started again: deployed afresh.
    mgr.put_stream(await store.start_stream(sdefs[0].id))
    await run_until_running(mgr, nodes, clock)


async def test_failed_reader_is_redeployed_alone_with_next_sid(store: StreamStore) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 1)
    mgr = await running_manager(store, clock, nodes)
    before = snapshot(nodes)
    redeploys = mgr.redeploys
    node = nodes[2]  # leads vgroup 4
    rep = next(r for r in node.tasks.values() if r.kind == stream_pb2.CALC_READER)
    rep.status, rep.error_code, rep.error_message = FAILED, 42, "disk full"
    reply = await mgr.handle_heartbeat(node.request())
    node.apply(reply)
    assert [(t.task_id, t.sid) for u in reply.undeploys for t in u.tasks] == [(rep.task_id, 1)]
    assert not reply.deploys  # the redeploy comes with a later reply (the undeploy overrides)
    reply = await mgr.handle_heartbeat(node.request())
    node.apply(reply)
    got = [r.task for d in reply.deploys for r in d.readers]
    assert [(t.task_id, t.sid, t.vgroup_id) for t in got] == [(rep.task_id, 2, 4)]
    assert not reply.deploys[0].runners and not reply.deploys[0].HasField("trigger")
    after = snapshot(nodes)
    changed = before ^ after
    assert {(c[1], c[2]) for c in changed} == {(rep.task_id, 1), (rep.task_id, 2)}
    await run_until_running(mgr, nodes, clock)
    assert mgr.redeploys == redeploys + 1 and mgr.show_streams().streams[0].deploy_times == 1


async def test_failed_trigger_stops_stream_and_redeploys_after_backoff(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 1)
    mgr = await running_manager(store, clock, nodes)
    first_ids = {k[1] for n in nodes for k in n.tasks}
    trig_node = next(n for n in nodes if any(r.kind == stream_pb2.TRIGGER for r in n.tasks.values()))
    trig = next(r for r in trig_node.tasks.values() if r.kind == stream_pb2.TRIGGER)
    trig.status, trig.error_message = FAILED, "crashed"  # error code 0: the stop still gets a non-zero code
    reply = await mgr.handle_heartbeat(trig_node.request())
    trig_node.apply(reply)
    assert [u.undeploy_all for u in reply.undeploys] == [True]
    info = mgr.show_streams().streams[0]
    assert info.state == stream_pb2.STREAM_STOPPED_BY_ERROR and info.stop_error_code == STOP_TASK_FAILED
    assert "crashed" in info.stop_reason and info.next_retry_ms > 0
    # Until the back-off passes: the other tasks are undeployed, nothing is deployed.
    for _ in range(3):
        await round_(mgr, nodes)
        mgr.tick()
        clock.advance(CONFIG.error_retry_delay / 4)
    assert snapshot(nodes) == set()
    assert all(t.stream_id != sdefs[0].id or t.task_id in first_ids for n in nodes for t in n.deploys)
    clock.advance(CONFIG.error_retry_delay)
    mgr.tick()
    await run_until_running(mgr, nodes, clock)
    new_ids = {k[1] for n in nodes for k in n.tasks}
    assert new_ids and not new_ids & first_ids  # a fresh deploy: new task ids from the allocator
    assert mgr.show_streams().streams[0].deploy_times == 2


async def test_error_backoff_grows_and_resets(store: StreamStore) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 1)
    mgr = await normal_manager(store, clock, nodes)
    rt = next(iter(mgr.streams.values()))
    delays = []
    rt.retries = 0
    for _ in range(12):
        mgr.shared.stop_by_error(rt, 7, "test", clock())
        assert rt.next_retry is not None
        delays.append(rt.next_retry - clock())
    assert delays == [CONFIG.error_retry_delay] * 10 + [CONFIG.max_retry_delay] * 2
    # A stream whose trigger ran reset_after before failing starts counting again.
    rt.stop_code, rt.next_retry = 0, None
    mgr.shared.to_plan.add(rt.sdef.id)
    await run_until_running(mgr, nodes, clock)
    clock.advance(CONFIG.reset_after)
    await round_(mgr, nodes)
    mgr.shared.stop_by_error(rt, 7, "test", clock())
    assert rt.retries == 1 and rt.next_retry == clock() + CONFIG.error_retry_delay


async def test_task_silence(store: StreamStore) -> None:
    """Tasks whose stream group their node no longer reports at all go silent (a node that loses a task but
    reports its group is the checker's case: tests/test_stream_checker.py)."""
    clock = Clock()
    nodes, sdefs = await setup(store, 2)
    assert sdefs[0].id % 2 != sdefs[1].id % 2
    mgr = await running_manager(store, clock, nodes)
    # Node 13 reports only stream 1's group from now on: stream 0's readers there go silent, redeployed with SID + 1.
    reader = next(k for k, r in nodes[2].tasks.items() if k[0] == sdefs[0].id and r.kind in READERS)
    nodes[2].groups, nodes[2].group = 2, sdefs[1].id % 2
    # The node of a runner of stream 1 reports only stream 0's group: the stream is stopped with TASK_LOST.
    runner_node = next(
        n for n in nodes if any(k[0] == sdefs[1].id and r.kind == stream_pb2.RUNNER for k, r in n.tasks.items())
    )
    runner_node.groups, runner_node.group = 2, sdefs[0].id % 2
    for _ in range(4):
        clock.advance(CONFIG.task_silence / 3)
        await round_(mgr, nodes)
        mgr.tick()
    info = {s.stream.id: s for s in mgr.show_streams().streams}
    assert info[sdefs[1].id].state == stream_pb2.STREAM_STOPPED_BY_ERROR
    assert info[sdefs[1].id].stop_error_code == STOP_TASK_LOST
    await round_(mgr, nodes)
    assert nodes[2].tasks[reader].sid == 2
    assert info[sdefs[0].id].deploy_times == 1


# ----- WATCH ----------------------------------------------------------------------------------------------------------
async def test_watch_adopts_50_running_streams_without_redeploy(store: StreamStore) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 50)
    await running_manager(store, clock, nodes)  # the old leader
    before = snapshot(nodes)
    assert len(before) == 50 * 16
    deploys_before = sum(len(n.deploys) for n in nodes)
    # The leader dies; a new one (same store, higher revision) takes over.
    mgr = await new_manager(store, clock, revision=200)
    assert mgr.state is ManagerState.WATCH
    mgr.set_live_nodes([n.node_id for n in nodes])
    replies = await round_(mgr, nodes)
    assert all(r.watching and not (r.deploys or r.undeploys or r.starts) for r in replies)
    assert mgr.state is ManagerState.NORMAL  # every live node reported: WATCH ended before its timer
    for _ in range(5):
        clock.advance(CONFIG.min_start_delay)
        await round_(mgr, nodes)
        mgr.tick()
    assert snapshot(nodes) == before
    assert sum(len(n.deploys) for n in nodes) == deploys_before and not any(n.undeploys for n in nodes)
    assert mgr.adopted == 50 and mgr.redeploys == 0
    shown = mgr.show_streams()
    assert {s.state for s in shown.streams} == {stream_pb2.STREAM_RUNNING}
    assert all(s.deploy_times == 0 for s in shown.streams)
    rows = {
        (r.task.stream_id, r.task.task_id, r.task.sid, r.task.deploy_id, r.task.task_idx, r.task.node_id)
        for s in shown.streams
        for r in s.tasks
    }
    assert rows == before
    # A late reply of the deposed leader is ignored by the nodes.
    stale = stream_pb2.HeartbeatReply(
        leader_revision=100,
        undeploys=[stream_pb2.StreamUndeploy(stream_id=shown.streams[0].stream.id, undeploy_all=True)],
    )
    nodes[0].apply(stale)
    assert snapshot(nodes) == before


async def test_watch_stops_and_redeploys_incomplete_stream(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 2)
    await running_manager(store, clock, nodes)  # the old leader
    lost_stream, kept_stream = sdefs[0].id, sdefs[1].id
    # One runner of stream 0 vanished with the old leader (its node lost it).
    holder = next(
        n for n in nodes if any(k[0] == lost_stream and r.kind == stream_pb2.RUNNER for k, r in n.tasks.items())
    )
    key = next(k for k, r in holder.tasks.items() if k[0] == lost_stream and r.kind == stream_pb2.RUNNER)
    del holder.tasks[key]
    kept_before = {s for s in snapshot(nodes) if s[0] == kept_stream}
    mgr = await new_manager(store, clock, revision=200)
    mgr.set_live_nodes([n.node_id for n in nodes])
    await round_(mgr, nodes)
    assert mgr.state is ManagerState.NORMAL
    info = {s.stream.id: s for s in mgr.show_streams().streams}
    assert info[lost_stream].state == stream_pb2.STREAM_STOPPED_BY_ERROR
    assert info[lost_stream].stop_error_code == STOP_TASK_LOST
    await round_(mgr, nodes)  # the incomplete stream's remaining tasks are undeployed
    assert not any(s[0] == lost_stream for s in snapshot(nodes))
    mgr.tick()
    await run_until_running(mgr, nodes, clock)
    assert {s for s in snapshot(nodes) if s[0] == kept_stream} == kept_before
    assert len([s for s in snapshot(nodes) if s[0] == lost_stream]) == 16
    assert mgr.adopted == 1


async def test_watch_ends_by_timer_without_heartbeats(store: StreamStore) -> None:
    clock = Clock()
    await setup(store, 3)
    mgr = await new_manager(store, clock)
    mgr.set_live_nodes([11, 12, 13])  # live, but none of them reports
    assert mgr.state is ManagerState.WATCH and mgr.show_streams().watching
    clock.advance(CONFIG.watch_timeout / 2)
    mgr.tick()
    assert mgr.state is ManagerState.WATCH
    clock.advance(CONFIG.watch_timeout / 2)
    mgr.tick()
    assert mgr.state is ManagerState.NORMAL
    shown = mgr.show_streams()
    assert not shown.watching
    assert {(s.state, s.stop_error_code) for s in shown.streams} == {
        (stream_pb2.STREAM_STOPPED_BY_ERROR, STOP_TASK_LOST)
    }


async def test_no_streams_starts_normal(store: StreamStore) -> None:
    clock = Clock()
    mgr = await new_manager(store, clock)
    assert mgr.state is ManagerState.NORMAL
    nodes = [Node(11, [2, 3], (await store.create_snode(11)).id), Node(13, [4])]
    mgr.set_live_nodes([11, 13])  # what the coordinator feeds from the stream node sessions
    await mgr.refresh()  # what the service does after CreateSnode: the snode is recorded for node 11
    await round_(mgr, nodes)  # the snode reports: now live
    sdef = await store.create_stream(create_req("late"), [nodes[0].snode_id])
    mgr.put_stream(sdef)  # after the create txn committed
    await run_until_running(mgr, nodes, clock)
    assert len(snapshot(nodes)) == 16


async def test_refresh_removes_dropped_stream_and_cleans_its_tasks(store: StreamStore) -> None:
    clock = Clock()
    nodes, sdefs = await setup(store, 2)
    mgr = await running_manager(store, clock, nodes)
    await store.drop_stream(sdefs[0].id)  # the drop notification is missed: the stream loop catches it
    await mgr.refresh()
    assert sdefs[0].id not in mgr.streams
    await round_(mgr, nodes)
    assert not any(s[0] == sdefs[0].id for s in snapshot(nodes))
    assert all(u.cleanup for n in nodes for u in n.undeploys if u.stream_id == sdefs[0].id)
    assert {s.state for s in mgr.show_streams().streams} == {stream_pb2.STREAM_RUNNING}


async def test_watch_error_falls_back_to_redeploying_everything(
    store: StreamStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    nodes, _ = await setup(store, 2)
    await running_manager(store, clock, nodes)  # the old leader
    before = snapshot(nodes)
    mgr = await new_manager(store, clock, revision=200)

    def broken(*_: object) -> bool:
        raise RuntimeError("bug in the completeness check")

    monkeypatch.setattr(Adoption, "complete", staticmethod(broken))
    mgr.set_live_nodes([n.node_id for n in nodes])
    await round_(mgr, nodes)
    assert mgr.state is ManagerState.NORMAL and mgr.adopted == 0
    await run_until_running(mgr, nodes, clock)
    after = snapshot(nodes)
    assert len(after) == len(before) and not {s[1] for s in after} & {s[1] for s in before}


def test_stream_config_scales_durations_not_counts() -> None:
    from querycoord.settings.config import StreamConfig

    base = StreamConfig()
    fast = base.scaled(0.1)
    assert fast.isolation == base.isolation * 0.1 and fast.watch_timeout == base.watch_timeout * 0.1
    assert fast.fast_retries == base.fast_retries and fast.health_slots == base.health_slots
    with pytest.raises(ValueError, match="positive"):
        base.scaled(0)


async def test_a_stream_whose_snode_is_down_says_what_it_waits_for(store: StreamStore) -> None:
    """Its trigger may run only on its main snode or that snode's replica: while neither is live it stays queued,
    and ShowStreams says why (``wait_reason``) instead of leaving an undeployed stream unexplained; it runs again
    once the snode's node is back."""
    snode = await store.create_snode(11)
    nodes = [Node(11, [], snode.id), Node(13, [2, 3, 4])]
    sdef = await store.create_stream(create_req("s0"), [snode.id])
    clock = Clock()
    mgr = await running_manager(store, clock, nodes)
    mgr.set_live_nodes([13])  # node 11's session is gone: it died
    assert mgr.node_lost(11)
    for _ in range(int((CONFIG.task_silence + CONFIG.error_retry_delay) / 0.1) + 20):
        await round_(mgr, nodes[1:])
        mgr.tick()
        clock.advance(0.1)
    show = mgr.show_streams()
    info = show.streams[0]
    assert info.state == stream_pb2.STREAM_UNDEPLOYED and info.plan_queued and not info.tasks, (
        stream_pb2.StreamState.Name(info.state), info.stop_reason, info.plan_queued, len(info.tasks))
    assert f"main snode {sdef.main_snode_id} is not live" in info.wait_reason, info.wait_reason
    text = draw.stream_activity(info, show, clock())
    assert text.startswith(f"waiting for a plan: no snode is available: main snode {sdef.main_snode_id}"), text
    mgr.set_live_nodes([11, 13])  # the snode's node is back
    await run_until_running(mgr, nodes, clock)
    assert mgr.show_streams().streams[0].wait_reason == ""
