"""Child tasks: one call to one query node each, then the query meta that records its effect.

``plan_children`` lives here, next to the tasks it builds: a child's ``reschedule`` plans its replacement the
same way a trigger plans its first children.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from loguru import logger

from proto import data_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.cluster.client import NodeError
from querycoord.common.messages import load_items, rpc_method
from querycoord.task.assign import (
    Planned,
    add_refs,
    head_first,
    merge_by_size,
    query_channels,
    segment_sizes_with_turns,
    segments_by_node,
    sent_request,
    strip_channel,
)
from querycoord.task.model import Task, TaskEnv, TaskError, check_cancelled
from querycoord.task.release_guard import dm_channels_to_keep, segments_to_keep
from querycoord.task.units import place_unit_with_turns, usage_of

QUERYNODE = querynode_pb2.DESCRIPTOR.services_by_name["QueryNode"]
_COMPACTION_FROM = attrgetter("compaction_from")  # read in C: every info of every load is asked
T = TypeVar("T", int, str)  # what a release names: segment ids, channel names


class ChildTask(Task):
    """A call to ``node_id`` (the QueryNode method that takes its request); valid while that node is online, as the
    incarnation it first found there.

    Why the incarnation: a node restarted under its fixed id holds nothing of what its previous process held and
    is forgotten as that one (``watchers.forget_node``). A child that kept retrying through the restart (a DM
    channel watch retries while its node is online) then succeeded on the new process and recorded the watch
    for a replica the new node was not in (it had joined another as a spare): a channel watched twice in that
    one, and the chaos drill's replicas check failing for good. Such a child is rescheduled instead.
    """

    _incarnation: int | None = None  # the create revision of the node's session when the child first ran

    def is_valid(self) -> bool:
        node = self.env.nodes.get(self.node_id)
        if node is None or not node.online:
            return False
        if self._incarnation is None:
            self._incarnation = node.created
        return node.created == self._incarnation

    # A rollback child (``retries.ChildRunner.fail``): it runs for a cancelled tree too.
    undoing = False

    async def call(self, request: Any) -> Any:
        if not self.undoing:
            check_cancelled(self)  # a cancelled tree sends nothing more (a call already in flight ends first)
        client = self.env.nodes.client(self.node_id)
        request.task_id = self.id
        return await client.call(rpc_method(QUERYNODE, request), request)

    async def execute(self) -> None:
        await self.call(self._copy())

    def _copy(self) -> Any:
        req = type(self.request)()
        req.CopyFrom(self.request)
        return req


class LoadSegmentsTask(ChildTask, kind=qc.TASK_KIND_LOAD_SEGMENT, request="load_segments"):
    def summary(self) -> str:
        return f"load {self.segment_count()} segments of collection {self.collection_id}"

    # What the request was planned from, binlog paths included (the catalog's binlogs, or filled load infos when
    # rescheduled); only in memory (the record holds references), and only until the child succeeded.
    full_infos: list[Planned] | None = None
    # The move budget's slot this attempt's call needs (``task.throttle``; set by the runner before each attempt),
    # taken once the node's load gate is this child's: a child queued behind its node's other calls is no call in
    # flight, and holding a cluster slot there starved other nodes (a lost node's repair at a million segments:
    # three children per node took the 16 cluster slots of five nodes, two nodes idle until those ended).
    move_slot: contextlib.AbstractAsyncContextManager[Any] = contextlib.nullcontext()

    def segment_refs(self) -> tuple[Sequence[int], Sequence[int]]:
        """(segment ids, partition ids) of this child's segments, in order: its record's references, or the
        stripped infos of a record written before references existed (reloaded after an upgrade)."""
        req = self.request
        if req.HasField("planned"):
            return req.planned.segment_ids, req.planned.partition_ids
        return [i.segment_id for i in req.infos], [i.partition_id for i in req.infos]

    def segment_count(self) -> int:
        req = self.request
        return len(req.planned.segment_ids) if req.HasField("planned") else len(req.infos)

    async def filled_request(self) -> querynode_pb2.LoadSegmentsRequest:
        """The request to send (a trigger parking it reads its segments' load infos too): what was planned, or after
        a reload (a new leader has the record's references only) the catalog's records of the referenced segments,
        asked again (``sent_request``).

        The catalog is asked only after a reload: re-reading what planning had just read cost 20 % of a load.
        """
        if self.full_infos is not None:
            return sent_request(self.request, self.full_infos)
        segment_ids, partition_ids = self.segment_refs()
        by_partition: dict[int, list[int]] = {}
        for sid, pid in zip(segment_ids, partition_ids, strict=True):
            by_partition.setdefault(pid, []).append(sid)
        known: dict[int, data_pb2.SegmentBinlogs] = {}
        for pid, seg_ids in by_partition.items():
            _, binlogs = await self.env.broker.get_recovery_info(self.request.collection_id, pid, seg_ids)
            known.update({b.segment_id: b for b in binlogs})
        found = []
        for sid in segment_ids:
            b = known.get(sid)
            if b is None:
                # Compacted away since the plan was made: its replacement arrives through handoff.
                logger.info("segment {} left the catalog; skipped by {}", sid, self.describe())
                continue
            found.append(b)
        return sent_request(self.request, found)

    async def execute(self) -> None:
        await self._load()
        # Done: nothing re-sends this request now (only a failed child is retried or rescheduled), so the planned
        # binlog paths are dropped rather than kept until the whole trigger ends (100,000s of them in a big load).
        self.full_infos = None

    async def _load(self) -> None:
        # Filled and sent once this child's turn on the node has come (``TaskEnv.load_gate``); the records are
        # saved after the slot is given back, while the node loads its next request.
        async with contextlib.AsyncExitStack() as held:
            async with self.env.load_gate(self.node_id):
                await held.enter_async_context(self.move_slot)  # held until the records are saved
                req = await self._call_filled()
            if req is None:
                return
            segments = load_items(req)
            await self.env.meta.save_loaded(segments, self.node_id, req.replica_id)
            replaced = (
                [s for info in segments for s in info.compaction_from] if any(map(_COMPACTION_FROM, segments)) else []
            )
            await self._release_moved_and_replaced(req, replaced)

    async def _call_filled(self) -> querynode_pb2.LoadSegmentsRequest | None:
        """Fill the request and send it; the request sent, or None when nothing was left to load."""
        req = await self.filled_request()
        # Partitions released since the plan (a resumed balance or handoff after a release): loading
        # them would leave copies that nothing records.
        # Asked once per (collection, partition) of the request, not per segment.
        meta = self.env.meta
        segments = load_items(req)
        pairs = {(i.collection_id, i.partition_id) for i in segments}
        gone = {(cid, pid) for cid, pid in pairs if not meta.has_partition(cid, pid)}
        if gone:
            kept = [i for i in segments if (i.collection_id, i.partition_id) not in gone]
            del segments[:]
            segments.extend(kept)
        if not segments:
            return None
        await self.call(req)
        return req

    async def _release_moved_and_replaced(self, req: querynode_pb2.LoadSegmentsRequest, replaced: list[int]) -> None:
        """A balance move releases the source copy; a handoff releases ``replaced``, the compaction sources.

        Best effort: a copy left behind on a node is released by the checker; the
        segment is already served by its new node, which is what matters. A source
        whose release failed stays recorded on its node: it is still held there.
        """
        releases: dict[int, list[int]] = {}
        if req.source_node_id and req.source_node_id != self.node_id:
            releases[req.source_node_id] = [i.segment_id for i in load_items(req)]
        forget: dict[int, list[int]] = {}  # this replica's copies of the compaction sources, by node
        for seg_id in replaced:
            node = self.env.meta.segment_copies(seg_id).get(req.replica_id)
            if node:
                releases.setdefault(node, []).append(seg_id)
                forget.setdefault(node, []).append(seg_id)
        for node_id, seg_ids in releases.items():
            if not self.env.nodes.is_online(node_id):
                continue
            try:
                await self.env.nodes.client(node_id).call(
                    "ReleaseSegments",
                    querynode_pb2.ReleaseSegmentsRequest(
                        collection_id=req.collection_id, segment_ids=seg_ids, task_id=self.id
                    ),
                )
            except NodeError as exc:
                logger.warning("{}: releasing {} on node {} failed: {}", self.describe(), seg_ids, node_id, exc)
                forget.pop(node_id, None)  # still held there: meta says so, and the checker releases it later
        for node_id, seg_ids in forget.items():
            await self.env.meta.remove_segment_copies(node_id, seg_ids)

    async def reschedule(self) -> list[Task]:
        excluded = [*self.rec.excluded_node_ids, self.node_id]
        parent = self.parent
        assert parent is not None
        req = await self.filled_request()
        return await plan_children(
            self.env,
            parent,
            req.collection_id,
            list(load_items(req)),
            [],
            exclude=excluded,
            source_node_id=req.source_node_id,
            load_type=req.load_type,
            replica_id=req.replica_id,
        )


class WatchDmChannelsTask(ChildTask, kind=qc.TASK_KIND_WATCH_DM_CHANNEL, request="watch_dm_channels"):
    """Watch DM channels on a node; retried there while the node is online, moved only when it is gone.

    A watch that failed may still be in place on the node (a reply lost on a cut link, or the node
    already watching the channel for an earlier load): moving it to another node while this one
    lives would leave the channel watched twice (until the checker releases the second watcher).
    """

    RETRY_WHILE_NODE_ONLINE = True

    def summary(self) -> str:
        return "watch dm " + ", ".join(i.channel_name for i in self.request.infos)

    async def execute(self) -> None:
        if not self.env.meta.has_collection(self.request.collection_id):  # released meanwhile: see above
            logger.info("{}: collection {} is no longer loaded; skipped", self.describe(), self.request.collection_id)
            return
        await self.call(self._copy())
        await self.env.meta.save_dm_channel_watch(
            [
                data_pb2.DmChannelWatchInfo(
                    collection_id=self.request.collection_id,
                    dm_channel=i.channel_name,
                    node_id=self.node_id,
                    partition_ids=list(self.request.partition_ids),
                    replica_id=self.request.replica_id,
                )
                for i in self.request.infos
            ]
        )

    async def reschedule(self) -> list[Task]:
        parent = self.parent
        assert parent is not None
        return await plan_children(
            self.env,
            parent,
            self.request.collection_id,
            [],
            list(self.request.infos),
            exclude=[*self.rec.excluded_node_ids, self.node_id],
            partition_ids=list(self.request.partition_ids),
            load_type=self.request.load_type,
            replica_id=self.request.replica_id,
        )


class _SegmentServingWatch(ChildTask):
    """A delta or query channel watch: it only serves the segments loaded on its node.

    Never rescheduled: when the node is gone, the segments' rescheduled loads bring their own watches.
    Skipped when the collection is no longer loaded (a resumed balance or handoff whose collection was released
    meanwhile): the watch would serve nothing and nothing would ever release it.
    """

    async def execute(self) -> None:
        if not self.env.meta.has_collection(self.request.collection_id):
            logger.info("{}: collection {} is no longer loaded; skipped", self.describe(), self.request.collection_id)
            return
        await super().execute()

    async def reschedule(self) -> list[Task]:
        return []


class WatchDeltaChannelsTask(_SegmentServingWatch, kind=qc.TASK_KIND_WATCH_DELTA_CHANNEL,
                             request="watch_delta_channels"):
    def summary(self) -> str:
        return "watch delta " + ", ".join(i.channel_name for i in self.request.infos)


class WatchQueryChannelTask(_SegmentServingWatch, kind=qc.TASK_KIND_WATCH_QUERY_CHANNEL, request="add_query_channel"):
    def summary(self) -> str:
        return f"watch query channel {self.request.query_channel}"


class _ReleaseChild(ChildTask):
    """A release: retried while its node is online; an offline node holds nothing, so it counts as done.

    A node that just crashed is still "online" until its session lapses (one
    TTL); giving up after the retry budget would fail the release half-done,
    so release children keep retrying until the node is declared offline.
    """

    RETRY_WHILE_NODE_ONLINE = True

    async def execute(self) -> None:
        if not self.env.nodes.is_online(self.node_id):
            return
        await self.call(self._copy())

    def is_valid(self) -> bool:
        return True

    def retryable_on_node(self) -> bool:
        return self.env.nodes.is_online(self.node_id)

    async def reschedule(self) -> list[Task]:
        if self.env.nodes.is_online(self.node_id):
            raise TaskError(f"{self.describe()} failed {self.rec.retry_count} times on an online node")
        return []

    async def _release_all_but(self, items: list[T], keep: Collection[T], field: str, why: str) -> list[T]:
        """Ask the node to release ``items`` but ``keep`` (each kept one logged with ``why`` it stays): the request
        with its repeated ``field`` narrowed to the rest. Returns the rest; nothing is sent when it is empty."""
        if keep:
            logger.info("{}: kept {} on node {}: {}", self.describe(), sorted(keep), self.node_id, why)
            items = [x for x in items if x not in keep]
        if items:
            sent = self._copy()
            getattr(sent, field)[:] = items
            await self.call(sent)
        return items


class ReleaseSegmentsTask(_ReleaseChild, kind=qc.TASK_KIND_RELEASE_SEGMENT, request="release_segments"):
    """The checker's release of copies (``task.repair``), weighed again when it runs (``release_guard``)."""

    def summary(self) -> str:
        return f"release {len(self.request.segment_ids)} segments"

    async def execute(self) -> None:
        env, req = self.env, self.request
        ids = list(req.segment_ids)
        if env.nodes.is_online(self.node_id):
            keep = await segments_to_keep(env, req.collection_id, self.node_id, ids)
            ids = await self._release_all_but(ids, keep, "segment_ids", "now the only copy its replica holds")
            if not ids:
                return
        # Only the copies on this node: releasing a duplicate (or one replica's copy) must not forget the others.
        # Recorded only once the node said it let them go (a failed call raised above); an offline node holds none.
        await env.meta.remove_segment_copies(self.node_id, ids)


class ReleaseDmChannelsTask(_ReleaseChild, kind=qc.TASK_KIND_RELEASE_DM_CHANNEL, request="release_dm_channels"):
    """The checker's release of DM channel watches (a second watcher in a replica, a watcher in no replica),
    weighed again when it runs (``release_guard``)."""

    def summary(self) -> str:
        return "release dm " + ", ".join(self.request.channel_names)

    async def execute(self) -> None:
        env, req = self.env, self.request
        names = list(req.channel_names)
        if env.nodes.is_online(self.node_id):
            keep = dm_channels_to_keep(env, req.collection_id, self.node_id, names)
            names = await self._release_all_but(names, keep, "channel_names", "now its replica's only watcher")
            if not names:
                return
        # As for segments: recorded only once the node stopped watching (or is gone).
        await env.meta.remove_dm_channel_copies(self.node_id, req.collection_id, names)


class ReleaseCollectionOnNodeTask(_ReleaseChild, kind=qc.TASK_KIND_RELEASE_COLLECTION,
                                  request="release_collection_on_node"):
    def summary(self) -> str:
        return f"release collection {self.request.collection_id}"


class ReleasePartitionsOnNodeTask(_ReleaseChild, kind=qc.TASK_KIND_RELEASE_PARTITION,
                                  request="release_partitions_on_node"):
    def summary(self) -> str:
        return f"release partitions {list(self.request.partition_ids)}"


async def plan_children(
    env: TaskEnv,
    parent: Task,
    collection_id: int,
    segments: Sequence[Planned],
    channels: Sequence[data_pb2.VChannelInfo],
    *,
    exclude: Sequence[int] = (),
    include: Sequence[int] = (),
    source_node_id: int = 0,
    load_type: data_pb2.LoadType = data_pb2.LOAD_TYPE_COLLECTION,
    partition_ids: Sequence[int] = (),
    replica_id: int = 0,
) -> list[Task]:
    """Children (without ids) that load ``segments`` and watch ``channels``; see module docstring.

    ``segments`` are the catalog's binlogs (a planned load: each child fills its load infos when it calls) or
    load infos (a reschedule, a balance). A binlog's wire size is its load info's (the same fields, all with
    one-byte tags: tests/test_load_plan.py), so requests are merged to the same sizes either way.

    With a ``replica_id``, only that replica's nodes take the work; when they have no room, spare nodes (online,
    in no replica of the collection) are offered too, and a spare that receives work joins the replica (persisted
    before the children are: a replica's copies are always on its own nodes). Replica 0 (a collection loaded
    before replicas) may use any node (``units.place_unit``).

    Nothing waits for room: what cannot be placed now raises ``NoAvailableNode`` at once, and the caller fails
    (a user's load) or parks the unit (a repair or a handoff: ``task.parking``).
    """
    cfg = env.config
    sizes = await segment_sizes_with_turns(segments)
    placed = await place_unit_with_turns(env, collection_id, replica_id, sizes, [c.channel_name for c in channels],
                                         usage_of(env), exclude=exclude, include=include)
    if replica_id:
        used = set(placed["segments"].values()) | set(placed["channels"].values())
        joining = sorted(used - set(env.meta.replica_nodes(collection_id, replica_id)))
        if joining:
            logger.info("{}: spare nodes {} join replica {} of collection {}", parent.describe(), joining,
                        replica_id, collection_id)
            await env.meta.add_replica_nodes(collection_id, replica_id, joining)
    cond = parent.rec.trigger_condition
    excluded = list(exclude)
    children: list[Task] = []

    per_node = await segments_by_node(segments, sizes, placed["segments"])
    for node_id, infos in sorted(per_node.items()):
        for group in head_first(merge_by_size(infos, cfg.max_request_bytes)):
            await asyncio.sleep(0)  # a group is up to a few thousand segments: a turn between groups
            req = querynode_pb2.LoadSegmentsRequest(
                collection_id=collection_id,
                source_node_id=source_node_id,
                load_type=load_type,
                replica_id=replica_id,
            )
            child = LoadSegmentsTask.new(env, req, trigger_condition=cond, collection_id=collection_id,
                                         node_id=node_id, parent=parent, excluded=excluded)
            add_refs(child.request.planned, group)  # into the record itself, not copied there
            child.full_infos = group
            children.append(child)

    for ch in channels:
        node_id = placed["channels"][ch.channel_name]
        req = querynode_pb2.WatchDmChannelsRequest(
            collection_id=collection_id, partition_ids=list(partition_ids), infos=[strip_channel(ch)],
            load_type=load_type, replica_id=replica_id,
        )
        children.append(WatchDmChannelsTask.new(env, req, trigger_condition=cond, collection_id=collection_id,
                                                node_id=node_id, parent=parent, excluded=excluded))

    receivers = sorted(set(per_node) | set(placed["channels"].values()))
    delta = env.meta.get_delta_channels(collection_id)
    query, result = query_channels(collection_id)
    for node_id in receivers:
        if delta and node_id in per_node:
            req = querynode_pb2.WatchDeltaChannelsRequest(collection_id=collection_id, infos=list(delta))
            children.append(WatchDeltaChannelsTask.new(env, req, trigger_condition=cond,
                                                       collection_id=collection_id, node_id=node_id, parent=parent,
                                                       excluded=excluded))
        qreq = querynode_pb2.AddQueryChannelRequest(
            collection_id=collection_id, query_channel=query, query_result_channel=result
        )
        children.append(WatchQueryChannelTask.new(env, qreq, trigger_condition=cond, collection_id=collection_id,
                                                  node_id=node_id, parent=parent, excluded=excluded))
    return children

