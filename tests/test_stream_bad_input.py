"""Bad input a new user finds, against real processes: a stream node started with stdin on /dev/null, an snode
asked for on a node that is no live stream node, ``stream create --if-not-exists`` on an existing stream, and a
stream on vgroups that no node leads (accepted; it says what it waits for)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import stream_pb2 as sp
from querycoord.tooling.harness import STREAM_NODE, node_argv
from tests.spawn import Processes, spawn_snode_host
from tests.stream_client import stream_keys, stub_for, wait_for
from tests.test_stream_cli import Cli


async def _keys(kv: MetaKV) -> dict[str, bytes]:
    """Everything the stream store and the snode id allocator hold (what a refusal must leave as it was), but the
    checkpoints the leader commits on its own meanwhile."""
    keys = await stream_keys(kv)
    alloc = await kv.get("idalloc/snode")
    if alloc is not None:
        keys["idalloc/snode"] = alloc
    return keys


async def test_a_stream_node_with_stdin_on_dev_null_logs_no_error(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """nohup and systemd start a node with stdin on /dev/null: no control channel, and nothing in the log says
    otherwise (asyncio used to log an epoll refusal with a traceback)."""
    argv = node_argv(STREAM_NODE, etcd.endpoints, root_path, "--vgroups", "1", "--heartbeat-ms", "100")
    log = tmp_path / "streamnode.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=err, env=subprocess_env)
        try:
            assert proc.stdout is not None
            ready = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert b'"event": "ready"' in ready, (ready, log.read_text())

            async def heartbeating() -> tuple[bool, Any]:
                text = log.read_text()
                return "no coordinator answered" in text, text  # a few ticks ran, the control reader long started

            await wait_for(heartbeating, "the node's heartbeat loop running", timeout=30)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = log.read_text()
    for bad in ("Traceback", "ERROR", "Exception in callback"):
        assert bad not in text, text


async def test_snode_create_if_not_exists_and_vgroups_without_a_leader(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    async with Processes(etcd, root_path, tmp_path) as p:
        leader = await p.coordinator("--stream-scale", "0.1", name="coord")
        await leader.wait_event("leader", timeout=30)
        cli = Cli(subprocess_env, leader.address)
        node = p.keep(await spawn_snode_host(etcd, root_path, tmp_path, "1", name="sn"))
        query_node = await p.query_node(name="qn")

        # snode create on an unknown id, or on a query node's id: refused, and nothing is written.
        before = await _keys(kv)
        await cli.refused("snode", "create", "424242", fragment="no live stream node has this id")
        await cli.refused("snode", "create", str(query_node.node_id), fragment="it is a query node")
        assert await _keys(kv) == before
        assert "created snode" in await cli.ok("snode", "create", str(node.node_id))

        async def snode_live() -> tuple[bool, Any]:
            records = await cli.json("snode", "show")
            return [r["live"] for r in records] == [True], records

        await wait_for(snode_live, "the snode live", timeout=30)

        # --if-not-exists on an existing stream: says so, exit 0, the stream left as it is; through the RPC too.
        out = await cli.ok("stream", "create", "s1", "--vgroups", "1")
        assert out.startswith("created stream s1"), out
        stored = await _keys(kv)
        again = await cli.ok("stream", "create", "s1", "--vgroups", "1,2", "--if-not-exists")
        assert "exists, left as it is" in again and "created" not in again, again
        await cli.refused("stream", "create", "s1", "--vgroups", "1", fragment="already exists")
        async with stub_for(leader.address) as stub:
            resp = await stub.CreateStream(sp.CreateStreamRequest(name="s1", source_db="db", source_vgroup_ids=[3],
                                                                  num_calc_subplans=1, if_not_exists=True))
        assert resp.status.error_code == common_pb2.SUCCESS and resp.already_exists, resp
        assert "exists, left as it is" in resp.status.reason and list(resp.stream.source_vgroup_ids) == [1]
        assert await _keys(kv) == stored

        # A stream on a vgroup no node leads: accepted, and it says what it waits for until a node leads it.
        code, out, err = await cli.run("stream", "create", "s2", "--vgroups", "1,7")
        assert code == 0 and out.startswith("created stream s2"), (code, out, err)
        assert "note: waiting for a node to lead vgroup [7]" in err, err

        async def s2(wanted: str, *states: str) -> tuple[bool, Any]:
            rec = (await cli.json("stream", "show", "s2"))["streams"][0]
            return wanted in rec["wait_reason"] and rec["state"] in states and wanted in rec["activity"], rec

        await wait_for(lambda: s2("waiting for a node to lead vgroup [7]", "deploying"), "s2 waiting for vgroup 7")
        assert "lead vgroup [7]" in await cli.ok("stream", "show", "s2")
        assert (await node.command("lead 7"))["ok"]

        async def s2_running() -> tuple[bool, Any]:
            rec = (await cli.json("stream", "show", "s2"))["streams"][0]
            return rec["state"] == "running" and rec["wait_reason"] == "", rec

        await wait_for(s2_running, "s2 running once vgroup 7 is led", timeout=30)
        # The vgroup loses its leader later: the stream says so again (once the vgroup is declared lost).
        assert (await node.command("unlead 7"))["ok"]
        await wait_for(lambda: s2("waiting for a node to lead vgroup [7]", "running", "deploying"),
                       "s2 waiting for vgroup 7 again", timeout=30)
