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
nodes have room for about half the replicas (loads are refused for want of memory, a lost node's copies may
have nowhere to go: a replica with no spare), nodes restart under fixed ids, the whole cluster restarts, and
compactions chain.

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
views the checker reads); ``chaos_cluster`` adds the proxies and the faults, ``chaos_checks`` the oracle and
the checks of each phase, ``chaos_records`` what is recorded, and this module the concurrent clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from typing import Any

import grpc

from meta.client import connect
from meta.errors import MetaError
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogError, CatalogStore, status_of
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.tooling.drill.activity import render_activity
from querycoord.tooling.drill.base import run_and_report, stop_task, wait_nodes_online
from querycoord.tooling.drill.chaos_checks import ChaosChecks
from querycoord.tooling.drill.chaos_ops import (
    INF,
    LOAD_STATE_KINDS,
    RELEASED,
    Attempt,
    ChaosOp,
    Item,
    Phase,
    describe_fault,
    describe_op,
    effect_of,
)
from querycoord.tooling.drill.chaos_records import ChaosCall, ChaosResult, PhaseReport
from querycoord.tooling.drill.failover_base import direct_address
from querycoord.tooling.drill.failover_records import ReplicaObservation
from querycoord.tooling.drill.options import SEGMENT_BYTES, ChaosOptions
from querycoord.tooling.drill.sampler import DrillSources, NodeHandle, Sampler
from querycoord.tooling.drill.samples import ReleaseCall, blocked_releases
from querycoord.tooling.drill.stale import count_refusals
from querycoord.tooling.harness import Harness

EC = common_pb2


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


# ----- the drill --------------------------------------------------------------------------------------------------
class ChaosDrill(ChaosChecks):
    """One run (see module docstring). ``run`` returns the result; every process is stopped before it returns."""

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
        await self._first_leader()
        await self._create_collections()
        for cid in self.coll_ids:
            self._states[cid] = {RELEASED}
            self._attempts[cid] = []
        self.nodes = list(await asyncio.gather(*(self._start_node(i) for i in range(o.nodes))))
        await wait_nodes_online(self.client, self.nodes, timeout=60)
        leader = self.cluster.leader
        self.say(f"cluster up: leader {leader.label if leader else '?'}, nodes {[n.node_id for n in self.nodes]}, "
                 f"collections {self.coll_ids[0]}..{self.coll_ids[-1]}; every etcd and node link through a proxy")

    async def _stop_cluster(self) -> None:
        await stop_task(self._poller)
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


__all__ = ["ChaosDrill", "ChaosOptions", "render", "run_chaos"]
