"""The cluster the scale benchmarks (``bench_scale.py``, ``bench_scale_ops.py``) measure, and their probes.

``ScaleCluster.start``: on an etcd root of its own, the catalog (written straight
to etcd with ``CatalogStore``, as any catalog process would): one collection of N
segments in ``--partitions`` partitions and ``spares`` collections of one segment
each; ``--nodes`` reference query nodes as in-process ``QueryNode`` objects in the
bench process (session TTL 60 s: theirs is not a TTL measured; their mutating
calls wait while ``gate`` is clear); then coordinator c0 as a real process
(``querycoord coord``, auto balance off, ``--http-listen``) until it leads, sees
every node and has copied the catalog for its checker. ``close`` stops all of it
and removes the root. The probes read a coordinator from outside: /proc, /metrics,
gRPC, the leader key.

Imported by the scripts as a sibling module (see ``benchlib``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import re
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from benchlib import BenchError, require_positive
from loguru import logger

from meta.client import EtcdClient, connect
from meta.config import EtcdConfig
from meta.election import current_leader, election_prefix
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.common.protocol import QUERYCOORD_ELECTION
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import QueryNode
from querycoord.tooling.harness import Harness, Member

T = TypeVar("T")
MIB = 1 << 20
SEGMENT_MEM_BOUND = 8 * MIB  # as bench_load: node capacity never limits placement
EXPIRED, FAILED = qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED
NODE_TTL = 60.0


# ----- options -----------------------------------------------------------------------------------------------------
def add_scale_options(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The options both scale benches take; ``check_scale_options`` validates them."""
    g = p.add_argument_group("sizes")
    g.add_argument("--sizes", default="10000,100000,1000000",
                   help="loaded segments, comma separated (default 10000,100000,1000000)")
    g.add_argument("--nodes", type=int, default=8, help="in-process reference query nodes (default 8)")
    g.add_argument("--partitions", type=int, default=16, help="partitions of the main collection (default 16)")
    g.add_argument("--channels", type=int, default=2, help="DM channels of the main collection (default 2)")
    g.add_argument("--ttl", type=float, default=10.0, help="coordinators' session TTL (default 10)")
    g.add_argument("--warm-standby", type=int, choices=(0, 1), default=1,
                   help="coordinators' --warm-standby: 1 (default) the standby follows the query meta; 0 it reloads "
                        "it when it takes over (the cold path)")
    g.add_argument("--checker-interval", type=float, default=5.0, help="coordinators' checker interval (default 5)")
    g.add_argument("--poll", type=float, default=0.05, help="GetTask poll interval (default 0.05)")
    g.add_argument("--timeout", type=float, default=3600.0, help="give up on any wait after this (default 3600)")
    g.add_argument("--quota-gb", type=int, default=8, help="embedded etcd's backend quota (default 8)")
    g.add_argument("--coord-logs", metavar="DIR",
                   help="keep the coordinators' logs, at INFO, in DIR/s<segments>/ (default: at WARNING, in a "
                        "temporary directory removed at the end): a timeline of a move or a takeover")
    g.add_argument("--coord-log-level", choices=("INFO", "DEBUG", "TRACE"), default="INFO",
                   help="their level with --coord-logs (default INFO)")
    return g


def check_scale_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        p.error("--sizes needs positive integers")
    require_positive(p, args, ("nodes", "partitions", "channels", "quota_gb"))
    if args.ttl < 2:
        p.error("--ttl must be >= 2")
    if min(args.poll, args.timeout, args.checker_interval) <= 0:
        p.error("--poll, --timeout and --checker-interval must be > 0")
    if args.coord_logs:
        args.coord_logs = Path(args.coord_logs).resolve()


async def on_fresh_etcd(args: argparse.Namespace, segments: int, work: Path,
                        measure: Callable[[EtcdConfig], Coroutine[Any, Any, T]]) -> T:
    """``measure`` on ``--etcd-endpoints``, else on an embedded member of its own (one per size)."""
    if args.etcd_endpoints:
        return await measure(EtcdConfig.from_endpoints(args.etcd_endpoints))
    cluster = EtcdCluster(work / f"etcd-{segments}", size=1, quota_backend_bytes=args.quota_gb << 30)
    await asyncio.to_thread(cluster.start)
    try:
        print(f"embedded etcd pid {cluster.members[0].pid} on {cluster.members[0].endpoint}, data dir "
              f"{cluster.members[0].data_dir}", file=sys.stderr, flush=True)
        return await measure(cluster.config())
    finally:
        await asyncio.to_thread(cluster.stop)


# ----- nodes whose mutating calls can be held --------------------------------------------------------------------
class GatedQueryNode(QueryNode):
    """A reference query node whose mutating calls wait while ``gate`` is clear (reads are never held): the
    bench keeps triggers dispatched-but-unfinished, so a queue is still there when the leader is killed."""

    def __init__(self, *args: Any, gate: asyncio.Event, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.gate = gate

    async def mutate(self, kind: str, request: Any, apply: Callable[[Any], object], response: Callable[..., Any],
                     context: grpc.aio.ServicerContext | None) -> Any:
        await self.gate.wait()
        return await super().mutate(kind, request, apply, response, context)


# ----- process and metrics probes --------------------------------------------------------------------------------
def proc_status_kib(pid: int, field_name: str) -> int:
    """A ``VmRSS``/``VmHWM`` line of /proc/<pid>/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise BenchError(f"no {field_name} for pid {pid}")


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def scrape(http_address: str, timeout: float = 30.0) -> dict[str, float]:
    """The coordinator's /metrics, summed by metric name over labels (``_total`` kept as exposed)."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


async def metric(http_address: str, name: str) -> float | None:
    """One metric of a coordinator; None when /metrics did not answer in time (a busy event loop)."""
    try:
        got = await asyncio.to_thread(scrape, http_address)
    except OSError as exc:
        logger.info("scrape of {} failed: {}", http_address, exc)
        return None
    return got.get(name, got.get(name + "_total", 0.0))


async def at_least(http_address: str, name: str, value: float) -> bool:
    got = await metric(http_address, name)
    return got is not None and got >= value


async def wait_until(what: str, predicate: Callable[[], Awaitable[bool]], timeout: float,
                     interval: float = 0.05) -> None:
    """Await ``predicate()`` (an async callable) until true; ``BenchError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def etcd_usage(kv: MetaKV, page: int = 5000) -> tuple[Counter[str], Counter[str]]:
    """(keys, bytes) under the root by top-level prefix; bytes = len(key) + len(value) as etcd stores them."""
    keys: Counter[str] = Counter()
    size: Counter[str] = Counter()
    start = ""
    while True:
        kvs, more = await kv.range_page("", start=start, limit=page)
        for item in kvs:
            top = item.key.split("/", 1)[0]
            keys[top] += 1
            size[top] += len(kv.abs_key(item.key)) + len(item.value)
        if not more or not kvs:
            return keys, size
        start = kvs[-1].key + "\x00"


async def load_main(qclient: QueryCoordClient, cid: int, poll: float, timeout: float) -> float:
    """``LoadCollection`` of ``cid`` until ``GetTask`` says EXPIRED and ``ShowCollections`` 100 %; seconds."""
    t0 = time.perf_counter()
    resp = await qclient.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    if resp.status.error_code != 0 or not resp.task_id:
        raise BenchError(f"LoadCollection refused: {resp.status.reason or resp}")
    while True:
        r = await qclient.query("GetTask", qc.GetTaskRequest(task_id=resp.task_id, children_limit=1))
        state = r.tree.trigger.state
        if r.status.error_code == 0 and state == FAILED:
            raise BenchError(f"the load failed: {r.tree.trigger.error}")
        if r.status.error_code == 0 and state == EXPIRED:
            show = await qclient.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
            if show.status.error_code == 0 and show.collections[0].in_memory_percentage == 100:
                return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise BenchError(f"the load did not finish within {timeout:.0f}s")
        await asyncio.sleep(poll)


@dataclass
class Takeover:
    """A leader's SIGKILL and what followed, in seconds from the signal."""

    lease_s: float  # until the election's leader key changed: the session TTL's expiry
    leader_event_s: float  # the new leader printed its ``leader`` event (reloaded, SERVING)
    reconciled_s: float  # the new leader's first checker pass finished
    pending: int  # triggers pending at the new leader then
    meta_source: str  # where its query meta came from: "warm standby copy" or "reload"
    steps: dict[str, float] = field(default_factory=dict)  # the takeover's steps, seconds (its ``leader`` event)


async def kill_and_take_over(kv: MetaKV, c0: Member, c1: Member, timeout: float, ttl: float,
                             before_kill: Callable[[], Awaitable[None]] | None = None) -> Takeover:
    """SIGKILL c0 (``before_kill`` awaited just before the signal) and follow c1 until it leads and reconciled.

    The end of c1's first pass is ``querycoord_checker_passes`` reaching 1 (passes counted as they finish)."""
    prefix = election_prefix(QUERYCOORD_ELECTION)
    before = await current_leader(kv, prefix)
    if before is None:
        raise BenchError("no leader key in etcd before the kill")
    leading = before.value.decode(errors="replace")
    if leading != c0.address:
        raise BenchError(f"c0 ({c0.address}) no longer leads at the takeover step, {leading} does: "
                         f"{unplanned_change(c0, c1)}")
    since = len(c1.child.events)
    if before_kill is not None:
        await before_kill()
    c0.state = "dead"  # as Harness.kill, without waiting to reap it: the clock starts at the signal
    t_kill = c0.child.kill_now()
    deadline = time.monotonic() + 10 * ttl + 60
    while True:
        now = await current_leader(kv, prefix)
        if now is None or now.key != before.key:
            lease_s = time.time() - t_kill
            break
        if time.monotonic() > deadline:
            raise BenchError("the dead leader's key never went away")
        await asyncio.sleep(0.005)
    ev = await c1.child.wait_event("leader", timeout=timeout, since=since)
    leader_event_s = float(ev["t"]) - t_kill
    http1 = str(c1.ready["http_address"])
    await wait_until("the new leader's first checker pass to end",
                     lambda: at_least(http1, "querycoord_checker_passes", 1), timeout, 0.02)
    reconciled_s = time.time() - t_kill
    pending = int(await metric(http1, "querycoord_tasks") or 0)
    said = ev.get("takeover") or {}
    steps = {"meta": float(said.get("meta_s", 0.0)), **{k: float(v) for k, v in (said.get("steps") or {}).items()}}
    return Takeover(lease_s, leader_event_s, reconciled_s, pending, str(said.get("meta_source", "")), steps)


def unplanned_change(c0: Member, c1: Member) -> str:
    """What the coordinators said of their roles, for an error when leadership moved with no kill asking it to:
    at a large size that means the leader's loop was blocked past its session TTL, or the leader died."""
    said = [f"{name} {ev.get('event')} at {float(ev.get('t', 0)):.1f}"
            for name, member in (("c0", c0), ("c1", c1)) for ev in member.child.events
            if ev.get("event") in ("leader", "standby")]
    alive = "running" if c0.child.running else f"exited with code {c0.child.proc.returncode}"
    return f"c0 is {alive}; role events: {', '.join(said) or 'none'}; c0's log ends:\n{c0.child.log_tail()}"


async def wait_for_standby(kv: MetaKV, c1: Member, warm: int, timeout: float) -> None:
    """Until c1 campaigns and, with ``--warm-standby 1``, holds its copy of the query meta (at a million
    segments the first read takes tens of seconds), as a failover in production would find it."""
    prefix = election_prefix(QUERYCOORD_ELECTION)

    async def both_campaign() -> bool:  # a standby prints no event: its election key says it waits
        return await kv.count_prefix(prefix) >= 2

    await wait_until("the standby's election key", both_campaign, 120, 0.05)
    if warm:
        http_standby = str(c1.ready["http_address"])
        await wait_until("the standby's copy of the query meta",
                         lambda: at_least(http_standby, "querycoord_warm_standby_revision", 1), timeout, 0.2)
    await asyncio.sleep(1.0)


# ----- the cluster ---------------------------------------------------------------------------------------------------
@dataclass
class ScaleCluster:
    """One size's cluster (see the module docstring); ``start`` builds it, ``close`` ends it."""

    args: argparse.Namespace
    segments: int
    client: EtcdClient
    kv: MetaKV
    harness: Harness
    work: Path
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    nodes: list[GatedQueryNode] = field(default_factory=list)
    c0: Member | None = None
    qclient: QueryCoordClient | None = None
    collection_id: int = 0
    spare: list[int] = field(default_factory=list)
    node_capacity: int = 0
    catalog_s: float = 0.0
    settle_s: float = 0.0  # the fresh coordinator's copy of the catalog, before the load is sent
    rss_before_kib: int = 0  # c0 once it leads and sees its nodes, before its catalog copy

    @property
    def leader(self) -> Member:
        assert self.c0 is not None
        return self.c0

    @property
    def client_of_c0(self) -> QueryCoordClient:
        assert self.qclient is not None
        return self.qclient

    @property
    def http0(self) -> str:
        return str(self.leader.ready["http_address"])

    def common_flags(self) -> tuple[str, ...]:
        """The flags every coordinator of the bench gets."""
        return ("--auto-balance-interval", "0", "--http-listen", "127.0.0.1:0", "--rpc-timeout", "120",
                "--trigger-timeout", str(self.args.timeout), "--warm-standby", str(self.args.warm_standby))

    @classmethod
    async def start(cls, config: EtcdConfig, args: argparse.Namespace, segments: int, work: Path, *,
                    spares: int = 0, node_capacity: int = 0,
                    start_c0: Callable[[ScaleCluster], Awaitable[Member]] | None = None) -> ScaleCluster:
        """The cluster of one size; ``node_capacity`` 0: each node twice its even share of the segments;
        ``start_c0`` starts the first coordinator (default: ``harness.start_coordinator`` with the common
        flags)."""
        root = f"bench/{uuid.uuid4().hex[:8]}"
        client = await connect(config)
        logs = (args.coord_logs or work) / f"s{segments}"
        logs.mkdir(parents=True, exist_ok=True)
        level = args.coord_log_level if args.coord_logs else "WARNING"
        harness = Harness(config.endpoints, root, logs, ttl=args.ttl, log_level=level, start_timeout=120)
        self = cls(args, segments, client, MetaKV(client, root), harness, work)
        self.gate.set()
        try:
            await self._start(spares, node_capacity, start_c0)
        except BaseException:
            await self.close()
            raise
        return self

    async def _start(self, spares: int, node_capacity: int,
                     start_c0: Callable[[ScaleCluster], Awaitable[Member]] | None) -> None:
        args, segments = self.args, self.segments
        catalog = CatalogStore(self.kv)
        t = time.perf_counter()
        desc, seg_ids = await catalog.create_bulk_collection(f"scale_{segments}", num_partitions=args.partitions,
                                                             num_segments=segments, num_channels=args.channels)
        if len(seg_ids) != segments:
            raise BenchError(f"the catalog created {len(seg_ids)} segments, expected {segments}")
        self.collection_id = desc.collection_id
        for i in range(spares):
            d, _ = await catalog.create_bulk_collection(f"spare_{i}", num_partitions=1, num_segments=1,
                                                        num_channels=1, rows_per_segment=100)
            self.spare.append(d.collection_id)
        self.catalog_s = time.perf_counter() - t
        del seg_ids
        gc.collect()
        logger.info("{:,} segments: catalog in {:.1f}s", segments, self.catalog_s)
        # The nodes start after the catalog (building a million segments blocks this loop for long stretches)
        # and with a long session TTL: theirs is not the TTL measured, and a busy bench must not lose them.
        self.node_capacity = node_capacity or max(1024 * MIB, -(-segments * SEGMENT_MEM_BOUND // args.nodes) * 2)
        for _ in range(args.nodes):
            await self.add_node()
        self.c0 = await (start_c0(self) if start_c0 is not None else self.harness.start_coordinator(
            0, "127.0.0.1:0", *self.common_flags(), "--checker-interval", str(args.checker_interval)))
        await self.harness.wait_leader(120)
        self.qclient = QueryCoordClient([self.c0.address], deadline=args.timeout, call_timeout=args.timeout)

        async def all_online() -> bool:
            got = await self.client_of_c0.query("ShowNodes", qc.ShowNodesRequest())
            return sum(n.state == "online" for n in got.nodes) == args.nodes

        await wait_until(f"{args.nodes} query nodes online at the leader", all_online, 60, 0.1)
        await asyncio.sleep(1.0)
        self.rss_before_kib = proc_status_kib(self.c0.child.pid, "VmRSS")  # before its catalog copy
        # A fresh coordinator first copies the whole catalog for its checker (a million records: many seconds);
        # a load sent meanwhile would be timed with that start-up work in it.
        settle = time.perf_counter()
        await wait_until("the coordinator's copy of the catalog",
                         lambda: at_least(self.http0, "querycoord_checker_targets_revision", 1), args.timeout, 0.2)
        self.settle_s = time.perf_counter() - settle

    async def add_node(self) -> GatedQueryNode:
        n = GatedQueryNode(self.kv, capacity_bytes=self.node_capacity, ttl=max(self.args.ttl, NODE_TTL),
                           gate=self.gate)
        await n.start()
        self.nodes.append(n)
        return n

    async def close(self) -> None:
        self.gate.set()
        if self.qclient is not None:
            await self.qclient.close()
        await self.harness.stop(10)
        for n in self.nodes:
            with contextlib.suppress(Exception):
                await n.stop()
        if self.args.etcd_endpoints:
            with contextlib.suppress(Exception):
                await self.kv.remove_prefix("")
        await self.client.close()
