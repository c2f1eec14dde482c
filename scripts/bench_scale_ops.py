"""What an operator's every operation costs as the cluster grows: checker, repair, drain, takeover, reads, tools.

For each size in ``--sizes`` (loaded segments), on a fresh embedded etcd
(``--etcd-endpoints``: one root per size, removed afterwards), the cluster of
``bench_scale.py`` (``scale_cluster.py``: the catalog, ``--nodes`` in-process
reference query nodes, coordinator c0 as a real ``querycoord coord`` process),
except that every node has room for the whole collection, so what the bench
takes away never leaves a copy without a place. c0 loads the collection (one
replica: every node in it; ``load_s``); then standby c1 (a second process) starts
and holds its warm copy. Measured, in this order:

- **leader_rss_kib_per_segment** / **standby_rss_kib_per_segment**: c0's
  ``VmRSS`` after the load and two checker passes, c1's once it holds its copy,
  each over c0's RSS before it copied the catalog, per segment.
- **standby_read_ms**: median of ``--reads`` ShowCollections and GetReplicas of
  the collection sent to c1, which answers them from its copy.
- **checker_pass_cpu_s**, **checker_pass_s**: c0's steady passes, nothing to
  repair (the checker's repair counter must not move): the coordinator's own
  counters of finished passes, their wall seconds and the process CPU seconds
  while they ran (``querycoord_checker_pass_{,cpu_}seconds``), over ``--passes``
  passes. The table also gives c0's whole CPU (utime + stime of /proc) over the
  same window, idle time between passes included.
- **segment_info_ms**: GetSegmentInfo of the first 65,536 segment ids (all when
  fewer) through the gRPC client; median of ``--reads``.
- **status_ms**: ``querycoord status -o json`` as a process, wall, median of
  ``--reads`` (the table gives the floor: ``querycoord --help`` as a process).
  Before either is timed the project's packages are byte-compiled once
  (``python -m compileall``, with ``PYTHONDONTWRITEBYTECODE`` unset for that
  step), so each process loads ``.pyc`` files as a pip-installed querycoord
  does, rather than compiling its modules anew as a source tree without them;
  **status_page_ms**: GET of c0's status page (``/``), 1.1 s apart so its
  one-second snapshot is never reused; median of ``--reads``.
- **meta_verify_s**, **meta_verify_rss_mb**: ``querycoord meta verify`` as a
  process; wall, and its peak RSS (``ru_maxrss`` of ``os.wait4``).
- **node_down_repair_s**: one node dies: its gRPC server stops at once and its
  session lease is revoked (``QueryNode.crash(revoke=True)``), which is what the
  coordinator sees of a SIGKILLed node once its TTL lapsed; the clock starts
  then. It ends when the nodes still up hold every segment and DM channel of the
  collection (read from the node objects themselves, every 10 ms while their
  count falls short) *and* the leader shows it 100 % with no trigger left
  (ShowCollections, then ListTasks, every 20 ms once the nodes hold everything;
  the log gives the last poll's own time, which bounds how late the end was
  read): the later of the two. **node_down_repair_ratio**:
  that over **raw**: the records the repair wrote (every key put under the root
  in its revisions, last value, from a watch replay: ``etcd_raw.replay``) written
  again with the plain etcd3aio client in sequential 128-op txns under a root of
  the same length (median of ``--raw-rounds``; as ``bench_load.py``'s raw_s).
  **node_down_repair_leader_cpu_s**, **node_down_repair_nodes_cpu_s**,
  **node_down_repair_machine_busy**: over the same window, c0's CPU seconds,
  this process's (the in-process nodes, mostly), and the share of the
  machine's CPU time (every core, every process: etcd too) that was busy: near
  1 the repair is bound by the machine, not by waiting. The table adds the
  checker passes c0 ended meanwhile and their wall seconds.
- **drain_ratio**: ``DrainNode`` of another node, until the leader lists it
  DRAINED, the nodes hold everything without it and no trigger is left; over
  the raw writes of its records, likewise.
- **takeover_two_down_over_ttl_s**: two more nodes die as above and c0 gets
  SIGKILL at once; from the end of c0's lease until c1 has led and finished its
  first checker pass (as ``takeover_over_ttl_s`` of ``bench_scale.py``). The
  table also gives when the collection was whole again.
- **leader_loop_blocked_max_s** / **new_leader_loop_blocked_max_s**: the longest
  time c0's event loop ran nothing else, from its start until just before its kill,
  and c1's until it finished the takeover
  (``querycoord_event_loop_blocked_max_seconds``): a block longer than ``--ttl``
  costs the leadership. If c0 no longer leads at the takeover step, the run ends
  with the coordinators' role events and c0's log.

The last line printed is one JSON object, lists over the sizes::

    {"segments": [...], "load_s": [...], "checker_pass_cpu_s": [...], ..., "standby_rss_kib_per_segment": [...]}

``--max-repair-bytes BYTES`` is given to both coordinators: a small one cuts the
node-down repair at 100,000 segments into as many parts as the default does at a
million.

``--profile-leader DIR`` runs c0 under ``scripts/profiled_coord.py``: a cProfile
switched on and off by signals, covering exactly its steady passes
(DIR/checker-<segments>.prof), the node-down repair, from the kill until the leader was done
(DIR/repair-<segments>.prof), and the drain likewise (DIR/drain-<segments>.prof);
the top functions by cumulative and by own time go to stderr. ``--profile-standby DIR``
likewise runs c1 under it, covering its takeover from c0's kill until its first checker
pass ended (DIR/takeover-<segments>.prof). Profiling slows the profiled process: take
the timings from a run without it.

Example (smoke, about a minute): ``python scripts/bench_scale_ops.py --sizes 2000 --ttl 3 --passes 2 --reads 2``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import pstats
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchlib import BenchError, arg_parser, report, require_positive
from etcd_raw import quiet_revision, raw_write, replay
from loguru import logger
from scale_cluster import (
    SEGMENT_MEM_BOUND,
    ScaleCluster,
    add_scale_options,
    at_least,
    check_scale_options,
    kill_and_take_over,
    load_main,
    on_fresh_etcd,
    proc_status_kib,
    scrape,
    wait_for_standby,
    wait_until,
)
from scale_ops_probes import Whole, machine_cpu_s, proc_cpu_s
from scale_ops_reads import meta_verify, segment_info, standby_reads, status_reads

from meta.config import EtcdConfig
from meta.kv import MetaKV
from proto import querycoord_pb2 as qc
from querycoord.net.client import QueryCoordClient
from querycoord.tooling.harness import COORDINATOR, Member, coord_argv

SCRIPTS = Path(__file__).resolve().parent
LEADER_POLL_S = 0.02  # between polls of the leader at a move's end


@dataclass
class Move:
    """A repair or a drain: how long, and what raw writing of its records costs."""

    seconds: float = 0.0
    nodes_whole_s: float = 0.0  # the nodes alone held everything again
    records: int = 0  # distinct keys put under the root
    segment_records: int = 0
    deletes: int = 0
    txns: int = 0  # etcd revisions
    raw_s: float = 0.0
    last_poll_s: float = 0.0  # the leader's end was read to within this (the last poll's own time)
    # CPU seconds over the move (until the leader was done): c0, this process (the in-process nodes), the machine
    # busy (every process, etcd and the standby included) and the machine's whole (wall x cores).
    leader_cpu_s: float = 0.0
    bench_cpu_s: float = 0.0
    machine_busy_s: float = 0.0
    machine_all_s: float = 0.0
    checker_passes: int = 0  # c0's checker passes that ended meanwhile, and their wall seconds (turns included)
    checker_pass_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.seconds / self.raw_s if self.raw_s else 0.0


@dataclass
class OpsResult:
    segments: int
    load_s: float = 0.0
    settle_s: float = 0.0
    rss_before_kib: int = 0
    leader_rss_kib: int = 0
    standby_rss_kib: int = 0
    standby_read_ms: float = 0.0
    passes: int = 0
    pass_s: float = 0.0
    pass_cpu_s: float = 0.0
    window_s: float = 0.0
    window_cpu_s: float = 0.0
    loop_blocked_s: float = 0.0  # c0's longest event loop block before its kill
    new_loop_blocked_s: float = 0.0  # c1's, until its takeover was reconciled
    segment_info_ms: float = 0.0
    segment_info_ids: int = 0
    status_ms: float = 0.0
    cli_floor_ms: float = 0.0
    status_page_ms: float = 0.0
    status_page_failed: list[str] = field(default_factory=list)
    verify_s: float = 0.0
    verify_rss_mb: float = 0.0
    verify_exit: int = 0
    repair: Move = field(default_factory=Move)
    drain: Move = field(default_factory=Move)
    takeover_over_ttl_s: float = 0.0
    takeover_lease_s: float = 0.0
    takeover_whole_s: float = 0.0
    takeover_leader_s: float = 0.0  # c1's ``leader`` event, from the end of c0's lease
    takeover_steps: dict[str, float] = field(default_factory=dict)  # c1's own breakdown (its ``leader`` event)

    def per_segment(self, kib: int) -> float:
        return (kib - self.rss_before_kib) / self.segments


# ----- profiles -----------------------------------------------------------------------------------------------------
class LeaderProfile:
    """A coordinator under ``profiled_coord.py`` (c0, or c1 with ``who="standby"``): ``start`` and ``stop(name)``
    bracket one stretch of its life. Each coordinator writes its raw profiles in a directory of its own."""

    def __init__(self, out: Path | None, member: Member | None = None, who: str = "leader"):
        self.out, self.member, self.written, self.who = out, member, 0, who

    @property
    def raw_dir(self) -> Path | None:
        """Where the profiled process writes ``profile-<k>.prof``."""
        return None if self.out is None else (self.out if self.who == "leader" else self.out / self.who)

    def start(self) -> None:
        if self.out is not None and self.member is not None:
            self.member.child.send_signal(signal.SIGUSR1)

    async def stop(self, name: str) -> None:
        if self.out is None or self.member is None:
            return
        self.member.child.send_signal(signal.SIGUSR2)
        self.written += 1
        assert self.raw_dir is not None
        path = self.raw_dir / f"profile-{self.written}.prof"

        async def written() -> bool:
            return path.exists()

        await wait_until(f"the {self.who}'s profile {path}", written, 300, 0.1)
        target = self.out / f"{name}.prof"
        path.replace(target)
        for order in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(str(target), stream=text).sort_stats(order).print_stats(15)
            print(f"== {self.who} profile {target} (top 15 by {order})\n{text.getvalue()}", file=sys.stderr,
                  flush=True)


# ----- the measurements -----------------------------------------------------------------------------------------------
async def steady_passes(cl: ScaleCluster, passes: int, profile: LeaderProfile) -> tuple[int, float, float,
                                                                                           float, float]:
    """(passes, wall s, CPU s of the passes, window s, c0's CPU s over the window), nothing to repair."""
    http, pid, interval = cl.http0, cl.leader.child.pid, cl.args.checker_interval
    before = await asyncio.to_thread(scrape, http)
    profile.start()
    cpu0, t0 = proc_cpu_s(pid), time.perf_counter()
    await asyncio.sleep(interval * passes)  # scrapes cost the leader CPU: none while the passes run
    await wait_until(f"{passes} checker passes", lambda: at_least(
        http, "querycoord_checker_passes", before["querycoord_checker_passes_total"] + passes), cl.args.timeout, 1.0)
    window, window_cpu = time.perf_counter() - t0, proc_cpu_s(pid) - cpu0
    await profile.stop(f"checker-{cl.segments}")
    after = await asyncio.to_thread(scrape, http)

    def delta(name: str) -> float:
        return after[name + "_total"] - before[name + "_total"]

    if delta("querycoord_checker_repairs") or delta("querycoord_checker_errors"):
        raise BenchError("the checker repaired something or failed during the steady passes: not steady")
    n = int(delta("querycoord_checker_passes"))
    return n, delta("querycoord_checker_pass_seconds") / n, delta("querycoord_checker_pass_cpu_seconds") / n, \
        window, window_cpu


async def measure_move(cl: ScaleCluster, whole: Whole, what: str, act: Callable[[], Awaitable[None]],
                       leader_done: Callable[[], Awaitable[bool]],
                       ended: Callable[[], Awaitable[None]] | None = None) -> Move:
    """``act()`` then until ``whole`` and ``leader_done()``; the raw writes of what the leader wrote meanwhile.
    ``ended()`` runs as soon as the leader is done (a profile stopped there covers the move, not the raw writes)."""
    move = Move()
    rev0 = await quiet_revision(cl.kv)
    pid = cl.leader.child.pid
    passes0 = await asyncio.to_thread(scrape, cl.http0)  # before the clock: a scrape at 1M costs c0 0.1 s
    cpu0, own0, (busy0, all0) = proc_cpu_s(pid), time.process_time(), machine_cpu_s()
    t0 = time.perf_counter()
    await act()
    logger.info("{}: started at revision {}", what, rev0)
    move.nodes_whole_s = await whole.wait(t0, cl.args.timeout)
    logger.info("{}: the nodes hold everything after {:.2f}s", what, move.nodes_whole_s)
    move.seconds, move.last_poll_s = await poll_until(f"the leader done with the {what}", leader_done, t0,
                                                      cl.args.timeout)
    busy1, all1 = machine_cpu_s()
    move.leader_cpu_s, move.bench_cpu_s = proc_cpu_s(pid) - cpu0, time.process_time() - own0
    if ended is not None:
        await ended()
    move.machine_busy_s, move.machine_all_s = busy1 - busy0, all1 - all0
    passes1 = await asyncio.to_thread(scrape, cl.http0)
    move.checker_passes = int(passes1["querycoord_checker_passes_total"] - passes0["querycoord_checker_passes_total"])
    move.checker_pass_s = (passes1["querycoord_checker_pass_seconds_total"]
                           - passes0["querycoord_checker_pass_seconds_total"])
    rev1 = await cl.kv.revision()  # what a later pass writes is not the move's
    rp = await replay(cl.client, cl.kv, rev0 + 1, rev1, cl.args.timeout)
    records = [(k, v) for k, v in rp.records() if not k.startswith("(outside the root)")]
    move.records, move.deletes, move.txns = len(records), rp.deletes, len(rp.revisions)
    move.segment_records = sum(1 for k, _ in records if k.startswith("queryCoord-segmentMeta/"))
    runs = []
    for _ in range(cl.args.raw_rounds):
        raw_root = f"bench/{uuid.uuid4().hex[:8]}"  # the same length as the cluster's root
        runs.append(await raw_write(cl.client, raw_root, records))
        await MetaKV(cl.client, raw_root).remove_prefix("")
    move.raw_s = statistics.median(runs)
    logger.info("{}: {:.2f}s (nodes whole at {:.2f}s; the leader's end read within {:.3f}s), {} records in {} txns, "
                "raw {:.3f}s", what, move.seconds, move.nodes_whole_s, move.last_poll_s, move.records, move.txns,
                move.raw_s)
    return move


async def poll_until(what: str, done: Callable[[], Awaitable[bool]], t0: float, timeout: float) -> tuple[float, float]:
    """Await ``done()`` every ``LEADER_POLL_S`` until true: (seconds since ``t0`` when it answered true, how long
    that last call took). The end is read to within one interval and that call, both logged: a move's tail (the
    last records written, the trigger's end, the percentage raised) is tens of milliseconds at 10,000 segments."""
    while True:
        start = time.perf_counter()
        if await done():
            end = time.perf_counter()
            return end - t0, end - start
        if start - t0 > timeout:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(LEADER_POLL_S)


async def leader_settled(client: QueryCoordClient, cid: int) -> bool:
    """The leader shows the collection 100 % and has no trigger left (ListTasks of the queued and running trees,
    asked only once it shows 100 %: two small RPCs, cheap to poll, where a metrics scrape at 100,000 segments
    takes a tenth of a second and would be counted in the move)."""
    show = await client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    if show.status.error_code != 0 or show.collections[0].in_memory_percentage != 100:
        return False
    tasks = await client.query("ListTasks", qc.ListTasksRequest(limit=1))
    return tasks.status.error_code == 0 and not tasks.trees


async def loop_blocked(http: str) -> float:
    """A coordinator's longest event loop block so far, in seconds (0 while it saw none over 50 ms)."""
    return (await asyncio.to_thread(scrape, http)).get("querycoord_event_loop_blocked_max_seconds", 0.0)


# ----- one size -------------------------------------------------------------------------------------------------------
async def one_size(config: EtcdConfig, args: argparse.Namespace, segments: int, work: Path) -> OpsResult:
    res = OpsResult(segments)
    profile = LeaderProfile(args.profile_leader)

    standby_profile = LeaderProfile(args.profile_standby, who="standby")

    async def start_coordinator(c: ScaleCluster, index: int, prof: LeaderProfile) -> Member:
        flags = (*c.common_flags(), "--checker-interval", str(args.checker_interval))
        if args.max_repair_bytes:
            flags += ("--max-repair-bytes", str(args.max_repair_bytes))
        if args.stalls is not None and prof.raw_dir is None:
            argv = coord_argv(config.endpoints, c.kv.root, "127.0.0.1:0", args.ttl, *flags,
                              log_level=c.harness.log_level)
            out = args.stalls / f"stalls-c{index}-{segments}.txt"
            return await c.harness.start(COORDINATOR, index, [str(SCRIPTS / "stall_sampler.py"), str(out), *argv])
        if prof.raw_dir is None:
            return await c.harness.start_coordinator(index, "127.0.0.1:0", *flags)
        argv = coord_argv(config.endpoints, c.kv.root, "127.0.0.1:0", args.ttl, *flags,
                          log_level=c.harness.log_level)
        return await c.harness.start(COORDINATOR, index, [str(SCRIPTS / "profiled_coord.py"), str(prof.raw_dir),
                                                          *argv])

    async def start_c0(c: ScaleCluster) -> Member:
        return await start_coordinator(c, 0, profile)

    # Every node has room for the whole collection: four of them go, and their copies must find a place.
    capacity = max(1024 << 20, segments * SEGMENT_MEM_BOUND)
    cl = await ScaleCluster.start(config, args, segments, work, node_capacity=capacity, start_c0=start_c0)
    try:
        c0, cid, http0 = cl.leader, cl.collection_id, cl.http0
        profile.member = c0
        res.settle_s, res.rss_before_kib = cl.settle_s, cl.rss_before_kib
        res.load_s = await load_main(cl.client_of_c0, cid, args.poll, args.timeout)
        logger.info("{:,} segments: loaded in {:.2f}s", segments, res.load_s)
        done0 = (await asyncio.to_thread(scrape, http0))["querycoord_checker_passes_total"]
        await wait_until("two checker passes after the load",
                         lambda: at_least(http0, "querycoord_checker_passes", done0 + 2), args.timeout, 0.5)
        res.leader_rss_kib = proc_status_kib(c0.child.pid, "VmRSS")

        c1 = await start_coordinator(cl, 1, standby_profile)
        standby_profile.member = c1
        await wait_for_standby(cl.kv, c1, args.warm_standby, args.timeout)
        res.standby_rss_kib = proc_status_kib(c1.child.pid, "VmRSS")
        res.standby_read_ms = await standby_reads(c1, cid, args.reads)

        res.passes, res.pass_s, res.pass_cpu_s, res.window_s, res.window_cpu_s = await steady_passes(
            cl, args.passes, profile)
        res.segment_info_ms, res.segment_info_ids = await segment_info(cl, args.reads)
        res.status_ms, res.cli_floor_ms, res.status_page_ms, res.status_page_failed = await status_reads(
            cl, config, args.reads)
        res.verify_s, res.verify_rss_mb, res.verify_exit = await meta_verify(cl, config)
        # Each figure as soon as it is taken: a later step that never ends (a repair stuck at some size) loses
        # only its own.
        logger.info("{:,} segments: leader RSS {:.3f} KiB/segment, standby RSS {:.3f} KiB/segment, standby read "
                    "{} ms; steady pass {:.4f} s CPU, {:.4f} s wall (c0 {:.2f} s CPU over {:.1f} s); GetSegmentInfo "
                    "of {} ids {} ms; status -o json {} ms (floor {} ms); status page {} ms, failed: {}; meta verify "
                    "{:.2f} s, {:.0f} MiB, exit {}", segments, res.per_segment(res.leader_rss_kib),
                    res.per_segment(res.standby_rss_kib), res.standby_read_ms, res.pass_cpu_s, res.pass_s,
                    res.window_cpu_s, res.window_s, res.segment_info_ids, res.segment_info_ms, res.status_ms,
                    res.cli_floor_ms, res.status_page_ms, res.status_page_failed or "none", res.verify_s,
                    res.verify_rss_mb, res.verify_exit)

        whole = Whole(cl.nodes, cid, segments, args.channels)
        settled = lambda: leader_settled(cl.client_of_c0, cid)  # noqa: E731
        victim = cl.nodes[0]

        async def kill_victim() -> None:
            profile.start()
            await whole.crash(victim)

        res.repair = await measure_move(cl, whole, "node-down repair", kill_victim, settled,
                                        ended=partial(profile.stop, f"repair-{segments}"))

        drained_node = cl.nodes[1]
        node_id = drained_node.state.node_id

        async def drain() -> None:
            profile.start()
            resp = await cl.client_of_c0.query("DrainNode", qc.NodeLifecycleRequest(node_id=node_id))
            if resp.status.error_code != 0:
                raise BenchError(f"DrainNode {node_id}: {resp.status.reason}")
            whole.leave(drained_node)

        async def drained() -> bool:
            nodes = await cl.client_of_c0.query("ShowNodes", qc.ShowNodesRequest())
            state = {n.node_id: n.lifecycle for n in nodes.nodes}
            return state.get(node_id) == qc.NODE_LIFECYCLE_DRAINED and await settled()

        res.drain = await measure_move(cl, whole, "drain", drain, drained,
                                       ended=partial(profile.stop, f"drain-{segments}"))

        two = cl.nodes[2:4]

        async def two_down() -> None:
            res.loop_blocked_s = await loop_blocked(http0)
            await asyncio.gather(*(whole.crash(n) for n in two))
            standby_profile.start()  # from the kill until c1 reconciled

        tk = await kill_and_take_over(cl.kv, c0, c1, args.timeout, args.ttl, before_kill=two_down)
        await standby_profile.stop(f"takeover-{segments}")
        t_kill = time.perf_counter() - tk.reconciled_s
        res.takeover_lease_s, res.takeover_over_ttl_s = tk.lease_s, tk.reconciled_s - tk.lease_s
        res.takeover_leader_s, res.takeover_steps = tk.leader_event_s - tk.lease_s, tk.steps
        res.new_loop_blocked_s = await loop_blocked(str(c1.ready["http_address"]))
        await whole.wait(t_kill, args.timeout)
        c1_client = QueryCoordClient([c1.address], deadline=args.timeout, call_timeout=args.timeout)
        try:
            await wait_until("the new leader done with the two nodes", lambda: leader_settled(c1_client, cid),
                             args.timeout, 0.1)
        finally:
            await c1_client.close()
        res.takeover_whole_s = time.perf_counter() - t_kill
        logger.info("{:,} segments: takeover with two nodes down {:.2f}s over the lease, whole at {:.2f}s", segments,
                    res.takeover_over_ttl_s, res.takeover_whole_s)
        return res
    finally:
        await cl.close()


# ----- report -----------------------------------------------------------------------------------------------------
def size_rows(r: OpsResult, args: argparse.Namespace) -> list[tuple[str, str]]:
    def move_row(m: Move) -> str:
        return (f"{m.seconds:.2f} s (nodes whole at {m.nodes_whole_s:.2f} s); wrote {m.records:,} records "
                f"({m.segment_records:,} segment records) and {m.deletes:,} deletes in {m.txns:,} txns; raw "
                f"{m.raw_s:.3f} s: ratio {m.ratio:.2f}; CPU: c0 {m.leader_cpu_s:.2f} s, this process (the nodes) "
                f"{m.bench_cpu_s:.2f} s, the machine busy {m.machine_busy_s:.2f} of {m.machine_all_s:.2f} s; "
                f"{m.checker_passes} checker passes ended meanwhile, {m.checker_pass_s:.2f} s wall")

    return [
        (f"== {r.segments:,} segments", f"{args.nodes} in-process nodes, {args.partitions} partitions, 1 replica"),
        ("load_s", f"{r.load_s:.2f} s (after the catalog copy: {r.settle_s:.1f} s)"),
        ("leader RSS", f"{r.leader_rss_kib / 1024:.0f} MiB: {r.per_segment(r.leader_rss_kib):.2f} KiB per segment "
                       f"over {r.rss_before_kib / 1024:.0f} MiB"),
        ("standby RSS", f"{r.standby_rss_kib / 1024:.0f} MiB: {r.per_segment(r.standby_rss_kib):.2f} KiB per segment"),
        ("standby read (median)", f"{r.standby_read_ms:.1f} ms (ShowCollections, GetReplicas)"),
        ("checker steady pass", f"{r.pass_cpu_s:.3f} s CPU, {r.pass_s:.3f} s wall (mean of {r.passes}); c0's whole "
                                f"CPU {r.window_cpu_s:.2f} s over the {r.window_s:.1f} s window"),
        (f"GetSegmentInfo of {r.segment_info_ids:,} ids", f"{r.segment_info_ms:.1f} ms"),
        ("status -o json (process)", f"{r.status_ms:.0f} ms (a `querycoord --help` process: {r.cli_floor_ms:.0f} ms; "
                                     "both from byte-compiled packages)"),
        ("status page", f"{r.status_page_ms:.1f} ms" + (f"; {len(r.status_page_failed)} of {args.reads} failed: "
                                                         f"{r.status_page_failed[0]}" if r.status_page_failed else "")),
        ("meta verify (process)", f"{r.verify_s:.2f} s, peak RSS {r.verify_rss_mb:.0f} MiB, exit {r.verify_exit}"),
        ("node-down repair", move_row(r.repair)),
        ("drain of one node", move_row(r.drain)),
        ("takeover, two nodes down", f"{r.takeover_over_ttl_s:.2f} s over the lease ({r.takeover_lease_s:.2f} s); "
                                     f"whole again {r.takeover_whole_s:.2f} s after the kill"),
        ("takeover steps", f"leading {r.takeover_leader_s:.2f} s over the lease, then its first pass "
                           f"{r.takeover_over_ttl_s - r.takeover_leader_s:.2f} s; steps (s): "
                           + ", ".join(f"{k} {v:.3f}" for k, v in r.takeover_steps.items())),
        ("longest event loop block", f"c0 {r.loop_blocked_s:.2f} s before its kill, c1 {r.new_loop_blocked_s:.2f} s "
                                     f"until reconciled (session TTL {args.ttl:g} s)"),
    ]


def run(args: argparse.Namespace) -> dict[str, object]:
    results: list[OpsResult] = []

    async def all_sizes() -> None:
        with tempfile.TemporaryDirectory(prefix="bench-scale-ops-") as tmp:
            for n in args.sizes:
                work = Path(tmp)
                r = await on_fresh_etcd(args, n, work, partial(one_size, args=args, segments=n, work=work))
                results.append(r)
                print(fmt_table(size_rows(r, args)), file=args.out, flush=True)

    asyncio.run(all_sizes())

    def col(get: Callable[[OpsResult], float], digits: int = 3) -> list[float]:
        return [round(get(r), digits) for r in results]

    return {
        "segments": [r.segments for r in results],
        "load_s": col(lambda r: r.load_s),
        "checker_pass_cpu_s": col(lambda r: r.pass_cpu_s, 4),
        "checker_pass_s": col(lambda r: r.pass_s, 4),
        "node_down_repair_s": col(lambda r: r.repair.seconds),
        "node_down_repair_ratio": col(lambda r: r.repair.ratio, 2),
        "drain_s": col(lambda r: r.drain.seconds),
        "drain_ratio": col(lambda r: r.drain.ratio, 2),
        "takeover_two_down_over_ttl_s": col(lambda r: r.takeover_over_ttl_s),
        "meta_verify_s": col(lambda r: r.verify_s),
        "meta_verify_rss_mb": col(lambda r: r.verify_rss_mb, 1),
        "status_ms": col(lambda r: r.status_ms, 1),
        "status_page_ms": col(lambda r: r.status_page_ms, 1),
        "segment_info_ms": col(lambda r: r.segment_info_ms, 1),
        "standby_read_ms": col(lambda r: r.standby_read_ms, 1),
        "leader_rss_kib_per_segment": col(lambda r: r.per_segment(r.leader_rss_kib)),
        "standby_rss_kib_per_segment": col(lambda r: r.per_segment(r.standby_rss_kib)),
        "settle_s": col(lambda r: r.settle_s, 2),
        "node_down_repair_raw_s": col(lambda r: r.repair.raw_s, 4),
        "node_down_repair_records": [r.repair.records for r in results],
        "node_down_repair_leader_cpu_s": col(lambda r: r.repair.leader_cpu_s, 2),
        "node_down_repair_nodes_cpu_s": col(lambda r: r.repair.bench_cpu_s, 2),
        "node_down_repair_machine_busy": col(
            lambda r: r.repair.machine_busy_s / r.repair.machine_all_s if r.repair.machine_all_s else 0.0, 2),
        "drain_raw_s": col(lambda r: r.drain.raw_s, 4),
        "drain_records": [r.drain.records for r in results],
        "takeover_two_down_whole_s": col(lambda r: r.takeover_whole_s),
        "takeover_two_down_leading_s": col(lambda r: r.takeover_leader_s),
        "status_floor_ms": col(lambda r: r.cli_floor_ms, 1),
        "status_page_failed": [len(r.status_page_failed) for r in results],
        "checker_window_cpu_s": col(lambda r: r.window_cpu_s),
        "leader_loop_blocked_max_s": col(lambda r: r.loop_blocked_s, 2),
        "new_leader_loop_blocked_max_s": col(lambda r: r.new_loop_blocked_s, 2),
    }


def fmt_table(rows: list[tuple[str, str]]) -> str:
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a.ljust(w)}  {b}" for a, b in rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__ or "", verbose_help="log progress to stderr")
    g = add_scale_options(p)
    g.add_argument("--passes", type=int, default=3, help="steady checker passes measured (default 3)")
    g.add_argument("--reads", type=int, default=5, help="samples of each read, median kept (default 5)")
    g.add_argument("--raw-rounds", type=int, default=3, help="runs of each raw write, median kept (default 3)")
    g.add_argument("--max-repair-bytes", type=int, default=0, metavar="BYTES",
                   help="the coordinators' --max-repair-bytes (default: theirs): a small one cuts a node's repair "
                        "into parts at 100k segments as the default does at 1M")
    g.add_argument("--profile-leader", metavar="DIR",
                   help="profile c0 over its steady passes, the node-down repair and the drain "
                        "(DIR/checker-<segments>.prof, DIR/repair-<segments>.prof, DIR/drain-<segments>.prof)")
    g.add_argument("--profile-standby", metavar="DIR",
                   help="profile c1 from c0's kill until c1's first checker pass ended (DIR/takeover-<segments>.prof)")
    g.add_argument("--stalls", metavar="DIR",
                   help="run each coordinator not profiled under scripts/stall_sampler.py: where its event loop "
                        "stalled, with sampled stacks, in DIR/stalls-c<k>-<segments>.txt")
    args = p.parse_args(argv)
    check_scale_options(p, args)
    require_positive(p, args, ("passes", "reads", "raw_rounds"))
    args.stalls = Path(args.stalls).resolve() if args.stalls else None
    if args.nodes < 5:
        p.error("--nodes must be >= 5 (four of them are taken away)")
    args.profile_leader = Path(args.profile_leader).resolve() if args.profile_leader else None
    args.profile_standby = Path(args.profile_standby).resolve() if args.profile_standby else None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = sys.stdout
    return report(lambda: run(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
