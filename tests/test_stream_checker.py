"""The stream checker compares what should run with what runs, and repairs.

A task handed to a node whose deploy reply was lost (or that the node lost) is redeployed at the first report of
the task's stream group without it, not left until task silence stops its whole stream for an error back-off.
Missed definition changes (create, drop, stop, start) are reconciled, each repair counted in ``checker_repairs``
and logged with what differed; streams notified while the checker reads are left alone (a read racing a
notification must not resurrect a dropped stream or drop a new one). An undeploy sent again is counted and logged
too, and no error in one periodic part stops the others.

The harness is tests/real_stream_nodes.py: the reference node's state machine under real sessions in real etcd.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from meta.kv import MetaKV
from proto import stream_pb2
from querycoord.stream.store import StreamStore
from tests.real_stream_nodes import (
    CONFIG,
    MANAGER_LOG,
    TWO_NODES,
    RealNode,
    create_req,
    create_streams,
    manager,
    real_nodes,
    round_,
    run_until,
    running,
    running_streams,
    summary,
    tasks_of,
)
from tests.streams import Clock

sp = stream_pb2


def held_streams(nodes: list[RealNode]) -> set[int]:
    return {k[0] for n in nodes for k in n.state.tasks}


async def test_lost_deploy_reply_is_repaired_long_before_task_silence(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES, groups=2) as nodes:
        sdefs = await create_streams(store, nodes, 4)
        mgr = await manager(store, kv, clock)
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        lost: list[tuple[int, sp.HeartbeatReply]] = []

        def lose_first_deploys(node: RealNode, reply: sp.HeartbeatReply) -> bool:
            if reply.deploys and not any(n == node.node_id for n, _ in lost):
                lost.append((node.node_id, reply))  # each node's first deploy reply times out
                return True
            return False

        began = clock()
        for _ in range(60):
            await round_(mgr, nodes, clock, lose_first_deploys)
            if running(mgr):
                break
        assert len(lost) == 2
        assert running(mgr), f"not repaired: {summary(mgr)}"
        assert clock() - began < CONFIG.task_silence / 5, "repaired by the checker, not by task silence"
        assert all(s.deploy_times == 1 and s.stop_error_code == 0 for s in mgr.show_streams().streams)
        lost_tasks = {(d.stream_id, t.task_id) for _, r in lost for d in r.deploys
                      for t in [*(x.task for x in d.readers), *(x.task for x in d.runners)]
                      + ([d.trigger.task] if d.HasField("trigger") else [])}
        now = tasks_of(mgr)
        assert {now[k][0].sid for k in lost_tasks} == {2}, "the lost tasks are redeployed with SID + 1"
        assert {n.node_id: n.held() for n in nodes} == {
            n.node_id: {(k[0], k[1], t.sid) for k, (t, node) in now.items() if node == n.node_id} for n in nodes
        }
        assert mgr.checker_repairs >= len({s for s, _ in lost_tasks})
        repairs = [r.getMessage() for r in caplog.records if "stream checker" in r.getMessage()]
        assert repairs and all("missing from that node's report of stream group" in m for m in repairs)
        assert {s.id for s in sdefs} == set(mgr.streams)


async def test_stream_that_should_run_but_has_nothing_planned_is_planned_again(
    store: StreamStore, kv: MetaKV
) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 2) as (nodes, sdefs, mgr):
        repairs = getattr(mgr, "checker_repairs", 0)
        # The leader's task map of one stream is lost (a bug): nothing would ever deploy it again.
        rt = mgr.streams[sdefs[0].id]
        mgr.shared.clear_tasks(rt)

        def replaced() -> bool:  # running on fresh task ids, the old instances undeployed as unknown
            held = {k[1] for n in nodes for k in n.held() if k[0] == sdefs[0].id}
            return running(mgr) and held == set(rt.tasks)

        await run_until(mgr, nodes, clock, replaced, what="the stream planned again")
        assert mgr.show_streams().streams[0].deploy_times == 2
        assert mgr.checker_repairs == repairs + 1 and mgr.check_tasks() == 0


async def test_refresh_repairs_missed_notifications(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 3) as (nodes, (dropped, stopped, kept), mgr):
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        # Committed, but the manager is never told (a lost notification).
        await store.drop_stream(dropped.id)
        await store.stop_stream(stopped.id)
        created = await store.create_stream(create_req("late"), [n.state.snode_id for n in nodes])
        await mgr.refresh()
        assert mgr.checker_repairs == 3
        said = " | ".join(r.getMessage() for r in caplog.records)
        assert "a missed drop" in said and "a missed create" in said and "persisted stopped by a user" in said
        await mgr.refresh()
        assert mgr.checker_repairs == 3, "nothing left to repair"
        await run_until(mgr, nodes, clock, lambda: running(mgr, [kept.id, created.id])
                        and held_streams(nodes) == {kept.id, created.id})
        states = {s.stream.id: s.state for s in mgr.show_streams().streams}
        assert states == {stopped.id: sp.STREAM_STOPPED_BY_USER, kept.id: sp.STREAM_RUNNING,
                          created.id: sp.STREAM_RUNNING}


class SlowListStore(StreamStore):
    """A store whose stream listing (a real etcd read) returns only once the test lets it: a slow read."""

    def __init__(self, store: StreamStore):
        super().__init__(store.kv)
        self.read_done = asyncio.Event()
        self.release = asyncio.Event()

    async def list_streams(self) -> list[stream_pb2.StreamDef]:
        streams = await super().list_streams()
        self.read_done.set()
        await self.release.wait()
        return streams


async def test_refresh_leaves_alone_streams_notified_during_its_read(store: StreamStore, kv: MetaKV) -> None:
    """A refresh whose read predates a create keeps the new stream (its tasks would otherwise be cleaned up as a
    dropped stream's), and one whose read predates a drop does not bring the dropped stream back."""
    clock = Clock()
    async with running_streams(store, kv, clock, 1) as (nodes, (old,), mgr):
        slow = SlowListStore(store)
        mgr.store = slow
        refresh = asyncio.create_task(mgr.refresh())
        await slow.read_done.wait()
        # While the refresh's read is in flight: a stream created and notified, another dropped and notified.
        new = await store.create_stream(create_req("new"), [n.state.snode_id for n in nodes])
        mgr.put_stream(new)
        mgr.remove_stream((await store.drop_stream(old.id)).id)
        slow.release.set()
        await refresh
        assert set(mgr.streams) == {new.id} and mgr.checker_repairs == 0
        mgr.store = store
        await run_until(mgr, nodes, clock, lambda: running(mgr) and held_streams(nodes) == {new.id})


async def test_lost_undeploy_is_sent_again_and_counted(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 2) as (nodes, (stopped, kept), mgr):
        # Undeploys that take effect at once are no repair.
        mgr.put_stream(await store.stop_stream(stopped.id))
        await run_until(mgr, nodes, clock, lambda: held_streams(nodes) == {kept.id}, what="stopped stream undeployed")
        assert mgr.checker_repairs == 0
        mgr.put_stream(await store.start_stream(stopped.id))
        await run_until(mgr, nodes, clock, lambda: running(mgr) and held_streams(nodes) == {stopped.id, kept.id})
        instances = {k for n in nodes for k in n.held() if k[0] == stopped.id}
        # Stopped again, and each node's reply carrying the undeploy is lost: the next report still shows the
        # tasks, so the undeploy goes again (and is counted once per instance).
        mgr.put_stream(await store.stop_stream(stopped.id))
        lost: list[int] = []

        def lose_first_undeploy(node: RealNode, reply: sp.HeartbeatReply) -> bool:
            if reply.undeploys and node.node_id not in lost:
                lost.append(node.node_id)
                return True
            return False

        for _ in range(5):
            await round_(mgr, nodes, clock, lose_first_undeploy)
        assert sorted(lost) == sorted(n.node_id for n in nodes)
        assert held_streams(nodes) == {kept.id}
        assert mgr.checker_repairs == len(instances) and mgr.resent_actions >= len(instances)
        assert running(mgr, [kept.id])


async def test_tick_parts_survive_an_error(
    store: StreamStore, kv: MetaKV, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 2) as (nodes, sdefs, mgr):
        def broken(*_: object) -> None:
            raise RuntimeError("bug in the health check")

        monkeypatch.setattr(mgr.liveness, "health_check", broken)
        mgr.shared.clear_tasks(mgr.streams[sdefs[1].id])
        mgr.shared.stop_by_error(mgr.streams[sdefs[0].id], 7, "test", clock() - 1000)  # retry due long ago
        caplog.set_level(logging.ERROR, MANAGER_LOG)
        for _ in range(3):
            clock.advance(CONFIG.health_interval)
            mgr.tick()
        assert mgr.errors == 3 and len([r for r in caplog.records if "health check failed" in r.getMessage()]) == 3
        # The checker and the retries still ran: both streams are queued for a plan, and deploy again.
        assert {sdefs[0].id, sdefs[1].id} <= mgr.shared.to_plan
        await run_until(mgr, nodes, clock, lambda: running(mgr))
