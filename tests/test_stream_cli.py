"""``querycoord stream`` and ``querycoord snode`` run as real processes against a coordinator and stream nodes,
plus the drawing of ``stream show`` (what the manager does about a stream) without a cluster."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meta.ops.etcd_server import EtcdCluster
from proto import stream_pb2 as sp
from querycoord.console import draw
from querycoord.console.actions import parse_vgroups
from tests.spawn import Processes, spawn_snode_host
from tests.stream_client import wait_for


class Cli:
    """``python -m querycoord.cli --address A ...`` as an asyncio subprocess (the test's loop keeps running)."""

    def __init__(self, env: dict[str, str], address: str):
        self.env, self.address = env, address

    async def run(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "querycoord.cli", "--address", self.address, "--timeout", "10", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=self.env)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def ok(self, *args: str) -> str:
        code, out, err = await self.run(*args)
        assert code == 0, f"{args}: exit {code}\nstdout:\n{out}\nstderr:\n{err}"
        assert "Traceback" not in err, err
        return out

    async def json(self, *args: str) -> Any:
        return json.loads(await self.ok(*args, "-o", "json"))

    async def refused(self, *args: str, fragment: str, code: int = 1) -> str:
        """One ``error: ...`` line naming ``fragment``, exit ``code``, nothing on stdout, no traceback."""
        got, out, err = await self.run(*args)
        assert got == code, f"{args}: exit {got}\nstdout:\n{out}\nstderr:\n{err}"
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert fragment in err, (fragment, err)
        assert not out and "Traceback" not in err, (out, err)
        return err


async def test_stream_and_snode_commands_against_a_coordinator_and_stream_nodes(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    async with Processes(etcd, root_path, tmp_path) as p:
        leader = await p.coordinator("--stream-scale", "0.1", name="coord-a")
        await leader.wait_event("leader", timeout=30)
        standby = await p.coordinator("--stream-scale", "0.1", name="coord-b")
        cli = Cli(subprocess_env, leader.address)

        assert "no snodes" in await cli.ok("snode", "show")
        assert "no streams" in await cli.ok("stream", "show")
        await cli.refused("stream", "create", "s1", "--vgroups", "1,2", fragment="no snode is available")

        node_a = p.keep(await spawn_snode_host(etcd, root_path, tmp_path, "1", name="sn-a"))
        node_b = p.keep(await spawn_snode_host(etcd, root_path, tmp_path, "2", name="sn-b"))
        snode_of: dict[int, int] = {}  # node id -> snode id
        for node in (node_a, node_b):
            out = await cli.ok("snode", "create", str(node.node_id))
            m = re.search(rf"created snode (\d+) on stream node {node.node_id}", out)
            assert m, out
            snode_of[node.node_id] = int(m.group(1))
        await cli.refused("snode", "create", str(node_a.node_id), fragment="already hosts")
        await cli.refused("snode", "create", "0", fragment="node_id", code=2)

        async def snodes_live() -> tuple[bool, Any]:
            records = await cli.json("snode", "show")
            return sum(1 for r in records if r["live"]) == 2, records

        records = await wait_for(snodes_live, "both snodes live", timeout=30)
        assert {r["node_id"]: r["id"] for r in records} == snode_of
        assert {r["id"]: r["replica_id"] for r in records} == {snode_of[node_a.node_id]: snode_of[node_b.node_id],
                                                               snode_of[node_b.node_id]: snode_of[node_a.node_id]}
        table = (await cli.ok("snode", "show")).splitlines()
        assert table[0].split() == ["SNODE", "NODE", "REPLICA", "LIVE", "MAIN", "OF", "STATE"], table
        assert sorted(line.split()[:2] for line in table[2:]) == sorted(
            [str(s), str(n)] for n, s in snode_of.items()), table

        # Create with the defaults: readers on vgroups 1 and 2, one scan plan, 3 runner deploys of 2.
        out = await cli.ok("stream", "create", "s1", "--vgroups", "1,2")
        m = re.search(r"created stream s1 \(id (\d+)\) on vgroups 1,2 of db: main snode (\d+)", out)
        assert m, out
        stream_id, main_snode = int(m.group(1)), int(m.group(2))
        await cli.refused("stream", "create", "s1", "--vgroups", "1,2", fragment="already exists")
        assert f"(id {stream_id})" in await cli.ok("stream", "create", "s1", "--vgroups", "1,2", "--if-not-exists")
        await cli.refused("stream", "create", "s2", "--vgroups", "1,x", fragment="--vgroups", code=2)
        await cli.refused("stream", "create", "s2", "--vgroups", "2,2", fragment="listed twice", code=2)
        await cli.refused("stream", "create", "s2", fragment="--vgroups", code=2)

        async def state_of(ref: str, wanted: str) -> tuple[bool, Any]:
            doc = await cli.json("stream", "show", ref)
            s = doc["streams"][0]
            running = bool(s["tasks"]) and all(t["state"] == "RUNNING" for t in s["tasks"])
            return s["state"] == wanted and (running if wanted == "running" else not s["tasks"]), doc

        doc = await wait_for(lambda: state_of("s1", "running"), "s1 running", timeout=30)
        assert not doc["watching"] and not doc["answered_by_standby"]
        s1 = doc["streams"][0]
        assert (s1["id"], s1["name"], s1["main_snode_id"], s1["source_vgroup_ids"]) == (
            stream_id, "s1", main_snode, [1, 2])
        tasks = s1["tasks"]
        assert Counter(t["kind"] for t in tasks) == {"trigger reader": 2, "calc reader": 2, "trigger": 1, "runner": 6}
        node_of_snode = {s: n for n, s in snode_of.items()}
        for t in tasks:
            assert t["sid"] >= 1 and t["state"] == "RUNNING" and not t["pending"], t
            if t["kind"].endswith("reader"):
                # A reader runs on the node leading its vgroup, and has no snode.
                assert t["snode_id"] == 0 and t["node_id"] == {1: node_a, 2: node_b}[t["vgroup_id"]].node_id, t
            else:
                assert t["snode_id"] in node_of_snode and t["node_id"] == node_of_snode[t["snode_id"]], t
        trigger = next(t for t in tasks if t["kind"] == "trigger")
        assert trigger["snode_id"] == main_snode
        assert "nothing to do" in s1["activity"]

        # The table: the stream's line, what the manager does, then one row per task with node, snode, SID, state.
        out = await cli.ok("stream", "show", "s1")
        lines = out.splitlines()
        assert lines[0].startswith(f"stream s1 (id {stream_id}): running  source db vgroups 1,2  main snode "
                                   f"{main_snode}"), out
        assert lines[1].strip().startswith("manager: running: 11 tasks RUNNING"), out
        assert lines[2].strip().startswith("progress: processed up to "), out
        # The consensus checkpoint: none yet, or committed (ids from the checkpoint allocator), with its age.
        assert re.fullmatch(r"checkpoint: (none yet|#\d+ committed [\d.]+s ago)(; round #\d+ in flight for "
                            r"[\d.]+s)?", lines[3].strip()), out
        assert lines[4].split() == ["TASK", "KIND", "NODE", "VGROUP", "SNODE", "DEPLOY", "SID", "STATE", "HEARD",
                                    "PROCESSED", "LAG"], out
        rows = lines[6:]
        assert len(rows) == 11 and all("RUNNING" in r for r in rows), out
        trig_row = next(r for r in rows if re.match(rf"\s+#{trigger['task_id']}\s+trigger\s", r))
        assert trig_row.split()[2:5] == [str(trigger["node_id"]), "-", str(main_snode)], trig_row
        # By id works as by name; --summary is the one-row table `make demo` prints; the standby follows the leader.
        assert (await cli.ok("stream", "show", str(stream_id))).splitlines()[0] == lines[0]
        summary = (await cli.ok("stream", "show", "--summary")).splitlines()
        assert summary[2].split()[:4] == ["s1", str(stream_id), "running", str(main_snode)], summary
        via_standby = await Cli(subprocess_env, standby.address).json("stream", "show", "s1")
        assert via_standby["streams"][0]["state"] == "running" and not via_standby["answered_by_standby"]
        await cli.refused("stream", "show", "nosuch", fragment="unknown stream 'nosuch'")

        # Stop (twice is refused), start, by name and by id.
        assert "stopped stream s1" in await cli.ok("stream", "stop", "s1")
        await cli.refused("stream", "stop", "s1", fragment="already stopped")
        doc = await wait_for(lambda: state_of("s1", "stopped"), "s1 stopped by the user", timeout=30)
        assert doc["streams"][0]["tasks"] == [] and doc["streams"][0]["user_stopped"]
        assert "manager: stopped by the user; `querycoord stream start s1`" in await cli.ok("stream", "show", "s1")
        assert "started stream s1" in await cli.ok("stream", "start", str(stream_id))
        await wait_for(lambda: state_of("s1", "running"), "s1 running again", timeout=30)
        await cli.refused("stream", "stop", "nope", fragment="unknown stream 'nope'")
        await cli.refused("stream", "start", "nope", fragment="unknown stream 'nope'")

        # Drop (twice is refused, unless --if-exists); the snode of node b is dropped, an unknown one refused.
        assert f"dropped stream s1 (id {stream_id})" in await cli.ok("stream", "drop", "s1")
        await cli.refused("stream", "drop", "s1", fragment="unknown stream 's1'")
        assert "nothing to drop" in await cli.ok("stream", "drop", "s1", "--if-exists")
        assert (await cli.json("stream", "show"))["streams"] == []
        dropped = snode_of[node_b.node_id]
        assert f"dropped snode {dropped}; no stream" in await cli.ok("snode", "drop", str(dropped))
        await cli.refused("snode", "drop", str(dropped), fragment=str(dropped))
        assert [r["id"] for r in await cli.json("snode", "show")] == [snode_of[node_a.node_id]]


# ----- the drawing, without a cluster ---------------------------------------------------------------------------------
def _info(state: int, **kw: Any) -> sp.StreamStatusInfo:
    sdef = sp.StreamDef(id=7, name="s7", source_db="db", source_vgroup_ids=[1, 2], num_calc_scan_plans=1,
                        num_calc_subplans=2, runner_deploys=3, main_snode_id=1)
    return sp.StreamStatusInfo(stream=sdef, state=state, **kw)  # type: ignore[arg-type]


def test_stream_show_says_what_the_manager_does() -> None:
    now = time.time()
    show = sp.ShowStreamsResponse(live_snode_ids=[1])
    stopped = _info(sp.STREAM_STOPPED_BY_ERROR, stop_error_code=1004,
                    stop_reason="snode 1 of lost node 4: it hosts the trigger", next_retry_ms=int((now + 30) * 1000),
                    retries=2)
    text = draw.stream_activity(stopped, show, now)
    assert text.startswith("stopped by error 1004: snode 1 of lost node 4: it hosts the trigger; retry #2 in 30s"), text
    due = _info(sp.STREAM_STOPPED_BY_ERROR, stop_error_code=3, stop_reason="x", next_retry_ms=int(now * 1000),
                retries=1)
    assert draw.stream_activity(due, show, now).endswith("retry #1 now")

    watching = sp.ShowStreamsResponse(watching=True, watch_until_ms=int((now + 4) * 1000))
    text = draw.stream_activity(_info(sp.STREAM_UNDEPLOYED), watching, now)
    assert text.startswith("WATCH: a new leader listens to the stream nodes' reports (until in 4s at the latest)")

    queued = _info(sp.STREAM_UNDEPLOYED, plan_queued=True)
    assert "no snode is live" in draw.stream_activity(queued, sp.ShowStreamsResponse(), now)
    assert "next stream heartbeat" in draw.stream_activity(queued, show, now)

    deploying = _info(sp.STREAM_DEPLOYING, deploy_times=2, tasks=[
        sp.TaskRow(task=sp.TaskId(task_id=10, kind=sp.TRIGGER_READER, vgroup_id=1, sid=1), pending=True),
        sp.TaskRow(task=sp.TaskId(task_id=11, kind=sp.TRIGGER, snode_id=1, node_id=5, sid=1), status=sp.TASK_INIT),
        sp.TaskRow(task=sp.TaskId(task_id=12, kind=sp.RUNNER, snode_id=1, node_id=5, sid=2, top=True, deploy_id=1,
                                  task_idx=1), status=sp.TASK_RUNNING, last_heard_ms=int(now * 1000)),
    ])
    text = draw.stream_activity(deploying, show, now)
    assert text == "deploying (deploy #2): 1 of 3 tasks wait for their host's heartbeat; 1 INIT, 1 RUNNING", text
    assert draw.stream_checkpoint(deploying, now) == "none yet"
    deploying.checkpoint_id, deploying.checkpoint_ms = 12, int((now - 8) * 1000)
    deploying.checkpoint_round_id, deploying.checkpoint_round_started_ms = 14, int((now - 0.4) * 1000)
    lines = draw.draw_stream(deploying, show, now)
    assert lines[0].startswith("stream s7 (id 7): deploying  source db vgroups 1,2  main snode 1"), lines
    assert lines[2].strip() == "progress: no task has reported progress", lines
    assert lines[3] == "  checkpoint: #12 committed 8.0s ago; round #14 in flight for 0.4s", lines
    rows = [line.split() for line in lines[6:]]
    # Readers first, then the trigger, then the runners; a pending task has no node yet.
    assert rows[0][:3] == ["#10", "trigger", "reader"] and rows[0][3] == "-" and "PENDING" in rows[0], rows
    assert rows[1][:2] == ["#11", "trigger"] and "INIT" in rows[1] and "never" in rows[1], rows
    assert rows[2][:3] == ["#12", "runner", "(top)"] and rows[2][3:9] == ["5", "-", "1", "1/1", "2", "RUNNING"], rows
    record = draw.stream_record(deploying, show, now)
    assert [t["state"] for t in record["tasks"]] == ["PENDING", "INIT", "RUNNING"]  # type: ignore[index]

    assert draw.stream_activity(_info(sp.STREAM_STOPPED_BY_USER), show, now).startswith("stopped by the user")
    assert "standby" in draw.stream_activity(_info(sp.STREAM_STATE_UNSPECIFIED), show, now)


def test_snode_records_count_main_streams_and_liveness() -> None:
    show = sp.ShowStreamsResponse(
        snodes=[sp.SnodeInfo(id=2, node_id=20, replica_id=1), sp.SnodeInfo(id=1, node_id=10, replica_id=2)],
        streams=[_info(sp.STREAM_RUNNING), _info(sp.STREAM_RUNNING)], live_snode_ids=[2])
    records = draw.snode_records(show)
    assert [(r["id"], r["node_id"], r["live"], r["main_streams"]) for r in records] == [(1, 10, False, 2),
                                                                                      (2, 20, True, 0)]
    assert [r["live"] for r in draw.snode_records(show, liveness_known=False)] == [None, None]
    assert [row[3] for row in draw.snode_rows(records)] == ["no", "yes"]


@pytest.mark.parametrize("text,expected", [("1,2", [1, 2]), ("3-5,1", [3, 4, 5, 1]), (" 7 ", [7])])
def test_vgroup_lists(text: str, expected: list[int]) -> None:
    assert parse_vgroups(text) == expected


@pytest.mark.parametrize("text,fragment", [("", "expected"), ("1,,2", "expected"), ("a", "expected"),
                                           ("0", "positive"), ("5-3", "ascending"), ("1,1-2", "twice"),
                                           ("1-99999", "too large"), ("-1", "expected")])
def test_bad_vgroup_lists(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_vgroups(text)
