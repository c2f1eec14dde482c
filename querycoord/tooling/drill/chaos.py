"""The chaos drill: seeded concurrent requests against a real cluster while links are cut, processes die.

``querycoord drill chaos --ops N --seed S`` starts an embedded etcd, 3 coordinators (``querycoord coord``)
and 5 query nodes (``querycoord querynode``) as real processes (every load asks for ``--replicas``, default 2),
and puts a TCP proxy (``proxy``) on every
link it wants to break: each coordinator's and each node's link to etcd (the process gets the proxy's
address as its etcd endpoint) and the coordinators' link to each node (the node advertises its proxy's
address in its session, ``--advertise``). It then runs the seeded plan (``chaos_ops``) phase by phase:
several clients (``QueryCoordClient``, which follows the leader) send loads and releases of collections and
partitions, duplicates, retries of abandoned requests, concurrent conflicting requests and balances, while
the catalog gains sealed segments and compactions (handoffs); meanwhile one or two faults hit: the leader
SIGKILLed or SIGSTOPped past its session TTL, the leader cut off from etcd (reset, blackholed or stalled)
while it still reaches the nodes, which is the case fencing exists for, a standby cut off, query nodes
killed, added, cut off from etcd or from the coordinators (``chaos_cluster``). With ``--capacity tight`` the
nodes have room for about half the replicas (loads meet NO_AVAILABLE_NODE, a lost node's copies may have nowhere
to go: a replica with no spare), nodes restart under fixed ids, the whole cluster restarts, and compactions chain.

After each phase every link is healed and the drill waits until the cluster is quiescent (the leader's
ListTasks empty, no task key, the leader sees exactly the live nodes), then checks: every call answered
(success or a clear error) within its deadline; identical requests (duplicates, retries) not answered
SUCCESS and CONFLICT; each collection in a state some order of its requests explains (``chaos_ops``'s
oracle), which then feeds the failover drill's pure checker (``invariants``: meta equals the nodes'
distribution copy by copy, each segment and DM channel held once in each replica unless the replica cannot be
placed now (``placement``: no node, no room) and meta does not show it whole, replicas on disjoint nodes
keeping their ids and nodes unless one died, nothing of released collections held, no task key left). Triggers
still queued or running on the leader when quiescence times out are *stuck*. All along, a sampler
(``sampler``) compares what the leader shows with what the nodes hold and judges three more invariants
(``samples``): false full answers, blocked units, blocked releases. The run ends with one JSON line; its exit
status is 1 when a call went unanswered, an invariant failed, a trigger stuck or a sampled count is not 0.

The processes are the cluster harness's (``querycoord.tooling.harness``), driven as in the failover drill
(``FailoverDrill``: leader kills with restart, the supervisor that replaces nodes exiting on their own, the
views the checker reads); ``chaos_cluster`` adds the proxies and the faults, this module the concurrent clients,
the oracle and the checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc

from meta.client import connect
from meta.errors import MetaError
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogError, CatalogStore, status_of
from querycoord.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.grpc_channels import make_channel
from querycoord.task.store import TASK_PREFIXES, TaskStore
from querycoord.tooling.drill.base import DrillSetupError, run_and_report
from querycoord.tooling.drill.chaos_cluster import ChaosCluster, FaultCounts
from querycoord.tooling.drill.chaos_ops import (
    INF,
    LOAD_STATE_KINDS,
    RELEASED,
    Attempt,
    ChaosOp,
    ChaosPlan,
    Item,
    Phase,
    State,
    admissible_states,
    describe_fault,
    describe_op,
    effect_of,
    make_plan,
    state_name,
)
from querycoord.tooling.drill.failover import FaultRecord, ReplicaObservation, direct_address, render_activity
from querycoord.tooling.drill.invariants import UNCLEAR_CODES, Expected, MetaView, check
from querycoord.tooling.drill.options import SEGMENT_BYTES, ChaosOptions
from querycoord.tooling.drill.sampler import DrillSources, NodeHandle, Sampler
from querycoord.tooling.drill.samples import ReleaseCall, blocked_releases
from querycoord.tooling.drill.stale import count_refusals
from querycoord.tooling.harness import Harness

EC = common_pb2


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


# ----- records ----------------------------------------------------------------------------------------------------
@dataclass
class ChaosCall:
    """One request as a client saw it; ``sent`` / ``answered`` are drill seconds (monotonic)."""

    seq: int
    phase: int
    worker: int
    group: int
    pattern: str
    method: str
    kind: str
    target: str
    cid: int = 0
    pids: tuple[int, ...] = ()
    sent: float = 0.0
    answered: float | None = None
    outcome: str = ""  # success / error / unanswered / abandoned
    code: str = ""
    reason: str = ""
    task_id: int = 0

    @property
    def elapsed(self) -> float:
        return (self.answered - self.sent) if self.answered is not None else 0.0

    def label(self) -> str:
        return f"#{self.seq} {self.method} {self.target}"


@dataclass
class PhaseReport:
    index: int
    faults: list[str] = field(default_factory=list)
    calls: int = 0
    quiesce_s: float = 0.0
    problems: list[str] = field(default_factory=list)  # new violation details of this phase
    stuck: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class ChaosResult:
    options: ChaosOptions
    plan: ChaosPlan
    calls: list[ChaosCall] = field(default_factory=list)
    phases: list[PhaseReport] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    counts: FaultCounts = field(default_factory=FaultCounts)
    checker_repairs: int = 0
    stuck_ids: set[int] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)  # unique details, in the order found
    seen_in: dict[str, list[int]] = field(default_factory=dict)  # detail -> phases whose check found it
    failed_triggers: dict[int, qc.TaskInfo] = field(default_factory=dict)
    triggers_seen: int = 0
    duration_s: float = 0.0
    ops_run: int = 0
    fenced_refusals: int = 0  # lines of deposed leaders' logs showing a refused write or node call
    # The continuous invariants (``samples``): samples judged, and what they found.
    samples: int = 0
    false_full_samples: int = 0
    false_full: list[str] = field(default_factory=list)
    blocked_units: list[str] = field(default_factory=list)
    blocked_releases: list[str] = field(default_factory=list)
    units_waiting_for_room: int = 0  # distinct (collection, replica) units seen waiting for room

    @property
    def unanswered(self) -> list[ChaosCall]:
        return [c for c in self.calls if c.outcome == "unanswered"]

    def summary(self) -> dict[str, Any]:
        return {
            "ops": self.ops_run,
            "replicas": self.options.replicas,
            "capacity": self.options.capacity,
            "leader_kills": self.counts.leader_kills,
            "node_kills": self.counts.node_kills,
            "node_restarts": self.counts.node_restarts,
            "cluster_restarts": self.counts.cluster_restarts,
            "partitions": self.counts.partitions,
            "checker_repairs": self.checker_repairs,
            "no_room_loads": sum(c.code == "NO_AVAILABLE_NODE" for c in self.calls),
            "units_waiting_for_room": self.units_waiting_for_room,
            "unanswered": len(self.unanswered),
            "invariant_violations": len(self.violations),
            "stuck_triggers": len(self.stuck_ids),
            "false_full_samples": self.false_full_samples,
            "blocked_units": len(self.blocked_units),
            "blocked_releases": len(self.blocked_releases),
            "samples": self.samples,
            "seed": self.options.seed,
            "phases": len(self.phases),
            "calls": len(self.calls),
            "fenced_refusals": self.fenced_refusals,
            "plan": self.plan.digest(),
            "duration_s": round(self.duration_s, 1),
        }

    @property
    def failed(self) -> bool:
        return bool(self.unanswered or self.violations or self.stuck_ids or self.false_full_samples
                    or self.blocked_units or self.blocked_releases)


def _actual_state(meta: MetaView, cid: int, every: frozenset[int]) -> State:
    m = meta.collections.get(cid)
    if m is None:
        return RELEASED
    if m.load_type == "collection":
        return ("collection", every if m.partitions == every else m.partitions)
    return ("partitions", m.partitions)


def _expected(state: State, label: str) -> Expected:
    kind, parts = state
    return Expected(kind, parts if kind != "released" else frozenset(), label)


def _overlaps(c: ChaosCall, start: float, end: float) -> bool:
    answered = c.answered if c.answered is not None and c.outcome in ("success", "error") else INF
    return c.sent <= end and answered >= start


def idempotence_violations(calls: list[ChaosCall], every_call: list[ChaosCall]) -> list[str]:
    """Identical requests (a duplicate, a retry) answered SUCCESS and CONFLICT, with no other request about that
    collection in between (``every_call``): such a retry is not idempotent, yet clients retry on every
    ambiguity (``QueryCoordClient`` itself, after a timeout or a leader change)."""
    out: list[str] = []
    groups: dict[int, list[ChaosCall]] = {}
    for c in calls:
        if c.pattern in ("duplicate", "retry") and c.kind in LOAD_STATE_KINDS:
            groups.setdefault(c.group, []).append(c)
    for g, members in sorted(groups.items()):
        answered = [c for c in members if c.outcome in ("success", "error")]
        if not {"SUCCESS", "CONFLICT"} <= {c.code for c in answered}:
            continue
        start = min(c.sent for c in members)
        end = max(c.answered if c.answered is not None else INF for c in members)
        if any(c.group != g and c.cid == members[0].cid and c.kind in LOAD_STATE_KINDS and _overlaps(c, start, end)
               for c in every_call):
            continue
        refused = next(c for c in answered if c.code == "CONFLICT")
        out.append(f"violation: identical requests ({members[0].pattern}) answered SUCCESS and CONFLICT with nothing "
                   f"else about collection {members[0].cid} in between: "
                   + "; ".join(f"{c.label()} {c.outcome} {c.code}" for c in members)
                   + f" (CONFLICT: {refused.reason[:160]})")
    return out


# ----- the drill --------------------------------------------------------------------------------------------------
class ChaosDrill(ChaosCluster):
    """One run (see module docstring). ``run`` returns the result; every process is stopped before it returns."""

    def __init__(self, opts: ChaosOptions, out: Any = None):
        super().__init__(opts, out)
        self.plan = make_plan(opts.seed, opts)
        self.cres = ChaosResult(opts, self.plan, faults=self.result.faults, counts=self.counts)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._poller: asyncio.Task[None] | None = None
        self.sampler: Sampler | None = None
        self.sources: DrillSources | None = None
        self._group = 0
        # The oracle: per collection, the states it may be in at the last check, and the requests since.
        self._states: dict[int, set[State]] = {}
        self._attempts: dict[int, list[Attempt]] = {}
        self._last_label: dict[int, str] = {}
        self._seen_details: set[str] = set()
        self._leak_notes: list[str] = []
        self._history: dict[int, qc.TaskInfo] = {}

    # ----- cluster ----------------------------------------------------------------------------------------------
    async def _start_cluster(self) -> None:
        o = self.copts
        p = self.plan
        self.say(f"chaos drill: seed {o.seed}, {o.coordinators} coordinators, {o.nodes} query nodes, {o.replicas} "
                 f"replicas, {o.clients} clients, {o.collections} collections ({o.partitions} partitions, "
                 f"{o.segments_per_collection} segments each), TTL {o.ttl:g}s; work dir {self.work}")
        kinds = Counter(f.kind for ph in p.phases for f in ph.faults)
        self.say(f"plan {p.digest()}: {len(p.phases)} phases, {p.ops} requests; faults "
                 + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        self.work.mkdir(parents=True, exist_ok=True)
        etcd = EtcdCluster(self.work / "etcd", size=1)
        self.etcd = etcd
        await asyncio.to_thread(etcd.start)
        self.kv = MetaKV(await connect(etcd.config()), self.root)
        self.harness = Harness(etcd.endpoints, self.root, self.work, ttl=o.ttl, on_event=self._on_event)
        coords = await asyncio.gather(*(self._start_coordinator(i) for i in range(o.coordinators)))
        addresses = [c.address for c in coords]
        self.client = QueryCoordClient(addresses, deadline=o.client_deadline, call_timeout=o.call_timeout)
        self.clients = [QueryCoordClient(addresses, deadline=o.client_deadline, call_timeout=o.call_timeout)
                        for _ in range(o.clients)]
        try:
            await self._wait_leader(timeout=60)
        except TimeoutError:
            raise DrillSetupError(f"no coordinator became leader within 60s; logs in {self.work}") from None
        await self._create_collections()
        for cid in self.coll_ids:
            self._states[cid] = {RELEASED}
            self._attempts[cid] = []
        self.nodes = list(await asyncio.gather(*(self._start_node(i) for i in range(o.nodes))))
        await self._wait_nodes_online(timeout=60)
        leader = self.cluster.leader
        self.say(f"cluster up: leader {leader.label if leader else '?'}, nodes {[n.node_id for n in self.nodes]}, "
                 f"collections {self.coll_ids[0]}..{self.coll_ids[-1]}; every etcd and node link through a proxy")

    async def _stop_cluster(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poller
        if self.sampler is not None:
            await self.sampler.stop()
        if self.sources is not None:
            await self.sources.stop()
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close()
        await super()._stop_cluster()

    # ----- run --------------------------------------------------------------------------------------------------
    async def run(self) -> ChaosResult:  # type: ignore[override]
        started = time.monotonic()
        try:
            await self._start_cluster()
            self._supervisor = asyncio.create_task(self._supervise(), name="supervisor")
            self._poller = asyncio.create_task(self._poll_history_forever(), name="history")
            self._start_sampler()
            try:
                async with asyncio.timeout(self.copts.time_budget):
                    for phase in self.plan.phases:
                        await self._run_phase(phase)
            except TimeoutError:
                what = (f"time budget of {self.copts.time_budget:.0f}s exhausted in phase {self._phase} "
                        f"({self.cres.ops_run} of {self.plan.ops} requests run); the run was cut short")
                self.say(what)
                self._new_problems(None, [f"violation: {what}"])
        finally:
            self.cres.duration_s = time.monotonic() - started
            self._collect_samples()
            await self._stop_cluster()
            for log in sorted(self.work.glob("coord-*.log")):
                with contextlib.suppress(OSError):
                    self.cres.fenced_refusals += count_refusals(log.read_text(errors="replace"))
        return self.cres

    def _start_sampler(self) -> None:
        assert self.kv is not None

        def leader() -> str | None:
            m = self.cluster.leader
            return m.address if m is not None else None

        def nodes() -> list[NodeHandle]:
            return [NodeHandle(n.node_id, direct_address(n), n.running) for n in self.nodes if n.ready]

        self.sources = DrillSources(self.kv, self.part_ids, leader=leader, nodes=nodes)
        self.sources.start()
        self.sampler = Sampler(self.sources, now=self.now, disturbances=self.disturbances,
                               interval=self.copts.sample_interval, leader_tail=self.tail, say=self.say)
        self.sampler.start()

    def _collect_samples(self) -> None:
        """The continuous invariants' counts into the result (``samples``)."""
        s = self.sampler
        if s is None:
            return
        r = self.cres
        r.samples, r.false_full_samples = s.stats.judged, s.stats.false_full_samples
        r.false_full = list(s.stats.false_full)
        r.blocked_units = list(s.clock.blocked)
        r.units_waiting_for_room = len(s.stats.room_units)
        releases = [ReleaseCall(c.label(), c.sent, c.answered if c.outcome in ("success", "error") else None,
                                c.code) for c in r.calls
                    if c.method in ("ReleaseCollection", "ReleasePartitions") and c.outcome != "abandoned"]
        r.blocked_releases = blocked_releases(releases, s.waits, self.disturbances, now=self.now())

    async def _run_phase(self, phase: Phase) -> None:
        self._phase = phase.index
        rep = PhaseReport(phase.index, [describe_fault(f) for f in phase.faults])
        self.cres.phases.append(rep)
        self.say(f"phase {phase.index}: {phase.ops} requests on {len(phase.workers)} clients; faults: "
                 f"{', '.join(rep.faults) or 'none'}")
        first_call = len(self.cres.calls)
        t0 = time.monotonic()
        faults = [asyncio.create_task(self._inject(f, t0), name=f"fault-{f.kind}") for f in phase.faults]
        workers = [asyncio.create_task(self._worker(w, items), name=f"client-{w}")
                   for w, items in enumerate(phase.workers)]
        try:
            await asyncio.gather(*workers)
            await asyncio.gather(*faults)
        finally:
            for t in (*workers, *faults):
                t.cancel()
            self._heal_all()
        self.cres.ops_run += phase.ops
        await self._settle_background()
        calls = self.cres.calls[first_call:]
        rep.calls = len(calls)
        await self._check_phase(rep, calls)

    async def _worker(self, w: int, items: tuple[Item, ...]) -> None:
        for item in items:
            if item.wait_s:
                await asyncio.sleep(item.wait_s)
            self._group += 1
            group = self._group
            if item.pattern == "retry":
                # The client gives up on its first send, then sends the same request again, and once more.
                op = item.ops[0]
                await self._send(op, w, group, item.pattern, abandon_s=item.abandon_s)
                await self._send(op, w, group, item.pattern)
                await self._send(op, w, group, item.pattern)
            else:
                k = len(self.clients)
                await asyncio.gather(*(self._send(op, (w + i) % k, group, item.pattern)
                                       for i, op in enumerate(item.ops)))

    # ----- requests ---------------------------------------------------------------------------------------------
    def _new_call(self, op: ChaosOp, w: int, group: int, pattern: str, method: str, target: str, cid: int,
                  pids: tuple[int, ...]) -> ChaosCall:
        self._seq += 1
        call = ChaosCall(self._seq, self._phase, w, group, pattern, method, op.kind, target, cid, pids,
                         sent=self.now())
        self.cres.calls.append(call)
        return call

    async def _send(self, op: ChaosOp, w: int, group: int, pattern: str, abandon_s: float = 0.0) -> ChaosCall:
        if op.kind in ("add_segments", "compact", "compact_chain"):
            return await self._catalog_change(op, w, group, pattern)
        method, req, target = self._request(op)
        cid = getattr(req, "collection_id", 0) if op.kind != "balance" else 0
        pids = tuple(getattr(req, "partition_ids", ()))
        call = self._new_call(op, w, group, pattern, method, target, cid, pids)
        client = self.clients[w % len(self.clients)]
        try:
            resp = await asyncio.wait_for(client.query(method, req), abandon_s or self.copts.call_deadline)
        except TimeoutError:
            call.outcome = "abandoned" if abandon_s else "unanswered"
            call.reason = f"no answer within {abandon_s or self.copts.call_deadline:g}s"
        except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
            call.outcome, call.reason = "unanswered", _one_line(str(exc))
        else:
            st = resp.status
            call.code, call.reason = EC.ErrorCode.Name(st.error_code), _one_line(st.reason, 500)
            call.task_id = getattr(resp, "task_id", 0)
            call.outcome = "success" if st.error_code == EC.SUCCESS else "error"
        call.answered = self.now()
        if call.outcome == "unanswered":
            self.say(f"call {call.label()}: UNANSWERED: {call.reason[:200]}")
        else:
            self.note(f"call {call.label()} ({describe_op(op)}, {pattern}): {call.outcome} {call.code} "
                      f"{call.reason[:100]} ({call.elapsed:.2f}s)")
        if op.kind in LOAD_STATE_KINDS:
            self._record_attempt(call)
        return call

    def _record_attempt(self, call: ChaosCall) -> None:
        effect = effect_of(call.kind, call.outcome, call.code)
        answered = call.answered if effect != "maybe" and call.answered is not None else INF
        self._attempts[call.cid].append(Attempt(call.seq, call.kind, frozenset(call.pids), call.sent, answered,
                                                effect, call.label()))
        if effect == "yes":
            self._last_label[call.cid] = call.label()

    async def _catalog_change(self, op: ChaosOp, w: int, group: int, pattern: str) -> ChaosCall:
        """New sealed segments, or two compacted into one, through the catalog API (the coordinator hands them
        off when the partition is loaded). A compaction chain compacts the result at once with a third segment:
        the second handoff names a source that was itself a compaction result, maybe not loaded anywhere yet."""
        assert self.kv is not None
        cid = self.coll_ids[op.coll % len(self.coll_ids)]
        parts = self.part_ids[cid]
        pid = parts[op.parts[0] % len(parts)] if op.parts else parts[0]
        method = {"add_segments": "AddSegments", "compact": "Compact"}.get(op.kind, "CompactChain")
        call = self._new_call(op, w, group, pattern, method, f"coll {cid} partition {pid}", cid, (pid,))
        store = CatalogStore(self.kv)
        try:
            if op.kind in ("compact", "compact_chain"):
                ids = await self._compact(store, cid, pid, call, chain=op.kind == "compact_chain")
            else:
                segs = [data_pb2.SegmentBinlogs(collection_id=cid, partition_id=pid, num_rows=1000,
                                                mem_size=SEGMENT_BYTES,
                                                binlog_paths=[f"insert_log/{cid}/{pid}/chaos-{call.seq}-{k}"])
                        for k in range(op.count)]
                ids = await store.add_segments(segs, collection_id=cid)
            call.outcome, call.code, call.reason = "success", "SUCCESS", f"segments {ids}"
        except (CatalogError, MetaError) as exc:
            st = status_of(exc)
            call.outcome, call.code, call.reason = "error", EC.ErrorCode.Name(st.error_code), st.reason
        call.answered = self.now()
        self.note(f"call {call.label()}: {call.code} {call.reason[:100]}")
        return call

    async def _compact(self, store: CatalogStore, cid: int, pid: int, call: ChaosCall, *, chain: bool) -> list[int]:
        """Two segments into one (sized as both), and with ``chain`` that one and a third into another."""
        _, binlogs = await store.get_recovery_info(cid, pid)
        need = 3 if chain else 2
        if len(binlogs) < need:
            raise CatalogError(f"partition {pid} has {len(binlogs)} segments: nothing to compact", code=EC.NOT_FOUND)
        rng = random.Random(f"{self.copts.seed}-{call.seq}")
        size = {b.segment_id: (b.mem_size, b.num_rows) for b in binlogs}
        sources = rng.sample(sorted(size), need)

        def compacted(srcs: list[int], step: int) -> data_pb2.SegmentBinlogs:
            return data_pb2.SegmentBinlogs(
                collection_id=cid, partition_id=pid, num_rows=sum(size[s][1] for s in srcs),
                mem_size=sum(size[s][0] for s in srcs), compaction_from=srcs,
                binlog_paths=[f"insert_log/{cid}/{pid}/compacted-{call.seq}-{step}"])

        ids = await store.add_segments([compacted(sources[:2], 0)], collection_id=cid)
        call.target += f" {sources[:2]} -> {ids[0]}"
        if chain:
            first = compacted(sources[:2], 0)
            size[ids[0]] = (first.mem_size, first.num_rows)
            await asyncio.sleep(rng.uniform(0.0, 0.5))  # its handoff may have started, or not
            second = [ids[0], sources[2]]
            ids += await store.add_segments([compacted(second, 1)], collection_id=cid)
            call.target += f", {second} -> {ids[-1]}"
        return ids

    # ----- replicas over time (``FailoverDrill._judge_replicas``) -------------------------------------------------
    def _requests_between(self, a: ReplicaObservation, b: ReplicaObservation) -> list[tuple[int, str]]:
        """As the failover drill's; an open-ended call (abandoned, unanswered, TIMEOUT...: ``effect_of`` says
        "maybe") may take effect until its phase is quiescent."""
        out = []
        for c in self.cres.calls:
            if not c.cid or c.kind not in LOAD_STATE_KINDS:
                continue
            definite = c.answered is not None and effect_of(c.kind, c.outcome, c.code) != "maybe"
            end = c.answered if definite else (INF if c.phase >= a.phase else c.answered)
            if c.sent <= b.t1 and (end is None or end >= a.t0):
                out.append((c.cid, c.method))
        return out

    # ----- the leader's view --------------------------------------------------------------------------------------
    def _stub(self, address: str) -> querycoord_pb2_grpc.QueryCoordStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = make_channel(address)
        return querycoord_pb2_grpc.QueryCoordStub(ch)

    async def _leader_call(self, method: str, request: Any, timeout: float = 5.0) -> Any:
        """``method`` on the coordinator that leads now, asked directly (a standby would answer ListTasks from
        etcd, not from the scheduler); None when no coordinator answers as the leader."""
        leader = self.cluster.leader
        if leader is None:
            return None
        stub = self._stub(leader.address)
        try:
            states = await stub.GetComponentStates(qc.GetComponentStatesRequest(), timeout=timeout)
            if states.state.state_code != EC.HEALTHY:
                return None
            resp = await getattr(stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError:
            return None
        return resp if resp.status.error_code == EC.SUCCESS else None

    async def _leader_trees(self, include_finished: bool) -> list[qc.TaskTree] | None:
        trees: list[qc.TaskTree] = []
        after = 0
        while True:
            resp = await self._leader_call("ListTasks", qc.ListTasksRequest(
                include_finished=include_finished, limit=1000, after_task_id=after))
            if resp is None:
                return None
            trees += resp.trees
            if not resp.next_after_task_id:
                return trees
            after = resp.next_after_task_id

    def _remember(self, trees: list[qc.TaskTree]) -> None:
        for tree in trees:
            t = tree.trigger
            self._history[t.task_id] = t
            if t.state == qc.TASK_STATE_FAILED:
                self.cres.failed_triggers[t.task_id] = t
        checker = getattr(qc, "TRIGGER_CONDITION_CHECKER", None)
        self.cres.triggers_seen = len(self._history)
        if checker is not None:
            self.cres.checker_repairs = sum(t.trigger_condition == checker for t in self._history.values())

    async def _poll_history_forever(self) -> None:
        """The leader keeps finished trees in memory only, and a bounded number: read them often."""
        while True:
            await asyncio.sleep(1.5)
            with contextlib.suppress(Exception):
                trees = await self._leader_trees(include_finished=True)
                if trees:
                    self._remember(trees)

    # ----- checks -----------------------------------------------------------------------------------------------
    async def _quiesce_chaos(self) -> tuple[list[str], list[qc.TaskTree]]:
        """Until the leader runs no trigger (except known stuck ones), no task key exists (unless a stuck trigger
        holds some) and the leader sees exactly the live nodes, for ``settle_s``; bounded. Returns (problems,
        stuck trees)."""
        assert self.kv is not None
        deadline = time.monotonic() + self.copts.quiesce_timeout
        good = leaked = 0
        quiet_since: float | None = None
        last = "no leader answered"
        pending: list[qc.TaskTree] = []
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            trees = await self._leader_trees(include_finished=False)
            nodes = await self._leader_call("ShowNodes", qc.ShowNodesRequest())
            if trees is None or nodes is None:
                good, last = 0, "no coordinator answered as the leader"
                continue
            pending = [t for t in trees if t.trigger.task_id not in self.cres.stuck_ids]
            keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
            live = {n.node_id for n in self.nodes}
            online = {n.node_id for n in nodes.nodes if n.state == "online"}
            known = {n.node_id for n in nodes.nodes}
            quiet = (not pending and (not any(keys.values()) or bool(self.cres.stuck_ids))
                     and online == live and known == live)
            last = (f"{len(pending)} triggers queued or running, task keys {keys}, online nodes {sorted(online)} "
                    f"(known {sorted(known)}), live nodes {sorted(live)}")
            good = good + 1 if quiet else 0
            quiet_since = (quiet_since or time.monotonic()) if quiet else None
            if good >= 3 and quiet_since is not None and time.monotonic() - quiet_since >= self.copts.settle_s:
                return [], []
            # Keys while the leader runs nothing, for 5 s: leaked (the checker reports them), not worth waiting on.
            leak = not pending and any(keys.values()) and online == live and known == live
            leaked = leaked + 1 if leak else 0
            if leaked >= 10:
                self._leak_notes = await self._describe_task_keys()
                return [], []
        if pending:
            return [], pending
        return [f"not quiescent after {self.copts.quiesce_timeout:.0f}s: {last}"], []

    async def _describe_task_keys(self) -> list[str]:
        """What the task keys left in etcd are, and what the leader said about those triggers (diagnosis)."""
        assert self.kv is not None
        try:
            records = await TaskStore(self.kv).load_all()
        except Exception as exc:  # diagnosis only
            return [f"task keys could not be read: {exc}"]
        out = []
        children: Counter[int] = Counter(r.parent_id for r in records if r.parent_id)
        now_ms = time.time() * 1000
        for r in records:
            if r.parent_id:
                continue
            seen = self._history.get(r.id)
            leader = (f"the leader finished it as {qc.TaskState.Name(seen.state)}" if seen is not None
                      and seen.state in (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED) else
                      "the leader lists it" if seen is not None else "the leader never listed it")
            out.append(f"task keys left: trigger {r.id} {qc.TaskKind.Name(r.kind)} "
                       f"{qc.TriggerCondition.Name(r.trigger_condition)} collection {r.collection_id} persisted as "
                       f"{qc.TaskState.Name(r.state)} with {children[r.id]} children, updated "
                       f"{(now_ms - r.updated_ms) / 1000:.0f}s ago; {leader}; error {r.error[:120] or '-'}")
        orphans = [r.id for r in records if r.parent_id and r.parent_id not in {x.id for x in records}]
        if orphans:
            out.append(f"task keys left: children without a trigger: {orphans[:10]}")
        return out

    def _new_problems(self, rep: PhaseReport | None, details: list[str]) -> None:
        """Count each distinct problem once, in the phase that found it (a lasting one is seen at every check,
        and the report says for how long: repaired later, or never)."""
        for d in details:
            self.cres.seen_in.setdefault(d, []).append(self._phase)
            if d in self._seen_details:
                continue
            self._seen_details.add(d)
            self.cres.violations.append(d)
            if rep is not None:
                rep.problems.append(d)

    def _resolve_expected(self, meta: MetaView, rep: PhaseReport) -> dict[int, Expected]:
        """Per collection, the admissible state found in meta (or the first admissible one, which the checker
        then reports against); the oracle restarts from what was found."""
        expected: dict[int, Expected] = {}
        for cid in self.coll_ids:
            every = frozenset(self.part_ids[cid])
            attempts = self._attempts[cid]
            cands = admissible_states(self._states[cid], attempts, every)
            actual = _actual_state(meta, cid, every)
            label = self._last_label.get(cid, "")
            if cands is None:
                rep.notes.append(f"collection {cid}: {len(attempts)} overlapping requests, too many orders to "
                                 f"enumerate: its state ({state_name(actual)}) is accepted as is")
                chosen = actual
            elif actual in cands:
                chosen = actual
            else:
                chosen = sorted(cands, key=lambda s: (s[0], sorted(s[1])))[0]
                reqs = "; ".join(f"{a.label} {a.effect}" for a in attempts) or "none"
                rep.notes.append(f"collection {cid}: found {state_name(actual)}, admissible "
                                 f"{sorted(state_name(s) for s in cands)} (requests since the last check: {reqs})")
            expected[cid] = _expected(chosen, label)
            self._states[cid] = {actual}
            self._attempts[cid] = []
        return expected

    async def _check_phase(self, rep: PhaseReport, calls: list[ChaosCall]) -> None:
        assert self.kv is not None
        t = time.monotonic()
        not_quiet, stuck = await self._quiesce_chaos()
        rep.quiesce_s = time.monotonic() - t
        for tree in stuck:
            tr = tree.trigger
            self.cres.stuck_ids.add(tr.task_id)
            cc = tree.child_counts
            line = (f"trigger {tr.task_id} {qc.TaskKind.Name(tr.kind)} collection {tr.collection_id} "
                    f"{qc.TaskState.Name(tr.state)} ({tr.summary}); children {cc.total} (doing {cc.doing}, "
                    f"undo {cc.undo}, failed {cc.failed}); error {tr.error[:160] or '-'}")
            rep.stuck.append(line)
            self.say(f"phase {rep.index}: STUCK {line}")
        trees = await self._leader_trees(include_finished=True)
        if trees:
            self._remember(trees)
        rep.notes += self._leak_notes
        self._leak_notes = []
        await self._close_dead_proxies()
        catalog = await self._catalog_view()
        t_meta = self.now()
        meta = await self._meta_view()
        self._judge_replicas(self._observation(f"phase {rep.index} check", t_meta, meta.collections, quiescent=True))
        history, self._replica_history = self._replica_history, []
        comparisons, self._replica_comparisons = self._replica_comparisons, 0
        nodes = await self._node_views()
        keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
        expected = self._resolve_expected(meta, rep)
        unclear = [f"{c.label()}: {c.code} {c.reason[:200]}" for c in calls
                   if c.outcome == "error" and c.code in UNCLEAR_CODES]
        mechanics, self._extra_violations = self._extra_violations, []
        # Units that cannot be placed now (no node, no room) are excused from "every copy in each replica".
        unplaceable = await self.sampler.unplaceable({cid: (m.partitions, m.replicas)
                                                      for cid, m in meta.collections.items()}) if self.sampler else {}
        res = check(expected, catalog, meta, nodes, task_keys=keys, unanswered=[], unclear=unclear,
                    extra_violations=mechanics + not_quiet, replica_number=self.copts.replicas,
                    replica_history=history, replica_comparisons=comparisons, unplaceable=unplaceable)
        rep.notes += res.notes
        details = [*res.details, *idempotence_violations(calls, self.cres.calls),
                   *(f"violation: unanswered call {c.label()}: {c.reason[:200]}" for c in calls
                     if c.outcome == "unanswered")]
        self._new_problems(rep, details)
        outcomes = Counter(c.outcome for c in calls)
        self.say(f"phase {rep.index}: {len(calls)} calls ({', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}"
                 f"), quiescent after {rep.quiesce_s:.1f}s, {len(rep.problems)} new problems, "
                 f"{len(rep.stuck)} stuck triggers")
        for d in rep.problems[:12]:
            self.say(f"    {d[:400]}")
        for n in rep.notes[:6]:
            self.say(f"    note: {n[:400]}")


# ----- report -----------------------------------------------------------------------------------------------------
def render(result: ChaosResult) -> str:
    """The table: phases, faults, calls, failed triggers, problems (the JSON line is printed separately)."""
    lines = ["", "phases"]
    for p in result.phases:
        lines.append(f"  {p.index:>3}  {p.calls:>3} calls  quiescent {p.quiesce_s:5.1f}s  problems "
                     f"{len(p.problems):>2}  stuck {len(p.stuck)}  faults: {', '.join(p.faults) or 'none'}")
    lines += render_activity(result.faults, result.calls, row=lambda c: f"{c.method} [{c.pattern}]", width=34,
                             example=ChaosCall.label, slow=ChaosCall.label)
    if result.failed_triggers:
        lines += ["", f"failed triggers (not violations by themselves; {result.triggers_seen} triggers seen)"]
        for t in list(result.failed_triggers.values())[:15]:
            lines.append(f"  {t.task_id} {qc.TaskKind.Name(t.kind)} {qc.TriggerCondition.Name(t.trigger_condition)} "
                         f"collection {t.collection_id}: {common_pb2.ErrorCode.Name(t.error_code)} {t.error[:150]}")
    stuck = [s for p in result.phases for s in p.stuck]
    lines += ["", f"stuck triggers: {len(result.stuck_ids)}"]
    lines += [f"  {s[:300]}" for s in stuck[:20]]
    lines += ["", f"problems: {len(result.violations)} (each counted once; 'seen in' = the checks that found it)"]
    for v in result.violations[:60]:
        seen = result.seen_in.get(v, [])
        last = len(result.phases) - 1
        span = (f"phase {seen[0]}" if len(seen) == 1 else f"phases {seen[0]}..{seen[-1]} ({len(seen)} checks)")
        still = ", STILL THERE at the last check" if seen and seen[-1] == last and last > seen[0] else (
            ", gone by the next check" if seen and seen[-1] < last else "")
        lines.append(f"  [{span}{still}] {v[:500]}")
    if len(result.violations) > 60:
        lines.append(f"  ... and {len(result.violations) - 60} more")
    lines += ["", f"continuous invariants over {result.samples} samples: false full samples "
                  f"{result.false_full_samples}, blocked units {len(result.blocked_units)}, blocked releases "
                  f"{len(result.blocked_releases)} (units seen waiting for room: {result.units_waiting_for_room})"]
    lines += [f"  false full {f[:400]}" for f in result.false_full[:20]]
    lines += [f"  blocked unit: {b[:400]}" for b in result.blocked_units[:20]]
    lines += [f"  blocked release: {b[:400]}" for b in result.blocked_releases[:20]]
    notes = [n for p in result.phases for n in p.notes]
    if notes:
        lines += ["", "oracle notes"]
        lines += [f"  {n[:500]}" for n in notes[:30]]
    return "\n".join(lines)


async def run_chaos(opts: ChaosOptions, out: Any = None) -> int:
    """Run the drill, print the table and the JSON line; 0 when nothing failed, 1 otherwise, 2 on setup."""
    out = out or sys.stdout
    return await run_and_report(ChaosDrill(opts, out), opts, render, out, plan="plan")


__all__ = ["ChaosCall", "ChaosDrill", "ChaosOptions", "ChaosResult", "idempotence_violations", "render", "run_chaos"]
