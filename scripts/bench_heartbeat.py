"""Benchmark the stream manager's heartbeat handling and its WATCH adoption after a leader change.

Simulated, in-process: ``--nodes`` stream nodes (default 200) are plain
objects that build ``HeartbeatRequest`` messages, apply the replies (deploys,
undeploys, starts) and report their tasks, like ``tests/test_stream_manager.py``'s
``Node``. Only the store is real: streams and snodes live in an embedded etcd
started in a temporary directory (``--etcd-endpoints`` uses an external one;
the keys written there are removed at the end).

Layout: ``--vgroups-per-node`` vgroups led by each node, an snode on every
``nodes / snodes``-th node, and ``--streams`` streams (default 5,000) of 4
tasks each: one source vgroup (spread round-robin over the vgroups), one calc
scan plan, one runner deploy of one subplan, so ``plan_stream`` gives one
trigger reader, one calc reader, one trigger and one runner. A node reports
its tasks by stream group (``streamGid = streamId % 5``), one group per
heartbeat, as TDengine's snodes and vnodes do.

Phases:

1. deploy: a leader (revision 1) starts with no stream, the streams are created
   and handed to it; rounds of heartbeats (every node, every group) until every
   task is RUNNING (readers and runners go INIT -> RUNNING on their own; the
   trigger when the leader starts it); every report carries the task's progress
   (``processed_ms``, ``source_ms``) as the reference node's do;
2. steady state: ``--rounds`` rounds of heartbeats, each one's
   ``handle_heartbeat`` timed on its own (p50, p99, max);
3. checkpoints: ``--checkpoint-rounds`` times, a checkpoint round starts on every stream at once, then rounds
   of heartbeats run (one heartbeat interval each: every node, every group) with the commits written to etcd
   after each, until every stream committed its round. Per stream: ``checkpoint_round_s`` (start to commit,
   p50 and max) and ``checkpoint_round_heartbeats`` (heartbeat intervals it took; the max must be <= 2: the
   order rides on the reply to one report, the checkpoint on the next); heartbeat p99 during the rounds;
4. leader change: a new ``StreamManager`` (revision 2) on the same store starts
   in WATCH; every node sends every group's heartbeat until WATCH ends; the time
   from ``start()`` to the end of WATCH with every stream adopted is
   ``watch_adopt_s``. One more round then checks that nothing was redeployed.

Durations are TDengine's scaled down (``StreamConfig`` below) except the WATCH
timeout, which stays the short isolation (10 s) that adoption must beat.
``--profile`` runs phase 2 under cProfile and prints the top functions to stderr.

The last line printed is one JSON object::

    {"nodes": 200, "streams": 5000, "p50_ms": ..., "p99_ms": ..., "watch_adopt_s": ..., "checkpoint_round_s_p50": ...,
     "checkpoint_round_s_max": ..., "checkpoint_round_heartbeats": ..., "checkpoint_p99_ms": ...}

Example: ``python scripts/bench_heartbeat.py --nodes 10 --streams 50`` (quick).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import json
import pstats
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterable

from benchlib import arg_parser, log_to_stderr, require_positive, run_on_etcd

from meta.client import connect
from meta.config import EtcdConfig
from meta.kv import MetaKV
from proto import stream_pb2
from querycoord.common.messages import copy_fields
from querycoord.settings.config import StreamConfig
from querycoord.stream.manager import StreamManager
from querycoord.stream.plan import expected_counts
from querycoord.stream.runtime import ManagerState
from querycoord.stream.store import StreamStore

STREAM_GROUPS = 5  # streamGid = streamId % 5 (TDengine)
TASKS_PER_STREAM = 4
CREATE_CONCURRENCY = 64
INIT, RUNNING = stream_pb2.TASK_INIT, stream_pb2.TASK_RUNNING


def bench_config(watch_timeout: float) -> StreamConfig:
    """TDengine's durations scaled down, except the WATCH timeout (the short isolation adoption must beat)."""
    return StreamConfig(
        watch_timeout=watch_timeout,
        task_silence=60.0,  # longer than one full round of heartbeats at full size, so nothing looks lost
        min_start_delay=0.2,
        error_retry_delay=1.0,
        max_retry_delay=10.0,
        fast_retries=10,
        reset_after=2.0,
        checkpoint_interval=0.0,  # rounds run only in the checkpoint phase, which starts them itself
    )


class SimNode:
    """A stream node: keeps the tasks it was given per stream group, reports one group per heartbeat.

    Readers and runners go INIT -> RUNNING after their first report; the
    trigger stays INIT until the leader starts it. Replies of an older leader
    revision than the highest seen are ignored.
    """

    def __init__(self, node_id: int, vgroups: Iterable[int], snode_id: int = 0):
        self.node_id = node_id
        self.vgroups = list(vgroups)
        self.snode_id = snode_id
        self.groups: list[dict[tuple[int, int], stream_pb2.TaskStatusReport]] = [{} for _ in range(STREAM_GROUPS)]
        self.seen_revision = 0
        self.deploys = 0
        self.undeploys = 0
        self.starts = 0

    def request(self, group: int) -> stream_pb2.HeartbeatRequest:
        tasks = self.groups[group]
        # Progress, as the reference node reports it: a RUNNING task has processed what its source held at its
        # last report, and the source holds events up to now.
        now_ms = int(time.time() * 1000)
        for rep in tasks.values():
            if rep.status == RUNNING:
                rep.processed_ms = rep.source_ms or now_ms
            rep.source_ms = now_ms
        req = stream_pb2.HeartbeatRequest(
            node_id=self.node_id,
            snode_id=self.snode_id,
            vgroup_ids=self.vgroups,
            stream_group=group,
            num_stream_groups=STREAM_GROUPS,
            tasks=list(tasks.values()),
            seen_leader_revision=self.seen_revision,
        )
        for rep in tasks.values():
            if rep.status == INIT and rep.kind != stream_pb2.TRIGGER:
                rep.status = RUNNING
        return req

    def _task(self, stream_id: int, task_id: int) -> tuple[dict[tuple[int, int], stream_pb2.TaskStatusReport], tuple]:
        return self.groups[stream_id % STREAM_GROUPS], (stream_id, task_id)

    def apply(self, reply: stream_pb2.HeartbeatReply) -> None:
        if reply.leader_revision < self.seen_revision:
            return
        self.seen_revision = reply.leader_revision
        for u in reply.undeploys:
            self.undeploys += 1
            tasks = self.groups[u.stream_id % STREAM_GROUPS]
            if u.undeploy_all:
                for key in [k for k in tasks if k[0] == u.stream_id]:
                    del tasks[key]
            for t in u.tasks:
                rep = tasks.get((t.stream_id, t.task_id))
                if rep is not None and rep.sid == t.sid:
                    del tasks[(t.stream_id, t.task_id)]
        for d in reply.deploys:
            msgs = [r.task for r in d.readers] + [r.task for r in d.runners]
            if d.HasField("trigger"):
                msgs.append(d.trigger.task)
            for t in msgs:
                self.deploys += 1
                tasks, key = self._task(t.stream_id, t.task_id)
                # Its reports repeat the task's identity as deployed, as a stream node's do.
                tasks[key] = copy_fields(t, stream_pb2.TaskStatusReport, node_id=self.node_id, status=INIT)
        for s in reply.starts:
            self.starts += 1
            tasks, key = self._task(s.stream_id, s.trigger.task_id)
            tasks[key].status = RUNNING
        for order in reply.checkpoints:  # every task of the stream here takes it; reported from the next heartbeat
            for key, rep in self.groups[order.stream_id % STREAM_GROUPS].items():
                if key[0] == order.stream_id and rep.checkpoint_id < order.checkpoint_id:
                    rep.checkpoint_id = order.checkpoint_id

    def reports(self) -> Iterable[stream_pb2.TaskStatusReport]:
        for tasks in self.groups:
            yield from tasks.values()


def snapshot(nodes: list[SimNode]) -> set[tuple[int, int, int, int]]:
    """Every instance out there: (stream, task id, SID, node)."""
    return {(r.stream_id, r.task_id, r.sid, r.node_id) for n in nodes for r in n.reports()}


def all_running(nodes: list[SimNode], expected_tasks: int) -> bool:
    count = 0
    for n in nodes:
        for r in n.reports():
            if r.status != RUNNING:
                return False
            count += 1
    return count == expected_tasks


def leader_sees_running(mgr: StreamManager) -> bool:
    states = {s.state for s in mgr.show_streams(stream_pb2.ShowStreamsRequest()).streams}
    return states == {stream_pb2.STREAM_RUNNING}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return 0.0
    idx = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[idx]


async def heartbeat_round(mgr: StreamManager, nodes: list[SimNode], latencies: list[float] | None = None) -> int:
    """Every node sends every group's heartbeat once; returns how many replies carried an action."""
    acted = 0
    for group in range(STREAM_GROUPS):
        for n in nodes:
            req = n.request(group)
            t0 = time.perf_counter()
            reply = await mgr.handle_heartbeat(req)
            if latencies is not None:
                latencies.append(time.perf_counter() - t0)
            if reply.deploys or reply.undeploys or reply.starts:
                acted += 1
            n.apply(reply)
    return acted


def build_nodes(n_nodes: int, vgroups_per_node: int) -> list[SimNode]:
    """Node i (1-based) leads vgroups i, i + n, i + 2n, ...; snode ids are filled in after creation."""
    return [SimNode(i, [i + k * n_nodes for k in range(vgroups_per_node)]) for i in range(1, n_nodes + 1)]


async def create_streams(
    store: StreamStore, n: int, n_vgroups: int, snode_ids: list[int]
) -> list[stream_pb2.StreamDef]:
    sem = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def one(i: int) -> stream_pb2.StreamDef:
        req = stream_pb2.CreateStreamRequest(
            name=f"bench_s{i}",
            source_db="benchdb",
            source_vgroup_ids=[1 + i % n_vgroups],
            num_calc_scan_plans=1,
            num_calc_subplans=1,
            runner_deploys=1,
        )
        async with sem:
            return await store.create_stream(req, snode_ids)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


Rows = list[tuple]
Snapshot = set[tuple[int, int, int, int]]  # what ``snapshot`` returns


async def setup_cluster(
    store: StreamStore, args: argparse.Namespace, rows: Rows
) -> tuple[list[SimNode], list[stream_pb2.StreamDef]]:
    """The nodes, an snode on every ``nodes / snodes``-th one, and the streams in etcd (not yet handed out)."""
    t0 = time.perf_counter()
    step = max(1, args.nodes // args.snodes)
    nodes = build_nodes(args.nodes, args.vgroups_per_node)
    snode_ids = []
    for n in nodes[::step][: args.snodes]:
        n.snode_id = (await store.create_snode(n.node_id)).id
        snode_ids.append(n.snode_id)
    sdefs = await create_streams(store, args.streams, args.nodes * args.vgroups_per_node, snode_ids)
    per_stream = {expected_counts(s).total for s in sdefs}
    if per_stream != {TASKS_PER_STREAM}:
        raise SystemExit(f"stream shape gives {per_stream} tasks per stream, not {TASKS_PER_STREAM}")
    rows.append(("setup: create snodes + streams in etcd", f"{time.perf_counter() - t0:.2f}", "s"))
    return nodes, sdefs


async def deploy_phase(store: StreamStore, cfg: StreamConfig, nodes: list[SimNode],
                       sdefs: list[stream_pb2.StreamDef], args: argparse.Namespace, rows: Rows) -> StreamManager:
    """Phase 1: a leader deploys every stream through heartbeats until every task is RUNNING; returns it."""
    expected_tasks = args.streams * TASKS_PER_STREAM
    t0 = time.perf_counter()
    leader = StreamManager(store, leader_revision=1, config=cfg, rng=random.Random(2))
    await leader.start()  # no stream yet: NORMAL
    leader.set_live_nodes([n.node_id for n in nodes])
    await heartbeat_round(leader, nodes)  # snodes and vgroups reported: live
    for sdef in sdefs:
        leader.put_stream(sdef)
    deploy_rounds = 0
    deploy_lat: list[float] = []
    while not (all_running(nodes, expected_tasks) and leader_sees_running(leader)):
        deploy_rounds += 1
        if deploy_rounds > args.max_rounds:
            raise SystemExit(f"phase 1: not every task RUNNING after {args.max_rounds} rounds")
        r0 = time.perf_counter()
        await heartbeat_round(leader, nodes, deploy_lat)
        leader.tick()
        # A trigger is started no sooner than min_start_delay after its deploy: small runs wait for it.
        await asyncio.sleep(max(0.0, cfg.min_start_delay - (time.perf_counter() - r0)))
    deploy_s = time.perf_counter() - t0
    rows.append(("phase 1: deploy until all RUNNING", f"{deploy_s:.2f}", f"s ({deploy_rounds} rounds)"))
    deploy_lat.sort()
    rows.append(("phase 1: heartbeat p99 while deploying", f"{percentile(deploy_lat, 99) * 1000:.3f}", "ms"))
    rows.append(("phase 1: heartbeat max (plans every stream)", f"{deploy_lat[-1] * 1000:.3f}", "ms"))
    return leader


async def steady_rounds(leader: StreamManager, nodes: list[SimNode], rounds: int, latencies: list[float],
                        ticks: list[float], profile: bool) -> None:
    """``rounds`` rounds of heartbeats, each timed, none of which may act; under cProfile with ``profile``."""
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    for _ in range(rounds):
        acted = await heartbeat_round(leader, nodes, latencies)
        if acted:
            raise SystemExit(f"phase 2: {acted} steady-state replies carried actions")
        t1 = time.perf_counter()
        leader.tick()
        ticks.append(time.perf_counter() - t1)
    if profiler:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue(), file=sys.stderr, flush=True)


async def steady_phase(leader: StreamManager, nodes: list[SimNode], args: argparse.Namespace,
                       rows: Rows) -> tuple[float, float, Snapshot]:
    """Phase 2: steady-state heartbeat latency; returns p50 and p99 (ms) and the task set, which must not move."""
    latencies: list[float] = []
    ticks: list[float] = []
    before = snapshot(nodes)
    await steady_rounds(leader, nodes, args.rounds, latencies, ticks, args.profile)
    if snapshot(nodes) != before:
        raise SystemExit("phase 2: the task set changed in steady state")
    latencies.sort()
    p50, p99 = percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000
    reports = [len(n.groups[g]) for n in nodes for g in range(STREAM_GROUPS)]
    rows.append(("phase 2: heartbeats timed", str(len(latencies)), f"({args.rounds} rounds)"))
    mean_max = f"{statistics.mean(reports):.0f}/{max(reports)}"
    rows.append(("phase 2: task reports per heartbeat mean/max", mean_max, ""))
    rows.append(("phase 2: handle_heartbeat p50", f"{p50:.3f}", "ms"))
    rows.append(("phase 2: handle_heartbeat p99", f"{p99:.3f}", "ms (target <= 20)"))
    rows.append(("phase 2: handle_heartbeat max", f"{latencies[-1] * 1000:.3f}", "ms"))
    rows.append(("phase 2: tick() mean", f"{statistics.mean(ticks) * 1000:.3f}", "ms"))
    return p50, p99, before


async def checkpoint_phase(leader: StreamManager, cfg: StreamConfig, nodes: list[SimNode], args: argparse.Namespace,
                           rows: Rows) -> dict[str, float | int]:
    """Phase 3: checkpoint rounds on every stream during steady heartbeats (module docstring)."""
    leader.shared.config = dataclasses.replace(cfg, checkpoint_interval=1e-9, checkpoint_timeout=3600.0)
    latencies: list[float] = []
    durations: list[float] = []
    intervals: list[int] = []
    for _ in range(args.checkpoint_rounds):
        t0 = time.perf_counter()
        await leader.checkpoint_tick()  # every stream is due: one round each, ids in one allocator block
        targets = {sid: rt.round.id for sid, rt in leader.streams.items() if rt.round is not None}
        if len(targets) != args.streams:
            raise SystemExit(f"phase 3: {len(targets)} of {args.streams} streams started a checkpoint round")
        waiting = dict(targets)
        hb = 0
        while waiting:
            hb += 1
            if hb > args.max_rounds:
                raise SystemExit(f"phase 3: {len(waiting)} streams did not commit their checkpoint round")
            await heartbeat_round(leader, nodes, latencies)
            await leader.checkpoints.flush()
            now = time.perf_counter() - t0
            for sid in [s for s, cid in waiting.items() if leader.streams[s].checkpoint_id >= cid]:
                del waiting[sid]
                durations.append(now)
                intervals.append(hb)
    leader.shared.config = cfg
    latencies.sort()
    durations.sort()
    p99 = percentile(latencies, 99) * 1000
    rows.append(("phase 3: checkpoint rounds (every stream)", str(args.checkpoint_rounds), "rounds"))
    rows.append(("phase 3: checkpoint round p50 (start -> commit)", f"{percentile(durations, 50):.3f}", "s"))
    rows.append(("phase 3: checkpoint round max", f"{durations[-1]:.3f}", "s"))
    rows.append(("phase 3: heartbeat intervals per round max", str(max(intervals)), "(target <= 2)"))
    rows.append(("phase 3: handle_heartbeat p99 during rounds", f"{p99:.3f}", "ms (target <= 20)"))
    rows.append(("phase 3: checkpoints committed / abandoned",
                 f"{leader.checkpoints.committed}/{leader.checkpoints.abandoned}", ""))
    return {
        "checkpoint_round_s_p50": round(percentile(durations, 50), 3),
        "checkpoint_round_s_max": round(durations[-1], 3),
        "checkpoint_round_heartbeats": max(intervals),
        "checkpoint_p99_ms": round(p99, 3),
    }


async def adopt_phase(store: StreamStore, cfg: StreamConfig, nodes: list[SimNode], before: Snapshot,
                      args: argparse.Namespace, rows: Rows) -> float:
    """Phase 3: a new leader adopts every stream in WATCH and redeploys nothing; returns ``watch_adopt_s``."""
    deploys_before = sum(n.deploys for n in nodes)
    undeploys_before = sum(n.undeploys for n in nodes)
    t0 = time.perf_counter()
    new = StreamManager(store, leader_revision=2, config=cfg, rng=random.Random(3))
    await new.start()
    load_s = time.perf_counter() - t0
    if new.state is not ManagerState.WATCH:
        raise SystemExit(f"phase 4: the new leader starts in {new.state.value}, not WATCH")
    new.set_live_nodes([n.node_id for n in nodes])
    watch_lat: list[float] = []
    watch_rounds = 0
    while new.state is ManagerState.WATCH:
        watch_rounds += 1
        if watch_rounds > args.max_rounds:
            raise SystemExit("phase 4: WATCH did not end")
        await heartbeat_round(new, nodes, watch_lat)
        new.tick()
    watch_adopt_s = time.perf_counter() - t0
    if new.adopted != args.streams:
        raise SystemExit(f"phase 4: {new.adopted} of {args.streams} streams adopted")
    acted = await heartbeat_round(new, nodes)
    new.tick()
    redeployed = sum(n.deploys for n in nodes) - deploys_before
    undeployed = sum(n.undeploys for n in nodes) - undeploys_before
    if acted or new.redeploys or redeployed or undeployed or snapshot(nodes) != before:
        raise SystemExit(
            f"phase 4: after adoption {acted} replies acted, {new.redeploys} redeploys, "
            f"{redeployed} tasks deployed, {undeployed} undeploys"
        )
    watch_lat.sort()
    rows.append(("phase 4: new leader start() (load streams)", f"{load_s:.3f}", "s"))
    rows.append(("phase 4: WATCH heartbeat p99", f"{percentile(watch_lat, 99) * 1000:.3f}", "ms"))
    rows.append(
        (
            "phase 4: start() -> WATCH ended, all adopted",
            f"{watch_adopt_s:.3f}",
            f"s (watch_timeout {cfg.watch_timeout:g} s, {watch_rounds} round)",
        )
    )
    rows.append(("phase 4: adopted / redeploys", f"{new.adopted}/{new.redeploys}", ""))
    return watch_adopt_s


async def bench_main(config: EtcdConfig, args: argparse.Namespace) -> tuple[dict[str, float | int], list[tuple]]:
    """The setup and the three phases (module docstring) on the etcd of ``config``; its keys are removed at the
    end. Returns the JSON line's values and the table's rows."""
    cfg = bench_config(args.watch_timeout)
    client = await connect(config)
    kv = MetaKV(client, f"bench-hb/{uuid.uuid4().hex[:12]}")
    rows: Rows = []
    try:
        store = StreamStore(kv, rng=random.Random(1))
        nodes, sdefs = await setup_cluster(store, args, rows)
        leader = await deploy_phase(store, cfg, nodes, sdefs, args, rows)
        p50, p99, before = await steady_phase(leader, nodes, args, rows)
        checkpoints = await checkpoint_phase(leader, cfg, nodes, args, rows)
        watch_adopt_s = await adopt_phase(store, cfg, nodes, before, args, rows)
        result: dict[str, float | int] = {
            "nodes": args.nodes,
            "streams": args.streams,
            "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3),
            "watch_adopt_s": round(watch_adopt_s, 3),
            **checkpoints,
        }
        return result, rows
    finally:
        try:
            await kv.remove_prefix("")  # leave nothing behind on an external etcd
        finally:
            await client.close()


def print_table(rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(2)]
    print(f"{'measure'.ljust(widths[0])}  {'value'.rjust(widths[1])}  unit")
    print(f"{'-' * widths[0]}  {'-' * widths[1]}  ----")
    for name, value, unit in rows:
        print(f"{name.ljust(widths[0])}  {value.rjust(widths[1])}  {unit}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__, verbose_help="log to stderr")
    w = p.add_argument_group("workload")
    w.add_argument("--nodes", type=int, default=200, help="simulated stream nodes (default 200)")
    w.add_argument("--streams", type=int, default=5000, help="streams of 4 tasks (default 5000)")
    w.add_argument("--snodes", type=int, default=0, help="snodes (default: one per 10 nodes, at least 1)")
    w.add_argument("--vgroups-per-node", type=int, default=2, help="vgroups led by each node (default 2)")
    m = p.add_argument_group("measurement")
    m.add_argument("--rounds", type=int, default=3, help="steady-state rounds timed (default 3)")
    m.add_argument("--watch-timeout", type=float, default=10.0, help="WATCH timeout in s (default 10)")
    m.add_argument("--checkpoint-rounds", type=int, default=3,
                   help="checkpoint rounds of every stream timed (default 3)")
    m.add_argument("--max-rounds", type=int, default=50, help="give up a phase after this many rounds")
    m.add_argument("--profile", action="store_true", help="cProfile phase 2, top functions to stderr")
    args = p.parse_args(argv)
    args.snodes = args.snodes or max(1, args.nodes // 10)
    require_positive(p, args, ("nodes", "streams", "snodes", "vgroups_per_node", "rounds", "checkpoint_rounds",
                               "max_rounds"))
    if args.snodes > args.nodes:
        p.error("--snodes must be <= --nodes (one snode per node)")
    if args.watch_timeout <= 0:
        p.error("--watch-timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_to_stderr(args.verbose)
    result, rows = run_on_etcd(bench_main, args, "bench-hb-")
    print_table(rows)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
