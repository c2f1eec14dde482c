"""Throttled moves: recovery and balance loads stay within their budgets as the nodes count them, a move over
its budget waits (and says so) instead of failing, recovery is never held back by balance, and a repair
pre-empts a balance of the same collection without leaving a copy too many."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.task.throttle import BALANCE, RECOVERY
from tests.cluster import QueryCluster, fast_scheduler, wait_until

SLOW = FaultConfig(latency_ms=150)


@dataclass
class Samples:
    """What the nodes reported at each sample: LoadSegments calls in flight per node, and the leader's waits."""

    per_node: int = 0  # the most on one node at one sample
    cluster: int = 0  # the most on all nodes together at one sample
    throttled_texts: set[str] = field(default_factory=set)
    count: int = 0


@contextlib.asynccontextmanager
async def sampling(c: QueryCluster, nodes: list[QueryNode]) -> AsyncIterator[Samples]:
    """Sample the nodes' own in-flight counters every 10 ms while the block runs."""
    out = Samples()

    async def loop() -> None:
        while True:
            loads = [n.in_flight["LoadSegments"] for n in nodes]
            out.per_node = max(out.per_node, *loads)
            out.cluster = max(out.cluster, sum(loads))
            out.count += 1
            lead = c.coords[0].coord.leadership if c.coords else None
            if lead is not None:
                for t in list(lead.scheduler.triggers.values()):
                    out.throttled_texts |= {w.text for w in lead.scheduler.waits_of(t)
                                            if w.kind == qc.WAIT_KIND_THROTTLED}
            await asyncio.sleep(0.01)

    task = asyncio.create_task(loop())
    try:
        yield out
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def copies_per_segment(nodes: list[QueryNode]) -> dict[int, int]:
    out: dict[int, int] = {}
    for n in nodes:
        if n.healthy:
            for s in n.state.segments:
                out[s] = out.get(s, 0) + 1
    return out


async def test_recovery_stays_within_its_budgets_and_repairs_everything(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """A killed node's copies are loaded on the survivors with at most one recovery load per node and two in the
    cluster at any sample, though the nodes would take four at once; the waits say they are throttled."""
    sched = fast_scheduler(max_request_bytes=600, node_load_concurrency=4, max_recoveries_per_node=1,
                           max_cluster_recoveries=2)
    async with QueryCluster(etcd, root_path, scheduler=sched) as c:
        await c.start_coordinator()
        await c.wait_leader()
        survivors = [await c.add_node(faults=SLOW) for _ in range(3)]
        proc, ready = await c.start_node_process(log_dir=tmp_path)
        cid = await c.create_collection("thr", partitions=2, segments=120)
        await c.load_collection(cid, timeout=120)
        lead = c.coords[0].coord.leadership
        assert lead is not None
        victim = ready["node_id"]
        assert lead.meta.segments_on_node(victim), "the node to kill holds copies"
        async with sampling(c, survivors) as seen:
            await proc.kill()
            await wait_until(lambda: len(copies_per_segment(survivors)) == 120, "the survivors hold every segment",
                             120)
            await c.wait_idle(timeout=120)
        assert seen.count > 10
        assert seen.per_node <= 1, f"{seen.per_node} recovery loads at once on one node (budget 1)"
        assert seen.cluster <= 2, f"{seen.cluster} recovery loads at once in the cluster (budget 2)"
        assert any("throttled:" in t and "recoveries running" in t for t in seen.throttled_texts), seen
        assert copies_per_segment(survivors) == {s: 1 for s in copies_per_segment(survivors)}
        assert lead.scheduler.env.throttle.running[RECOVERY] == 0
        assert lead.scheduler.env.throttle.running[BALANCE] == 0


async def test_balance_within_its_budget_and_a_repair_pre_empts_it(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """A user's LoadBalance moves one call at a time (balance budget 1, the nodes would take four); a node lost
    meanwhile is repaired at once: the checker cancels the balance, and in the end every segment is held exactly
    once, as the nodes report."""
    sched = fast_scheduler(max_request_bytes=600, node_load_concurrency=4, max_balance_moves_per_node=1,
                           max_cluster_balance_moves=1)
    async with QueryCluster(etcd, root_path, scheduler=sched) as c:
        await c.start_coordinator()
        await c.wait_leader()
        a = await c.add_node()
        proc, ready = await c.start_node_process(log_dir=tmp_path)
        cid = await c.create_collection("bal", partitions=2, segments=120)
        await c.load_collection(cid, timeout=120)
        dst = await c.add_node(faults=FaultConfig(latency_ms=300))
        await c.wait_node_online(dst.node_id)
        lead = c.coords[0].coord.leadership
        assert lead is not None and c.client is not None
        moved = sorted(a.state.segments)
        assert moved and lead.meta.segments_on_node(ready["node_id"])
        async with sampling(c, [a, dst]) as seen:
            r = await c.client.query("LoadBalance", qc.LoadBalanceRequest(
                source_node_ids=[a.node_id], dst_node_ids=[dst.node_id], sealed_segment_ids=moved))
            assert r.status.error_code == 0, r
            await wait_until(lambda: any("balance moves running" in t for t in seen.throttled_texts),
                             "a balance move waits for its budget")
            assert seen.cluster <= 1
            await proc.kill()
            await wait_until(lambda: len(copies_per_segment([a, dst])) == 120, "every segment held again", 120)
            await c.wait_idle(timeout=120)
        balances = [t for t in lead.scheduler.finished if t.trigger.kind == qc.TASK_KIND_LOAD_BALANCE]
        assert balances and "pre-empted by a repair" in balances[-1].trigger.error, balances
        await wait_until(lambda: copies_per_segment([a, dst]) == {s: 1 for s in copies_per_segment([a, dst])},
                         "no segment is held twice", 60)
        assert len(copies_per_segment([a, dst])) == 120


async def test_a_load_queued_behind_its_nodes_call_holds_no_recovery_slot(
        etcd: EtcdCluster, root_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node loads one request at a time (``node_load_concurrency`` 1): a repair's second load for a node waits for
    the first one's call, and must not hold a slot of the cluster's recovery budget meanwhile, or a few busy nodes
    take every slot while the others idle (a lost node's repair at a million segments: five nodes' children held
    all 16 slots, two nodes waited). The first call on a survivor is held until the second load waits behind it:
    then one slot is taken on that node, the calling one's."""
    from querycoord.task.children import LoadSegmentsTask

    sched = fast_scheduler(max_request_bytes=600, node_load_concurrency=1, max_recoveries_per_node=4,
                           max_cluster_recoveries=16)
    release = asyncio.Event()
    entered: dict[int, int] = {}
    execute, call = LoadSegmentsTask.execute, LoadSegmentsTask.call
    held_node: list[int] = []

    async def counting(self: LoadSegmentsTask) -> None:
        entered[self.node_id] = entered.get(self.node_id, 0) + 1
        await execute(self)

    async def holding(self: LoadSegmentsTask, request: object) -> object:
        if not held_node or held_node[0] == self.node_id:
            if not held_node:
                held_node.append(self.node_id)
            await release.wait()
        return await call(self, request)

    async with QueryCluster(etcd, root_path, scheduler=sched) as c:
        await c.start_coordinator()
        await c.wait_leader()
        await c.add_node()
        proc, _ready = await c.start_node_process(log_dir=tmp_path)
        cid = await c.create_collection("queued", partitions=2, segments=60)
        await c.load_collection(cid, timeout=120)
        await c.wait_idle()
        lead = c.coords[0].coord.leadership
        assert lead is not None
        throttle = lead.scheduler.env.throttle
        monkeypatch.setattr(LoadSegmentsTask, "execute", counting)
        monkeypatch.setattr(LoadSegmentsTask, "call", holding)
        await proc.kill()
        await wait_until(lambda: held_node and entered.get(held_node[0], 0) >= 2,
                         "a second load waits behind the held call", 60)
        await asyncio.sleep(0.2)  # had the waiting load taken a slot, it would have by now
        assert throttle.on_node[RECOVERY][held_node[0]] == 1, dict(throttle.on_node[RECOVERY])
        assert throttle.running[RECOVERY] == 1
        release.set()
        await c.wait_idle(timeout=120)
        assert throttle.running[RECOVERY] == 0
