"""Checkpoint rounds: the leader orders them through heartbeat replies, commits a consensus only when every task of
the stream holds it, abandons rounds that time out, keeps ids monotonic across a leader change, resumes redeployed
tasks from the consensus, and takes a final checkpoint on a stop.

Real parts: the reference stream node's state machine (``StreamNodeState``) under real stream-node sessions, the
leader's fenced store in the embedded etcd. Time is the manager's fake clock (the harness of
tests/real_stream_nodes.py), so "timed out" is exact and nothing sleeps for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from meta.errors import NotLeader
from meta.kv import MetaKV
from proto import stream_pb2
from querycoord.console import draw
from querycoord.stream.checkpoint_store import CheckpointStore, checkpoint_key
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import StreamStore
from tests.leader import LEADER_KEY
from tests.real_stream_nodes import CONFIG, RealNode, lose_runner_snode, manager, running, running_streams
from tests.streams import Clock, fenced_store

CKPT_CONFIG = dataclasses.replace(CONFIG, checkpoint_interval=1.0, checkpoint_timeout=2.0)


async def beat_all(mgr: StreamManager, nodes: list[RealNode], clock: Clock, rounds: int = 1) -> None:
    """``rounds`` times: every node beats, then the manager ticks (its checkpoint part too) and time moves 0.1 s."""
    for _ in range(rounds):
        for n in nodes:
            await n.beat(mgr, clock)
        mgr.tick()
        await mgr.checkpoint_tick()
        clock.advance(0.1)


async def final_checkpoint_while_beating(
    mgr: StreamManager, nodes: list[RealNode], clock: Clock, stream_id: int
) -> tuple[int, str]:
    """The stop's final checkpoint of ``stream_id``, every node beating meanwhile: its round is ordered and
    reported only through heartbeats."""

    async def heartbeats() -> None:
        while True:
            await beat_all(mgr, nodes, clock)
            await asyncio.sleep(0.01)

    beating = asyncio.create_task(heartbeats())
    try:
        return await mgr.final_checkpoint(stream_id)
    finally:
        beating.cancel()


def held(nodes: list[RealNode], stream_id: int) -> dict[int, int]:
    """task id -> the checkpoint the node holding it reports."""
    return {k[1]: t.checkpoint_id for n in nodes for k, t in n.state.tasks.items() if k[0] == stream_id}


async def persisted(kv: MetaKV, stream_id: int) -> int:
    cp = await CheckpointStore(kv).get(stream_id)
    return 0 if cp is None else cp.checkpoint_id


async def test_round_commits_once_every_task_holds_it(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), mgr):
        rt = mgr.streams[sdef.id]
        await beat_all(mgr, nodes, clock, rounds=12)  # past the interval: a round started, ordered, reported
        assert rt.checkpoint_id > 0
        # What the nodes hold: every task at least the consensus; etcd has exactly the consensus.
        assert min(held(nodes, sdef.id).values()) >= rt.checkpoint_id
        assert await persisted(kv, sdef.id) == rt.checkpoint_id
        info = mgr.show_streams().streams[0]
        assert info.checkpoint_id == rt.checkpoint_id and info.checkpoint_ms > 0
        assert {row.checkpoint_id >= rt.checkpoint_id for row in info.tasks} == {True}


async def test_refusing_node_blocks_the_commit_until_a_new_round_after_recovery(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), mgr):
        rt = mgr.streams[sdef.id]
        await beat_all(mgr, nodes, clock, rounds=12)
        first = rt.checkpoint_id
        assert first > 0
        refusing = nodes[1]
        refusing.state.set_checkpoint_fault("refuse")
        await beat_all(mgr, nodes, clock, rounds=12)  # a new round started and was ordered
        assert rt.round is not None
        stuck = rt.round.id
        assert stuck > first
        # The other node took it; the refusing one did not: no commit, in memory or in etcd.
        others = {k[1]: t.checkpoint_id for k, t in nodes[0].state.tasks.items() if k[0] == sdef.id}
        assert others and min(others.values()) >= stuck
        mine = {k[1]: t.checkpoint_id for k, t in refusing.state.tasks.items() if k[0] == sdef.id}
        assert mine and max(mine.values()) < stuck
        before = rt.checkpoint_id  # a round in flight when the fault came may have committed
        assert before < stuck and await persisted(kv, sdef.id) == before
        abandoned = mgr.checkpoints.abandoned
        await beat_all(mgr, nodes, clock, rounds=25)  # past checkpoint_timeout (2 s): abandoned
        assert mgr.checkpoints.abandoned > abandoned
        assert rt.checkpoint_id == before and await persisted(kv, sdef.id) == before
        refusing.state.set_checkpoint_fault("")
        await beat_all(mgr, nodes, clock, rounds=25)
        assert rt.checkpoint_id > stuck  # a later round, with a higher id, committed
        assert await persisted(kv, sdef.id) == rt.checkpoint_id
        assert min(held(nodes, sdef.id).values()) >= rt.checkpoint_id


async def test_slow_node_commits_late_but_within_the_timeout(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), mgr):
        nodes[0].state.set_checkpoint_fault("slow", 0.5)
        rt = mgr.streams[sdef.id]
        await beat_all(mgr, nodes, clock, rounds=20)
        assert rt.checkpoint_id > 0 and mgr.checkpoints.abandoned == 0
        assert min(held(nodes, sdef.id).values()) >= rt.checkpoint_id


async def test_ids_never_go_back_across_a_leader_change_mid_round(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), old):
        await beat_all(old, nodes, clock, rounds=12)
        assert old.streams[sdef.id].checkpoint_id > 0
        nodes[1].state.set_checkpoint_fault("refuse")
        await beat_all(old, nodes, clock, rounds=12)
        committed = old.streams[sdef.id].checkpoint_id
        in_flight = old.streams[sdef.id].round
        assert in_flight is not None and in_flight.id > committed
        # The leader is deposed mid-round (its fence key re-created), a new one takes over.
        await kv.remove(LEADER_KEY)
        new_store = await fenced_store(kv)
        new = await manager(new_store, kv, clock, revision=200, config=CKPT_CONFIG)
        assert new.streams[sdef.id].checkpoint_id == committed  # loaded from etcd
        # The deposed leader cannot commit anything any more.
        old.checkpoints.to_commit[sdef.id] = (in_flight.id, 1)
        with pytest.raises(NotLeader):
            await old.checkpoints.flush()
        nodes[1].state.set_checkpoint_fault("")
        for _ in range(40):
            await beat_all(new, nodes, clock)
            if new.streams[sdef.id].checkpoint_id > committed:
                break
        rt = new.streams[sdef.id]
        assert new.adopted == 1
        # The new leader's ids continue above every id the old one started, committed or not.
        assert rt.checkpoint_id > in_flight.id
        assert await persisted(kv, sdef.id) == rt.checkpoint_id
        assert min(held(nodes, sdef.id).values()) >= rt.checkpoint_id


async def test_redeployed_task_resumes_from_the_consensus(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    layout = [([], True), ([], True), ([], True), ([1, 2], False), ([3], False)]
    async with running_streams(store, kv, clock, 3, layout, config=CKPT_CONFIG) as (nodes, _, mgr):
        await beat_all(mgr, nodes, clock, rounds=12)
        lost, stream_id, alive = await lose_runner_snode(mgr, kv, nodes)
        consensus = mgr.streams[stream_id].checkpoint_id
        assert consensus > 0
        mgr.node_lost(lost.node_id)
        for _ in range(60):
            await beat_all(mgr, alive, clock)
            if running(mgr, [stream_id]):
                break
        rt = mgr.streams[stream_id]
        moved = [t for t in rt.tasks.values() if t.task.sid > 1]
        assert moved, "the lost node's runners were redeployed"
        for t in moved:
            node = next(n for n in alive if n.node_id == t.node_id)
            task = node.state.tasks[(stream_id, t.task.task_id)]
            assert task.info.sid == t.task.sid
            # It started from a consensus the leader had committed, never older than the one before the loss.
            assert task.resumed_from >= consensus
            assert (stream_id, t.task.task_id, t.task.sid, task.resumed_from) in node.state.resumes


async def test_stop_takes_a_final_checkpoint(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    config = dataclasses.replace(CKPT_CONFIG, checkpoint_interval=0.0)  # no periodic rounds: only the stop's
    async with running_streams(store, kv, clock, 1, config=config) as (nodes, (sdef,), mgr):
        await beat_all(mgr, nodes, clock, rounds=5)
        assert mgr.streams[sdef.id].checkpoint_id == 0
        consensus, note = await final_checkpoint_while_beating(mgr, nodes, clock, sdef.id)
        assert note == "" and consensus > 0
        assert await persisted(kv, sdef.id) == consensus
        assert min(held(nodes, sdef.id).values()) >= consensus


async def test_stop_without_final_checkpoint_says_why(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    config = dataclasses.replace(CKPT_CONFIG, checkpoint_interval=0.0, checkpoint_timeout=0.3)
    async with running_streams(store, kv, clock, 1, config=config) as (nodes, (sdef,), mgr):
        nodes[0].state.set_checkpoint_fault("refuse")
        consensus, note = await final_checkpoint_while_beating(mgr, nodes, clock, sdef.id)
        assert consensus == 0 and "not held by every task" in note
        assert await persisted(kv, sdef.id) == 0


async def test_drop_removes_the_checkpoint_record(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), mgr):
        await beat_all(mgr, nodes, clock, rounds=12)
        assert await persisted(kv, sdef.id) > 0
        await store.drop_stream(sdef.id)
        assert await CheckpointStore(kv).get(sdef.id) is None


async def test_a_new_leader_removes_the_checkpoint_record_of_a_dropped_stream(store: StreamStore, kv: MetaKV) -> None:
    """A drop racing a leader's commit can leave a record behind: the next leader's load removes it, and keeps the
    records of streams that exist."""
    clock = Clock()
    orphan = stream_pb2.StreamCheckpoint(stream_id=999, checkpoint_id=5, checkpoint_ms=1)
    await kv.save(checkpoint_key(999), orphan.SerializeToString())
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), mgr):
        assert await kv.get(checkpoint_key(999)) is None
        await beat_all(mgr, nodes, clock, rounds=12)
        committed = await persisted(kv, sdef.id)
        assert committed > 0
        await kv.save(checkpoint_key(999), orphan.SerializeToString())
        await mgr.checkpoints.load()  # what the next leadership's start does
        assert await kv.get(checkpoint_key(999)) is None
        assert await persisted(kv, sdef.id) == committed


@pytest.mark.parametrize("flag,value", [("--checkpoint-interval", "-1"), ("--checkpoint-interval", "nan"),
                                        ("--checkpoint-timeout", "0"), ("--checkpoint-timeout", "abc")])
def test_bad_checkpoint_options_are_refused(flag: str, value: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "querycoord.cli", "coord", "--etcd-endpoints", "127.0.0.1:1",
                           flag, value], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert flag in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_readme_checkpoint_line_is_what_stream_show_draws() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    now = 1_000_000.0
    info = stream_pb2.StreamStatusInfo(checkpoint_id=4, checkpoint_ms=int((now - 2.1) * 1000))
    assert f"  checkpoint: {draw.stream_checkpoint(info, now)}\n  TASK  KIND" in readme


async def test_a_task_handed_out_while_a_settled_round_waits_for_its_commit_resumes_from_that_round(
        store: StreamStore, kv: MetaKV) -> None:
    """Every task held round N, so it is queued for commit (written a tick later). A task redeployed meanwhile
    must resume from N, not from the older consensus: once N is committed, that task would hold less than it."""
    clock = Clock()
    async with running_streams(store, kv, clock, 1, config=CKPT_CONFIG) as (nodes, (sdef,), mgr):
        rt = mgr.streams[sdef.id]
        await mgr.checkpoints.start_rounds([rt], clock.now)
        assert rt.round is not None
        settled = rt.round.id
        for t in rt.tasks.values():
            t.checkpoint_id = settled  # what every instance's report says once it took the round
        mgr.checkpoints.settle([sdef.id])
        assert rt.round is None and rt.checkpoint_id < settled, "queued for commit, not written yet"
        runner = next(t for t in rt.tasks.values() if t.task.kind == stream_pb2.RUNNER)
        mgr.shared.redeploy_task(rt, runner, clock.now)
        reply = stream_pb2.HeartbeatReply()
        mgr.deploy.hand_out(runner.node_id or nodes[0].node_id, runner.task.snode_id, set(), clock.now, reply, set())
        if not reply.deploys:  # the runner's snode is on the other node
            mgr.deploy.hand_out(nodes[1].node_id, runner.task.snode_id, set(), clock.now, reply, set())
        assert [d.resume_checkpoint_id for d in reply.deploys] == [settled], reply
        assert runner.checkpoint_id == settled
