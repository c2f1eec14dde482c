"""Check kinds at runtime (ListCheckers/ActivateChecker/DeactivateChecker): a kind turned off plans nothing, on
again it does; bad names are refused whole; the command line (`checkers`, `balance pause|resume|status`,
`status`) as real processes; README's examples as the commands draw them.

What nodes hold is the fact; the checker's own pass counter says how many passes had the chance to act.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.checkers.activation import ACTIVATION_KEY, CHECK_KINDS, KINDS_BY_NAME, warning_for
from querycoord.cli.balance_cmd import balance_lines, checker_line, checkers_lines
from querycoord.cli.status import control_lines
from querycoord.serving.coordinator_metrics import coordinator_families
from tests.cluster import QueryCluster, wait_until

STRAY = 987654


async def _passes(checker, n: int) -> None:
    start = checker.runs
    await wait_until(lambda: checker.runs >= start + n, f"{n} checker passes")


async def test_a_deactivated_kind_plans_nothing_until_activated(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.checker_interval = 0.3
        leader = await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node()
        cid = await c.create_collection("kinds", partitions=1, segments=12)
        await c.load_collection(cid)
        await c.wait_idle()
        checker = leader.coord.leadership.checker

        off = await c.client.query("DeactivateChecker", qc.CheckerRequest(name="segments"))
        assert off.status.error_code == common_pb2.SUCCESS and not off.checker.active, off
        assert off.status.reason.startswith("warning: ") and "not repaired" in off.status.reason
        off = await c.client.query("DeactivateChecker", qc.CheckerRequest(name="releases"))
        assert off.status.error_code == common_pb2.SUCCESS and off.status.reason == "", off
        listed = await c.client.query("ListCheckers", qc.ListCheckersRequest())
        assert [(i.name, i.active) for i in listed.checkers] == [
            (k.name, k.name not in ("segments", "releases")) for k in CHECK_KINDS]
        families = await coordinator_families(leader.coord)
        active = {s.labels["checker"]: s.value for f in families for s in f.samples
                  if s.name == "querycoord_checker_active"}
        assert active["segments"] == 0 and active["releases"] == 0 and active["channels"] == 1

        # Outside hands: a node loses three segments, another gains a copy of a collection nobody loaded.
        node = max(c.nodes, key=lambda n: len(n.state.segments))
        other = next(n for n in c.nodes if n is not node)
        lost = sorted(node.state.segments)[:3]
        node.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=lost))
        stray = querynode_pb2.LoadSegmentsRequest(collection_id=cid + 1000, infos=[data_pb2.SegmentLoadInfo(
            segment_id=STRAY, collection_id=cid + 1000, partition_id=1, mem_size=10)])
        stray.node_id = other.node_id
        other.state.load_segments(stray)

        def held() -> set[int]:
            return {s for n in c.nodes for s in n.state.segments}

        await _passes(checker, 4)
        assert not set(lost) & held(), "segments off: a lost copy was loaded again"
        assert STRAY in other.state.segments, "releases off: the stray copy was released"
        assert not c.coords[0].coord.leadership.scheduler.triggers

        on = await c.client.query("ActivateChecker", qc.CheckerRequest(name="releases"))
        assert on.status.error_code == common_pb2.SUCCESS and on.checker.active, on
        await wait_until(lambda: STRAY not in other.state.segments, "releases on: the stray copy released")
        await _passes(checker, 2)
        assert not set(lost) & held(), "segments is still off"

        on = await c.client.query("ActivateChecker", qc.CheckerRequest(name="segments"))
        assert on.checker.active
        await wait_until(lambda: set(lost) <= held(), "segments on: the lost copies loaded again")
        await c.wait_idle()
        all_held = [s for n in c.nodes for s in n.state.segments]
        assert len(all_held) == len(set(all_held)) == 12


async def test_bad_checker_names_are_refused_and_change_nothing(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        await c.wait_leader()
        for method in ("ActivateChecker", "DeactivateChecker"):
            r = await c.client.query(method, qc.CheckerRequest(name="nosuch"))
            assert r.status.error_code == common_pb2.NOT_FOUND, r
            assert "unknown checker 'nosuch'" in r.status.reason
            assert all(k.name in r.status.reason for k in CHECK_KINDS), r.status.reason
            r = await c.client.query(method, qc.CheckerRequest(name=""))
            assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT, r
            r = await c.client.query(method, qc.CheckerRequest(name="x" * 10_000))
            assert r.status.error_code == common_pb2.ILLEGAL_ARGUMENT, r
        assert await c.kv.get(ACTIVATION_KEY) is None, "a refused request wrote nothing"
        # Switching a kind to the state it is in writes nothing either.
        r = await c.client.query("ActivateChecker", qc.CheckerRequest(name="channels"))
        assert r.status.error_code == common_pb2.SUCCESS and r.checker.active
        assert await c.kv.get(ACTIVATION_KEY) is None


# ----- the command line, as processes ------------------------------------------------------------------------------
async def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_balance_control_and_checkers(etcd: EtcdCluster, root_path: str,
                                                subprocess_env: dict[str, str]) -> None:
    async with QueryCluster(etcd, root_path) as c:
        leader = await c.start_coordinator()
        await c.wait_leader()
        at = ("--address", leader.address, "--timeout", "10")

        code, out, _ = await _cli(subprocess_env, "balance", "status", *at)
        assert code == 0 and out.startswith("balance runs"), out
        code, out, _ = await _cli(subprocess_env, "balance", "pause", *at)
        assert code == 0 and out.startswith("balance paused since ") and "UTC by 127.0.0.1" in out, out
        code, out, _ = await _cli(subprocess_env, "balance", "status", "-o", "json", *at)
        record = json.loads(out)
        assert code == 0 and record["paused"] and record["since_ms"] > 0 and record["by"] == "127.0.0.1", out

        etcd_opts = ("--etcd-endpoints", ",".join(etcd.config().endpoints), "--root", root_path)
        code, out, err = await _cli(subprocess_env, "status", *etcd_opts)
        assert code == 0 and re.search(r"^balance paused since .* UTC by 127\.0\.0\.1$", out, re.M), out + err

        code, out, _ = await _cli(subprocess_env, "balance", "resume", *at)
        assert code == 0 and out.startswith("balance runs"), out

        code, out, _ = await _cli(subprocess_env, "checkers", "list", "-o", "json", *at)
        assert code == 0 and [r["name"] for r in json.loads(out)] == [k.name for k in CHECK_KINDS], out
        assert all(r["active"] for r in json.loads(out))
        code, out, err = await _cli(subprocess_env, "checkers", "deactivate", "segments", *at)
        assert code == 0 and out.startswith("checker segments is off"), out
        assert err.startswith("warning: checker segments is off"), err
        code, out, err = await _cli(subprocess_env, "checkers", "deactivate", "releases", *at)
        assert code == 0 and err == "", err
        code, out, _ = await _cli(subprocess_env, "checkers", "list", *at)
        assert re.search(r"^segments +no +load segments a replica lacks", out, re.M), out
        code, out, err = await _cli(subprocess_env, "status", *etcd_opts)
        assert "checkers off: segments (since " in out and "releases (since " in out, out + err
        code, out, _ = await _cli(subprocess_env, "checkers", "activate", "segments", *at)
        assert code == 0 and out.startswith("checker segments is active"), out

        # Refusals exit 1 with one line; usage mistakes exit 2; `balance --source` is still a move.
        code, _, err = await _cli(subprocess_env, "checkers", "activate", "nosuch", *at)
        assert code == 1 and err.startswith("error: unknown checker 'nosuch': the checkers are "), err
        for args in (("checkers", "activate"), ("checkers", "list", "segments"), ("checkers", "pause"),
                     ("balance",), ("balance", "pause", "--source", "1"), ("balance", "jump")):
            code, _, err = await _cli(subprocess_env, *args, *at)
            assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, (args, err)
        code, _, err = await _cli(subprocess_env, "balance", "--source", "987654", *at)
        assert code == 1 and "987654" in err, err


# ----- README's examples ------------------------------------------------------------------------------------------
def _readme_block(project_root: Path, command: str) -> list[str]:
    text = (project_root / "README.md").read_text()
    m = re.search(rf"^\$ {re.escape(command)}\n(.*?)(?=^\$ |^```)", text, re.S | re.M)
    assert m is not None, f"no `$ {command}` example in README.md"
    return m.group(1).rstrip("\n").split("\n")


EXAMPLE_MS = 1_767_268_800_000  # 2026-01-01 12:00:00 UTC


def test_readme_examples_are_what_the_commands_draw(project_root: Path) -> None:
    paused = {"paused": True, "since_ms": EXAMPLE_MS, "by": "ops-admin"}
    assert balance_lines(paused) == _readme_block(project_root, "querycoord balance pause")
    assert balance_lines({"paused": False, "since_ms": 0, "by": ""}) == _readme_block(
        project_root, "querycoord balance resume")
    records = [{"name": k.name, "active": k.name != "releases", "description": k.description} for k in CHECK_KINDS]
    assert checkers_lines(records) == _readme_block(project_root, "querycoord checkers list")
    segments = next(r for r in records if r["name"] == "segments")
    assert [warning_for(KINDS_BY_NAME["segments"]), checker_line({**segments, "active": False})] == _readme_block(
        project_root, "querycoord checkers deactivate segments")
    off = {"since_ms": EXAMPLE_MS, "by": "ops-admin"}
    controls = {"balance": paused, "inactive_checkers": [{"name": "balance", **off}, {"name": "releases", **off}]}
    assert ["root prod-a: 127.0.0.1:35105 leads", *control_lines(controls)] == _readme_block(
        project_root, "querycoord status --etcd-endpoints 127.0.0.1:2379 --root prod-a | head -3")
