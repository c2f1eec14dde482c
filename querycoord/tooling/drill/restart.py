"""The restart drill: a whole cluster stopped and started again on its data dirs, as processes, several times.

``querycoord drill restart`` starts an embedded etcd, ``--coordinators`` coordinators
(``querycoord coord``) and ``--nodes`` reference query nodes (``querycoord querynode --node-id N``, fixed ids),
creates ``--collections`` collections holding ``--segments`` sealed segments in all and loads the first with
``--replicas`` replicas, the others with one. Then, ``--restarts`` times, it stops every process (etcd, the
coordinators, the nodes) with SIGTERM or SIGKILL in a seeded order (``restart_plan``) and starts them again:
etcd on its data dir and ports, the coordinators on their addresses, the nodes under their ids and addresses
(empty: what a node holds lives in its memory).

All along, every ``--sample-interval`` seconds, it asks the leader (the coordinator whose latest event says it
leads, called directly: a standby answers from etcd) for ShowCollections and GetReplicas, then every node for
its own GetDataDistribution, and judges the pair (``restart_judge``): a collection or replica shown at 100 %
while some target copy is on no answering node of that replica is a false full sample. ``back_whole_s`` of a
restart is the time from the moment every process is down and the drill starts them again (etcd first) until
a sample finds every replica of every collection whole by what the nodes report; ``down`` (from the first
signal until every process is down) is reported beside it: it is bounded by the processes' own shutdown (a
SIGTERMed process whose etcd is gone spends seconds on bounded attempts to revoke its session), not by the
cluster's recovery. Once whole, every running node must be online at the leader (ShowNodes). Once the last
restart is whole and no trigger runs, the FAILED triggers of the task history (ListTasks) are counted.

A table per restart, then one JSON line; exit 1 when the issue's contract fails (``restart_judge.failures``: a
false full sample, a FAILED trigger, a restart never whole within ``--whole-timeout``, back whole later than the
session TTL + 10 s), a process exited on its own, or a running node is not online at the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
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
    stop_task,
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
from querycoord.tooling.drill.options import RestartOptions
from querycoord.tooling.drill.restart_judge import (
    CollectionShown,
    Holding,
    ReplicaShown,
    RoundTally,
    Sample,
    Target,
    failures,
    judge,
    summary,
)
from querycoord.tooling.drill.restart_plan import COORDINATORS, ETCD, NODES, SIGKILL, Round, plan_rounds
from querycoord.tooling.harness import QUERY_NODE, Harness, Member

EC = common_pb2
COORD_FLAGS = ("--scaled",)
CALL_TIMEOUT = 5.0  # one sample's call to the leader or to a node; a node slower than this is "silent"
NODES_ONLINE_TIMEOUT = 30.0  # after a restart is whole, every running node must be online at the leader within this
SLOW_STOP_S = 2.0  # a SIGTERMed process slower than this to exit is noted in the table


@dataclass
class RestartResult:
    opts: RestartOptions
    plan: list[Round]
    rounds: list[RoundTally] = field(default_factory=list)  # the first load (n 0), then one per restart
    failed_triggers: list[str] = field(default_factory=list)
    triggers: int = 0
    unfinished_triggers: list[str] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)  # processes that exited without being stopped by the drill
    unknown_nodes: list[str] = field(default_factory=list)  # live nodes the leader did not list online
    escalated: list[str] = field(default_factory=list)  # SIGTERMed processes that had to be SIGKILLed
    load_s: float | None = None
    duration_s: float = 0.0
    drill_cpu_s: float = 0.0  # this process's own CPU (sampling and judging), beside the cluster on the same cores

    def summary(self) -> dict[str, Any]:
        o = self.opts
        s = summary(self.rounds, ttl=o.ttl, collections=o.collections, segments=o.segments,
                    failed_triggers=len(self.failed_triggers), seed=o.seed)
        s.update({"copies": sum(n * r for n, r in zip(o.segments_of(), o.replicas_of(), strict=True)),
                  "nodes": o.nodes, "coordinators": o.coordinators,
                  "signals": [r.signal for r in self.plan[:s["restarts"]]],
                  "exited_on_their_own": len(self.exited), "unfinished_triggers": len(self.unfinished_triggers),
                  "nodes_not_online": len(self.unknown_nodes),
                  "load_s": None if self.load_s is None else round(self.load_s, 2),
                  "duration_s": round(self.duration_s, 1), "drill_cpu_s": round(self.drill_cpu_s, 1)})
        return s

    def failures(self) -> list[str]:
        out = failures(self.summary(), restarts=self.opts.restarts)
        out += [f"{what} exited on its own" for what in self.exited]
        out += self.unknown_nodes
        return out

    @property
    def failed(self) -> bool:
        return bool(self.failures())


class RestartDrill(ProcessDrill[RestartOptions, RestartResult]):
    """One run (see module docstring); every process is stopped before ``run`` returns."""

    def __init__(self, opts: RestartOptions, out: Any = None):
        super().__init__(opts, out, "querycoord-rdrill-")
        self.plan = plan_rounds(opts.seed, opts.restarts)
        self.result = RestartResult(opts, self.plan)
        self.root = f"drill-restart-{opts.seed}"
        self.client: QueryCoordClient | None = None
        self.coordinators: list[Member] = []
        self.nodes: list[Member] = []
        self.targets: dict[int, Target] = {}
        # node id -> when the loss of its last process could first be seen (drill clock): when it was signalled, or
        # once etcd is back if etcd was down then (a leader learns of a loss from its session); inf until then.
        self.died: dict[int, float] = {}
        self._etcd_down = False
        self.tally = RoundTally(0, 0.0, "first load")
        self.sampled = asyncio.Event()
        self._sampler: asyncio.Task[None] | None = None
        self.reads = DirectReads(CALL_TIMEOUT)
        self._seen_exits: set[int] = set()
        self._stopping = False  # a restart's stop phase runs

    @property
    def etcd_cluster(self) -> EtcdCluster:
        assert self.etcd is not None
        return self.etcd

    # ----- the cluster ----------------------------------------------------------------------------------------------
    async def _start_cluster(self) -> None:
        o = self.opts
        self.say(f"restart drill: seed {o.seed}, {o.restarts} restarts, {o.coordinators} coordinators, {o.nodes} "
                 f"query nodes, {o.collections} collections ({o.segments} segments: "
                 f"{', '.join(f'{n} x{r}' for n, r in zip(o.segments_of(), o.replicas_of(), strict=True))} "
                 f"replicas), TTL {o.ttl:g}s; work dir {self.work}")
        for r in self.plan:
            self.say(f"  restart {r.n}: {r.describe()}")
        self.work.mkdir(parents=True, exist_ok=True)
        self.etcd = EtcdCluster(self.work / "etcd", size=1)
        await asyncio.to_thread(self.etcd.start)
        self.harness = Harness(self.etcd.endpoints, self.root, self.work, ttl=o.ttl, on_event=self._on_event)
        self.coordinators = list(await asyncio.gather(
            *(self.cluster.start_coordinator(i, "127.0.0.1:0", *COORD_FLAGS) for i in range(o.coordinators))))
        self.client = QueryCoordClient([c.address for c in self.coordinators], deadline=60.0, call_timeout=30.0)
        await self._first_leader()
        await self._create_collections()
        self.nodes = list(await asyncio.gather(*(self._start_node(i) for i in range(o.nodes))))
        await wait_nodes_online(self.client, self.nodes, timeout=60)
        self._sampler = asyncio.create_task(self._sample_forever(), name="sampler")
        await self._load()

    def _on_event(self, member: Member, event: dict[str, Any]) -> None:
        if event.get("event") in ("leader", "standby"):
            self.note(f"{member.label} is now {event['event']}")

    async def _start_node(self, index: int, member: Member | None = None) -> Member:
        return await start_fixed_node(self.cluster, index, member=member, say=self.say)

    async def _create_collections(self) -> None:
        o = self.opts
        specs = [(f"restart_{i}", n, r) for i, (n, r) in enumerate(zip(o.segments_of(), o.replicas_of(), strict=True))]
        self.targets = await create_collections(self.etcd_cluster.config(), self.root, specs, partitions=o.partitions,
                                                channels=o.channels)

    async def _load(self) -> None:
        assert self.client is not None
        self.tally.began = self.tally.stopped = self.now()
        self.result.rounds.append(self.tally)
        await load_targets(self.client, self.targets)
        if not await self._wait_whole(self.tally):
            raise DrillSetupError(f"the first load was not whole within {self.opts.whole_timeout:g}s")
        self.result.load_s = self.tally.back_whole_s
        self.say(f"loaded: every replica whole by the nodes' own reports after {self.result.load_s:.2f}s")

    async def _stop_cluster(self) -> None:
        await stop_task(self._sampler)
        await self._stop_processes(None if self.client is None else self.client.close(), self.reads.close())

    # ----- the restarts ---------------------------------------------------------------------------------------------
    async def _drive(self) -> None:
        for rnd in self.plan:
            await self._restart(rnd)
        await self._final()

    async def _restart(self, rnd: Round) -> None:
        self._check_exits()
        tally = RoundTally(rnd.n, self.now(), rnd.describe())
        self.result.rounds.append(tally)
        self.tally = tally
        self.say(f"restart {rnd.n}: {rnd.describe()}")
        sig = signal.SIGKILL if rnd.signal == SIGKILL else signal.SIGTERM
        self._stopping = True  # a node whose etcd went first exits by itself (session lost): that is no fault
        try:
            for group in rnd.stop_order:
                await self._stop_group(group, sig)
        finally:
            self._stopping = False
        tally.stopped = self.now()
        self.note(f"restart {rnd.n}: every process down after {tally.stopped - tally.began:.2f}s")
        await asyncio.to_thread(self.etcd_cluster.restart_member, 0, 60.0)
        self._etcd_down = False
        self.died = {n: self.now() if t == math.inf else t for n, t in self.died.items()}
        self.note(f"restart {rnd.n}: etcd up after {self.now() - tally.began:.2f}s")
        if rnd.start_order == "together":
            await asyncio.gather(self._start_group(COORDINATORS), self._start_group(NODES))
        else:
            first, second = (COORDINATORS, NODES) if rnd.start_order == "coordinators first" else (NODES, COORDINATORS)
            await self._start_group(first)
            await self._start_group(second)
        tally.started = self.now()
        self.note(f"restart {rnd.n}: every process started after {tally.started - tally.began:.2f}s")
        if await self._wait_whole(tally):
            self.say(f"restart {rnd.n}: whole again after {tally.back_whole_s:.2f}s")
        else:
            self.say(f"restart {rnd.n}: NOT whole within {self.opts.whole_timeout:g}s")
        await self._settle(2)
        await self._check_nodes_online(rnd.n)

    async def _stop_group(self, group: str, sig: int) -> None:
        if group == ETCD:
            self._etcd_down = True
            if sig == signal.SIGKILL:
                await asyncio.to_thread(self.etcd_cluster.kill_member, 0)
            else:
                await asyncio.to_thread(self.etcd_cluster.stop)
                proc = self.etcd_cluster.members[0].proc
                if proc is not None and proc.returncode == -signal.SIGKILL:
                    self.result.escalated.append(f"restart {self.tally.n}: etcd")
            return
        members = self.coordinators if group == COORDINATORS else self.nodes
        if sig == signal.SIGKILL or not self.etcd_cluster.members[0].running:
            await asyncio.gather(*(self._stop(m, sig) for m in members))
            return
        # SIGTERM as a deployment stops: standbys before the leader, so no standby takes over from a resigning one
        # (with etcd already down nobody can take over: all at once).
        leader = self.cluster.leader
        await asyncio.gather(*(self._stop(m, sig) for m in members if m is not leader))
        if leader in members:
            await self._stop(leader, sig)

    async def _stop(self, member: Member, sig: int) -> None:
        member.state = "dead"  # stopped by us, not exited on its own
        if member.role == QUERY_NODE:
            self.died[member.node_id] = math.inf if self._etcd_down else self.now()
        began = time.monotonic()
        if sig == signal.SIGKILL:
            await member.child.kill()
        else:
            code = await member.child.stop(self.opts.stop_timeout)
            if code == -signal.SIGKILL:
                self.result.escalated.append(f"restart {self.tally.n}: {member.child.name}")
            took = time.monotonic() - began
            if took > SLOW_STOP_S:
                self.tally.notes.append(f"{member.child.name} took {took:.1f}s to exit on SIGTERM")

    async def _start_group(self, group: str) -> None:
        if group == COORDINATORS:
            await asyncio.gather(*(self._restart_coordinator(c) for c in self.coordinators))
        else:
            await asyncio.gather(*(self._start_node(n.index, member=n) for n in self.nodes))

    async def _restart_coordinator(self, member: Member) -> None:
        await self.cluster.restart_coordinator(member, *COORD_FLAGS, attempts=4, say=self.say)
        assert self.client is not None
        if member.address not in self.client.addresses:
            self.client.addresses.append(member.address)

    async def _wait_whole(self, tally: RoundTally) -> bool:
        """Until a sample finds every collection whole (``tally.whole_at``), or ``--whole-timeout`` after the
        round began."""
        deadline = time.monotonic() + self.opts.whole_timeout - (self.now() - tally.began)
        while tally.whole_at is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sampled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.sampled.wait(), min(left, 1.0))
        return True

    async def _check_nodes_online(self, n: int) -> None:
        """Every running node is online at the leader (a node the leader lost track of would never be used
        again, even where a replica needs it); bounded wait, since a node may have only just registered."""
        assert self.client is not None
        want = {m.node_id for m in self.nodes if m.running}
        deadline = time.monotonic() + NODES_ONLINE_TIMEOUT
        online: set[int] = set()
        while time.monotonic() < deadline:
            with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
                resp = await self.client.query("ShowNodes", qc.ShowNodesRequest())
                online = {x.node_id for x in resp.nodes if x.state == "online"}
                if want <= online:
                    return
            await asyncio.sleep(0.5)
        what = (f"restart {n}: running query nodes {sorted(want - online)} not online at the leader after "
                f"{NODES_ONLINE_TIMEOUT:g}s")
        self.result.unknown_nodes.append(what)
        self.say(what)

    async def _settle(self, samples: int) -> None:
        """A few more samples of the cluster as it is (a figure must stay true once whole, too)."""
        for _ in range(samples):
            self.sampled.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.sampled.wait(), 10 * self.opts.sample_interval + CALL_TIMEOUT)

    async def _final(self) -> None:
        """Wait (bounded) until no trigger runs, then count the FAILED triggers of the task history."""
        assert self.client is not None
        self.result.drill_cpu_s = time.process_time()
        self._check_exits()
        deadline = time.monotonic() + self.opts.whole_timeout
        running: list[str] = []
        while time.monotonic() < deadline:
            try:
                resp = await self.client.query("ListTasks", qc.ListTasksRequest(limit=100))
            except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                running = [f"no leader answered ListTasks: {exc}"]
            else:
                running = [f"{t.trigger.task_id} {t.trigger.summary}" for t in resp.trees]
                if not running:
                    break
            await asyncio.sleep(0.5)
        self.result.unfinished_triggers = running
        try:
            async for t in finished_trees(self.client):
                self.result.triggers += 1
                if t.trigger.state == qc.TASK_STATE_FAILED:
                    self.result.failed_triggers.append(failed_text(t))
        except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
            self.result.failed_triggers.append(f"the task history could not be read: {exc}")

    def _check_exits(self) -> None:
        for m in new_exits(self.cluster.members, self._seen_exits):
            if self._stopping:
                continue
            what = exit_text(m)
            self.result.exited.append(what)
            self.say(f"{what} exited on its own")

    # ----- sampling -------------------------------------------------------------------------------------------------
    async def _sample_forever(self) -> None:
        while True:
            started = time.monotonic()
            tally = self.tally
            try:
                sample = await self._sample()
            except Exception as exc:  # a sample that cannot be taken is skipped, never the drill
                self.note(f"sample failed: {exc!r}")
            else:
                verdict = judge(sample, self.targets, self.died, self.opts.grace_s)
                tally.add(sample, verdict)
                for text in verdict.false_full[:1]:
                    self.say(f"FALSE FULL at {sample.asked:.2f}s ({sample.leader}): {text}")
                for text in verdict.excused[:1]:
                    self.note(f"excused at {sample.asked:.2f}s: {text}")
                self.sampled.set()
            self._check_exits()
            await asyncio.sleep(max(0.0, self.opts.sample_interval - (time.monotonic() - started)))

    async def _sample(self) -> Sample:
        sample = Sample(asked=self.now(), read=0.0)
        leader = self.cluster.leader
        if leader is not None and leader.address:
            shown = await self._ask_leader(self.reads.channel(leader, leader.address))
            if shown is not None:
                sample.leader, sample.shown = leader.label, shown
        # The nodes after the leader: what they hold now is what they held when it answered, or more.
        answers = await asyncio.gather(*(self.reads.holding(n) for n in self.nodes))
        for node, answer in zip(self.nodes, answers, strict=True):
            if isinstance(answer, Holding):
                sample.holdings[node.node_id] = answer
            elif answer == SILENT:
                sample.silent |= {node.node_id}
        sample.read = self.now()
        return sample

    async def _ask_leader(self, channel: grpc.aio.Channel) -> dict[int, CollectionShown] | None:
        """The leader's figures of every target collection; None when it did not answer them all."""
        stub = querycoord_pb2_grpc.QueryCoordStub(channel)
        try:
            show = await stub.ShowCollections(qc.ShowCollectionsRequest(), timeout=CALL_TIMEOUT)
            if show.status.error_code != EC.SUCCESS:
                return None
            pct = {c.collection_id: int(c.in_memory_percentage) for c in show.collections}
            cids = [cid for cid in self.targets if cid in pct]
            reps = await asyncio.gather(*(stub.GetReplicas(qc.GetReplicasRequest(collection_id=cid),
                                                           timeout=CALL_TIMEOUT) for cid in cids))
        except grpc.aio.AioRpcError:
            return None
        if any(r.status.error_code != EC.SUCCESS for r in reps):
            return None
        return {cid: CollectionShown(pct[cid], tuple(ReplicaShown(x.replica_id, frozenset(x.node_ids),
                                                                  int(x.in_memory_percentage)) for x in r.replicas))
                for cid, r in zip(cids, reps, strict=True)}


def render(result: RestartResult) -> str:
    o = result.opts
    bound = o.ttl + 10
    lines = ["", f"restart drill, seed {o.seed}: {o.collections} collections, {o.segments} segments, {o.nodes} "
                 f"query nodes, {o.coordinators} coordinators, TTL {o.ttl:g}s (back whole within TTL + 10 s = "
                 f"{bound:g}s), {result.duration_s:.1f}s", ""]
    head = (f"{'#':>2}  {'restart':<62} {'down':>6} {'up':>6} {'back whole':>10}  {'samples':>7} {'leader':>6} "
            f"{'false full':>10} {'excused':>7} {'unclear':>7}")
    lines += [head, "-" * len(head)]
    for r in result.rounds:
        back = "-" if r.back_whole_s is None else f"{r.back_whole_s:.2f}s"
        if r.n and r.back_whole_s is None:
            back = "NEVER"
        elif r.n and r.back_whole_s is not None and r.back_whole_s > bound:
            back += " !"
        down = f"{r.down_s:.1f}s" if r.n and r.down_s is not None else ""
        up = f"{r.started - r.stopped:.1f}s" if r.started is not None and r.stopped is not None else ""
        lines.append(f"{r.n:>2}  {r.what[:62]:<62} {down:>6} {up:>6} {back:>10}  {r.samples:>7} {r.answered:>6} "
                     f"{r.false_full_samples:>10} {r.excused_samples:>7} {r.inconclusive_samples:>7}")
        lines += [f"      {x}" for x in r.false_full + r.notes]
    lines.append("")
    lines.append(f"triggers in the task history: {result.triggers}, FAILED: {len(result.failed_triggers)}")
    lines += [f"  {x}" for x in result.failed_triggers[:10]]
    if result.unfinished_triggers:
        lines.append(f"still running at the end: {len(result.unfinished_triggers)}")
        lines += [f"  {x}" for x in result.unfinished_triggers[:5]]
    for what in result.escalated:
        lines.append(f"ignored SIGTERM for {o.stop_timeout:g}s (SIGKILLed): {what}")
    lines += ["down: from a restart's first signal until every process was down; up: from then (the drill starts "
              "etcd, then the others) until every process was started again; back whole: from then until every "
              "replica of every collection holds every target segment and DM channel, as the nodes report",
              "false full: the leader shows 100 % for a collection or replica that its nodes do not hold; excused: a "
              f"node it rests on was lost less than {o.grace_s:g}s before (with etcd up); unclear: a node it rests "
              f"on did not answer within {CALL_TIMEOUT:g}s"]
    lines += verdict_lines(result.failures(), "every invariant held")
    return "\n".join(lines)


async def run_restart(opts: RestartOptions, out: Any = None) -> int:
    """Run the drill, print the table and the JSON line; 0 when every invariant held, 1 otherwise, 2 on setup."""
    out = out or sys.stdout
    return await run_and_report(RestartDrill(opts, out), opts, render, out, plan="plan")


__all__ = ["RestartDrill", "RestartResult", "render", "run_restart"]
