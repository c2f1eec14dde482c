"""Memory a finished load no longer needs: children drop their binlog paths once answered, and a large trigger
gives the freed memory back to the OS (``querycoord.common.memory``). Facts about objects, never RSS or timings."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.common import memory
from querycoord.task.children import LoadSegmentsTask
from tests.cluster import QueryCluster, running_cluster, wait_until


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_release_collects_cycles_and_trims(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda pad: trims.append(pad) or 1)
    gc.disable()  # only the release may collect the cycle below
    try:
        obj = _Cycle()
        ref = weakref.ref(obj)
        del obj
        assert ref() is not None, "a cycle is not freed by reference counting"
        before = memory.releases
        assert memory.release_freed_memory() is True
        assert ref() is None, "the cycle was collected"
        assert trims == [0], "malloc_trim(0): every free page, not only the top of the heap"
        assert memory.releases == before + 1
    finally:
        gc.enable()


def test_release_without_malloc_trim_still_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_malloc_trim", None)  # musl, macOS: no malloc_trim in the C library
    obj = _Cycle()
    ref = weakref.ref(obj)
    del obj
    assert memory.release_freed_memory() is False
    assert ref() is None


def test_malloc_trim_is_found_on_glibc() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert memory.malloc_trim_found()


async def test_release_soon_runs_once_for_requests_that_arrive_together(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []
    monkeypatch.setattr(memory, "release_freed_memory", lambda: ran.append(1) or True)
    memory.release_soon(0.01)
    memory.release_soon(0.01)
    memory.release_soon(0.01)
    assert ran == [], "later, not on the caller's turn of the loop"
    while not ran:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert ran == [1]
    memory.release_soon(0.01)  # a new request after the run is served again
    while len(ran) < 2:
        await asyncio.sleep(0.01)


@pytest.fixture
async def cluster(etcd: EtcdCluster, root_path: str):  # type: ignore[no-untyped-def]
    async with running_cluster(etcd, root_path, [None] * 2) as c:
        yield c


async def test_children_drop_binlog_paths_once_answered_and_a_large_load_releases_memory(
        cluster: QueryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[LoadSegmentsTask] = []
    execute = LoadSegmentsTask.execute

    async def recording(self: LoadSegmentsTask) -> None:
        assert self.full_infos is not None and any(i.binlog_paths for i in self.full_infos), \
            "planned with the binlog paths: the catalog is not read again"
        ran.append(self)
        await execute(self)

    monkeypatch.setattr(LoadSegmentsTask, "execute", recording)
    requested: list[float] = []
    monkeypatch.setattr(memory, "release_soon", lambda delay=0.0: requested.append(delay))
    monkeypatch.setattr(memory, "LARGE_TASK_SEGMENTS", 30)

    small = await cluster.create_collection("small", partitions=1, segments=10)
    await cluster.load_collection(small)
    await cluster.wait_idle()
    assert ran and all(c.full_infos is None for c in ran), "answered children keep no binlog paths"
    assert all(c.segment_count() and not c.request.infos and not c.request.binlogs for c in ran), \
        "the records hold references only"
    assert requested == [], "10 segments: below the threshold, no release"

    big = await cluster.create_collection("big", partitions=2, segments=40)
    await cluster.load_collection(big)
    await cluster.wait_idle()
    assert all(c.full_infos is None for c in ran)
    assert len(requested) == 1, "a trigger that loaded 40 segments asks for one release"

    rel = await cluster.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=big))
    assert rel.status.error_code == common_pb2.SUCCESS, rel
    await cluster.wait_idle()
    assert len(requested) == 2, "releasing 40 segments asks for one too"


async def test_a_failed_call_keeps_the_planned_paths_for_the_retry(
        cluster: QueryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from querycoord.cluster.client import NodeError

    calls: list[LoadSegmentsTask] = []
    filled: list[Any] = []
    call = LoadSegmentsTask.call
    refill = LoadSegmentsTask.filled_request

    async def flaky(self: LoadSegmentsTask, request: Any) -> Any:
        if self not in calls:
            calls.append(self)
            raise NodeError(self.node_id, "LoadSegments", common_pb2.UNEXPECTED_ERROR, "injected: first call fails",
                            transport=True)
        return await call(self, request)

    async def filling(self: LoadSegmentsTask) -> Any:
        filled.append(self.full_infos is not None)
        return await refill(self)

    monkeypatch.setattr(LoadSegmentsTask, "call", flaky)
    monkeypatch.setattr(LoadSegmentsTask, "filled_request", filling)
    cid = await cluster.create_collection("retried", partitions=1, segments=6)
    await cluster.load_collection(cid)
    await cluster.wait_idle()
    assert calls and len(filled) == 2 * len(calls)
    assert all(filled), "the retry still had the planned binlog paths (no catalog re-read)"
    assert all(c.full_infos is None for c in calls)


async def test_the_release_does_not_need_the_trigger_alive_and_does_not_keep_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from proto import task_pb2
    from querycoord.task.triggers import LoadCollectionTask

    requested: list[float] = []
    monkeypatch.setattr(memory, "release_soon", lambda delay=0.0: requested.append(delay))
    env: Any = SimpleNamespace(config=SimpleNamespace(trigger_timeout=60.0))
    gc.disable()  # reference counting alone must free the trigger: no cycle through its own future
    try:
        t = LoadCollectionTask(env, task_pb2.TaskRecord(kind=qc.TASK_KIND_LOAD_COLLECTION))
        t.touched.segments = memory.LARGE_TASK_SEGMENTS
        finished, ref = t.finished, weakref.ref(t)
        del t
        assert ref() is None, "the finished callback does not keep the trigger alive"
        finished.set_result(None)  # the scheduler lets go of a tree as it finishes it: the callback runs later
        await asyncio.sleep(0)
        assert len(requested) == 1, "the release is asked for although the trigger is gone"
    finally:
        gc.enable()


def test_trim_returns_pages_without_a_gc_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """``trim`` (after each large checker pass) asks glibc for its free pages and runs no collection."""
    trims: list[int] = []
    collections: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda pad: trims.append(pad) or 1)
    monkeypatch.setattr(memory.gc, "collect", lambda *a: collections.append(1) or 0)
    assert memory.trim() is True and trims == [0]
    assert collections == []
    monkeypatch.setattr(memory, "_malloc_trim", None)
    assert memory.trim() is False


class _Holder:
    def __init__(self) -> None:
        self.busy = True

    def holding(self) -> bool:
        return self.busy


def _recorded_releases(monkeypatch: pytest.MonkeyPatch, *, own_holders: bool = True) -> list[int]:
    """A list that grows by one at each release run (none runs for real), re-armed every 10 ms while held;
    ``own_holders``: only the holders the test registers hold (none of an earlier test's coordinators)."""
    ran: list[int] = []
    monkeypatch.setattr(memory, "release_freed_memory", lambda: ran.append(1) or True)
    monkeypatch.setattr(memory, "RELEASE_DELAY", 0.01)
    if own_holders:
        monkeypatch.setattr(memory, "_holders", [])
    return ran


async def _until(ran: list[int], count: int) -> None:
    while len(ran) < count:
        await asyncio.sleep(0.01)


async def test_a_release_waits_while_its_holder_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost node's repair at 1M goes in parts: a full pass between two parts stalled the next one's loads."""
    ran = _recorded_releases(monkeypatch)
    holder = _Holder()
    stop = memory.defer_while(holder.holding)
    try:
        memory.release_soon(0.01)
        await asyncio.sleep(0.2)
        assert ran == [], "held while its holder is busy"
        holder.busy = False
        await asyncio.wait_for(_until(ran, 1), 10)
        holder.busy = True
        stop()
        memory.release_soon(0.01)
        await asyncio.wait_for(_until(ran, 2), 10)  # a holder that stopped holding holds nothing
    finally:
        stop()


async def test_a_held_release_runs_after_max_defer_and_a_gone_holder_holds_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _recorded_releases(monkeypatch)
    monkeypatch.setattr(memory, "MAX_DEFER", 0.1)
    holder = _Holder()
    stop = memory.defer_while(holder.holding)
    try:
        memory.release_soon(0.01)
        await asyncio.wait_for(_until(ran, 1), 10)  # busy all along: the memory still comes back
        monkeypatch.setattr(memory, "MAX_DEFER", 3600.0)
        del holder
        memory.release_soon(0.01)
        await asyncio.wait_for(_until(ran, 2), 10)
    finally:
        stop()


async def test_the_scheduler_holds_releases_while_a_trigger_runs(
        cluster: QueryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    ran = _recorded_releases(monkeypatch, own_holders=False)  # the cluster's scheduler holds
    monkeypatch.setattr(memory, "MAX_DEFER", 5.0)  # whatever else holds (an earlier test's), the release comes
    lead = (await cluster.wait_leader()).coord.leadership
    assert lead is not None
    sched = lead.scheduler
    gate = asyncio.Event()
    execute = LoadSegmentsTask.execute

    async def held(self: LoadSegmentsTask) -> None:
        await gate.wait()
        await execute(self)

    monkeypatch.setattr(LoadSegmentsTask, "execute", held)
    cid = await cluster.create_collection("held", partitions=1, segments=4)
    loading = asyncio.create_task(cluster.load_collection(cid))
    await wait_until(lambda: bool(sched.queue.running), "the load runs")
    memory.release_soon(0.01)
    await asyncio.sleep(0.3)
    assert ran == [], "a release waits while a trigger is queued or runs"
    gate.set()
    await loading
    await cluster.wait_idle()
    await asyncio.wait_for(_until(ran, 1), 10)
