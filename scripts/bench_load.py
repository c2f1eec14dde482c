"""Benchmark one LoadCollection end to end, against the raw cost of persisting what it persisted.

Setup (not timed): an embedded etcd (or ``--etcd-endpoints``), one coordinator
(``CoordinatorProcess`` in this process: its gRPC server, the in-process
catalog, auto balance off), ``--nodes`` reference query nodes (in-process
``QueryNode`` objects by default, real ``querycoord querynode`` processes
with ``--node-processes``) and a catalog collection of ``--segments``
segments in ``--partitions`` partitions (``create_bulk_collection``).

Measured, in one run:

- **wall_s**: from sending ``LoadCollection`` through the gRPC client
  (``QueryCoordClient``) until the collection is 100 % in memory *and* the
  coordinator is done with the load. The client polls ``GetTask`` until the
  trigger is EXPIRED with ``ShowCollections`` at 100 %; the end of the
  coordinator's work (its last write: removing the task tree) is the
  trigger's ``finished`` future, observed in process. wall_s is the later
  of the two; both are in the table.
- **CPU** (table only): this process's CPU time over the same span, every
  thread (with in-process nodes, theirs too): on a shared machine it
  moves less than wall_s, so it is the number to compare between versions.
- **etcd_txns**: etcd's revision after minus before the load. Every write
  txn that changes anything bumps the revision by exactly one, and nothing
  else writes meanwhile (the catalog is created and the sessions registered
  before the first reading; lease keep-alives do not bump it; the script
  checks the revision is still before and after). Cross-checked against
  the coordinator's own counters (``TaskStore.txns``, ``QueryMeta.txn_count``)
  and broken down by what each txn wrote: the events of the load's
  revisions are replayed with a watch and each revision is classified by
  the key prefixes it touched.
- **raw_s**: every distinct key the coordinator put during the load (segment
  meta ``queryCoord-segmentMeta/<coll>/<part>/<seg>``, task records
  ``queryCoord-{trigger,active}Task/<id>`` and ``queryCoord-taskInfo/<id>``, the
  finished tree's ``queryCoord-taskHistory/<id>`` record, and the few
  collection / channel / id-allocator records), each with the
  last value it held, taken from the replayed events, written once with the
  raw ``etcd3aio`` client in sequential 128-op txns under a root path of the
  same length: the floor of what persisting this load costs. Median of
  ``--raw-rounds`` runs, each under a fresh root that is removed after it
  (untimed). The table also shows the same writes with 8 concurrent writers.

The last line printed is one JSON object::

    {"segments": ..., "nodes": ..., "children": ..., "etcd_txns": ..., "wall_s": ..., "raw_s": ..., "ratio": ...}

with ratio = wall_s / raw_s. ``--profile FILE`` runs cProfile around the load
(coordinator and in-process nodes share this event loop) and prints the top
functions to stderr. Everything started is stopped at the end (nodes,
coordinator, etcd), also on error.

Example: ``python scripts/bench_load.py --segments 300 --partitions 2 --nodes 2`` (quick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import pstats
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from benchlib import (
    BenchError,
    add_cluster_options,
    arg_parser,
    check_cluster_options,
    report,
    require_positive,
    run_on_etcd,
)
from etcd_raw import category, quiet_revision, raw_write, replay
from loguru import logger

from meta.client import connect
from meta.config import EtcdConfig
from meta.kv import MetaKV
from proto import querycoord_pb2 as qc
from querycoord.leader.view import Leadership
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import QueryNode
from querycoord.serving.process import CoordinatorProcess
from querycoord.settings.config import CoordConfig, SchedulerConfig

MIB = 1 << 20
# Upper bound of a bulk segment's mem_size (create_bulk_collection: 10,000 rows of a 128-dim vector = 5.2 MB);
# node capacities are sized from it so that memory never limits the placement.
SEGMENT_MEM_BOUND = 8 * MIB
EXPIRED = qc.TASK_STATE_EXPIRED
FAILED = qc.TASK_STATE_FAILED


@dataclass
class LoadResult:
    task_id: int = 0
    children: int = 0
    child_kinds: Counter[str] = field(default_factory=Counter)
    planned_s: float = 0.0  # LoadCollection answered (children committed)
    seen_s: float = 0.0  # the client saw EXPIRED and 100 %
    done_s: float = 0.0  # the coordinator finished the trigger (task keys removed)
    polls: int = 0
    rev_before: int = 0
    rev_after: int = 0
    cpu_s: float = 0.0  # CPU time of this process (every thread) from the request until wall_s
    store_txns: int = 0
    meta_txns: int = 0

    @property
    def wall_s(self) -> float:
        return max(self.seen_s, self.done_s)

    @property
    def etcd_txns(self) -> int:
        return self.rev_after - self.rev_before


# ----- nodes -----------------------------------------------------------------------------------------------------
class Nodes:
    """The reference query nodes: in-process objects or child processes; ``stop`` ends them all."""

    def __init__(self, args: argparse.Namespace, etcd: EtcdConfig, kv: MetaKV, capacity: int):
        self.args, self.etcd, self.kv, self.capacity = args, etcd, kv, capacity
        self.inproc: list[QueryNode] = []
        self.procs: list[subprocess.Popen[str]] = []

    async def start(self) -> None:
        if self.args.node_processes:
            await asyncio.gather(*(asyncio.to_thread(self._spawn) for _ in range(self.args.nodes)))
        else:
            for _ in range(self.args.nodes):
                n = QueryNode(self.kv, capacity_bytes=self.capacity, ttl=self.args.ttl)
                self.inproc.append(n)
                await n.start()

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "querycoord.nodes.querynode", "--etcd-endpoints", ",".join(self.etcd.endpoints),
               "--root", self.kv.root, "--ttl", str(self.args.ttl), "--capacity-mb", str(self.capacity / MIB),
               "--log-level", "WARNING"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True)
        self.procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise BenchError(f"query node process {p.pid} exited before it was ready (exit code {p.wait()})")
        ready = json.loads(line)
        logger.info("query node {} ready at {} (pid {})", ready["node_id"], ready["address"], p.pid)

    async def stop(self) -> None:
        for n in self.inproc:
            with contextlib.suppress(Exception):
                await n.stop()
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                await asyncio.to_thread(p.wait, 10)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
            if p.stdout is not None:
                p.stdout.close()


# ----- helpers -----------------------------------------------------------------------------------------------------
async def wait_for(what: str, predicate, timeout: float, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)



# ----- the load ----------------------------------------------------------------------------------------------------
async def run_load(lead: Leadership, qclient: QueryCoordClient, cid: int, args: argparse.Namespace,
                   kv: MetaKV) -> LoadResult:
    res = LoadResult()
    store, meta = lead.env.store, lead.meta
    store0, meta0 = store.txns, meta.txn_count
    res.rev_before = await quiet_revision(kv)
    gc.collect()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    resp = await qclient.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    res.planned_s = time.perf_counter() - t0
    if resp.status.error_code != 0 or not resp.task_id:
        raise BenchError(f"LoadCollection refused: {resp.status.reason or resp}")
    res.task_id = resp.task_id
    trig = lead.scheduler.triggers.get(res.task_id)
    done = asyncio.Event()
    if trig is None:
        res.done_s = time.perf_counter() - t0  # already finished (tiny loads): an upper bound
        done.set()
    else:
        def on_done(_f: asyncio.Future[None]) -> None:
            res.done_s = time.perf_counter() - t0
            done.set()

        trig.finished.add_done_callback(on_done)
    tree: qc.TaskTree | None = None
    while True:
        r = await qclient.query("GetTask", qc.GetTaskRequest(task_id=res.task_id, children_limit=1))
        res.polls += 1
        if r.status.error_code != 0:
            raise BenchError(f"GetTask {res.task_id}: {r.status.reason}")
        state = r.tree.trigger.state
        if state == FAILED:
            raise BenchError(f"the load failed: {r.tree.trigger.error}")
        if state == EXPIRED:
            show = await qclient.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
            if show.status.error_code == 0 and show.collections[0].in_memory_percentage == 100:
                res.seen_s = time.perf_counter() - t0
                tree = r.tree
                break
        if time.perf_counter() - t0 > args.timeout:
            raise BenchError(f"the load did not finish within {args.timeout:.0f}s (task {res.task_id}: "
                             f"{qc.TaskState.Name(state)}, children {r.tree.child_counts})")
        await asyncio.sleep(args.poll)
    async with asyncio.timeout(args.timeout):
        await done.wait()
    res.cpu_s = time.process_time() - cpu0
    if profiler:
        profiler.disable()
        report_profile(profiler, args.profile)
    await meta.drain()
    res.rev_after = await quiet_revision(kv)
    res.store_txns = store.txns - store0
    res.meta_txns = meta.txn_count - meta0
    assert tree is not None
    res.children = tree.child_counts.total
    full = await qclient.query("GetTask", qc.GetTaskRequest(task_id=res.task_id))
    res.child_kinds = Counter(qc.TaskKind.Name(c.kind).removeprefix("TASK_KIND_").lower() for c in full.tree.children)
    loaded = len(meta.segment_ids_of(cid))
    if loaded != args.segments:
        raise BenchError(f"query meta holds {loaded} segments of collection {cid}, expected {args.segments}")
    return res


def report_profile(profiler: cProfile.Profile, path: str) -> None:
    profiler.dump_stats(path)
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(40)
    print(buf.getvalue(), file=sys.stderr)


# ----- main --------------------------------------------------------------------------------------------------------
def fmt_table(rows: list[tuple[str, str]]) -> str:
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a.ljust(w)}  {b}" for a, b in rows)


async def bench_main(config: EtcdConfig, args: argparse.Namespace) -> dict[str, object]:
    token = uuid.uuid4().hex[:8]
    root = f"bench/{token}/c0"  # raw rounds write under bench/<token>/r<i>: same key lengths

    def raw_root(i: int) -> str:
        return f"bench/{token}/r{i}"

    client = await connect(config)
    kv = MetaKV(client, root)
    coord: CoordinatorProcess | None = None
    nodes: Nodes | None = None
    qclient: QueryCoordClient | None = None
    try:
        capacity = max(1024 * MIB, -(-args.segments * SEGMENT_MEM_BOUND // args.nodes) * 2)
        coord_cfg = CoordConfig(etcd=config, root=root, listen="127.0.0.1:0", session_ttl=args.ttl,
                                rpc_timeout=60.0, auto_balance_interval=0,
                                scheduler=SchedulerConfig(trigger_timeout=args.timeout))
        coord = CoordinatorProcess(coord_cfg)
        await coord.start()
        await wait_for("the coordinator to lead", lambda: coord.coord.is_leader, 30)  # type: ignore[union-attr]
        lead = coord.coord.leadership
        assert lead is not None and coord.coord.catalog is not None
        nodes = Nodes(args, config, kv, capacity)
        t = time.perf_counter()
        await nodes.start()
        await wait_for(f"{args.nodes} query nodes online", lambda: len(lead.nodes.online()) == args.nodes, 30)
        nodes_s = time.perf_counter() - t
        t = time.perf_counter()
        desc, seg_ids = await coord.coord.catalog.create_bulk_collection(
            f"bench_{args.segments}", num_partitions=args.partitions, num_segments=args.segments,
            num_channels=args.channels)
        catalog_s = time.perf_counter() - t
        if len(seg_ids) != args.segments:
            raise BenchError(f"the catalog created {len(seg_ids)} segments, expected {args.segments}")
        logger.info("catalog: collection {} with {} segments in {:.1f}s", desc.collection_id, len(seg_ids), catalog_s)
        qclient = QueryCoordClient([coord.address], deadline=args.timeout, call_timeout=args.timeout)

        res = await run_load(lead, qclient, desc.collection_id, args, kv)
        rp = await replay(client, kv, res.rev_before + 1, res.rev_after, args.timeout)
        if len(rp.revisions) != res.etcd_txns:
            raise BenchError(f"the revision moved by {res.etcd_txns} but the replay found {len(rp.revisions)} "
                             f"revisions with events")
        outside = [c for c in rp.txns_by_category if "other:" in c]
        if outside:
            raise BenchError(f"something besides the load wrote during it: {outside}")

        records = rp.records()
        raw_bytes = sum(len(k) + len(v) for k, v in records)
        seq, conc = [], []
        for i in range(args.raw_rounds):
            for j, (runs, writers) in enumerate(((seq, 1), (conc, 8))):
                gc.collect()
                target = raw_root(2 * i + j + 1)
                runs.append(await raw_write(client, target, records, writers=writers))
                await MetaKV(client, target).remove_prefix("")  # untimed: keeps etcd's key count as it was
        raw_s, raw_conc_s = statistics.median(seq), statistics.median(conc)

        seg_records = sum(1 for k, _ in records if k.startswith("queryCoord-segmentMeta/"))
        task_records = sum(1 for k, _ in records if category(k) == "task records")
        ids_alloc = sum(n for c, n in rp.txns_by_category.items() if c == "id allocator")
        rows = [
            ("setup", f"{args.nodes} {'node processes' if args.node_processes else 'in-process nodes'} "
                      f"in {nodes_s:.2f}s; catalog of {args.segments:,} segments in {args.partitions} partitions, "
                      f"{args.channels} channels in {catalog_s:.2f}s"),
            ("LoadCollection answered (planned)", f"{res.planned_s:.3f} s"),
            ("client saw EXPIRED + 100 %", f"{res.seen_s:.3f} s ({res.polls} GetTask polls every {args.poll}s)"),
            ("coordinator finished (keys removed)", f"{res.done_s:.3f} s"),
            ("wall_s", f"{res.wall_s:.3f} s"),
            ("CPU of this process meanwhile", f"{res.cpu_s:.3f} s (coordinator, client"
                                              f"{'' if args.node_processes else ', in-process nodes'}; every thread: "
                                              f"steadier than wall_s on a shared machine)"),
            ("children", f"{res.children} ({', '.join(f'{n} {k}' for k, n in sorted(res.child_kinds.items()))})"),
            ("etcd write txns (revision delta)", f"{res.etcd_txns}"),
            ("  counted by TaskStore.txns", f"{res.store_txns}"),
            ("  counted by QueryMeta.txn_count", f"{res.meta_txns}"),
            ("  id allocator CAS (replay)", f"{ids_alloc}"),
            *[(f"  txns touching {c}", f"{n}") for c, n in sorted(rp.txns_by_category.items())],
            ("keys put (replay)", ", ".join(f"{n} {c}" for c, n in sorted(rp.puts_by_category.items()))
             + f"; {rp.deletes} deleted"),
            ("distinct records persisted", f"{len(records):,} ({seg_records:,} segment meta, {task_records} task "
                                           f"records, {len(records) - seg_records - task_records} other), "
                                           f"{raw_bytes:,} bytes"),
            ("raw etcd3aio, sequential 128-op txns", f"{raw_s:.3f} s (rounds: {', '.join(f'{x:.3f}' for x in seq)})"),
            ("raw etcd3aio, 8 concurrent writers", f"{raw_conc_s:.3f} s (rounds: "
                                                   f"{', '.join(f'{x:.3f}' for x in conc)})"),
            ("per segment", f"wall {res.wall_s / args.segments * 1e6:.1f} us, "
                            f"raw {raw_s / args.segments * 1e6:.1f} us"),
            ("ratio wall_s / raw_s", f"{res.wall_s / raw_s:.2f} (vs concurrent raw: {res.wall_s / raw_conc_s:.2f})"),
        ]
        print(fmt_table(rows), file=args.out, flush=True)
        return {
            "segments": args.segments,
            "nodes": args.nodes,
            "children": res.children,
            "etcd_txns": res.etcd_txns,
            "wall_s": round(res.wall_s, 4),
            "raw_s": round(raw_s, 4),
            "ratio": round(res.wall_s / raw_s, 3),
        }
    finally:
        if qclient is not None:
            await qclient.close()
        if coord is not None:  # the coordinator first: stopping nodes under it would queue node-down balances
            with contextlib.suppress(Exception):
                await coord.stop()
        if nodes is not None:
            await nodes.stop()
        if config is not None and args.etcd_endpoints:
            with contextlib.suppress(Exception):
                await MetaKV(client, f"bench/{token}").remove_prefix("")
        await client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__, verbose_help="log progress to stderr")
    g = add_cluster_options(p, segments=10_000, partitions=16, nodes=8, poll=0.01, node_help="reference query nodes")
    g.add_argument("--channels", type=int, default=2, help="DM channels of the collection (default 2)")
    g.add_argument("--node-processes", action="store_true",
                   help="run the nodes as `querycoord querynode` processes (default: in-process objects)")
    m = p.add_argument_group("measurement")
    m.add_argument("--raw-rounds", type=int, default=5, help="runs of the raw write; median kept (default 5)")
    m.add_argument("--timeout", type=float, default=1800.0, help="give up on the load after this many seconds")
    m.add_argument("--profile", metavar="FILE", help="cProfile the load into FILE; top functions to stderr")
    args = p.parse_args(argv)
    check_cluster_options(p, args)
    require_positive(p, args, ("channels", "raw_rounds"))
    if args.timeout <= 0:
        p.error("--timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = sys.stdout  # the table; the coordinator's leadership events go to stderr
    return report(lambda: run_on_etcd(bench_main, args, "bench-load-"), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
