"""etcd out of space (NOSPACE) under a coordinator: nothing crashes, reads go on, mutations are refused with the
reason, running work pauses, and after `querycoord etcd maintain` it resumes without losing a persisted task.

A separate etcd member with a 16 MiB quota is driven into NOSPACE by overwriting one key with 100 KB values
(history, as a coordinator's task keys make it: what compaction frees). Real etcd, real processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from meta.client import NOSPACE_WAIT, connect
from meta.errors import MetaNoSpace
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.ops.maintenance import MIB, maintain
from meta.session import list_sessions
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.common import metrics
from querycoord.common.etcd_space import SpaceMonitor
from querycoord.common.protocol import QUERYCOORD_ROLE
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig
from querycoord.nodes.querynode_faults import FaultInjector
from querycoord.serving.gate import LeaderGate
from tests.cluster import QueryCluster
from tests.spawn import MID_LOAD_FLAGS, Spawned, spawn_coordinator
from tests.test_metrics import probe, scrape, value

QUOTA = 16 * MIB
VALUE = b"x" * 100_000
REASON = re.compile(r"^etcd is out of space \(db \d+ MiB of quota 16 MiB\): run `querycoord etcd maintain`$")


async def fill_history(kv: MetaKV) -> int:
    """Overwrite one key with 100 KB values until etcd refuses for NOSPACE; how many puts it took."""
    for i in range(1, 1000):
        try:
            await kv.save("junk", VALUE)
        except MetaNoSpace:
            return i
    raise AssertionError("etcd never ran out of space")


async def until(what: str, predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok = predicate()
        if not isinstance(ok, bool):
            ok = await ok
        if ok:
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


@pytest.fixture
def tiny(tmp_path: Path):
    with EtcdCluster(tmp_path / "tiny", quota_backend_bytes=QUOTA) as cluster:
        yield cluster


async def test_space_monitor_follows_the_alarm(tiny: EtcdCluster) -> None:
    async with await connect(tiny.config()) as client:
        monitor = SpaceMonitor(client, interval=0.2, nospace_interval=0.2, min_interval=0.1)
        monitor.start()
        try:
            await until("a first poll", lambda: monitor.checked_at > 0)
            assert not monitor.nospace and monitor.quota == QUOTA and monitor.db_size > 0
            puts = await fill_history(MetaKV(client, "junk"))
            # At least the quota's worth of history (16 MiB / 100 KB ~ 160 puts) before the refusal; how far past
            # it etcd's backend file grows first depends on when its batch commits reuse freed pages (267 once in
            # a full run), so there is no upper bound here: fill_history fails if NOSPACE never comes.
            assert puts > 100, puts
            await until("the alarm seen", lambda: monitor.nospace)
            assert REASON.match(monitor.reason()), monitor.reason()
            assert monitor.as_dict()["nospace"] is True and monitor.raised == 1
            assert [a["alarm"] for a in monitor.as_dict()["alarms"]] == ["NOSPACE"]  # type: ignore[union-attr]
            waiter = asyncio.create_task(monitor.wait_writable())
            await asyncio.sleep(0.5)
            assert not waiter.done(), "nothing may resume while the alarm is raised"
            await maintain(tiny.config(), keep=10, say=lambda _: None)
            await asyncio.wait_for(waiter, 30)
            assert not monitor.nospace and monitor.raised == 1
        finally:
            await monitor.stop()


def loop_errors(loop: str) -> float:
    return REGISTRY.get_sample_value("querycoord_background_loop_errors_total", {"loop": loop}) or 0.0


async def test_the_space_monitor_goes_on_after_a_failed_poll_and_stops_with_its_client(tiny: EtcdCluster) -> None:
    """A poll etcd does not answer (its member stopped) is kept in ``poll_error`` with the last sizes, and polled
    again: once the member is back a poll succeeds and reports, and NOSPACE is still seen afterwards. etcd trouble
    is not a loop error, and closing the client ends the loop cleanly (no error, nothing left unretrieved)."""
    metrics.install()
    before = loop_errors("etcd space monitor")
    # Short attempts, so that a poll against the stopped member fails within a second instead of 15 s.
    client = await connect(dataclasses.replace(tiny.config(), call_timeout=0.5, deadline=1.0))
    monitor = SpaceMonitor(client, interval=0.2, nospace_interval=0.2, min_interval=0.1)
    monitor.start()
    try:
        await until("a first poll", lambda: monitor.checked_at > 0)
        size = monitor.db_size
        await asyncio.to_thread(tiny.stop_member, 0)
        await until("a failed poll", lambda: monitor.poll_error != "")
        failed_at = time.time()
        assert monitor.db_size == size and not monitor.nospace, "a failed poll keeps what the last one saw"
        await asyncio.to_thread(tiny.restart_member, 0)
        await until("a poll after the failed one", lambda: monitor.checked_at > failed_at)
        assert monitor.poll_error == "" and monitor.db_size > 0
        assert loop_errors("etcd space monitor") == before, "etcd trouble is kept in poll_error, not a loop error"
        await fill_history(MetaKV(client, "junk"))
        await until("the alarm seen", lambda: monitor.nospace)
        await maintain(tiny.config(), keep=10, say=lambda _: None)
        await until("the alarm gone", lambda: not monitor.nospace)
        task = monitor.poll_task
        assert task is not None and not task.done()
        await client.close()
        await until("the loop stopped", task.done)
        assert not task.cancelled() and task.exception() is None, "a closed client is a clean stop"
        assert loop_errors("etcd space monitor") == before, "and not an error"
    finally:
        await monitor.stop()
        await client.close()


async def test_a_service_answers_a_refused_write_with_resource_exhausted(tiny: EtcdCluster) -> None:
    """Any gated service (streams, queries): a write etcd refuses for NOSPACE is answered with the sizes and what
    to run, not as an etcd outage."""
    async with await connect(tiny.config()) as client:
        kv = MetaKV(client, "g")
        await fill_history(kv)
        monitor = SpaceMonitor(client)
        gate = LeaderGate(SimpleNamespace(space=monitor))  # type: ignore[arg-type]

        async def create() -> qc.GetTaskResponse:
            await kv.save("stream/1", "definition")
            raise AssertionError("unreachable")

        resp = await gate.answer(qc.GetTaskResponse, create)
        assert resp.status.error_code == common_pb2.RESOURCE_EXHAUSTED
        assert REASON.match(resp.status.reason), resp.status.reason
        assert monitor.nospace


async def test_a_write_waits_out_nospace_only_where_asked(tiny: EtcdCluster) -> None:
    """Without a waiter NOSPACE is raised at once; with one (the scheduler's triggers) the write waits and is
    applied once maintenance made room."""
    async with await connect(tiny.config()) as client:
        kv = MetaKV(client, "w")
        await fill_history(kv)
        with pytest.raises(MetaNoSpace, match="run `querycoord etcd maintain`"):
            await kv.save("k", "v")
        waits: list[MetaNoSpace] = []
        monitor = SpaceMonitor(client, interval=0.2, nospace_interval=0.2, min_interval=0.1)
        monitor.start()

        async def wait(exc: MetaNoSpace) -> None:
            waits.append(exc)
            await monitor.wait_writable()

        async def paused_write() -> int:
            NOSPACE_WAIT.set(wait)
            return await kv.save("k", "v")

        try:
            write = asyncio.create_task(paused_write())
            await until("the write to wait", lambda: bool(waits))
            assert not write.done()
            await maintain(tiny.config(), keep=10, say=lambda _: None)
            assert await asyncio.wait_for(write, 30) > 0
            assert await kv.get("k") == b"v"
            assert NOSPACE_WAIT.get() is None  # set in the writer's task only, never in its caller's context
        finally:
            await monitor.stop()


async def test_nospace_mid_load_pauses_refuses_and_resumes_after_maintain(
        tiny: EtcdCluster, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    root = "nospace"
    async with QueryCluster(tiny, root) as c:
        assert c.kv is not None
        slow = FaultConfig(latency_ms=100)
        for _ in range(2):
            await c.add_node(faults=slow)
        leader = await spawn_coordinator(tiny, root, tmp_path, *MID_LOAD_FLAGS, "--http-listen", "127.0.0.1:0",
                                         name="coord-a")
        standby = await spawn_coordinator(tiny, root, tmp_path, *MID_LOAD_FLAGS, name="coord-b")
        late = None
        client = QueryCoordClient([leader.address, standby.address], deadline=60)
        try:
            await leader.wait_event("leader", timeout=60)
            await until("both coordinators registered", lambda: _coordinators(c, 2))
            catalog = CatalogStore(c.kv)
            big, _ = await catalog.create_bulk_collection("big", num_partitions=2, num_segments=300)
            other, _ = await catalog.create_bulk_collection("other", num_partitions=1, num_segments=4)
            r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=big.collection_id))
            assert r.status.error_code == common_pb2.SUCCESS, r
            task_id = r.task_id

            def held() -> int:
                return sum(len(n.state.segments) for n in c.nodes)

            def node_latency(ms: float) -> None:
                for n in c.nodes:
                    n.faults = FaultConfig(latency_ms=ms)
                    n.injector = FaultInjector(n.faults)

            await until("the load to be under way", lambda: held() >= 20)
            # Slow the nodes right down while etcd fills, so the load is certainly still running when its writes
            # meet NOSPACE (on a loaded machine the fill took longer than the whole load at 100 ms a call).
            node_latency(2000)
            await fill_history(MetaKV(c.kv.client, "junk"))

            # A mutation is refused with the reason; a read is answered.
            other_load = await client.query("LoadCollection",
                                            qc.LoadCollectionRequest(collection_id=other.collection_id))
            assert other_load.status.error_code == common_pb2.RESOURCE_EXHAUSTED, other_load
            assert REASON.match(other_load.status.reason), other_load.status.reason
            # The running load pauses (its coordinator says so) instead of failing.
            log = tmp_path / "coord-a.log"
            await until("the load to pause", lambda: "paused: etcd is out of space" in log.read_text())
            show = await client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[big.collection_id]))
            assert show.status.error_code == common_pb2.SUCCESS and show.collections[0].in_memory_percentage < 100
            tasks = await client.query("ListTasks", qc.ListTasksRequest())
            assert tasks.status.error_code == common_pb2.SUCCESS
            [tree] = [t for t in tasks.trees if t.trigger.task_id == task_id]
            assert tree.trigger.state != qc.TASK_STATE_FAILED
            # A coordinator started now neither crashes nor leads: it cannot even register; it waits.
            late = await spawn_coordinator(tiny, root, tmp_path, *MID_LOAD_FLAGS, name="coord-c")
            late_log = tmp_path / "coord-c.log"
            await until("the late coordinator to notice",
                        lambda: "waiting for etcd to have space again" in late_log.read_text())
            assert leader.running and standby.running and late.running
            assert [e["event"] for e in leader.events if e.get("event") in ("leader", "standby")] == ["leader"]
            states = await client.query("GetComponentStates", qc.GetComponentStatesRequest())
            assert states.state.state_code == common_pb2.HEALTHY
            # The alarm shows in health (the probes still pass: reads are served) and in metrics.
            code, ready = await probe(leader, "/readyz")
            assert code == 200 and REASON.match(str(ready.get("etcd"))), ready
            await until("the NOSPACE gauge", lambda: _scraped(leader, "querycoord_etcd_nospace", 1))

            node_latency(100)
            out = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "querycoord.cli", "etcd", "maintain", "--keep", "20",
                "--etcd-endpoints", tiny.endpoints[0]], capture_output=True, text=True, env=subprocess_env,
                timeout=120)
            assert out.returncode == 0, out
            assert "alarm: NOSPACE disarmed" in out.stdout

            # The same trigger finishes: nothing was lost, failed or run twice.
            async def finished() -> bool:
                got = await client.query("GetTask", qc.GetTaskRequest(task_id=task_id))
                return got.status.error_code == common_pb2.SUCCESS and got.tree.trigger.state in (
                    qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED)
            await until("the load to finish", finished, timeout=120)
            got = await client.query("GetTask", qc.GetTaskRequest(task_id=task_id))
            assert got.tree.trigger.state == qc.TASK_STATE_EXPIRED, got.tree.trigger
            show = await client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[big.collection_id]))
            assert show.collections[0].in_memory_percentage == 100
            segments = [s for n in c.nodes for s in n.state.segments]
            assert len(segments) == len(set(segments)) == 300, "each segment loaded exactly once"
            everything = await client.query("ListTasks", qc.ListTasksRequest(include_finished=True))
            assert not [t.trigger.task_id for t in everything.trees if t.trigger.state == qc.TASK_STATE_FAILED]
            # Mutations are accepted again; the late coordinator registered and stands by.
            again = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=other.collection_id))
            assert again.status.error_code == common_pb2.SUCCESS, again
            await until("the late coordinator to register", lambda: _coordinators(c, 3))
            assert [e["event"] for e in leader.events if e.get("event") in ("leader", "standby")] == ["leader"]
            await until("no task key left", lambda: _no_task_keys(c), timeout=120)
        finally:
            await client.close()
            for p in (late, standby, leader):
                if p is not None:
                    await p.kill()


async def _coordinators(c: QueryCluster, n: int) -> bool:
    assert c.kv is not None
    return len((await list_sessions(c.kv, QUERYCOORD_ROLE)).sessions) == n


async def _no_task_keys(c: QueryCluster) -> bool:
    return not any((await c.task_keys()).values())


async def _scraped(proc: Spawned, name: str, expected: float) -> bool:
    return value(await scrape(proc), name) == expected
