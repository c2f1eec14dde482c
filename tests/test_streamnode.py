"""The reference stream node: its state machine directly, then the process against a scripted StreamMgmt double.

The double stands in for the COORDINATOR only (it answers heartbeats with a
scripted deploy and start); the node's session registers in the real etcd of
tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session, list_sessions, session_key
from proto import common_pb2, stream_pb2, stream_pb2_grpc
from querycoord.nodes.streamnode import HeartbeatClient, StreamNode
from querycoord.nodes.streamnode_state import INJECTED_TASK_ERROR, StreamNodeState
from querycoord.stream.store import snode_key

sp = stream_pb2
INIT, RUNNING, FAILED = sp.TASK_INIT, sp.TASK_RUNNING, sp.TASK_FAILED


def tid(stream: int, task: int, kind: int, sid: int = 1, **kw: Any) -> sp.TaskId:
    return sp.TaskId(stream_id=stream, task_id=task, sid=sid, kind=kind, **kw)


def deploy_reply(rev: int, stream: int, *, base: int = 100, sid: int = 1) -> sp.HeartbeatReply:
    """A full deploy of one stream: a trigger reader on vgroup 2, a trigger and one runner on snode 7."""
    reader = tid(stream, base + 1, sp.TRIGGER_READER, sid, vgroup_id=2)
    runner = tid(stream, base + 3, sp.RUNNER, sid, snode_id=7, top=True)
    trigger = tid(stream, base + 2, sp.TRIGGER, sid, snode_id=7)
    return sp.HeartbeatReply(leader_revision=rev, deploys=[sp.StreamDeploy(
        stream_id=stream, stream_name=f"s{stream}", readers=[sp.ReaderDeploy(task=reader, trigger_reader=True)],
        trigger=sp.TriggerDeploy(task=trigger, readers=[reader], top_runners=[runner]),
        runners=[sp.RunnerDeploy(task=runner)])])


def statuses(state: StreamNodeState) -> dict[int, int]:
    return {task_id: t.status for (_, task_id), t in state.tasks.items()}


# ----- the state machine ------------------------------------------------------
def test_deploy_init_then_running_and_trigger_waits_for_start() -> None:
    st = StreamNodeState(11, vgroups=[2], snode_id=7, groups=1, init_delay_s=0.5)
    out = st.apply_reply(deploy_reply(5, stream=1), now=10.0)
    assert out.accepted and sorted(k[1] for k in out.deployed) == [101, 102, 103]
    assert statuses(st) == {101: INIT, 102: INIT, 103: INIT}
    assert all(t.info.node_id == 11 for t in st.tasks.values()), "the node stamps its own id"
    assert st.tick(10.4) == [] and statuses(st)[101] == INIT, "still within the init delay"
    st.tick(10.5)
    assert statuses(st) == {101: RUNNING, 102: INIT, 103: RUNNING}, "the trigger waits for its start"
    # A start for another generation of the trigger is not this instance's: ignored.
    st.apply_reply(sp.HeartbeatReply(leader_revision=5, starts=[
        sp.StreamStart(stream_id=1, trigger=tid(1, 102, sp.TRIGGER, sid=9))]), now=11.0)
    st.tick(11.0)
    assert statuses(st)[102] == INIT
    out = st.apply_reply(sp.HeartbeatReply(leader_revision=5, starts=[
        sp.StreamStart(stream_id=1, trigger=tid(1, 102, sp.TRIGGER))]), now=11.0)
    assert out.started == [(1, 102)]
    st.tick(11.0)
    assert set(statuses(st).values()) == {RUNNING}
    trig = st.tasks[(1, 102)]
    assert [t.task_id for t in trig.top_runners] == [103] and [t.task_id for t in trig.readers] == [101]
    # A repeated deploy (same SIDs) changes nothing: tasks stay RUNNING.
    out = st.apply_reply(deploy_reply(5, stream=1), now=12.0)
    assert out.deployed == [] and set(statuses(st).values()) == {RUNNING}
    # A redeploy of the reader (SID 2) replaces the instance, which starts over in INIT.
    redeploy = sp.HeartbeatReply(leader_revision=5, deploys=[sp.StreamDeploy(stream_id=1, readers=[
        sp.ReaderDeploy(task=tid(1, 101, sp.TRIGGER_READER, sid=2, vgroup_id=2))])])
    assert st.apply_reply(redeploy, now=12.0).deployed == [(1, 101)]
    assert st.tasks[(1, 101)].info.sid == 2 and st.tasks[(1, 101)].status == INIT
    # A runner update replaces the trigger's top runners.
    new_top = tid(1, 103, sp.RUNNER, sid=2, snode_id=8, top=True)
    out = st.apply_reply(sp.HeartbeatReply(leader_revision=5, runner_updates=[
        sp.RunnerUpdate(stream_id=1, trigger=tid(1, 102, sp.TRIGGER), top_runners=[new_top])]), now=12.0)
    assert out.runner_updates == [(1, 102)] and trig.top_runners[0].sid == 2


def test_reports_carry_the_whole_identity_and_the_triggers_top_runners() -> None:
    """What a new leader needs to adopt a task exactly as deployed, and to see a RunnerUpdate took effect."""
    st = StreamNodeState(11, vgroups=[2], snode_id=7, groups=1, init_delay_s=0)
    reply = deploy_reply(5, stream=1)
    reply.deploys[0].readers.append(sp.ReaderDeploy(task=tid(1, 104, sp.CALC_READER, vgroup_id=2, task_idx=3,
                                                              scan_plan_idx=2)))
    st.apply_reply(reply, now=0)
    reports = {r.task_id: r for r in st.build_heartbeat().tasks}
    calc, runner, trigger = reports[104], reports[103], reports[102]
    assert (calc.scan_plan_idx, calc.task_idx, calc.HasField("scan_plan_idx")) == (2, 3, True)
    assert runner.top and runner.HasField("top") and not calc.top
    assert [(t.task_id, t.sid) for t in trigger.top_runners] == [(103, 1)] and not runner.top_runners
    st.apply_reply(sp.HeartbeatReply(leader_revision=5, runner_updates=[sp.RunnerUpdate(
        stream_id=1, trigger=tid(1, 102, sp.TRIGGER), top_runners=[tid(1, 103, sp.RUNNER, sid=2, top=True)])]), now=1)
    (trigger,) = [r for r in st.build_heartbeat().tasks if r.task_id == 102]
    assert [(t.task_id, t.sid) for t in trigger.top_runners] == [(103, 2)]


def test_undeploy_matches_sid_all_and_overrides_other_actions() -> None:
    st = StreamNodeState(11, groups=1, init_delay_s=0)
    st.apply_reply(deploy_reply(5, stream=1), now=0)
    st.apply_reply(deploy_reply(5, stream=2, base=200), now=0)
    # An undeploy of an older generation never removes the current instance.
    old = sp.StreamUndeploy(stream_id=1, tasks=[tid(1, 101, sp.TRIGGER_READER, sid=0)])
    assert st.apply_reply(sp.HeartbeatReply(leader_revision=5, undeploys=[old]), now=1).undeployed == []
    one = sp.StreamUndeploy(stream_id=1, tasks=[tid(1, 101, sp.TRIGGER_READER)], checkpoint=True)
    out = st.apply_reply(sp.HeartbeatReply(leader_revision=5, undeploys=[one]), now=1)
    assert out.undeployed == [(1, 101)] and out.checkpointed_streams == [1] and out.cleaned_streams == []
    assert (1, 101) not in st.tasks and (1, 102) in st.tasks
    # undeploy_all with cleanup (a dropped stream), in the same reply as a deploy and start of that stream:
    # the undeploy wins, and the other stream is untouched.
    reply = deploy_reply(5, stream=1)
    reply.undeploys.append(sp.StreamUndeploy(stream_id=1, undeploy_all=True, cleanup=True))
    reply.starts.append(sp.StreamStart(stream_id=1, trigger=tid(1, 102, sp.TRIGGER)))
    out = st.apply_reply(reply, now=2)
    assert sorted(out.undeployed) == [(1, 102), (1, 103)] and out.cleaned_streams == [1]
    assert out.deployed == [] and out.started == []
    assert sorted(st.tasks) == [(2, 201), (2, 202), (2, 203)]


def test_reply_from_a_stale_leader_is_ignored() -> None:
    st = StreamNodeState(11, groups=1, init_delay_s=0)
    assert st.apply_reply(sp.HeartbeatReply(leader_revision=9, watching=True), now=0).accepted
    assert st.max_leader_revision == 9
    stale = deploy_reply(8, stream=1)
    stale.undeploys.append(sp.StreamUndeploy(stream_id=2, undeploy_all=True))
    out = st.apply_reply(stale, now=0)
    assert not out.accepted and "8 < 9" in out.reason and st.tasks == {} and st.stale_replies == 1
    assert st.build_heartbeat().seen_leader_revision == 9
    # The same revision (the same leader) and a newer one are applied.
    assert st.apply_reply(deploy_reply(9, stream=1), now=0).accepted and len(st.tasks) == 3
    assert st.apply_reply(sp.HeartbeatReply(leader_revision=12), now=0).accepted and st.max_leader_revision == 12
    # An error status (e.g. NOT_LEADER) applies nothing and does not move the revision.
    err = deploy_reply(50, stream=3)
    err.status.CopyFrom(common_pb2.Status(error_code=common_pb2.NOT_LEADER, reason="not the leader"))
    assert not st.apply_reply(err, now=0).accepted and st.max_leader_revision == 12


def test_failing_a_task_reports_failed_with_a_nonzero_code() -> None:
    st = StreamNodeState(11, groups=1, init_delay_s=0)
    st.apply_reply(deploy_reply(1, stream=1), now=0)
    st.tick(0)
    assert st.fail_task(103, "disk full") == (1, 103)
    st.tick(1)
    (report,) = [r for r in st.build_heartbeat().tasks if r.task_id == 103]
    assert (report.status, report.error_code, report.error_message) == (FAILED, INJECTED_TASK_ERROR, "disk full")
    assert report.error_code != 0 and report.node_id == 11 and report.sid == 1 and report.kind == sp.RUNNER
    with pytest.raises(KeyError):
        st.fail_task(999)
    with pytest.raises(ValueError):
        st.fail_task(101, error_code=0)


def test_heartbeats_report_one_stream_group_per_tick() -> None:
    st = StreamNodeState(11, vgroups=[3, 1], snode_id=7, groups=3, init_delay_s=0)
    for stream in (1, 2, 4, 6):
        st.apply_reply(deploy_reply(1, stream=stream, base=stream * 100), now=0)
    beats = [st.build_heartbeat() for _ in range(4)]
    assert [b.stream_group for b in beats] == [0, 1, 2, 0]
    assert [sorted({r.stream_id for r in b.tasks}) for b in beats] == [[6], [1, 4], [2], [6]]
    b = beats[1]
    assert (b.node_id, b.snode_id, list(b.vgroup_ids), b.num_stream_groups) == (11, 7, [1, 3], 3)
    assert len(b.tasks) == 6 and {r.status for r in b.tasks} == {INIT}
    # Vgroup leadership moves: the next heartbeats say so; readers stay until the leader undeploys them.
    assert st.drop_vgroup(2) == [(1, 101), (2, 201), (4, 401), (6, 601)]
    st.lead_vgroup(5)
    assert list(st.build_heartbeat().vgroup_ids) == [1, 3, 5] and (1, 101) in st.tasks


# ----- transport (in process) -------------------------------------------------
class ScriptedStreamMgmt(stream_pb2_grpc.StreamMgmtServicer):
    """A coordinator double: records heartbeats; deploys stream 3 to the first node that asks, starts its trigger
    once every other task reports RUNNING. A non-empty ``leader_at`` makes it a standby answering NOT_LEADER."""

    def __init__(self, revision: int = 7, *, leader_at: str = "") -> None:
        self.revision = revision
        self.leader_at = leader_at
        self.heartbeats: list[sp.HeartbeatRequest] = []
        self.deployed_to = 0

    async def StreamHeartbeat(self, request: sp.HeartbeatRequest, context: Any) -> sp.HeartbeatReply:
        if self.leader_at:
            return sp.HeartbeatReply(status=common_pb2.Status(
                error_code=common_pb2.NOT_LEADER, reason=f"not the leader; the leader is at {self.leader_at}"))
        self.heartbeats.append(request)
        if not self.deployed_to:
            self.deployed_to = request.node_id
            return deploy_reply(self.revision, stream=3)
        reply = sp.HeartbeatReply(leader_revision=self.revision)
        others = [t for t in request.tasks if t.stream_id == 3 and t.kind != sp.TRIGGER]
        if others and all(t.status == RUNNING for t in others):
            reply.starts.append(sp.StreamStart(stream_id=3, trigger=tid(3, 102, sp.TRIGGER)))
        return reply


async def serve(servicer: ScriptedStreamMgmt) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    stream_pb2_grpc.add_StreamMgmtServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_client_follows_the_named_leader_and_skips_dead_addresses() -> None:
    leader = ScriptedStreamMgmt()
    srv_leader, leader_addr = await serve(leader)
    srv_standby, standby_addr = await serve(ScriptedStreamMgmt(leader_at=leader_addr))
    client = HeartbeatClient(["127.0.0.1:1", standby_addr], timeout=2.0)
    try:
        reply = await client.heartbeat(sp.HeartbeatRequest(node_id=4))
        assert reply is not None and reply.leader_revision == 7 and len(leader.heartbeats) == 1
        assert client.current == leader_addr, "the next heartbeat goes straight to the leader"
    finally:
        await client.close()
        await srv_leader.stop(None)
        await srv_standby.stop(None)


async def test_in_process_node_registers_session_and_reaches_running(kv: MetaKV) -> None:
    coord = ScriptedStreamMgmt()
    server, address = await serve(coord)
    node = StreamNode(kv, coordinators=[address], vgroups=[2], snode_id=7, heartbeat_ms=50, groups=5,
                      init_delay_s=0.1, ttl=10)
    try:
        await node.start()
        info = (await list_sessions(kv, "streamnode")).sessions[node.node_id]
        assert info.extra == {"vgroups": [2]}
        for _ in range(100):
            all_running = node.state.tasks and {t.status for t in node.state.tasks.values()} == {RUNNING}
            if all_running and len({h.stream_group for h in coord.heartbeats}) == 5:
                break
            await asyncio.sleep(0.05)
        assert {t.status for t in node.state.tasks.values()} == {RUNNING}, node.state.snapshot()
        assert {h.stream_group for h in coord.heartbeats} == {0, 1, 2, 3, 4}
        assert node.control("mute")["ok"]
        await asyncio.sleep(0.15)
        seen = len(coord.heartbeats)
        await asyncio.sleep(0.3)
        assert len(coord.heartbeats) == seen, "a muted node sends no heartbeat"
        assert node.control("fail 103 boom")["task"] == [3, 103]
        assert node.control("nope")["ok"] is False
    finally:
        await node.stop()
        await server.stop(None)
    assert await kv.get(session_key("streamnode", node.node_id)) is None


async def test_node_finds_coordinator_sessions_and_its_snode_in_etcd(kv: MetaKV) -> None:
    """Without --coordinator the node heartbeats to the live querycoord sessions; with --snode it takes the snode
    persisted for its node id (what CreateSnode writes)."""
    coord = ScriptedStreamMgmt()
    server, address = await serve(coord)
    coord_session = Session(kv, "querycoord", address, ttl=10)
    await coord_session.start()
    node = StreamNode(kv, discover_snode=True, heartbeat_ms=50, init_delay_s=0, ttl=10)
    try:
        await node.start()
        await kv.save(snode_key(4), sp.SnodeInfo(id=4, node_id=node.node_id).SerializeToString())
        await kv.save(snode_key(5), sp.SnodeInfo(id=5, node_id=node.node_id + 1000).SerializeToString())
        for _ in range(100):
            if coord.heartbeats and coord.heartbeats[-1].snode_id == 4:
                break
            await asyncio.sleep(0.05)
        assert coord.heartbeats and coord.heartbeats[-1].snode_id == 4
    finally:
        await node.stop()
        await coord_session.close()
        await server.stop(None)


# ----- the node as a process --------------------------------------------------
def log_tail(log: Path, lines: int = 40) -> str:
    """The end of a node's stderr, for assertion messages."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


async def read_json(proc: asyncio.subprocess.Process, log: Path, timeout: float = 30) -> dict[str, Any]:
    assert proc.stdout is not None
    try:
        return json.loads(await asyncio.wait_for(proc.stdout.readline(), timeout))
    except (TimeoutError, json.JSONDecodeError):
        raise AssertionError(f"no JSON line from the node; log:\n{log_tail(log)}") from None


async def test_process_heartbeats_reaches_running_and_sigterm_revokes_session(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    coord = ScriptedStreamMgmt(revision=7)
    server, address = await serve(coord)
    log = tmp_path / "node.log"
    args = ["-m", "querycoord.nodes.streamnode", "--etcd-endpoints", ",".join(etcd.endpoints), "--root", root_path,
            "--coordinator", address, "--vgroups", "2", "--snode-id", "7", "--heartbeat-ms", "50", "--groups", "5",
            "--init-delay-ms", "100", "--ttl", "60"]
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=err, env=subprocess_env)
    assert proc.stdin is not None
    try:
        ready = await read_json(proc, log)
        assert ready["event"] == "ready" and ready["pid"] == proc.pid and ready["vgroups"] == [2]
        node_id = ready["node_id"]
        assert node_id in (await list_sessions(kv, "streamnode")).sessions
        # The coordinator sees the deployed tasks reported RUNNING, trigger included (started by the double).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        running: set[int] = set()
        while loop.time() < deadline and running != {101, 102, 103}:
            running = {t.task_id for h in coord.heartbeats[-5:] for t in h.tasks
                       if t.stream_id == 3 and t.status == RUNNING}
            await asyncio.sleep(0.05)
        assert running == {101, 102, 103}, log_tail(log)
        hb = coord.heartbeats[-1]
        assert (hb.node_id, hb.snode_id, list(hb.vgroup_ids), hb.seen_leader_revision) == (node_id, 7, [2], 7)
        assert all(t.node_id == node_id for h in coord.heartbeats for t in h.tasks)
        # The control channel: vgroup leadership moves and the task table reads back.
        proc.stdin.write(b"lead 5\ntasks\n")
        await proc.stdin.drain()
        assert (await read_json(proc, log))["ok"]
        table = await read_json(proc, log)
        assert table["vgroups"] == [2, 5] and {t["status"] for t in table["tasks"]} == {"RUNNING"}
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0, log_tail(log)
        # TTL is 60 s: the key being gone now means the lease was revoked, not expired.
        assert await kv.get(session_key("streamnode", node_id)) is None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await server.stop(None)


async def test_process_crash_command_exits_137_without_revoking(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "node.log"
    args = ["-m", "querycoord.nodes.streamnode", "--etcd-endpoints", ",".join(etcd.endpoints), "--root", root_path,
            "--coordinator", "127.0.0.1:1", "--heartbeat-ms", "100", "--ttl", "60"]
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=err, env=subprocess_env)
    assert proc.stdin is not None
    try:
        node_id = (await read_json(proc, log))["node_id"]
        proc.stdin.write(b"crash\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.wait(), 20) == 137, log_tail(log)
        assert await kv.get(session_key("streamnode", node_id)) is not None, "a crash leaves the lease to expire"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
