"""The failover drill: the all-in-one cluster as processes, a seeded workload, leader kills, invariants.

``querycoord drill failover --coordinators 3 --nodes 4 --collections 20 --kills 10 --seed S`` starts an
embedded etcd (1 or 3 members), coordinators and query nodes as real processes, creates collections in
the catalog, then runs the seeded schedule (``schedule``): loads, releases, partition loads and releases,
user balances through ``QueryCoordClient``; the leader SIGKILLed at random moments (idle, right after a
LoadCollection answer, or while one is in flight) and restarted as a standby; query nodes SIGKILLed and
replaced; etcd members SIGKILLed and restarted (never two down); one SIGSTOP round that proves fencing
from etcd's history (``stale``). Once the cluster is quiescent it checks the invariants (``invariants``)
against the nodes' own GetDataDistribution and query meta as persisted in etcd, prints a table and one
JSON line, and exits non-zero when an invariant failed. Takeover times are compared with the TTL + 1 s
target in the table only: timing on a shared machine is noise, not a correctness failure.

Takeover is measured from the SIGKILL (our clock) to the ``{"event": "leader"}`` line of another
coordinator (its clock, same host), which a coordinator prints only once it has reloaded and resumed its tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from meta.client import connect
from meta.election import current_leader, election_prefix
from meta.kv import MetaKV
from meta.ops.child import ChildProcess, log_tail
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2, querynode_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.grpc_channels import make_channel
from querycoord.protocol import QUERYCOORD_ELECTION
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies
from querycoord.task.store import TASK_PREFIXES
from querycoord.tooling.drill.base import DrillSetupError, ProcessDrill, run_and_report
from querycoord.tooling.drill.chaos_ops import effect_of
from querycoord.tooling.drill.invariants import (
    UNCLEAR_CODES,
    CatalogColl,
    CheckResult,
    Expected,
    MetaColl,
    MetaView,
    NodeView,
    check,
    node_view,
    replica_changes,
)
from querycoord.tooling.drill.leaders import wait_until
from querycoord.tooling.drill.options import DrillOptions
from querycoord.tooling.drill.schedule import (
    EtcdKill,
    KillLeader,
    KillNode,
    Op,
    Pause,
    Request,
    Schedule,
    describe,
    make_schedule,
)
from querycoord.tooling.drill.stale import PauseReport, Window, changes_between, count_refusals, stable_revision
from querycoord.tooling.harness import QUERY_NODE, Harness, Member, StartError

EC = common_pb2


# Beyond the scaled preset (``coord --scaled``): a bounded trigger deadline, a few children at a time and (with
# ``--max-request-bytes``) small merged requests, so a load has many children to be killed in the middle of; the
# back-off cap the drills were tuned with.
DRILL_COORD_FLAGS = ("--scaled", "--max-concurrent-children", "4", "--trigger-timeout", "120",
                     "--retry-backoff-max", "0.5")


def direct_address(node: Member) -> str:
    """Where the drill itself reaches a query node: its bound address, never a proxy it advertises instead."""
    return str(node.ready.get("listen_address") or node.address)


# ----- records --------------------------------------------------------------------------------------------------
@dataclass
class CallRecord:
    seq: int
    method: str
    target: str
    t: float
    elapsed: float = 0.0
    outcome: str = ""  # success / error / unanswered
    code: str = ""
    reason: str = ""
    task_id: int = 0
    cid: int = 0  # the collection asked about (0: a balance)


@dataclass
class ReplicaObservation:
    """The replicas in etcd at one moment (read between ``t0`` and ``t1``, drill seconds), and the nodes running
    then."""

    what: str
    t0: float
    t1: float
    collections: dict[int, MetaColl]
    live: set[int]
    quiescent: bool = False
    phase: int = 0


@dataclass
class KillRecord:
    n: int
    t: float
    mode: str
    old: str
    new: str = ""
    takeover_s: float | None = None
    note: str = ""


@dataclass
class FaultRecord:
    t: float
    what: str
    note: str = ""


@dataclass
class DrillResult:
    options: DrillOptions
    schedule: Schedule
    calls: list[CallRecord] = field(default_factory=list)
    kills: list[KillRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    pauses: list[PauseReport] = field(default_factory=list)
    check: CheckResult | None = None
    duration_s: float = 0.0
    work_dir: Path | None = None

    @property
    def takeovers(self) -> list[float]:
        return [k.takeover_s for k in self.kills if k.takeover_s is not None]

    @property
    def stale_writes(self) -> int:
        return sum(p.stale_writes for p in self.pauses)

    def summary(self) -> dict[str, Any]:
        ts = self.takeovers
        c = self.check or CheckResult()
        return {
            "kills": len(self.kills),
            "replicas": self.options.replicas,
            "takeover_p50_s": round(statistics.median(ts), 3) if ts else None,
            "takeover_max_s": round(max(ts), 3) if ts else None,
            "lost_tasks": c.lost_tasks,
            "duplicate_segments": c.duplicate_segments,
            "stale_writes": self.stale_writes,
            "invariant_violations": c.invariant_violations,
            "seed": self.options.seed,
            "unanswered_calls": sum(r.outcome == "unanswered" for r in self.calls),
            "unclear_errors": sum(r.outcome == "error" and r.code in UNCLEAR_CODES for r in self.calls),
            "calls": len(self.calls),
            "pauses": len(self.pauses),
            "pause_takeover_s": [round(p.takeover_s, 3) if p.takeover_s is not None else None for p in self.pauses],
            "stale_window_changes": sum(p.window_changes for p in self.pauses),
            "fenced_refusals": sum(p.refused_in_log for p in self.pauses),
            "node_kills": sum(f.what.startswith("node") for f in self.faults),
            "etcd_kills": sum(f.what.startswith("etcd") for f in self.faults),
            "schedule": self.schedule.digest(),
            "duration_s": round(self.duration_s, 1),
        }

    @property
    def failed(self) -> bool:
        s = self.summary()
        return any(s[k] for k in ("lost_tasks", "duplicate_segments", "stale_writes", "invariant_violations"))


# ----- the drill ------------------------------------------------------------------------------------------------
class FailoverDrill(ProcessDrill[DrillOptions, DrillResult]):
    """One run (see module docstring). ``run`` returns the result; every process is stopped before it returns."""

    def __init__(self, opts: DrillOptions, out: Any = None):
        opts.validate()
        super().__init__(opts, out, "querycoord-drill-")
        self.schedule = make_schedule(opts.seed, opts)
        self.result = DrillResult(opts, self.schedule)
        self.root = f"drill-{opts.seed}"
        self.result.work_dir = self.work
        self.kv: MetaKV | None = None
        self.client: QueryCoordClient | None = None
        self.nodes: list[Member] = []  # the query nodes the drill keeps running, by slot
        self.leader_log: list[tuple[Member, ChildProcess, dict[str, Any]]] = []
        self.coll_ids: list[int] = []
        self.part_ids: dict[int, list[int]] = {}
        self.expected: dict[int, Expected] = {}
        self._seq = 0
        self._kill_task: asyncio.Task[None] | None = None
        self._etcd_task: asyncio.Task[None] | None = None
        self._extra_violations: list[str] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._replacing: set[int] = set()
        self._etcd_down: set[int] = set()  # members the drill killed (or is restarting) on purpose
        # Replicas over time: observed around leader kills and at every quiescent check (``_judge_replicas``).
        self._replica_obs: list[ReplicaObservation] = []
        self._replica_suspects: dict[int, tuple[str, ReplicaObservation]] = {}  # node -> (what, since when)
        self._replica_history: list[str] = []
        self._replica_comparisons = 0  # collections compared at two observations

    @property
    def coords(self) -> list[Member]:
        """By index, not by start order: seeded faults pick a coordinator by its position."""
        return sorted(self.cluster.coordinators, key=lambda m: m.index)

    # ----- run --------------------------------------------------------------------------------------------------
    async def _drive(self) -> None:
        self._supervisor = asyncio.create_task(self._supervise(), name="supervisor")
        await self._run_schedule()
        await self._settle_background()
        await self._check()

    # ----- cluster ----------------------------------------------------------------------------------------------
    async def _start_cluster(self) -> None:
        o = self.opts
        self.say(f"failover drill: seed {o.seed}, {o.coordinators} coordinators, {o.nodes} query nodes, "
                 f"{o.replicas} replicas, {o.collections} collections ({o.partitions} partitions, "
                 f"{o.segments_per_collection} segments each), etcd {o.etcd_members} member(s), TTL {o.ttl:g}s; "
                 f"work dir {self.work}")
        s = self.schedule
        self.say(f"schedule {s.digest()}: {len(s.steps)} steps, {s.ops} requests, {s.leader_kills} leader kills, "
                 f"{s.count(KillNode)} node kills, {s.count(EtcdKill)} etcd kills, {s.count(Pause)} pause rounds")
        self.work.mkdir(parents=True, exist_ok=True)
        etcd = EtcdCluster(self.work / "etcd", size=o.etcd_members)
        self.etcd = etcd
        await asyncio.to_thread(etcd.start)
        self.kv = MetaKV(await connect(etcd.config()), self.root)
        self.harness = Harness(etcd.endpoints, self.root, self.work, ttl=o.ttl, on_event=self._on_event)
        coords = await asyncio.gather(*(self._start_coordinator(i) for i in range(o.coordinators)))
        self.client = QueryCoordClient([c.address for c in coords], deadline=o.client_deadline)
        try:
            await self._wait_leader(timeout=60)
        except TimeoutError:
            raise DrillSetupError(f"no coordinator became leader within 60s; logs in {self.work}") from None
        await self._create_collections()
        self.nodes = list(await asyncio.gather(*(self._start_node(i) for i in range(o.nodes))))
        await self._wait_nodes_online(timeout=60)
        leader = self.cluster.leader
        self.say(f"cluster up: leader {leader.label if leader else '?'}, nodes "
                 f"{[n.node_id for n in self.nodes]}, collections {self.coll_ids[0]}..{self.coll_ids[-1]}")

    def _on_event(self, member: Member, event: dict[str, Any]) -> None:
        """The harness's hook: it has set ``member.state`` already; takeovers are found in ``leader_log``."""
        kind = event.get("event")
        if kind in ("leader", "standby"):
            self.leader_log.append((member, member.child, event))
            self.note(f"{member.label} is now {kind}")

    def _coordinator_flags(self) -> list[str]:
        """``querycoord coord``'s options beyond the connection (a hook: the chaos drill adds its own)."""
        return [*DRILL_COORD_FLAGS, "--max-request-bytes", str(self.opts.max_request_bytes)]

    async def _coordinator_etcd(self, index: int) -> str | None:
        """The etcd endpoint coordinator ``index`` is given; None: etcd's own (the chaos drill gives a proxy)."""
        return None

    async def _start_coordinator(self, index: int) -> Member:
        return await self.cluster.start_coordinator(index, "127.0.0.1:0", *self._coordinator_flags(),
                                                    etcd=await self._coordinator_etcd(index))

    async def _restart_coordinator(self, member: Member) -> None:
        """Start the killed coordinator again as a standby (the harness retries while etcd is unreachable), and
        make sure the client knows its address, which is new when the old port was taken."""
        await self.cluster.restart_coordinator(member, *self._coordinator_flags(),
                                               etcd=await self._coordinator_etcd(member.index), say=self.say)
        assert self.client is not None
        if member.address not in self.client.addresses:
            self.client.addresses.append(member.address)

    async def _start_node(self, index: int, member: Member | None = None) -> Member:
        """Query node ``index``; with ``member`` its replacement (a new process under a new node id)."""
        return await self.cluster.start_node(QUERY_NODE, index, "--capacity-mb", "4096",
                                             "--latency-ms", f"{self.opts.node_latency_ms:g}", member=member)

    async def _create_collections(self) -> None:
        assert self.kv is not None
        catalog = CatalogStore(self.kv)
        sem = asyncio.Semaphore(4)

        async def one(i: int) -> int:
            async with sem:
                # Small segments (about 0.5 MB accounted each): the drill is about failover, not capacity.
                desc, _ = await catalog.create_bulk_collection(
                    f"drill_{i}", num_partitions=self.opts.partitions, num_segments=self.opts.segments_per_collection,
                    num_channels=self.opts.channels, rows_per_segment=1000, dim=128)
                self.part_ids[desc.collection_id] = [p.partition_id for p in desc.partitions]
                return desc.collection_id

        self.coll_ids = list(await asyncio.gather(*(one(i) for i in range(self.opts.collections))))
        self.expected = {cid: Expected() for cid in self.coll_ids}

    async def _wait_nodes_online(self, timeout: float) -> None:
        assert self.client is not None
        want = {n.node_id for n in self.nodes}
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
                resp = await self.client.query("ShowNodes", qc.ShowNodesRequest())
                if want <= {n.node_id for n in resp.nodes if n.state == "online"}:
                    return
            if time.monotonic() > deadline:
                raise DrillSetupError(f"query nodes {sorted(want)} never all online at the leader")
            await asyncio.sleep(0.1)

    async def _stop_cluster(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        for t in (self._supervisor, self._kill_task, self._etcd_task):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        if self.harness is not None:
            await self.harness.stop(5)
        if self.kv is not None:
            with contextlib.suppress(Exception):
                await self.kv.client.close()
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop)

    # ----- leadership -----------------------------------------------------------------------------------------------
    async def _wait_takeover(self, old: ChildProcess, since: float, timeout: float) -> tuple[Member, dict[str, Any]]:
        """The first ``leader`` event of a coordinator process other than ``old`` stamped at or after ``since``."""

        def found() -> tuple[Member, dict[str, Any]] | None:
            for member, child, ev in self.leader_log:
                if child is not old and ev.get("event") == "leader" and float(ev.get("t", 0)) >= since:
                    return member, ev
            return None

        return await wait_until(found, self.cluster.changed, timeout)

    async def _settle_kill(self) -> None:
        """Wait for the previous leader kill (takeover and restart) to complete: one kill at a time."""
        if self._kill_task is not None:
            await self._kill_task
            self._kill_task = None

    async def _kill_leader(self, mode: str) -> None:
        try:
            leader = await self._wait_leader(timeout=60)
        except TimeoutError:
            self._extra_violations.append(f"no leader for 60s before kill ({mode}); kill skipped")
            self.say(f"NO LEADER for 60s: kill ({mode}) skipped")
            return
        rec = KillRecord(len(self.result.kills) + 1, self.now(), mode, leader.label)
        self.result.kills.append(rec)
        old = leader.child
        await self.cluster.kill(leader)
        t_kill = old.killed_at or time.time()
        self.say(f"kill #{rec.n} ({mode}): SIGKILL leader {leader.label}")
        self._kill_task = asyncio.create_task(self._after_kill(leader, old, t_kill, rec), name=f"kill-{rec.n}")

    async def _after_kill(self, member: Member, old: ChildProcess, t_kill: float, rec: KillRecord) -> None:
        # The killed leader writes nothing more and no other leads yet: the replicas as the next leader finds them.
        await self._observe_replicas(f"leader kill #{rec.n}")
        try:
            new, ev = await self._wait_takeover(old, t_kill, timeout=max(60.0, 10 * self.opts.ttl))
            rec.new, rec.takeover_s = new.label, float(ev["t"]) - t_kill
            self.say(f"kill #{rec.n}: {new.label} leads after {rec.takeover_s:.2f}s")
            await self._observe_replicas(f"takeover #{rec.n}")
        except TimeoutError:
            rec.note = "no takeover within the timeout"
            self._extra_violations.append(f"kill #{rec.n}: no coordinator took over within 60s")
            self.say(f"kill #{rec.n}: NO TAKEOVER")
        await self._restart_coordinator(member)
        self.note(f"kill #{rec.n}: {member.label} restarted as a standby")

    # ----- schedule ----------------------------------------------------------------------------------------------
    async def _run_schedule(self) -> None:
        for step in self.schedule.steps:
            if step.wait_s:
                await asyncio.sleep(step.wait_s)
            a = step.action
            self.note(f"step: {describe(a)}")
            if isinstance(a, Op):
                await self._run_op(a)
            elif isinstance(a, KillLeader):
                await self._settle_kill()
                await self._kill_leader("idle")
            elif isinstance(a, KillNode):
                await self._kill_node(a.slot)
            elif isinstance(a, EtcdKill):
                if self._etcd_task is not None:
                    await self._etcd_task
                self._etcd_task = asyncio.create_task(self._etcd_fault(a), name="etcd-fault")
            elif isinstance(a, Pause):
                await self._settle_background()
                await self._pause_round()

    async def _settle_background(self) -> None:
        await self._settle_kill()
        if self._etcd_task is not None:
            await self._etcd_task
            self._etcd_task = None

    async def _run_op(self, op: Op) -> None:
        if op.kill is None:
            await self._call_op(op)
            return
        await self._settle_kill()
        if op.kill == "after_answer":
            await self._call_op(op)
            await self._kill_leader("after LoadCollection answer")
        else:
            call = asyncio.create_task(self._call_op(op))
            await asyncio.sleep(op.kill_delay)
            await self._kill_leader(f"LoadCollection in flight +{op.kill_delay * 1000:.0f}ms")
            await call

    def _request(self, op: Request[Any]) -> tuple[str, Any, str]:
        if op.kind == "balance":
            node = self.nodes[op.node_slot % len(self.nodes)]
            return ("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[node.node_id]),
                    f"node {node.node_id}")
        cid = self.coll_ids[op.coll % len(self.coll_ids)]
        parts = self.part_ids[cid]
        pids = [parts[p % len(parts)] for p in op.parts]
        if op.kind == "load":
            return ("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=self.opts.replicas),
                    f"coll {cid}")
        if op.kind == "release":
            return "ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid), f"coll {cid}"
        if op.kind == "load_partitions":
            return ("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids,
                                                               replica_number=self.opts.replicas),
                    f"coll {cid} partitions {pids}")
        if op.kind == "release_partitions":
            return ("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=pids),
                    f"coll {cid} partitions {pids}")
        raise ValueError(f"{op.kind!r} is not a QueryCoord request")

    async def _call_op(self, op: Op, client: QueryCoordClient | None = None) -> CallRecord:
        method, req, target = self._request(op)
        self._seq += 1
        rec = CallRecord(self._seq, method, target, self.now(), cid=getattr(req, "collection_id", 0))
        self.result.calls.append(rec)
        started = time.monotonic()
        c = client or self.client
        assert c is not None
        try:
            resp = await c.query(method, req)
        except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
            rec.outcome, rec.reason = "unanswered", str(exc)[:300]
            self.say(f"call #{rec.seq} {method} {target}: UNANSWERED: {rec.reason}")
            return rec
        finally:
            rec.elapsed = time.monotonic() - started
        st = resp.status
        rec.code, rec.reason, rec.task_id = EC.ErrorCode.Name(st.error_code), st.reason, getattr(resp, "task_id", 0)
        rec.outcome = "success" if st.error_code == EC.SUCCESS else "error"
        if rec.outcome == "success":
            self._apply(op, req, f"#{rec.seq} {method} {target}")
        self.note(f"call #{rec.seq} {method} {target}: {rec.code} {rec.reason[:120]} ({rec.elapsed:.2f}s)")
        return rec

    def _apply(self, op: Op, req: Any, label: str) -> None:
        """The expected state after an answered SUCCESS (the model the invariants check against)."""
        if op.kind == "balance":
            return
        cid = req.collection_id
        exp = self.expected[cid]
        if op.kind == "load":
            self.expected[cid] = Expected("collection", frozenset(self.part_ids[cid]), label)
        elif op.kind == "release":
            self.expected[cid] = Expected("released", frozenset(), label)
        elif op.kind == "load_partitions":
            if exp.state == "collection":
                self.expected[cid] = Expected("collection", exp.partitions, label)
            else:
                self.expected[cid] = Expected("partitions", exp.partitions | frozenset(req.partition_ids), label)
        else:
            if exp.state == "partitions":
                left = exp.partitions - frozenset(req.partition_ids)
                self.expected[cid] = Expected("partitions", left, label) if left else Expected("released",
                                                                                              frozenset(), label)
            else:
                self.expected[cid] = Expected(exp.state, exp.partitions, label)

    # ----- node and etcd faults -------------------------------------------------------------------------------
    async def _supervise(self) -> None:
        """Replace processes that exit without being killed by the drill, as a deployment's supervisor would.

        A query node exits by design when it loses its session (an etcd fault
        longer than its TTL): it must come back under a new id. A coordinator
        must never exit on its own (it campaigns again instead): that is
        recorded as a violation, and it is restarted too.
        """
        while True:
            await asyncio.sleep(0.3)
            for node in list(self.nodes):
                if node.running or node.state == "dead" or node.index in self._replacing:
                    continue
                last = log_tail(node.child.log_path, 1).strip()
                rec = FaultRecord(self.now(), f"node n{node.index}: node {node.node_id} exited on its own "
                                              f"(code {node.child.proc.returncode}: {last[:110]})")
                self.result.faults.append(rec)
                self.say(rec.what)
                await self._replace_node(node, rec)
            await self._supervise_etcd()
            for c in self.coords:
                if c.running or c.state == "dead":
                    continue
                c.state = "dead"
                what = (f"coordinator {c.label} exited on its own (code {c.child.proc.returncode}); "
                        f"see {c.child.log_path}")
                self._extra_violations.append(what)
                self.say(what)
                await self._restart_coordinator(c)

    async def _supervise_etcd(self) -> None:
        """An etcd member that exits on its own (a crash, not a drill fault) is a violation; restart it."""
        etcd = self.etcd
        assert etcd is not None
        for i, m in enumerate(etcd.members):
            if i in self._etcd_down or m.running or m.proc is None:
                continue
            what = (f"etcd member {m.name} exited on its own (code {m.proc.returncode})"
                    f"{': ' + etcd_crash_reason(m.log_path) if etcd_crash_reason(m.log_path) else ''}")
            self._extra_violations.append(what)
            self.result.faults.append(FaultRecord(self.now(), what))
            self.say(what)
            self._etcd_down.add(i)
            try:
                await asyncio.to_thread(etcd.restart_member, i, 60.0)
                self.result.faults[-1].note = "restarted by the drill"
            except Exception as exc:  # recorded; the run goes on and its checks will show the damage
                self._extra_violations.append(f"etcd member {m.name} did not restart: {exc}")
            finally:
                self._etcd_down.discard(i)

    async def _replace_node(self, node: Member, rec: FaultRecord) -> None:
        """A new process in the dead node's slot (the same ``Member``, a new node id)."""
        self._replacing.add(node.index)
        try:
            for attempt in range(1, 4):  # etcd may be losing a member right now
                try:
                    await self._start_node(node.index, member=node)
                    break
                except StartError:
                    if attempt == 3:
                        raise
                    await asyncio.sleep(1.0)
            rec.note = f"replaced by node {node.node_id}"
        finally:
            self._replacing.discard(node.index)

    async def _kill_node(self, slot_index: int) -> None:
        node = self.nodes[slot_index % len(self.nodes)]
        while node.index in self._replacing:  # the supervisor is replacing it already
            await asyncio.sleep(0.1)
            node = self.nodes[slot_index % len(self.nodes)]
        await self._observe_replicas(f"node {node.node_id} kill")
        await self.cluster.kill(node)
        rec = FaultRecord(self.now(), f"node n{node.index}: SIGKILL node {node.node_id}")
        self.result.faults.append(rec)
        await self._replace_node(node, rec)
        self.say(f"{rec.what}, {rec.note}")

    async def _etcd_fault(self, action: EtcdKill) -> None:
        etcd = self.etcd
        assert etcd is not None
        leader = await asyncio.to_thread(etcd.leader_index)
        index = action.member if action.member is not None else (leader if leader is not None else 0)
        name = etcd.members[index].name
        rec = FaultRecord(self.now(), f"etcd {name}{' (raft leader)' if index == leader else ''}: SIGKILL for "
                                      f"{action.down_s:.2f}s")
        self.result.faults.append(rec)
        self.say(rec.what)
        self._etcd_down.add(index)
        try:
            await asyncio.to_thread(etcd.kill_member, index)
            await asyncio.sleep(action.down_s)
            await asyncio.to_thread(etcd.restart_member, index, 60.0)
            rec.note = "restarted"
        except Exception as exc:  # a member that cannot come back is a drill failure, not a crash of the drill
            rec.note = f"restart failed: {exc}"
            self._extra_violations.append(f"etcd member {name} did not restart: {exc}")
        finally:
            self._etcd_down.discard(index)
        self.note(f"etcd {name}: {rec.note}")

    # ----- the SIGSTOP round ----------------------------------------------------------------------------------
    def _released_collection(self, skip: set[int]) -> int | None:
        for cid in self.coll_ids:
            if cid not in skip and self.expected[cid].state == "released":
                return cid
        return None

    async def _pause_round(self) -> None:
        """SIGSTOP the leader mid-load, let another take over and work, then prove fencing (``stale``)."""
        assert self.kv is not None
        report = PauseReport()
        self.result.pauses.append(report)
        ttl = self.opts.ttl
        # 1. The leader is working on a fresh load when it freezes.
        cid = self._released_collection(set())
        if cid is None:
            cid = self.coll_ids[0]
            await self._call_op(Op("release", self.coll_ids.index(cid)))
        await self._call_op(Op("load", self.coll_ids.index(cid)))
        try:
            l1 = await self._wait_leader(timeout=60)
        except TimeoutError:
            self._extra_violations.append("pause: no leader for 60s; round skipped")
            return
        old = l1.child
        report.old_leader = l1.label
        t_stop = time.time()
        old.signal(signal.SIGSTOP)
        self.say(f"pause: SIGSTOP leader {l1.label} mid-load of collection {cid}")
        try:
            l2, ev = await self._wait_takeover(old, t_stop, timeout=max(60.0, 10 * ttl))
        except TimeoutError:
            old.signal(signal.SIGCONT)
            report.conclusive = False
            report.notes.append("no takeover while the leader was stopped")
            self._extra_violations.append("pause: no coordinator took over from the stopped leader")
            return
        report.new_leader, report.takeover_s = l2.label, float(ev["t"]) - t_stop
        self.say(f"pause: {l2.label} leads after {report.takeover_s:.2f}s; it changes state while the old one sleeps")
        # 2. The new leader changes state (through a client that cannot reach the frozen one).
        async with QueryCoordClient([l2.address], deadline=self.opts.client_deadline) as c2:
            other = self._released_collection({cid})
            if other is not None:
                await self._call_op(Op("load", self.coll_ids.index(other)), client=c2)
            else:
                await self._call_op(Op("release", self.coll_ids.index(cid)), client=c2)
        await asyncio.sleep(0.3)
        before = await current_leader(self.kv, election_prefix(QUERYCOORD_ELECTION))
        # 3. Windows in which only the old leader runs.
        others = [c for c in self.coords if c.child is not old and c.child.running]
        for _ in range(self.opts.pause_windows):
            for c in others:
                c.child.signal(signal.SIGSTOP)
            try:
                a = await stable_revision(self.kv, settle=0.2)
                old.signal(signal.SIGCONT)
                await asyncio.sleep(self.opts.pause_window_s)
                old.signal(signal.SIGSTOP)
                b = await stable_revision(self.kv, settle=0.2)
            finally:
                for c in others:
                    c.child.signal(signal.SIGCONT)
            report.windows.append(Window(a, b))
            await asyncio.sleep(max(0.8, ttl / 2))
        old.signal(signal.SIGCONT)
        after = await current_leader(self.kv, election_prefix(QUERYCOORD_ELECTION))
        if before is None or after is None or before.create_revision != after.create_revision:
            report.conclusive = False
            report.notes.append(f"the leader changed during the windows ({before} -> {after}): writes in them "
                                f"cannot be attributed to the old leader alone")
        for w in report.windows:
            w.changes = await changes_between(self.kv, w.start, w.end)
        await asyncio.sleep(1.0)
        if old.log_path is not None:
            with contextlib.suppress(OSError):
                report.refused_in_log = count_refusals(old.log_path.read_text(errors="replace"))
        stale = [change for w in report.windows for change in w.stale]
        doubt = "" if report.conclusive else f" (INCONCLUSIVE: {'; '.join(report.notes)})"
        self.say(f"pause: {len(report.windows)} windows with only the old leader running: "
                 f"{report.window_changes} changes in etcd, {len(stale)} stale writes, {report.refused_in_log} "
                 f"refusals in its log{doubt}")
        for change in stale[:10]:
            self.say(f"pause: STALE WRITE at revision {change.revision}: {change.kind} {change.key}")

    # ----- invariants -----------------------------------------------------------------------------------------
    async def _quiesce(self) -> list[str]:
        """Until no task runs, no task key exists and the leader sees exactly the live nodes online (bounded)."""
        assert self.client is not None and self.kv is not None
        deadline = time.monotonic() + self.opts.quiesce_timeout
        good = 0
        last = ""
        while time.monotonic() < deadline:
            try:
                nodes = await self.client.query("ShowNodes", qc.ShowNodesRequest())
                tasks = await self.client.query("ListTasks", qc.ListTasksRequest(limit=1000))
            except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                last = f"no leader answered: {exc}"
                good = 0
                await asyncio.sleep(0.5)
                continue
            live = {n.node_id for n in self.nodes}
            online = {n.node_id for n in nodes.nodes if n.state == "online"}
            known = {n.node_id for n in nodes.nodes}
            keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
            quiet = (nodes.status.error_code == EC.SUCCESS and tasks.status.error_code == EC.SUCCESS
                     and not tasks.trees and not any(keys.values()) and online == live and known == live)
            last = (f"{len(tasks.trees)} task trees, task keys {keys}, online nodes {sorted(online)} (known "
                    f"{sorted(known)}), live nodes {sorted(live)}")
            good = good + 1 if quiet else 0
            if good >= 3:
                return []
            await asyncio.sleep(0.5)
        return [f"not quiescent after {self.opts.quiesce_timeout:.0f}s: {last}"]

    async def _check(self) -> None:
        assert self.kv is not None
        self.say("workload done; waiting until the cluster is quiescent")
        t = time.monotonic()
        not_quiet = await self._quiesce()
        self.say(f"quiescent after {time.monotonic() - t:.1f}s" if not not_quiet else not_quiet[0])
        catalog = await self._catalog_view()
        t_meta = self.now()
        meta = await self._meta_view()
        self._judge_replicas(self._observation("final check", t_meta, meta.collections, quiescent=True))
        nodes = await self._node_views()
        keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
        unanswered = [f"#{r.seq} {r.method} {r.target}: {r.reason}" for r in self.result.calls
                      if r.outcome == "unanswered"]
        unclear = [f"#{r.seq} {r.method} {r.target}: {r.code} {r.reason[:200]}" for r in self.result.calls
                   if r.outcome == "error" and r.code in UNCLEAR_CODES]
        inconclusive = [f"pause round {i + 1} inconclusive: {'; '.join(p.notes)}"
                        for i, p in enumerate(self.result.pauses) if not p.conclusive]
        self.result.check = check(self.expected, catalog, meta, nodes, task_keys=keys, unanswered=unanswered,
                                  unclear=unclear, extra_violations=self._extra_violations + not_quiet + inconclusive,
                                  replica_number=self.opts.replicas, replica_history=self._replica_history,
                                  replica_comparisons=self._replica_comparisons)

    async def _catalog_view(self) -> dict[int, CatalogColl]:
        assert self.kv is not None
        store = CatalogStore(self.kv)
        out: dict[int, CatalogColl] = {}
        for cid in self.coll_ids:
            desc = await store.describe_collection(cid)
            parts: dict[int, frozenset[int]] = {}
            sources: dict[int, tuple[int, ...]] = {}
            for p in desc.partitions:
                _, binlogs = await store.get_recovery_info(cid, p.partition_id)
                parts[p.partition_id] = frozenset(b.segment_id for b in binlogs)
                sources.update((b.segment_id, tuple(b.compaction_from)) for b in binlogs if b.compaction_from)
            out[cid] = CatalogColl(parts, frozenset(desc.dm_channels), sources)
        return out

    async def _meta_view(self) -> MetaView:
        assert self.kv is not None
        meta = QueryMeta(self.kv)  # a plain (unfenced) view, only read
        await meta.reload()
        view = MetaView()
        view.collections = meta_collections(meta)
        for cid in self.coll_ids:
            for s in meta.segments_of(cid):
                view.segments[s.segment_id] = (s.collection_id, s.partition_id, copies(s))
            for w in meta.dm_channels_of(cid):
                view.channels[(cid, w.dm_channel)] = copies(w)
        return view

    # ----- replicas over time -----------------------------------------------------------------------------------
    def _observation(self, what: str, t0: float, collections: dict[int, MetaColl],
                     quiescent: bool = False) -> ReplicaObservation:
        return ReplicaObservation(what, t0, self.now(), collections, {n.node_id for n in self.nodes if n.running},
                                  quiescent, self._current_phase())

    def _current_phase(self) -> int:
        return 0

    async def _observe_replicas(self, what: str) -> None:
        """Read the replicas from etcd now (``_judge_replicas`` compares the observations at the next check)."""
        assert self.kv is not None
        t0 = self.now()
        meta = QueryMeta(self.kv)
        try:
            await asyncio.wait_for(meta.reload(), 15)
        except Exception as exc:  # etcd losing a member right now: this observation is skipped, not the drill
            self.note(f"replicas at {what}: not read ({exc!r})")
            return
        self._replica_obs.append(self._observation(what, t0, meta_collections(meta)))

    def _requests_between(self, a: ReplicaObservation, b: ReplicaObservation) -> list[tuple[int, str]]:
        """(collection, method) of the load and release requests that may have taken effect between two
        observations: sent before the second, not answered before the first; an answer that leaves the effect
        open (unanswered, TIMEOUT: "it may still complete") may take effect at any later time."""
        out = []
        for r in self.result.calls:
            kind = _KIND_OF_METHOD.get(r.method)
            if kind is None or not r.cid:
                continue
            open_ended = not r.outcome or effect_of(kind, r.outcome, r.code) == "maybe"
            end = float("inf") if open_ended else r.t + r.elapsed
            if r.t <= b.t1 and end >= a.t0:
                out.append((r.cid, r.method))
        return out

    def _reborn_between(self, a: ReplicaObservation, b: ReplicaObservation) -> set[int]:
        """Nodes that died and came back under their id between two observations (none here: replaced nodes get
        new ids; the chaos drill restarts nodes under fixed ids)."""
        return set()

    def _judge_replicas(self, now: ReplicaObservation) -> None:
        """At a quiescent check: compare every observation since the last check with the next one
        (``replica_changes``); a node that left its replica while running must be dead by now."""
        obs = [*sorted(self._replica_obs, key=lambda o: o.t0), now]
        for a, b in itertools.pairwise(obs):
            requests = self._requests_between(a, b)
            released = {c for c, m in requests if m in ("ReleaseCollection", "ReleasePartitions")}
            problems, suspects = replica_changes(
                a.collections, b.collections, live=b.live, released=released,
                loading={c for c, m in requests if m in ("LoadCollection", "LoadPartitions")},
                reborn=self._reborn_between(a, b))
            self._replica_comparisons += len((a.collections.keys() & b.collections.keys()) - released)
            self._replica_history += [f"replicas from {a.what} to {b.what}: {p}" for p in problems]
            for n, what in suspects.items():
                self._replica_suspects.setdefault(n, (f"from {a.what} to {b.what}: {what}", a))
        for n, (what, since) in sorted(self._replica_suspects.items()):
            # Died since and back under its id (a fixed-id restart): not the process that left, which is dead.
            if n in now.live and n not in self._reborn_between(since, now):
                self._replica_history.append(f"replicas {what}, and still runs at {now.what}")
        self._replica_suspects = {}
        self._replica_obs = [now]

    async def _node_views(self) -> dict[int, NodeView]:
        out: dict[int, NodeView] = {}
        for n in self.nodes:
            async with make_channel(direct_address(n)) as ch:
                try:
                    d = await querynode_pb2_grpc.QueryNodeStub(ch).GetDataDistribution(
                        querynode_pb2.GetDataDistributionRequest(), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    self._extra_violations.append(f"node {n.node_id} did not report its distribution: {exc.code()}")
                    continue
            out[n.node_id] = node_view(d)
        return out


#: The chaos oracle's request kinds (``chaos_ops.effect_of``) of the failover drill's load-state methods.
_KIND_OF_METHOD = {"LoadCollection": "load", "LoadPartitions": "load_partitions", "ReleaseCollection": "release",
                   "ReleasePartitions": "release_partitions"}


def meta_collections(meta: QueryMeta) -> dict[int, MetaColl]:
    """Query meta's loaded collections as the checks read them, with their replicas (id -> nodes)."""
    out = {}
    for info in meta.collections():
        kind = "collection" if info.load_type == data_pb2.LOAD_TYPE_COLLECTION else "partitions"
        out[info.collection_id] = MetaColl(kind, int(info.in_memory_percentage),
                                           frozenset(p.partition_id for p in info.partitions),
                                           {r.replica_id: frozenset(r.node_ids) for r in info.replicas})
    return out


def etcd_crash_reason(log_path: Path) -> str:
    """The panic / fatal message at the end of an etcd member's log, with a hint when it is a known etcd bug."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, log_path.stat().st_size - 512_000))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if '"level":"panic"' in line or '"level":"fatal"' in line:
            try:
                entry = json.loads(line)
            except ValueError:
                return line[:200]
            reason = f"{entry.get('level')}: {entry.get('msg')}: {entry.get('error', '')}".rstrip(": ")
            if "unexpected error during txn" in reason and "context canceled" in reason:
                reason += (" (etcd-io/etcd#14110, fixed in etcd 3.5.5: a read-only txn whose caller went away, "
                           "e.g. CatalogStore._get_many's 'catalog get' txn of a coordinator killed or cancelled)")
            return reason
    return ""


# ----- report ---------------------------------------------------------------------------------------------------
def render(result: DrillResult) -> str:
    """The table: kills, pauses, faults, calls, invariants (the JSON line is printed separately)."""
    o = result.options
    target = o.ttl + 1.0
    lines = ["", f"leader kills (takeover target <= TTL + 1s = {target:g}s)",
             f"  {'#':>3} {'at s':>7}  {'mode':<34} {'old leader':<24} {'new leader':<24} {'takeover':>9}  target"]
    for k in result.kills:
        took = f"{k.takeover_s:.2f}s" if k.takeover_s is not None else "-"
        verdict = "PASS" if k.takeover_s is not None and k.takeover_s <= target else "FAIL"
        lines.append(f"  {k.n:>3} {k.t:>7.1f}  {k.mode:<34} {k.old:<24} {k.new or '-':<24} {took:>9}  {verdict}"
                     f"{'  ' + k.note if k.note else ''}")
    ts = result.takeovers
    if ts:
        lines.append(f"  takeover p50 {statistics.median(ts):.2f}s, max {max(ts):.2f}s over {len(ts)} kills")
    for i, p in enumerate(result.pauses, 1):
        took = f"{p.takeover_s:.2f}s" if p.takeover_s is not None else "-"
        lines += ["", f"pause round {i} (SIGSTOP past the TTL, then windows where only the old leader runs)",
                  f"  old leader {p.old_leader}, new leader {p.new_leader or '-'}, takeover {took}",
                  f"  windows (revision ranges): {[(w.start, w.end) for w in p.windows]}",
                  f"  changes in them: {p.window_changes} (sessions/election only: "
                  f"{p.window_changes - p.stale_writes}), stale writes: {p.stale_writes} -> "
                  f"{'PASS' if not p.stale_writes else 'FAIL'}{'' if p.conclusive else ' (INCONCLUSIVE)'}",
                  f"  old leader's log: {p.refused_in_log} lines of refused writes / lost leadership"]
    lines += render_activity(result.faults, result.calls, row=lambda r: r.method, width=18,
                             example=lambda r: f"#{r.seq} {r.target}", slow=lambda r: f"#{r.seq} {r.method}")
    c = result.check
    if c is not None:
        lines += ["", "invariants"]
        for name, (ok, summary) in c.checks.items():
            lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}: {summary}")
        for d in c.details[:40]:
            lines.append(f"    {d}")
        if len(c.details) > 40:
            lines.append(f"    ... and {len(c.details) - 40} more")
    return "\n".join(lines)


class Call(Protocol):
    """What the table reads of a client call (``CallRecord``, the chaos drill's ``ChaosCall``)."""

    method: str
    outcome: str
    code: str
    reason: str

    @property
    def elapsed(self) -> float: ...


C = TypeVar("C", bound=Call)


def render_activity(faults: list[FaultRecord], calls: Sequence[C], *, row: Callable[[C], str], width: int,
                    example: Callable[[C], str], slow: Callable[[C], str]) -> list[str]:
    """The faults and the client calls of a drill's table: the answers per ``row`` (``width`` wide), one
    ``example`` of each failure, the three slowest calls."""
    lines: list[str] = []
    if faults:
        lines += ["", "faults"]
        lines += [f"  {f.t:>7.1f}  {f.what}{'; ' + f.note if f.note else ''}" for f in faults]
    by: dict[str, Counter[str]] = {}
    for c in calls:
        by.setdefault(row(c), Counter())[c.code if c.outcome in ("success", "error") else c.outcome.upper()] += 1
    lines += ["", f"client calls: {len(calls)}"]
    for name, counts in sorted(by.items()):
        lines.append(f"  {name:<{width}} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    reasons: dict[str, str] = {}
    for c in calls:
        if c.outcome != "success":
            reasons.setdefault(f"{c.method} {c.code or c.outcome.upper()}", f"{example(c)}: {c.reason[:150]}")
    for what, text in sorted(reasons.items()):
        lines.append(f"    e.g. {what}: {text}")
    slowest = sorted(calls, key=lambda c: -c.elapsed)[:3]
    if slowest:
        lines.append("  slowest: " + "; ".join(f"{slow(c)} {c.elapsed:.1f}s" for c in slowest))
    return lines


async def run_failover(opts: DrillOptions, out: Any = None) -> int:
    """Run the drill, print the table and the JSON line; 0 when every invariant held, 1 otherwise, 2 on setup."""
    out = out or sys.stdout
    return await run_and_report(FailoverDrill(opts, out), opts, render, out, plan="schedule")
