"""The stream drill: coordinators and stream nodes as processes, stream faults, stream invariants.

``querycoord drill streams --nodes 4 --snodes 2 --streams 50 --seed S`` starts an embedded etcd, two
coordinators (``querycoord coord --scaled``: scaled-down stream timings) and ``--nodes`` reference
stream nodes (``querycoord streamnode``; each leads two vgroups, the first ``--snodes`` host an
snode), creates the snodes and the streams (seeded shapes; a few are then stopped by the user), waits until
quiescent, then runs its faults one at a time, each followed by a wait until quiescent:

* the coordinator leader SIGKILLed (``--leader-kills``, default 2) and restarted as a standby;
* the node of an snode SIGKILLed and a replacement node started on its vgroups (with a new snode);
* a vgroup's leadership moved (stdin ``unlead V`` on its node, ``lead V`` on another);
* some tasks failed (stdin ``fail TASK`` on the node holding them).

Quiescent means: the leader is out of WATCH; every stream not stopped by the user is RUNNING in the leader's
ShowStreams with every expected task (``plan.expected_counts``) RUNNING, readers on the node that leads their
vgroup; and the nodes' own task lists (stdin ``tasks``) hold exactly those instances (same task id, SID and
node), no instance of a task on two nodes, no instance with a SID below the leader's or of a task the leader
does not have (stale). The final check is the same observation; its counts are the JSON line.

Adoption is observed from the nodes, not taken from the leader: before a leader kill the drill records
every stream's instances (task id, SID, node) on the nodes; once quiescent again under the new leader, a
stream whose instances are all unchanged was adopted without redeploy, any other was redeployed (fresh
task ids or higher SIDs). ``recovered_s`` of a fault is the time from the fault to quiescence.

Recalculations: before each fault the drill asks one (RecalculateStream) of a stream not stopped by the user, so
the fault strikes while runners run it. At the end every one must be DONE in the leader's ShowStreams, and no
runner instance (stream, recalculation, task id, SID) may have finished it twice: the nodes print each finished
run (``recalc_done`` events, counted here, those of nodes killed later included). JSON: ``recalcs`` (asked),
``recalcs_not_done``, ``recalc_duplicates`` (0, or the drill fails).

Lag: through the whole run the leader's ShowStreams is sampled (``stream_lag``) and every stream's lag kept;
``lag_p99_s`` (and ``lag_max_s``, ``lag_samples``) in the JSON line are over those samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, stream_pb2
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.tooling.drill.base import DrillSetupError, ProcessDrill, run_and_report
from querycoord.tooling.drill.leaders import wait_until
from querycoord.tooling.drill.options import StreamDrillOptions
from querycoord.tooling.drill.stream_checkpoints import CheckpointChecks
from querycoord.tooling.drill.stream_lag import LagSampler, stop
from querycoord.tooling.drill.stream_observation import Fault, Observation, why_not_running
from querycoord.tooling.harness import STREAM_NODE, Harness, Member

sp = stream_pb2
ALIVE = ("INIT", "RUNNING")
VGROUPS_PER_NODE = 2
_WATCH_ENDED = re.compile(r"WATCH ended: (\d+) streams adopted")


@dataclass
class StreamDrillResult:
    opts: StreamDrillOptions
    faults: list[Fault] = field(default_factory=list)
    final: Observation | None = None
    violations: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    recalcs: dict[int, int] = field(default_factory=dict)  # recalc id -> stream id
    recalcs_not_done: list[str] = field(default_factory=list)
    recalc_duplicates: list[str] = field(default_factory=list)
    lag: LagSampler | None = None
    checkpoints: CheckpointChecks = field(default_factory=CheckpointChecks)

    def of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    def summary(self) -> dict[str, Any]:
        final = self.final or Observation(error="no final observation")
        kills = self.of("leader-kill")
        recovered = [f.recovered_s for f in self.faults if f.recovered_s is not None]
        return {
            "streams": self.opts.streams,
            "leader_kills": len(kills),
            "adopted_without_redeploy": sum(f.adopted or 0 for f in kills),
            "redeploys": sum(f.redeployed or 0 for f in kills),
            "recovered_s_max": round(max(recovered), 2) if recovered else None,
            "duplicate_tasks": len(final.duplicates),
            "stale_tasks": len(final.stale),
            "not_running": len(final.not_running),
            "recalcs": len(self.recalcs),
            "recalcs_not_done": len(self.recalcs_not_done),
            "recalc_duplicates": len(self.recalc_duplicates),
            **(self.lag.summary() if self.lag is not None else {"lag_p99_s": None}),
            **self.checkpoints.summary(),
        }

    @property
    def failed(self) -> bool:
        s = self.summary()
        return bool(self.violations or s["duplicate_tasks"] or s["stale_tasks"] or s["not_running"]
                    or s["recalcs_not_done"] or s["recalc_duplicates"]
                    or s["checkpoint_regressions"] or s["bad_resumes"]
                    or self.final is None or self.final.error)


class StreamDrill(ProcessDrill[StreamDrillOptions, StreamDrillResult]):
    def __init__(self, opts: StreamDrillOptions, out: Any = None):
        super().__init__(opts, out, "querycoord-sdrill-")
        self.rng = random.Random(opts.seed)
        self.root = f"drill-streams-{opts.seed}"
        self.nodes: list[Member] = []
        # What the drill asked of each node: the vgroups it leads (moves change them), whether it hosts an snode.
        self.vgroups: dict[Member, list[int]] = {}
        self.snodes: set[Member] = set()
        self.result = StreamDrillResult(opts)
        self.stopped_ids: set[int] = set()
        self.stopped_names: set[str] = set()
        self.client: QueryCoordClient | None = None
        # Finished recalculation runs the nodes printed: (stream, recalc, task, SID) -> how many.
        self.recalc_runs: Counter[tuple[int, int, int, int]] = Counter()

    # ----- life cycle -----------------------------------------------------------------------------------------------
    async def _drive(self) -> None:
        await self._create_streams()
        sampler = self.result.lag = LagSampler(
            lambda: self._call("ShowStreams", sp.ShowStreamsRequest(with_tasks=False), timeout=10))
        sampling = asyncio.create_task(sampler.run(), name="stream-drill-lag")
        try:
            first = await self._quiesce("initial deploy")
            if not first.quiescent:
                self.result.violations.append(f"initial deploy not quiescent: {first.brief()}")
            await self._first_checkpoints()
            await self._run_faults()
            self.result.final = await self._quiesce("final")
            self.say(f"final: {self.result.final.brief()}")
            await self._check_recalcs()
        finally:
            await stop(sampling)

    async def _start_cluster(self) -> None:
        o = self.opts
        self.say(f"stream drill: seed {o.seed}, 2 coordinators, {o.nodes} stream nodes ({o.snodes} with an snode), "
                 f"{o.streams} streams; work dir {self.work}")
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdCluster(self.work / "etcd", size=1)
        await asyncio.to_thread(self.etcd.start)
        self.harness = Harness(self.etcd.endpoints, self.root, self.work, ttl=o.ttl, on_event=self._on_event)
        coords = await asyncio.gather(*(self._start_coordinator(i) for i in range(2)))
        self.client = QueryCoordClient([c.address for c in coords], deadline=30.0, call_timeout=5.0)
        await self._first_leader()
        vgs = [[i * VGROUPS_PER_NODE + k + 1 for k in range(VGROUPS_PER_NODE)] for i in range(o.nodes)]
        self.nodes = list(await asyncio.gather(*(self._start_node(i, vgs[i], i < o.snodes) for i in range(o.nodes))))
        for n in self.nodes:
            if n in self.snodes:
                await self._create_snode(n)
        leader = self.cluster.leader
        self.say(f"cluster up: leader {leader.label if leader else '?'}; nodes "
                 + ", ".join(f"{n.label}=id {n.node_id} vgroups {self.vgroups[n]}"
                             f"{' +snode' if n in self.snodes else ''}" for n in self.nodes))

    async def _stop_cluster(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        if self.harness is not None:
            await self.harness.stop(5)
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop)

    def _on_event(self, member: Member, event: dict[str, Any]) -> None:
        """The harness's hook (it has set ``member.state`` already)."""
        kind = event.get("event")
        if kind == "recalc_done":
            self.recalc_runs[(int(event["stream_id"]), int(event["recalc_id"]), int(event["task_id"]),
                              int(event["sid"]))] += 1
        if kind in ("leader", "standby"):
            self.note(f"{member.label} is now {kind}")

    def _coordinator_flags(self) -> list[str]:
        # The scaled preset has the scaled-down stream timings; the WATCH bound is the drill's option.
        return ["--scaled", "--stream-watch-timeout", f"{self.opts.watch_timeout:g}"]

    async def _start_coordinator(self, index: int) -> Member:
        return await self.cluster.start_coordinator(index, "127.0.0.1:0", *self._coordinator_flags())

    async def _restart_coordinator(self, member: Member) -> None:
        await self.cluster.restart_coordinator(member, *self._coordinator_flags(), attempts=4)
        if self.client is not None and member.address not in self.client.addresses:
            self.client.addresses.append(member.address)  # restarted at a new address

    async def _start_node(self, index: int, vgroups: list[int], snode: bool, member: Member | None = None) -> Member:
        """Stream node ``index`` leading ``vgroups``; with ``member`` its replacement (a new process, new id)."""
        flags = ["--vgroups", ",".join(map(str, vgroups)), "--heartbeat-ms", f"{self.opts.heartbeat_ms:g}",
                 "--groups", "2", "--init-delay-ms", "100", *(["--snode"] if snode else [])]
        node = await self.cluster.start_node(STREAM_NODE, index, *flags, member=member)
        self.vgroups[node] = list(vgroups)
        if snode:
            self.snodes.add(node)
        return node

    # ----- leader and calls -----------------------------------------------------------------------------------------
    async def _call(self, method: str, request: Any, timeout: float = 30.0) -> Any:
        """Call the leader through the shared leader-following client, starting at the one our events name.

        A standby answers reads (ShowStreams) itself with persisted streams only, so the client is pointed at
        the coordinator that last reported leading before each call; it still follows redirects from there.
        TimeoutError if no coordinator reports leading within ``timeout``; ``CoordinatorUnavailable`` if no
        leader answers.
        """
        assert self.client is not None
        deadline = time.monotonic() + timeout
        while (leader := self.cluster.leader) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method}: no coordinator leads after {timeout:g}s")
            await asyncio.sleep(0.05)
        if self.client.current != leader.address:
            self.client.prefer(leader.address)  # the redirect a standby would give
        return await asyncio.wait_for(self.client.stream(method, request), max(0.1, deadline - time.monotonic()))

    async def _create_snode(self, node: Member) -> None:
        resp = await self._call("CreateSnode", sp.CreateSnodeRequest(node_id=node.node_id))
        if resp.status.error_code != common_pb2.SUCCESS:
            raise DrillSetupError(f"CreateSnode on node {node.node_id}: {resp.status.reason}")
        self.snodes.add(node)
        self.note(f"snode {resp.snode.id} on {node.label} (node {node.node_id})")

    async def _create_streams(self) -> None:
        o = self.opts
        all_vgs = sorted(v for n in self.nodes for v in self.vgroups[n])
        # Streams need a live snode: the first CreateStream waits until an snode heartbeats.
        deadline = time.monotonic() + 30
        for i in range(o.streams):
            k = self.rng.randint(1, min(3, len(all_vgs)))
            vgs = sorted(self.rng.sample(all_vgs, k))
            req = sp.CreateStreamRequest(
                name=f"s{i:03d}", source_db="db", source_vgroup_ids=vgs,
                trigger_vgroup_id=self.rng.choice(vgs) if self.rng.random() < 0.2 else 0,
                num_calc_scan_plans=self.rng.randint(0, 2), num_calc_subplans=self.rng.randint(1, 3),
                runner_deploys=self.rng.randint(1, 2))
            while True:
                resp = await self._call("CreateStream", req)
                if resp.status.error_code == common_pb2.SUCCESS:
                    break
                if resp.status.error_code != common_pb2.NO_AVAILABLE_NODE or time.monotonic() > deadline:
                    raise DrillSetupError(f"CreateStream {req.name}: {resp.status.reason}")
                await asyncio.sleep(0.2)
        names = self.rng.sample([f"s{i:03d}" for i in range(o.streams)], o.stops)
        for name in sorted(names):
            resp = await self._call("StopStream", sp.StopStreamRequest(stream=sp.StreamRef(name=name)))
            if resp.status.error_code != common_pb2.SUCCESS:
                raise DrillSetupError(f"StopStream {name}: {resp.status.reason}")
            self.stopped_ids.add(resp.stream.id)
            self.stopped_names.add(name)
        self.say(f"{o.streams} streams created, {len(names)} of them stopped by the user: {sorted(names)}")

    # ----- observation ----------------------------------------------------------------------------------------------
    async def _node_tasks(self) -> dict[int, dict[str, Any]]:
        """node id -> the ``tasks`` ack of every live node."""
        live = [n for n in self.nodes if n.running]
        acks = await asyncio.gather(*(n.child.command("tasks") for n in live), return_exceptions=True)
        return {n.node_id: a for n, a in zip(live, acks, strict=True) if isinstance(a, dict) and a.get("ok")}

    async def observe(self) -> Observation:
        ob = Observation()
        try:
            show = await self._call("ShowStreams", sp.ShowStreamsRequest(with_tasks=True), timeout=10)
        except (TimeoutError, CoordinatorUnavailable) as exc:
            ob.error = str(exc) or "ShowStreams: no answer from a leader within 10s"
            return ob
        leader = self.cluster.leader
        ob.leader = leader.label if leader else "?"
        ob.watching = show.watching
        nodes = await self._node_tasks()
        led = {v: nid for nid, a in nodes.items() for v in a.get("vgroups", [])}
        snode_hosts = {a.get("snode_id"): nid for nid, a in nodes.items() if a.get("snode_id")}
        # Leader's view: task id -> (sid, node); per stream.
        leader_tasks: dict[int, tuple[int, int, int]] = {}
        for info in show.streams:
            sdef = info.stream
            ob.streams += 1
            for row in info.tasks:
                leader_tasks[row.task.task_id] = (sdef.id, row.task.sid, row.task.node_id)
            if sdef.user_stopped:
                ob.user_stopped += 1
                continue
            why = why_not_running(info, led, snode_hosts)
            if why:
                ob.not_running.append(f"{sdef.name}: {why}")
        # The nodes' view.
        holders: dict[int, list[tuple[int, int]]] = {}
        per_stream: dict[int, set[tuple[int, int, int]]] = {}
        for nid, ack in nodes.items():
            for t in ack.get("tasks", []):
                if t.get("status") not in ALIVE:
                    continue
                tid, sid = int(t["task_id"]), int(t["sid"])
                holders.setdefault(tid, []).append((nid, sid))
                per_stream.setdefault(int(t["stream_id"]), set()).add((tid, sid, nid))
                known = leader_tasks.get(tid)
                if known is None:
                    ob.stale.append(f"task {tid} (stream {t['stream_id']}, SID {sid}) on node {nid}: not the "
                                    f"leader's")
                elif sid < known[1]:
                    ob.stale.append(f"task {tid} SID {sid} on node {nid}: the leader's SID is {known[1]}")
        ob.duplicates += [f"task {tid} on nodes {sorted(where)}" for tid, where in sorted(holders.items())
                          if len({nid for nid, _ in where}) > 1]
        for tid, (stream_id, sid, nid) in sorted(leader_tasks.items()):
            if stream_id in self.stopped_ids:
                continue
            if (nid, sid) not in holders.get(tid, []):
                ob.missing.append(f"task {tid} SID {sid} (stream {stream_id}) not alive on node {nid}")
        ob.instances = {s: frozenset(v) for s, v in per_stream.items() if s not in self.stopped_ids}
        self.result.checkpoints.observe(show, nodes, self.stopped_ids)
        return ob

    async def _first_checkpoints(self) -> None:
        """Before the faults, until every running stream has a consensus checkpoint (bounded by the quiesce
        timeout): resumes after the faults then have one to resume from."""
        deadline = time.monotonic() + self.opts.quiesce_timeout
        while time.monotonic() < deadline:
            ob = await self.observe()
            running = [s for s in ob.instances if s not in self.stopped_ids]
            if running and self.result.checkpoints.least_consensus(running) > 0:
                self.say(f"every running stream has a consensus checkpoint "
                         f"({self.result.checkpoints.summary()['checkpoints']} seen)")
                return
            await asyncio.sleep(0.5)
        self.say("not every running stream has a consensus checkpoint yet; faults go on")

    async def _quiesce(self, what: str, since: float | None = None) -> Observation:
        """Observe until quiescent or ``quiesce_timeout``; the last observation."""
        deadline = time.monotonic() + self.opts.quiesce_timeout
        while True:
            ob = await self.observe()
            if ob.quiescent:
                if since is not None:
                    self.note(f"{what}: quiescent after {time.monotonic() - since:.2f}s")
                return ob
            if time.monotonic() > deadline:
                self.say(f"{what}: NOT quiescent within {self.opts.quiesce_timeout:g}s: {ob.brief()}")
                return ob
            self.note(f"{what}: {ob.brief()}")
            await asyncio.sleep(0.25)

    async def _after_fault(self, fault: Fault, before: Observation | None = None) -> Observation:
        ob = await self._quiesce(f"fault #{fault.n} ({fault.kind})", since=fault.t)
        if ob.quiescent:
            fault.recovered_s = time.monotonic() - fault.t
        else:
            self.result.violations.append(f"fault #{fault.n} ({fault.kind}, {fault.what}): not quiescent within "
                                          f"{self.opts.quiesce_timeout:g}s: {ob.brief()}")
        if before is not None:
            ids = set(before.instances) | set(ob.instances)
            fault.adopted = sum(1 for s in ids if before.instances.get(s) == ob.instances.get(s))
            fault.redeployed = len(ids) - fault.adopted
        self.say(f"fault #{fault.n} ({fault.kind}: {fault.what}): "
                 + (f"recovered in {fault.recovered_s:.2f}s" if fault.recovered_s is not None else "NOT recovered")
                 + (f"; {fault.adopted} streams adopted as they ran, {fault.redeployed} redeployed"
                    if before is not None else ""))
        return ob

    # ----- recalculations -------------------------------------------------------------------------------------------
    async def _recalculate(self) -> None:
        """Ask a recalculation of a random running stream (the next fault strikes while it runs)."""
        names = sorted(f"s{i:03d}" for i in range(self.opts.streams) if f"s{i:03d}" not in self.stopped_names)
        if not names:
            return
        name = self.rng.choice(names)
        start = self.rng.randint(0, 10**12)
        req = sp.RecalculateStreamRequest(stream=sp.StreamRef(name=name), from_ms=start, to_ms=start + 3_600_000)
        resp = await self._call("RecalculateStream", req)
        if resp.status.error_code != common_pb2.SUCCESS:
            self.result.violations.append(f"RecalculateStream {name}: {resp.status.reason}")
            return
        self.result.recalcs[resp.recalc.recalc_id] = resp.recalc.stream_id
        self.note(f"recalculation {resp.recalc.recalc_id} of {name} on {resp.recalc.tasks_total} runners")

    async def _check_recalcs(self) -> None:
        """Wait until every recalculation asked is DONE (or the quiesce timeout), then count duplicate runs."""
        res = self.result
        deadline = time.monotonic() + self.opts.quiesce_timeout
        while True:
            try:
                show = await self._call("ShowStreams", sp.ShowStreamsRequest(), timeout=10)
                states = {r.recalc_id: r for info in show.streams for r in info.recalcs}
            except (TimeoutError, CoordinatorUnavailable):
                states = {}
            res.recalcs_not_done = [
                f"recalc {rid} (stream {sid}): " + (f"{sp.RecalcState.Name(states[rid].state)} "
                                                   f"{states[rid].tasks_done}/{states[rid].tasks_total}"
                                                   if rid in states else "not listed")
                for rid, sid in sorted(res.recalcs.items())
                if rid not in states or states[rid].state != sp.RECALC_DONE]
            if not res.recalcs_not_done or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        res.recalc_duplicates = [f"stream {s} recalc {r}: task {t} SID {sid} ran it {n} times"
                                 for (s, r, t, sid), n in sorted(self.recalc_runs.items()) if n > 1]
        self.say(f"recalculations: {len(res.recalcs)} asked, {len(res.recalcs_not_done)} not done, "
                 f"{len(res.recalc_duplicates)} duplicate runs, {sum(self.recalc_runs.values())} runs in all")

    # ----- faults ---------------------------------------------------------------------------------------------------
    async def _run_faults(self) -> None:
        o = self.opts
        plan = (["leader-kill"] * min(o.leader_kills, 1) + ["node-kill"] * o.node_kills
                + ["vgroup-move"] * o.vgroup_moves + ["task-fail"] * (1 if o.task_fails else 0)
                + ["leader-kill"] * max(o.leader_kills - 1, 0))
        for kind in plan:
            n = len(self.result.faults) + 1
            await self._recalculate()
            if kind == "leader-kill":
                await self._leader_kill(n)
            elif kind == "node-kill":
                await self._node_kill(n)
            elif kind == "vgroup-move":
                await self._vgroup_move(n)
            else:
                await self._task_fail(n)

    async def _leader_kill(self, n: int) -> None:
        before = await self.observe()
        leader = await self._wait_leader(60)
        fault = Fault(n, "leader-kill", f"SIGKILL leader {leader.label}", time.monotonic())
        self.result.faults.append(fault)
        old = leader.child
        await self.cluster.kill(leader)
        t_kill = old.killed_at or time.time()
        self.say(f"fault #{n}: SIGKILL coordinator leader {leader.label}")
        new: Member | None
        try:
            new = await wait_until(
                lambda: next((c for c in self.cluster.coordinators if c is not leader and c.state == "leader"
                              and c.state_t >= t_kill and c.running), None), self.cluster.changed, 60)
            fault.note = f"{new.label} leads after {new.state_t - t_kill:.2f}s"
        except TimeoutError:
            self.result.violations.append(f"fault #{n}: no coordinator took over within 60s")
            fault.note = "NO TAKEOVER"
            new = None
        await self._restart_coordinator(leader)
        await self._after_fault(fault, before)
        if new is not None and new.child.log_path is not None:
            with contextlib.suppress(OSError):
                found = _WATCH_ENDED.findall(new.child.log_path.read_text(errors="replace"))
                if found:
                    fault.leader_says_adopted = int(found[-1])

    async def _node_kill(self, n: int) -> None:
        victims = [x for x in self.nodes if x in self.snodes and x.running]
        victim = self.rng.choice(victims)
        fault = Fault(n, "node-kill", f"SIGKILL {victim.label} (node {victim.node_id}, snode, vgroups "
                                      f"{self.vgroups[victim]}); replacement with a new snode", time.monotonic())
        self.result.faults.append(fault)
        await self.cluster.kill(victim)
        self.say(f"fault #{n}: SIGKILL stream node {victim.label} (node {victim.node_id}, hosts an snode)")
        repl = await self._start_node(victim.index, self.vgroups[victim], True, member=victim)
        await self._create_snode(repl)
        fault.note = f"replacement {repl.label} is node {repl.node_id}"
        await self._after_fault(fault)

    async def _vgroup_move(self, n: int) -> None:
        live = [x for x in self.nodes if x.running and self.vgroups[x]]
        src = self.rng.choice(live)
        dst = self.rng.choice([x for x in self.nodes if x.running and x is not src])
        vg = self.rng.choice(self.vgroups[src])
        fault = Fault(n, "vgroup-move", f"vgroup {vg}: {src.label} -> {dst.label}", time.monotonic())
        self.result.faults.append(fault)
        self.say(f"fault #{n}: move vgroup {vg} from {src.label} to {dst.label}")
        a = await src.child.command(f"unlead {vg}")
        b = await dst.child.command(f"lead {vg}")
        if not (a.get("ok") and b.get("ok")):
            self.result.violations.append(f"fault #{n}: vgroup move refused: {a} / {b}")
        self.vgroups[src].remove(vg)
        self.vgroups[dst].append(vg)
        fault.note = f"{len(a.get('readers_left', []))} readers left behind on {src.label}"
        await self._after_fault(fault)

    async def _task_fail(self, n: int) -> None:
        nodes = await self._node_tasks()
        by_node = {x.node_id: x for x in self.nodes if x.running}
        alive = sorted((int(t["task_id"]), nid, str(t["kind"])) for nid, a in nodes.items()
                       for t in a.get("tasks", []) if t.get("status") == "RUNNING" and nid in by_node)
        # Different kinds first (a failed reader is redeployed alone, a failed trigger or runner stops the stream).
        self.rng.shuffle(alive)
        picks: list[tuple[int, int, str]] = []
        for tid, nid, kind in alive:
            if len(picks) < self.opts.task_fails and kind not in {k for _, _, k in picks}:
                picks.append((tid, nid, kind))
        picks += [x for x in alive if x not in picks][:self.opts.task_fails - len(picks)]
        fault = Fault(n, "task-fail", ", ".join(f"{kind.lower()} {tid}" for tid, _, kind in picks),
                      time.monotonic())
        self.result.faults.append(fault)
        self.say(f"fault #{n}: fail tasks {fault.what}")
        acks = await asyncio.gather(*(by_node[nid].child.command(f"fail {tid} drill") for tid, nid, _ in picks))
        refused = [a for a in acks if not a.get("ok")]
        if refused:
            fault.note = f"{len(refused)} refused: {refused[0].get('error')}"
        await self._after_fault(fault)


def render(result: StreamDrillResult) -> str:
    o = result.opts
    lines = [f"\nstream drill, seed {o.seed}: {o.nodes} nodes, {o.snodes} snodes, {o.streams} streams "
             f"({o.stops} stopped by the user), {result.duration_s:.1f}s", ""]
    head = f"{'#':>2}  {'fault':<12} {'recovered':>9}  {'adopted':>7} {'redeployed':>10} {'leader log':>10}  what"
    lines += [head, "-" * len(head)]
    for f in result.faults:
        rec = f"{f.recovered_s:.2f}s" if f.recovered_s is not None else "NO"
        ad = "" if f.adopted is None else str(f.adopted)
        rd = "" if f.redeployed is None else str(f.redeployed)
        ll = "" if f.leader_says_adopted is None else str(f.leader_says_adopted)
        lines.append(f"{f.n:>2}  {f.kind:<12} {rec:>9}  {ad:>7} {rd:>10} {ll:>10}  {f.what}"
                     + (f" ({f.note})" if f.note else ""))
    final = result.final
    lines.append("")
    if final is not None:
        lines.append(f"final: {final.streams} streams ({final.user_stopped} stopped by the user), leader "
                     f"{final.leader}, {'quiescent' if final.quiescent else 'NOT quiescent'}")
        for label, items in (("not running", final.not_running), ("duplicate", final.duplicates),
                             ("stale", final.stale), ("missing", final.missing)):
            lines.append(f"  {label:<12} {len(items)}")
            lines += [f"    {x}" for x in items[:10]]
        if final.error:
            lines.append(f"  error: {final.error}")
    lines.append(f"recalculations: {len(result.recalcs)} asked, {len(result.recalcs_not_done)} not done, "
                 f"{len(result.recalc_duplicates)} duplicate runs")
    lines += [f"    {x}" for x in (result.recalcs_not_done + result.recalc_duplicates)[:10]]
    if result.lag is not None:
        lag = result.lag.summary()
        lines.append(f"lag: p99 {lag['lag_p99_s']}s, max {lag['lag_max_s']}s over {lag['lag_samples']} samples "
                     "(each stream's lag in the leader's ShowStreams every 0.5s, streams without progress left out)")
    ck = result.checkpoints
    lines.append(f"checkpoints: {ck.summary()}")
    lines += [f"  regression: {x}" for x in ck.regressions[:10]]
    lines += [f"  bad resume: {x}" for x in ck.bad_resumes[:10]]
    for v in result.violations:
        lines.append(f"VIOLATION: {v}")
    lines.append("adopted/redeployed (per leader kill): streams whose task instances (task id, SID, node) on the "
                 "nodes were the same before the kill and once quiescent under the new leader / the others; "
                 "'leader log' is the new leader's own 'WATCH ended: N streams adopted'")
    lines.append("RESULT: " + ("FAILED" if result.failed else "every invariant held"))
    return "\n".join(lines)


async def run_streams(opts: StreamDrillOptions, out: Any = None) -> int:
    """Run the drill, print the table and the JSON line; 0 when every invariant held, 1 otherwise, 2 on setup."""
    out = out or sys.stdout
    return await run_and_report(StreamDrill(opts, out), opts, render, out, plan="drill")
