"""Which deployment a reader of etcd reads, how fast it hears that nothing listens, closed pipes, etcd's temp dir.

Real processes throughout: the CLI as a subprocess against a real etcd (or a port where nothing listens, or a
socket that accepts and never answers), ``querycoord etcd`` stopped by real signals.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from meta.client import connect
from meta.config import EtcdConfig
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster, bindable
from proto import data_pb2
from proto import querycoord_pb2 as qc
from querycoord.cli import CLOSED_PIPE_EXIT
from querycoord.querymeta import keys as qkeys
from querycoord.task.history import history_key, summarize
from tests import procs
from tests.cluster import running_cluster
from tests.test_cli import run_querycoord

pytestmark = pytest.mark.timeout(240)


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querycoord.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def reading_line(root: str, root_from: str, endpoints: str, etcd_from: str) -> str:
    return f'reading root "{root}" ({root_from}) at etcd {endpoints} ({etcd_from})'


async def plant_segments(endpoints: list[str], root: str, count: int) -> None:
    """``count`` segment records, each of a collection of its own that nothing loaded (a problem each for
    ``meta verify``), written as an outside hand would (no coordinator)."""
    async with await connect(EtcdConfig.from_endpoints(endpoints)) as client:
        kv = MetaKV(client, root)
        for start in range(0, count, 100):
            await kv.multi_save({
                qkeys.segment_key(100_000 + sid, 1, sid): data_pb2.SegmentInfo(
                    segment_id=sid, collection_id=100_000 + sid, partition_id=1, node_id=7, num_rows=10,
                    mem_size=1 << 20).SerializeToString()
                for sid in range(start + 1, min(start + 100, count) + 1)})


def segment_ids(stdout: str) -> set[int]:
    return {row["segment_id"] for row in json.loads(stdout)["rows"]}


# ----- the root and the endpoints: flag > variables > file > default, and said on stderr -----------------------------
def test_readers_take_the_root_and_endpoints_from_the_config_file_and_say_so(
        etcd: EtcdCluster, root_path: str, subprocess_env, tmp_path) -> None:
    asyncio.run(plant_segments(etcd.endpoints, root_path, 3))
    endpoints = ",".join(etcd.endpoints)
    config = tmp_path / "prod.toml"
    config.write_text(f'[coord]\nroot = "{root_path}"\n[etcd]\nendpoints = "{endpoints}"\n')
    from_file = reading_line(root_path, f"from {config} [coord] root", endpoints, f"from {config} [etcd] endpoints")

    r = run(subprocess_env, "meta", "show", "segments", "--config", str(config), "-o", "json")
    assert r.returncode == 0 and r.stderr.splitlines() == [from_file], r
    assert segment_ids(r.stdout) == {1, 2, 3}, "the file's root was read, not the default one"

    r = run(subprocess_env, "status", "--config", str(config), "-o", "json")
    assert r.returncode == 0 and r.stderr.splitlines() == [from_file], r
    assert json.loads(r.stdout)["root"] == root_path

    r = run(subprocess_env, "meta", "verify", "--config", str(config))
    assert r.stderr.splitlines()[0] == from_file, r

    r = run(subprocess_env, "etcd", "roles", "--dry-run", "--config", str(config))
    assert r.returncode == 0 and f"for root {root_path} " in r.stdout.splitlines()[0], r
    assert r.stderr.splitlines() == [f'planning roles for root "{root_path}" (from {config} [coord] root)'], r


def test_flag_beats_variables_beat_the_file_for_root_and_endpoints(
        etcd: EtcdCluster, root_path: str, subprocess_env, tmp_path) -> None:
    asyncio.run(plant_segments(etcd.endpoints, root_path, 2))
    endpoints = ",".join(etcd.endpoints)
    refused = f"127.0.0.1:{free_port()}"
    config = tmp_path / "c.toml"
    config.write_text(f'[coord]\nroot = "not-this-one"\n[etcd]\nendpoints = "{refused}"\n')

    env = {**subprocess_env, "QUERYCOORD_ROOT": root_path, "ETCDCTL_ENDPOINTS": endpoints}
    r = run(env, "meta", "show", "segments", "--config", str(config), "-o", "json")
    assert r.returncode == 0, r
    assert r.stderr.splitlines() == [reading_line(root_path, "from $QUERYCOORD_ROOT", endpoints,
                                                  "from $ETCDCTL_ENDPOINTS")]
    assert segment_ids(r.stdout) == {1, 2}

    # Ours before etcdctl's variable; the flag before both; --endpoints is etcdctl's spelling of --etcd-endpoints.
    env = {**subprocess_env, "QUERYCOORD_ETCD_ENDPOINTS": endpoints, "ETCDCTL_ENDPOINTS": refused,
           "QUERYCOORD_ROOT": "not-this-one-either"}
    r = run(env, "meta", "show", "segments", "--config", str(config), "--root", root_path, "-o", "json")
    assert r.returncode == 0 and r.stderr.splitlines() == [
        reading_line(root_path, "from --root", endpoints, "from $QUERYCOORD_ETCD_ENDPOINTS")], r
    env = {**subprocess_env, "QUERYCOORD_ETCD_ENDPOINTS": refused}
    r = run(env, "meta", "show", "segments", "--endpoints", endpoints, "--root", root_path, "-o", "json")
    assert r.returncode == 0 and segment_ids(r.stdout) == {1, 2}, r
    assert r.stderr.splitlines() == [reading_line(root_path, "from --root", endpoints, "from --etcd-endpoints")]


def test_config_show_names_the_variable_that_set_a_value_and_the_default_endpoint(subprocess_env) -> None:
    env = {**subprocess_env, "ETCDCTL_ENDPOINTS": "10.0.0.1:2379", "QUERYCOORD_ROOT": "shared"}
    r = run(env, "config", "show", "-o", "json")
    assert r.returncode == 0, r
    rows = {row["key"]: row for row in json.loads(r.stdout)["settings"]}
    assert (rows["etcd.endpoints"]["value"], rows["etcd.endpoints"]["origin"]) == ("10.0.0.1:2379",
                                                                                   "env ETCDCTL_ENDPOINTS")
    assert (rows["coord.root"]["value"], rows["coord.root"]["origin"]) == ("shared", "env QUERYCOORD_ROOT")
    r = run(subprocess_env, "config", "show", "-o", "json")
    rows = {row["key"]: row for row in json.loads(r.stdout)["settings"]}
    assert r.returncode == 0 and (rows["etcd.endpoints"]["value"], rows["etcd.endpoints"]["origin"]) == (
        "127.0.0.1:2379", "default"), r


def test_an_empty_root_is_refused_naming_where_it_was_set(subprocess_env, tmp_path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[coord]\nroot = ""\n')
    r = run(subprocess_env, "status", "--config", str(config), "--endpoints", f"127.0.0.1:{free_port()}")
    assert r.returncode == 2 and r.stderr.startswith("error: configuration file ") and "[coord] root" in r.stderr, r
    assert len(r.stderr.splitlines()) == 1, r


# ----- the default endpoint: etcdctl's 127.0.0.1:2379 ----------------------------------------------------------------
def test_with_no_endpoints_readers_try_the_default_and_say_nothing_listens_there(default_etcd, subprocess_env) -> None:
    if not bindable(2379):
        pytest.skip("something outside the tests listens on 127.0.0.1:2379")
    for args in (("status",), ("meta", "verify"), ("meta", "show", "segments")):
        r = run(subprocess_env, *args, "--timeout", "120")
        assert r.returncode == 1, r
        lines = r.stderr.splitlines()
        assert lines[0] == reading_line("querycoord", "default", default_etcd, "default"), r
        assert len(lines) == 2 and lines[1].startswith(
            f"error: etcd at {default_etcd} refused the connection (nothing listens there?); "
            f"{default_etcd} is the default: give --endpoints"), r
    r = run(subprocess_env, "etcd", "maintain", "--dry-run")
    assert r.returncode == 1 and "refused the connection" in r.stderr and "Traceback" not in r.stderr, r


def test_with_no_endpoints_readers_read_the_etcd_on_the_default_port(default_etcd, subprocess_env, tmp_path,
                                                                      root_path) -> None:
    if not bindable(2379):
        pytest.skip("something outside the tests listens on 127.0.0.1:2379")
    with EtcdCluster(tmp_path / "etcd", client_ports=(2379,)) as cluster:
        assert cluster.endpoints == [default_etcd]
        asyncio.run(plant_segments(cluster.endpoints, root_path, 4))
        r = run(subprocess_env, "meta", "show", "segments", "--root", root_path, "-o", "json")
        assert r.returncode == 0 and segment_ids(r.stdout) == {1, 2, 3, 4}, r
        assert r.stderr.splitlines() == [reading_line(root_path, "from --root", default_etcd, "default")]
        r = run(subprocess_env, "etcd", "status", "-o", "json")
        assert r.returncode == 0 and [m["endpoint"] for m in json.loads(r.stdout)["members"]] == [default_etcd], r


# ----- etcd reach: a refusal at once, a silent endpoint waited for ---------------------------------------------------
def test_a_refused_connection_is_reported_at_once_not_after_the_timeout(subprocess_env) -> None:
    refused = f"127.0.0.1:{free_port()}"
    # A 600 s budget: the run's own 60 s limit would fail the test if the command waited the budget out.
    for args in (("status",), ("meta", "show", "collections"), ("meta", "verify")):
        r = run(subprocess_env, *args, "--endpoints", refused, "--timeout", "600")
        assert r.returncode == 1, r
        assert r.stderr.splitlines()[1:] == [f"error: etcd at {refused} refused the connection (nothing listens "
                                             "there?)"], r


def test_an_endpoint_that_accepts_but_never_answers_is_waited_for_up_to_the_timeout(subprocess_env) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody speaks HTTP/2
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        r = run(subprocess_env, "meta", "verify", "--endpoints", endpoint, "--timeout", "2")
    assert r.returncode == 1, r
    assert r.stderr.splitlines()[1].startswith("error: etcd did not answer: etcd unavailable: "), r
    assert "refused" not in r.stderr, r


def test_etcd_status_gives_an_unreachable_member_a_short_reason_and_json_the_whole_error(
        etcd: EtcdCluster, subprocess_env) -> None:
    refused = f"127.0.0.1:{free_port()}"
    both = f"{etcd.endpoints[0]},{refused}"
    r = run(subprocess_env, "etcd", "status", "--endpoints", both)
    assert r.returncode == 1, r
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[2:]}
    assert rows[refused].split()[-3:] == ["unreachable:", "connection", "refused"], r.stdout
    assert rows[etcd.endpoints[0]].split()[-1] == "-", "the live member has no alarm"
    assert max(len(line) for line in r.stdout.splitlines()) < 160, r.stdout
    r = run(subprocess_env, "etcd", "status", "--endpoints", both, "-o", "json")
    members = {m["endpoint"]: m for m in json.loads(r.stdout)["members"]}
    assert members[refused]["reason"] == "unreachable: connection refused"
    assert members[refused]["error"] == f"etcd at {refused} refused the connection (nothing listens there?)"
    assert members[etcd.endpoints[0]]["error"] == "" and members[etcd.endpoints[0]]["version"]


# ----- closed pipes: quiet, exit 141 ----------------------------------------------------------------------------------
def first_line_then_close(env: dict[str, str], *args: str, timeout: float = 120) -> tuple[bytes, int, str]:
    """Run ``querycoord ARGS`` with stdout into a pipe whose reader takes one line and closes it (as ``| head -1``):
    (that line, exit code, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "querycoord.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        return first, proc.wait(timeout), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_meta_show_and_verify_end_quietly_when_the_reader_closes_the_pipe(
        etcd: EtcdCluster, root_path: str, subprocess_env) -> None:
    asyncio.run(plant_segments(etcd.endpoints, root_path, 3000))  # ~200 KiB of table: more than a pipe holds
    endpoints = ",".join(etcd.endpoints)
    said = reading_line(root_path, "from --root", endpoints, "from --etcd-endpoints")
    for args in (("meta", "show", "segments"), ("meta", "show", "segments", "-o", "json"), ("meta", "verify")):
        first, code, err = first_line_then_close(subprocess_env, *args, "--endpoints", endpoints, "--root", root_path)
        assert first, args
        assert (code, err.splitlines()) == (CLOSED_PIPE_EXIT, [said]), (args, code, err)


def test_etcd_roles_dry_run_ends_quietly_when_the_reader_closes_the_pipe(subprocess_env) -> None:
    nodes = ",".join(str(i) for i in range(1, 3001))
    first, code, err = first_line_then_close(subprocess_env, "etcd", "roles", "--dry-run", "--root", "r",
                                             "--querynodes", nodes)
    assert first.startswith(b"would make etcd hold these roles for root r ")
    assert (code, err) == (CLOSED_PIPE_EXIT, 'planning roles for root "r" (from --root)\n')


async def test_tasks_history_with_children_ends_quietly_when_the_reader_closes_the_pipe(
        etcd: EtcdCluster, root_path: str, subprocess_env) -> None:
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.kv is not None
        for i in range(3):  # real loads and releases leave their trees in the history
            cid = await c.create_collection(f"c{i}", partitions=1, segments=20)
            await c.load_collection(cid)
        await c.wait_idle()
        now = int(time.time() * 1000)
        for task_id in range(10**9, 10**9 + 30):  # and records with 100 children each, as an outside hand writes
            children = [qc.TaskInfo(task_id=task_id * 1000 + i, parent_id=task_id, kind=qc.TASK_KIND_LOAD_SEGMENT,
                                    state=qc.TASK_STATE_EXPIRED, node_id=1) for i in range(100)]
            tree = summarize(qc.TaskInfo(task_id=task_id, kind=qc.TASK_KIND_LOAD_COLLECTION,
                                         state=qc.TASK_STATE_EXPIRED, collection_id=1),
                             children, started_ms=now - 10, finished_ms=now, max_children=100)
            await c.kv.save(history_key(task_id), tree.SerializeToString())
        first, code, err = await asyncio.to_thread(  # in a thread: the in-process cluster keeps answering
            first_line_then_close, subprocess_env, "tasks", "--history", "--children", "--max-children", "0",
            "--address", c.coords[0].address)
    assert first, "the history was printed"
    assert (code, err) == (CLOSED_PIPE_EXIT, ""), err


# ----- `querycoord etcd` without --data-dir leaves nothing behind ----------------------------------------------------
def start_etcd(env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], Path]:
    """``querycoord etcd ARGS`` in a process group of its own (as a shell runs it), once it printed its data dir;
    started with SIGINT ignored, which Ctrl-C must overcome (``sigint_ignored``)."""
    proc = run_querycoord(["etcd", *args], env, ignoring_sigint=True, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"\(data in (\S+?);", line)
    assert m, f"no data dir printed: {line!r}"
    return proc, Path(m.group(1))


def wait_no_etcd_under(data_dir: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while procs.etcd_pids_under(data_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not procs.etcd_pids_under(data_dir), "etcd outlived `querycoord etcd`"


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_etcd_without_data_dir_removes_its_temporary_directory_when_stopped(subprocess_env, how) -> None:
    proc, data_dir = start_etcd(subprocess_env)
    try:
        assert data_dir.is_dir() and procs.etcd_pids_under(data_dir), "etcd runs in its temporary directory"
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:  # a terminal's Ctrl-C: SIGINT to the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        wait_no_etcd_under(data_dir)
        assert not data_dir.exists(), f"{data_dir} left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_etcd_with_data_dir_keeps_its_data_when_stopped(subprocess_env, tmp_path) -> None:
    proc, data_dir = start_etcd(subprocess_env, "--data-dir", str(tmp_path / "kept"))
    try:
        assert data_dir == (tmp_path / "kept").resolve() or data_dir == tmp_path / "kept"
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        wait_no_etcd_under(data_dir)
        assert (data_dir / "m0.etcd" / "member").is_dir(), "the data stays for the next run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_grpc_server_that_is_not_etcd_gets_one_line_from_every_reader(subprocess_env) -> None:
    """A coordinator's or any other gRPC port given as etcd answers UNIMPLEMENTED: each reader says so in one line
    (exit 1, no traceback), and ``etcd status`` puts it in the member's row."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    endpoint = f"127.0.0.1:{port}"
    try:
        for command in (["status"], ["meta", "verify"], ["meta", "show", "segments"]):
            r = await asyncio.to_thread(run, subprocess_env, *command, "--etcd-endpoints", endpoint)
            assert r.returncode == 1, (command, r)
            assert "Traceback" not in r.stderr, (command, r.stderr)
            errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "that is a gRPC server but not etcd" in errors[0], (command, r.stderr)
        r = await asyncio.to_thread(run, subprocess_env, "etcd", "status", "--endpoints", endpoint, "-o", "json")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r
        member = json.loads(r.stdout)["members"][0]
        assert member["reason"] == "not etcd (a gRPC server without etcd's API)", member
    finally:
        await server.stop(None)
