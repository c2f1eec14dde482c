"""The rolling drill: every query node in turn drained, stopped, restarted and uncordoned, with clients at work.

``querycoord drill rolling`` starts an embedded etcd, ``--coordinators`` coordinators (``querycoord coord``, auto
balance every ``--auto-balance-interval``) and ``--nodes`` reference query nodes as processes under fixed ids
(``fixed_nodes``), each with the memory that makes the judged collections fill ``--fill`` of the cluster. It loads
``--collections-two`` collections with 2 replicas and ``--collections-one`` with 1 (``--segments`` each), then,
while ``--churn-collections`` clients load and release other collections over and over, takes every node in turn
(``rolling_step``): cordon, drain and wait until DRAINED, SIGTERM (the node stops gracefully), start it again
under its id and address, wait until the leader lists it online, uncordon it, wait until every judged
collection is whole again by the nodes' reports and no balance or repair runs, then the next node. ``--drain 0``
leaves the drain to the node's graceful stop (on SIGTERM it drains itself, for at most ``--graceful-stop-timeout``
seconds, and the leader makes it ACTIVE again when it registers anew); ``--drain 0 --graceful-stop-timeout 0`` is a
plain stop (a node's copies are then repaired after it left).

All along, every ``--sample-interval`` seconds, each node process is asked for its own GetDataDistribution
(twice, see ``rolling_judge``) and the leader for the replicas' members; a sample in which some 2-replica
collection has no replica holding every target segment and DM channel is an unserved sample. The moves are
counted from the task history (``rolling_moves``). A table, then one JSON line; exit 1 when a sample was
unserved, a node was not restarted or not whole again, a drain did not end DRAINED, a process exited on its own,
or a node is not online and ACTIVE at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.tooling.drill.base import (
    DrillSetupError,
    ProcessDrill,
    run_and_report,
    verdict_lines,
    wait_nodes_online,
)
from querycoord.tooling.drill.fixed_nodes import (
    SILENT,
    DirectReads,
    create_collections,
    exit_text,
    failed_text,
    finished_trees,
    load_targets,
    new_exits,
    start_fixed_node,
)
from querycoord.tooling.drill.options import MIB, RollingOptions
from querycoord.tooling.drill.restart_judge import Holding, Target, lacking
from querycoord.tooling.drill.rolling_judge import NodeStep, Tally, failures, merge, serving, summary
from querycoord.tooling.drill.rolling_moves import count_moves
from querycoord.tooling.drill.rolling_step import StepError, drain, nodes, uncordon, wait_node
from querycoord.tooling.harness import Harness, Member

EC = common_pb2
SEGMENT_BYTES = 1000 * (8 * 4 + 8)  # what ``create_collections`` accounts for one segment
CALL_TIMEOUT = 5.0  # one sample's call to a node or the leader; a node slower than this is "silent"
ONLINE_TIMEOUT = 60.0  # a restarted node must be listed online within this
MOVING_KINDS = (qc.TASK_KIND_LOAD_BALANCE, qc.TASK_KIND_REPAIR)


@dataclass
class RollingResult:
    opts: RollingOptions
    tally: Tally
    steps: list[NodeStep] = field(default_factory=list)
    moves: dict[str, int] = field(default_factory=dict)
    exited: list[str] = field(default_factory=list)
    not_active: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    failed_triggers: list[str] = field(default_factory=list)
    churn_ops: int = 0
    churn_errors: list[str] = field(default_factory=list)
    load_s: float | None = None
    duration_s: float = 0.0
    drill_cpu_s: float = 0.0

    @property
    def drained(self) -> bool:
        return bool(self.opts.drain)

    def summary(self) -> dict[str, Any]:
        o = self.opts
        extra = {"nodes": o.nodes, "coordinators": o.coordinators, "collections_two": o.collections_two,
                 "collections_one": o.collections_one, "segments": o.segments, "drained": self.drained,
                 "drains_unfinished": sum(s.drain_left is None and not s.stalled and s.stopped is not None
                                          for s in self.steps) if self.drained else 0,
                 "drains_waiting": sum(bool(s.stalled) for s in self.steps),
                 "churn_ops": self.churn_ops, "churn_errors": len(self.churn_errors),
                 "failed_triggers": len(self.failed_triggers),
                 "unlisted_children": self.moves.get("unlisted_children", 0),
                 "escalated": len(self.escalated), "exited_on_their_own": len(self.exited),
                 "nodes_not_active": len(self.not_active),
                 "load_s": None if self.load_s is None else round(self.load_s, 2),
                 "drill_cpu_s": round(self.drill_cpu_s, 1), "seed": o.seed}
        return summary(self.tally, self.steps, self.moves, duration_s=self.duration_s, extra=extra)

    def failures(self) -> list[str]:
        return failures(self.summary(), nodes=self.opts.nodes) + self.exited + self.not_active

    @property
    def failed(self) -> bool:
        return bool(self.failures())


class RollingDrill(ProcessDrill[RollingOptions, RollingResult]):
    """One run (see module docstring); every process is stopped before ``run`` returns."""

    def __init__(self, opts: RollingOptions, out: Any = None):
        super().__init__(opts, out, "querycoord-rolling-")
        self.root = f"drill-rolling-{opts.seed}"
        self.rng = random.Random(f"rolling-{opts.seed}")
        self.client: QueryCoordClient | None = None
        self.nodes: list[Member] = []
        self.targets: dict[int, Target] = {}  # the judged collections
        self.churn: list[int] = []
        self.replicas: dict[int, tuple[frozenset[int], ...]] = {}  # the leader's members, as last answered
        self.reads = DirectReads(CALL_TIMEOUT)
        self.whole_at: float | None = None  # the latest sample that found every judged replica whole
        self.judging = False  # samples count once the first load is whole (a load in progress serves nothing yet)
        self.sampled = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stop_churn = asyncio.Event()
        self._seen_exits: set[int] = set()
        self._mark = 0  # the newest trigger id before the first node's turn
        self.result = RollingResult(opts, Tally(frozenset(), frozenset()))

    @property
    def api(self) -> QueryCoordClient:
        assert self.client is not None
        return self.client

    @property
    def capacity_mb(self) -> float:
        copies = sum(n * r for _, n, r in self.opts.specs())
        return max(1.0, copies * SEGMENT_BYTES / self.opts.fill / self.opts.nodes / MIB)

    # ----- the cluster ----------------------------------------------------------------------------------------------
    async def _start_cluster(self) -> None:
        o = self.opts
        self.say(f"rolling drill: seed {o.seed}, {o.nodes} query nodes ({self.capacity_mb:.1f} MiB each), "
                 f"{o.coordinators} coordinators, {o.collections_two} collections x2 and {o.collections_one} x1 "
                 f"replicas of {o.segments} segments, {o.churn_collections} churned; "
                 f"{how(self.opts)}; work dir {self.work}")
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdCluster(self.work / "etcd", size=1)
        await asyncio.to_thread(self.etcd.start)
        self.harness = Harness(self.etcd.endpoints, self.root, self.work, ttl=o.ttl)
        flags = ("--scaled", "--auto-balance-interval", f"{o.auto_balance_interval:g}", "--history-children",
                 "100000")
        coords = await asyncio.gather(*(self.cluster.start_coordinator(i, "127.0.0.1:0", *flags)
                                        for i in range(o.coordinators)))
        self.client = QueryCoordClient([c.address for c in coords], deadline=60.0, call_timeout=30.0)
        try:
            await self._wait_leader(60)
        except TimeoutError:
            raise DrillSetupError(f"no coordinator became leader within 60s; logs in {self.work}") from None
        made = await create_collections(self.etcd.config(), self.root, o.specs(), partitions=o.partitions,
                                        channels=o.channels)
        self.targets = {cid: t for cid, t in made.items() if t.replicas}
        self.churn = [cid for cid, t in made.items() if not t.replicas]
        self.result.tally = Tally(frozenset(c for c, t in self.targets.items() if t.replicas >= 2),
                                  frozenset(c for c, t in self.targets.items() if t.replicas == 1))
        self.nodes = list(await asyncio.gather(*(self._start_node(i) for i in range(o.nodes))))
        await wait_nodes_online(self.client, self.nodes, timeout=60)
        self._tasks.append(asyncio.create_task(self._sample_forever(), name="sampler"))
        began = self.now()
        await load_targets(self.api, self.targets)
        if not await self._wait_whole(began, o.whole_timeout):
            raise DrillSetupError(f"the first load was not whole within {o.whole_timeout:g}s")
        self.result.load_s = self.now() - began
        self.judging = True
        self.say(f"loaded: every replica whole by the nodes' own reports after {self.result.load_s:.2f}s")
        await self._wait_quiet(o.whole_timeout)
        with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
            newest = await self.api.query("ListTasks", qc.ListTasksRequest(include_finished=True, limit=1,
                                                                          newest_first=True))
            self._mark = max((t.trigger.task_id for t in newest.trees), default=0)

    async def _start_node(self, index: int, member: Member | None = None) -> Member:
        return await start_fixed_node(self.cluster, index, member=member, capacity_mb=self.capacity_mb,
                                      graceful_stop_timeout=self.opts.graceful_stop_timeout, say=self.say)

    async def _stop_cluster(self) -> None:
        self._stop_churn.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # The nodes first, at once: on SIGTERM they would drain themselves (graceful stop) with no leader left.
        await asyncio.gather(*(self.cluster.kill(n) for n in self.nodes if n.running), return_exceptions=True)
        await self._stop_processes(None if self.client is None else self.client.close(), self.reads.close())

    # ----- the turns ------------------------------------------------------------------------------------------------
    async def _drive(self) -> None:
        self._tasks += [asyncio.create_task(self._churn(cid), name=f"churn {cid}") for cid in self.churn]
        for node in self.nodes:
            self._check_exits()
            await self._turn(node)
        self._stop_churn.set()
        await self._final()

    async def _turn(self, node: Member) -> None:
        o, nid = self.opts, node.node_id
        step = NodeStep(nid, self.now())
        self.result.steps.append(step)
        self.say(f"node {nid}: {how(o)}")
        if self.result.drained:
            try:
                got = await drain(self.api, nid, o.drain_timeout, o.drain_stall)
            except (StepError, CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                step.notes.append(f"drain refused: {exc}")
                got = None
            if got is not None and got.lifecycle == "DRAINED":
                step.drained, step.drain_left = self.now(), got.copies_left
                self.say(f"node {nid}: DRAINED after {step.took(step.drained, step.began)}")
            elif got is not None and got.waiting:
                step.stalled = got.waiting
                step.notes.append(f"drain waits ({got.copies_left} copies left): {got.waiting}")
                self.say(f"node {nid}: the drain waits ({got.copies_left} copies left: {got.waiting}); stopped "
                         f"anyway")
            else:
                step.notes.append(f"not DRAINED within {o.drain_timeout:g}s" + (
                    "" if got is None else f" ({got.lifecycle}, {got.copies_left} copies left)"))
                self.say(f"node {nid}: NOT DRAINED within {o.drain_timeout:g}s; stopped anyway")
        node.state = "dead"  # stopped by the drill, not exited on its own
        code = await node.child.stop(o.graceful_stop_timeout + o.stop_timeout_margin)
        if code == -signal.SIGKILL:
            self.result.escalated.append(f"node {nid}")
            step.notes.append("ignored SIGTERM: SIGKILLed")
        step.stopped = self.now()
        self.note(f"node {nid}: exited with {code} after {step.took(step.stopped, step.began)}")
        await self._start_node(node.index, member=node)
        step.started = self.now()
        if await wait_node(self.api, nid, ONLINE_TIMEOUT, state="online") is None:
            step.notes.append(f"not online at the leader within {ONLINE_TIMEOUT:g}s")
            self.say(f"node {nid}: NOT online within {ONLINE_TIMEOUT:g}s")
            return
        step.online = self.now()
        if self.result.drained:
            try:
                await uncordon(self.api, nid)
            except (StepError, CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                step.notes.append(f"uncordon refused: {exc}")
        if await self._wait_whole(step.online, o.whole_timeout):
            step.whole = self.whole_at
        else:
            step.notes.append(f"not whole within {o.whole_timeout:g}s")
        if await self._wait_quiet(o.whole_timeout):
            step.balanced = self.now()
        self.say(f"node {nid}: back online after {step.took(step.online, step.stopped)}, whole after "
                 f"{step.took(step.whole, step.online)}, turn {step.took(step.balanced or step.whole, step.began)}")

    async def _wait_whole(self, since: float, timeout: float) -> bool:
        """Until a sample taken after ``since`` finds every judged replica whole; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.whole_at is None or self.whole_at < since:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sampled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.sampled.wait(), min(left, 1.0))
        return True

    async def _wait_quiet(self, timeout: float) -> bool:
        """Until the leader runs no balance and no repair (a balance onto a returned node); False after
        ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
                resp = await self.api.query("ListTasks", qc.ListTasksRequest(limit=100))
                if resp.status.error_code == EC.SUCCESS and not any(
                        t.trigger.kind in MOVING_KINDS for t in resp.trees):
                    return True
            await asyncio.sleep(0.3)
        return False

    async def _churn(self, cid: int) -> None:
        """A client loading and releasing collection ``cid`` until the last turn is done."""
        rng = random.Random(f"churn-{self.opts.seed}-{cid}")
        while not self._stop_churn.is_set():
            for method, request in (("LoadCollection", qc.LoadCollectionRequest(collection_id=cid)),
                                    ("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))):
                self.result.churn_ops += 1
                try:
                    resp = await self.api.query(method, request)
                    if resp.status.error_code != EC.SUCCESS:
                        self._churn_error(f"{method} {cid}: {EC.ErrorCode.Name(resp.status.error_code)} "
                                          f"{resp.status.reason}")
                except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                    self._churn_error(f"{method} {cid}: {exc}")
                await asyncio.sleep(rng.uniform(0.2, 1.5))

    def _churn_error(self, text: str) -> None:
        self.result.churn_errors.append(text)
        self.note(f"churn: {text}")

    async def _final(self) -> None:
        """Once the churn stopped: no trigger runs (bounded), every node online and ACTIVE, the moves and the
        FAILED triggers since the first turn."""
        self.result.drill_cpu_s = time.process_time()
        self._check_exits()
        deadline = time.monotonic() + self.opts.whole_timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
                if not (await self.api.query("ListTasks", qc.ListTasksRequest(limit=1))).trees:
                    break
            await asyncio.sleep(0.5)
        listed = await nodes(self.api)
        for m in self.nodes:
            got = listed.get(m.node_id)
            if got is None or got.state != "online" or got.lifecycle != "ACTIVE":
                self.result.not_active.append(f"query node {m.node_id} at the end: "
                                              f"{'not listed' if got is None else f'{got.state} {got.lifecycle}'}")
        trees: list[qc.TaskTree] = []
        try:
            async for t in finished_trees(self.api, after=self._mark, children=True):
                trees.append(t)
                if t.trigger.state == qc.TASK_STATE_FAILED:
                    self.result.failed_triggers.append(failed_text(t))
        except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
            self.result.failed_triggers.append(f"the task history could not be read: {exc}")
        self.result.moves = count_moves(trees)
        self.result.tally.finish()

    def _check_exits(self) -> None:
        for m in new_exits(self.cluster.members, self._seen_exits):
            what = exit_text(m)
            self.result.exited.append(f"{what} exited on its own")
            self.say(f"{what} exited on its own")

    # ----- sampling -------------------------------------------------------------------------------------------------
    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self._sample()
            except Exception as exc:  # a sample that cannot be taken is skipped, never the drill
                self.note(f"sample failed: {exc!r}")
            self._check_exits()
            await asyncio.sleep(max(0.0, self.opts.sample_interval - (time.monotonic() - started)))

    async def _read_nodes(self) -> tuple[dict[int, Holding], frozenset[int]]:
        answers = await asyncio.gather(*(self.reads.holding(n) for n in self.nodes))
        held = {n.node_id: a for n, a in zip(self.nodes, answers, strict=True) if isinstance(a, Holding)}
        return held, frozenset(n.node_id for n, a in zip(self.nodes, answers, strict=True) if a == SILENT)

    async def _sample(self) -> None:
        await self._ask_members()
        first, silent_first = await self._read_nodes()
        second, silent = await self._read_nodes()
        at = self.now()
        held = merge(first, second)
        silent = (silent | silent_first) - set(held)
        if self.judging:
            verdicts = {cid: serving(cid, t, self.replicas.get(cid), held, silent) for cid, t in self.targets.items()}
            for text in self.result.tally.add(at, verdicts)[:1]:
                self.say(f"UNSERVED at {at:.2f}s: {text}")
        if all(self._whole(cid, t, held) for cid, t in self.targets.items()):
            self.whole_at = at
        self.sampled.set()

    def _whole(self, cid: int, target: Target, held: dict[int, Holding]) -> bool:
        replicas = self.replicas.get(cid)
        return (replicas is not None and len(replicas) == target.replicas
                and not any(any(lacking(target, cid, r, held)) for r in replicas))

    async def _ask_members(self) -> None:
        """The replicas' members of every judged collection, as the leader answers now (kept when it does not)."""
        leader = self.cluster.leader
        if leader is None or not leader.address:
            return
        stub = querycoord_pb2_grpc.QueryCoordStub(self.reads.channel(leader, leader.address))
        with contextlib.suppress(grpc.aio.AioRpcError):
            got = await asyncio.gather(*(stub.GetReplicas(qc.GetReplicasRequest(collection_id=cid),
                                                          timeout=CALL_TIMEOUT) for cid in self.targets))
            for cid, r in zip(self.targets, got, strict=True):
                if r.status.error_code == EC.SUCCESS:
                    self.replicas[cid] = tuple(frozenset(x.node_ids) for x in r.replicas)


def how(o: RollingOptions) -> str:
    """How each node is taken down."""
    if o.drain:
        return "cordon, drain, SIGTERM"
    return f"SIGTERM (graceful stop: {o.graceful_stop_timeout:g}s)" if o.graceful_stop_timeout else "SIGTERM, no drain"


def render(result: RollingResult) -> str:
    o, t = result.opts, result.tally
    lines = ["", f"rolling drill, seed {o.seed}: {o.nodes} query nodes, {how(o)}; {len(t.two)} collections x2, "
                 f"{len(t.one)} x1, {o.segments} segments each; {o.churn_collections} churned; "
                 f"{result.duration_s:.1f}s", ""]
    head = f"{'node':>5}  {'drained':>8} {'stopped':>8} {'online':>8} {'whole':>8} {'quiet':>8}  notes"
    lines += [head, "-" * len(head)]
    for s in result.steps:
        lines.append(f"{s.node_id:>5}  {s.took(s.drained, s.began):>8} {s.took(s.stopped, s.drained or s.began):>8} "
                     f"{s.took(s.online, s.stopped):>8} {s.took(s.whole, s.online):>8} "
                     f"{s.took(s.balanced, s.whole or s.online):>8}  {'; '.join(s.notes)}")
    lines.append("")
    lines.append(f"samples: {t.samples}, unserved (a 2-replica collection with no whole replica): "
                 f"{t.unserved_samples}, unknown (a node did not answer): {t.unknown_samples}")
    lines += [f"  {x}" for x in t.unserved]
    for cid in sorted(t.two | t.one):
        out = t.outages.get(cid)
        if out is not None and out.stretches:
            lines.append(f"collection {cid} ({'2' if cid in t.two else '1'} replicas): unserved {out.stretches} "
                         f"times, longest {out.longest:.2f}s, {out.total:.2f}s in all")
    m = result.moves
    lines.append(f"moves (copies loaded by balances and repairs since the first turn): {m.get('moves', 0)}: "
                 f"drain {m.get('drain', 0)}, recovery {m.get('recovery', 0)}, balance {m.get('balance', 0)}")
    lines.append(f"churn: {result.churn_ops} loads and releases, {len(result.churn_errors)} refused")
    lines += [f"  {x}" for x in result.churn_errors[:5]]
    lines.append(f"FAILED triggers since the first turn: {len(result.failed_triggers)}")
    lines += [f"  {x}" for x in result.failed_triggers[:5]]
    lines += [f"ignored SIGTERM (SIGKILLed): {x}" for x in result.escalated]
    lines.append("drained: cordon until DRAINED; stopped: SIGTERM until exit; online: start until the leader lists it "
                 "online; whole: until every judged replica holds every target segment and DM channel, as the nodes "
                 "report; quiet: until no balance or repair runs")
    lines += verdict_lines(result.failures(), "every 2-replica collection kept a whole replica")
    return "\n".join(lines)


async def run_rolling(opts: RollingOptions, out: Any = None) -> int:
    """Run the drill, print the table and the JSON line; 0 when it held, 1 otherwise, 2 on setup."""
    out = out or sys.stdout
    return await run_and_report(RollingDrill(opts, out), opts, render, out, plan="run")


__all__ = ["RollingDrill", "RollingResult", "render", "run_rolling"]
