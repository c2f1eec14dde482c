"""The fuzzer in CI: about 1,000 hostile, valid and garbage requests with a fixed seed against a cluster of real
processes (2 coordinators, 2 query nodes, 2 stream nodes), then every after-run check (``tests/fuzz_cluster.py``);
``make fuzz`` runs 10,000 or more with a fresh seed. The engine's own facts (every RPC enumerated, every
field of every request drawn, answers classified) are checked without a cluster first."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from meta.ops.etcd_server import EtcdCluster
from proto import catalog_pb2, common_pb2, querycoord_pb2, querynode_pb2, stream_pb2
from tests.exhaustion import Exhaustion, Target, big_heads
from tests.fuzz_cluster import FuzzOptions, FuzzReport, run_fuzz
from tests.fuzzing import COORDINATOR, QUERY_NODE, Case, CaseStrategies, Outcome, World, classify, generate, rpcs

CI_REQUESTS = int(os.environ.get("QUERYCOORD_FUZZ_REQUESTS", "1000"))
CI_SEED = 20251102


def _world() -> World:
    return World(collections={5: [6, 7]}, query_nodes=[3], stream_nodes=[4], vgroups=[1, 2], snodes=[9],
                 streams={11: "s1"}, coordinators=["127.0.0.1:1"])


def test_every_unary_rpc_of_every_service_is_enumerated_from_the_descriptors() -> None:
    found = {(r.service, r.method) for r in rpcs()}
    for pb, name in ((querycoord_pb2, "QueryCoord"), (catalog_pb2, "Catalog"), (stream_pb2, "StreamMgmt"),
                     (querynode_pb2, "QueryNode")):
        service = pb.DESCRIPTOR.services_by_name[name]
        assert {(service.full_name, m.name) for m in service.methods} <= found
    assert ("grpc.health.v1.Health", "Check") in found
    assert ("grpc.health.v1.Health", "Watch") not in found  # server streaming: not a request/answer pair
    surfaces = {r.service: r.surface for r in rpcs()}
    assert surfaces["querycoord.node.QueryNode"] == QUERY_NODE
    assert surfaces["querycoord.stream.StreamMgmt"] == COORDINATOR  # StreamHeartbeat is the coordinator's


def test_every_field_of_every_request_is_drawn_and_the_same_seed_draws_the_same_requests() -> None:
    """Strategies come from the descriptors: each field of each request type is set by some case, hostile
    values and garbage included, so a new field is fuzzed without a change here."""
    strategies = CaseStrategies(rpcs(), _world(), targets={COORDINATOR: ["leader"], QUERY_NODE: ["node0"]})
    # As a run draws them: batches of 100, each with its own seed, until every field was set by a hostile case.
    # The budget grows with the RPCs: each new RPC takes its share of the picks (47 RPCs needed 26 batches).
    wanted = {r.request.DESCRIPTOR.full_name: {f.name for f in r.request.DESCRIPTOR.fields} for r in rpcs()
              if r.request.DESCRIPTOR.fields and r.method not in ("Switchover", "StepBack")}  # those rare on purpose
    set_fields: dict[str, set[str]] = {}
    cases: list[Case] = []
    for batch in range(max(20, 2 * len(rpcs()))):
        drawn = generate(strategies, 100, 7 + batch)
        cases += drawn
        for c in drawn:
            if c.kind == "hostile":
                msg = c.rpc.request.FromString(c.payload)
                set_fields.setdefault(c.rpc.request.DESCRIPTOR.full_name, set()).update(
                    f.name for f, _ in msg.ListFields())
        if batch >= 19 and all(names <= set_fields.get(name, set()) for name, names in wanted.items()):
            break
    assert [c.payload for c in cases[:100]] == [c.payload for c in generate(strategies, 100, 7)]
    kinds = Counter(c.kind.split(":")[0] for c in cases)
    assert kinds["hostile"] and kinds["valid"] and kinds["garbage"], kinds
    assert len({c.kind for c in cases if c.kind.startswith("garbage")}) >= 7
    for name, names in wanted.items():
        missing = names - set_fields.get(name, set())
        assert not missing, f"{name}: fields never drawn in {len(cases)} cases: {missing}"
    ints = [v for c in cases if c.kind == "hostile" for f, v in c.rpc.request.FromString(c.payload).ListFields()
            if f.cpp_type == FieldDescriptor.CPPTYPE_INT64 and not f.is_repeated]
    assert {-1, 2**31 - 1, 2**63 - 1, -(2**63), 5} <= set(ints)  # boundaries and real ids (0 is never "set")


def test_answers_are_classified() -> None:
    show = next(r for r in rpcs() if r.label == "QueryCoord.ShowCollections")
    ok = querycoord_pb2.ShowCollectionsResponse(status=common_pb2.Status(error_code=common_pb2.NOT_FOUND))
    assert classify(show, ok.SerializeToString(), None) == Outcome("status", "NOT_FOUND", "")
    bug = querycoord_pb2.ShowCollectionsResponse(status=common_pb2.Status(error_code=common_pb2.UNEXPECTED_ERROR,
                                                                          reason="internal error: KeyError"))
    assert classify(show, bug.SerializeToString(), None).kind == "crash"
    assert classify(show, b"\xff\xff", None).kind == "crash"

    def err(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)

    assert classify(show, None, err(grpc.StatusCode.INVALID_ARGUMENT, "bad")).kind == "code"
    assert classify(show, None, err(grpc.StatusCode.UNAVAILABLE, "not the leader; the leader is at a:1")).kind \
        == "code"
    assert classify(show, None, err(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")).kind \
        == "unanswered"
    assert classify(show, None, err(grpc.StatusCode.DEADLINE_EXCEEDED, "")).kind == "unanswered"
    assert classify(show, None, err(grpc.StatusCode.UNKNOWN, "boom")).kind == "crash"
    assert classify(show, None, err(grpc.StatusCode.INTERNAL, "boom")).kind == "crash"


async def test_the_exhaustion_phase_counts_an_answer_that_is_no_clean_refusal() -> None:
    """Its checks can fail: a server that serves a 64 KiB request head (no bound) is counted, and a count fails
    the run and shows in the JSON line."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, limit=1 << 20)
    try:
        port = server.sockets[0].getsockname()[1]
        found = Exhaustion()
        await big_heads(Target("unbounded", "127.0.0.1:1", f"127.0.0.1:{port}", None, 0), 2, found)
    finally:
        server.close()
        await server.wait_closed()
    assert found.unclean_refusals == 2 and found.failed, found.render()
    report = FuzzReport(seed=1, exhaustion=found)
    assert report.failed
    assert json.loads(report.json_line())["exhaustion"]["unclean_refusals"] == 2
    assert not FuzzReport(seed=1, exhaustion=Exhaustion(rss_growth_mib=12.0)).failed  # a figure, not a count


@pytest.mark.timeout(300)
async def test_fuzz_a_running_cluster(etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """Hostile input to every RPC of the coordinators (leader and standby), the query nodes and the stream
    surface, concurrently; then every process alive, the leader SERVING, every request answered, no traceback,
    no task key left, nothing half-written, and a leader kill taken over by the standby with the same checks."""
    opts = FuzzOptions(requests=CI_REQUESTS, seed=CI_SEED)
    report = await run_fuzz(etcd, root_path, tmp_path / "fuzz", opts)
    text = f"{report.render()}\n{report.json_line()}"
    assert report.stats.requests == CI_REQUESTS, text
    assert report.stats.crashes == 0, text
    assert report.stats.unanswered == 0, text
    assert not report.tracebacks, text
    assert report.leftover_keys == 0, text
    assert not report.violations, text
    # The resource-exhaustion phase ran (a small one) and every count is 0: the leader kept leading, /healthz
    # answered, nothing died or grew past its bound, every refusal was clean.
    assert report.exhaustion is not None, text
    assert report.exhaustion.sent["http idle"] and report.exhaustion.sent["read status.json"], text
    assert report.exhaustion.refused["grpc watch RESOURCE_EXHAUSTED"], text  # more streams than the bound
    assert report.exhaustion.refused["status.json no token 401"] == 1, text
    assert not report.exhaustion.failed, text
    assert json.loads(report.json_line())["exhaustion"] == report.exhaustion.counts(), text
