"""Metrics and health over HTTP: real coordinators and nodes as processes, scraped during a load, a node kill and a
leader kill; the probes of a leader, a standby and the nodes; meta's observers against a real etcd."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from meta.client import connect
from meta.config import EtcdConfig
from meta.errors import MetaUnavailable, NotLeader
from meta.fence import Fence
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.common import metrics
from querycoord.net.client import QueryCoordClient
from tests.spawn import MID_LOAD_FLAGS, Spawned, spawn_coordinator, spawn_query_node, spawn_stream_node

HTTP = ("--http-listen", "127.0.0.1:0")


def sample(name: str, **labels: str) -> float:
    """A sample of this process's registry (0 until the series exists)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(proc: Spawned, path: str) -> tuple[int, str]:
    """GET ``path`` from the process's HTTP server (found in its ready event), off the event loop."""
    return await asyncio.to_thread(_get, f"http://{proc.ready['http_address']}{path}")


async def probe(proc: Spawned, path: str) -> tuple[int, dict[str, Any]]:
    status, body = await get(proc, path)
    return status, json.loads(body)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(proc: Spawned) -> Samples:
    status, text = await get(proc, "/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (0 when none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def has(samples: Samples, name: str) -> bool:
    return any(n == name for n, _ in samples)


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)


async def test_metrics_move_through_a_load_a_node_kill_and_a_leader_kill(
    etcd: EtcdCluster, root_path: str, kv: MetaKV, tmp_path: Path
) -> None:
    procs: list[Spawned] = []
    try:
        first = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, *HTTP, name="coord-1")
        procs.append(first)
        await first.next_event("leader", timeout=60)
        second = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, *HTTP, name="coord-2")
        procs.append(second)
        nodes = []
        for i in range(3):
            nodes.append(await spawn_query_node(etcd, root_path, tmp_path, "--ttl", "2", "--latency-ms", "30", *HTTP,
                                                name=f"querynode-{i}"))
            procs.append(nodes[-1])

        # Probes: the leader, the standby, a node.
        assert await probe(first, "/healthz") == (200, {"status": "ok", "role": "leader", "address": first.address})
        status, body = await probe(first, "/readyz")
        assert (status, body["role"]) == (200, "leader") and body["fence_revision"] > 0
        assert (await probe(first, "/readyz?role=leader"))[0] == 200
        assert await probe(second, "/healthz") == (200, {"status": "ok", "role": "standby",
                                                          "address": second.address})
        status, body = await probe(second, "/readyz")
        assert (status, body["role"], body["leader"]) == (200, "standby", first.address), body
        status, body = await probe(second, "/readyz?role=leader")
        assert (status, body["reason"]) == (503, "not the leader")
        for node in nodes:
            assert await probe(node, "/healthz") == (200, {"status": "ok", "role": "query node",
                                                            "node_id": node.node_id})
            assert await probe(node, "/readyz") == (200, {"status": "ok", "role": "query node",
                                                           "node_id": node.node_id})
        assert (await get(first, "/nothing"))[0] == 404

        leader_before, standby_before = await scrape(first), await scrape(second)
        assert value(leader_before, "querycoord_leader") == 1 and value(standby_before, "querycoord_leader") == 0
        assert value(leader_before, "querycoord_leader_changes_total", change="acquired") == 1
        assert value(standby_before, "querycoord_leader_changes_total", change="acquired") == 0
        assert value(leader_before, "querycoord_sessions_online", role="querycoord") == 2
        await until("3 query nodes online", lambda: _scraped_equals(first, "querycoord_sessions_online", 3,
                                                                      role="querynode"))
        assert value(leader_before, "querycoord_etcd_reachable") == 1
        assert value(leader_before, "querycoord_etcd_db_size_bytes") > 0
        assert value(leader_before, "querycoord_etcd_alarm", alarm="NOSPACE") == 0
        assert value(leader_before, "querycoord_etcd_nospace") == 0
        assert has(leader_before, "querycoord_etcd_quota_bytes")
        await until("the standby watches etcd's space too", lambda: _scraped_above(
            second, "querycoord_etcd_db_size_bytes", 0))
        assert value(leader_before, "querycoord_etcd_request_duration_seconds_count") > 0
        assert not has(standby_before, "querycoord_tasks"), "a standby runs no tasks"
        # Both follow the (local) catalog for their checker from start-up: a copy current up to some revision.
        for c in (first, second):
            await until("the catalog copied for the checker", lambda c=c: _scraped_above(
                c, "querycoord_checker_targets_revision", 0))

        # A load, scraped while it runs and once it is done.
        client = QueryCoordClient([first.address, second.address], deadline=60)
        desc, _ = await CatalogStore(kv).create_bulk_collection("metrics", num_partitions=2, num_segments=200)
        cid = desc.collection_id
        done_before = value(leader_before, "querycoord_tasks_finished_total", kind="load_collection", result="done")
        r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r
        seen_running = False
        while not await _loaded(client, cid):
            s = await scrape(first)
            seen_running |= value(s, "querycoord_tasks", kind="load_collection", state="running") == 1
        assert seen_running, "the load showed as running while it ran"
        loaded = await scrape(first)
        assert value(loaded, "querycoord_tasks_finished_total", kind="load_collection", trigger="grpc_request",
                     result="done") == done_before + 1
        assert value(loaded, "querycoord_task_duration_seconds_count", kind="load_collection", result="done") >= 1
        assert value(loaded, "querycoord_child_task_duration_seconds_count", kind="load_segment") > 0
        assert value(loaded, "querycoord_node_segments") == 200
        assert value(loaded, "querycoord_node_memory_used_bytes") > 0
        assert value(loaded, "querycoord_query_nodes_online") == 3
        node_samples = [await scrape(n) for n in nodes]
        held = [value(s, "querycoord_querynode_segments") for s in node_samples]
        assert sum(held) == 200
        assert all(value(s, "querycoord_querynode_memory_used_bytes") > 0 for s in node_samples)
        fence = value(loaded, "querycoord_leader_fence_revision")
        assert fence > 0 and all(value(s, "querycoord_querynode_fence_revision") == fence for s in node_samples)

        # A node killed: its session goes, it is forgotten, and a repair loads its segments again (queued by its
        # forget, trigger="node_down", or by a checker pass that found them missing first, trigger="checker").
        victim = max(nodes, key=lambda n: held[nodes.index(n)])
        repairs_before = value(loaded, "querycoord_tasks_finished_total", kind="repair")
        await victim.kill()
        await until("the killed node's session gone", lambda: _scraped_equals(first, "querycoord_sessions_online", 2,
                                                                               role="querynode"))
        await until("a repair", lambda: _scraped_above(first, "querycoord_tasks_finished_total", repairs_before,
                                                       kind="repair"))
        await until("its segments moved", lambda: _scraped_equals(first, "querycoord_node_segments", 0,
                                                                  node_id=str(victim.node_id)))
        after_node_kill = await scrape(first)
        assert value(after_node_kill, "querycoord_node_segments") == 200
        assert value(after_node_kill, "querycoord_query_nodes_online") == 2
        # Passes finished, each with its wall and CPU seconds summed.
        passes = value(after_node_kill, "querycoord_checker_passes_total")
        assert 1 <= passes <= value(after_node_kill, "querycoord_checker_runs_total")
        assert value(after_node_kill, "querycoord_checker_pass_seconds_total") > 0
        assert value(after_node_kill, "querycoord_checker_pass_cpu_seconds_total") > 0
        assert has(after_node_kill, "querycoord_checker_skipped_collections_total")

        # The leader killed: the standby takes over.
        await first.kill()
        await second.next_event("leader", timeout=60)
        assert await probe(second, "/healthz") == (200, {"status": "ok", "role": "leader", "address": second.address})
        status, body = await probe(second, "/readyz?role=leader")
        assert (status, body["role"]) == (200, "leader")
        new_leader = await scrape(second)
        assert value(new_leader, "querycoord_leader") == 1
        assert value(new_leader, "querycoord_leader_changes_total", change="acquired") == 1
        assert value(new_leader, "querycoord_leader_takeover_seconds_count") == 1
        assert value(new_leader, "querycoord_leader_takeover_seconds_sum") > 0
        print(f"takeover {value(new_leader, 'querycoord_leader_takeover_seconds_sum'):.3f}s; load of 200 segments "
              f"{value(loaded, 'querycoord_task_duration_seconds_sum', kind='load_collection'):.2f}s; etcd calls "
              f"{value(loaded, 'querycoord_etcd_request_duration_seconds_count'):.0f} on the first leader")
        await until("the dead leader's session gone", lambda: _scraped_equals(second, "querycoord_sessions_online", 1,
                                                                               role="querycoord"))
        await until("the new leader sees what nodes hold", lambda: _scraped_equals(second, "querycoord_node_segments",
                                                                                 200))
        await client.close()
    finally:
        for p in procs:
            await p.kill()


async def test_stream_node_probes_and_metrics(etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    coord = await spawn_coordinator(etcd, root_path, tmp_path, *HTTP, name="coord")
    try:
        await coord.next_event("leader", timeout=60)
        node = await spawn_stream_node(etcd, root_path, tmp_path, "--vgroups", "1", "--heartbeat-ms", "100", *HTTP)
        try:
            assert await probe(node, "/healthz") == (200, {"status": "ok", "role": "stream node",
                                                            "node_id": node.node_id})
            assert (await probe(node, "/readyz"))[0] == 200
            assert (await probe(node, "/readyz?role=leader"))[0] == 503
            await until("heartbeats answered", lambda: _scraped_above(node, "querycoord_streamnode_heartbeats_total",
                                                                      0, result="replied"))
            s = await scrape(node)
            assert value(s, "querycoord_streamnode_session_up") == 1
            assert value(s, "querycoord_streamnode_vgroups") == 1
            assert has(s, "process_resident_memory_bytes"), "the process collector comes with the registry"
            await until("heartbeats handled", lambda: _scraped_above(
                coord, "querycoord_stream_heartbeat_duration_seconds_count", 0))
            c = await scrape(coord)
            assert value(c, "querycoord_sessions_online", role="streamnode") == 1
            assert has(c, "querycoord_streams") and value(c, "querycoord_streams") == 0
        finally:
            await node.kill()
    finally:
        await coord.kill()


def test_operation_labels_stay_few() -> None:
    label = metrics.operation_label
    assert label("get queryCoord-taskInfo/17") == "get"
    assert label("register session session/querynode-3") == "register session"
    assert label("task store (2/3)") == "task store"
    assert label("Maintenance.Status") == "Maintenance.Status"
    assert label("stop stream 12") == "stop stream"
    assert label("42") == "other"
    known = set(metrics.OPERATION_LABELS)
    try:
        for i in range(2 * metrics.MAX_OPERATIONS):
            label("made_up_" + "".join(chr(97 + int(d)) for d in str(i)) + " key/1")
        assert label("yet_another_operation") == "other", "past the bound every new name is 'other'"
        assert label("get queryCoord-taskInfo/18") == "get", "names seen before keep their label"
    finally:
        metrics.OPERATION_LABELS.clear()
        metrics.OPERATION_LABELS.update(known)


async def test_meta_observers_count_refused_fenced_writes_retries_and_unavailable(
    etcd: EtcdCluster, root_path: str, unused_tcp_port: int
) -> None:
    metrics.install()
    client = await connect(etcd.config())
    try:
        refused = sample("querycoord_fenced_writes_refused_total")
        stale = MetaKV(client, root_path).fenced(Fence(f"/{root_path}/no-such-leader", 12345))
        with pytest.raises(NotLeader):
            await stale.save("fenced/k", "v")
        assert sample("querycoord_fenced_writes_refused_total") == refused + 1
        assert sample("querycoord_etcd_request_duration_seconds_sum", operation="save") > 0
    finally:
        await client.close()

    dead = EtcdConfig.from_endpoints(f"127.0.0.1:{unused_tcp_port}", call_timeout=0.2, deadline=1.0)
    retries = sample("querycoord_etcd_retries_total", operation="Maintenance.Status")
    unavailable = sample("querycoord_etcd_unavailable_total", operation="Maintenance.Status")
    with pytest.raises(MetaUnavailable):
        await connect(dead)
    assert sample("querycoord_etcd_retries_total", operation="Maintenance.Status") > retries
    assert sample("querycoord_etcd_unavailable_total", operation="Maintenance.Status") == unavailable + 1


async def _loaded(client: QueryCoordClient, cid: int) -> bool:
    show = await client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    return bool(show.status.error_code == 0 and show.collections[0].in_memory_percentage == 100)


async def _scraped_equals(proc: Spawned, name: str, expected: float, **labels: str) -> bool:
    return value(await scrape(proc), name, **labels) == expected


async def _scraped_above(proc: Spawned, name: str, floor: float, **labels: str) -> bool:
    return value(await scrape(proc), name, **labels) > floor


async def test_a_stopped_coordinator_reports_how_long_its_loop_was_blocked(
    etcd: EtcdCluster, root_path: str, tmp_path: Path
) -> None:
    """A process stopped by SIGSTOP runs nothing, as a loop held by one long computation runs nothing else: once it
    runs again, it counts the block and warns of it (the block is over a third of its 3 s session TTL)."""
    coord = await spawn_coordinator(etcd, root_path, tmp_path, *HTTP, "--ttl", "3", name="coord-stall",
                                    log_level="INFO")
    try:
        await coord.next_event("leader", timeout=60)
        os.kill(coord.proc.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        await asyncio.sleep(1.5)
        held = time.monotonic() - stopped  # taken before SIGCONT: at most how long it was stopped
        os.kill(coord.proc.pid, signal.SIGCONT)
        await until("the block counted", lambda: _scraped_at_least(coord, "querycoord_event_loop_blocked_seconds_count",
                                                                     1))
        samples = await scrape(coord)
        # The watch woke at most INTERVAL (0.1 s) before the stop: its lateness covers the rest of the stop.
        assert value(samples, "querycoord_event_loop_blocked_max_seconds") >= held - 0.1 - 0.05
        await until("the warning", lambda: _logged(coord, "the event loop was blocked for"))
    finally:
        await coord.kill()


async def _scraped_at_least(proc: Spawned, name: str, least: float) -> bool:
    return value(await scrape(proc), name) >= least


async def _logged(proc: Spawned, text: str) -> bool:
    return text in proc.log_tail(200)
