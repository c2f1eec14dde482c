"""The checker's driver: when a pass runs, and what one pass does with the comparison.

On the leader, every ``interval`` seconds and whenever kicked (node join or leave, takeover, handoff, a
release or repair ending), a pass forgets offline nodes, gathers the distribution, reads the targets,
compares them (``diff``), corrects load percentages, weighs parked units, enqueues one REPAIR trigger per
collection that differs (``task.repair``), gives a parked replica with no node one a sibling replica can spare
(``rehome_parked``) and moves the copies of draining nodes (``drain``). It never
touches a collection that has a trigger queued or running (the trigger owns it until it ends) and never
writes except through the scheduler, whose writes are fenced, and the node lifecycles' fenced records.

A collection whose every input is as when a pass last found nothing to do for it is skipped (``unchanged``):
the nodes report a version per collection and leave out the segments of those the pass already has, so a
steady pass over a million segments reads and compares none of them.

Check kinds an operator turned off (``activation``) plan nothing: a pass still compares and corrects
percentages, then drops what those kinds would do from each repair.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from loguru import logger

from meta.errors import MetaError
from meta.loops import loop_failed
from proto import data_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.targets import CatalogTargets
from querycoord.checkers.activation import REPLICAS, SEGMENTS, CheckerSwitches
from querycoord.checkers.diff import diff_async
from querycoord.checkers.distribution import Held, NodeReport, collect_reports
from querycoord.checkers.drain import drain_nodes
from querycoord.checkers.left import LeftNodes
from querycoord.checkers.lost import lost_copy_count, lost_node_ids, lost_repairs, unwatched_channels
from querycoord.checkers.parked import weigh_units
from querycoord.checkers.preempt import balances_by_collection, preempt_balances
from querycoord.checkers.progress import set_progress
from querycoord.checkers.rehome_parked import rehome_to_parked
from querycoord.checkers.repair_size import bound_repair
from querycoord.checkers.replicas import forget_offline
from querycoord.checkers.scan import Diff, describe, has_work
from querycoord.checkers.targets import TARGETS_CATCH_UP, TargetReader
from querycoord.checkers.unchanged import Unchanged, coordinator_marks
from querycoord.cluster.lifecycle import NodeLifecycles
from querycoord.common import memory
from querycoord.common.wording import plural
from querycoord.task.repair import RepairTask
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import TriggerTask
from querycoord.task.units import usage_of

# Trigger kinds whose end kicks a pass (``Checker.after_trigger``).
_KICKED_BY = frozenset({qc.TASK_KIND_RELEASE_COLLECTION, qc.TASK_KIND_RELEASE_PARTITION, qc.TASK_KIND_REPAIR,
                        qc.TASK_KIND_UPDATE_LOAD_CONFIG,
                        qc.TASK_KIND_LOAD_BALANCE})
# Trigger kinds a drain queues (``checkers.drain``): the end of one runs the drain's next step at once.
_DRAIN_STEPS = frozenset({qc.TASK_KIND_REPAIR, qc.TASK_KIND_LOAD_BALANCE, qc.TASK_KIND_REHOME_NODE})


@dataclass
class CheckReport:
    repairs: dict[int, str] = field(default_factory=dict)  # collection -> what differed
    unreachable: list[int] = field(default_factory=list)
    progress_updates: int = 0
    parked: dict[tuple[int, int], str] = field(default_factory=dict)  # (collection, replica) -> why
    forgotten: list[int] = field(default_factory=list)  # offline nodes forgotten by this pass


class Checker:
    """Runs ``check_once`` every ``interval`` seconds or when kicked; never dies on one error."""

    def __init__(self, scheduler: Scheduler, *, interval: float = 5.0, targets: CatalogTargets | None = None,
                 forget: Callable[[int], Awaitable[None]] | None = None, left: LeftNodes | None = None,
                 switches: CheckerSwitches | None = None, skip_unchanged: bool = True):
        """``forget``: what a lost node gets (``watchers.forget_node``; see ``replicas.forget_offline``).
        ``targets``: the followed copy of a local catalog (``catalog.targets``): a pass reads targets from
        memory. ``left``: nodes whose re-replication is delayed (``checkers.left``): what meta places on them is
        unknown to a pass, neither missing nor extra, until they are forgotten or back. ``switches``: which kinds
        run (``activation``; default: all). ``skip_unchanged``: skip the collections whose inputs did not change
        since a pass found nothing to do for them (``unchanged``); False compares everything at every pass."""
        self.scheduler = scheduler
        self.left = left
        self.interval = interval
        self.forget = forget
        self.targets = targets
        self.switches = switches if switches is not None else CheckerSwitches()
        self._reader = TargetReader(scheduler.env, targets)
        self.unchanged = Unchanged(skip_unchanged)
        self._kick = asyncio.Event()
        self.runs = 0  # passes started
        # Passes finished, and their summed wall and process CPU seconds (``time.process_time``: every thread of
        # the process while a pass ran, so what else the leader does meanwhile is counted too): what a pass costs
        # at scale, read from /metrics.
        self.passes = 0
        self.passed = asyncio.Event()  # set when the first pass ended (the takeover's triggers dispatch then)
        self.pass_seconds = 0.0
        self.pass_cpu_seconds = 0.0
        self.repairs = 0  # repair triggers enqueued
        self.errors = 0
        # The nodes' maintenance lifecycles: a pass drains the DRAINING nodes (``checkers.drain``).
        self.lifecycles: NodeLifecycles | None = None
        # One drain step at a time (a pass's, or ``drain_step``'s): two would both see a collection free and
        # queue two moves of it.
        self._draining = asyncio.Lock()
        self._drain_task: asyncio.Task[None] | None = None
        self._drain_again = False
        # Collections whose repair is being persisted (``_queue_repair``): busy before the trigger is queued.
        self._queuing: set[int] = set()
        # Whether a lost node's forget queues its repair at once (``repair_lost``); False leaves it to the passes.
        # Off until the scheduler has taken in the persisted triggers (the coordinator turns it on after its
        # takeover): a repair queued before would race the resumed ones, and the first pass repairs what the
        # takeover's forgets found.
        self.repair_at_forget = False
        # The parts of lost nodes' repairs (``_next_lost_part``): collections whose next part is being built and
        # queued (busy meanwhile: the pass a part's end kicks leaves them to it), and per collection the lost nodes
        # its last part was built from, with their copies of it left then (a part that moved none of them ends
        # the chain; a node lost meanwhile does not hide that).
        self._chaining: set[int] = set()
        self._lost_left: dict[int, tuple[frozenset[int], int]] = {}
        self._part_tasks: set[asyncio.Task[None]] = set()
        self.lost_parts = 0  # later parts of lost nodes' repairs queued at a part's end
        memory.defer_while(self.queuing_next)  # a memory release waits between two parts, as during one

    def queuing_next(self) -> bool:
        """Whether the next part of a lost nodes' repair or the next drain move is being built and queued."""
        return bool(self._chaining) or (self._drain_task is not None and not self._drain_task.done())

    def kick(self) -> None:
        self._kick.set()

    def after_trigger(self, trigger: TriggerTask) -> None:
        """A trigger finished (``Scheduler.finish_hooks``): check at once when it may have changed what can be
        placed or what is held (a release freed memory, a repair or a balance moved copies), or while units are
        parked; not after every load or handoff, which at a million segments would keep a pass always running."""
        if trigger.KIND == qc.TASK_KIND_REPAIR:
            self._chain_lost(trigger)
        if trigger.KIND in _KICKED_BY or len(self.scheduler.env.parked):
            self.kick()
        if trigger.KIND in _DRAIN_STEPS:
            self.drain_soon()

    def drain_soon(self) -> None:
        """Run ``drain_step`` now in the background (again once more if one is running): a drain started, or a
        move that may have been a drain's ended. Nothing when no node is draining."""
        if self.lifecycles is None or not self.lifecycles.draining() or self.scheduler.stopped:
            return
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_again = True
            return
        self._drain_task = asyncio.get_running_loop().create_task(self._drain_soon(), name="drain-step")

    async def _drain_soon(self) -> None:
        again = True
        while again:
            self._drain_again = False
            try:
                await self.drain_step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next pass's drain step does it
                logger.warning("checker: a drain step failed: {}", exc)
            again = self._drain_again

    async def drain_step(self) -> int:
        """The draining nodes' next moves now, without a pass's comparison first (``checkers.drain``): when a
        drain's move ends or a drain starts, what comes next (the DM channels once the segments are moved, DRAINED
        once the node holds nothing) needs no distribution nor target, only query meta and the draining node's own
        report. Returns the triggers queued."""
        if self.lifecycles is None or not self.lifecycles.draining() or self.scheduler.stopped:
            return 0
        async with self._draining:
            return await drain_nodes(self.scheduler, self.lifecycles, self._busy)

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

    async def _queue_repair(self, cid: int, req: task_pb2.RepairRequest,
                            condition: qc.TriggerCondition, later: int = 0) -> RepairTask | None:
        """Queue ``req`` (its units already weighed) as collection ``cid``'s repair, without what inactive kinds
        would do and cut to one etcd write; None when nothing is left to do. ``cid`` counts as busy while the
        trigger is persisted (``_busy``): another path cannot queue a second repair of it meanwhile. ``later``:
        segments already left out of ``req`` for a later repair (said in its reason)."""
        env = self.scheduler.env
        self.switches.drop_inactive(req)  # after parking: a unit that cannot be placed still says why
        later += bound_repair(req, env.config.max_repair_bytes)  # one etcd write; the rest in the next repair
        req.reason = describe(req) + (f"; {plural(later, 'segment')} more in a later repair" if later else "")
        if not has_work(req):
            return None
        task = RepairTask.new(env, req, trigger_condition=condition, collection_id=cid)
        self._queuing.add(cid)
        try:
            await self.scheduler.enqueue(task)
        finally:
            self._queuing.discard(cid)
        self.repairs += 1
        return task

    async def repair_lost(self, node_id: int, watches: list[data_pb2.DmChannelWatchInfo]) -> int:
        """Queue the repair of what lost node ``node_id`` held, right after its forget took it out of its replicas
        (``checkers.lost``; ``watches``: its DM channel watches as recorded before the forget): no pass has to
        compare every segment to find its copies missing. A collection a trigger owns is left to the next pass, as
        the pass itself would leave it; units that cannot be placed now are parked. Returns the repairs queued."""
        return await self.repair_lost_nodes({node_id: watches})

    async def repair_lost_nodes(self, lost: dict[int, list[data_pb2.DmChannelWatchInfo]]) -> int:
        """``repair_lost`` of several nodes forgotten together (a takeover's gone nodes): one repair per
        collection for all of them, so that the second node's copies do not wait for the first node's repair to
        end and a pass to find them."""
        env = self.scheduler.env
        if not self.repair_at_forget or self.scheduler.stopped or not lost:
            return 0
        queued = 0
        usage = usage_of(env)  # shared by the nodes' units, as by a pass's
        parked: dict[tuple[int, int], str] = {}
        names = ("query node " if len(lost) == 1 else "query nodes ") + ", ".join(map(str, sorted(lost)))
        nodes = sorted(lost)
        built = lost_repairs(env.meta, self.targets, nodes, [w for n in nodes for w in lost[n]], self._busy(),
                             budget=env.config.max_repair_bytes)
        for cid, req in sorted(built.requests.items()):
            if cid in self._busy() or self.scheduler.stopped:
                continue
            left = built.copies.get(cid, 0)  # ``lost_copy_count``, counted by the build
            weigh_units(env, cid, req, usage, parked)
            task = await self._queue_repair(cid, req, qc.TRIGGER_CONDITION_NODE_DOWN, built.later.get(cid, 0))
            if task is not None:
                self._lost_left[cid] = (frozenset(nodes), left)
                env.prefetch.start(env.broker, cid, built.ahead.get(cid, []))
                queued += 1
                logger.info("checker: {} lost: collection {}: {}; repair task {} queued", names, cid,
                            req.reason, task.id)
        return queued

    def _chain_lost(self, trigger: TriggerTask) -> None:
        """A repair of collection ``cid`` ended: while lost nodes' records still name copies of it (the rest of a
        repair cut to one etcd write), its next part is queued now (``_next_lost_part``) rather than after a pass
        compares the whole collection. Only after a repair that ended well, while the lost copies of the
        collection shrink from part to part (a part that moved none, or could not be placed, ends the chain: the
        passes take over), and while no trigger owns the collection. Decided here, before the pass this end kicks
        starts: the collection is busy until the part is queued, so that pass leaves it alone."""
        cid = trigger.collection_id
        if not cid or trigger.state in (qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED) \
                or not self.repair_at_forget or self.scheduler.stopped or cid in self._chaining:
            self._lost_left.pop(cid, None)
            self.scheduler.env.prefetch.drop(cid)
            return
        env = self.scheduler.env
        lost = lost_node_ids(env.meta, env.nodes.online_ids())
        left = lost_copy_count(env.meta, lost, cid) if lost else 0
        before = self._lost_left.pop(cid, None)
        if before is None:
            moved = True
        else:  # the copies left of the nodes the last part was built from (the usual case: those are ``lost``)
            still = before[0] & lost
            moved = (left if still == lost else lost_copy_count(env.meta, still, cid)) < before[1]
        if not left or not moved or cid in self._busy():
            env.prefetch.drop(cid)  # no next part from here: what was read ahead for it is not needed
            return
        self._chaining.add(cid)
        task = asyncio.get_running_loop().create_task(self._next_lost_part(cid, lost, left), name=f"lost-part-{cid}")
        self._part_tasks.add(task)  # referenced until done: the loop keeps only weak references
        task.add_done_callback(self._part_tasks.discard)

    async def _next_lost_part(self, cid: int, lost: set[int], left: int) -> None:
        """Queue the next part of the repair of what lost nodes ``lost`` held of ``cid`` (``left`` copies) through
        ``repair_lost``'s path: built up to one etcd write, units weighed (one that cannot be placed is parked, and
        nothing is queued), inactive kinds dropped. Whatever is not queued is left to the passes."""
        env = self.scheduler.env
        queued = False
        try:
            if self.scheduler.stopped or cid in self.scheduler.busy_collections() or cid in self._queuing:
                return
            parts = lost_repairs(env.meta, self.targets, sorted(lost), unwatched_channels(env.meta, self.targets, cid),
                                 only=cid, budget=env.config.max_repair_bytes)
            req = parts.requests.get(cid)
            if req is None:
                return
            parked: dict[tuple[int, int], str] = {}
            weigh_units(env, cid, req, usage_of(env), parked)
            task = await self._queue_repair(cid, req, qc.TRIGGER_CONDITION_NODE_DOWN, parts.later.get(cid, 0))
            if task is not None:
                queued = True
                self._lost_left[cid] = (frozenset(lost), left)
                env.prefetch.start(env.broker, cid, parts.ahead.get(cid, []))
                self.lost_parts += 1
                logger.info("checker: lost query nodes {}: collection {}: next part: {}; repair task {} queued",
                            sorted(lost), cid, req.reason, task.id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NotLeader included: the scheduler was told; else a pass repairs instead
            logger.warning("checker: collection {}: the next part of a lost node's repair was not queued ({}); "
                           "a checker pass repairs it", cid, exc)
        finally:
            self._chaining.discard(cid)
            if not queued and not env.parked.of(cid):
                self.kick()  # the pass this part's end kicked left the collection to the chain

    def busy_collections(self) -> set[int]:
        """The collections triggers own, and those whose repair this checker is queuing."""
        return self._busy()

    def _busy(self) -> set[int]:
        return self.scheduler.busy_collections() | self._queuing | self._chaining

    async def check_once(self) -> CheckReport:
        """One comparison; enqueues the repairs and corrects load percentages."""
        self.runs += 1
        wall, cpu = time.monotonic(), time.process_time()
        try:
            return await self._check()
        finally:
            self.passes += 1
            self.passed.set()
            self.pass_seconds += time.monotonic() - wall
            self.pass_cpu_seconds += time.process_time() - cpu

    async def _check(self) -> CheckReport:
        env = self.scheduler.env
        report = CheckReport()
        if self.forget is not None and self.switches.is_active(REPLICAS):
            await forget_offline(env, self.forget, report.forgotten)
        # Collections a trigger is working on are left to it: their segments are not even collected from the
        # nodes' answers (a million-segment load would pay for every one of them at every pass).
        # Except those only balances hold: a repair pre-empts them (``checkers.preempt``).
        balanced = balances_by_collection(self.scheduler)
        skipped = self._busy() - set(balanced)
        gone = frozenset(self.left.left) if self.left is not None else frozenset()
        marks = await self._marks(skipped | set(balanced), gone)
        held, reachable, reports, unchanged = await self._collect(skipped, marks, report, gone)
        busy = skipped | (self._busy() - set(balances_by_collection(self.scheduler)))
        targets = await self._reader.read([c for c in env.meta.collection_ids() if c not in busy | unchanged])
        # The catalog reads awaited: triggers may have started meanwhile.
        balanced = {c: ts for c, ts in balances_by_collection(self.scheduler).items() if c not in busy}
        busy |= self._busy() - set(balanced)
        online = {n.node_id for n in env.nodes.online()}
        online |= gone  # not reachable: silent, so their records are kept as they are (but count as not held)
        d = await diff_async(env.meta, targets, held, reachable=reachable, online=online, busy=busy | unchanged,
                             gone=gone, own_targets=True)  # the reader's fresh copies: not copied again
        quiet = {c for c in marks if c not in self._busy() and c not in balanced and not env.parked.of(c)}
        self.unchanged.after([c for c in targets if c not in busy], d, marks, reports, online, held.channels, quiet,
                             env.meta.collection_ids())
        large = len(held.segment_collection) >= memory.LARGE_TASK_SEGMENTS
        del held, targets  # a million segments' worth: freed now, and handed back to the OS below
        if large:
            memory.trim()
        for cid, parts in d.progress.items():
            if cid not in self._busy():
                report.progress_updates += await set_progress(env.meta, cid, parts, d.replica_progress.get(cid, {}))
        preempt_balances(self.scheduler, d, balanced)
        await self._queue_repairs(d, report)
        if self.lifecycles is not None:
            async with self._draining:
                await drain_nodes(self.scheduler, self.lifecycles, self._busy)
        return report

    async def _marks(self, busy: set[int], gone: frozenset[int]) -> dict[int, Hashable]:
        """The coordinator's marks (``unchanged``) of the loaded collections not ``busy``, once the catalog copy is
        current; none without a copy (a remote catalog) or when it is not current: then nothing is skipped. None
        either, and no wait for the copy, when every loaded collection is ``busy``."""
        env = self.scheduler.env
        cids = [c for c in env.meta.collection_ids() if c not in busy]
        if not self.unchanged.enabled or self.targets is None or not cids:
            return {}
        try:
            await self.targets.catch_up(TARGETS_CATCH_UP)
        except (TimeoutError, MetaError):  # the target read says why, and reads the catalog instead
            return {}
        return coordinator_marks(env, self.targets, self.switches, gone, cids)

    async def _collect(self, skipped: set[int], marks: dict[int, Hashable], report: CheckReport,
                       gone: frozenset[int]) -> tuple[Held, set[int], dict[int, NodeReport], set[int]]:
        """The nodes' distributions (without the groups of collections ``unchanged`` tells them they may leave out),
        and the collections this pass skips. When a node left out a collection that must be compared after all,
        every node is asked again for everything."""
        env = self.scheduler.env
        version = env.nodes.version
        candidates = self.unchanged.candidates(marks)
        held, reachable, reports = await collect_reports(env.nodes, skipped, report.unreachable,
                                                         self.unchanged.known(candidates))
        online = {n.node_id for n in env.nodes.online()} | gone
        unchanged, again = self.unchanged.settle(candidates, reports, online, held.channels)
        if env.nodes.version != version:  # a node came or went while they answered: compare everything
            unchanged, again = set(), any(r.left_out for r in reports.values())
        if again:
            report.unreachable.clear()
            held, reachable, reports = await collect_reports(env.nodes, skipped, report.unreachable, {})
            unchanged = set()
        self.unchanged.skipped += len(unchanged)
        return held, reachable, reports, unchanged

    async def _queue_repairs(self, d: Diff, report: CheckReport) -> None:
        """Enqueue the repairs of collections still not busy, with only the units that can be placed now; then
        unpark what a collection checked whole no longer lacks."""
        sched = self.scheduler
        env = sched.env
        usage = usage_of(env)  # shared by the pass's units: two units are not both given the same free room
        unwhole: dict[int, set[int]] = {}
        for cid, req in sorted(d.repairs.items()):
            if cid in self._busy() or sched.stopped:
                continue
            unwhole[cid] = weigh_units(env, cid, req, usage, report.parked)
            task = await self._queue_repair(cid, req, qc.TRIGGER_CONDITION_CHECKER)
            if task is None:
                # Nothing placeable: a parked replica with no node may get one from a sibling (``rehome_parked``).
                if self.switches.is_active(SEGMENTS):
                    await rehome_to_parked(sched, cid, usage, report.parked)
                continue
            report.repairs[cid] = req.reason
            logger.info("checker: collection {}: {}; repair task {} queued", cid, req.reason, task.id)
        for cid in d.progress:  # checked whole this pass: a unit it does not lack any more is not parked
            if cid not in self._busy():
                env.parked.keep_only(cid, unwhole.get(cid, set()))
        env.parked.drop_collections(set(env.meta.collection_ids()))
