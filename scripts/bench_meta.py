"""Benchmark the meta layer (``meta.kv.MetaKV``) against the raw ``etcd3aio`` client, in one run, on one etcd.

Four measures, each taken through ``MetaKV`` and through the raw
``Etcd3Client`` (``client.raw``: the same gRPC channel, so only the Python
layer differs):

- sequential put/s: one 200-byte put after another (``MetaKV.save`` vs ``kv.put``);
- concurrent put/s: 64 asyncio tasks putting (same calls);
- txn keys/s: sequential txns of 128 puts of 200 bytes (``MetaKV.multi_save`` vs
  ``kv.txn`` with ``KVService.txn_op_put``);
- paged load of 100,000 keys of 1 KiB, in seconds (``MetaKV.load_prefix`` vs a
  hand-written ``kv.get`` range/limit loop at one revision, same page size).

Each measure runs ``--rounds`` times; every round runs both paths, the order
flipping from round to round (meta first, then raw first, ...) so warm-up,
fsync and compaction noise do not all land on one side. Each timed run writes
under a fresh key prefix. The reported figure per path is the median of its
rounds; a ratio is meta / raw throughput (for the load: raw seconds / meta
seconds), taken per round (the two runs of a round are adjacent in time) and
then the median over rounds, so a ratio above 1 means meta is faster.

By default an embedded etcd is started in a temporary directory and stopped at
the end (``--etcd-endpoints`` uses an external cluster instead; the keys written
there are removed at the end). The last line printed is one JSON object::

    {"seq_put_ratio": ..., "conc_put_ratio": ..., "txn_ratio": ..., "load_100k_s": ..., "load_ratio": ...}

Example: ``python scripts/bench_meta.py --keys 2000 --seconds 0.5 --rounds 1`` (quick).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from benchlib import arg_parser, log_to_stderr, require_positive, run_on_etcd
from etcd3aio import Etcd3Client
from etcd3aio.kv import KVService, prefix_range_end
from loguru import logger

from meta.client import EtcdClient, connect
from meta.config import EtcdConfig
from meta.kv import DEFAULT_PAGE_SIZE, MAX_TXN_OPS, MetaKV

RateFn = Callable[[float], Awaitable[float]]


@dataclass
class Measure:
    """One measure: a label, its unit, the per-round results of both paths."""

    name: str
    unit: str
    higher_is_better: bool
    meta: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)

    @property
    def meta_median(self) -> float:
        return statistics.median(self.meta)

    @property
    def raw_median(self) -> float:
        return statistics.median(self.raw)

    @property
    def round_ratios(self) -> list[float]:
        """Meta relative to raw in each round (> 1: meta faster); the two runs of a round are adjacent in time."""
        if self.higher_is_better:
            return [m / r for m, r in zip(self.meta, self.raw, strict=True)]
        return [r / m for m, r in zip(self.meta, self.raw, strict=True)]

    @property
    def ratio(self) -> float:
        """The median of the per-round ratios: pairing runs that were adjacent in time cancels slow drift
        (etcd's growing database, other load on the machine) better than a ratio of two medians."""
        return statistics.median(self.round_ratios)


class Bench:
    """Holds both access paths and the benchmark parameters."""

    def __init__(self, client: EtcdClient, args: argparse.Namespace):
        self.args = args
        self.root = f"bench/{uuid.uuid4().hex[:12]}"
        self.kv = MetaKV(client, self.root)
        raw: Etcd3Client = client.raw
        assert raw.kv is not None
        self.raw_kv: KVService = raw.kv
        self.timeout = client.config.call_timeout  # both paths give each call the same deadline
        self.value = b"v" * args.value_size
        self.load_value = b"L" * args.load_value_size
        self._run_id = 0

    def fresh_prefix(self, tag: str) -> str:
        """A key prefix (relative to the root) never used before in this run."""
        self._run_id += 1
        return f"{tag}/{self._run_id}/"

    def raw_key(self, rel: str) -> str:
        """The etcd key the raw path writes for a relative key (same key layout as MetaKV)."""
        return f"{self.root}/{rel}"

    # ----- sequential puts ------------------------------------------------------
    async def seq_put_meta(self, seconds: float) -> float:
        prefix, kv, value = self.fresh_prefix("seq-meta"), self.kv, self.value
        n = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            await kv.save(f"{prefix}{n}", value)
            n += 1
        return n / (time.perf_counter() - start)

    async def seq_put_raw(self, seconds: float) -> float:
        prefix, raw, value, timeout = self.raw_key(self.fresh_prefix("seq-raw")), self.raw_kv, self.value, self.timeout
        n = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            await raw.put(f"{prefix}{n}", value, timeout=timeout)
            n += 1
        return n / (time.perf_counter() - start)

    # ----- concurrent puts ------------------------------------------------------
    async def _concurrent(self, seconds: float, worker: Callable[[int, float], Awaitable[int]]) -> float:
        start = time.perf_counter()
        end = start + seconds
        counts = await asyncio.gather(*(worker(w, end) for w in range(self.args.concurrency)))
        return sum(counts) / (time.perf_counter() - start)

    async def conc_put_meta(self, seconds: float) -> float:
        prefix, kv, value = self.fresh_prefix("conc-meta"), self.kv, self.value

        async def worker(w: int, end: float) -> int:
            n = 0
            while time.perf_counter() < end:
                await kv.save(f"{prefix}{w}/{n}", value)
                n += 1
            return n

        return await self._concurrent(seconds, worker)

    async def conc_put_raw(self, seconds: float) -> float:
        prefix, raw, value, timeout = self.raw_key(self.fresh_prefix("conc-raw")), self.raw_kv, self.value, self.timeout

        async def worker(w: int, end: float) -> int:
            n = 0
            while time.perf_counter() < end:
                await raw.put(f"{prefix}{w}/{n}", value, timeout=timeout)
                n += 1
            return n

        return await self._concurrent(seconds, worker)

    # ----- 128-op txns ----------------------------------------------------------
    async def txn_meta(self, seconds: float) -> float:
        prefix, kv, value, ops = self.fresh_prefix("txn-meta"), self.kv, self.value, self.args.txn_ops
        n = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            await kv.multi_save({f"{prefix}{n + i}": value for i in range(ops)})
            n += ops
        return n / (time.perf_counter() - start)

    async def txn_raw(self, seconds: float) -> float:
        prefix, raw, value, ops = self.raw_key(self.fresh_prefix("txn-raw")), self.raw_kv, self.value, self.args.txn_ops
        put_op, timeout = KVService.txn_op_put, self.timeout
        n = 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            await raw.txn([], [put_op(f"{prefix}{n + i}", value) for i in range(ops)], timeout=timeout)
            n += ops
        return n / (time.perf_counter() - start)

    # ----- paged load -----------------------------------------------------------
    async def write_load_keys(self) -> str:
        """Write ``--keys`` keys of ``--load-value-size`` bytes once; both load paths read them."""
        prefix = "load/"
        n, value, writers = self.args.keys, self.load_value, 4
        started = time.perf_counter()

        async def writer(w: int) -> None:
            await self.kv.chunked_save_non_atomic((f"{prefix}{i:08d}", value) for i in range(w, n, writers))

        await asyncio.gather(*(writer(w) for w in range(writers)))
        count = await self.kv.count_prefix(prefix)
        if count != n:
            raise SystemExit(f"wrote {n} load keys but etcd counts {count} under {self.root}/{prefix}")
        logger.info("wrote {} keys of {} B in {:.1f}s", n, len(value), time.perf_counter() - started)
        return prefix

    async def load_meta(self, prefix: str) -> tuple[float, int]:
        start = time.perf_counter()
        snap = await self.kv.load_prefix(prefix, page_size=self.args.page_size)
        elapsed = time.perf_counter() - start
        return elapsed, len(snap.kvs)

    async def load_raw(self, prefix: str) -> tuple[float, int]:
        raw, page, timeout = self.raw_kv, self.args.page_size, self.timeout
        start = time.perf_counter()
        first = self.raw_key(prefix).encode()
        end = prefix_range_end(first)
        kvs: list[object] = []
        key, revision = first, 0
        while True:
            resp = await raw.get(key, end, revision=revision, limit=page, timeout=timeout)
            if revision == 0:
                revision = resp.header.revision
            kvs.extend(resp.kvs)
            if not resp.more or not resp.kvs:
                break
            key = resp.kvs[-1].key + b"\x00"
        elapsed = time.perf_counter() - start
        return elapsed, len(kvs)


async def _settle() -> None:
    """Between timed runs: drop garbage from the previous run so it is not collected inside the next."""
    gc.collect()
    await asyncio.sleep(0.05)


async def run_rate(name: str, unit: str, meta_fn: RateFn, raw_fn: RateFn, args: argparse.Namespace) -> Measure:
    """A throughput measure: a short untimed warm-up of each path, then alternating timed rounds."""
    m = Measure(name, unit, higher_is_better=True)
    warm = min(0.3, args.seconds / 4)
    await meta_fn(warm)
    await raw_fn(warm)
    for r in range(args.rounds):
        order = [("meta", meta_fn), ("raw", raw_fn)]
        if r % 2:
            order.reverse()
        for label, fn in order:
            await _settle()
            value = await fn(args.seconds)
            getattr(m, label).append(value)
            logger.info("{} round {} {}: {:,.0f} {}", name, r + 1, label, value, unit)
    return m


async def run_load(bench: Bench, args: argparse.Namespace) -> Measure:
    prefix = await bench.write_load_keys()
    m = Measure(f"paged load of {args.keys:,} keys of {args.load_value_size} B", "s", higher_is_better=False)
    await _settle()
    await bench.load_raw(prefix)  # warm-up: brings the keys into etcd's page cache for both paths
    for r in range(args.rounds):
        order = [("meta", bench.load_meta), ("raw", bench.load_raw)]
        if r % 2:
            order.reverse()
        for label, fn in order:
            await _settle()
            seconds, count = await fn(prefix)
            if count != args.keys:
                raise SystemExit(f"{label} load returned {count} keys, expected {args.keys}")
            getattr(m, label).append(seconds)
            logger.info("load round {} {}: {:.3f} s", r + 1, label, seconds)
    await _settle()
    return m


def print_table(measures: list[Measure]) -> None:
    rows = [("measure", "meta", "raw", "ratio")]
    for m in measures:
        fmt = "{:,.3f}" if m.unit == "s" else "{:,.0f}"
        rows.append((f"{m.name} ({m.unit})", fmt.format(m.meta_median), fmt.format(m.raw_median), f"{m.ratio:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        print("  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("meta, raw: medians of the rounds. ratio: median of per-round meta/raw throughput (load: raw s / meta s);")
    print("> 1 means meta is faster.")
    for m in measures:
        fmt = "{:,.3f}" if m.unit == "s" else "{:,.0f}"
        print(
            f"  {m.name}: meta "
            + " ".join(fmt.format(v) for v in m.meta)
            + " | raw "
            + " ".join(fmt.format(v) for v in m.raw)
            + " | ratios "
            + " ".join(f"{r:.3f}" for r in m.round_ratios)
        )


async def bench_main(config: EtcdConfig, args: argparse.Namespace) -> dict[str, float]:
    client = await connect(config)
    try:
        bench = Bench(client, args)
        logger.info("root path {} on {}", bench.root, ",".join(config.endpoints))
        try:
            # The load runs first, on an etcd that holds only its keys (the puts below leave about a million
            # more, which made etcd's side of a load ~10% slower in a trial and dilutes the client difference).
            load = await run_load(bench, args)
            seq = await run_rate("sequential put", "put/s", bench.seq_put_meta, bench.seq_put_raw, args)
            conc = await run_rate(
                f"{args.concurrency}-way concurrent put", "put/s", bench.conc_put_meta, bench.conc_put_raw, args
            )
            txn = await run_rate(f"{args.txn_ops}-op txn", "keys/s", bench.txn_meta, bench.txn_raw, args)
        finally:
            await bench.kv.remove_prefix("")  # leave nothing behind on an external etcd
        print_table([seq, conc, txn, load])
        return {
            "seq_put_ratio": round(seq.ratio, 4),
            "conc_put_ratio": round(conc.ratio, 4),
            "txn_ratio": round(txn.ratio, 4),
            "load_100k_s": round(load.meta_median, 4),
            "load_ratio": round(load.ratio, 4),
        }
    finally:
        await client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__, verbose_help="log every round to stderr")
    w = p.add_argument_group("workload")
    w.add_argument("--keys", type=int, default=100_000, help="keys for the paged load (default 100000)")
    w.add_argument("--value-size", type=int, default=200, help="bytes per put value (default 200)")
    w.add_argument("--load-value-size", type=int, default=1024, help="bytes per loaded value (default 1024)")
    w.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE, help="keys per load page (both paths)")
    w.add_argument("--txn-ops", type=int, default=MAX_TXN_OPS, help=f"puts per txn (default {MAX_TXN_OPS})")
    m = p.add_argument_group("measurement")
    m.add_argument("--seconds", type=float, default=1.5, help="duration of each timed put run (default 1.5)")
    m.add_argument("--rounds", type=int, default=7, help="timed runs per path and measure; median kept (default 7)")
    m.add_argument("--concurrency", type=int, default=64, help="tasks for the concurrent put (default 64)")
    args = p.parse_args(argv)
    require_positive(p, args, ("keys", "rounds", "concurrency", "value_size", "load_value_size", "page_size"))
    if args.seconds <= 0:
        p.error("--seconds must be > 0")
    if not 1 <= args.txn_ops <= MAX_TXN_OPS:
        p.error(f"--txn-ops must be in 1..{MAX_TXN_OPS} (etcd's limit)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_stderr(args.verbose)
    print(json.dumps(run_on_etcd(bench_main, args, "bench-meta-")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
