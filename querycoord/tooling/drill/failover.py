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
import signal
import sys
import time
from typing import Any

import grpc

from meta.client import connect
from meta.election import current_leader, election_prefix
from meta.kv import MetaKV
from meta.ops.child import ChildProcess
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.common.protocol import QUERYCOORD_ELECTION
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.tooling.drill.base import run_and_report, stop_task, wait_nodes_online
from querycoord.tooling.drill.failover_checks import FailoverChecks
from querycoord.tooling.drill.failover_faults import FailoverFaults
from querycoord.tooling.drill.failover_records import CallRecord, KillRecord
from querycoord.tooling.drill.failover_report import render
from querycoord.tooling.drill.invariants import (
    Expected,
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
    describe,
)
from querycoord.tooling.drill.stale import PauseReport, Window, changes_between, count_refusals, stable_revision
from querycoord.tooling.harness import QUERY_NODE, Harness, Member

EC = common_pb2


# Beyond the scaled preset (``coord --scaled``): a bounded trigger deadline, a few children at a time and (with
# ``--max-request-bytes``) small merged requests, so a load has many children to be killed in the middle of; the
# back-off cap the drills were tuned with.
DRILL_COORD_FLAGS = ("--scaled", "--max-concurrent-children", "4", "--trigger-timeout", "120",
                     "--retry-backoff-max", "0.5")


class FailoverDrill(FailoverFaults, FailoverChecks):
    """One run (see module docstring). ``run`` returns the result; every process is stopped before it returns.

    Its parts: ``FailoverBase`` (state), ``ReplicaWatch`` (replicas over time), ``FailoverFaults`` (node and
    etcd faults, the supervisor), ``FailoverChecks`` (quiescence and invariants); here the cluster, the
    schedule, leader kills and the SIGSTOP round.
    """

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
        await self._first_leader()
        await self._create_collections()
        self.nodes = list(await asyncio.gather(*(self._start_node(i) for i in range(o.nodes))))
        await wait_nodes_online(self.client, self.nodes, timeout=60)
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

    async def _stop_cluster(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        for t in (self._supervisor, self._kill_task, self._etcd_task):
            await stop_task(t)
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


async def run_failover(opts: DrillOptions, out: Any = None) -> int:
    """Run the drill, print the table and the JSON line; 0 when every invariant held, 1 otherwise, 2 on setup."""
    out = out or sys.stdout
    return await run_and_report(FailoverDrill(opts, out), opts, render, out, plan="schedule")
