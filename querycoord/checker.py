"""The checker: level-triggered reconciliation under the task trees.

Triggers are edge-triggered: each does what it was asked and ends. Whatever
falls between them (a balance that gave up, a node that lost a segment, a
segment sealed while no leader watched the catalog, a rollback cut short)
would stay wrong until someone asks again. The checker closes that gap the
way Milvus's querycoordv2 does: on the leader, every ``interval`` seconds and
whenever kicked (node join or leave, takeover, handoff), it compares

* the **target**: what should be held, from query meta (which collections
  and partitions are loaded) and the catalog (their sealed segments and DM
  channels), with
* the **distribution**: what every online node reports through
  ``GetDataDistribution`` (the call carries the leader's fence),

and enqueues one REPAIR trigger per collection that differs (see
``task.repair``). It never touches a collection that has a trigger queued or
running (the trigger owns it until it ends) and never writes except through
the scheduler, whose writes are fenced. Load percentages are derived from
what nodes hold, so a partition that lost segments stops claiming 100 %.

The comparison (``diff``) is a pure function of plain data, so the rules are
tested without a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from loguru import logger

from meta.errors import MetaError
from proto import data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.targets import CatalogTargets
from querycoord.cluster.client import NodeError
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies
from querycoord.target import Target, TargetSegment
from querycoord.task.repair import RepairTask
from querycoord.task.scheduler import Scheduler

IN_MEMORY = data_pb2.PARTITION_STATE_IN_MEMORY
PARTIAL = data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY
DM = querynode_pb2.CHANNEL_KIND_DM
# How long a pass waits for the catalog copy to reach etcd's revision before it reads the catalog instead.
TARGETS_CATCH_UP = 5.0


@dataclass
class Held:
    """What the reachable online nodes report: segment -> nodes, (collection, channel) -> nodes."""

    segments: dict[int, set[int]] = field(default_factory=dict)
    segment_collection: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (collection, partition)
    channels: dict[tuple[int, str], set[int]] = field(default_factory=dict)


@dataclass
class Diff:
    repairs: dict[int, task_pb2.RepairRequest] = field(default_factory=dict)
    # collection -> partition -> (held, total) for every checked loaded collection
    progress: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    # collection -> replica -> (held, total)
    replica_progress: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)


def _repair(d: Diff, cid: int) -> task_pb2.RepairRequest:
    return d.repairs.setdefault(cid, task_pb2.RepairRequest())


def diff(
    meta: QueryMeta,
    targets: dict[int, Target],
    held: Held,
    *,
    reachable: set[int],
    online: set[int],
    busy: set[int],
) -> Diff:
    """The repairs that make the distribution match the target (see module docstring).

    ``reachable``: online nodes that reported; what meta places on an online
    node that did not report (``online - reachable``) is unknown, so it is
    neither missing nor extra.
    """
    out = Diff()
    silent = online - reachable
    for cid, target in targets.items():
        if cid in busy:
            continue
        loaded = set(meta.partition_ids(cid))
        progress: dict[int, tuple[int, int]] = {p: (0, 0) for p in loaded}
        replicas = meta.replica_ids(cid)
        members = {r: set(meta.replica_nodes(cid, r)) for r in replicas}
        legacy = replicas == [0]  # loaded before replicas: any node serves its one copy

        def split(nodes: set[int], members: dict[int, set[int]] = members, legacy: bool = legacy
                  ) -> tuple[dict[int, set[int]], set[int]]:
            """Holders by replica, and holders in no replica (strays)."""
            if legacy:
                return {0: set(nodes)}, set()
            by: dict[int, set[int]] = {}
            strays: set[int] = set()
            for n in nodes:
                r = next((r for r, m in members.items() if n in m), 0)
                (by.setdefault(r, set()) if r else strays).add(n)
            return by, strays

        per_replica = {r: [0, 0] for r in replicas}
        keep_sources: set[int] = set()
        for seg in target.segments.values():
            by_replica, strays = split(held.segments.get(seg.segment_id, set()))
            recorded_copies = meta.segment_copies(seg.segment_id)
            for extra in sorted(strays):
                _release(out, cid, extra, seg.segment_id)
            for replica in replicas:
                holders = by_replica.get(replica, set())
                recorded = recorded_copies.get(replica, 0)
                unknown = recorded in silent
                h, t = progress.get(seg.partition_id, (0, 0))
                counted = 1 if holders or unknown else 0
                progress[seg.partition_id] = (h + counted, t + 1)
                per_replica[replica][0] += counted
                per_replica[replica][1] += 1
                if holders:
                    keep = recorded if recorded in holders else min(holders)
                    if recorded != keep:
                        _repair(out, cid).adopt.append(data_pb2.SegmentInfo(
                            segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                            node_id=keep, replica_id=replica, state=data_pb2.SEGMENT_STATE_SEALED,
                            compaction_from=list(seg.compaction_from)))
                    for extra in sorted(holders - {keep}):
                        _release(out, cid, extra, seg.segment_id)
                elif not unknown:
                    keep_sources.update(seg.compaction_from)  # serve the sources until the result is loaded
                    _repair(out, cid).missing_segments.append(data_pb2.SegmentInfo(
                        segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                        node_id=recorded, replica_id=replica))
        # Copies of this collection that are not in the target: released partitions, compacted away.
        for sid, (scid, _pid) in held.segment_collection.items():
            if scid != cid or sid in target.segments or sid in keep_sources:
                continue
            for node in sorted(held.segments.get(sid, ())):
                _release(out, cid, node, sid)
        # Meta records of segments that are neither in the target nor held anywhere.
        for sid in meta.segment_ids_of(cid):  # ids, not copies of a million records
            if sid not in target.segments and sid not in held.segments \
                    and not silent.intersection(meta.segment_copies(sid).values()):
                _repair(out, cid).forget_segment_ids.append(sid)
        # DM channels: each target channel watched by a reachable node of every replica, or re-watched.
        pids = [] if meta.get_load_type(cid) == data_pb2.LOAD_TYPE_COLLECTION else sorted(loaded)
        for name in sorted(target.channels):
            by_replica, _strays = split(held.channels.get((cid, name), set()))
            recorded_w = meta.get_dm_channel(cid, name)
            watch_copies = copies(recorded_w) if recorded_w is not None else {}
            for replica in replicas:
                if by_replica.get(replica):
                    continue
                node = watch_copies.get(replica, 0)
                if node in silent:
                    continue  # its node did not report: unknown
                _repair(out, cid).rewatch.append(data_pb2.DmChannelWatchInfo(
                    collection_id=cid, dm_channel=name, node_id=node if node in reachable else 0,
                    replica_id=replica,
                    partition_ids=list(recorded_w.partition_ids) if recorded_w is not None else pids))
        out.progress[cid] = progress
        out.replica_progress[cid] = {r: (h, t) for r, (h, t) in per_replica.items()}
    # Nodes holding anything of a collection that is not loaded at all.
    stray: dict[int, set[int]] = {}
    for sid, (scid, _pid) in held.segment_collection.items():
        if scid not in targets and scid not in busy and not meta.has_collection(scid):
            stray.setdefault(scid, set()).update(held.segments.get(sid, ()))
    for (scid, _name), nodes in held.channels.items():
        if scid not in targets and scid not in busy and not meta.has_collection(scid):
            stray.setdefault(scid, set()).update(nodes)
    for scid, nodes in stray.items():
        _repair(out, scid).release_collection_on_nodes.extend(sorted(nodes))
    for req in out.repairs.values():
        req.reason = describe(req)
    return out


def _release(d: Diff, cid: int, node: int, sid: int) -> None:
    req = _repair(d, cid)
    for ns in req.release_segments:
        if ns.node_id == node:
            if sid not in ns.segment_ids:
                ns.segment_ids.append(sid)
            return
    req.release_segments.append(task_pb2.NodeSegments(node_id=node, segment_ids=[sid]))


def describe(req: task_pb2.RepairRequest) -> str:
    copies = sum(len(ns.segment_ids) for ns in req.release_segments)
    found = [
        (req.missing_segments, f"{len(req.missing_segments)} segments held by no node"),
        (copies, f"{copies} copies to release"),
        (req.rewatch, f"{len(req.rewatch)} DM channels unwatched"),
        (req.release_collection_on_nodes, f"not loaded but held on nodes {list(req.release_collection_on_nodes)}"),
        (req.adopt, f"{len(req.adopt)} segments recorded on the wrong node"),
        (req.forget_segment_ids, f"{len(req.forget_segment_ids)} stale segment records"),
    ]
    return "; ".join(text for present, text in found if present)


@dataclass
class CheckReport:
    repairs: dict[int, str] = field(default_factory=dict)  # collection -> what differed
    unreachable: list[int] = field(default_factory=list)
    progress_updates: int = 0


class Checker:
    """Runs ``check_once`` every ``interval`` seconds or when kicked; never dies on one error."""

    def __init__(self, scheduler: Scheduler, *, interval: float = 5.0, targets: CatalogTargets | None = None):
        self.scheduler = scheduler
        self.interval = interval
        # The followed copy of a local catalog (``catalog.targets``): a pass reads targets from memory.
        self.targets = targets
        self._no_target: set[int] = set()  # collections the catalog lacks (logged once each)
        self._kick = asyncio.Event()
        self.runs = 0
        self.repairs = 0  # repair triggers enqueued
        self.errors = 0

    def kick(self) -> None:
        self._kick.set()

    async def run_forever(self) -> None:
        while not self.scheduler.stopped:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.interval)
            self._kick.clear()
            if self.scheduler.stopped:
                return
            try:
                await self.check_once()
                await self.scheduler.sweep_unremoved()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                logger.opt(exception=exc).warning("checker: a check failed ({}); the next one tries again", exc)

    def _busy(self) -> set[int]:
        out: set[int] = set()
        for t in self.scheduler.triggers.values():
            out |= t.collections()
            if t.collection_id:
                out.add(t.collection_id)
        return out

    async def _distribution(self, report: CheckReport) -> tuple[Held, set[int]]:
        nodes = self.scheduler.env.nodes
        held = Held()
        reachable: set[int] = set()

        async def ask(node_id: int) -> querynode_pb2.GetDataDistributionResponse | None:
            try:
                return await nodes.client(node_id).call("GetDataDistribution",
                                                        querynode_pb2.GetDataDistributionRequest())
            except NodeError as exc:
                logger.info("checker: node {} did not report its distribution: {}", node_id, exc)
                report.unreachable.append(node_id)
                return None

        online = [n.node_id for n in nodes.online()]
        answers = await asyncio.gather(*(ask(n) for n in online))
        for node_id, dist in zip(online, answers, strict=True):
            if dist is None:
                continue
            reachable.add(node_id)
            for s in dist.segments:
                held.segments.setdefault(s.segment_id, set()).add(node_id)
                held.segment_collection[s.segment_id] = (s.collection_id, s.partition_id)
            for c in dist.channels:
                if c.kind == DM:
                    held.channels.setdefault((c.collection_id, c.channel_name), set()).add(node_id)
        return held, reachable

    async def _targets(self, cids: Iterable[int]) -> dict[int, Target]:
        env = self.scheduler.env
        out: dict[int, Target] = {}
        if self.targets is not None:
            try:
                await self.targets.catch_up(TARGETS_CATCH_UP)
            except (TimeoutError, MetaError) as exc:
                logger.info("checker: the catalog copy is not current ({}); reading the catalog",
                            exc or "it did not catch up in time")
            else:
                for cid in cids:
                    target = self.targets.target(cid, env.meta.partition_ids(cid))
                    if target is None:
                        if cid not in self._no_target:
                            logger.warning("checker: collection {} is loaded but the catalog lacks it or one of "
                                           "its loaded partitions; it is left alone", cid)
                        self._no_target.add(cid)
                        continue
                    self._no_target.discard(cid)
                    out[cid] = target
                return out
        for cid in cids:
            target = Target()
            for pid in env.meta.partition_ids(cid):
                chans, binlogs = await env.broker.get_recovery_info(cid, pid)
                for b in binlogs:
                    target.segments[b.segment_id] = TargetSegment(b.segment_id, pid, tuple(b.compaction_from))
                target.channels.update(c.channel_name for c in chans)
            out[cid] = target
        return out

    async def check_once(self) -> CheckReport:
        """One comparison; enqueues the repairs and corrects load percentages."""
        sched = self.scheduler
        env = sched.env
        report = CheckReport()
        self.runs += 1
        held, reachable = await self._distribution(report)
        busy = self._busy()
        targets = await self._targets([c for c in env.meta.collection_ids() if c not in busy])
        # The catalog reads awaited: triggers may have started meanwhile.
        busy |= self._busy()
        online = {n.node_id for n in env.nodes.online()}
        d = diff(env.meta, targets, held, reachable=reachable, online=online, busy=busy)
        for cid, parts in d.progress.items():
            if cid not in self._busy():
                report.progress_updates += await self._set_progress(env.meta, cid, parts)
                await env.meta.set_replica_percentages(cid, {
                    r: 100 if t == 0 else h * 100 // t for r, (h, t) in d.replica_progress.get(cid, {}).items()})
        for cid, req in sorted(d.repairs.items()):
            if cid in self._busy() or sched.stopped:
                continue
            task = RepairTask.new(env, req, trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
            await sched.enqueue(task)
            self.repairs += 1
            report.repairs[cid] = req.reason
            logger.info("checker: collection {}: {}; repair task {} queued", cid, req.reason, task.id)
        return report

    @staticmethod
    async def _set_progress(meta: QueryMeta, cid: int, parts: dict[int, tuple[int, int]]) -> int:
        """Percentages from what nodes hold: a partition that lost segments stops claiming 100 %."""
        info = meta.get_collection(cid)
        if info is None:
            return 0
        states: dict[int, tuple[int, int]] = {}
        for p in info.partitions:
            if p.partition_id not in parts:
                continue
            h, t = parts[p.partition_id]
            pct = 100 if t == 0 else h * 100 // t
            state = IN_MEMORY if pct == 100 else PARTIAL
            if (p.state, p.in_memory_percentage) != (state, pct):
                states[p.partition_id] = (state, pct)
        if states:
            await meta.set_partition_states(cid, states)  # type: ignore[arg-type]
            logger.info("checker: collection {}: load progress corrected from the nodes: {}", cid, states)
        return len(states)
