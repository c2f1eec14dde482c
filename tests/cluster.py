"""A real query cluster for tests: a coordinator (its gRPC server in this process) and query nodes.

Nodes run in-process (real gRPC servers on loopback, real sessions) unless a
test needs to kill one with a signal, for which ``start_node_process`` starts
``querycoord querynode`` as a real process (``tests.spawn``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from meta.client import connect
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.serving.process import CoordinatorProcess
from querycoord.settings.config import SCALED_SCHEDULER, SchedulerConfig, scaled_config
from querycoord.task.store import TASK_PREFIXES, TaskStore
from tests.spawn import Spawned, spawn_query_node

MiB = 1 << 20


def fast_scheduler(**kw: Any) -> SchedulerConfig:
    """The scaled preset's scheduler with ``kw`` changed."""
    return dataclasses.replace(SCALED_SCHEDULER, **kw)


async def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Until ``predicate()`` holds; AssertionError naming ``what`` after ``timeout`` seconds.

    Tests wait on a fact the nodes report, never on a sleep: the time it takes
    is the machine's business, the fact is the test's.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        await asyncio.sleep(0.1)


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 60.0) -> Any:
    """What ``check()`` returns once it is true; AssertionError naming ``what`` and the last value after
    ``timeout`` seconds (``wait_until`` for a check that awaits and whose answer the test uses)."""
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what} (still {got!r})"
        await asyncio.sleep(0.1)


async def wait_in_memory(client: QueryCoordClient, cid: int, timeout: float = 60.0) -> qc.ShowCollectionsResponse:
    """Until the leader reports collection ``cid`` 100 % in memory; TimeoutError with its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        resp = await client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
        if resp.status.error_code == 0 and resp.collections[0].in_memory_percentage == 100:
            return resp
        if time.monotonic() > deadline:
            raise TimeoutError(f"collection {cid} not loaded: {resp}")
        await asyncio.sleep(0.1)


class QueryCluster:
    def __init__(self, etcd: EtcdCluster, root: str, *, scheduler: SchedulerConfig | None = None,
                 session_ttl: float = 2.0):
        self.etcd = etcd
        self.root = root
        self.config = scaled_config(etcd=etcd.config(), root=root, session_ttl=session_ttl,
                                    scheduler=scheduler or fast_scheduler())
        self.coords: list[CoordinatorProcess] = []
        self.nodes: list[QueryNode] = []
        self.procs: list[Spawned] = []
        self.kv: MetaKV | None = None
        self.client: QueryCoordClient | None = None

    async def __aenter__(self) -> QueryCluster:
        self.kv = MetaKV(await connect(self.etcd.config()), self.root)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client:
            await self.client.close()
        for n in self.nodes:
            with contextlib.suppress(Exception):
                await n.stop()
        for c in self.coords:
            with contextlib.suppress(Exception):
                await c.stop()
        for p in self.procs:
            await p.kill()
        if self.kv:
            await self.kv.client.close()

    async def start_coordinator(self) -> CoordinatorProcess:
        c = CoordinatorProcess(self.config)
        await c.start()
        self.coords.append(c)
        if self.client is None:
            self.client = QueryCoordClient([c.address], deadline=30)
        else:
            self.client.addresses.append(c.address)
        return c

    async def leader_and_standby(self, name: str) -> tuple[CoordinatorProcess, CoordinatorProcess, int]:
        """A leader over two nodes with collection ``name`` loaded (2 partitions, 40 segments), then a second
        coordinator that stands by, the cluster idle: (leader, standby, collection id)."""
        first = await self.start_coordinator()
        await self.wait_leader()
        for _ in range(2):
            await self.add_node()
        cid = await self.create_collection(name, partitions=2, segments=40)
        await self.load_collection(cid)
        second = await self.start_coordinator()
        await self.wait_idle()
        return first, second, cid

    async def wait_leader(self, timeout: float = 30.0) -> CoordinatorProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for c in self.coords:
                if c.coord.is_leader:
                    return c
            await asyncio.sleep(0.05)
        raise TimeoutError("no coordinator became leader")

    async def add_node(self, capacity: int = 1024 * MiB, faults: FaultConfig | None = None,
                       ttl: float = 2.0) -> QueryNode:
        assert self.kv is not None
        n = QueryNode(self.kv, capacity_bytes=capacity, ttl=ttl, faults=faults)
        await n.start()
        self.nodes.append(n)
        return n

    async def start_node_process(self, *args: str, env: Mapping[str, str] | None = None, log_dir: Path | None = None,
                                 timeout: float = 60.0) -> tuple[Spawned, dict[str, Any]]:
        """A query node as a real process (to be killed with a real signal): returns it and its ready event
        once the leader sees it online."""
        p = await spawn_query_node(self.etcd, self.root, log_dir, "--ttl", "2", *args,
                                   name=f"querynode-{len(self.procs)}", env=env, timeout=timeout)
        self.procs.append(p)
        await self.wait_node_online(p.node_id, timeout=timeout)
        return p, p.ready

    async def wait_node_online(self, node_id: int, timeout: float = 60.0) -> None:
        """Until the leader counts ``node_id`` among its online nodes and has taken it in (its incarnation
        recorded: ``record_joined`` done), so a snapshot of etcd taken next holds everything its joining wrote."""
        deadline = time.monotonic() + timeout
        while True:
            lead = (await self.wait_leader(timeout=max(0.1, deadline - time.monotonic()))).coord.leadership
            if lead is not None and lead.nodes.is_online(node_id) and node_id not in lead.nodes.joining:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"query node {node_id} not online at the leader within {timeout:.0f}s")
            await asyncio.sleep(0.05)

    async def create_collection(self, name: str, *, partitions: int, segments: int, channels: int = 2) -> int:
        leader = self.coords[0].coord
        assert leader.catalog is not None
        desc, _ = await leader.catalog.create_bulk_collection(
            name, num_partitions=partitions, num_segments=segments, num_channels=channels)
        return desc.collection_id

    async def wait_loaded(self, cid: int, timeout: float = 60.0) -> qc.ShowCollectionsResponse:
        assert self.client is not None
        return await wait_in_memory(self.client, cid, timeout)

    async def load_collection(self, cid: int, timeout: float = 60.0) -> Any:
        """LoadCollection accepted and then 100 % in memory; returns the answer (its ``task_id``)."""
        assert self.client is not None
        r = await self.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r
        await self.wait_loaded(cid, timeout)
        return r

    async def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no trigger is queued or running on the leader."""
        deadline = time.monotonic() + timeout
        while True:
            leader = await self.wait_leader()
            lead = leader.coord.leadership
            if lead is not None and not lead.scheduler.triggers:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"tasks still pending: {list(lead.scheduler.triggers) if lead else None}")
            await asyncio.sleep(0.1)

    def distribution(self) -> dict[int, querynode_pb2.GetDataDistributionResponse]:
        return {n.node_id: n.state.distribution() for n in self.nodes if n.healthy}

    async def task_keys(self) -> dict[str, int]:
        assert self.kv is not None
        return {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}

    async def wait_no_task_keys(self, timeout: float = 60.0) -> None:
        """Until no task key is left in etcd (every tree finished and removed); TimeoutError with what is left."""
        deadline = time.monotonic() + timeout
        while any((left := await self.task_keys()).values()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task keys left after {timeout:g}s: {left}; {await self._left_trees()}")
            await asyncio.sleep(0.1)

    async def _left_trees(self) -> str:
        """What the persisted tasks left are, and what the leader's scheduler knows of each (a failure's facts)."""
        assert self.kv is not None
        lead = next((c.coord.leadership for c in self.coords if c.coord.leadership is not None), None)
        out = []
        for rec in await TaskStore(self.kv).load_all():
            where = "no leader"
            if lead is not None:
                q = lead.scheduler.queue
                facts = (("queued", rec.id in q.triggers), ("running", rec.id in q.running),
                         ("started", rec.id in q.started), ("failing", rec.id in q.failing),
                         (f"cancel: {q.cancel_reason.get(rec.id)}", rec.id in q.cancel_reason),
                         ("in the heap", rec.id in q.queued_order()))
                where = ", ".join(f for f, on in facts if on) or "unknown to the leader"
            out.append(f"task {rec.id} kind {rec.kind} state {rec.state} parent {rec.parent_id} ({where})")
        return "; ".join(out) or "no task record"


async def node_info(c: QueryCluster, node_id: int) -> qc.NodeInfo:
    """What ShowNodes says of ``node_id``."""
    assert c.client is not None
    resp = await c.client.query("ShowNodes", qc.ShowNodesRequest())
    return next(n for n in resp.nodes if n.node_id == node_id)


async def drain(c: QueryCluster, node_id: int) -> qc.NodeLifecycleResponse:
    """DrainNode, which must be accepted."""
    assert c.client is not None
    r = await c.client.query("DrainNode", qc.NodeLifecycleRequest(node_id=node_id))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    return r


async def drain_waiting(c: QueryCluster, node_id: int, rounds: int = 300) -> str:
    """What the drain of ``node_id`` waits for, once ShowNodes says (polled ``rounds`` times, 0.1 s apart);
    "" when it never does."""
    for _ in range(rounds):
        if (await node_info(c, node_id)).drain.waiting:
            break
        await asyncio.sleep(0.1)
    return (await node_info(c, node_id)).drain.waiting


async def replica_number_recorded(c: QueryCluster, cid: int, number: int, rounds: int = 600) -> bool:
    """Whether etcd records ``number`` replicas of collection ``cid``: a fresh read of the meta, polled ``rounds``
    times 0.1 s apart until it does."""
    kv = c.kv
    assert kv is not None

    async def recorded() -> bool:
        fresh = QueryMeta(kv)
        await fresh.reload()
        info = fresh.get_collection(cid)
        return info is not None and info.replica_number == number

    for _ in range(rounds):
        if await recorded():
            break
        await asyncio.sleep(0.1)
    return await recorded()


def held_segments(node: QueryNode) -> set[int]:
    return set(node.state.segments)


@contextlib.asynccontextmanager
async def running_cluster(etcd: EtcdCluster, root: str, faults: Sequence[FaultConfig | None], *,
                          capacity: int = 1024 * MiB, scheduler: SchedulerConfig | None = None,
                          checker_interval: float | None = None) -> AsyncIterator[QueryCluster]:
    """A leader and one in-process query node per entry of ``faults`` (None: a healthy one); all stopped on exit."""
    async with QueryCluster(etcd, root, scheduler=scheduler) as c:
        if checker_interval is not None:
            c.config.checker_interval = checker_interval
        await c.start_coordinator()
        await c.wait_leader()
        for f in faults:
            await c.add_node(capacity=capacity, faults=f)
        yield c
