"""Guards and the start option, as processes: ``snode drop`` refused while a stream depends on the snode (nothing
written), forced (the stream moves and runs on the other snode), ``stream start --ignore-untreated`` (the nodes'
tasks skip what was written while it was stopped; without it they resume), all kept by the next leader."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from querycoord.stream.store import StreamStore, check_ring
from tests.spawn import Processes, Spawned, spawn_snode_host
from tests.stream_client import stream_keys, wait_for
from tests.test_stream_cli import Cli


async def _held(node: Spawned, stream_id: int) -> list[dict[str, Any]]:
    """The tasks of ``stream_id`` the node itself holds (its ``tasks`` control command)."""
    return [t for t in (await node.command("tasks"))["tasks"] if t["stream_id"] == stream_id]


async def test_snode_drop_guard_force_and_start_ignore_untreated(
    etcd: EtcdCluster, kv: MetaKV, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    async with Processes(etcd, root_path, tmp_path) as p:
        leader = await p.coordinator("--stream-scale", "0.1", name="coord-a")
        await leader.wait_event("leader", timeout=30)
        standby = await p.coordinator("--stream-scale", "0.1", name="coord-b")
        cli = Cli(subprocess_env, leader.address)
        nodes = [p.keep(await spawn_snode_host(etcd, root_path, tmp_path, vg, name=f"sn-{vg}")) for vg in "12"]
        snode_of: dict[int, int] = {}
        for node in nodes:
            m = re.search(r"created snode (\d+)", await cli.ok("snode", "create", str(node.node_id)))
            assert m
            snode_of[node.node_id] = int(m.group(1))

        async def snodes_live() -> tuple[bool, Any]:
            records = await cli.json("snode", "show")
            return sum(r["live"] for r in records) == 2, records

        await wait_for(snodes_live, "both snodes live", timeout=30)
        out = await cli.ok("stream", "create", "s1", "--vgroups", "1,2", "--runner-deploys", "1")
        m = re.search(r"\(id (\d+)\).*main snode (\d+)", out)
        assert m, out
        stream_id, main = int(m.group(1)), int(m.group(2))
        other = next(s for s in snode_of.values() if s != main)
        node_of = {s: n for n, s in snode_of.items()}

        async def running(c: Cli) -> tuple[bool, Any]:
            rec = (await c.json("stream", "show", "s1"))["streams"][0]
            return rec["state"] == "running", rec

        await wait_for(lambda: running(cli), "s1 running", timeout=30)

        # Unforced drop of the stream's main snode: CONFLICT naming the stream, nothing written.
        store = StreamStore(kv)
        before = await stream_keys(kv)
        await cli.refused("snode", "drop", str(main), fragment="1 stream depends on it (s1)")
        assert await stream_keys(kv) == before

        # Start with --ignore-untreated: every task the nodes hold skips what was written while s1 was stopped.
        assert "stopped stream s1" in await cli.ok("stream", "stop", "s1")
        stopped = await store.get_stream(stream_id)
        assert stopped.user_stopped and stopped.stop_ms > 0
        out = await cli.ok("stream", "start", "s1", "--ignore-untreated")
        assert "skip what was written while it was stopped" in out, out
        started = await store.get_stream(stream_id)
        assert started.start_from_ms >= stopped.stop_ms > 0
        await wait_for(lambda: running(cli), "s1 running again", timeout=30)

        async def held_skip(wanted: int) -> tuple[bool, Any]:
            held = [t for n in nodes for t in await _held(n, stream_id)]
            trigger_started = any(t["kind"] == "TRIGGER" for t in held)
            return trigger_started and held and all(t["skip_until_ms"] == wanted for t in held), held

        await wait_for(lambda: held_skip(started.start_from_ms), "the nodes' tasks skip until the start", timeout=30)

        # Without the flag the tasks resume where they were (nothing skipped), and the persisted mark is cleared.
        await cli.ok("stream", "stop", "s1")
        assert "resume where they were" in await cli.ok("stream", "start", "s1")
        assert (await store.get_stream(stream_id)).start_from_ms == 0
        await wait_for(lambda: running(cli), "s1 running after a plain start", timeout=30)
        await wait_for(lambda: held_skip(0), "the nodes' tasks resume (skip nothing)", timeout=30)

        # Forced: the stream moves to the other snode and runs there; the dropped snode's node holds none of it.
        out = await cli.ok("snode", "drop", str(main), "--force")
        assert f"1 stream moved to snode {other}, its tasks" in out, out

        async def moved() -> tuple[bool, Any]:
            rec = (await cli.json("stream", "show", "s1"))["streams"][0]
            placed = {t["snode_id"] for t in rec["tasks"] if t["kind"] in ("trigger", "runner")}
            return rec["state"] == "running" and rec["main_snode_id"] == other and placed == {other}, rec

        await wait_for(moved, "s1 running on the remaining snode", timeout=60)

        async def dropped_node_clean() -> tuple[bool, Any]:
            held = await _held(next(n for n in nodes if n.node_id == node_of[main]), stream_id)
            return not [t for t in held if t["kind"] in ("TRIGGER", "RUNNER")], held

        await wait_for(dropped_node_clean, "no trigger or runner of s1 left on the dropped snode's node", timeout=30)
        snodes = await store.list_snodes()
        assert [s.id for s in snodes] == [other] and check_ring(snodes) == []

        # A new leader keeps it all: s1 on the remaining snode, and its drop refused there too.
        await leader.kill()
        await standby.wait_event("leader", timeout=60)
        cli = Cli(subprocess_env, standby.address)
        await wait_for(moved, "s1 running on the remaining snode under the new leader", timeout=60)
        await cli.refused("snode", "drop", str(other), fragment="1 stream depends on it (s1)")
        assert [s.id for s in await store.list_snodes()] == [other]
