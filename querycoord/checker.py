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
tested without a cluster. ``diff_async`` is the same comparison with a turn of
the event loop every ``TURN_SEGMENTS`` segments: at a million segments one
pass is about a second of Python.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field

from loguru import logger

from meta.errors import MetaError
from meta.loops import loop_failed
from proto import data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord import memory
from querycoord.catalog.targets import CatalogTargets
from querycoord.cluster.allocator import Usage
from querycoord.cluster.client import NodeError
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies
from querycoord.target import Target, TargetSegment
from querycoord.task.repair import RepairTask
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import TriggerTask
from querycoord.task.units import assess, spare_plan, usage_of

IN_MEMORY = data_pb2.PARTITION_STATE_IN_MEMORY
PARTIAL = data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY
DM = querynode_pb2.CHANNEL_KIND_DM
# How long a pass waits for the catalog copy to reach etcd's revision before it reads the catalog instead.
TARGETS_CATCH_UP = 5.0


class Holders(MutableMapping[int, set[int]]):
    """segment -> the nodes that reported it, without a set per segment (a million segments are a million sets).

    Stored as the first node that reported each segment, the second for those held twice (a segment of a
    collection with two replicas), and a list of the others for the rare rest. Reads as a mapping of sets (each
    read builds a new set: for the few segments that differ, not for the loop over all of them).
    """

    __slots__ = ("_empty", "first", "rest", "second")

    def __init__(self) -> None:
        self.first: dict[int, int] = {}
        self.second: dict[int, int] = {}
        self.rest: dict[int, list[int]] = {}  # third and later holders
        self._empty: set[int] = set()  # set to no node (only by hand: a node's report always names one)

    def add(self, sid: int, node: int) -> None:
        if self._empty:
            self._empty.discard(sid)
        first = self.first.setdefault(sid, node)
        if first != node:
            second = self.second.setdefault(sid, node)
            if second != node:
                rest = self.rest.setdefault(sid, [])
                if node not in rest:
                    rest.append(node)

    def __getitem__(self, sid: int) -> set[int]:
        first = self.first.get(sid)
        if first is None:
            if sid in self._empty:
                return set()
            raise KeyError(sid)
        second = self.second.get(sid)
        if second is None:
            return {first}
        return {first, second, *self.rest.get(sid, ())}

    def __setitem__(self, sid: int, nodes: Iterable[int]) -> None:
        self.pop(sid, None)
        nodes = list(nodes)
        if not nodes:
            self._empty.add(sid)
        for node in nodes:
            self.add(sid, node)

    def __delitem__(self, sid: int) -> None:
        if sid in self._empty:
            self._empty.discard(sid)
            return
        del self.first[sid]
        self.second.pop(sid, None)
        self.rest.pop(sid, None)

    def setdefault(self, sid: int, default: Iterable[int] | None = None) -> set[int]:
        """Refused: the set it would return is a copy, so adding to it (the old ``Held.segments`` idiom) would be
        lost. Use ``add``."""
        raise TypeError("Holders.setdefault would return a copy: use Holders.add(segment, node)")

    def __contains__(self, sid: object) -> bool:
        return sid in self.first or sid in self._empty

    def __iter__(self) -> Iterator[int]:
        yield from self.first
        yield from self._empty

    def __len__(self) -> int:
        return len(self.first) + len(self._empty)


@dataclass
class Held:
    """What the reachable online nodes report: segment -> nodes, (collection, channel) -> nodes."""

    segments: Holders = field(default_factory=Holders)
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


# Trigger kinds whose end kicks a pass (``Checker.after_trigger``).
_KICKED_BY = frozenset({qc.TASK_KIND_RELEASE_COLLECTION, qc.TASK_KIND_RELEASE_PARTITION, qc.TASK_KIND_REPAIR,
                        qc.TASK_KIND_LOAD_BALANCE})

#: Segments the checker handles between two turns of the event loop in ``diff_async`` (~20-50 ms of work).
TURN_SEGMENTS = 20_000


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
    neither missing nor extra. Runs without a turn of the event loop: see
    ``diff_async`` for the checker's pass.
    """
    steps = _diff_steps(meta, targets, held, reachable=reachable, online=online, busy=busy, every=0)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


async def diff_async(
    meta: QueryMeta,
    targets: dict[int, Target],
    held: Held,
    *,
    reachable: set[int],
    online: set[int],
    busy: set[int],
    every: int = TURN_SEGMENTS,
) -> Diff:
    """``diff``, giving the event loop a turn every ``every`` segments (a million segments take a second or more:
    the session keepalive, the election watch and every gRPC answer, /metrics included, wait meanwhile).

    Why the turns do not make it wrong: each target is copied before the first turn, so a catalog change made
    meanwhile (a handoff replacing compaction sources by their result) is seen whole or not at all; ``held`` is
    the caller's own. Query meta may change between turns (a trigger's writes, a reload), so one collection
    may be seen partly before and partly after a change: the caller re-checks ``busy`` before it acts and drops
    what it found for a collection that became busy, a repair re-plans against current meta before it loads or
    releases anything (``task.repair``), progress is advisory and the next pass recomputes it. The checker is
    level-triggered: a difference a pass missed or saw half-way is found whole by the next one. (A trigger that
    starts and ends within one pass is not seen as busy: that window existed before the turns, between the
    catalog reads' awaits and ``diff``; the turns widen it from milliseconds to the pass.)
    """
    steps = _diff_steps(meta, targets, held, reachable=reachable, online=online, busy=busy, every=every)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        await asyncio.sleep(0)


class _Releases:
    """Adds segment ``sid`` to the copies ``node`` should release for collection ``cid``: one entry per node, in
    the order the nodes come up, each segment once.

    Indexed by (collection, node), with each entry's segment ids as a set: the scan of every node entry and
    every id already listed (the old ``_release``) was quadratic when a released partition leaves a hundred
    thousand copies to release.
    """

    def __init__(self, out: Diff):
        self.out = out
        self.entries: dict[tuple[int, int], tuple[task_pb2.NodeSegments, set[int]]] = {}

    def __call__(self, cid: int, node: int, sid: int) -> None:
        req = _repair(self.out, cid)
        entry = self.entries.get((cid, node))
        if entry is None:
            self.entries[cid, node] = (req.release_segments.add(node_id=node, segment_ids=[sid]), {sid})
        elif sid not in entry[1]:
            entry[0].segment_ids.append(sid)
            entry[1].add(sid)


class _Sources:
    """Held segments outside the target that may still serve a compaction result no replica holds yet.

    A missing result's direct sources are known (its ``compaction_from``), their own sources are not: the catalog
    drops a compacted segment's record in the txn that adds its result, so in a chain A -> B -> C whose B was never
    loaded (compacted again before its handoff ran, or parked for room), nothing on record says that C holds A's
    rows: not the catalog, not query meta (B was never recorded), not a node. Compaction stays within a partition
    (the catalog refuses sources of another), so while a result is missing, every held segment of its partition
    outside the target is kept: the whole chain, however long, until the result is held; the next pass releases
    them.
    """

    __slots__ = ("ids", "partitions")

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.partitions: set[int] = set()

    def note(self, seg: TargetSegment) -> None:
        """``seg`` is missing in some replica."""
        if seg.compaction_from:
            self.ids.update(seg.compaction_from)
            self.partitions.add(seg.partition_id)

    def spare(self, outside: set[int], where: dict[int, tuple[int, int]]) -> None:
        """Take the segments to keep out of ``outside`` (held segments not in the target; ``where``: their
        reported collection and partition)."""
        outside.difference_update(self.ids)
        if self.partitions and outside:
            outside.difference_update([s for s in outside if where[s][1] in self.partitions])


def _diff_steps(
    meta: QueryMeta,
    targets: dict[int, Target],
    held: Held,
    *,
    reachable: set[int],
    online: set[int],
    busy: set[int],
    every: int,
) -> Generator[None, None, Diff]:
    """``diff``'s body: yields every ``every`` segments (never when 0), returns the ``Diff``.

    Per target segment, a fast path: when the nodes that hold it are exactly its recorded copies, one per
    replica, each on a node of its replica (any node for a collection loaded before replicas), the segment is
    held everywhere it should be and needs nothing: it only counts towards progress. Checking that reads the
    record's copy fields, not a dict per segment (``copies``) and a dict and sets per segment (``split``). Every
    other segment takes the general path (the rules in full). Both give what the general path alone gives
    (tests/test_checker_diff_paths.py compares them with the rules written once, on random states).
    """
    out = Diff()
    release = _Releases(out)
    silent = online - reachable
    holders = held.segments
    first, second, rest = holders.first, holders.second, holders.rest
    turn = every or -1  # segments until the next turn; never reaches 0 when not yielding
    # A snapshot of each target taken now (see diff_async): the caller's may be shared and change during turns.
    work = [(cid, dict(t.segments) if every else t.segments, set(t.channels) if every else t.channels)
            for cid, t in list(targets.items()) if cid not in busy]
    target_ids = set(targets)
    # Held segments by collection, in report order (a pass per collection over all held segments is quadratic
    # in collections). One collection held (the common case): no loop.
    held_of: dict[int, list[int]] = {}
    held_cids = {scid for scid, _pid in set(held.segment_collection.values())}  # (collection, partition) pairs
    if len(held_cids) == 1:
        held_of[held_cids.pop()] = list(held.segment_collection)
    else:
        for sid, (scid, _pid) in held.segment_collection.items():
            ids = held_of.get(scid)
            if ids is None:
                held_of[scid] = [sid]
            else:
                ids.append(sid)
            turn -= 1
            if not turn:
                turn = every
                yield
    for cid, tsegs, tchans in work:
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
        keep_sources = _Sources()
        # The fast path (see the docstring): replica of each member node, as ``split`` finds it.
        replica_of: dict[int, int] = {}
        for r in replicas:
            for n in members[r]:
                replica_of.setdefault(n, r)
        ordered = sorted(replicas)
        shape = len(replicas) if len(set(replicas)) == len(replicas) and len(replicas) <= 2 else 0
        r0 = ordered[0] if shape else 0
        r1 = ordered[1] if shape == 2 else 0
        places = meta.segment_places()  # (collection, partition, flat copies: replica, node, ...) by segment
        fast_pids: list[int] = []  # partition of each segment that took the fast path
        segments = list(tsegs.values())
        step = every or len(segments) or 1
        for start in range(0, len(segments), step):
            if start:
                yield
            for seg in segments[start:start + step]:
                sid = seg.segment_id
                if shape == 1:
                    node = first.get(sid)
                    if node is not None and sid not in second and (legacy or replica_of.get(node) == r0):
                        place = places.get(sid)
                        if place is not None:
                            flat = place[2]  # its one copy is in r0, on the node that holds it
                            if len(flat) == 2 and flat[1] == node and flat[0] == r0:
                                pid = seg.partition_id
                                if pid not in progress:
                                    progress[pid] = (0, 0)
                                fast_pids.append(pid)
                                continue
                elif shape == 2:
                    a = first.get(sid)
                    b = second.get(sid)
                    if a is not None and b is not None and sid not in rest:
                        place = places.get(sid)
                        if place is not None and _copies_are(place[2], r0, r1, a, b, replica_of):
                            pid = seg.partition_id
                            if pid not in progress:
                                progress[pid] = (0, 0)
                            fast_pids.append(pid)
                            continue
                # The general path: the rules in full.
                by_replica, strays = split(holders.get(seg.segment_id, set()))
                recorded_copies = meta.segment_copies(seg.segment_id)
                for extra in sorted(strays):
                    release(cid, extra, seg.segment_id)
                for replica in replicas:
                    holding = by_replica.get(replica, set())
                    recorded = recorded_copies.get(replica, 0)
                    unknown = recorded in silent
                    h, t = progress.get(seg.partition_id, (0, 0))
                    counted = 1 if holding or unknown else 0
                    progress[seg.partition_id] = (h + counted, t + 1)
                    per_replica[replica][0] += counted
                    per_replica[replica][1] += 1
                    if holding:
                        keep = recorded if recorded in holding else min(holding)
                        if recorded != keep:
                            _repair(out, cid).adopt.append(data_pb2.SegmentInfo(
                                segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                                node_id=keep, replica_id=replica, state=data_pb2.SEGMENT_STATE_SEALED,
                                compaction_from=list(seg.compaction_from)))
                        for extra in sorted(holding - {keep}):
                            release(cid, extra, seg.segment_id)
                    elif not unknown:
                        keep_sources.note(seg)  # serve the sources until the result is loaded
                        _repair(out, cid).missing_segments.append(data_pb2.SegmentInfo(
                            segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                            node_id=recorded, replica_id=replica, mem_size=seg.mem_size))
        # A fast segment is held in each replica: one held and one expected per replica.
        for pid, count in Counter(fast_pids).items():
            h, t = progress[pid]
            progress[pid] = (h + count * len(replicas), t + count * len(replicas))
            for replica in replicas:
                per_replica[replica][0] += count
                per_replica[replica][1] += count
        # Copies of this collection that are not in the target: released partitions, compacted away.
        held_here = held_of.get(cid, [])
        outside: set[int] = set()
        for start in range(0, len(held_here), every or len(held_here) or 1):
            yield
            outside.update(set(held_here[start:start + (every or len(held_here))]).difference(tsegs))  # in C
        keep_sources.spare(outside, held.segment_collection)
        if outside:  # usually not
            for sid in held_here:
                if sid in outside:
                    for node in sorted(holders.get(sid, ())):
                        release(cid, node, sid)
        # Meta records of segments that are neither in the target nor held anywhere (set arithmetic first: the
        # ids of a million records, not their copies).
        yield
        unplaced = meta.segment_id_set(cid)
        yield
        unplaced.difference_update(tsegs)
        for sid in sorted(unplaced):
            if sid not in holders and not silent.intersection(meta.segment_copies(sid).values()):
                _repair(out, cid).forget_segment_ids.append(sid)
        pids = [] if meta.get_load_type(cid) == data_pb2.LOAD_TYPE_COLLECTION else sorted(loaded)
        for name in sorted(tchans):
            _diff_channel(out, meta, cid, name, split(held.channels.get((cid, name), set())), replicas,
                          silent=silent, reachable=reachable, pids=pids)
        out.progress[cid] = progress
        out.replica_progress[cid] = {r: (h, t) for r, (h, t) in per_replica.items()}
    # Nodes holding anything of a collection that is not loaded at all.
    stray: dict[int, set[int]] = {}
    for scid, sids in held_of.items():
        if scid not in target_ids and scid not in busy and not meta.has_collection(scid):
            nodes = stray.setdefault(scid, set())
            for sid in sids:
                nodes.update(holders.get(sid, ()))
    for (scid, _name), nodes in held.channels.items():
        if scid not in target_ids and scid not in busy and not meta.has_collection(scid):
            stray.setdefault(scid, set()).update(nodes)
    for scid, nodes in stray.items():
        _repair(out, scid).release_collection_on_nodes.extend(sorted(nodes))
    for req in out.repairs.values():
        req.reason = describe(req)
    return out


def _diff_channel(out: Diff, meta: QueryMeta, cid: int, name: str, placed: tuple[dict[int, set[int]], set[int]],
                  replicas: list[int], *, silent: set[int], reachable: set[int], pids: list[int]) -> None:
    """One target DM channel (``placed``: its reachable watchers by replica, and those in no replica): watched by
    one node of every replica, the one meta records when it watches (else the lowest id, then recorded); watched
    again where no node of a replica watches it (unless the recorded node did not report: unknown); and no longer
    watched by every other node, a second watcher in one replica (two nodes consuming one channel for one replica)
    or a node in no replica of the collection."""
    by_replica, strays = placed
    recorded = meta.get_dm_channel(cid, name)
    watch_copies = copies(recorded) if recorded is not None else {}
    parts = list(recorded.partition_ids) if recorded is not None else pids
    extra = set(strays)
    for replica in replicas:
        node = watch_copies.get(replica, 0)
        holding = by_replica.get(replica)
        if holding:
            keep = node if node in holding else min(holding)
            extra |= holding - {keep}
            if keep != node:
                _repair(out, cid).adopt_dm_channels.append(data_pb2.DmChannelWatchInfo(
                    collection_id=cid, dm_channel=name, node_id=keep, replica_id=replica, partition_ids=parts))
        elif node not in silent:
            _repair(out, cid).rewatch.append(data_pb2.DmChannelWatchInfo(
                collection_id=cid, dm_channel=name, node_id=node if node in reachable else 0, replica_id=replica,
                partition_ids=parts))
    for n in sorted(extra):
        req = _repair(out, cid)
        entry = next((e for e in req.release_dm_channels if e.node_id == n), None)
        if entry is None:
            entry = req.release_dm_channels.add(node_id=n)
        entry.channel_names.append(name)


def _copies_are(flat: tuple[int, ...], r0: int, r1: int, a: int, b: int, replica_of: dict[int, int]) -> bool:
    """True only when the record's copies (``flat``: replica, node, replica, node by replica) are ``{r0: x, r1: y}``
    with ``{x, y} == {a, b}``, x a node of replica ``r0`` and y of ``r1``. False sends the segment to the general
    path."""
    if len(flat) != 4 or flat[0] != r0 or flat[2] != r1:
        return False
    x, y = flat[1], flat[3]
    return ((x == a and y == b) or (x == b and y == a)) and replica_of.get(x) == r0 and replica_of.get(y) == r1


def describe(req: task_pb2.RepairRequest) -> str:
    copies = sum(len(ns.segment_ids) for ns in req.release_segments)
    watches = sum(len(nc.channel_names) for nc in req.release_dm_channels)
    found = [
        (req.missing_segments, f"{len(req.missing_segments)} segments held by no node"),
        (copies, f"{copies} copies to release"),
        (req.rewatch, f"{len(req.rewatch)} DM channels unwatched"),
        (req.release_collection_on_nodes, f"not loaded but held on nodes {list(req.release_collection_on_nodes)}"),
        (req.adopt, f"{len(req.adopt)} segments recorded on the wrong node"),
        (req.forget_segment_ids, f"{len(req.forget_segment_ids)} stale segment records"),
        (watches, f"{watches} DM channel watches to release"),
        (req.adopt_dm_channels, f"{len(req.adopt_dm_channels)} DM channel watches recorded on the wrong node"),
    ]
    return "; ".join(text for present, text in found if present)


@dataclass
class CheckReport:
    repairs: dict[int, str] = field(default_factory=dict)  # collection -> what differed
    unreachable: list[int] = field(default_factory=list)
    progress_updates: int = 0
    parked: dict[tuple[int, int], str] = field(default_factory=dict)  # (collection, replica) -> why
    forgotten: list[int] = field(default_factory=list)  # offline nodes forgotten by this pass


def _has_work(req: task_pb2.RepairRequest) -> bool:
    return bool(req.missing_segments or req.release_segments or req.rewatch or req.release_collection_on_nodes
                or req.adopt or req.forget_segment_ids or req.release_dm_channels or req.adopt_dm_channels)


class Checker:
    """Runs ``check_once`` every ``interval`` seconds or when kicked; never dies on one error."""

    def __init__(self, scheduler: Scheduler, *, interval: float = 5.0, targets: CatalogTargets | None = None,
                 forget: Callable[[int], Awaitable[None]] | None = None):
        """``forget``: what a lost node gets (``watchers.forget_node``); a pass calls it for every node query meta
        still refers to that is not online (its session went while forgetting it failed, or while no leader
        watched), so a dead node never holds a replica or counts as holding anything past one pass."""
        self.scheduler = scheduler
        self.interval = interval
        self.forget = forget
        # The followed copy of a local catalog (``catalog.targets``): a pass reads targets from memory.
        self.targets = targets
        self._no_target: set[int] = set()  # collections the catalog lacks (logged once each)
        self._kick = asyncio.Event()
        self.runs = 0
        self.repairs = 0  # repair triggers enqueued
        self.errors = 0

    def kick(self) -> None:
        self._kick.set()

    def after_trigger(self, trigger: TriggerTask) -> None:
        """A trigger finished (``Scheduler.finish_hooks``): check at once when it may have changed what can be
        placed or what is held (a release freed memory, a repair or a balance moved copies), or while units are
        parked; not after every load or handoff, which at a million segments would keep a pass always running."""
        if trigger.KIND in _KICKED_BY or len(self.scheduler.env.parked):
            self.kick()

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
                if loop_failed("checker", exc, self.scheduler.env.store.kv.client):
                    return

    def _busy(self) -> set[int]:
        out: set[int] = set()
        for t in self.scheduler.triggers.values():
            out |= t.collections()
            if t.collection_id:
                out.add(t.collection_id)
        return out

    async def _distribution(self, report: CheckReport, skipped: set[int]) -> tuple[Held, set[int]]:
        """What the online nodes hold, without the segments of ``skipped`` collections (left out of the pass)."""
        nodes = self.scheduler.env.nodes
        held = Held()
        reachable: set[int] = set()

        async def ask(node_id: int) -> querynode_pb2.GetDataDistributionResponse | None:
            try:
                return await nodes.client(node_id).call("GetDataDistribution",
                                                        querynode_pb2.GetDataDistributionRequest(segment_ids_only=True))
            except NodeError as exc:
                logger.info("checker: node {} did not report its distribution: {}", node_id, exc)
                report.unreachable.append(node_id)
                return None

        online = [n.node_id for n in nodes.online()]
        answers = await asyncio.gather(*(ask(n) for n in online))
        holders = held.segments
        first, second = holders.first, holders.second
        where = held.segment_collection
        places: dict[tuple[int, int], tuple[int, int]] = {}  # one tuple per partition, not per segment
        turn = TURN_SEGMENTS
        for node_id, dist in zip(online, answers, strict=True):
            if dist is None:
                continue
            reachable.add(node_id)
            nodes.heard(node_id)
            for g in dist.segment_groups:
                if g.collection_id in skipped:
                    continue
                # Ids by partition: each step below is one C-level operation over the group, not a Python
                # statement per segment (a node reports a segment once, so any id already seen is another node's).
                ids = set(g.segment_ids)
                place = (g.collection_id, g.partition_id)
                where.update(dict.fromkeys(ids, place))
                seen = ids & first.keys()
                first.update(dict.fromkeys(ids - seen if seen else ids, node_id))
                if seen:
                    third = seen & second.keys()
                    second.update(dict.fromkeys(seen - third if third else seen, node_id))
                    for sid in third:
                        holders.add(sid, node_id)  # a third holder (or more): rare
                turn -= len(ids)
                if turn <= 0:
                    turn = TURN_SEGMENTS
                    await asyncio.sleep(0)
            for s in dist.segments:  # a node that predates segment_ids_only
                if s.collection_id in skipped:
                    continue
                sid = s.segment_id
                if first.setdefault(sid, node_id) != node_id and second.setdefault(sid, node_id) != node_id:
                    holders.add(sid, node_id)  # a third holder (or more): rare
                place = (s.collection_id, s.partition_id)
                where[sid] = places.setdefault(place, place)
                turn -= 1
                if not turn:
                    turn = TURN_SEGMENTS
                    await asyncio.sleep(0)  # a million segments: give the loop a turn (held is this pass's own)
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
                    target.segments[b.segment_id] = TargetSegment(b.segment_id, pid, tuple(b.compaction_from),
                                                                  b.mem_size)
                target.channels.update(c.channel_name for c in chans)
            out[cid] = target
        return out

    async def check_once(self) -> CheckReport:
        """One comparison; enqueues the repairs and corrects load percentages."""
        sched = self.scheduler
        env = sched.env
        report = CheckReport()
        self.runs += 1
        await self._forget_offline(report)
        # Collections a trigger is working on are left to it: their segments are not even collected from the
        # nodes' answers (a million-segment load paid for every one of them at every pass of its 30 s).
        skipped = self._busy()
        held, reachable = await self._distribution(report, skipped)
        busy = skipped | self._busy()
        targets = await self._targets([c for c in env.meta.collection_ids() if c not in busy])
        # The catalog reads awaited: triggers may have started meanwhile.
        busy |= self._busy()
        online = {n.node_id for n in env.nodes.online()}
        d = await diff_async(env.meta, targets, held, reachable=reachable, online=online, busy=busy)
        large = len(held.segment_collection) >= memory.LARGE_TASK_SEGMENTS
        del held, targets  # a million segments' worth: freed now, and handed back to the OS below
        if large:
            memory.trim()
        for cid, parts in d.progress.items():
            if cid not in self._busy():
                report.progress_updates += await self._set_progress(env.meta, cid, parts)
                await env.meta.set_replica_percentages(cid, {
                    r: 100 if t == 0 else h * 100 // t for r, (h, t) in d.replica_progress.get(cid, {}).items()})
        usage = usage_of(env)  # shared by the pass's units: two units are not both given the same free room
        unwhole: dict[int, set[int]] = {}
        for cid, req in sorted(d.repairs.items()):
            if cid in self._busy() or sched.stopped:
                continue
            unwhole[cid] = self._weigh_units(cid, req, usage, report)
            if not _has_work(req):
                continue
            task = RepairTask.new(env, req, trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
            await sched.enqueue(task)
            self.repairs += 1
            report.repairs[cid] = req.reason
            logger.info("checker: collection {}: {}; repair task {} queued", cid, req.reason, task.id)
        for cid in d.progress:  # checked whole this pass: a unit it does not lack any more is not parked
            if cid not in self._busy():
                env.parked.keep_only(cid, unwhole.get(cid, set()))
        env.parked.drop_collections(set(env.meta.collection_ids()))
        return report

    async def _forget_offline(self, report: CheckReport) -> None:
        """Forget the nodes query meta refers to that are not online (see ``__init__``)."""
        if self.forget is None:
            return
        env = self.scheduler.env
        for node_id in sorted(env.meta.known_node_ids() - env.nodes.online_ids()):
            logger.info("checker: query node {} is not online but query meta still refers to it: forgetting it",
                        node_id)
            await self.forget(node_id)
            report.forgotten.append(node_id)

    def _weigh_units(self, cid: int, req: task_pb2.RepairRequest, usage: Usage, report: CheckReport) -> set[int]:
        """Keep in ``req`` only the units (replicas) that can be placed now; park the others with their reason
        (``task.parking``: no repair that would fail is queued, pass after pass). Returns the replicas that lack
        something, placeable or not."""
        env = self.scheduler.env
        missing: dict[int, list[data_pb2.SegmentInfo]] = {}
        for s in req.missing_segments:
            missing.setdefault(s.replica_id, []).append(s)
        rewatch: dict[int, list[data_pb2.DmChannelWatchInfo]] = {}
        for w in req.rewatch:
            rewatch.setdefault(w.replica_id, []).append(w)
        units = set(missing) | set(rewatch)
        if not units:
            return units
        spares = spare_plan(env, cid)
        placeable: set[int] = set()
        for replica in sorted(units):
            before = env.parked.get(cid, replica)
            parked = assess(env, cid, replica, missing.get(replica, []),
                            [w.dm_channel for w in rewatch.get(replica, [])], usage,
                            planned=[spares[replica]] if replica in spares else [])
            if parked is None:
                placeable.add(replica)
                if env.parked.unpark(cid, replica) is not None:
                    logger.info("checker: replica {} of collection {} can be placed now", replica, cid)
                continue
            env.parked.park(parked)
            report.parked[(cid, replica)] = parked.reason
            if before is None or before.code != parked.code:
                logger.warning("checker: replica {} of collection {} parked: {}", replica, cid, parked.reason)
        kept_missing = [s for s in req.missing_segments if s.replica_id in placeable]
        kept_rewatch = [w for w in req.rewatch if w.replica_id in placeable]
        del req.missing_segments[:]
        req.missing_segments.extend(kept_missing)
        del req.rewatch[:]
        req.rewatch.extend(kept_rewatch)
        req.reason = describe(req)
        return units

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
