"""The continuous sampler: what the leader shows, against what the nodes themselves hold.

Every ``interval`` seconds, for the whole run (faults, quiet spells and checks alike), one sample:

1. the query node sessions registered in etcd (read directly, never through a proxy the drill cuts);
2. every node's own report of what it holds and the catalog's target;
3. the leader's ShowCollections, GetReplicas of every collection it lists, ShowCollections again;
4. the nodes and the catalog once more.

A copy counts as held when a node reported it in either read, and a target copy only when the catalog had it
in both: whatever the leader answered in between, it answered about that state or one in the middle (a copy a
node loads and releases between two reads a second apart, or a segment the catalog gains and loses, is beyond
what one sample can tell and is not judged). A GetReplicas answer is judged only when both ShowCollections
answers list its collection with the same partitions (a partition released in between would be judged as still
wanted). ``samples`` judges the sample: false full answers, units that could be placed and are not held (with
the calm the fault windows leave), units waiting for room. A leader that changed between two samples (or none)
opens a fault window of its own.

Where the data comes from is a ``Sources``: the chaos drill's (``DrillSources``: etcd, each node process's
``GetDataDistribution`` at its direct address, a followed copy of the catalog, the leader's gRPC), or the
tests' in-process cluster (tests/truth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc

from meta.errors import MetaError
from meta.kv import MetaKV
from meta.session import role_prefix
from proto import common_pb2, querycoord_pb2_grpc, querynode_pb2, querynode_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.catalog.targets import CatalogTargets
from querycoord.common.protocol import QUERYNODE_ROLE
from querycoord.security.grpc_channels import make_channel
from querycoord.tooling.drill.invariants import NodeView, node_view
from querycoord.tooling.drill.placement import NO_ROOM, PLACEABLE, Room, TargetView, Unit, units_of, weigh
from querycoord.tooling.drill.samples import (
    Disturbances,
    RoomWaits,
    Sessions,
    Shown,
    UnitClock,
    false_full,
    replicas_from,
    shown_from,
)

CALL_TIMEOUT = 3.0

#: The catalog as a sample reads it: collection -> (segment id -> (partition, size), DM channels).
Catalog = dict[int, tuple[dict[int, tuple[int, int]], frozenset[str]]]
#: What nodes report: node id -> (what it holds, its memory).
Reports = dict[int, tuple[NodeView, Room]]
Ask = Callable[[str, Any], Awaitable[Any]]


class Sources(Protocol):
    """Where a sample's data comes from (module docstring)."""

    def leader(self) -> str | None:
        """Who leads now (for telling a leader change), None when nobody does."""

    async def sessions(self) -> dict[int, int]:
        """node id -> create revision of its registered session."""

    async def reports(self) -> Reports:
        """Each reachable node's own report (a node that does not answer is left out: unknown)."""

    async def catalog(self) -> Catalog:
        """The catalog's targets now."""

    async def ask(self, method: str, request: Any) -> Any:
        """The leader's answer to a QueryCoord call; None when it did not answer SUCCESS."""


async def leader_answers(ask: Ask) -> list[Shown] | None:
    """ShowCollections, GetReplicas of each collection it lists, ShowCollections again (module docstring)."""

    async def show() -> list[Shown] | None:
        r = await ask("ShowCollections", qc.ShowCollectionsRequest())
        return None if r is None else [shown_from(info) for info in r.collections]

    first = await show()
    if first is None:
        return None
    got = await asyncio.gather(*(ask("GetReplicas", qc.GetReplicasRequest(collection_id=s.collection_id))
                                 for s in first))
    second = await show()
    if second is None:
        return None
    parts = {s.collection_id: s.partitions for s in first}
    same = {s.collection_id: s.partitions for s in second if parts.get(s.collection_id) == s.partitions}
    out = [*first, *second]
    for s, r in zip(first, got, strict=True):
        if r is not None and s.collection_id in same:
            out.append(Shown(s.collection_id, -1, same[s.collection_id], replicas_from(r.replicas), "GetReplicas"))
    return out


def target_of(cid: int, partitions: AbstractSet[int], a: Catalog, b: Catalog) -> TargetView | None:
    """The target both catalog reads agree on, over the loaded ``partitions``."""
    if cid not in a or cid not in b:
        return None
    segs_a, chans_a = a[cid]
    segs_b, chans_b = b[cid]
    keep = {sid: size for sid, (pid, size) in segs_b.items() if sid in segs_a and pid in partitions}
    return TargetView(keep, chans_a & chans_b)


def merged(*reads: Reports) -> tuple[dict[int, NodeView | None], dict[int, Room]]:
    """What each node held in any of ``reads``, and its latest room."""
    views: dict[int, NodeView | None] = {}
    rooms: dict[int, Room] = {}
    for reads_ in reads:
        for n, (view, room) in reads_.items():
            v = views.get(n) or NodeView()
            v.segments.update(view.segments)
            v.dm_channels |= view.dm_channels
            views[n] = v
            rooms[n] = room
    return views, rooms


@dataclass
class SampleStats:
    samples: int = 0
    judged: int = 0  # samples in which a leader answered
    false_full_samples: int = 0
    false_full: list[str] = field(default_factory=list)  # findings, the first ones
    room_units: set[tuple[int, int]] = field(default_factory=set)  # units seen waiting for room
    errors: int = 0


class Sampler:
    """Samples until stopped (module docstring); ``stats``, ``clock``, ``waits`` hold what it found."""

    def __init__(self, sources: Sources, *, now: Callable[[], float], disturbances: Disturbances | None = None,
                 interval: float = 1.0, leader_tail: float = 3.0, say: Callable[[str], None] | None = None):
        self.sources = sources
        self.now = now
        self.disturbances = disturbances or Disturbances()
        self.interval = interval
        self.leader_tail = leader_tail
        self.say = say or (lambda _text: None)
        self.sessions = Sessions()
        self.clock = UnitClock()
        self.waits = RoomWaits()
        self.stats = SampleStats()
        self._last_leader: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.wait_for(self.sample_once(), 30)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a sample that could not be taken is skipped, never the run
                self.stats.errors += 1
                if self.stats.errors <= 5:
                    self.say(f"sampler: a sample failed ({exc!r}); skipped")

    async def sample_once(self) -> list[str]:
        """One sample (module docstring); returns its false full findings."""
        src = self.sources
        t0 = self.now()
        self.stats.samples += 1
        address = src.leader()
        if address != self._last_leader:
            self.disturbances.add(t0, t0 + self.leader_tail)
            self._last_leader = address
        try:
            self.sessions.observe(t0, await src.sessions())
            before = await src.reports()
            cat_before = await src.catalog()
        except (MetaError, TimeoutError, OSError):
            self.disturbances.add(t0, self.now() + self.leader_tail)  # etcd itself is away (a cluster restart)
            return []
        answers = await leader_answers(src.ask) if address else None
        t1 = self.now()
        if answers is None:
            self.disturbances.add(t0, t1 + self.leader_tail)
            return []
        after = await src.reports()
        try:
            cat_after = await src.catalog()
        except (MetaError, TimeoutError, OSError):
            return []
        self.stats.judged += 1
        return self._judge(t0, t1, answers, merged(before, after), cat_before, cat_after)

    def _judge(self, t0: float, t1: float, answers: list[Shown],
               held: tuple[dict[int, NodeView | None], dict[int, Room]], cat_before: Catalog,
               cat_after: Catalog) -> list[str]:
        views, rooms = held
        views = {**views, **dict.fromkeys(self.sessions.unsure_at(t1))}  # new incarnations: not yet judged
        online = self.sessions.online_at(t1)
        found: list[str] = []
        units: list[Unit] = []
        registered = set(self.sessions.present)  # a unit with a node that did not report is not weighed
        weighed: set[int] = set()
        for shown in answers:
            target = target_of(shown.collection_id, shown.partitions, cat_before, cat_after)
            if target is None:
                continue
            found += false_full(shown, target, views, online)
            if shown.surface == "ShowCollections" and shown.collection_id not in weighed:
                weighed.add(shown.collection_id)
                units += units_of(shown.collection_id, target, {r.replica_id: r.node_ids for r in shown.replicas},
                                  registered, views)[0]
        if found:
            self.stats.false_full_samples += 1
            for f in found:
                line = f"at {t1:.1f}s: {f}"
                if len(self.stats.false_full) < 40:
                    self.stats.false_full.append(line)
                self.say(f"FALSE FULL {line}")
        verdicts = weigh(units, rooms)
        what = {u.key: u.lack.describe() for u in units}
        for detail in self.clock.observe(t1, verdicts, self.disturbances.calm_since(t0), what):
            self.say(f"BLOCKED UNIT {detail}")
        waiting = sorted(key for key, verdict in verdicts.items() if verdict == NO_ROOM)
        self.stats.room_units.update(waiting)
        if waiting:  # one wait per sample is enough to tell a release that waited on one
            cid, rid = waiting[0]
            self.waits.add(t1, f"replica {rid} of collection {cid} lacks {what[(cid, rid)]}"
                               + (f" (and {len(waiting) - 1} more units)" if len(waiting) > 1 else ""))
        return found

    async def unplaceable(self, loaded: Mapping[int, tuple[AbstractSet[int], Mapping[int, AbstractSet[int]]]]
                          ) -> dict[tuple[int, int], str]:
        """The units that lack copies and cannot be placed now, with why, from fresh reads; ``loaded``: per
        collection its loaded partitions and its replicas (id -> nodes). For a quiescent check, where such units
        are excused from "every copy in each replica" (``invariants.check``)."""
        src = self.sources
        registered = set(await src.sessions())
        views, rooms = merged(await src.reports())
        snap = await src.catalog()
        units: list[Unit] = []
        for cid, (partitions, replicas) in sorted(loaded.items()):
            target = target_of(cid, partitions, snap, snap)
            if target is not None:
                units += units_of(cid, target, replicas, registered, views)[0]
        verdicts = weigh(units, rooms)
        what = {u.key: u.lack.describe() for u in units}
        return {k: f"{v} (lacks {what[k]})" for k, v in verdicts.items() if v != PLACEABLE}


# ----- the drill's sources ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeHandle:
    """A query node process the drill runs: its id, where the drill reaches it directly, whether it runs."""

    node_id: int
    address: str
    running: bool


async def registered_sessions(kv: MetaKV) -> dict[int, int]:
    """node id -> create revision of every registered query node session."""
    prefix = role_prefix(QUERYNODE_ROLE)
    snap = await kv.load_prefix(prefix)
    out: dict[int, int] = {}
    for item in snap.kvs:
        tail = item.key[len(prefix):]
        if tail.isdigit():
            out[int(tail)] = item.create_revision
    return out


class DrillSources:
    """The chaos drill's: etcd read directly, each node process at its direct address, the catalog followed
    (``CatalogTargets``, caught up to etcd's revision before each read), the leader's gRPC."""

    def __init__(self, kv: MetaKV, partitions: Mapping[int, list[int]], *, leader: Callable[[], str | None],
                 nodes: Callable[[], list[NodeHandle]]):
        self.kv = kv
        self.partitions = dict(partitions)
        self._leader = leader
        self._nodes = nodes
        self.targets = CatalogTargets(kv)
        self._channels: dict[str, grpc.aio.Channel] = {}

    def start(self) -> None:
        self.targets.start()

    async def stop(self) -> None:
        await self.targets.stop()
        for ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close()

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = make_channel(address)
        return ch

    def leader(self) -> str | None:
        return self._leader()

    async def sessions(self) -> dict[int, int]:
        return await registered_sessions(self.kv)

    async def reports(self) -> Reports:
        async def one(h: NodeHandle) -> tuple[int, tuple[NodeView, Room] | None]:
            if not h.running:
                return h.node_id, None
            try:
                d = await querynode_pb2_grpc.QueryNodeStub(self._channel(h.address)).GetDataDistribution(
                    querynode_pb2.GetDataDistributionRequest(), timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError:
                return h.node_id, None
            if d.status.error_code != common_pb2.SUCCESS or d.node_id != h.node_id:
                return h.node_id, None
            return h.node_id, (node_view(d), Room(d.memory_used, d.memory_capacity))

        got = await asyncio.gather(*(one(h) for h in self._nodes()))
        return {n: v for n, v in got if v is not None}

    async def catalog(self) -> Catalog:
        await self.targets.catch_up(5.0)
        out: Catalog = {}
        for cid, pids in self.partitions.items():
            t = self.targets.target(cid, pids)
            if t is not None:
                out[cid] = ({s.segment_id: (s.partition_id, s.mem_size) for s in t.segments.values()},
                            frozenset(t.channels))
        return out

    async def ask(self, method: str, request: Any) -> Any:
        address = self._leader()
        if address is None:
            return None
        with contextlib.suppress(grpc.aio.AioRpcError):
            stub = querycoord_pb2_grpc.QueryCoordStub(self._channel(address))
            r = await getattr(stub, method)(request, timeout=CALL_TIMEOUT)
            if r.status.error_code == common_pb2.SUCCESS:
                return r
        return None


__all__ = ["Catalog", "DrillSources", "NodeHandle", "Reports", "SampleStats", "Sampler", "Sources", "leader_answers",
           "merged", "registered_sessions", "target_of"]
