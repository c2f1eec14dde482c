"""CheckHealth, Explain, `querycoord health|explain`, the waits of `tasks show` and the health gauges, on a real
cluster: real etcd, a real coordinator and real query nodes on loopback gRPC, nodes stopped for real (their
sessions revoked), and the CLI as real processes. Every assertion is a fact that must hold once waited for, never
how fast."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import grpc

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.nodes.querynode import FaultConfig
from querycoord.security.grpc_channels import make_channel
from querycoord.serving.coordinator_metrics import coordinator_families
from tests.cluster import MiB, QueryCluster, fast_scheduler, running_cluster, until
from tests.test_cli import cli, ok

OK = common_pb2.SUCCESS


async def call(c: QueryCluster, method: str, request: Any) -> Any:
    assert c.client is not None
    resp = await c.client.query(method, request)
    assert resp.status.error_code == OK, resp.status
    return resp


async def run_cli(env: dict[str, str], address: str, *args: str) -> Any:
    return await asyncio.to_thread(cli, env, address, *args)


async def gauges(c: QueryCluster) -> dict[tuple[str, tuple[str, ...]], float]:
    """The leader's scrape-time gauges: (name, label values) -> value."""
    out = {}
    for family in await coordinator_families(c.coords[0].coord):
        for s in family.samples:
            out[(s.name, tuple(s.labels.values()))] = s.value
    return out


async def target_ids(c: QueryCluster, cid: int) -> list[int]:
    catalog = c.coords[0].coord.catalog
    assert catalog is not None
    desc = await catalog.describe_collection(cid)
    ids: list[int] = []
    for p in desc.partitions:
        _chans, binlogs = await catalog.get_recovery_info(cid, p.partition_id)
        ids += [b.segment_id for b in binlogs]
    return sorted(ids)


async def test_green_then_yellow_then_red_with_what_is_missing_and_why(
        etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]) -> None:
    async with running_cluster(etcd, root_path, [None, None]) as c:
        cid = await c.create_collection("twice", partitions=1, segments=10, channels=2)
        await call(c, "LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
        await c.wait_loaded(cid)
        await c.wait_idle()
        lead = c.coords[0].coord.leadership
        assert lead is not None
        address = c.coords[0].address
        channels = sorted(lead.meta.dm_channel_copies(cid))
        ids = await target_ids(c, cid)
        assert len(channels) == 2 and len(ids) == 10

        h = await call(c, "CheckHealth", qc.CheckHealthRequest())
        [col] = h.collections
        assert (h.state, col.state, col.name, col.percentage, col.missing) == (
            qc.HEALTH_STATE_GREEN, qc.HEALTH_STATE_GREEN, "twice", 100, "")
        assert [(r.whole, r.percentage, r.missing_segments) for r in col.replicas] == [(True, 100, 0)] * 2
        ex = await call(c, "Explain", qc.ExplainRequest(collection_name="twice"))
        assert (ex.collection_id, ex.state, list(ex.units)) == (cid, qc.HEALTH_STATE_GREEN, [])
        out = ok(await run_cli(subprocess_env, address, "health"))
        assert re.search(rf"^\s*{cid}\s+twice\s+green\s+100%\s+2/2$", out, re.M), out
        assert "1 collection: 1 green, 0 yellow, 0 red" in out, out
        assert "every replica holds" in ok(await run_cli(subprocess_env, address, "explain", "twice"))

        # One replica loses its only node (its session revoked): that replica is empty, the other serves it all.
        victim = c.nodes[0]
        hurt = lead.meta.replica_of_node(cid, victim.node_id)
        await victim.stop()
        await until("the replica with no node parked", lambda: _parked(lead, cid, hurt))
        h = await call(c, "CheckHealth", qc.CheckHealthRequest(collection_ids=[cid]))
        [col] = h.collections
        assert (h.state, col.state, col.percentage) == (qc.HEALTH_STATE_YELLOW, qc.HEALTH_STATE_YELLOW, 50)
        by = {r.replica_id: r for r in col.replicas}
        assert (by[hurt].whole, by[hurt].missing_segments, list(by[hurt].missing_channels)) == (False, 10, channels)
        assert list(by[hurt].online_node_ids) == [] and all(r.whole for k, r in by.items() if k != hurt)
        assert f"replica {hurt} lacks 10 of 10 segments and DM channels {', '.join(channels)}" in col.missing
        ex = await call(c, "Explain", qc.ExplainRequest(collection_id=cid, segment_limit=3))
        [u] = ex.units
        assert (u.replica_id, u.reason, u.missing_segments, list(u.segment_ids)) == (
            hurt, qc.EXPLAIN_REASON_NO_NODE, 10, ids[:3])
        assert list(u.missing_channels) == channels and "no online query node" in u.reason_text and u.since_ms > 0
        g = await gauges(c)
        assert g[("querycoord_collections_by_health", ("yellow",))] == 1
        assert g[("querycoord_collections_by_health", ("green",))] == 0
        assert g[("querycoord_collection_loaded_percentage", (str(cid),))] == 50

        r = await run_cli(subprocess_env, address, "health", "--fail-on", "yellow")
        assert r.returncode == 3 and re.search(rf"^\s*{cid}\s+twice\s+yellow\s+50%\s+1/2$", r.stdout, re.M), r
        assert f"twice (id {cid}): replica {hurt} lacks 10 of 10 segments" in r.stdout, r.stdout
        ok(await run_cli(subprocess_env, address, "health", "--fail-on", "red"))
        record = json.loads(ok(await run_cli(subprocess_env, address, "health", "twice", "-o", "json")))
        assert record["state"] == "yellow" and [x["health"] for x in record["collections"]] == ["yellow"]
        out = ok(await run_cli(subprocess_env, address, "explain", "twice"))
        assert f"twice (id {cid}): yellow" in out and f"replica {hurt} lacks 10 segments and 2 DM channels" in out
        assert re.search(r"^  why\s+no node: replica \d+ has no online query node", out, re.M), out
        [unit] = json.loads(ok(await run_cli(subprocess_env, address, "explain", str(cid), "-o", "json")))["replicas"]
        assert (unit["id"], unit["reason"], unit["segment_ids"]) == (hurt, "no_node", ids)

        # The other replica's node too: nothing is held by any replica now.
        await c.nodes[1].stop()
        h = await until("red", lambda: _health(c, qc.HEALTH_STATE_RED))
        [col] = h.collections
        assert (col.unserved_segments, col.unserved_channels, col.percentage) == (10, 2, 0)
        assert col.missing.startswith("10 segments and 2 DM channels held by no replica"), col.missing
        g = await gauges(c)
        assert g[("querycoord_collections_by_health", ("red",))] == 1
        assert g[("querycoord_collection_loaded_percentage", (str(cid),))] == 0
        r = await run_cli(subprocess_env, address, "health", "--fail-on", "red")
        assert r.returncode == 3, r


async def _parked(lead: Any, cid: int, replica: int) -> bool:
    return lead.env.parked.get(cid, replica) is not None


async def _health(c: QueryCluster, state: int) -> qc.CheckHealthResponse | None:
    h = await call(c, "CheckHealth", qc.CheckHealthRequest())
    return h if h.state == state else None


async def test_explain_says_no_room_with_the_memory_missing_and_each_nodes_room(
        etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]) -> None:
    async with QueryCluster(etcd, root_path) as c:
        await c.start_coordinator()
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        small = await c.add_node(capacity=8 * MiB)  # cannot take the big node's segments
        big = await c.add_node(capacity=1024 * MiB)
        cid = await c.create_collection("big", partitions=1, segments=20)
        await call(c, "LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        await c.wait_loaded(cid)
        await c.wait_idle()
        on_big = {s.segment_id for s in lead.meta.segments_on_node(big.node_id)}
        assert on_big
        await big.stop()

        async def no_room() -> qc.ExplainUnit | None:
            ex = await call(c, "Explain", qc.ExplainRequest(collection_id=cid))
            return next((u for u in ex.units if u.reason == qc.EXPLAIN_REASON_NO_ROOM), None)

        u = await until("explain says no room", no_room)
        assert u.missing_segments == len(on_big) and set(u.segment_ids) == on_big
        assert u.short_bytes > 0 and set(u.room_bytes) == {small.node_id} and u.room_bytes[small.node_id] < 8 * MiB
        assert "no room for" in u.reason_text and "memory is freed" in u.next and u.since_ms > 0
        h = await call(c, "CheckHealth", qc.CheckHealthRequest(collection_ids=[cid]))
        assert h.state == qc.HEALTH_STATE_RED and h.collections[0].unserved_segments == len(on_big)
        out = ok(await run_cli(subprocess_env, c.coords[0].address, "explain", "big"))
        assert re.search(rf"^  room\s+node {small.node_id}: [\d.]+ MiB free \([\d.,]+ MiB short\)$", out, re.M), out
        assert re.search(r"^  why\s+no room: no room for", out, re.M), out


async def test_a_running_trigger_says_what_it_waits_for_and_explain_names_the_error(
        etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]) -> None:
    """A node that fails every load: the load's child retries there (a budget that outlasts the test), and both
    GetTask (``tasks show``) and Explain say so, with the node and the error; a standby refuses CheckHealth,
    naming the leader. Once the node heals, the load ends and its tree waits for nothing."""
    flaky = FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"}))
    async with running_cluster(etcd, root_path, [flaky], scheduler=fast_scheduler(retry_budget=100_000)) as c:
        node = c.nodes[0]
        cid = await c.create_collection("flaky", partitions=1, segments=4, channels=1)
        task_id = (await call(c, "LoadCollection", qc.LoadCollectionRequest(collection_id=cid))).task_id

        async def retrying() -> qc.TaskWait | None:
            tree = (await call(c, "GetTask", qc.GetTaskRequest(task_id=task_id))).tree
            return next((w for w in tree.waits if w.kind == qc.WAIT_KIND_RETRY), None)

        w = await until("the child's retry in GetTask", retrying)
        assert w.node_id == node.node_id and "injected failure" in w.error and w.attempt >= 1
        assert w.child_task_id and w.until_ms >= w.since_ms > 0 and f"failed on node {node.node_id}" in w.text

        async def explained() -> qc.ExplainUnit | None:
            ex = await call(c, "Explain", qc.ExplainRequest(collection_id=cid))
            return next((u for u in ex.units if u.reason == qc.EXPLAIN_REASON_RETRYING), None)

        u = await until("explain says retrying", explained)
        assert (u.task_id, u.node_id) == (task_id, node.node_id) and "injected failure" in u.error
        out = ok(await run_cli(subprocess_env, c.coords[0].address, "tasks", "show", str(task_id)))
        assert "waiting for:" in out and f"on node {node.node_id}" in out, out
        record = json.loads(ok(await run_cli(subprocess_env, c.coords[0].address, "tasks", "show", str(task_id),
                                             "-o", "json")))
        assert record["waits"] and {x["kind"] for x in record["waits"]} <= {"retry", "child"}, record["waits"]

        standby = await c.start_coordinator()
        async with make_channel(standby.address) as channel:
            stub = querycoord_pb2_grpc.QueryCoordStub(channel)
            try:
                await stub.CheckHealth(qc.CheckHealthRequest(), timeout=10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and c.coords[0].address in (exc.details() or "")
            else:
                raise AssertionError("a standby answered CheckHealth")

        node.injector.config = FaultConfig()
        await c.wait_loaded(cid)
        await c.wait_idle()
        tree = (await call(c, "GetTask", qc.GetTaskRequest(task_id=task_id))).tree
        assert tree.trigger.state == qc.TASK_STATE_EXPIRED and list(tree.waits) == []
        h = await call(c, "CheckHealth", qc.CheckHealthRequest())
        assert h.state == qc.HEALTH_STATE_GREEN


async def test_bad_requests_are_refused_with_a_clear_error(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.client is not None
        cid = await c.create_collection("idle", partitions=1, segments=2)
        cases = [
            ("CheckHealth", qc.CheckHealthRequest(collection_ids=[cid]), common_pb2.NOT_FOUND, "not been loaded"),
            ("Explain", qc.ExplainRequest(collection_id=cid), common_pb2.NOT_FOUND, "not been loaded"),
            ("Explain", qc.ExplainRequest(collection_name="nope"), common_pb2.NOT_FOUND, "nope"),
            ("Explain", qc.ExplainRequest(), common_pb2.ILLEGAL_ARGUMENT, "collection_id or collection_name"),
            ("Explain", qc.ExplainRequest(collection_id=cid, collection_name="idle"), common_pb2.ILLEGAL_ARGUMENT,
             "not both"),
            ("Explain", qc.ExplainRequest(collection_id=cid, segment_limit=5000), common_pb2.ILLEGAL_ARGUMENT,
             "segment_limit"),
        ]
        for method, request, code, text in cases:
            resp = await c.client.query(method, request)
            assert resp.status.error_code == code and text in resp.status.reason, (method, request, resp.status)
        h = await call(c, "CheckHealth", qc.CheckHealthRequest())
        assert (h.state, list(h.collections)) == (qc.HEALTH_STATE_GREEN, [])
