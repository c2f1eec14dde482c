"""StreamMgmt end to end: a real coordinator (its gRPC server in this process) and stream nodes as real processes.

The nodes find the coordinator through its querycoord session and their snode
through what CreateSnode persisted; everything goes through the gRPC stub.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import common_pb2, stream_pb2
from querycoord.serving.process import CoordinatorProcess
from querycoord.settings.config import CoordConfig, StreamConfig, scaled_config
from querycoord.stream.store import StreamStore
from tests.stream_client import stub_for, wait_for

sp = stream_pb2
FAST_STREAMS = StreamConfig(watch_timeout=1.0, task_silence=5.0, min_start_delay=0.2, error_retry_delay=0.5,
                            max_retry_delay=2.0, reset_after=5.0)


def coord_config(etcd: EtcdCluster, root: str) -> CoordConfig:
    return scaled_config(etcd=etcd.config(), root=root, stream=FAST_STREAMS)


@contextlib.asynccontextmanager
async def coordinator(etcd: EtcdCluster, root: str) -> AsyncIterator[CoordinatorProcess]:
    proc = CoordinatorProcess(coord_config(etcd, root))
    await proc.start()
    try:
        yield proc
    finally:
        await proc.stop()


async def wait_leader(proc: CoordinatorProcess, timeout: float = 30.0) -> None:
    await asyncio.wait_for(proc.coord.became_leader.wait(), timeout)


def stream_request(name: str, **kw: Any) -> sp.CreateStreamRequest:
    fields: dict[str, Any] = dict(name=name, source_db="db", source_vgroup_ids=[1, 2], num_calc_scan_plans=1,
                                  num_calc_subplans=2, runner_deploys=2)
    fields.update(kw)
    return sp.CreateStreamRequest(**fields)


class NodeProcs:
    """Stream nodes as real processes (``python -m querycoord.nodes.streamnode``)."""

    def __init__(self, etcd: EtcdCluster, root: str, env: dict[str, str], tmp: Path):
        self.etcd, self.root, self.env, self.tmp = etcd, root, env, tmp
        self.procs: list[asyncio.subprocess.Process] = []
        self.logs: list[Path] = []

    async def spawn(self, vgroups: str) -> int:
        log = self.tmp / f"node{len(self.procs)}.log"
        args = ["-m", "querycoord.nodes.streamnode", "--etcd-endpoints", ",".join(self.etcd.endpoints),
                "--root", self.root, "--vgroups", vgroups, "--snode", "--heartbeat-ms", "100", "--groups", "2",
                "--init-delay-ms", "100", "--ttl", "10"]
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE, stderr=err, env=self.env)
        self.procs.append(proc)
        self.logs.append(log)
        assert proc.stdout is not None
        try:
            ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        except (TimeoutError, json.JSONDecodeError):
            raise AssertionError(f"stream node did not start:\n{self.tail()}") from None
        assert ready["event"] == "ready"
        return int(ready["node_id"])

    def tail(self, lines: int = 30) -> str:
        return "\n".join(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                         for log in self.logs)

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.terminate()
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), 15)
            except TimeoutError:
                p.kill()
                await p.wait()


async def test_create_stream_runs_on_real_stream_nodes_and_errors_have_statuses(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    nodes = NodeProcs(etcd, root_path, subprocess_env, tmp_path)
    async with coordinator(etcd, root_path) as proc, stub_for(proc.address) as stub:
        await wait_leader(proc)
        try:
            # No snode yet: a clear refusal, and nothing is persisted.
            resp = await stub.CreateStream(stream_request("s1"))
            assert resp.status.error_code == common_pb2.NO_AVAILABLE_NODE, resp
            assert "no snode is available" in resp.status.reason
            assert await StreamStore(kv).list_streams() == []

            node_a = await nodes.spawn("1")
            node_b = await nodes.spawn("2")
            for node_id in (node_a, node_b):
                created = await stub.CreateSnode(sp.CreateSnodeRequest(node_id=node_id))
                assert created.status.error_code == common_pb2.SUCCESS, created
                assert created.snode.node_id == node_id
            again = await stub.CreateSnode(sp.CreateSnodeRequest(node_id=node_a))
            assert again.status.error_code == common_pb2.CONFLICT and "already hosts" in again.status.reason

            # The nodes pick up their snodes from etcd and heartbeat them: then a stream can be created.
            async def snodes_live() -> tuple[bool, Any]:
                lead = proc.coord.leadership
                heard = set(lead.streams.snodes) if lead and lead.streams else set()
                return len(heard) == 2, heard

            await wait_for(snodes_live, "both snodes heartbeating", timeout=20)
            resp = await stub.CreateStream(stream_request("s1"))
            assert resp.status.error_code == common_pb2.SUCCESS, resp
            sdef = resp.stream
            assert sdef.id > 0 and sdef.main_snode_id > 0 and not sdef.user_stopped
            assert [s.id for s in await StreamStore(kv).list_streams()] == [sdef.id], "persisted in etcd"

            dup = await stub.CreateStream(stream_request("s1"))
            assert dup.status.error_code == common_pb2.CONFLICT and "already exists" in dup.status.reason
            same = await stub.CreateStream(stream_request("s1", if_not_exists=True))
            assert same.status.error_code == common_pb2.SUCCESS and same.stream.id == sdef.id
            bad = await stub.CreateStream(stream_request("1-bad name"))
            assert bad.status.error_code == common_pb2.ILLEGAL_ARGUMENT, bad

            # Deployed to the real nodes, trigger started: RUNNING with every task RUNNING.
            async def running() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                assert show.status.error_code == common_pb2.SUCCESS, show
                info = show.streams[0] if show.streams else None
                ok = (info is not None and info.state == sp.STREAM_RUNNING and len(info.tasks) > 0
                      and all(t.status == sp.TASK_RUNNING for t in info.tasks))
                return ok, show

            try:
                show = await wait_for(running, "the stream RUNNING", timeout=30)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{nodes.tail()}") from None
            info = show.streams[0]
            kinds = sorted(sp.TaskKind.Name(t.task.kind) for t in info.tasks)
            # 2 trigger readers (one per vgroup), 2 calc readers (1 scan plan x 2 vgroups), 1 trigger,
            # 2 runner deploys x 2 subplans.
            assert kinds == sorted(["TRIGGER"] + ["TRIGGER_READER"] * 2 + ["CALC_READER"] * 2 + ["RUNNER"] * 4)
            readers = {t.task.vgroup_id: t.task.node_id for t in info.tasks if t.task.kind == sp.TRIGGER_READER}
            assert readers == {1: node_a, 2: node_b}, "readers run on the node leading their vgroup"
            assert {s.node_id for s in show.snodes} == {node_a, node_b}

            # Stop, stop again (a conflict), start, drop; unknown names are NOT_FOUND.
            ref = sp.StreamRef(name="s1")
            stopped = await stub.StopStream(sp.StopStreamRequest(stream=ref))
            assert stopped.status.error_code == common_pb2.SUCCESS and stopped.stream.user_stopped
            twice = await stub.StopStream(sp.StopStreamRequest(stream=ref))
            assert twice.status.error_code == common_pb2.CONFLICT and "already stopped" in twice.status.reason

            async def stopped_by_user() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(streams=[ref], with_tasks=True))
                return show.streams[0].state == sp.STREAM_STOPPED_BY_USER and not show.streams[0].tasks, show

            await wait_for(stopped_by_user, "the stream stopped by the user")
            started = await stub.StartStream(sp.StartStreamRequest(stream=sp.StreamRef(stream_id=sdef.id)))
            assert started.status.error_code == common_pb2.SUCCESS and not started.stream.user_stopped
            await wait_for(running, "the stream RUNNING again", timeout=30)

            missing = await stub.StopStream(sp.StopStreamRequest(stream=sp.StreamRef(name="nope")))
            assert missing.status.error_code == common_pb2.NOT_FOUND, missing
            dropped = await stub.DropStream(sp.DropStreamRequest(stream=ref))
            assert dropped.status.error_code == common_pb2.SUCCESS and dropped.stream.user_dropped
            assert (await stub.DropStream(sp.DropStreamRequest(stream=ref))).status.error_code == common_pb2.NOT_FOUND
            quiet = await stub.DropStream(sp.DropStreamRequest(stream=ref, if_exists=True))
            assert quiet.status.error_code == common_pb2.SUCCESS
            show = await stub.ShowStreams(sp.ShowStreamsRequest())
            assert list(show.streams) == [] and await StreamStore(kv).list_streams() == []

            # Snodes: drop one (no streams left to move), an unknown one is NOT_FOUND.
            snode = next(s for s in show.snodes if s.node_id == node_b)
            gone = await stub.DropSnode(sp.DropSnodeRequest(snode_id=snode.id))
            assert gone.status.error_code == common_pb2.SUCCESS and gone.moved_streams == 0, gone
            unknown = await stub.DropSnode(sp.DropSnodeRequest(snode_id=snode.id))
            assert unknown.status.error_code == common_pb2.NOT_FOUND, unknown
        finally:
            await nodes.stop()


async def test_standby_refuses_writes_and_heartbeats_and_shows_streams_from_etcd(
    etcd: EtcdCluster, kv: MetaKV, root_path: str
) -> None:
    async with coordinator(etcd, root_path) as leader, stub_for(leader.address) as lstub:
        await wait_leader(leader)
        async with coordinator(etcd, root_path) as standby, stub_for(standby.address) as sstub:
            await asyncio.sleep(0.3)
            assert not standby.coord.is_leader
            # A stream through the leader; the test plays the stream node whose heartbeat makes the snode live
            # (with a real stream node session: the leader hears no node without one).
            async with Session(kv, "streamnode", "stream-node", ttl=10) as session:
                node_id = session.server_id
                snode = (await lstub.CreateSnode(sp.CreateSnodeRequest(node_id=node_id))).snode
                hb_req = sp.HeartbeatRequest(node_id=node_id, snode_id=snode.id, num_stream_groups=1)

                async def heard() -> tuple[bool, Any]:
                    hb = await lstub.StreamHeartbeat(hb_req)
                    return hb.status.error_code == common_pb2.SUCCESS and hb.leader_revision > 0, hb

                await wait_for(heard, "the leader hearing the node's session", timeout=10)
                created = await lstub.CreateStream(stream_request("s1"))
                assert created.status.error_code == common_pb2.SUCCESS, created

            for call in (sstub.CreateStream(stream_request("s2")),
                         sstub.StreamHeartbeat(sp.HeartbeatRequest(node_id=node_id, snode_id=snode.id)),
                         sstub.StopStream(sp.StopStreamRequest(stream=sp.StreamRef(name="s1"))),
                         sstub.CreateSnode(sp.CreateSnodeRequest(node_id=778))):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert f"the leader is at {leader.address}" in (err.value.details() or "")
            assert [s.name for s in await StreamStore(kv).list_streams()] == ["s1"], "the standby wrote nothing"

            show = await sstub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
            assert show.status.error_code == common_pb2.SUCCESS and leader.address in show.status.reason
            assert [s.stream.name for s in show.streams] == ["s1"] and not show.streams[0].tasks
            assert [s.id for s in show.snodes] == [snode.id]
