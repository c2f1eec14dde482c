"""Answers the command line gets right: a move of a collection that is not loaded is NOT_FOUND, collections named by
name or id everywhere, a request lost in flight said to be maybe queued, bad addresses and PEM files refused at
once, an HTTP port told apart from the gRPC one, HEAD requests, counts and sizes as people write them, every node
holding a copy in `meta show`, and the defaults `config show` knows.

Real processes throughout: the CLI as a subprocess; coordinators and query nodes as processes on a real etcd; the
coordinator killed with SIGKILL while a request waits.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import signal
import subprocess
from pathlib import Path

import grpc
import pytest

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querynode_pb2, querynode_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.common.wording import mib, plural
from querycoord.net.client import QueryCoordClient
from tests.spawn import Processes, Spawned
from tests.test_cli_messages import arun, free_port, one_error_line, run

NODE = ("--ttl", "10", "--capacity-mb", "1024")


def lines_of(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip()]


# ----- wording: the one helper for counts and sizes -------------------------------------------------------------------
def test_counts_and_sizes_read_as_people_write_them() -> None:
    assert [plural(n, "segment") for n in (0, 1, 2, 1234)] == ["0 segments", "1 segment", "2 segments",
                                                                "1,234 segments"]
    assert (plural(1, "scan plan"), plural(3, "scan plan"), plural(2, "copy"), plural(2, "child"),
            plural(1, "DM channel"), plural(2, "DM channel")) == (
        "1 scan plan", "3 scan plans", "2 copies", "2 children", "1 DM channel", "2 DM channels")
    mb = 1 << 20
    assert [mib(n) for n in (0, 500, int(0.01 * mb), int(0.5 * mb), mb, int(9.95 * mb), 1024 * mb)] == [
        "0 MiB", "500 B", "10 KiB", "512 KiB", "1.0 MiB", "9.9 MiB", "1,024 MiB"]


# ----- usage errors at once: --address, PEM files, log levels ---------------------------------------------------------
@pytest.mark.parametrize(("address", "says"), [
    ("127.0.0.1", "'127.0.0.1' is not HOST:PORT"),
    ("127.0.0.1:99999", "port 99999 is out of range (1 to 65535)"),
    ("localhost:http", "'localhost:http' is not HOST:PORT"),
    ("127.0.0.1:0", "port 0 is out of range"),
    ("127.0.0.1:19531,10.0.0.1", "'10.0.0.1' is not HOST:PORT"),
])
@pytest.mark.parametrize("command", [("nodes",), ("tasks",), ("collection", "show"), ("balance", "status")])
def test_a_bad_address_is_a_usage_error_at_once(subprocess_env, address, says, command) -> None:
    """Exit 2 naming --address, before anything is dialled (a 60 s timeout is not waited out)."""
    r = run(subprocess_env, *command, "--address", address, "--timeout", "60", timeout=30)
    assert r.returncode == 2, r
    one_error_line(r, "--address", says)


def test_a_tls_ca_that_is_no_certificate_is_one_line(subprocess_env, tmp_path) -> None:
    """Clients and servers alike: one line naming the option and the file, exit 2, none of gRPC's own lines."""
    bogus = tmp_path / "ca.pem"
    bogus.write_text("this is not a certificate\n")
    key = tmp_path / "key.pem"
    key.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    for argv in (["nodes", "--tls-ca", str(bogus), "--address", "127.0.0.1:1"],
                 ["--tls-ca", str(bogus), "coord", "--etcd-endpoints", "127.0.0.1:1", "--root", "r"],
                 ["querynode", "--tls-ca", str(bogus), "--etcd-endpoints", "127.0.0.1:1", "--root", "r"]):
        r = run(subprocess_env, *argv, timeout=30)
        assert r.returncode == 2, r
        one_error_line(r, f"--tls-ca {bogus} is not a PEM certificate")
    r = run(subprocess_env, "nodes", "--tls-ca", str(key), "--tls-cert", str(key), "--tls-key", str(key),
            "--address", "127.0.0.1:1", timeout=30)
    assert r.returncode == 2, r
    one_error_line(r, f"--tls-key {key} is not a PEM private key")
    env = {**subprocess_env, "QUERYCOORD_TLS_CA": str(bogus)}
    one_error_line(run(env, "nodes", "--address", "127.0.0.1:1", timeout=30),
                   f"$QUERYCOORD_TLS_CA {bogus} is not a PEM certificate")


def test_log_levels_trace_works_and_a_bad_one_names_its_option(subprocess_env) -> None:
    addr = f"127.0.0.1:{free_port()}"
    for level in ("TRACE", "success"):
        r = run(subprocess_env, "--log-level", level, "nodes", "--address", addr, "--timeout", "1")
        assert r.returncode == 1, r
        assert "Unknown level" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("error: no leading coordinator answered"), r.stderr
    r = run(subprocess_env, "nodes", "--log-level", "LOUD", "--address", addr)
    assert r.returncode == 2
    one_error_line(r, "--log-level", "'LOUD'")
    r = run({**subprocess_env, "QUERYCOORD_LOG_LEVEL": "LOUD"}, "nodes", "--address", addr)
    assert r.returncode == 2
    one_error_line(r, "$QUERYCOORD_LOG_LEVEL", "'LOUD'")


def test_config_show_prints_the_defaults_it_knows(subprocess_env) -> None:
    given = ("--etcd-endpoints", "127.0.0.1:2379", "--root", "r")
    r = run(subprocess_env, "config", "show", *given, "-o", "json")
    assert r.returncode == 0, r
    shown = {s["key"]: s for s in json.loads(r.stdout)["settings"]}
    assert shown["grpc.max_message_mb"]["value"] == 16 and shown["grpc.max_message_mb"]["source"] == "default"
    for switch in ("grpc.insecure", "tls.client_auth", "tls.http"):
        assert shown[switch]["value"] is False, shown[switch]
    out = run(subprocess_env, "config", "show", *given).stdout
    table = {line.split()[0]: line.split()[1] for line in out.splitlines()
             if line and not line.startswith(("configuration file", "KEY"))}
    assert table["grpc.max_message_mb"] == "16" and table["grpc.insecure"] == "False", table
    r = run(subprocess_env, "config", "show", *given, "-o", "json", "--grpc-max-message-mb", "32", "--insecure")
    shown = {s["key"]: s for s in json.loads(r.stdout)["settings"]}
    assert (shown["grpc.max_message_mb"]["value"], shown["grpc.insecure"]["value"]) == (32.0, True), shown


# ----- a coordinator with its HTTP endpoint: its port as --address, HEAD requests ------------------------------------
async def test_an_http_port_as_address_is_named_and_head_answers_like_get(subprocess_env, etcd: EtcdCluster,
                                                                            root_path, tmp_path) -> None:
    async with Processes(etcd, root_path, tmp_path) as p:
        coord = await p.coordinator("--http-listen", "127.0.0.1:0")
        await coord.wait_event("leader", timeout=30)
        http_address = str(coord.ready["http_address"])
        r = await arun(subprocess_env, "nodes", "--address", http_address, "--timeout", "30", timeout=20)
        one_error_line(r, f"{http_address}: that is an HTTP server (the coordinator's --http-listen?), "
                          "not its gRPC port")
        assert "nothing listens there" not in r.stderr
        host, port = http_address.rsplit(":", 1)
        for path in ("/metrics", "/healthz", "/readyz", "/", "/status.json"):
            got = await asyncio.to_thread(_request, host, int(port), "GET", path)
            head = await asyncio.to_thread(_request, host, int(port), "HEAD", path)
            assert head[0] == got[0] and head[0] != 501, (path, head[0], got[0])
            assert head[1].get("content-type") == got[1].get("content-type"), (path, head[1], got[1])
            assert head[2] == b"" and got[2], (path, head[2][:80])


def _request(host: str, port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# ----- a cluster: balance and tasks by name, NOT_FOUND, sizes and counts, meta show of replicas ----------------------
async def _node_holdings(node: Spawned) -> dict[int, set[int]]:
    """segment id -> {node id}: what the query node itself reports (GetDataDistribution)."""
    async with grpc.aio.insecure_channel(node.address) as ch:
        d = await querynode_pb2_grpc.QueryNodeStub(ch).GetDataDistribution(
            querynode_pb2.GetDataDistributionRequest(), timeout=30)
    return {s.segment_id: {d.node_id} for s in d.segments}


async def test_balance_and_tasks_take_names_and_a_move_of_nothing_loaded_is_not_found(
        subprocess_env, etcd: EtcdCluster, root_path, tmp_path) -> None:
    async with Processes(etcd, root_path, tmp_path) as p:
        coord = await p.coordinator()
        await coord.wait_event("leader", timeout=30)
        nodes = [await p.query_node(*NODE, name=f"qn{i}") for i in range(2)]
        addr = coord.address

        async def cli(*args: str) -> tuple[int, str, str]:
            r = await arun(subprocess_env, *args, "--address", addr, "--timeout", "30", timeout=120)
            assert "Traceback" not in r.stderr, r.stderr
            return r.returncode, r.stdout, r.stderr

        # Sizes and counts as people write them.
        code, out, err = await cli("collection", "create", "tiny", "--partitions", "1", "--channels", "1",
                                   "--segments", "1", "--segment-mb", "0.01")
        assert code == 0, err
        assert re.search(r": 1 partition, 1 DM channel, 1 segment of 10 KiB in ", out), out
        code, _, err = await cli("collection", "create", "huge", "--partitions", "5000")
        assert code == 1 and "out of range (limit 1..4096, or 0 for the default)" in err, err
        code, out, err = await cli("collection", "create", "c", "--partitions", "2", "--segments", "8",
                                   "--channels", "2")
        assert code == 0, err
        cid = int(re.search(r"\(id (\d+)\)", out).group(1))  # type: ignore[union-attr]

        # A move of a collection that is not loaded: NOT_FOUND from the coordinator, whoever asks.
        source = str(nodes[0].node_id)
        code, out, err = await cli("balance", "--source", source, "--collection", "99999")
        assert code == 1 and "finished" not in out, (out, err)
        one_error_line(_completed(code, out, err), "collection 99999 is not loaded")
        code, out, err = await cli("balance", "--source", source, "--collection", "c")
        assert code == 1, (out, err)
        one_error_line(_completed(code, out, err), f"collection {cid} is not loaded")
        code, out, err = await cli("balance", "--source", source, "--collection", "nosuch")
        assert code == 1, (out, err)
        one_error_line(_completed(code, out, err), "nosuch")
        async with QueryCoordClient(addr, deadline=30) as c:
            resp = await c.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[nodes[0].node_id],
                                                                      collection_id=99999))
        assert resp.status.error_code == common_pb2.NOT_FOUND, resp
        assert "99999 is not loaded" in resp.status.reason, resp

        # Loaded with two replicas: `meta show` lists both nodes of every segment, as the nodes report them.
        code, out, err = await cli("collection", "load", "c", "--replicas", "2")
        assert code == 0, (out, err)
        held: dict[int, set[int]] = {}
        for node in nodes:
            for sid, on in (await _node_holdings(node)).items():
                held.setdefault(sid, set()).update(on)
        assert len(held) == 8 and all(len(v) == 2 for v in held.values()), held
        r = await arun(subprocess_env, "meta", "show", "segments", "--etcd-endpoints", ",".join(etcd.endpoints),
                       "--root", root_path)
        assert r.returncode == 0, r
        rows = lines_of(r.stdout)
        head = rows[1].split()
        assert head[-1] == "NODES", rows[1]
        shown = {int(line.split()[0]): {int(n) for n in re.findall(r"(?:^|, )(\d+) \(replica", line.split(
            maxsplit=head.index("NODES"))[-1])} for line in rows[3:]}
        assert shown == held, (shown, held, r.stdout)
        r = await arun(subprocess_env, "meta", "show", "channels", "--etcd-endpoints", ",".join(etcd.endpoints),
                       "--root", root_path)
        assert r.returncode == 0, r
        dm = [line for line in lines_of(r.stdout)[3:] if " dm " in f" {line} "]
        assert len(dm) == 2 and all(line.count("(replica") == 2 for line in dm), r.stdout

        # By name: a move of this collection's segments, its tasks listed by name as by id.
        code, out, err = await cli("balance", "--source", source, "--collection", "c", "--no-wait")
        assert code == 0 and "balance queued as task #" in out, (out, err)
        for ref in ("c", str(cid)):
            code, out, err = await cli("tasks", "--history", "--collection", ref, "-o", "json")
            assert code == 0, err
            assert {t["collection_id"] for t in json.loads(out)} == {cid}, out
        code, out, err = await cli("tasks", "--collection", "nosuch")
        assert code == 1, (out, err)
        one_error_line(_completed(code, out, err), "nosuch")


def _completed(code: int, out: str, err: str) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], code, out, err)


# ----- the coordinator dies while a request waits ---------------------------------------------------------------------
async def test_a_request_lost_with_its_coordinator_says_it_may_have_been_queued(
        subprocess_env, etcd: EtcdCluster, root_path, tmp_path: Path) -> None:
    """A release waits until done; its coordinator is SIGKILLed meanwhile. The client says the request may have
    been queued and how to check, not "nothing listens there"; a new coordinator then finishes the release (it
    was queued: persisted in etcd)."""
    async with Processes(etcd, root_path, tmp_path) as p:
        coord = await p.coordinator()
        await coord.wait_event("leader", timeout=30)
        await p.query_node(*NODE, "--latency-ms", "4000", name="slow")
        addr = coord.address
        r = await arun(subprocess_env, "collection", "create", "c", "--segments", "2", "--address", addr)
        assert r.returncode == 0, r
        cid = int(re.search(r"\(id (\d+)\)", r.stdout).group(1))  # type: ignore[union-attr]
        r = await arun(subprocess_env, "collection", "load", "c", "--address", addr, "--timeout", "120",
                       timeout=180)
        assert r.returncode == 0, r

        release = asyncio.create_task(arun(subprocess_env, "collection", "release", "c", "--address", addr,
                                           "--timeout", "10", timeout=120))
        async with QueryCoordClient(addr, deadline=30) as c:
            for _ in range(600):  # the release is queued on the leader: the request is in flight
                trees = (await c.query("ListTasks", qc.ListTasksRequest())).trees
                if any(t.trigger.kind == qc.TASK_KIND_RELEASE_COLLECTION for t in trees):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the release was never queued")
        assert not release.done()
        coord.signal(signal.SIGKILL)
        r = await release
        line = one_error_line(r, f"{addr}: it went away while the request was in flight",
                              f"the request may have been queued at {addr}", "`querycoord tasks`")
        assert "nothing listens there" not in line, line

        # It was queued: a new coordinator finishes the release.
        coord2 = await p.coordinator(name="coord2")
        await coord2.wait_event("leader", timeout=60)
        async with QueryCoordClient(coord2.address, deadline=60) as c:
            for _ in range(1200):
                shown = await c.query("ShowCollections", qc.ShowCollectionsRequest())
                if cid not in {info.collection_id for info in shown.collections}:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"collection {cid} still loaded: {shown}")
        r = await arun(subprocess_env, "tasks", "--history", "--address", coord2.address, "-o", "json")
        assert r.returncode == 0, r
        done = [t for t in json.loads(r.stdout) if t["collection_id"] == cid and t["kind"] == "ReleaseCollection"]
        assert done and done[0]["outcome"] == "DONE", r.stdout

