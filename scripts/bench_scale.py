"""Cost as the cluster grows: load time, etcd and coordinator memory per segment, takeover after SIGKILL, by size.

For each size in ``--sizes`` (loaded segments), on a fresh embedded etcd
(``--etcd-endpoints``: one root per size, removed afterwards):

Setup (not timed): the catalog (written straight to etcd with
``CatalogStore``, as any catalog process would): the main collection of N
segments in ``--partitions`` partitions and ``--queued`` spare collections
of one segment each; ``--nodes`` reference query nodes as in-process
``QueryNode`` objects *in this bench process* (session TTL 60 s: theirs is
not the TTL measured); then coordinator c0 as a real process
(``querycoord coord``, auto balance off, ``--http-listen``) until it leads
and sees every node.

Measured:

- **load_s**: ``LoadCollection`` of the main collection through the gRPC
  client until ``GetTask`` says EXPIRED (the coordinator finished the
  trigger: keys removed, history written) and ``ShowCollections`` 100 %.
  Sent once the fresh coordinator has copied the catalog for its checker
  (``settle_s``, until ``querycoord_checker_targets_revision`` is set): at a
  million segments that start-up copy ran beside the load and took a fifth
  of the coordinator's time during it.
- **etcd keys and bytes per segment**: every key under the root after the
  load (len(key) + len(value), paged reads), by top-level prefix; the
  table splits the catalog from the coordinator's own ``queryCoord-*``
  meta. The JSON value is the whole root (catalog included) per segment.
- **rss_kib_per_segment**: the coordinator is its own process, so its RSS
  (``VmRSS`` of /proc/<pid>/status) holds no node or client memory. Baseline:
  once it leads, the nodes are online and the catalog exists; after: once
  the load finished and two checker passes ran (the collected nodes'
  distributions are garbage by then). ``gc.collect`` cannot be called in
  another process; the coordinator raises its cyclic-GC thresholds
  (process.py), so uncollected cycles can only make the number larger:
  an upper bound. Peak (``VmHWM``) is in the table, and so is the steady
  state without the load's transient garbage: the new leader's RSS once it
  took over and reconciled, over the fresh coordinator's baseline
  (``reload_rss_kib_per_segment``, queued triggers included), and the
  standby's own RSS with its warm copy (``standby_rss_kib_per_segment``).
- **takeover**: standby c1 (a second ``querycoord coord``) waits, with its
  warm copy of the query meta read and followed (``--warm-standby 0``: no
  copy, the new leader reloads: the cold path); the nodes'
  mutating calls are gated shut and ``--queued`` LoadCollection requests of
  the spare collections are sent (each answered with a deadline error once
  queued, and sent again while some are missing: a repeated load joins the
  pending one; ``querycoord_tasks`` on c0's /metrics confirms they are
  persisted and pending: 8 dispatched and blocked at the nodes, the rest
  queued).
  Then c0 gets SIGKILL (t0). **lease_s**: until the election's leader key
  changes (polled on etcd every 5 ms): the session TTL's lease expiry, a
  physical floor of at most ``--ttl``. **takeover_over_ttl_s**: from there
  until c1 has printed its ``leader`` event (reloaded query meta, nodes and
  every persisted trigger; health SERVING) *and* its first checker pass
  (target vs every node's distribution) is done, i.e. reloaded and
  reconciled. The counter ``querycoord_checker_runs`` counts passes as they
  start, so c1 runs with a 0.05 s checker interval and the end of its first
  pass is when the counter reaches 2 (an upper bound by <= 0.05 s + a 20 ms
  poll). The gates then open;
  **drain_s** is until the resumed queue is empty (not part of takeover).

The last line printed is one JSON object with one entry per size::

    {"segments": [...], "load_s": [...], "takeover_over_ttl_s": [...], "rss_kib_per_segment": [...],
     "etcd_bytes_per_segment": [...], ...}

``--profile-standby DIR`` runs c1 under cProfile (DIR/standby-<segments>.prof, written when it exits).

Example (smoke, about 20 s): ``python scripts/bench_scale.py --sizes 2000 --queued 100 --ttl 3``.
At 1M segments expect ~10-15 minutes and ~4 GB for the coordinator plus ~2 GB for etcd.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from benchlib import BenchError, arg_parser, report, require_positive
from loguru import logger

from meta.client import connect
from meta.config import EtcdConfig
from meta.election import current_leader, election_prefix
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from proto import querycoord_pb2_grpc
from querycoord.catalog.store import CatalogStore
from querycoord.common.protocol import QUERYCOORD_ELECTION
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import QueryNode
from querycoord.security.grpc_channels import make_channel
from querycoord.tooling.harness import COORDINATOR, Harness, Member, coord_argv

MIB = 1 << 20
SEGMENT_MEM_BOUND = 8 * MIB  # as bench_load: node capacity never limits placement
EXPIRED, FAILED = qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED
NODE_TTL = 60.0
STANDBY_CHECKER_INTERVAL = 0.05


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


def scrape(http_address: str, timeout: float = 10.0) -> dict[str, float]:
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


# ----- one size ---------------------------------------------------------------------------------------------------
@dataclass
class SizeResult:
    segments: int
    catalog_s: float = 0.0
    settle_s: float = 0.0  # the fresh coordinator's start-up reads, before the load is sent
    load_s: float = 0.0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    hwm_kib: int = 0
    keys: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    queued: int = 0
    enqueue_s: float = 0.0
    lease_s: float = 0.0
    leader_event_s: float = 0.0  # kill -> leader event (reloaded, SERVING)
    reconciled_s: float = 0.0  # kill -> first checker pass done
    resumed: int = 0  # triggers pending on the new leader when it serves
    drain_s: float = 0.0
    c1_standby_kib: int = 0  # the standby's RSS before the kill (its warm copy of the query meta included)
    c1_rss_kib: int = 0  # and once it leads and reconciled
    meta_source: str = ""  # where the new leader's query meta came from: "warm standby copy" or "reload"

    @property
    def reload_kib_per_segment(self) -> float:
        """The new leader's steady state over a fresh coordinator's baseline (c0's before the load)."""
        return (self.c1_rss_kib - self.rss_before_kib) / self.segments

    @property
    def standby_kib_per_segment(self) -> float:
        return (self.c1_standby_kib - self.rss_before_kib) / self.segments

    @property
    def rss_kib_per_segment(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / self.segments

    @property
    def takeover_over_ttl_s(self) -> float:
        return self.reconciled_s - self.lease_s

    def per_segment(self, counter: Counter[str], meta_only: bool = False) -> float:
        total = sum(v for k, v in counter.items() if not meta_only or k.startswith("queryCoord-"))
        return total / self.segments


async def load_main(qclient: QueryCoordClient, cid: int, poll: float, timeout: float) -> float:
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


async def enqueue_loads(address: str, cids: list[int], concurrency: int = 200) -> None:
    """LoadCollection of each spare collection with a 1 s deadline: the coordinator persists and queues the
    trigger, then answers a deadline error (the load waits for its plan, which waits for a free trigger slot)."""
    channel = make_channel(address)
    stub = querycoord_pb2_grpc.QueryCoordStub(channel)
    sem = asyncio.Semaphore(concurrency)

    async def one(cid: int) -> None:
        async with sem:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.LoadCollection(qc.LoadCollectionRequest(collection_id=cid), timeout=1.0)

    try:
        await asyncio.gather(*(one(c) for c in cids))
    finally:
        await channel.close()


async def one_size(config: EtcdConfig, args: argparse.Namespace, segments: int, work: Path) -> SizeResult:
    res = SizeResult(segments)
    root = f"bench/{uuid.uuid4().hex[:8]}"
    client = await connect(config)
    kv = MetaKV(client, root)
    gate = asyncio.Event()
    gate.set()
    nodes: list[GatedQueryNode] = []
    harness = Harness(config.endpoints, root, work / f"s{segments}", ttl=args.ttl, log_level="WARNING",
                      start_timeout=120)
    (work / f"s{segments}").mkdir(parents=True, exist_ok=True)
    qclient: QueryCoordClient | None = None
    try:
        catalog = CatalogStore(kv)
        t = time.perf_counter()
        desc, seg_ids = await catalog.create_bulk_collection(f"scale_{segments}", num_partitions=args.partitions,
                                                             num_segments=segments, num_channels=args.channels)
        if len(seg_ids) != segments:
            raise BenchError(f"the catalog created {len(seg_ids)} segments, expected {segments}")
        spare: list[int] = []
        for i in range(args.queued):
            d, _ = await catalog.create_bulk_collection(f"spare_{i}", num_partitions=1, num_segments=1,
                                                        num_channels=1, rows_per_segment=100)
            spare.append(d.collection_id)
        res.catalog_s = time.perf_counter() - t
        del seg_ids
        gc.collect()
        logger.info("{:,} segments: catalog in {:.1f}s", segments, res.catalog_s)
        # The nodes start after the catalog (building a million segments blocks this loop for long stretches)
        # and with a long session TTL: theirs is not the TTL measured, and a busy bench must not lose them.
        capacity = max(1024 * MIB, -(-segments * SEGMENT_MEM_BOUND // args.nodes) * 2)
        for _ in range(args.nodes):
            n = GatedQueryNode(kv, capacity_bytes=capacity, ttl=max(args.ttl, NODE_TTL), gate=gate)
            await n.start()
            nodes.append(n)

        common = ("--auto-balance-interval", "0", "--http-listen", "127.0.0.1:0", "--rpc-timeout", "120",
                  "--trigger-timeout", str(args.timeout), "--warm-standby", str(args.warm_standby))
        c0 = await harness.start_coordinator(0, "127.0.0.1:0", *common,
                                             "--checker-interval", str(args.checker_interval))
        await harness.wait_leader(120)
        qclient = QueryCoordClient([c0.address], deadline=args.timeout, call_timeout=args.timeout)

        async def all_online() -> bool:
            got = await qclient.query("ShowNodes", qc.ShowNodesRequest())
            return len(got.nodes) == args.nodes

        await wait_until(f"{args.nodes} query nodes online at the leader", all_online, 60, 0.1)
        await asyncio.sleep(1.0)
        res.rss_before_kib = proc_status_kib(c0.child.pid, "VmRSS")  # before its catalog copy: counted per segment
        # A fresh coordinator first copies the whole catalog for its checker (a million records: many seconds);
        # a load sent meanwhile would be timed with that start-up work in it.
        settle = time.perf_counter()

        async def targets_copied() -> bool:
            metrics = await asyncio.to_thread(scrape, str(c0.ready["http_address"]))
            return metrics.get("querycoord_checker_targets_revision", 0) > 0

        await wait_until("the coordinator's copy of the catalog", targets_copied, args.timeout, 0.2)
        res.settle_s = time.perf_counter() - settle

        res.load_s = await load_main(qclient, desc.collection_id, args.poll, args.timeout)
        logger.info("{:,} segments: loaded in {:.2f}s", segments, res.load_s)
        http0 = str(c0.ready["http_address"])
        runs0 = await metric(http0, "querycoord_checker_runs") or 0.0
        await wait_until("two checker passes after the load",
                         lambda: _at_least(http0, "querycoord_checker_runs", runs0 + 2), args.timeout, 0.2)
        res.rss_after_kib = proc_status_kib(c0.child.pid, "VmRSS")
        res.hwm_kib = proc_status_kib(c0.child.pid, "VmHWM")
        res.keys, res.bytes = await etcd_usage(kv)
        logger.info("{:,} segments: coordinator RSS {} -> {} KiB (peak {}), etcd {:,} keys {:,} bytes", segments,
                    res.rss_before_kib, res.rss_after_kib, res.hwm_kib, sum(res.keys.values()),
                    sum(res.bytes.values()))

        # ----- the takeover --------------------------------------------------------------------------------
        # The standby's checker runs again STANDBY_CHECKER_INTERVAL after a pass: its second pass starting marks
        # the end of the first (the runs counter counts passes as they start).
        flags = (*common, "--checker-interval", str(STANDBY_CHECKER_INTERVAL))
        if args.profile_standby:  # cProfile writes its file when the process exits (SIGTERM at the end)
            out = args.profile_standby / f"standby-{segments}.prof"
            argv = coord_argv(config.endpoints, root, "127.0.0.1:0", args.ttl, *flags, log_level="WARNING")
            c1 = await harness.start(COORDINATOR, 1, ["-m", "cProfile", "-o", str(out), *argv])
            logger.info("standby under cProfile, profile in {}", out)
        else:
            c1 = await harness.start_coordinator(1, "127.0.0.1:0", *flags)
        prefix = election_prefix(QUERYCOORD_ELECTION)

        async def both_campaign() -> bool:  # a standby prints no event: its election key says it waits
            return await kv.count_prefix(prefix) >= 2

        await wait_until("the standby's election key", both_campaign, 120, 0.05)
        if args.warm_standby:
            # A standby that has run for a while holds its copy: wait for it (at a million segments the first
            # read takes tens of seconds), as a failover in production would find it.
            http_standby = str(c1.ready["http_address"])
            await wait_until("the standby's copy of the query meta",
                             lambda: _at_least(http_standby, "querycoord_warm_standby_revision", 1),
                             args.timeout, 0.2)
        await asyncio.sleep(1.0)
        res.c1_standby_kib = proc_status_kib(c1.child.pid, "VmRSS")
        gate.clear()
        t = time.perf_counter()
        want = float(args.queued)
        for _ in range(10):  # a request whose deadline passed before a busy leader got to it queued nothing:
            await enqueue_loads(c0.address, spare)  # ask again (a repeated load joins the one pending)
            with contextlib.suppress(BenchError):
                await wait_until(f"{args.queued} spare loads pending on the leader",
                                 lambda: _at_least(http0, "querycoord_tasks", want), 60, 0.2)
                break
        else:
            raise BenchError(f"{args.queued} spare loads were never all pending on the leader")
        res.enqueue_s = time.perf_counter() - t
        res.queued = int(await metric(http0, "querycoord_tasks") or 0)
        res.lease_s, res.leader_event_s, res.reconciled_s, res.resumed, res.meta_source = await kill_and_take_over(
            harness, kv, c0, c1, args)
        http1 = str(c1.ready["http_address"])
        res.c1_rss_kib = proc_status_kib(c1.child.pid, "VmRSS")
        logger.info("{:,} segments: {} queued; lease {:.2f}s, leader event {:.2f}s, reconciled {:.2f}s after the "
                    "kill; {} pending; new leader RSS {} -> {} KiB", segments, res.queued, res.lease_s,
                    res.leader_event_s, res.reconciled_s, res.resumed, res.c1_standby_kib, res.c1_rss_kib)
        gate.set()
        t = time.perf_counter()

        async def drained() -> bool:
            return await metric(http1, "querycoord_tasks") == 0.0

        await wait_until("the resumed queue to drain", drained, args.timeout, 0.2)
        res.drain_s = time.perf_counter() - t
        return res
    finally:
        gate.set()
        if qclient is not None:
            await qclient.close()
        await harness.stop(10)
        for n in nodes:
            with contextlib.suppress(Exception):
                await n.stop()
        if args.etcd_endpoints:
            with contextlib.suppress(Exception):
                await kv.remove_prefix("")
        await client.close()


async def _at_least(http_address: str, name: str, value: float) -> bool:
    got = await metric(http_address, name)
    return got is not None and got >= value


async def kill_and_take_over(harness: Harness, kv: MetaKV, c0: Member, c1: Member,
                             args: argparse.Namespace) -> tuple[float, float, float, int, str]:
    """SIGKILL c0; (lease_s, leader_event_s, reconciled_s, triggers pending at the new leader, where its query
    meta came from), times from the kill."""
    prefix = election_prefix(QUERYCOORD_ELECTION)
    before = await current_leader(kv, prefix)
    if before is None:
        raise BenchError("no leader key in etcd before the kill")
    since = len(c1.child.events)
    c0.state = "dead"  # as Harness.kill, without waiting to reap it: the clock starts at the signal
    t_kill = c0.child.kill_now()
    deadline = time.monotonic() + 10 * args.ttl + 60
    while True:
        now = await current_leader(kv, prefix)
        if now is None or now.key != before.key:
            lease_s = time.time() - t_kill
            break
        if time.monotonic() > deadline:
            raise BenchError("the dead leader's key never went away")
        await asyncio.sleep(0.005)
    ev = await c1.child.wait_event("leader", timeout=args.timeout, since=since)
    leader_event_s = float(ev["t"]) - t_kill
    http1 = str(c1.ready["http_address"])
    await wait_until("the new leader's first checker pass to end",
                     lambda: _at_least(http1, "querycoord_checker_runs", 2), args.timeout, 0.02)
    reconciled_s = time.time() - t_kill
    pending = int(await metric(http1, "querycoord_tasks") or 0)
    return lease_s, leader_event_s, reconciled_s, pending, str((ev.get("takeover") or {}).get("meta_source", ""))


# ----- report -----------------------------------------------------------------------------------------------------
def size_rows(r: SizeResult, args: argparse.Namespace) -> list[tuple[str, str]]:
    keys_seg, bytes_seg = r.per_segment(r.keys), r.per_segment(r.bytes)
    meta_keys, meta_bytes = r.per_segment(r.keys, True), r.per_segment(r.bytes, True)
    by_prefix = ", ".join(f"{k} {r.keys[k]:,} keys/{r.bytes[k] / MIB:.1f} MiB" for k in sorted(r.keys))
    return [
        (f"== {r.segments:,} segments", f"{args.nodes} in-process nodes, {args.partitions} partitions, "
                                        f"catalog written in {r.catalog_s:.1f}s"),
        ("catalog copied by coordinator", f"{r.settle_s:.1f} s after its nodes were online (for its checker; "
                                          f"the load is sent then)"),
        ("load_s", f"{r.load_s:.2f} s ({r.load_s / r.segments * 1e6:.1f} us per segment)"),
        ("etcd under the root", f"{sum(r.keys.values()):,} keys, {sum(r.bytes.values()) / MIB:.1f} MiB: "
                                f"{keys_seg:.2f} keys, {bytes_seg:.0f} bytes per segment"),
        ("  of which coordinator meta", f"{meta_keys:.2f} keys, {meta_bytes:.0f} bytes per segment"),
        ("  by prefix", by_prefix),
        ("coordinator RSS", f"{r.rss_before_kib / 1024:.0f} -> {r.rss_after_kib / 1024:.0f} MiB "
                            f"(peak {r.hwm_kib / 1024:.0f} MiB): {r.rss_kib_per_segment:.2f} KiB per segment"),
        ("queued at the kill", f"{r.queued} triggers pending (asked {args.queued}; enqueued in {r.enqueue_s:.1f}s)"),
        ("lease expiry (kill -> key gone)", f"{r.lease_s:.2f} s (TTL {args.ttl:g} s)"),
        ("kill -> leader event (SERVING)", f"{r.leader_event_s:.2f} s (+{r.leader_event_s - r.lease_s:.2f} s over "
                                           f"the lease; query meta from the {r.meta_source or '?'}; {r.resumed} "
                                           f"triggers pending at the new leader)"),
        ("kill -> first checker pass done", f"{r.reconciled_s:.2f} s (+{r.reconciled_s - r.leader_event_s:.2f} s "
                                            f"after SERVING)"),
        ("takeover_over_ttl_s", f"{r.takeover_over_ttl_s:.2f} s"),
        ("standby RSS", f"{r.c1_standby_kib / 1024:.0f} MiB: {r.standby_kib_per_segment:.2f} KiB per segment over "
                        f"a fresh coordinator's {r.rss_before_kib / 1024:.0f} MiB"),
        ("new leader RSS", f"{r.c1_rss_kib / 1024:.0f} MiB once reconciled: {r.reload_kib_per_segment:.2f} KiB per "
                           f"segment over a fresh coordinator's (queued triggers included)"),
        ("drain of the resumed queue", f"{r.drain_s:.2f} s (after the gates opened; not part of the takeover)"),
    ]


async def run_size(args: argparse.Namespace, segments: int, work: Path) -> SizeResult:
    if args.etcd_endpoints:
        return await one_size(EtcdConfig.from_endpoints(args.etcd_endpoints), args, segments, work)
    cluster = EtcdCluster(work / f"etcd-{segments}", size=1, quota_backend_bytes=args.quota_gb << 30)
    await asyncio.to_thread(cluster.start)
    try:
        print(f"embedded etcd pid {cluster.members[0].pid} on {cluster.members[0].endpoint}", file=sys.stderr,
              flush=True)
        return await one_size(cluster.config(), args, segments, work)
    finally:
        await asyncio.to_thread(cluster.stop)


def run(args: argparse.Namespace) -> dict[str, object]:
    results: list[SizeResult] = []

    async def all_sizes() -> None:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            for n in args.sizes:
                r = await run_size(args, n, Path(tmp))
                results.append(r)
                print(fmt_table(size_rows(r, args)), file=args.out, flush=True)

    asyncio.run(all_sizes())
    if len(results) > 1:
        a, b = results[0], results[-1]
        scale = b.segments / a.segments
        print(fmt_table([("linearity", f"load_s x{b.load_s / a.load_s:.1f} for segments x{scale:.0f}; "
                                       f"takeover_over_ttl_s x{b.takeover_over_ttl_s / a.takeover_over_ttl_s:.1f}")]),
              file=args.out, flush=True)
    return {
        "segments": [r.segments for r in results],
        "load_s": [round(r.load_s, 3) for r in results],
        "settle_s": [round(r.settle_s, 2) for r in results],
        "takeover_over_ttl_s": [round(r.takeover_over_ttl_s, 3) for r in results],
        "rss_kib_per_segment": [round(r.rss_kib_per_segment, 3) for r in results],
        "reload_rss_kib_per_segment": [round(r.reload_kib_per_segment, 3) for r in results],
        "standby_rss_kib_per_segment": [round(r.standby_kib_per_segment, 3) for r in results],
        "meta_source": [r.meta_source for r in results],
        "serving_over_ttl_s": [round(r.leader_event_s - r.lease_s, 3) for r in results],
        "etcd_bytes_per_segment": [round(r.per_segment(r.bytes), 1) for r in results],
        "etcd_keys_per_segment": [round(r.per_segment(r.keys), 3) for r in results],
        "lease_s": [round(r.lease_s, 3) for r in results],
        "queued": [r.queued for r in results],
        "drain_s": [round(r.drain_s, 3) for r in results],
    }


def fmt_table(rows: list[tuple[str, str]]) -> str:
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a.ljust(w)}  {b}" for a, b in rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__, verbose_help="log progress to stderr")
    g = p.add_argument_group("sizes")
    g.add_argument("--sizes", default="10000,100000,1000000",
                   help="loaded segments, comma separated (default 10000,100000,1000000)")
    g.add_argument("--queued", type=int, default=1000, help="triggers queued at the kill (default 1000)")
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
    g.add_argument("--profile-standby", metavar="DIR",
                   help="run the standby under cProfile; DIR/standby-<segments>.prof covers its takeover")
    args = p.parse_args(argv)
    try:
        args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error(f"--sizes: not a list of integers: {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        p.error("--sizes needs positive integers")
    if args.profile_standby:
        args.profile_standby = Path(args.profile_standby).resolve()
    require_positive(p, args, ("queued", "nodes", "partitions", "channels", "quota_gb"))
    if args.ttl < 2:
        p.error("--ttl must be >= 2")
    if min(args.poll, args.timeout, args.checker_interval) <= 0:
        p.error("--poll, --timeout and --checker-interval must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = sys.stdout
    return report(lambda: run(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
