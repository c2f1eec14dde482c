"""The chaos drill's cluster and its faults: every link through a proxy, every fault the plan injects.

Each coordinator's and each node's link to etcd goes through a TCP proxy (``proxy``; the process gets the
proxy's address as its etcd endpoint), and so do the coordinators' links to each node (the node advertises its
proxy's address in its session, ``--advertise``), so a fault can cut, blackhole or stall any of them. The faults
(``chaos_ops.FaultKind``): the leader SIGKILLed or SIGSTOPped past its session TTL, the leader or a standby cut
off from etcd, query nodes killed, added, cut off from etcd or from the coordinators; with ``--capacity tight``
also a query node SIGKILLed and started again under its fixed ``--node-id`` (every node has one then), and the
whole cluster restarted: every coordinator and node SIGKILLed, etcd stopped, then all started again on their
data dirs and ids.

Every fault is a *window* (``samples.Disturbances``) from its injection until it healed, plus the time a lost
session takes to lapse and be seen: the continuous invariants do not count waits inside one (a unit cannot be
repaired while no leader leads, a release cannot finish while its node is cut off).

The processes are the cluster harness's (``querycoord.tooling.harness``), driven as in the failover drill
(``FailoverDrill``: leader kills with restart, the supervisor that replaces nodes exiting on their own, the
replica observations); ``chaos`` adds the clients, the requests, the oracle and the checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from querycoord.net.client import QueryCoordClient
from querycoord.settings.config import SchedulerConfig
from querycoord.tooling.drill.activity import FaultRecord
from querycoord.tooling.drill.chaos_ops import Fault
from querycoord.tooling.drill.failover import FailoverDrill
from querycoord.tooling.drill.failover_base import direct_address
from querycoord.tooling.drill.failover_records import ReplicaObservation
from querycoord.tooling.drill.options import MIB, ChaosOptions, DrillOptions
from querycoord.tooling.drill.proxy import TcpProxy
from querycoord.tooling.drill.samples import Disturbances
from querycoord.tooling.harness import QUERY_NODE, Member, StartError

#: With ``--capacity tight`` query node ``n<i>`` runs under the fixed id ``FIXED_ID_BASE + i``.
FIXED_ID_BASE = 1000


@dataclass
class FaultCounts:
    """The faults that happened (the JSON line's counts)."""

    leader_kills: int = 0
    node_kills: int = 0
    partitions: int = 0  # link faults through a proxy
    node_restarts: int = 0
    cluster_restarts: int = 0


class ChaosCluster(FailoverDrill):
    """The processes, proxies and faults of one chaos run (see module docstring)."""

    def __init__(self, opts: ChaosOptions, out: Any = None):
        opts.validate()
        self.copts = opts
        work = opts.work_dir or tempfile.mkdtemp(prefix="querycoord-chaos-")
        super().__init__(DrillOptions(
            coordinators=opts.coordinators, nodes=opts.nodes, replicas=opts.replicas, collections=opts.collections,
            kills=0, seed=opts.seed,
            ttl=opts.ttl, segments_per_collection=opts.segments_per_collection, partitions=opts.partitions,
            pauses=0, node_kills=0, ops=1, node_latency_ms=opts.node_latency_ms,
            client_deadline=opts.client_deadline, quiesce_timeout=opts.quiesce_timeout, work_dir=work,
            keep=opts.keep, verbose=opts.verbose), out)
        self.root = f"chaos-{opts.seed}"
        self.counts = FaultCounts()
        self.clients: list[QueryCoordClient] = []
        self.coord_proxies: dict[int, TcpProxy] = {}
        self.node_proxies: dict[int, tuple[TcpProxy, TcpProxy]] = {}  # node id -> (to etcd, from coordinators)
        self._next_node_index = opts.nodes
        self._phase = -1
        self.disturbances = Disturbances()
        # How long after a fault healed its effects may still be seen: a lost session lapses (TTL), and the
        # leader sees it a moment later.
        self.tail = opts.ttl + 1.0
        self._rebirths: list[tuple[float, int]] = []  # (drill seconds, node id): killed or back under its id
        self._whole = asyncio.Event()  # cleared while the whole cluster restarts: other faults wait
        self._whole.set()

    # ----- processes --------------------------------------------------------------------------------------------
    def _coordinator_flags(self) -> list[str]:
        # The scheduler's own wait interval (not the preset's): the chaos drill was tuned with it.
        return [*super()._coordinator_flags(), "--rpc-timeout", f"{self.copts.rpc_timeout:g}",
                "--wait-interval", f"{SchedulerConfig.wait_interval:g}",
                "--checker-interval", f"{self.copts.checker_interval:g}"]

    async def _coordinator_etcd(self, index: int) -> str:
        """The coordinator's own proxy to etcd, kept across its restarts."""
        assert self.etcd is not None
        proxy = self.coord_proxies.get(index)
        if proxy is None:
            proxy = self.coord_proxies[index] = await TcpProxy(self.etcd.endpoints[0], name=f"c{index}-etcd").start()
        return proxy.address

    async def _start_node(self, index: int, member: Member | None = None, node_id: int | None = None) -> Member:
        """``querycoord querynode`` behind two proxies: its etcd endpoint, and the address it advertises. Under
        ``node_id`` (with ``--capacity tight`` always: ``FIXED_ID_BASE + index``), else an id from etcd."""
        assert self.etcd is not None
        fixed = node_id if node_id is not None else (FIXED_ID_BASE + index if self.copts.tight else None)
        generation = 0 if member is None else member.generation + 1
        old = self.node_proxies.pop(fixed, None) if fixed is not None else None
        for p in old or ():
            await p.close()
        to_etcd = await TcpProxy(self.etcd.endpoints[0], name=f"n{index}.{generation}-etcd").start()
        link = await TcpProxy(name=f"n{index}.{generation}-link").start()  # target known once the node listens
        flags = ["--capacity-mb", f"{self.copts.node_memory / MIB:g}", "--latency-ms",
                 f"{self.opts.node_latency_ms:g}", "--advertise", link.address,
                 *(("--node-id", str(fixed)) if fixed is not None else ())]
        try:
            node = await self.cluster.start_node(QUERY_NODE, index, *flags, member=member, etcd=to_etcd.address)
        except StartError:
            await to_etcd.close()
            await link.close()
            raise
        # The drill itself reads the node's distribution directly (``direct_address``), never through the proxy
        # it may cut.
        link.set_target(direct_address(node))
        self.node_proxies[node.node_id] = (to_etcd, link)
        if fixed is not None and member is not None:
            self._rebirths.append((self.now(), fixed))
        return node

    async def _restart_coordinator(self, member: Member) -> None:
        await super()._restart_coordinator(member)
        for c in self.clients:
            if member.address not in c.addresses:
                c.addresses.append(member.address)

    async def _replace_node(self, node: Member, rec: FaultRecord) -> None:
        """The supervisor's replacement of a node that exited on its own is a fault window too."""
        window = self.disturbances.open(self.now())
        try:
            await super()._replace_node(node, rec)
        finally:
            self.disturbances.close(window, self.now() + self.tail)

    async def _stop_cluster(self) -> None:
        for p in self._all_proxies():
            p.heal()  # coordinators resign and nodes revoke their sessions on SIGTERM: through their links
        for c in self.clients:
            with contextlib.suppress(Exception):
                await c.close()
        try:
            await super()._stop_cluster()
        finally:
            for p in self._all_proxies():
                with contextlib.suppress(Exception):
                    await p.close()

    def _all_proxies(self) -> list[TcpProxy]:
        return [*self.coord_proxies.values(), *(p for pair in self.node_proxies.values() for p in pair)]

    async def _close_dead_proxies(self) -> None:
        live = {n.node_id for n in self.nodes}
        for nid in [nid for nid in self.node_proxies if nid not in live]:
            for p in self.node_proxies.pop(nid):
                await p.close()

    def _heal_all(self) -> None:
        for p in self._all_proxies():
            p.heal()

    def _usable_nodes(self) -> list[Member]:
        """Nodes a fault may hit: running, not being replaced or restarted."""
        return [n for n in self.nodes if n.running and n.index not in self._replacing] or list(self.nodes)

    # ----- faults -----------------------------------------------------------------------------------------------
    async def _inject(self, f: Fault, t0: float) -> None:
        await asyncio.sleep(max(0.0, t0 + f.at_s - time.monotonic()))
        if f.kind != "cluster_restart":
            await self._whole.wait()
        window = self.disturbances.open(self.now())
        try:
            await self._fault(f)
        except TimeoutError:
            self.say(f"fault {f.kind}: no leader to hit within 30s; skipped")
        except StartError as exc:  # a node to add did not start: the drill's trouble, not the cluster's
            self.say(f"fault {f.kind}: could not be injected: {str(exc).splitlines()[0]}")
        finally:
            self.disturbances.close(window, self.now() + self.tail)

    def _record_fault(self, what: str) -> FaultRecord:
        rec = FaultRecord(self.now(), what)
        self.result.faults.append(rec)
        self.say(what)
        return rec

    def _partition(self, proxy: TcpProxy, f: Fault, what: str) -> None:
        if f.kind.endswith("_stall"):
            proxy.stall()
        else:
            proxy.cut(blackhole=f.blackhole)
        self.counts.partitions += 1
        self._record_fault(f"{f.kind}: {what} ({proxy.name} {proxy.mode}{' blackhole' if f.blackhole else ''}) "
                           f"for {f.hold_s:.2f}s")

    async def _fault(self, f: Fault) -> None:
        kind = f.kind
        if kind == "leader_kill":
            await self._settle_kill()
            before = len(self.result.kills)
            await self._kill_leader(f"phase {self._phase}")
            self.counts.leader_kills += len(self.result.kills) - before
            await self._settle_kill()  # the fault (its window) lasts until another leads and the old one is back
        elif kind == "leader_pause":
            leader = await self._wait_leader(timeout=30)
            leader.child.signal(signal.SIGSTOP)
            rec = self._record_fault(f"leader_pause: SIGSTOP leader {leader.label} for {f.hold_s:.2f}s "
                                     f"(TTL {self.opts.ttl:g}s)")
            try:
                await asyncio.sleep(f.hold_s)
            finally:
                leader.child.signal(signal.SIGCONT)
            rec.note = "SIGCONT"
        elif kind in ("leader_etcd_cut", "leader_etcd_stall"):
            leader = await self._wait_leader(timeout=30)
            proxy = self.coord_proxies[leader.index]
            self._partition(proxy, f, f"leader {leader.label} cut off from etcd, still reaching the nodes")
            await self._hold(proxy, f.hold_s)
        elif kind == "standby_etcd_cut":
            current = self.cluster.leader
            standbys = [c for c in self.coords if c is not current and c.running]
            if not standbys:
                return
            standby = standbys[f.slot % len(standbys)]
            proxy = self.coord_proxies[standby.index]
            self._partition(proxy, f, f"standby {standby.label} cut off from etcd")
            await self._hold(proxy, f.hold_s)
        elif kind == "node_kill" and len(self.nodes) > self.copts.min_nodes:
            await self._kill_node_for_good(f.slot)
        elif kind in ("node_kill", "node_add"):
            if len(self.nodes) < self.copts.max_nodes:
                await self._add_node()
        elif kind == "node_etcd_cut":
            nodes = self._usable_nodes()
            node = nodes[f.slot % len(nodes)]
            proxy = self.node_proxies[node.node_id][0]
            self._partition(proxy, f, f"node {node.node_id} cut off from etcd")
            await self._hold(proxy, f.hold_s)
        elif kind in ("node_link_cut", "node_link_stall"):
            nodes = self._usable_nodes()
            node = nodes[f.slot % len(nodes)]
            proxy = self.node_proxies[node.node_id][1]
            self._partition(proxy, f, f"coordinators cut off from node {node.node_id}")
            await self._hold(proxy, f.hold_s)
        elif kind == "node_restart":
            await self._restart_node(f)
        elif kind == "cluster_restart":
            await self._restart_cluster(f)

    @staticmethod
    async def _hold(proxy: TcpProxy, hold_s: float) -> None:
        try:
            await asyncio.sleep(hold_s)
        finally:
            proxy.heal()

    async def _kill_node_for_good(self, slot_index: int) -> None:
        """SIGKILL a query node without replacing it: the leader forgets its copies and the checker loads them
        again where there is room (or parks them)."""
        node = self.nodes[slot_index % len(self.nodes)]
        while node.index in self._replacing:  # the supervisor is replacing it: kill the replacement
            await asyncio.sleep(0.1)
            node = self.nodes[slot_index % len(self.nodes)]
        await self._observe_replicas(f"node {node.node_id} kill")
        self.nodes.remove(node)
        await self.cluster.kill(node)
        self.counts.node_kills += 1
        self._record_fault(f"node_kill: SIGKILL node {node.node_id} ({node.label}); {len(self.nodes)} nodes left")

    async def _add_node(self) -> None:
        index = self._next_node_index
        self._next_node_index += 1
        node = await self._start_node(index)
        self.nodes.append(node)
        self._record_fault(f"node_add: node {node.node_id} (n{index}) started; {len(self.nodes)} nodes")

    async def _start_again(self, node: Member, node_id: int) -> None:
        """``node``'s slot under ``node_id`` again; a few attempts (etcd may be coming back)."""
        for attempt in range(1, 4):
            try:
                await self._start_node(node.index, member=node, node_id=node_id)
                return
            except StartError:
                if attempt == 3:
                    raise
                await asyncio.sleep(1.0)

    async def _restart_node(self, f: Fault) -> None:
        """SIGKILL a query node and start it again under its id after ``hold_s``: the new process waits for the
        old session to lapse, then registers a new incarnation that holds nothing."""
        nodes = self._usable_nodes()
        node = nodes[f.slot % len(nodes)]
        self._replacing.add(node.index)
        try:
            old = node.node_id
            await self._observe_replicas(f"node {old} restart")
            await self.cluster.kill(node)
            self._rebirths.append((self.now(), old))
            rec = self._record_fault(f"node_restart: SIGKILL node {old} ({node.label}), back under its id after "
                                     f"{f.hold_s:.2f}s")
            await asyncio.sleep(f.hold_s)
            await self._start_again(node, old)
            self.counts.node_restarts += 1
            rec.note = f"node {old} back as {node.label}"
            self.note(f"node_restart: {rec.note}")
        finally:
            self._replacing.discard(node.index)

    async def _restart_cluster(self, f: Fault) -> None:
        """Every coordinator and query node SIGKILLed, etcd stopped; ``hold_s`` later etcd starts on its data dir,
        then every node under its id and every coordinator. SIGTERM for etcd: its own crash safety is not what
        the drill is about (etcd 3.5.0 to 3.5.2 had a data-inconsistency-on-crash bug)."""
        assert self.etcd is not None
        self._whole.clear()
        nodes: list[Member] = []
        try:
            await self._settle_kill()
            while self._replacing:
                await asyncio.sleep(0.1)
            nodes = list(self.nodes)
            coords = list(self.coords)
            self._replacing |= {n.index for n in nodes}
            await self._observe_replicas("cluster restart")
            await asyncio.gather(*(self.cluster.kill(m) for m in [*coords, *nodes]))
            ids = {n.index: n.node_id for n in nodes}
            for nid in ids.values():
                self._rebirths.append((self.now(), nid))
            self._etcd_down.add(0)
            await asyncio.to_thread(self.etcd.stop_member, 0)
            rec = self._record_fault(f"cluster_restart: SIGKILL {len(coords)} coordinators and nodes "
                                     f"{sorted(ids.values())}, etcd stopped, for {f.hold_s:.2f}s")
            await asyncio.sleep(f.hold_s)
            await asyncio.to_thread(self.etcd.restart_member, 0, 60.0)
            self._etcd_down.discard(0)
            await asyncio.gather(*(self._start_again(n, ids[n.index]) for n in nodes),
                                 *(self._restart_coordinator(c) for c in coords))
            leader = await self._wait_leader(timeout=60)
            self.counts.cluster_restarts += 1
            rec.note = f"back; {leader.label} leads"
            self.say(f"cluster_restart: {rec.note}")
        finally:
            self._etcd_down.discard(0)
            self._replacing -= {n.index for n in nodes}
            self._whole.set()

    # ----- replicas over time (``FailoverDrill._judge_replicas``) -------------------------------------------------
    def _current_phase(self) -> int:
        return self._phase

    def _reborn_between(self, a: ReplicaObservation, b: ReplicaObservation) -> set[int]:
        return {n for t, n in self._rebirths if a.t0 <= t <= b.t1}


__all__ = ["FIXED_ID_BASE", "ChaosCluster", "FaultCounts"]
