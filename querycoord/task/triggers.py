"""Trigger tasks: what callers (users, the node watcher, the balancer, handoff) ask for.

A trigger's ``execute`` only plans: it reads the catalog and query meta and
builds children. The scheduler persists them (the commit point), runs them,
and calls ``post_execute`` to record the result, or ``roll_back`` and
``after_failure`` when the trigger fails.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable
from itertools import filterfalse
from operator import attrgetter

from loguru import logger

from proto import common_pb2, data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.client import NodeError
from querycoord.common import memory
from querycoord.common.messages import load_items
from querycoord.common.partition_state import IN_MEMORY, NOT_PRESENT
from querycoord.common.replica_number import replica_number
from querycoord.common.yielding import TURN_EVERY
from querycoord.querymeta.copies import copies
from querycoord.served.persist import persist_releasing
from querycoord.task.assign import Planned, segment_load_info
from querycoord.task.children import (
    LoadSegmentsTask,
    ReleaseCollectionOnNodeTask,
    ReleasePartitionsOnNodeTask,
    WatchDmChannelsTask,
    plan_children,
)
from querycoord.task.model import Task, TaskEnv, TaskError, mark_retrieved
from querycoord.task.units import give_spares, park_unplaced

_SEGMENT_ID = attrgetter("segment_id")
# How a load of the other load type is refused, by how the collection is loaded.
_LOADED_AS = {
    data_pb2.LOAD_TYPE_PARTITION: "as partitions: release partitions first",
    data_pb2.LOAD_TYPE_COLLECTION: "as a whole: release it first",
}


def delta_channel(dm: data_pb2.VChannelInfo) -> data_pb2.VChannelInfo:
    """The delta channel that goes with a DM channel (Milvus derives it by name)."""
    name = dm.channel_name.replace("dml", "delta", 1) if "dml" in dm.channel_name else f"delta-{dm.channel_name}"
    return data_pb2.VChannelInfo(collection_id=dm.collection_id, channel_name=name)


_CHANNEL_ID_FIELDS = ("unflushed_segment_ids", "flushed_segment_ids", "dropped_segment_ids")


def merge_channel(into: data_pb2.VChannelInfo, other: data_pb2.VChannelInfo,
                  known: dict[str, set[int]] | None = None) -> None:
    """Add to ``into``'s segment id lists the ids of ``other``'s that ``into`` lacks (as the lists were before
    this merge: an id ``other`` repeats is added as often).

    ``known`` (when merging many channels into one: a partition each) keeps the id sets of ``into``'s lists
    between calls, built on first use: rebuilding them on every merge was quadratic in partitions. It must
    come with ``into`` and nothing else may change ``into`` meanwhile.
    """
    for field in _CHANNEL_ID_FIELDS:
        ids = getattr(into, field)
        if known is None:
            have = set(ids)
        elif field in known:
            have = known[field]
        else:
            have = known[field] = set(ids)
        new = list(filterfalse(have.__contains__, getattr(other, field)))
        if new:
            ids.extend(new)
            if known is not None:
                have.update(new)


def split_nodes(nodes: list[int], number: int, *, memory: dict[int, int]) -> list[list[int]]:
    """``number`` disjoint groups of ``nodes`` for a new load's replicas, as even in count and memory as dealing
    allows: the emptiest nodes first, dealt round robin. Fewer nodes than replicas: ``NoAvailableNode``."""
    if number < 1:
        raise TaskError(f"replica_number must be at least 1, got {number}", common_pb2.ILLEGAL_ARGUMENT)
    if not nodes:
        raise NoAvailableNode("no online query node to load segments on")
    if len(nodes) < number:
        raise NoAvailableNode(f"not enough query nodes to create {number} replicas: {len(nodes)} online")
    groups: list[list[int]] = [[] for _ in range(number)]
    for i, node in enumerate(sorted(nodes, key=lambda n: (memory.get(n, 0), n))):
        groups[i % number].append(node)
    return [sorted(g) for g in groups]


class TriggerTask(Task):
    """A trigger: carries the futures its caller waits on and its deadline."""

    IS_TRIGGER = True

    def __init__(self, env: TaskEnv, rec: task_pb2.TaskRecord):
        super().__init__(env, rec)
        loop = asyncio.get_event_loop()
        self.planned: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self.deadline = time.monotonic() + env.config.trigger_timeout
        self.resumed = False  # reloaded by a new leader (``Scheduler.reload``): its children may wait for nodes
        # The partitions of the release that cancelled it (``Scheduler._cancel_loads``); None: not cancelled by a
        # partitions release.
        self.cancelled_partitions: frozenset[int] | None = None
        # Segments this trigger loaded or released, for the memory release when it finishes (``_release_after``).
        self.touched = _Touched()
        self.finished.add_done_callback(_release_after(self.touched))
        # Set by ``post_execute`` when the trigger has more to do after its children (a grow that first moved
        # nodes between replicas): the executor then plans it again (``execute``), commits and runs that plan.
        self.another_phase = False

    def on_child_done(self, child: Task) -> None:
        """A child succeeded: its segments count as touched (see ``_release_after``)."""
        if isinstance(child, LoadSegmentsTask):
            self.touched.segments += child.segment_count()

    async def after_failure(self) -> None:
        """Undo query meta written by a failed trigger (after ``roll_back``'s children ran)."""

    async def park_unplaced_child(self, child: Task, cause: BaseException | None, error: NoAvailableNode) -> bool:
        """A child could not be rescheduled (``error``) after failing with ``cause``: park its unit instead of
        failing this trigger? True when parked (the scheduler then drops the child). No by default."""
        return False

    def _release_everywhere(self, partition_ids: Iterable[int] = ()) -> list[Task]:
        """Milvus's brute-force rollback: release on every online node."""
        out: list[Task] = []
        pids = list(partition_ids)
        for node in self.env.nodes.online():
            if pids:
                req = querynode_pb2.ReleasePartitionsRequest(collection_id=self.collection_id, partition_ids=pids)
                out.append(ReleasePartitionsOnNodeTask.new(self.env, req, trigger_condition=self.rec.trigger_condition,
                                                           collection_id=self.collection_id, node_id=node.node_id,
                                                           parent=self))
            else:
                req2 = querynode_pb2.ReleaseCollectionRequest(collection_id=self.collection_id)
                out.append(ReleaseCollectionOnNodeTask.new(self.env, req2,
                                                           trigger_condition=self.rec.trigger_condition,
                                                           collection_id=self.collection_id, node_id=node.node_id,
                                                           parent=self))
        return out


def _lost_or_full(env: TaskEnv, child: Task, cause: BaseException | None) -> bool:
    """Whether a child failed for want of its node (offline when its turn came, offline now, not reachable) or of
    room on it; not when its node answered and refused the work."""
    if cause is None or not env.nodes.is_online(child.node_id):
        return True
    return isinstance(cause, NodeError) and (cause.transport or cause.code == common_pb2.NO_AVAILABLE_NODE)


async def park_lost_child(trigger: TriggerTask, child: Task, cause: BaseException | None,
                          error: NoAvailableNode) -> bool:
    """Park the unit of ``trigger``'s load or watch ``child`` that failed for want of its node or of room there
    (``_lost_or_full``) and that ``error`` says cannot be placed anywhere else now; True when parked. What this
    does not park (a node that answered and refused, a child of another kind) fails the trigger as before."""
    replica = getattr(child.request, "replica_id", 0)
    if not replica or not _lost_or_full(trigger.env, child, cause):
        return False
    if isinstance(child, LoadSegmentsTask):
        segments, channels = list(load_items(await child.filled_request())), []
    elif isinstance(child, WatchDmChannelsTask):
        segments, channels = [], [i.channel_name for i in child.request.infos]
    else:
        return False
    park_unplaced(trigger.env, trigger.collection_id, replica, segments, channels, by=trigger.describe(),
                  error=error)
    return True


class _Touched:
    """How many segments a trigger loaded or released; shared with its ``finished`` callback instead of the trigger
    itself, which must not be kept alive (or put in a cycle) by its own future."""

    __slots__ = ("segments",)

    def __init__(self) -> None:
        self.segments = 0


def _release_after(touched: _Touched) -> Callable[[asyncio.Future[None]], None]:
    """The ``finished`` callback of a trigger: once one that touched ``memory.LARGE_TASK_SEGMENTS`` segments or more
    has finished, the memory its plan and children used goes back to the OS (``memory.release_soon``: a little
    later, when the scheduler has let go of the tree)."""

    def done(_f: asyncio.Future[None]) -> None:
        if touched.segments >= memory.LARGE_TASK_SEGMENTS:
            memory.release_soon()

    return done


class _LoadTrigger(TriggerTask):
    """Shared planning of LoadCollection and LoadPartitions."""

    LOAD_TYPE: data_pb2.LoadType

    def __init__(self, env: TaskEnv, rec: task_pb2.TaskRecord):
        super().__init__(env, rec)
        self.new_partitions: list[int] = []
        self.had_partitions = False  # the collection had loaded partitions before this trigger
        self.planned_segments: dict[int, int] = {}  # partition -> copies planned (segments x replicas)
        self.loaded_segments: dict[int, int] = {}  # partition -> copies loaded so far
        self.replica_total = 0  # segments each replica must hold
        self.replica_loaded: dict[int, int] = {}  # replica -> copies it holds so far
        self.new_replicas: list[data_pb2.ReplicaInfo] = []  # created by this trigger's first load

    def replica_number(self) -> int:
        """How many replicas the request asks for: its number, else the loaded collection's, else 1."""
        return replica_number(self.request, self.env.meta.get_collection(self.collection_id))

    async def _replicas(self) -> list[int]:
        """The collection's replica ids; on its first load, creates them (see ``split_nodes``)."""
        env, cid = self.env, self.collection_id
        if env.meta.has_collection(cid):
            return env.meta.replica_ids(cid)
        number = self.replica_number()
        eligible = sorted(env.nodes.eligible_ids())  # a cordoned node joins no new replica
        groups = split_nodes(eligible, number, memory={n: env.meta.node_memory_usage(n) for n in eligible})
        ids = await env.ids.allocate(number)
        self.new_replicas = [data_pb2.ReplicaInfo(replica_id=rid, collection_id=cid, node_ids=group)
                             for rid, group in zip(ids, groups, strict=True)]
        return list(ids)

    async def _plan(self, partition_ids: list[int]) -> None:
        """Plan the partitions this trigger owns: those not yet in meta, or in meta but never loaded.

        A partition that is in meta at 0 % NOT_PRESENT was written by a trigger
        that never reached its commit point (its leader died): it is work to do,
        not work done. Segments that meta already places on an online node are
        not loaded twice.
        """
        env, cid = self.env, self.collection_id
        before = env.meta.get_collection(cid)
        unloaded = {p.partition_id for p in before.partitions if p.state == NOT_PRESENT} if before else set()
        self.new_partitions = [p for p in partition_ids if not env.meta.has_partition(cid, p) or p in unloaded]
        self.had_partitions = before is not None and any(p.partition_id not in self.new_partitions
                                                        for p in before.partitions)
        self.new_replicas = []
        # The partitions' recovery infos are independent reads of the catalog, of nothing written here: fetched
        # together, while the replicas and the collection are written.
        reads = asyncio.gather(*(env.broker.get_recovery_info(cid, pid) for pid in self.new_partitions))
        try:
            replicas = await self._replicas()
            await env.meta.add_collection(cid, self.LOAD_TYPE, self.new_partitions, replicas=self.new_replicas,
                                          replica_number=len(replicas))
        except BaseException:
            reads.cancel()
            reads.add_done_callback(mark_retrieved)  # their outcome no longer matters: not logged as never retrieved
            raise
        recovered = await reads
        binlogs_by_partition: list[tuple[int, list[data_pb2.SegmentBinlogs]]] = []
        channels: dict[str, data_pb2.VChannelInfo] = {}
        channel_ids: dict[str, dict[str, set[int]]] = {}  # merge_channel's sets, by channel
        for pid, (chans, binlogs) in zip(self.new_partitions, recovered, strict=True):
            binlogs_by_partition.append((pid, list(binlogs)))
            self.planned_segments[pid] = len(binlogs) * len(replicas)
            self.replica_total += len(binlogs)
            for c in chans:
                if c.channel_name in channels:
                    merge_channel(channels[c.channel_name], c, channel_ids.setdefault(c.channel_name, {}))
                else:
                    channels[c.channel_name] = c
        if not env.meta.get_delta_channels(cid) and channels:
            await env.meta.set_delta_channels(cid, [delta_channel(c) for c in channels.values()])
        all_pids = [] if self.LOAD_TYPE == data_pb2.LOAD_TYPE_COLLECTION else self._loaded_partitions()
        self.children = []
        for replica in replicas:  # one after another: a spare joining one replica is no longer offered to the next
            # The catalog's binlogs themselves: each child builds its segments' load infos when it calls its node,
            # and drops them once answered (a load info per segment held for the whole load was most of its RSS).
            segments: list[Planned] = []
            for pid, binlogs in binlogs_by_partition:
                held = await self.not_held(binlogs, replica, segments)
                self.loaded_segments[pid] = self.loaded_segments.get(pid, 0) + held
                self.replica_loaded[replica] = self.replica_loaded.get(replica, 0) + held
            watched = {w.dm_channel: node for w in env.meta.dm_channels_of(cid)
                       if (node := copies(w).get(replica, 0)) and env.nodes.is_online(node)}
            fresh = [c for name, c in channels.items() if name not in watched]
            self.children += await plan_children(env, self, cid, segments, fresh, load_type=self.LOAD_TYPE,
                                                 partition_ids=all_pids, replica_id=replica)
            for name, c in channels.items():
                if name in watched:  # keep the watcher; tell it about the new partitions
                    self.children += await plan_children(env, self, cid, [], [c], include=[watched[name]],
                                                         load_type=self.LOAD_TYPE, partition_ids=all_pids,
                                                         replica_id=replica)

    async def on_reload(self) -> None:
        info = self.env.meta.get_collection(self.collection_id)
        pending = [p.partition_id for p in info.partitions if p.state != IN_MEMORY] if info else []
        if self.REQUEST_FIELD == "load_partitions":
            pending = [p for p in pending if p in set(self.request.partition_ids)]
        self.new_partitions = pending
        self.had_partitions = info is not None and any(p.partition_id not in pending for p in info.partitions)

    async def pre_execute(self) -> None:
        """A collection is loaded as a whole or as partitions, never both: the other load type is refused."""
        loaded_as = self.env.meta.get_load_type(self.collection_id)
        if loaded_as and loaded_as != self.LOAD_TYPE:
            raise TaskError(f"collection {self.collection_id} is loaded {_LOADED_AS[loaded_as]}", common_pb2.CONFLICT)

    async def not_held(self, binlogs: list[data_pb2.SegmentBinlogs], replica_id: int,
                       out: list[Planned]) -> int:
        """Append to ``out`` the segments of ``binlogs`` that ``replica_id`` does not hold yet
        (``replica_holds``); return how many it holds. A turn every ``TURN_EVERY`` segments.

        A slice none of whose segments query meta records at all (every segment of a first load) is taken whole,
        checked in C: asking ``replica_holds`` segment by segment was a tenth of planning such a load.
        """
        held = 0
        for start in range(0, len(binlogs), TURN_EVERY):
            chunk = binlogs[start:start + TURN_EVERY]
            if self.env.meta.segment_places().keys().isdisjoint(map(_SEGMENT_ID, chunk)):
                out += chunk
            else:
                for b in chunk:
                    if self.replica_holds(b.segment_id, replica_id):
                        held += 1
                    else:
                        out.append(b)
            await asyncio.sleep(0)
        return held

    def replica_holds(self, segment_id: int, replica_id: int) -> bool:
        node = self.env.meta.segment_copies(segment_id).get(replica_id, 0)
        return bool(node) and self.env.nodes.is_online(node)

    async def park_unplaced_child(self, child: Task, cause: BaseException | None, error: NoAvailableNode) -> bool:
        """A load answered SUCCESS (its plan persisted) whose child's node was lost, cut off or full, and whose
        replica has no room (or no node) left for that work: the unit is parked (DESIGN rule 9) and the load goes
        on, instead of failing and rolling back the whole collection, every other replica included, after its
        caller was told it succeeded. The checker places the unit when a node joins or memory frees; until then
        the collection shows what its nodes hold. A node that answers and refuses (anything but "no room") still
        fails the load, as before: the work fails there, not for want of a place."""
        return await park_lost_child(self, child, cause, error)

    def _undone(self) -> list[int]:
        """The partitions a failure undoes: every one this trigger added; but a load answered SUCCESS that a
        partitions release then cancelled undoes only those the release names. The others were promised to its
        caller and stay loaded (the checker loads what they still lack): rolling them back lost a partition
        that no request released (tests/test_model_chaos.py, "overlapping_release_cancels_answered_load")."""
        named, planned = self.cancelled_partitions, self.planned
        if named is not None and planned.done() and not planned.cancelled() and planned.exception() is None:
            return [p for p in self.new_partitions if p in named]
        return list(self.new_partitions)

    def roll_back(self) -> list[Task]:
        """Undo only what this trigger added: its own partitions, or the whole collection if it created it."""
        undone = self._undone()
        if not undone:
            return []
        if self.had_partitions or self.LOAD_TYPE == data_pb2.LOAD_TYPE_PARTITION:
            return self._release_everywhere(undone)
        return self._release_everywhere()

    async def after_failure(self) -> None:
        undone = self._undone()
        if not undone:
            return
        if self.had_partitions or self.LOAD_TYPE == data_pb2.LOAD_TYPE_PARTITION:
            await self.env.meta.release_partitions(self.collection_id, undone)
        else:
            await self.env.meta.release_collection(self.collection_id)

    def _loaded_partitions(self) -> list[int]:
        info = self.env.meta.get_collection(self.collection_id)
        return sorted({p.partition_id for p in info.partitions}) if info else []

    def on_child_done(self, child: Task) -> None:
        """Milvus updateTaskProcess: the loaded share per partition, capped at 99 until every child is done.

        Counted from the finished child's own request, not by rescanning query
        meta: a rescan per child made a 100,000-segment load quadratic.
        """
        super().on_child_done(child)
        if not isinstance(child, LoadSegmentsTask) or not self.planned_segments:
            return
        replica = child.request.replica_id
        if replica and self.replica_total:
            self.replica_loaded[replica] = self.replica_loaded.get(replica, 0) + child.segment_count()
            self.env.meta.set_replica_progress(self.collection_id, replica,
                                               min(99, 100 * self.replica_loaded[replica] // self.replica_total))
        for pid, n in Counter(child.segment_refs()[1]).items():  # counted in C
            planned = self.planned_segments.get(pid)
            if planned is None:
                continue
            self.loaded_segments[pid] = self.loaded_segments.get(pid, 0) + n
            self.env.meta.set_progress(self.collection_id, pid, min(99, 100 * self.loaded_segments[pid] // planned))

    async def post_execute(self) -> None:
        if self.new_partitions:
            await self.env.meta.set_partition_states(
                self.collection_id, {pid: (IN_MEMORY, 100) for pid in self.new_partitions}
            )


class LoadCollectionTask(_LoadTrigger, kind=qc.TASK_KIND_LOAD_COLLECTION, request="load_collection"):
    LOAD_TYPE = data_pb2.LOAD_TYPE_COLLECTION

    def summary(self) -> str:
        return f"load collection {self.collection_id}"

    async def execute(self) -> None:
        pids = await self.env.broker.show_partitions(self.collection_id)
        await self._plan(list(pids))


class LoadPartitionsTask(_LoadTrigger, kind=qc.TASK_KIND_LOAD_PARTITION, request="load_partitions"):
    LOAD_TYPE = data_pb2.LOAD_TYPE_PARTITION

    def summary(self) -> str:
        return f"load partitions {list(self.request.partition_ids)} of collection {self.collection_id}"

    async def pre_execute(self) -> None:
        await super().pre_execute()
        known = set(await self.env.broker.show_partitions(self.collection_id))
        unknown = sorted(set(self.request.partition_ids) - known)
        if unknown:
            raise TaskError(f"partitions {unknown} do not exist in collection {self.collection_id}",
                            common_pb2.NOT_FOUND)

    async def execute(self) -> None:
        await self._plan(list(self.request.partition_ids))


class ReleaseCollectionTask(TriggerTask, kind=qc.TASK_KIND_RELEASE_COLLECTION, request="release_collection"):
    def summary(self) -> str:
        return f"release collection {self.collection_id}"

    async def execute(self) -> None:
        self.touched.segments = len(self.env.meta.segment_ids_of(self.collection_id))
        self.children = self._release_everywhere()
        await persist_releasing(self.env.meta, self.collection_id)

    async def post_execute(self) -> None:
        await self.env.meta.release_collection(self.collection_id)
        self.env.parked.drop_collections(set(self.env.meta.collection_ids()))  # nothing of it waits any more

    async def after_failure(self) -> None:
        # The user asked for a release: record it; whatever a node still holds is a
        # stray that the checker releases.
        await self.post_execute()


class ReleasePartitionsTask(TriggerTask, kind=qc.TASK_KIND_RELEASE_PARTITION, request="release_partitions"):
    def summary(self) -> str:
        return f"release partitions {list(self.request.partition_ids)} of collection {self.collection_id}"

    async def execute(self) -> None:
        self.touched.segments = sum(len(self.env.meta.segment_ids_of(self.collection_id, pid))
                            for pid in set(self.request.partition_ids))
        # Decided now, not when the request was accepted: releases running one after another (two
        # concurrent requests) may together release every loaded partition, and then the nodes must
        # drop the whole collection (its delta and query channels too), as meta does.
        loaded = set(self.env.meta.partition_ids(self.collection_id))
        if loaded and loaded <= set(self.request.partition_ids):
            self.children = self._release_everywhere()
        else:
            self.children = self._release_everywhere(self.request.partition_ids)
        await persist_releasing(self.env.meta, self.collection_id, self.request.partition_ids)

    async def post_execute(self) -> None:
        await self.env.meta.release_partitions(self.collection_id, list(self.request.partition_ids))
        self.env.parked.drop_collections(set(self.env.meta.collection_ids()))

    async def after_failure(self) -> None:
        await self.post_execute()


class LoadBalanceTask(TriggerTask, kind=qc.TASK_KIND_LOAD_BALANCE, request="load_balance"):
    """Move segments (and, for a dead node, channels) off the source nodes."""

    @property
    def node_down(self) -> bool:
        return self.request.reason == qc.BALANCE_REASON_NODE_DOWN

    def summary(self) -> str:
        why = qc.BalanceReason.Name(self.request.reason).removeprefix("BALANCE_REASON_").lower()
        return f"balance ({why}) from nodes {list(self.request.source_node_ids)}"

    def collections(self) -> set[int]:
        """What it moves now, and what its planned children move: a resumed balance whose collection was
        released meanwhile must still wait for (and be serialised with) that release."""
        meta = self.env.meta
        out: set[int] = {c.collection_id for c in self.children if c.collection_id}
        for src in self.request.source_node_ids:  # from the places: no view per copy (a checker pass asks often)
            out |= meta.collections_on_node(src)
            out |= {c.collection_id for c in meta.channels_on_node(src)}
        if self.request.collection_id:
            out &= {self.request.collection_id}
        return out

    def _copies_to_move(self) -> dict[tuple[int, int, int], dict[int, list[int]]]:
        """(collection, source node, replica) -> partition -> ids of the copies to move, from the kept place
        groups (``QueryMeta.places_on_node``), no record parsed: a view of each copy of a drained node was a tenth
        of the leader's CPU in a drain at a million segments."""
        meta, wanted, only = self.env.meta, set(self.request.sealed_segment_ids), self.request.collection_id
        out: dict[tuple[int, int, int], dict[int, list[int]]] = {}
        for src in self.request.source_node_ids:
            for cid in [only] if only else sorted(meta.collections_on_node(src)):
                for (_cid, pid, flat), ids in meta.places_on_node(src, cid).items():
                    replica = next((flat[i] for i in range(0, len(flat), 2) if flat[i + 1] == src), 0)
                    moving = [s for s in ids if s in wanted] if wanted else list(ids)
                    if moving:
                        out.setdefault((cid, src, replica), {}).setdefault(pid, []).extend(moving)
        return out

    async def execute(self) -> None:
        if self.node_down:
            # Written by a version that balanced a dead node's copies away in one trigger: the dead node is
            # forgotten now, and the checker loads what it held, one replica at a time (``watchers.forget_node``).
            await self._forget_sources()
            self.children = []
            return
        env = self.env
        sources = list(self.request.source_node_ids)
        # Moves stay within the copy's replica: the source's replica (or a spare joining it) takes them.
        children: list[Task] = []
        for (cid, src, replica), by_pid in sorted(self._copies_to_move().items()):
            infos = await self._load_infos(cid, by_pid)
            children += await plan_children(
                env, self, cid, infos, [], exclude=sources, include=list(self.request.dst_node_ids),
                source_node_id=src, load_type=env.meta.get_load_type(cid) or data_pb2.LOAD_TYPE_COLLECTION,
                replica_id=replica,
            )
        self.children = children

    async def _load_infos(self, cid: int, by_pid: dict[int, list[int]]) -> list[data_pb2.SegmentLoadInfo]:
        infos = []
        gone: list[int] = []
        for pid, ids in by_pid.items():
            _, binlogs = await self.env.broker.get_recovery_info(cid, pid, ids)
            found = {b.segment_id for b in binlogs}
            gone += [i for i in ids if i not in found]
            infos += [segment_load_info(b) for b in binlogs]
        if gone:
            logger.info("{}: segments {} left the catalog; dropping them from query meta", self.describe(), gone)
            await self.env.meta.remove_segments(gone)
        return infos

    async def _forget_sources(self) -> None:
        for src in self.request.source_node_ids:
            if self.env.nodes.is_online(src):
                continue
            await self.env.meta.remove_node(src)
            await self.env.nodes.remove(src)


class HandoffTask(TriggerTask, kind=qc.TASK_KIND_HANDOFF, request="handoff"):
    """Load newly sealed segments of a loaded collection; their compaction sources are released after."""

    def summary(self) -> str:
        return f"handoff {len(self.request.segment_infos)} segments of collection {self.collection_id}"

    async def execute(self) -> None:
        env, cid = self.env, self.collection_id
        info = env.meta.get_collection(cid)
        if info is None:
            return
        released = set(info.released_partition_ids)
        by_pid: dict[int, list[int]] = {}
        for s in self.request.segment_infos:
            if s.partition_id in released or not env.meta.has_partition(cid, s.partition_id):
                continue
            by_pid.setdefault(s.partition_id, []).append(s.segment_id)
        infos: list[data_pb2.SegmentLoadInfo] = []
        for pid, ids in by_pid.items():
            _, binlogs = await env.broker.get_recovery_info(cid, pid, ids)
            infos += [segment_load_info(b) for b in binlogs]
        self.children = []
        await give_spares(env, cid)
        for replica in env.meta.replica_ids(cid):
            # A copy already held in this replica is not loaded again (a re-run after failover).
            todo = [i for i in infos if replica not in env.meta.segment_copies(i.segment_id)]
            if not todo:
                continue
            try:
                self.children += await plan_children(
                    env, self, cid, todo, [], replica_id=replica,
                    load_type=env.meta.get_load_type(cid) or data_pb2.LOAD_TYPE_COLLECTION)
            except NoAvailableNode as exc:
                # This replica cannot take them now: the others still do. The checker loads them here once it
                # can (they are in the target), and keeps their compaction sources served until then.
                park_unplaced(env, cid, replica, todo, by=self.describe(), error=exc)
