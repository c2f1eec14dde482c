"""Cost as the cluster grows: load time, etcd and coordinator memory per segment, takeover after SIGKILL, by size.

For each size in ``--sizes`` (loaded segments), on a fresh embedded etcd
(``--etcd-endpoints``: one root per size, removed afterwards):

Setup (not timed; ``scale_cluster.py``, shared with ``bench_scale_ops.py``): the catalog (written straight to etcd with
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
  reconciled: ``querycoord_checker_passes`` (passes as they finish) reaches 1
  (an upper bound by a 20 ms poll; c1 runs with a 0.05 s checker interval, so
  its first pass starts at once). The gates then open;
  **drain_s** is until the resumed queue is empty (not part of takeover).

The last line printed is one JSON object with one entry per size::

    {"segments": [...], "load_s": [...], "takeover_over_ttl_s": [...], "rss_kib_per_segment": [...],
     "etcd_bytes_per_segment": [...], ...}

``--profile-standby DIR`` runs c1 under ``profiled_coord.py``: a cProfile from just before the kill until c1
reconciled (DIR/takeover-<segments>.prof; the top functions go to stderr). Profiling slows c1: take the timings
from a run without it.

Example (smoke, about 20 s): ``python scripts/bench_scale.py --sizes 2000 --queued 100 --ttl 3``.
At 1M segments expect ~10-15 minutes and ~4 GB for the coordinator plus ~2 GB for etcd.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import pstats
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from benchlib import BenchError, arg_parser, report, require_positive
from loguru import logger
from scale_cluster import (
    MIB,
    ScaleCluster,
    add_scale_options,
    at_least,
    check_scale_options,
    etcd_usage,
    kill_and_take_over,
    load_main,
    metric,
    on_fresh_etcd,
    proc_status_kib,
    wait_for_standby,
    wait_until,
)

from meta.config import EtcdConfig
from proto import querycoord_pb2 as qc
from proto import querycoord_pb2_grpc
from querycoord.security.grpc_channels import make_channel
from querycoord.tooling.harness import COORDINATOR, Member, coord_argv

SCRIPTS = Path(__file__).resolve().parent
STANDBY_CHECKER_INTERVAL = 0.05


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
    takeover_steps: dict[str, float] = field(default_factory=dict)  # the new leader's own breakdown

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
    cl = await ScaleCluster.start(config, args, segments, work, spares=args.queued)
    try:
        res.catalog_s, res.settle_s, res.rss_before_kib = cl.catalog_s, cl.settle_s, cl.rss_before_kib
        c0, kv, harness, http0 = cl.leader, cl.kv, cl.harness, cl.http0
        res.load_s = await load_main(cl.client_of_c0, cl.collection_id, args.poll, args.timeout)
        logger.info("{:,} segments: loaded in {:.2f}s", segments, res.load_s)
        runs0 = await metric(http0, "querycoord_checker_runs") or 0.0
        await wait_until("two checker passes after the load",
                         lambda: at_least(http0, "querycoord_checker_runs", runs0 + 2), args.timeout, 0.2)
        res.rss_after_kib = proc_status_kib(c0.child.pid, "VmRSS")
        res.hwm_kib = proc_status_kib(c0.child.pid, "VmHWM")
        res.keys, res.bytes = await etcd_usage(kv)
        logger.info("{:,} segments: coordinator RSS {} -> {} KiB (peak {}), etcd {:,} keys {:,} bytes", segments,
                    res.rss_before_kib, res.rss_after_kib, res.hwm_kib, sum(res.keys.values()),
                    sum(res.bytes.values()))

        # ----- the takeover --------------------------------------------------------------------------------
        flags = (*cl.common_flags(), "--checker-interval", str(STANDBY_CHECKER_INTERVAL))
        if args.profile_standby:  # profiled from the kill until reconciled (SIGUSR1, SIGUSR2: profiled_coord.py)
            raw = args.profile_standby / f"raw-{segments}"
            argv = coord_argv(config.endpoints, kv.root, "127.0.0.1:0", args.ttl, *flags, log_level=harness.log_level)
            c1 = await harness.start(COORDINATOR, 1, [str(SCRIPTS / "profiled_coord.py"),
                                                      str(raw), *argv])
            logger.info("standby under cProfile, profile of its takeover in {}", raw)
        else:
            c1 = await harness.start_coordinator(1, "127.0.0.1:0", *flags)
        await wait_for_standby(kv, c1, args.warm_standby, args.timeout)
        res.c1_standby_kib = proc_status_kib(c1.child.pid, "VmRSS")
        cl.gate.clear()
        t = time.perf_counter()
        want = float(args.queued)
        for _ in range(10):  # a request whose deadline passed before a busy leader got to it queued nothing:
            await enqueue_loads(c0.address, cl.spare)  # ask again (a repeated load joins the one pending)
            with contextlib.suppress(BenchError):
                await wait_until(f"{args.queued} spare loads pending on the leader",
                                 lambda: at_least(http0, "querycoord_tasks", want), 60, 0.2)
                break
        else:
            raise BenchError(f"{args.queued} spare loads were never all pending on the leader")
        res.enqueue_s = time.perf_counter() - t
        res.queued = int(await metric(http0, "querycoord_tasks") or 0)
        if args.profile_standby:
            c1.child.send_signal(signal.SIGUSR1)
        tk = await kill_and_take_over(kv, c0, c1, args.timeout, args.ttl)
        if args.profile_standby:
            await takeover_profile(c1, args.profile_standby, segments)
        res.lease_s, res.leader_event_s, res.reconciled_s = tk.lease_s, tk.leader_event_s, tk.reconciled_s
        res.resumed, res.meta_source, res.takeover_steps = tk.pending, tk.meta_source, tk.steps
        http1 = str(c1.ready["http_address"])
        res.c1_rss_kib = proc_status_kib(c1.child.pid, "VmRSS")
        logger.info("{:,} segments: {} queued; lease {:.2f}s, leader event {:.2f}s, reconciled {:.2f}s after the "
                    "kill; {} pending; new leader RSS {} -> {} KiB", segments, res.queued, res.lease_s,
                    res.leader_event_s, res.reconciled_s, res.resumed, res.c1_standby_kib, res.c1_rss_kib)
        cl.gate.set()
        t = time.perf_counter()

        async def drained() -> bool:
            return await metric(http1, "querycoord_tasks") == 0.0

        await wait_until("the resumed queue to drain", drained, args.timeout, 0.2)
        res.drain_s = time.perf_counter() - t
        return res
    finally:
        await cl.close()


async def takeover_profile(c1: Member, out: Path, segments: int) -> None:
    """Stop c1's profile (started just before the kill) and print its top functions."""
    c1.child.send_signal(signal.SIGUSR2)
    raw = out / f"raw-{segments}" / "profile-1.prof"

    async def written() -> bool:
        return raw.exists()

    await wait_until(f"the standby's profile {raw}", written, 300, 0.1)
    target = out / f"takeover-{segments}.prof"
    raw.replace(target)
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        pstats.Stats(str(target), stream=text).sort_stats(order).print_stats(25)
        print(f"== standby profile {target} (top 25 by {order})\n{text.getvalue()}", file=sys.stderr, flush=True)


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
        ("  the new leader's steps", ", ".join(f"{k} {v:.3f} s" for k, v in r.takeover_steps.items()) or "?"),
        ("standby RSS", f"{r.c1_standby_kib / 1024:.0f} MiB: {r.standby_kib_per_segment:.2f} KiB per segment over "
                        f"a fresh coordinator's {r.rss_before_kib / 1024:.0f} MiB"),
        ("new leader RSS", f"{r.c1_rss_kib / 1024:.0f} MiB once reconciled: {r.reload_kib_per_segment:.2f} KiB per "
                           f"segment over a fresh coordinator's (queued triggers included)"),
        ("drain of the resumed queue", f"{r.drain_s:.2f} s (after the gates opened; not part of the takeover)"),
    ]


async def run_size(args: argparse.Namespace, segments: int, work: Path) -> SizeResult:
    return await on_fresh_etcd(args, segments, work, lambda config: one_size(config, args, segments, work))


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
    g = add_scale_options(p)
    g.add_argument("--queued", type=int, default=1000, help="triggers queued at the kill (default 1000)")
    g.add_argument("--profile-standby", metavar="DIR",
                   help="profile the standby from the kill until reconciled (DIR/takeover-<segments>.prof)")
    args = p.parse_args(argv)
    check_scale_options(p, args)
    require_positive(p, args, ("queued",))
    if args.profile_standby:
        args.profile_standby = Path(args.profile_standby).resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = sys.stdout
    return report(lambda: run(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
