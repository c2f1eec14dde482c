"""What a caller may cost a coordinator: standby reads share one copy, heavy reads are bounded, open gRPC methods
take small requests and few streams.

Real etcd, real coordinator processes: the standby's memory is its process's resident set (``/proc``), its
takeover the real election after the leader's session is revoked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meta.election import Election
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import common_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.common.protocol import QUERYCOORD_ELECTION, QUERYCOORD_ROLE
from querycoord.common.shared_run import SharedRun
from querycoord.querymeta import QueryMeta
from querycoord.security.grpc_bounds import MAX_OPEN_STREAMS
from querycoord.security.grpc_channels import make_channel
from querycoord.serving.read_slots import Busy, ReadSlots
from tests.spawn import spawn_coordinator
from tests.test_querymeta import COLL, seg

SEGMENTS = 6000
MIB = 1 << 20


def _kib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` memory field (VmRSS, VmHWM) in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


async def _fill(kv: MetaKV, fence: object) -> None:
    """One loaded collection of ``SEGMENTS`` segments on three nodes, written as a leader writes."""
    meta = QueryMeta(kv.fenced(fence))  # type: ignore[arg-type]
    await meta.reload()
    await meta.add_collection(1, COLL, [10])
    for start in range(0, SEGMENTS, 1000):
        await meta.save_segments([seg(100 + i, node=1 + i % 3) for i in range(start, start + 1000)])


async def test_a_standby_answers_many_concurrent_reads_from_one_copy_and_still_takes_over(
        etcd: EtcdCluster, kv: MetaKV, root_path: str, tmp_path: Path) -> None:
    # The test holds the leadership (a session and the election key), so the coordinator stands by.
    session = Session(kv, QUERYCOORD_ROLE, "127.0.0.1:1", ttl=2)
    await session.start()
    fence = await Election(kv, session, QUERYCOORD_ELECTION).campaign("127.0.0.1:1")
    await _fill(kv, fence)
    # One heavy read at a time and one waiting: 48 concurrent GetReplicas are refused beyond that bound.
    standby = await spawn_coordinator(etcd, root_path, tmp_path, "--max-heavy-reads", "1",
                                      "--max-heavy-reads-waiting", "1", name="standby", log_level="INFO")
    try:
        channel = make_channel(standby.address)
        stub = querycoord_pb2_grpc.QueryCoordStub(channel)
        first = await stub.GetReplicas(qc.GetReplicasRequest(collection_id=1), timeout=60)
        assert first.status.error_code == common_pb2.SUCCESS, first.status
        assert sum(r.segment_count for r in first.replicas) == SEGMENTS
        baseline = _kib(standby.pid, "VmRSS")

        async def reads() -> list[common_pb2.Status]:  # ShowCollections is no heavy read: never refused
            calls = [stub.ShowCollections(qc.ShowCollectionsRequest(), timeout=120) for _ in range(48)]
            calls += [stub.GetReplicas(qc.GetReplicasRequest(collection_id=1), timeout=120) for _ in range(48)]
            return [r.status for r in await asyncio.gather(*calls)]

        for _ in range(2):
            statuses = await reads()
            # Every read is answered: its result, or (GetReplicas over its bound) RESOURCE_EXHAUSTED.
            assert {s.error_code for s in statuses} <= {common_pb2.SUCCESS, common_pb2.RESOURCE_EXHAUSTED}, statuses
            assert sum(s.error_code == common_pb2.SUCCESS for s in statuses) >= 48
            refusals = [s.reason for s in statuses if s.error_code == common_pb2.RESOURCE_EXHAUSTED]
            assert all(("(1 running" in r and "at most 1)" in r) or "within" in r for r in refusals), refusals
        peak = _kib(standby.pid, "VmHWM")
        assert peak < 2 * baseline + 50 * 1024, f"standby peaked at {peak} KiB from {baseline} KiB\n{standby.tail()}"
        assert standby.proc.returncode is None
        await channel.close()
        # The leader dies: the standby takes over.
        await session.close(revoke=True)
        event = await standby.wait_event("leader", timeout=60)
        assert event["address"] == standby.address
    finally:
        await standby.kill()
        await session.close()


async def test_open_health_calls_take_small_requests_and_few_streams(etcd: EtcdCluster, root_path: str,
                                                                    tmp_path: Path) -> None:
    coord = await spawn_coordinator(etcd, root_path, tmp_path, name="coord")
    channel = make_channel(coord.address, options=[("grpc.max_send_message_length", 32 * MIB)])
    stub = health_pb2_grpc.HealthStub(channel)
    streams: list[grpc.aio.UnaryStreamCall] = []
    try:
        ok = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert ok.status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
        baseline = _kib(coord.pid, "VmRSS")
        huge = health_pb2.HealthCheckRequest(service="x" * (15 * MIB))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Check(huge, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        rss = []
        for _ in range(2):
            for _ in range(4):  # each was pinned (about 64 MiB) for as long as the stream stayed open
                call = stub.Watch(huge, timeout=60)
                streams.append(call)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
                assert "at most 1024" in (refused.value.details() or "")
            rss.append(_kib(coord.pid, "VmRSS"))
        # A refused request costs its size once, briefly (gRPC receives it whole): the second round reuses
        # that. Pinned, each open stream held about 64 MiB, so a round of four grew by about 256 MiB; the
        # bound leaves the allocator its slack (tens of MiB on a loaded machine).
        assert rss[0] - baseline < 160 * 1024 and rss[1] - rss[0] < 96 * 1024, (baseline, rss)
        # Many small Watch streams: a bounded number is kept, the rest refused.
        answers = []
        for i in range(MAX_OPEN_STREAMS + 8):
            call = stub.Watch(health_pb2.HealthCheckRequest(service=f"s{i}"), timeout=60)
            streams.append(call)
            try:
                answers.append(await call.read())
            except grpc.aio.AioRpcError as exc:
                answers.append(exc.code())
        refusals = [a for a in answers if a == grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert len(refusals) == 8, answers
        grown = _kib(coord.pid, "VmRSS") - rss[1]
        assert grown < 32 * 1024, f"the coordinator grew by {grown} KiB while holding the streams"
        assert (await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)).status
    finally:
        for call in streams:
            call.cancel()
        await channel.close()
        await coord.kill()


async def test_shared_run_joins_callers_that_came_before_it_started() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    runs = 0

    async def work() -> int:
        nonlocal runs
        runs += 1
        started.set()
        await release.wait()
        return runs

    shared = SharedRun(work)
    first = [asyncio.create_task(shared()) for _ in range(10)]
    await started.wait()
    later = [asyncio.create_task(shared()) for _ in range(10)]  # the first run started before they called
    await asyncio.sleep(0)
    release.set()
    assert set(await asyncio.gather(*first)) == {1}
    assert set(await asyncio.gather(*later)) == {2}
    assert shared.runs == 2


async def test_read_slots_refuse_beyond_the_bound() -> None:
    slots = ReadSlots(slots=2, queue=1, wait=0.2)
    gate = asyncio.Event()

    async def read() -> None:
        async with slots.hold("GetReplicas"):
            await gate.wait()

    running = [asyncio.create_task(read()) for _ in range(2)]
    await asyncio.sleep(0.05)
    waiting = asyncio.create_task(read())  # waits its 0.2 s, then refused
    await asyncio.sleep(0)
    with pytest.raises(Busy, match="no room to wait"):
        await read()
    with pytest.raises(Busy, match="none finished within"):
        await waiting
    gate.set()
    await asyncio.gather(*running)
    async with slots.hold("GetReplicas"):
        pass
