"""`querycoord up` as a user runs it: readers find its etcd (default port, export line, env file), what servers
take is passed to its processes (HTTP, TLS, log format, root from the configuration), logs named as the processes
are, and a coordinator or query node that dies is started again while the cluster keeps its state.

Every part is a real process; kills are real SIGKILLs; what is loaded is asked of the query nodes themselves.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc

from proto import querynode_pb2
from querycoord.tooling.up_watch import RestartBudget
from tests import procs
from tests.certs import make_authority
from tests.test_cli import Up, node_rows, ok, wait_gone


def env_file(path: Path) -> dict[str, str]:
    """The variables ``DIR/env`` exports, as a shell would read them."""
    line = next(x for x in path.read_text().splitlines() if x.startswith("export "))
    return dict(word.split("=", 1) for word in shlex.split(line.removeprefix("export ")))


def without_querycoord(env: dict[str, str]) -> dict[str, str]:
    """``env`` with no QUERYCOORD_* / ETCDCTL_* variable: what a new shell has."""
    return {k: v for k, v in env.items() if not k.startswith(("QUERYCOORD_", "ETCDCTL_"))}


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querycoord.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def poll(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not after {timeout:g}s: {what}"
        time.sleep(0.2)


def stop(up: Up) -> str:
    """SIGINT; `up` exits 0 and leaves no process; its stderr."""
    up.children()  # the children it runs now (it restarts killed ones), while it is their parent
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(timeout=60) == 0
    up.rest()
    assert not wait_gone(up.children) and not wait_gone(up.etcd)
    return up.proc.stderr.read() if up.proc.stderr else ""


def distribution(address: str) -> querynode_pb2.GetDataDistributionResponse:
    """What the query node at ``address`` itself says it holds."""
    with grpc.insecure_channel(address) as ch:
        return ch.unary_unary(
            "/querycoord.node.QueryNode/GetDataDistribution",
            request_serializer=querynode_pb2.GetDataDistributionRequest.SerializeToString,
            response_deserializer=querynode_pb2.GetDataDistributionResponse.FromString,
        )(querynode_pb2.GetDataDistributionRequest(), timeout=10)


# ----- readers find the cluster ---------------------------------------------------------------------------------------
def test_up_on_the_default_port_writes_an_env_file_readers_use(subprocess_env, tmp_path, default_etcd) -> None:
    with Up(subprocess_env, tmp_path / "up", "--nodes", "1", etcd_port=None) as up:
        addr = up.wait_ready()
        head = "".join(up.out)
        assert re.search(rf"etcd endpoints\s+{default_etcd}\s", head), head
        exported = env_file(up.data_dir / "env")
        assert exported == {"QUERYCOORD_ETCD_ENDPOINTS": default_etcd, "QUERYCOORD_ROOT": up.root,
                            "QUERYCOORD_ADDRESS": addr}, exported
        printed = next(line for line in up.out if line.startswith("export "))
        assert printed.strip() in (up.data_dir / "env").read_text(), "the printed line is the file's line"

        shell = without_querycoord(subprocess_env) | exported
        out = ok(run(shell, "status"))
        assert f"root {up.root}: {addr} leads" in out, out
        ok(run(shell, "collection", "create", "c1", "--segments", "4"))
        out = ok(run(shell, "meta", "show", "collections"))
        assert re.search(r"\bc1\b", out), out
        assert node_rows(ok(run(shell, "nodes"))), "the address from the file reaches the coordinator"
        stop(up)


def test_status_with_no_endpoint_at_all_finds_up_on_the_default_port(subprocess_env, tmp_path, default_etcd) -> None:
    with Up(subprocess_env, tmp_path / "up", "--nodes", "1", etcd_port=None, root="querycoord") as up:
        addr = up.wait_ready()
        bare = without_querycoord(subprocess_env)
        try:
            out = ok(run(bare, "status"))
            assert f"{addr} leads" in out, out
            out = ok(run(bare, "meta", "show", "collections"))
        finally:
            stop(up)


def test_up_takes_a_free_etcd_port_when_the_default_is_taken_and_says_so(subprocess_env, tmp_path,
                                                                           default_etcd) -> None:
    host, port = default_etcd.split(":")
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind((host, int(port)))
        busy.listen()
        with Up(subprocess_env, tmp_path / "up", "--nodes", "0", etcd_port=None) as up:
            up.wait_ready()
            head = "".join(up.out)
            notes = [line for line in up.out if line.startswith("note: ")]
            assert len(notes) == 1 and f"{default_etcd} (etcd's default port) is taken" in notes[0], head
            endpoint = re.search(r"etcd endpoints\s+(\S+)", head).group(1)  # type: ignore[union-attr]
            assert endpoint != default_etcd and endpoint in notes[0], head
            assert env_file(up.data_dir / "env")["QUERYCOORD_ETCD_ENDPOINTS"] == endpoint
            stop(up)
        # An explicit port that is taken is a usage error; nothing is started.
        r = run(subprocess_env, "up", "--etcd-port", port, "--data-dir", str(tmp_path / "explicit"))
        assert r.returncode == 2 and r.stderr.startswith(f"error: --etcd-port {port}: "), r.stderr
        assert not (tmp_path / "explicit" / "etcd").exists()


# ----- coordinator and node deaths ------------------------------------------------------------------------------------
def test_a_sigkilled_coordinator_is_restarted_at_its_address_and_the_cluster_keeps_its_state(subprocess_env,
                                                                                              tmp_path) -> None:
    with Up(subprocess_env, tmp_path / "up", "--nodes", "2", "--http-listen", "127.0.0.1:0") as up:
        addr = up.wait_ready()
        head = "".join(up.out)
        coord_pid = int(re.search(r"coordinator\s+\S+\s+\(leader, pid (\d+)", head).group(1))  # type: ignore[union-attr]
        status = re.search(r"status page\s+(http://\S+/)", head).group(1)  # type: ignore[union-attr]
        env = without_querycoord(subprocess_env) | env_file(up.data_dir / "env")
        ok(run(env, "collection", "create", "c1", "--segments", "40", "--partitions", "2"))
        ok(run(env, "collection", "load", "c1"))
        before = node_rows(ok(run(env, "nodes")))
        addresses = {int(i): a for i, a in re.findall(r"query node (\d+)\s+(\S+)", head)}
        assert set(addresses) == set(before) and len(before) == 2, (head, before)

        os.kill(coord_pid, signal.SIGKILL)
        line = up.wait_line("restarted: coordinator")
        assert f"coordinator {addr} " in line, line
        new_pid = int(re.search(r"pid (\d+)", line).group(1))  # type: ignore[union-attr]
        assert new_pid != coord_pid and up.proc.poll() is None, "`up` keeps running"

        def leads_with_the_same_nodes() -> bool:
            r = run(env, "nodes")
            rows = node_rows(r.stdout) if r.returncode == 0 else {}
            return set(rows) == set(before) and all(row[2] == "online" for row in rows.values())

        poll(leads_with_the_same_nodes, "the restarted coordinator leads and lists the same nodes online")
        out = ok(run(env, "status"))
        assert re.search(rf"{re.escape(addr)}\s+\d+\s+leader", out), out
        # Still loaded: the nodes themselves hold every segment, as before the kill.
        held = {nid: {s.segment_id for s in distribution(a).segments} for nid, a in addresses.items()}
        assert sum(len(s) for s in held.values()) == 40 and all(held.values()), held
        out = ok(run(env, "collection", "show", "c1"))
        assert re.search(r"c1\s+2\s+40\s+collection\s+100%", out), out
        with urllib.request.urlopen(status + "readyz", timeout=10) as resp:  # the same HTTP address as before
            assert resp.status == 200

        # A query node SIGKILLed: restarted under its id; the checker gives it segments back.
        victim, victim_addr = min(addresses.items())
        victim_pid = int(re.search(rf"query node {victim}\s+\S+\s+\(pid (\d+)", head).group(1))  # type: ignore[union-attr]
        os.kill(victim_pid, signal.SIGKILL)
        line = up.wait_line(f"restarted: query node {victim} ")

        def whole_again() -> bool:
            rows = node_rows(ok(run(env, "nodes")))
            return set(rows) == set(before) and all(r[2] == "online" for r in rows.values())

        poll(whole_again, f"query node {victim} online again under its id")
        err = stop(up)
    assert re.search(rf"warning: coordinator \(pid {coord_pid}\) exited with code -9 \(SIGKILL\); restarting it "
                     r"\(restart 1\)", err), err
    assert re.search(rf"warning: query node {victim} \({re.escape(victim_addr)}, pid {victim_pid}\) exited with "
                     r"code -9 \(SIGKILL\); restarting it under its id \(restart 1\)", err), err
    assert "Traceback" not in err, err


def test_restart_budget_allows_five_exits_a_minute() -> None:
    budget = RestartBudget(limit=5, window=60.0)
    assert all(budget.spend(t) for t in (0, 1, 2, 3, 4))
    assert not budget.spend(5), "a sixth exit within the minute is one too many"
    fresh = RestartBudget(limit=5, window=60.0)
    assert all(fresh.spend(t * 13.0) for t in range(20)), "exits spread out never exhaust it"


# ----- what servers take, passed through ------------------------------------------------------------------------------
def test_up_runs_a_tls_cluster_with_json_logs_and_its_root_from_the_config_file(subprocess_env, tmp_path) -> None:
    ca = make_authority(tmp_path / "pki")
    cert = ca.issue("querycoord-up")
    config = tmp_path / "up.toml"
    root = f"from-file-{os.getpid()}"
    config.write_text(f'[coord]\nroot = "{root}"\n\n[tls]\nca = "{ca.ca_file}"\ncert = "{cert.cert}"\n'
                      f'key = "{cert.key}"\n')
    env = without_querycoord(subprocess_env)
    data = tmp_path / "fromfile"
    proc = subprocess.Popen([sys.executable, "-m", "querycoord.cli", "up", "--config", str(config), "--log-format",
                             "json", "--listen", "127.0.0.1:0", "--etcd-port", "0", "--ttl", "2", "--nodes", "1",
                             "--data-dir", str(data)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        head = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            head += line
            if line.startswith("ready:"):
                break
        assert re.search(rf"meta root\s+{root}$", head, re.M), head
        addr = re.search(r"coordinator\s+(\S+)", head).group(1)  # type: ignore[union-attr]
        exported = env_file(data / "env")
        assert exported["QUERYCOORD_ROOT"] == root and exported["QUERYCOORD_TLS_CA"] == str(ca.ca_file), exported

        out = ok(run(env, "--address", addr, "--tls-ca", str(ca.ca_file), "nodes"))
        assert len(node_rows(out)) == 1, out
        plain = run(env, "--address", addr, "--timeout", "3", "nodes")
        assert plain.returncode == 1 and "Traceback" not in plain.stderr, plain.stderr
        out = ok(run(without_querycoord(env) | exported, "status"))
        assert f"root {root}: {addr} leads" in out, out

        logs = sorted(p.name for p in data.glob("*.log"))
        node_id = re.search(r"query node (\d+)", head).group(1)  # type: ignore[union-attr]
        assert logs == ["coordinator-1.log", "etcd.log", f"querynode-{node_id}.log"], logs
        for name in ("coordinator-1.log", f"querynode-{node_id}.log"):
            first = (data / name).read_text().splitlines()[0]
            assert json.loads(first), f"{name} is not JSON lines: {first!r}"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert not wait_gone(lambda: procs.pids_matching(f"--root {root}") + procs.etcd_pids_under(data)), \
            "a process outlived `up`"
