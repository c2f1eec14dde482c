"""What the command line tells a user: conventions (--version, completion, --log-level after the sub-command), one
error line naming the flag for bad input, a timeout honoured and said, what an address is (nothing listening, no
coordinator, no leader yet, a standby), which node `up` lost, and `-o json` output.

Real processes throughout: the CLI as a subprocess, coordinators and query nodes as processes on a real etcd.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from importlib.metadata import version
from pathlib import Path

import pytest

from meta.election import Election
from meta.ops.child import ChildProcess, child_env
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import querycoord_pb2 as qc
from querycoord.common.protocol import QUERYCOORD_ELECTION, QUERYCOORD_ROLE
from querycoord.console import draw
from querycoord.tooling.harness import coord_argv
from tests.spawn import spawn_coordinator, spawn_query_node
from tests.test_cli import Up, ok, refused


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querycoord.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


async def arun(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``run`` without blocking the event loop (in-process sessions of the test keep their leases meanwhile)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"`querycoord {' '.join(args)}` still ran after {timeout}s") from None
    assert proc.returncode is not None
    return subprocess.CompletedProcess(list(args), proc.returncode, out.decode(), err.decode())


def one_error_line(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A non-zero exit whose stderr is exactly one ``error: ...`` line holding ``fragments``."""
    assert r.returncode != 0, f"exit 0\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----- conventions: --version, completion, --log-level after the sub-command ------------------------------------------
def test_version_comes_from_the_package_metadata(subprocess_env) -> None:
    r = run(subprocess_env, "--version")
    assert r.returncode == 0 and r.stdout.strip() == f"querycoord {version('querycoord')}", r


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_naming_every_command(subprocess_env, shell) -> None:
    script = ok(run(subprocess_env, "completion", shell))
    assert ("complete " if shell == "bash" else "#compdef querycoord") in script, script[:300]
    for word in ("collection", "drop", "tasks", "nodes", "--output", "--log-level", "--timeout"):
        assert word in script, word


def test_log_level_is_accepted_after_the_sub_command(subprocess_env) -> None:
    addr = f"127.0.0.1:{free_port()}"
    r = run(subprocess_env, "nodes", "--log-level", "warning", "--address", addr, "--timeout", "1")
    one_error_line(r, addr, "nothing listens there")
    r = run(subprocess_env, "collection", "show", "--log-level", "ERROR", "--address", addr, "--timeout", "1")
    one_error_line(r, "nothing listens there")


# ----- bad input: one error line naming the flag, never a traceback ---------------------------------------------------
BAD = {
    "client --timeout -1": (["nodes", "--timeout", "-1"], "--timeout"),
    "client --timeout 0": (["tasks", "--timeout", "0"], "--timeout"),
    "create --partitions 0": (["collection", "create", "c", "--partitions", "0"], "--partitions"),
    "create --partitions -3": (["collection", "create", "c", "--partitions", "-3"], "--partitions"),
    "create --channels 0": (["collection", "create", "c", "--channels", "0"], "--channels"),
    "create --rows -5": (["collection", "create", "c", "--rows", "-5"], "--rows"),
    "create --segments x": (["collection", "create", "c", "--segments", "x"], "--segments"),
    "tasks --max-children -1": (["tasks", "--max-children", "-1"], "--max-children"),
    "tasks --task -5": (["tasks", "--task", "-5"], "--task"),
    "output xml": (["nodes", "-o", "xml"], "--output"),
    "up --node-capacity-mb 0": (["up", "--node-capacity-mb", "0"], "--node-capacity-mb"),
    "up --nodes -1": (["up", "--nodes", "-1"], "--nodes"),
    "up --ttl 1": (["up", "--ttl", "1"], "--ttl"),
    "up --listen 99999": (["up", "--listen", "127.0.0.1:99999"], "99999"),
    "coord --listen 99999": (["coord", "--etcd-endpoints", "127.0.0.1:1", "--root", "r", "--listen",
                              "127.0.0.1:99999"], "99999"),
    "unknown option": (["nodes", "--nope"], "--nope"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_error_line(subprocess_env, case) -> None:
    argv, flag = BAD[case]
    r = run(subprocess_env, "--address", "127.0.0.1:1", *argv)
    one_error_line(r, flag)
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("command", ["up", "etcd"])
def test_data_dir_that_is_a_file_or_not_writable_is_one_error_line(subprocess_env, tmp_path, command) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    extra = ["--listen", "127.0.0.1:0"] if command == "up" else []
    one_error_line(run(subprocess_env, command, "--data-dir", str(a_file), *extra), "--data-dir", str(a_file),
                   "is a file")
    under = a_file / "sub"  # not creatable, even by root
    one_error_line(run(subprocess_env, command, "--data-dir", str(under), *extra), "--data-dir", str(under),
                   "not a writable directory")


# ----- --timeout is honoured, and what an address is said to be -----------------------------------------------------
async def test_timeout_is_honoured_when_etcd_is_down_and_the_message_says_so(subprocess_env, tmp_path) -> None:
    """With etcd down the coordinator says at once that it cannot reach etcd, rather than that it does not lead
    after its 15 s etcd deadline, and no call outlives `--timeout 2`; its log
    says so in one line per change (down, back), without gRPC dumps."""
    etcd = EtcdCluster(tmp_path / "etcd", size=1).start()
    coord = None
    try:
        coord = await spawn_coordinator(etcd, f"t-{uuid.uuid4().hex[:8]}", tmp_path, name="coord", log_level="INFO")
        await coord.wait_event("leader", timeout=30)
        etcd.stop_member(0)
        await coord.wait_event("standby", timeout=30)  # its session lapsed (TTL 2 s)
        # Another 15 s (the etcd deadline) would time this out: the subprocess limit catches a call that waits.
        r = await arun(subprocess_env, "nodes", "--address", coord.address, "--timeout", "2", timeout=12)
        one_error_line(r, coord.address, "cannot reach etcd")
        seen = len(coord.events)
        etcd.restart_member(0)
        await coord.wait_event("leader", timeout=60, since=seen)  # leads again (not the first leader event)
    finally:
        if coord is not None:
            await coord.stop()
        etcd.stop()
    log = (tmp_path / "coord.log").read_text()
    assert "debug_error_string" not in log and "AioRpcError" not in log, log[-3000:]
    assert len(re.findall(r"etcd at \S+ is unreachable", log)) == 1, log[-3000:]
    assert len(re.findall(r"etcd at \S+ is reachable again", log)) == 1, log[-3000:]


async def test_a_coordinator_started_before_its_etcd_says_so_and_waits(subprocess_env, tmp_path) -> None:
    """It says at once that etcd is unreachable and keeps waiting past its 15 s etcd deadline until etcd is up."""
    etcd = EtcdCluster(tmp_path / "etcd", size=1).start()
    etcd.stop_member(0)  # its address is known, nothing listens there yet
    log = tmp_path / "coord.log"
    argv = coord_argv(etcd.endpoints, f"t-{uuid.uuid4().hex[:8]}", "127.0.0.1:0", 2, log_level="INFO")
    child = await ChildProcess.spawn("coord", argv, log_path=log, env=child_env())
    try:
        deadline = time.monotonic() + 30
        while "is unreachable" not in (log.read_text() if log.exists() else ""):
            assert child.running and time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            await asyncio.sleep(0.2)
        await asyncio.sleep(17)  # past the etcd deadline (15 s): it must not exit
        assert child.running, log.read_text()
        etcd.restart_member(0)
        await child.wait_event("leader", timeout=60)
    finally:
        await child.stop()
        etcd.stop()
    assert "reachable again" in log.read_text()


def test_nothing_listening_is_told_apart(subprocess_env) -> None:
    addr = f"127.0.0.1:{free_port()}"
    one_error_line(run(subprocess_env, "nodes", "--address", addr, "--timeout", "1"),
                   f"{addr}: nothing listens there", "querycoord up")


async def test_an_address_that_is_no_coordinator_is_told_apart_at_once(subprocess_env, etcd, tmp_path) -> None:
    """A query node's address is said to be no coordinator, not answered with `UNIMPLEMENTED ... Method not found!`."""
    node = await spawn_query_node(etcd, f"t-{uuid.uuid4().hex[:8]}", tmp_path, "--ttl", "10")
    try:
        # The answer is final: no waiting out the 60 s timeout.
        r = await arun(subprocess_env, "nodes", "--address", node.address, "--timeout", "60", timeout=30)
        one_error_line(r, f"{node.address}: that address is not a querycoord coordinator")
        r = await arun(subprocess_env, "collection", "show", "--address", node.address, timeout=30)
        one_error_line(r, "not a querycoord coordinator")
    finally:
        await node.stop()


async def test_no_leader_elected_yet_is_told_apart(subprocess_env, etcd, tmp_path, kv) -> None:
    """A candidate ahead in the election that has not said where it serves: the coordinator stands by."""
    root = kv.root
    session = Session(kv, QUERYCOORD_ROLE, "", ttl=10)
    await session.start()
    try:
        await Election(kv, session, QUERYCOORD_ELECTION).campaign("")
        coord = await spawn_coordinator(etcd, root, tmp_path, log_level="INFO")
        try:
            r = await arun(subprocess_env, "nodes", "--address", coord.address, "--timeout", "2", timeout=30)
            one_error_line(r, f"{coord.address}: it stands by and no leader is elected yet")
        finally:
            await coord.stop()
    finally:
        await session.close()


# ----- a standby says it stands by and who leads ---------------------------------------------------------------------
async def test_a_standby_says_it_stands_by_and_names_the_leader(etcd, tmp_path, root_path) -> None:
    leader = await spawn_coordinator(etcd, root_path, tmp_path, name="c1", log_level="INFO")
    try:
        await leader.wait_event("leader", timeout=30)
        standby = await spawn_coordinator(etcd, root_path, tmp_path, name="c2", log_level="INFO")
        try:
            log = tmp_path / "c2.log"
            deadline = time.monotonic() + 20
            pattern = rf"stands by; the leader is at {re.escape(leader.address)}"
            while not re.search(pattern, log.read_text()):
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.2)
            assert len(re.findall(pattern, log.read_text())) == 1
        finally:
            await standby.stop()
    finally:
        await leader.stop()


# ----- up: node ids, logs where it said, which node exited ------------------------------------------------------------
def test_up_names_nodes_by_id_says_which_exited_and_keeps_its_logs(subprocess_env, tmp_path) -> None:
    root = f"test-up-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "querycoord.cli", "up", "--listen", "127.0.0.1:0", "--ttl", "2",
                             "--etcd-port", "0", "--root", root, "--nodes", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env)
    data_dir = None
    try:
        assert proc.stdout is not None
        head = []
        for line in proc.stdout:
            head.append(line)
            if line.startswith("ready:"):
                break
        text = "".join(head)
        nodes = re.findall(r"query node (\d+)\s+\S+\s+\(pid (\d+), log (\S+)\)", text)
        assert len(nodes) == 2, text
        data_dir = Path(re.search(r"\(data and logs in (\S+?)[;,)]", text).group(1))  # type: ignore[union-attr]
        coord_log = re.search(r"coordinator\s+\S+\s+\(leader, pid \d+, log (\S+)\)", text).group(1)  # type: ignore[union-attr]
        victim_id, victim_pid, _ = nodes[0]
        subprocess.run(["kill", "-KILL", victim_pid], check=True)
        time.sleep(3)  # `up` looks every 0.5 s
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=40) == 0
        err = proc.stderr.read() if proc.stderr else ""
        assert re.search(rf"query node {victim_id} \(\S+, pid {victim_pid}\) exited", err), err
        for _, _, log in nodes:
            assert Path(log).is_file() and Path(log).read_text(), f"{log} is gone"
        assert Path(coord_log).is_file()
        assert not (data_dir / "etcd").exists(), "the etcd data of a temporary cluster is removed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if data_dir is not None:
            shutil.rmtree(data_dir, ignore_errors=True)


# ----- collection drop, DONE for finished tasks, -o json --------------------------------------------------------------
def test_drop_json_output_and_done(subprocess_env, tmp_path) -> None:
    with Up(subprocess_env, tmp_path / "up", "--nodes", "1") as up:
        addr = up.wait_ready()

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return run(subprocess_env, "--address", addr, "--timeout", "20", *args)

        ok(cli("collection", "create", "c1", "--partitions", "2", "--segments", "20"))
        err = refused(cli("collection", "create", "c1"), "already used", "drop")
        assert "drop" in err
        ok(cli("collection", "load", "c1"))

        shown = json.loads(ok(cli("collection", "show", "-o", "json")))
        assert [(r["name"], r["segments"], r["load_type"], r["loaded_percentage"], r["loaded_partitions"])
                for r in shown] == [("c1", 20, "collection", 100, 2)], shown
        nodes = json.loads(ok(cli("nodes", "--output", "json")))
        assert len(nodes) == 1 and nodes[0]["segments"] == 20 and nodes[0]["state"] == "online", nodes
        trees = json.loads(ok(cli("tasks", "--all", "--children", "-o", "json")))
        load = next(t for t in trees if t["kind"] == "LoadCollection")
        assert load["state"] == "DONE" and {c["state"] for c in load["children"]} == {"DONE"}, load
        assert re.search(r"LoadCollection\s+DONE", ok(cli("tasks", "--all"))), "a finished task shows DONE"
        assert "EXPIRED" not in ok(cli("tasks", "--all", "--children"))
        one = json.loads(ok(cli("tasks", "--task", str(load["task_id"]), "-o", "json")))
        assert one["task_id"] == load["task_id"] and one["state"] == "DONE"
        assert json.loads(ok(cli("tasks", "-o", "json"))) == []

        refused(cli("collection", "drop", "c1"), "loaded", "release")
        ok(cli("collection", "release", "c1"))
        out = ok(cli("collection", "drop", "c1"))
        assert "dropped collection c1" in out, out
        assert json.loads(ok(cli("collection", "show", "-o", "json"))) == []
        refused(cli("collection", "drop", "c1"), "c1")
        ok(cli("collection", "create", "c1"))  # the name is free again


def test_user_state_names() -> None:
    assert draw.state_name(qc.TASK_STATE_EXPIRED) == "DONE"
    assert draw.state_name(qc.TASK_STATE_DONE, trigger=True) == "DOING"  # planned, children still running
    assert draw.state_name(qc.TASK_STATE_DONE) == "DONE"
    counts = qc.ChildStateCounts(total=3, done=1, expired=2)
    trig = qc.TaskInfo(task_id=1, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_EXPIRED)
    assert draw.trigger_line(trig, counts) == "#1  LoadCollection  DONE  children 3 (3 done)"
