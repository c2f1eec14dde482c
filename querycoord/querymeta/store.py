"""``QueryMeta``: the coordinator's record of what is loaded, persisted in etcd.

What it stores (keys in ``keys``): one ``CollectionLoadInfo`` per loaded
collection (load type, partition states and percentages, released
partitions), one ``SegmentInfo`` per loaded segment (node, rows, memory),
one ``DmChannelWatchInfo`` per watched DM channel (which node; Milvus kept
this only in memory and lost it on restart) and the delta channels of each
collection. A new leader calls ``reload`` and carries on from there; a
standby builds one on a plain ``MetaKV`` and only calls ``reload`` and the
getters.

Rules every write follows:

1. **etcd first, then memory.** A write plans its txns, sends them through
   the ``MetaKV`` it was given (the leader passes its ``FencedKV``, so every
   txn carries the fence), and changes memory only after etcd accepted the
   txn. A refused write (``NotLeader``, ``RequestTooLarge``, a validation
   error) leaves memory as it was. ``MetaUnavailable`` also leaves memory
   unchanged, but etcd may have applied the txn before the answer was lost,
   so ``needs_reload`` is set and the owner should ``reload`` (see
   ``TxnWriter``).
2. **One writer per collection at a time, or savers of distinct segments.**
   Writes read memory to plan (read-modify-write of the collection record,
   "which keys does this node have"), so each write holds the lock of every
   collection it touches (taken in id order: no deadlock). Segment saves and
   removals hold it shared, beside each other, and claim the segment ids
   they write (two writes of one segment never overlap); every other write
   holds it alone (``querymeta.locks``). Reads take no lock: memory only
   changes between awaits, never half-way through an index update.
3. **A started write finishes.** A caller cancelled while its txn is in
   flight gets ``CancelledError``, but the write itself runs on (shielded)
   and applies its result to memory. Otherwise a txn committed in etcd
   would be missing from memory, and a later removal planned from memory
   would leave its key behind forever. ``drain`` waits for such writes.
4. **Range deletes for releases.** ``release_collection`` is one txn: the
   collection key plus one range delete per record kind, so it removes
   every record of the collection however many there are, including records
   memory does not know (left by a crash or skipped as corrupt).
5. **Segment and channel records may be written in several txns.** They are
   facts about which node holds what; the checker (right after a failover,
   then periodically) re-derives them from the nodes, so a batch cut in two
   by a crash is repaired there. Collection records, the intent, are always one put.
6. **Stored stripped.** Fields the catalog can tell again (index file paths
   of a segment; flushed and dropped segment ids of a delta channel) are
   cleared before storing, as ``proto/data.proto`` prescribes for persisted
   records, so records stay small and bounded.

Getters return copies: the caller may modify them freely.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence, Set
from types import MappingProxyType
from typing import TypeVar

from loguru import logger

from meta.kv import DEFAULT_PAGE_SIZE, MetaKV
from meta.txn import Op, Put
from proto import data_pb2
from querycoord.messages import LoadItem
from querycoord.yielding import every_few

from . import keys
from .batch import Mutation, TxnWriter
from .copies import copies, view_of, with_copy, without_node
from .errors import CollectionNotLoaded, CorruptRecord, LoadTypeConflict, PartitionNotLoaded
from .index import MetaIndex, NewSegment
from .locks import CollectionLock, RecordClaims
from .records import (
    SEALED,
    CollectionLoadInfo,
    DmChannelWatchInfo,
    SegmentInfo,
    VChannelInfo,
    add_partitions,
    collection_percentage,
    copy_message,
    decode_into,
    loaded_record,
    stored_delta_channel,
    stored_segment,
    warn_orphans,
)

PartitionLoadInfo = data_pb2.PartitionLoadInfo
PartitionState = data_pb2.PartitionState
IN_MEMORY = data_pb2.PARTITION_STATE_IN_MEMORY

Record = CollectionLoadInfo | SegmentInfo | DmChannelWatchInfo | VChannelInfo
T = TypeVar("T")

_LOAD_TYPES = (data_pb2.LOAD_TYPE_PARTITION, data_pb2.LOAD_TYPE_COLLECTION)


def _check_id(what: str, value: int) -> int:
    """Ids are positive int64: a 0 is almost always a field the caller forgot to set."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} id must be a positive integer, got {value!r}")
    return value


def _checked_segment_ids(segs: Sequence[SegmentInfo | LoadItem]) -> set[int]:
    """The segment ids of a save, each checked with its collection and partition ids, and none twice.

    Protobuf ids are ints, so a save of valid records (every load) needs three ``min``s and a set; only a bad
    one takes the loop that finds the first offender and names it.
    """
    sids = [s.segment_id for s in segs]
    seen = set(sids)
    if segs and len(seen) == len(sids) and min(sids) > 0:
        if min(s.collection_id for s in segs) > 0 and min(s.partition_id for s in segs) > 0:
            return seen
    seen = set()
    for seg in segs:
        _check_id("segment", seg.segment_id)
        _check_id("collection", seg.collection_id)
        _check_id("partition", seg.partition_id)
        if seg.segment_id in seen:
            raise ValueError(f"segment {seg.segment_id} appears twice in one save")
        seen.add(seg.segment_id)
    return seen


def _unique_ids(what: str, ids: Iterable[int]) -> list[int]:
    seen: dict[int, None] = {}
    for i in ids:
        seen[_check_id(what, i)] = None
    return list(seen)


def _check_percentage(percentage: int) -> None:
    if isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100:
        raise ValueError(f"percentage must be an integer in 0..100, got {percentage!r}")


def _check_replicas(collection_id: int, replicas: list[data_pb2.ReplicaInfo]) -> None:
    """Replicas of a new load: positive distinct ids, of this collection, with disjoint nodes."""
    ids: set[int] = set()
    nodes: set[int] = set()
    for r in replicas:
        _check_id("replica", r.replica_id)
        if r.replica_id in ids:
            raise ValueError(f"replica {r.replica_id} appears twice")
        if r.collection_id != collection_id:
            raise ValueError(f"replica {r.replica_id} belongs to collection {r.collection_id}, not {collection_id}")
        shared = nodes.intersection(r.node_ids)
        if shared:
            raise ValueError(f"nodes {sorted(shared)} are in two replicas of collection {collection_id}")
        ids.add(r.replica_id)
        nodes.update(r.node_ids)


def _leave_replicas(info: CollectionLoadInfo, node_id: int) -> CollectionLoadInfo:
    """A copy of the record with ``node_id`` out of every replica (the node is gone)."""
    out = copy_message(info)
    for r in out.replicas:
        if node_id in r.node_ids:
            r.node_ids[:] = [n for n in r.node_ids if n != node_id]
    return out


def _copies_tail(replica_id: int, node_id: int) -> bytes:
    """The serialized copy lists of a one-copy record, to append to the rest of it serialized.

    Why: appending the two lists to every record of a load cost more than serializing it. Protobuf
    serializes fields in number order and the lists are the record's last fields (12, 13), so the rest
    serialized, then this, are the bytes of the whole record serialized (test_querymeta checks it).
    """
    return SegmentInfo(node_ids=[node_id], replica_ids=[replica_id]).SerializeToString()


def _log_abandoned_write(task: asyncio.Task[object]) -> None:
    """Outcome of a write whose caller was cancelled: nobody else will look at it."""
    if task.cancelled():
        logger.warning("query meta write cancelled while in flight; memory may lag etcd until reload")
    elif task.exception() is not None:
        logger.warning("query meta write finished after its caller was cancelled, and failed: {}", task.exception())


class QueryMeta:
    """Collections, partitions, segments and channels of the query coordinator (see module docstring)."""

    def __init__(self, kv: MetaKV):
        self._kv = kv
        self._writer = TxnWriter(kv)
        self._index = MetaIndex()
        self._locks: dict[int, CollectionLock] = {}
        self._claims = RecordClaims()
        self._inflight: set[asyncio.Task[object]] = set()
        self._corrupt: dict[str, str] = {}
        self._progress: dict[int, dict[int, int]] = {}
        self._replica_progress: dict[int, dict[int, int]] = {}
        self._flushing: set[int] = set()
        self._generation = 0  # bumped when the index is replaced (reload, adopt): see ``change_mark``

    # ===== state of the store itself ===========================================
    @property
    def kv(self) -> MetaKV:
        return self._kv

    @property
    def txn_count(self) -> int:
        """Write txns etcd accepted from this instance (for benchmarks and tests)."""
        return self._writer.txns

    @property
    def needs_reload(self) -> bool:
        """A write ended in ``MetaUnavailable``: etcd may hold it or not; ``reload`` to be sure."""
        return self._writer.in_doubt

    @property
    def corrupt_keys(self) -> dict[str, str]:
        """Keys skipped by the last ``reload`` because their record is unreadable, with the reason."""
        return dict(self._corrupt)

    # ===== reload ================================================================
    async def reload(self, *, strict: bool = False, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        """Replace memory with what etcd holds under the four prefixes (paged loads).

        The new state is built aside and swapped in at once, so readers never
        see half a reload and a failed reload keeps the old state.

        A corrupt record (unparseable, or not matching its key) is logged,
        skipped and listed in ``corrupt_keys`` unless ``strict``. Why skip
        rather than refuse to start: a refusal would stop every future leader
        (the whole cluster) on one bad value, while skipping costs little:
        a skipped segment or channel record is re-derived by the checker
        from the nodes, a skipped collection shows as not loaded and can be
        loaded again, and memory still shows nothing etcd lacks. Range
        deletes of a later release remove skipped keys too; ``purge_corrupt``
        removes them at once.

        Records of collections or partitions that are not loaded (orphans:
        only a crash between txns of a non-atomic write or a foreign writer
        leaves them) are kept, as they are what etcd holds, and logged.
        """
        await self.drain()
        snapshots = await asyncio.gather(*(self._kv.load_prefix(p, page_size=page_size) for p in keys.ALL_PREFIXES))
        fresh = MetaIndex()
        corrupt: dict[str, str] = {}
        for prefix, snapshot in zip(keys.ALL_PREFIXES, snapshots, strict=True):
            async for key, value in every_few(snapshot.items()):  # built aside: turns are safe
                try:
                    decode_into(fresh, prefix, key, value)
                except CorruptRecord as exc:
                    if strict:
                        raise
                    logger.error("query meta reload skips {}", exc)
                    corrupt[key] = exc.reason
        warn_orphans(fresh)
        self._index = fresh
        self._generation += 1
        self._corrupt = corrupt
        self._writer.in_doubt = False
        logger.info(
            "query meta reloaded: {} collections, {} segments, {} DM channels, {} skipped as corrupt",
            len(fresh.collections),
            len(fresh.segments),
            sum(len(c) for c in fresh.dm_channels.values()),
            len(corrupt),
        )

    def adopt(self, index: MetaIndex, corrupt: dict[str, str]) -> None:
        """Start from a copy a warm standby kept current (``mirror.MetaMirror.take``) instead of reading etcd.

        The copy equals what ``reload`` would build at the revision it was taken at, and nothing but this
        coordinator writes after that revision (it holds the fence), so the two are interchangeable; this one
        costs nothing at a million segments.
        """
        for key, reason in corrupt.items():
            logger.error("query meta reload skips {}", CorruptRecord(key, reason))
        self._index = index
        self._generation += 1
        self._corrupt = dict(corrupt)
        self._writer.in_doubt = False
        logger.info(
            "query meta taken over from the warm standby's copy: {} collections, {} segments, {} DM channels, "
            "{} skipped as corrupt",
            len(index.collections),
            len(index.segments),
            sum(len(c) for c in index.dm_channels.values()),
            len(corrupt),
        )

    @classmethod
    def reading(cls, kv: MetaKV, index: MetaIndex) -> QueryMeta:
        """A read-only view of ``index``, which another owner keeps current (the warm standby's mirror): a
        standby answers reads from it without a reload. Its getters copy what they return; use it between two
        awaits (the owner changes the index in place as etcd changes) and never write through it."""
        meta = cls(kv)
        meta._index = index
        return meta

    async def drain(self) -> None:
        """Wait for writes still in flight (also those whose callers were cancelled)."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    def change_mark(self, collection_id: int) -> tuple[int, int]:
        """A value that changes whenever the collection's records change (a reload included): what a reader that
        derives something costly from them (``querycoord.served``) keys its cache by."""
        return self._generation, self._index.changes.get(collection_id, 0)

    # ===== collections and partitions: reads =======================================
    def collections(self) -> list[CollectionLoadInfo]:
        """Every loaded collection, by id."""
        return [copy_message(self._index.collections[c]) for c in sorted(self._index.collections)]

    def collection_ids(self) -> list[int]:
        return sorted(self._index.collections)

    def get_collection(self, collection_id: int) -> CollectionLoadInfo | None:
        info = self._index.collections.get(collection_id)
        return copy_message(info) if info is not None else None

    def has_collection(self, collection_id: int) -> bool:
        return collection_id in self._index.collections

    def has_partition(self, collection_id: int, partition_id: int) -> bool:
        """Whether the partition is loaded (a released partition is not)."""
        info = self._index.collections.get(collection_id)
        return info is not None and any(p.partition_id == partition_id for p in info.partitions)

    def partition_ids(self, collection_id: int) -> list[int]:
        """Loaded partitions of the collection in load order; [] when the collection is not loaded."""
        info = self._index.collections.get(collection_id)
        return [p.partition_id for p in info.partitions] if info is not None else []

    def get_partition(self, collection_id: int, partition_id: int) -> PartitionLoadInfo | None:
        info = self._index.collections.get(collection_id)
        for p in info.partitions if info is not None else ():
            if p.partition_id == partition_id:
                return copy_message(p)
        return None

    def get_load_type(self, collection_id: int) -> data_pb2.LoadType:
        """How the collection was loaded; ``LOAD_TYPE_UNSPECIFIED`` (0, falsy) when it is not loaded.

        Not an exception: every caller (the API's conflict checks, balance)
        asks this of collections that may well not be loaded.
        """
        info = self._index.collections.get(collection_id)
        return info.load_type if info is not None else data_pb2.LOAD_TYPE_UNSPECIFIED

    # ===== replicas ====================================================================
    def replicas_of(self, collection_id: int) -> list[data_pb2.ReplicaInfo]:
        """The collection's replicas by id, each with its nodes (sorted), progress, copies held and DM channels.

        A collection loaded before replicas existed has none recorded: it shows one replica, id 0, on the nodes
        that hold its copies. [] when the collection is not loaded.
        """
        info = self._index.collections.get(collection_id)
        if info is None:
            return []
        view = self._index.view("replicas", collection_id, lambda: self._replicas_of(info))
        return [copy_message(r) for r in view]

    def _replicas_of(self, info: CollectionLoadInfo) -> list[data_pb2.ReplicaInfo]:
        collection_id = info.collection_id
        replicas = [copy_message(r) for r in info.replicas] or [data_pb2.ReplicaInfo(
            replica_id=0, collection_id=collection_id, in_memory_percentage=info.in_memory_percentage)]
        held: dict[int, int] = {}
        nodes: dict[int, set[int]] = {}
        places = self._index.segments.places()
        for sid in self._index.segment_ids_of(collection_id):
            flat = places[sid][2]
            for r, n in zip(flat[::2], flat[1::2], strict=True):
                held[r] = held.get(r, 0) + 1
                nodes.setdefault(r, set()).add(n)
        channels: dict[int, list[str]] = {}
        for name, watch in sorted(self._index.dm_channels.get(collection_id, {}).items()):
            for r, n in copies(watch).items():
                channels.setdefault(r, []).append(name)
                nodes.setdefault(r, set()).add(n)
        for r in replicas:
            if not info.replicas:
                r.node_ids.extend(sorted(nodes.get(0, ())))
            r.node_ids[:] = sorted(r.node_ids)
            r.segment_count = held.get(r.replica_id, 0)
            r.dm_channels.extend(channels.get(r.replica_id, ()))
        return replicas

    def replica_ids(self, collection_id: int) -> list[int]:
        """Ids of the collection's replicas; [0] for a collection loaded before replicas, [] when not loaded."""
        info = self._index.collections.get(collection_id)
        if info is None:
            return []
        return [r.replica_id for r in info.replicas] or [0]

    def replica_nodes(self, collection_id: int, replica_id: int) -> list[int]:
        """The nodes of one replica (sorted); [] for an unknown replica or the implicit replica 0."""
        info = self._index.collections.get(collection_id)
        for r in info.replicas if info is not None else ():
            if r.replica_id == replica_id:
                return sorted(r.node_ids)
        return []

    def replica_of_node(self, collection_id: int, node_id: int) -> int:
        """The replica of the collection the node serves; 0 when it serves none (a spare)."""
        info = self._index.collections.get(collection_id)
        for r in info.replicas if info is not None else ():
            if node_id in r.node_ids:
                return r.replica_id
        return 0

    def replica_node_ids(self, collection_id: int) -> set[int]:
        """Every node serving some replica of the collection."""
        info = self._index.collections.get(collection_id)
        return {n for r in info.replicas for n in r.node_ids} if info is not None else set()

    async def add_replica_nodes(self, collection_id: int, replica_id: int, node_ids: Iterable[int]) -> None:
        """Give nodes to a replica (spares that will hold its copies). A node already in another replica of the
        collection is refused (``ValueError``): replicas never share a node."""
        nodes = _unique_ids("node", node_ids)

        async def body() -> None:
            current = self._index.collections.get(collection_id)
            if current is None:
                raise CollectionNotLoaded(collection_id)
            info = copy_message(current)
            target = next((r for r in info.replicas if r.replica_id == replica_id), None)
            if target is None:
                raise ValueError(f"collection {collection_id} has no replica {replica_id}")
            for n in nodes:
                other = next((r.replica_id for r in info.replicas if n in r.node_ids), 0)
                if other and other != replica_id:
                    raise ValueError(f"node {n} already serves replica {other} of collection {collection_id}")
                if n not in target.node_ids:
                    target.node_ids.append(n)
            if info != current:
                await self._commit("add_replica_nodes", [self._put_collection(info)], atomic=True)

        await self._guarded(lambda: [collection_id], body)

    async def set_replica_percentages(self, collection_id: int, percentages: Mapping[int, int]) -> None:
        """Set replicas' load percentages exactly (the checker's count of what their nodes hold); unknown
        replicas ignored; written only when something changes."""
        for pct in percentages.values():
            _check_percentage(pct)

        async def body() -> None:
            current = self._index.collections.get(collection_id)
            if current is None:
                return
            info = copy_message(current)
            for r in info.replicas:
                if r.replica_id in percentages:
                    r.in_memory_percentage = percentages[r.replica_id]
            if info != current:
                await self._commit("set_replica_percentages", [self._put_collection(info)], atomic=True)

        await self._guarded(lambda: [collection_id], body)

    # ===== collections and partitions: writes ========================================
    async def add_collection(
        self,
        collection_id: int,
        load_type: data_pb2.LoadType,
        partition_ids: Iterable[int],
        *,
        replica_number: int = 1,
        replicas: Iterable[data_pb2.ReplicaInfo] = (),
    ) -> CollectionLoadInfo:
        """Create the collection's load record, or extend it with more partitions.

        New partitions start NOT_PRESENT at 0 % (which lowers the collection's
        percentage); partitions already loaded keep their state; a partition
        listed in ``released_partition_ids`` is loaded again and leaves that
        list. Loading with the other load type raises ``LoadTypeConflict``.
        ``partition_ids`` may be empty (a re-run whose partitions are all
        loaded already; a collection load creates the record before its
        partitions are known). Nothing is written when nothing changes.
        """
        _check_id("collection", collection_id)
        if load_type not in _LOAD_TYPES:
            raise ValueError(f"load type must be LOAD_TYPE_PARTITION or LOAD_TYPE_COLLECTION, got {load_type!r}")

        new_replicas = [copy_message(r) for r in replicas]
        _check_replicas(collection_id, new_replicas)

        def start(current: CollectionLoadInfo | None) -> CollectionLoadInfo:
            if current is None:
                return CollectionLoadInfo(collection_id=collection_id, load_type=load_type,
                                          replica_number=len(new_replicas) or replica_number,
                                          replicas=new_replicas)
            if current.load_type != load_type:
                raise LoadTypeConflict(collection_id, current.load_type, load_type)
            return copy_message(current)

        return await self._add_partitions("add_collection", collection_id, partition_ids, start)

    async def add_partitions(self, collection_id: int, partition_ids: Iterable[int]) -> CollectionLoadInfo:
        """Load more partitions of a loaded collection (any load type); ``CollectionNotLoaded`` otherwise."""

        def start(current: CollectionLoadInfo | None) -> CollectionLoadInfo:
            if current is None:
                raise CollectionNotLoaded(collection_id)
            return copy_message(current)

        return await self._add_partitions("add_partitions", collection_id, partition_ids, start)

    async def _add_partitions(
        self,
        operation: str,
        collection_id: int,
        partition_ids: Iterable[int],
        start: Callable[[CollectionLoadInfo | None], CollectionLoadInfo],
    ) -> CollectionLoadInfo:
        """Add partitions to the record ``start`` makes of the current one (under the collection's lock).

        Written only when that changes the current record; returns a copy of the result.
        """
        pids = _unique_ids("partition", partition_ids)

        async def body() -> CollectionLoadInfo:
            current = self._index.collections.get(collection_id)
            info = start(current)
            add_partitions(info, pids)
            if info != current:
                await self._commit(operation, [self._put_collection(info)], atomic=True)
            return copy_message(info)

        return await self._guarded(lambda: [collection_id], body)

    async def release_collection(self, collection_id: int) -> None:
        """Remove the collection record and all its segment, DM and delta channel records in ONE txn.

        Four operations whatever the size of the collection: the record and
        three range deletes. Sent even when memory knows nothing of the
        collection, so it also clears records a crash or a corrupt reload
        left behind. Releasing a collection that is not loaded is success.
        """
        _check_id("collection", collection_id)

        async def body() -> None:
            await self._commit("release_collection", [self._release_collection(collection_id)], atomic=True)
            self._progress.pop(collection_id, None)

        await self._guarded(lambda: [collection_id], body)

    async def release_partitions(self, collection_id: int, partition_ids: Iterable[int]) -> bool:
        """Release partitions: their records, their segments, and their ids in DM channel watches.

        Partitions that are not loaded are ignored (releasing nothing is
        success). For a collection loaded as a whole the released ids are
        recorded in ``released_partition_ids`` (handoff skips them). A DM
        watch serving only released partitions is removed; a watch with no
        partition ids (a collection load) stays. When the last loaded
        partition goes, the collection is released as ``release_collection``
        does; returns True then.

        One txn unless more than ~120 partitions and channels change at once;
        then the segment and channel changes go first and the collection
        record last, so the collection record (the commit point) never claims
        fewer partitions than etcd still holds segments for.
        """
        _check_id("collection", collection_id)
        pids = _unique_ids("partition", partition_ids)

        async def body() -> bool:
            current = self._index.collections.get(collection_id)
            if current is None:
                return False
            loaded = [p.partition_id for p in current.partitions]
            released = [p for p in pids if p in loaded]
            if not released:
                return False
            pending = self._progress.get(collection_id, {})
            if len(released) == len(loaded):
                await self._commit("release_partitions", [self._release_collection(collection_id)], atomic=True)
                self._progress.pop(collection_id, None)
                return True
            gone = set(released)
            info = copy_message(current)
            kept = [p for p in info.partitions if p.partition_id not in gone]
            del info.partitions[:]
            info.partitions.extend(kept)
            if info.load_type == data_pb2.LOAD_TYPE_COLLECTION:
                already = set(info.released_partition_ids)
                info.released_partition_ids.extend(p for p in released if p not in already)
            info.in_memory_percentage = collection_percentage(info)
            mutations = [self._drop_partition_segments(collection_id, p) for p in released]
            for watch in self._index.dm_channels.get(collection_id, {}).values():
                if not gone.intersection(watch.partition_ids):
                    continue
                updated = copy_message(watch)
                del updated.partition_ids[:]
                updated.partition_ids.extend(p for p in watch.partition_ids if p not in gone)
                if updated.partition_ids:
                    mutations.append(self._put_dm_channel(updated))
                else:
                    mutations.append(self._drop_dm_channel(watch))
            mutations.append(self._put_collection(info))
            await self._commit("release_partitions", mutations, atomic=False)
            for pid in released:
                pending.pop(pid, None)
            return False

        return await self._guarded(lambda: [collection_id], body)

    async def set_partition_state(
        self,
        collection_id: int,
        partition_id: int,
        state: data_pb2.PartitionState,
        percentage: int,
    ) -> CollectionLoadInfo:
        """Set one partition's state and percentage; the collection's percentage is recomputed in the same put."""
        return await self.set_partition_states(collection_id, {partition_id: (state, percentage)})

    async def set_partition_states(
        self,
        collection_id: int,
        states: Mapping[int, tuple[data_pb2.PartitionState, int]],
    ) -> CollectionLoadInfo:
        """Set several partitions' (state, percentage) in one put, and recompute the collection's percentage.

        The collection percentage is derived (``collection_percentage``), never
        set directly, so it cannot disagree with its partitions.
        """
        for pid, (state, percentage) in states.items():
            _check_id("partition", pid)
            if state not in PartitionState.values():
                raise ValueError(f"unknown partition state {state!r}")
            if isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100:
                raise ValueError(f"percentage must be an integer in 0..100, got {percentage!r}")

        async def body() -> CollectionLoadInfo:
            current = self._index.collections.get(collection_id)
            if current is None:
                raise CollectionNotLoaded(collection_id)
            info = copy_message(current)
            by_id = {p.partition_id: p for p in info.partitions}
            for pid, (state, percentage) in states.items():
                if pid not in by_id:
                    raise PartitionNotLoaded(collection_id, pid)
                by_id[pid].state = state
                by_id[pid].in_memory_percentage = percentage
            info.in_memory_percentage = collection_percentage(info)
            if info.in_memory_percentage == 100:  # every partition loaded: so is every replica
                for r in info.replicas:
                    r.in_memory_percentage = 100
            if info != current:
                await self._commit("set_partition_states", [self._put_collection(info)], atomic=True)
            return copy_message(info)

        return await self._guarded(lambda: [collection_id], body)

    def set_progress(self, collection_id: int, partition_id: int, percentage: int) -> None:
        """Report a partition's load progress without waiting; it is persisted in the background.

        For callbacks that cannot await (a child finished). Reports are
        coalesced per collection (at most one put in flight per collection,
        carrying the latest values) and only ever raise a percentage: a late
        report cannot undo a ``set_partition_state(..., IN_MEMORY, 100)`` or
        lower progress already stored. State becomes PARTIAL_IN_MEMORY, or
        IN_MEMORY at 100. Memory changes only once etcd has the put (rule 1),
        so the new value shows after the flush; ``drain`` waits for it. A
        failed flush is logged and dropped: progress is advisory, the final
        ``set_partition_state`` is what counts. Reports for partitions that
        are not loaded (or get released meanwhile) are ignored.
        """
        _check_id("partition", partition_id)
        _check_percentage(percentage)
        pending = self._progress.setdefault(collection_id, {})
        pending[partition_id] = max(percentage, pending.get(partition_id, 0))
        self._flush_soon(collection_id)

    def set_replica_progress(self, collection_id: int, replica_id: int, percentage: int) -> None:
        """Report one replica's load progress, as ``set_progress`` does for a partition (coalesced, raised only)."""
        _check_percentage(percentage)
        pending = self._replica_progress.setdefault(collection_id, {})
        pending[replica_id] = max(percentage, pending.get(replica_id, 0))
        self._flush_soon(collection_id)

    def _flush_soon(self, collection_id: int) -> None:
        if collection_id not in self._flushing:
            self._flushing.add(collection_id)
            task = asyncio.get_running_loop().create_task(self._flush_progress(collection_id))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _flush_progress(self, collection_id: int) -> None:
        try:
            while self._progress.get(collection_id) or self._replica_progress.get(collection_id):
                pending = self._progress.pop(collection_id, {})
                replicas = self._replica_progress.pop(collection_id, {})

                async def body(pending: dict[int, int] = pending, replicas: dict[int, int] = replicas) -> None:
                    current = self._index.collections.get(collection_id)
                    if current is None:
                        return
                    info = copy_message(current)
                    for r in info.replicas:
                        r.in_memory_percentage = max(r.in_memory_percentage, replicas.get(r.replica_id, 0))
                    for p in info.partitions:
                        want = pending.get(p.partition_id)
                        if want is None or want <= p.in_memory_percentage or p.state == IN_MEMORY:
                            continue
                        p.in_memory_percentage = want
                        p.state = IN_MEMORY if want == 100 else data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY
                    info.in_memory_percentage = collection_percentage(info)
                    if info != current:
                        await self._commit("set_progress", [self._put_collection(info)], atomic=True)

                await self._locked(lambda: [collection_id], body, None)
        except Exception as exc:
            logger.warning("load progress of collection {} not persisted (advisory, dropped): {}", collection_id, exc)
        finally:
            self._flushing.discard(collection_id)

    # ===== segments ================================================================
    def get_segment(self, segment_id: int) -> SegmentInfo | None:
        """The segment's record (the caller's own copy): every copy in ``node_ids``/``replica_ids`` (``node_id``:
        the lowest replica's)."""
        return self._index.segments.get(segment_id)

    def segment_copies(self, segment_id: int) -> dict[int, int]:
        """replica id -> node id of every recorded copy of the segment ({} when it has none)."""
        place = self._index.segments.place(segment_id)
        if place is None:
            return {}
        flat = place[2]
        return dict(zip(flat[::2], flat[1::2], strict=True))

    def segments_of(self, collection_id: int, partition_id: int | None = None) -> list[SegmentInfo]:
        """Segments of a collection (or of one partition), by segment id (the caller's own copies)."""
        ids = self._index.segment_ids_of(collection_id, partition_id)
        return [self._index.segments[s] for s in ids]

    def segment_ids_of(self, collection_id: int, partition_id: int | None = None) -> list[int]:
        """Ids only, sorted: no copies, for hot paths such as progress (``segments_of`` copies every record)."""
        return self._index.segment_ids_of(collection_id, partition_id)

    def segment_id_set(self, collection_id: int) -> set[int]:
        """Ids of the collection's segments as a new set, unsorted: ``segment_ids_of`` without the sort, for set
        arithmetic over a million ids (the checker's diff)."""
        return set().union(*self._index.segments_by_partition.get(collection_id, {}).values())

    def partition_segment_ids(self, collection_id: int, partition_id: int) -> Set[int]:
        """Ids of the partition's recorded segments, read-only and not copied (a million-segment partition is
        counted, not copied, by ``querycoord.served``); empty when it has none."""
        return self._index.segments_by_partition.get(collection_id, {}).get(partition_id, frozenset())

    def dm_channel_copies(self, collection_id: int) -> dict[str, dict[int, int]]:
        """Each recorded DM channel of the collection: replica id -> watching node."""
        return {name: copies(w) for name, w in self._index.dm_channels.get(collection_id, {}).items()}

    def segment_places(self) -> Mapping[int, tuple[int, int, tuple[int, ...]]]:
        """Every segment's (collection, partition, copies as replica, node, replica, node...) by id, read-only and
        without parsing a record: for loops over many segments (the checker's diff, once per pass).

        The view is of the index this instance has now: after a ``reload`` it still shows the places of before
        (a fresh call shows the new ones).
        """
        return MappingProxyType(self._index.segments.places())

    def segments_on_node(self, node_id: int) -> list[SegmentInfo]:
        """The copies recorded on the node, by segment id (node 0, "no node", has none).

        Views of one copy each: ``node_id`` is this node, ``replica_id`` the copy's replica.
        """
        out = []
        for sid in sorted(self._index.segments_by_node.get(node_id, ())):
            seg = self._index.segments[sid]
            replica = next((r for r, n in copies(seg).items() if n == node_id), 0)
            out.append(view_of(seg, replica))
        return out

    def node_memory_usage(self, node_id: int) -> int:
        """Sum of ``mem_size`` of the segments on the node (kept incrementally: O(1))."""
        return self._index.memory_by_node.get(node_id, 0)

    def segment_count_by_node(self) -> dict[int, int]:
        """Number of segments per node, for nodes that hold at least one."""
        return {n: len(s) for n, s in self._index.segments_by_node.items()}

    async def save_segments(self, segments: Iterable[SegmentInfo]) -> int:
        """Insert or replace segment records (by segment id); return the number of txns used.

        Each segment's collection and partition must be loaded
        (``CollectionNotLoaded`` / ``PartitionNotLoaded`` otherwise, nothing
        written), so no write can leave records of a released collection.
        A segment whose partition changed has its old key deleted in the
        same txn. The batch is packed into txns of at most 128 operations
        and ~1.5 MiB: a big batch is NOT atomic (see rule 5 of the module
        docstring for why that is acceptable here); memory follows each txn.
        A load's copies take ``save_loaded``.
        """
        return await self.save_segments_and_remove(segments, ())

    async def save_segments_and_remove(self, saves: Iterable[SegmentInfo], removals: Iterable[int]) -> int:
        """Save segments and remove others: one txn when it fits (a balance move, a handoff).

        When it does not fit, the saves go first and the removals after, so
        a crash in between never loses a segment without its replacement
        (a handoff saves the new segment before releasing its compaction
        sources). A segment both saved and removed is refused
        (``ValueError``); removing an unknown id is a no-op. Returns the
        number of txns used.
        """
        to_save = [stored_segment(s) for s in saves]
        remove_ids = _unique_ids("segment", removals)
        seen = _checked_segment_ids(to_save)
        both = seen.intersection(remove_ids)
        if both:
            raise ValueError(f"segments {sorted(both)} are both saved and removed in one call")
        pairs = {(seg.collection_id, seg.partition_id) for seg in to_save}
        touched = seen.union(remove_ids)

        def cids() -> set[int]:
            places = self._index.segments.places()
            return {cid for cid, _ in pairs} | {places[sid][0] for sid in places.keys() & touched}

        async def body() -> int:
            for cid, pid in pairs:
                self._require_partition(cid, pid)
            replicas: dict[tuple[int, int], int] = {}  # (collection, node) -> replica, resolved once per call
            places = self._index.segments.places()
            new = [seg for seg in to_save if seg.node_id and seg.segment_id not in places]
            mutations = self._put_new_segments(new, replicas) if new else []
            if len(new) < len(to_save):
                mutations += [
                    self._put_segment(self._merged_segment(seg, replicas))
                    for seg in to_save
                    if not (seg.node_id and seg.segment_id not in places)
                ]
            for sid in remove_ids:
                old = self._index.segments.get(sid)
                if old is not None:
                    mutations.append(self._drop_segment(old))
            return await self._commit("save_segments", mutations, atomic=False)

        return await self._guarded(cids, body, claims=touched)

    async def save_loaded(self, infos: Sequence[LoadItem], node_id: int, replica_id: int) -> int:
        """``save_segments`` of the copies on ``node_id`` that a LoadSegments call of replica ``replica_id`` (0: the
        node's replica) has just loaded from ``infos``, the load infos it was sent; returns the txns used.

        The records are ``loaded_record``'s. Why a method of its own: making that message per segment, then
        reading it back to key, serialize and index it, cost more than etcd's write of it, and every segment of
        every load comes here. A segment with no record yet is serialized from one message, its fields set per
        segment (``_put_loaded``); one recorded already (another replica's copy) is merged as ``save_segments``
        merges it.
        """
        _check_id("node", node_id)
        infos = list(infos)
        seen = _checked_segment_ids(infos)
        pairs = {(info.collection_id, info.partition_id) for info in infos}

        async def body() -> int:
            for cid, pid in pairs:
                self._require_partition(cid, pid)
            replicas: dict[tuple[int, int], int] = {}
            places = self._index.segments.places()
            new = [info for info in infos if info.segment_id not in places]
            mutations = self._put_loaded(new, node_id, replica_id, replicas) if new else []
            if len(new) < len(infos):
                mutations += [
                    self._put_segment(self._merged_segment(loaded_record(info, node_id, replica_id), replicas))
                    for info in infos
                    if info.segment_id in places
                ]
            return await self._commit("save_segments", mutations, atomic=False)

        return await self._guarded(lambda: {cid for cid, _ in pairs}, body, claims=seen)

    async def remove_segments(self, segment_ids: Iterable[int]) -> int:
        """Remove segment records by id, every copy (unknown ids ignored), in as few txns as the limits allow."""
        return await self.save_segments_and_remove((), segment_ids)

    async def remove_segment_copies(self, node_id: int, segment_ids: Iterable[int]) -> int:
        """Forget the copies of ``segment_ids`` on ``node_id`` (a release on that node); other replicas' copies
        stay, and a record left with no copy is removed. Ids with no copy on the node are ignored."""
        _check_id("node", node_id)
        ids = _unique_ids("segment", segment_ids)

        def cids() -> set[int]:
            places = self._index.segments.places()
            return {places[s][0] for s in ids if s in places}

        async def body() -> int:
            mutations = []
            for sid in ids:
                seg = self._index.segments.get(sid)
                if seg is None or node_id not in copies(seg).values():
                    continue
                rest = without_node(seg, node_id)
                mutations.append(self._put_segment(rest) if rest is not None else self._drop_segment(seg))
            return await self._commit("remove_segment_copies", mutations, atomic=False)

        return await self._guarded(cids, body)

    def _merged_segment(self, view: SegmentInfo, replicas: dict[tuple[int, int], int]) -> SegmentInfo:
        """The stored record once the copy ``view`` describes is added (its replica resolved from its node).

        ``view`` is the caller's private copy (``stored_segment``). A segment with no record yet becomes its
        record in place: ``with_copy`` would copy the message twice more, per segment.
        """
        place = self._index.segments.place(view.segment_id)
        current = None
        if place is not None and place[:2] == (view.collection_id, view.partition_id):
            current = self._index.segments.get(view.segment_id)
        # else: new, or moved to another partition (a catalog fix): the old copies went with the old key
        if current is None and view.node_id:
            if not view.replica_id:
                view.replica_id = self._replica_of_copy(view.collection_id, view.node_id, replicas)
            # set_copies(view, {replica: node}) for one copy, written out (once per segment of every load)
            if view.replica_ids or view.node_ids:
                del view.replica_ids[:]
                del view.node_ids[:]
            view.replica_ids.append(view.replica_id)
            view.node_ids.append(view.node_id)
            return view
        return with_copy(current, self._with_replica(view))

    def _replica_of_copy(self, collection_id: int, node_id: int, replicas: dict[tuple[int, int], int]) -> int:
        """The replica a copy on ``node_id`` belongs to, resolved once per (collection, node) of a save."""
        replica = replicas.get((collection_id, node_id))
        if replica is None:
            replica = replicas[collection_id, node_id] = self.replica_of_node(
                collection_id, node_id) or self._sole_replica(collection_id)
        return replica

    def _put_new_segments(self, views: list[SegmentInfo], replicas: dict[tuple[int, int], int]) -> list[Mutation]:
        """The records of segments with no record yet, each with the one copy its view describes: the views
        (the caller's private copies) become the records, written in as few mutations as txns.

        Why a path of its own: the general path (``_merged_segment``, ``_put_segment``, a mutation each) cost
        more per segment than etcd's write of it, for saves of many new segments (an adoption by ``repair``; a
        load's own copies take ``_put_loaded``, which does not even make the messages).
        """
        rows: list[NewSegment] = []
        puts: list[Put] = []
        segment_key = keys.segment_key
        tails: dict[tuple[int, int], bytes] = {}
        for view in views:
            sid, cid, pid, node = view.segment_id, view.collection_id, view.partition_id, view.node_id
            replica = view.replica_id
            if not replica:
                view.replica_id = replica = self._replica_of_copy(cid, node, replicas)
            if view.replica_ids or view.node_ids:
                del view.replica_ids[:]
                del view.node_ids[:]
            tail = tails.get((replica, node))
            if tail is None:
                tail = tails[replica, node] = _copies_tail(replica, node)
            raw = view.SerializeToString() + tail  # the record with its one copy, byte for byte (see _copies_tail)
            puts.append(Put(segment_key(cid, pid, sid), raw))
            rows.append((sid, cid, pid, replica, node, view.mem_size, raw))
        return self._writer.independent_puts(puts, lambda index, a, b: index.put_new_segments(rows, a, b))

    def _put_loaded(self, infos: list[LoadItem], node_id: int, replica_id: int,
                    replicas: dict[tuple[int, int], int]) -> list[Mutation]:
        """``_put_new_segments`` of the ``loaded_record``s of ``infos`` (segments with no record yet), serialized
        from one message whose per-segment fields are set in turn: the bytes ``loaded_record`` serializes to."""
        rows: list[NewSegment] = []
        puts: list[Put] = []
        seg = SegmentInfo(node_id=node_id, state=SEALED)
        serialize = seg.SerializeToString
        sources = seg.compaction_from
        collection = replica = partition = -1
        tail = b""
        prefix = ""
        for info in infos:
            sid, cid, pid, mem = info.segment_id, info.collection_id, info.partition_id, info.mem_size
            if cid != collection:  # a load's infos are of one collection: resolved once
                collection = seg.collection_id = cid
                replica = seg.replica_id = replica_id or self._replica_of_copy(cid, node_id, replicas)
                tail = _copies_tail(replica, node_id)
                partition = -1
            if pid != partition:  # they come by partition: the key's prefix made once per run
                partition = seg.partition_id = pid
                prefix = keys.segment_partition_prefix(cid, pid)
            seg.segment_id = sid
            seg.mem_size = mem
            seg.num_rows = info.num_rows
            seg.dm_channel = info.insert_channel
            if info.compaction_from:
                del sources[:]
                sources.extend(info.compaction_from)
            elif sources:
                del sources[:]
            raw = serialize() + tail  # the record with its one copy, byte for byte (see _copies_tail)
            puts.append(Put(prefix + str(sid), raw))  # keys.segment_key, its prefix made once per partition
            rows.append((sid, cid, pid, replica, node_id, mem, raw))
        return self._writer.independent_puts(puts, lambda index, a, b: index.put_new_segments(rows, a, b))

    def _with_replica(self, view: SegmentInfo | DmChannelWatchInfo) -> SegmentInfo | DmChannelWatchInfo:
        if view.replica_id or not view.node_id:
            return view
        out = copy_message(view)
        out.replica_id = self.replica_of_node(view.collection_id, view.node_id) or self._sole_replica(
            view.collection_id)
        return out

    def _sole_replica(self, collection_id: int) -> int:
        info = self._index.collections.get(collection_id)
        return info.replicas[0].replica_id if info is not None and len(info.replicas) == 1 else 0

    # ===== DM channels ===============================================================
    def dm_channels_of(self, collection_id: int) -> list[DmChannelWatchInfo]:
        """DM channel watches of a collection, by channel name."""
        channels = self._index.dm_channels.get(collection_id, {})
        return [copy_message(channels[c]) for c in sorted(channels)]

    def get_dm_channel(self, collection_id: int, channel: str) -> DmChannelWatchInfo | None:
        watch = self._index.dm_channels.get(collection_id, {}).get(channel)
        return copy_message(watch) if watch is not None else None

    def channels_on_node(self, node_id: int) -> list[DmChannelWatchInfo]:
        """DM channel watches recorded on the node, by (collection, channel): views of one watch each."""
        out = []
        for c, ch in sorted(self._index.dm_channels_by_node.get(node_id, ())):
            watch = self._index.dm_channels[c][ch]
            replica = next((r for r, n in copies(watch).items() if n == node_id), 0)
            out.append(view_of(watch, replica))
        return out

    def channel_count_by_node(self) -> dict[int, int]:
        """Number of DM channel watches per node (the "fewest channels" allocation reads it)."""
        return {n: len(c) for n, c in self._index.dm_channels_by_node.items()}

    def known_node_ids(self) -> set[int]:
        """Nodes that hold any segment or channel record or serve a replica (a new leader checks them against
        live sessions, and the checker forgets those that are gone)."""
        members = {n for info in self._index.collections.values() for r in info.replicas for n in r.node_ids}
        return set(self._index.segments_by_node) | set(self._index.dm_channels_by_node) | members

    async def save_dm_channel_watch(self, watches: Iterable[DmChannelWatchInfo]) -> int:
        """Insert or replace DM channel watches (by collection and channel); return the txns used.

        The collection, and any partition ids listed, must be loaded. Packed
        like segments (node facts, rule 5), in practice one txn.
        """
        to_save = [copy_message(w) for w in watches]
        seen: set[tuple[int, str]] = set()
        for w in to_save:
            _check_id("collection", w.collection_id)
            if not w.dm_channel:
                raise ValueError(f"a DM channel watch of collection {w.collection_id} has no channel name")
            if (w.collection_id, w.dm_channel) in seen:
                raise ValueError(f"DM channel {w.dm_channel} of collection {w.collection_id} appears twice")
            seen.add((w.collection_id, w.dm_channel))

        async def body() -> int:
            for w in to_save:
                if w.collection_id not in self._index.collections:
                    raise CollectionNotLoaded(w.collection_id)
                for pid in w.partition_ids:
                    self._require_partition(w.collection_id, pid)
            merged = [with_copy(self._index.dm_channels.get(w.collection_id, {}).get(w.dm_channel),
                                self._with_replica(w)) for w in to_save]
            return await self._commit("save_dm_channel_watch", [self._put_dm_channel(w) for w in merged], atomic=False)

        # Shared, each watch's record claimed: saved beside a load's segment saves, not after them (``locks``).
        return await self._guarded(lambda: {w.collection_id for w in to_save}, body, claims=seen)

    async def remove_dm_channels(self, collection_id: int, channels: Iterable[str]) -> int:
        """Remove DM channel watches of a collection by name (unknown names ignored); return the txns used."""
        names = list(dict.fromkeys(channels))

        async def body() -> int:
            known = self._index.dm_channels.get(collection_id, {})
            mutations = [self._drop_dm_channel(known[n]) for n in names if n in known]
            return await self._commit("remove_dm_channels", mutations, atomic=False)

        return await self._guarded(lambda: [collection_id], body)

    async def remove_dm_channel_copies(self, node_id: int, collection_id: int, channels: Iterable[str]) -> int:
        """Remove the node's copy from the collection's named DM channel watches (a watch left with no copy goes;
        unknown names and watches without a copy there are ignored); return the txns used."""
        names = list(dict.fromkeys(channels))

        async def body() -> int:
            known = self._index.dm_channels.get(collection_id, {})
            mutations = []
            for name in names:
                watch = known.get(name)
                if watch is None or node_id not in copies(watch).values():
                    continue
                left = without_node(watch, node_id)
                mutations.append(self._put_dm_channel(left) if left is not None else self._drop_dm_channel(watch))
            return await self._commit("remove_dm_channel_copies", mutations, atomic=False)

        return await self._guarded(lambda: [collection_id], body)

    # ===== delta and query channels ==================================================
    def get_delta_channels(self, collection_id: int) -> list[VChannelInfo]:
        """Delta channels of a collection, by name (as stored: stripped)."""
        channels = self._index.delta_channels.get(collection_id, {})
        return [copy_message(channels[c]) for c in sorted(channels)]

    async def set_delta_channels(self, collection_id: int, infos: Iterable[VChannelInfo]) -> None:
        """Replace the collection's delta channels with ``infos`` in one txn (stale ones removed).

        Stale channels are deleted key by key, not by a range delete: etcd
        refuses a txn that puts a key inside a range it also deletes.
        """
        to_save = [stored_delta_channel(i) for i in infos]
        names: set[str] = set()
        for info in to_save:
            if info.collection_id != collection_id:
                raise ValueError(
                    f"delta channel {info.channel_name!r} belongs to collection {info.collection_id}, "
                    f"not {collection_id}"
                )
            if not info.channel_name:
                raise ValueError(f"a delta channel of collection {collection_id} has no channel name")
            if info.channel_name in names:
                raise ValueError(f"delta channel {info.channel_name} of collection {collection_id} appears twice")
            names.add(info.channel_name)

        async def body() -> None:
            if collection_id not in self._index.collections:
                raise CollectionNotLoaded(collection_id)
            mutations = [self._put_delta_channel(i) for i in to_save]
            stale = set(self._index.delta_channels.get(collection_id, {})) - names
            mutations.extend(self._drop_delta_channel(collection_id, n) for n in sorted(stale))
            await self._commit("set_delta_channels", mutations, atomic=True)

        await self._guarded(lambda: [collection_id], body)

    @staticmethod
    def query_channels(collection_id: int) -> tuple[str, str]:
        """(query channel, query result channel) of a collection: derived from the id, not stored."""
        return keys.query_channels(collection_id)

    # ===== nodes ===================================================================
    async def remove_node(self, node_id: int) -> int:
        """Remove the node's copies from every segment and DM channel record (a record left with no copy goes) and
        take the node out of every replica, in as few txns as the limits allow.

        Used by the node-down balance once the node's work was given to the
        survivors (their saves already moved those records to other nodes;
        what is left here is what could not be moved). Returns the txns used.
        """
        _check_id("node", node_id)

        def cids() -> set[int]:
            places = self._index.segments.places()
            out = {places[s][0] for s in self._index.segments_by_node.get(node_id, ())}
            out.update(c for c, _ in self._index.dm_channels_by_node.get(node_id, ()))
            out.update(i.collection_id for i in self._index.collections.values()
                       if any(node_id in r.node_ids for r in i.replicas))
            return out

        async def body() -> int:
            mutations = []
            for sid in sorted(self._index.segments_by_node.get(node_id, ())):
                seg = self._index.segments[sid]
                rest = without_node(seg, node_id)
                mutations.append(self._put_segment(rest) if rest is not None else self._drop_segment(seg))
            for cid, channel in sorted(self._index.dm_channels_by_node.get(node_id, ())):
                watch = self._index.dm_channels[cid][channel]
                left = without_node(watch, node_id)
                mutations.append(self._put_dm_channel(left) if left is not None else self._drop_dm_channel(watch))
            for info in self._index.collections.values():
                if any(node_id in r.node_ids for r in info.replicas):
                    mutations.append(self._put_collection(_leave_replicas(info, node_id)))
            return await self._commit(f"remove_node {node_id}", mutations, atomic=False)

        return await self._guarded(cids, body)

    # ===== maintenance =============================================================
    def records(self) -> dict[str, Record]:
        """Every record in memory under its etcd key (copies): exactly what etcd must hold."""
        return {k: copy_message(v) for k, v in self._index.records()}

    async def purge_corrupt(self) -> int:
        """Delete the keys the last ``reload`` skipped as corrupt (leader only); return how many.

        A key rewritten with a valid record since (it is in memory now) is kept.
        """
        live = {k for k, _ in self._index.records()}
        doomed = [k for k in self._corrupt if k not in live]
        mutations = [Mutation([self._writer.delete(k)], lambda _idx: None) for k in doomed]
        await self._commit("purge_corrupt", mutations, atomic=False)
        for k in doomed:
            self._corrupt.pop(k, None)
        return len(doomed)

    # ===== internals: validation ===================================================
    def _require_partition(self, collection_id: int, partition_id: int) -> None:
        info = self._index.collections.get(collection_id)
        if info is None:
            raise CollectionNotLoaded(collection_id)
        if not any(p.partition_id == partition_id for p in info.partitions):
            raise PartitionNotLoaded(collection_id, partition_id)

    # ===== internals: mutations (etcd ops + memory effect) =============================
    def _put_collection(self, info: CollectionLoadInfo) -> Mutation:
        return Mutation(
            [self._writer.put(keys.collection_key(info.collection_id), info)], lambda idx: idx.put_collection(info)
        )

    def _release_collection(self, collection_id: int) -> Mutation:
        w = self._writer
        ops: list[Op] = [
            w.delete(keys.collection_key(collection_id)),
            w.delete_prefix(keys.segment_collection_prefix(collection_id)),
            w.delete_prefix(keys.dm_channel_prefix(collection_id)),
            w.delete_prefix(keys.delta_channel_prefix(collection_id)),
        ]
        return Mutation(ops, lambda idx: idx.drop_everything_of(collection_id))

    def _put_segment(self, seg: SegmentInfo) -> Mutation:
        key = keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id)
        put = self._writer.put(key, seg)
        ops: list[Op] = [put]
        old = self._index.segments.place(seg.segment_id)
        if old is not None:
            old_key = keys.segment_key(old[0], old[1], seg.segment_id)
            if old_key != key:
                ops.append(self._writer.delete(old_key))
        return Mutation(ops, lambda idx: idx.put_segment(seg, put.value))  # the bytes etcd got, not serialized again

    def _drop_segment(self, seg: SegmentInfo) -> Mutation:
        key = keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id)
        sid = seg.segment_id
        return Mutation([self._writer.delete(key)], lambda idx: idx.drop_segment(sid))

    def _drop_partition_segments(self, collection_id: int, partition_id: int) -> Mutation:
        op = self._writer.delete_prefix(keys.segment_partition_prefix(collection_id, partition_id))
        return Mutation([op], lambda idx: idx.drop_partition_segments(collection_id, partition_id))

    def _put_dm_channel(self, watch: DmChannelWatchInfo) -> Mutation:
        key = keys.dm_channel_key(watch.collection_id, watch.dm_channel)
        return Mutation([self._writer.put(key, watch)], lambda idx: idx.put_dm_channel(watch))

    def _drop_dm_channel(self, watch: DmChannelWatchInfo) -> Mutation:
        cid, channel = watch.collection_id, watch.dm_channel
        return Mutation(
            [self._writer.delete(keys.dm_channel_key(cid, channel))], lambda idx: idx.drop_dm_channel(cid, channel)
        )

    def _put_delta_channel(self, info: VChannelInfo) -> Mutation:
        key = keys.delta_channel_key(info.collection_id, info.channel_name)
        return Mutation([self._writer.put(key, info)], lambda idx: idx.put_delta_channel(info))

    def _drop_delta_channel(self, collection_id: int, channel: str) -> Mutation:
        return Mutation(
            [self._writer.delete(keys.delta_channel_key(collection_id, channel))],
            lambda idx: idx.drop_delta_channel(collection_id, channel),
        )

    # ===== internals: running writes =================================================
    async def _commit(self, operation: str, mutations: list[Mutation], *, atomic: bool) -> int:
        return await self._writer.commit(operation, mutations, lambda: self._index, atomic=atomic)

    def _lock(self, collection_id: int) -> CollectionLock:
        lock = self._locks.get(collection_id)
        if lock is None:
            lock = self._locks[collection_id] = CollectionLock()
        return lock

    async def _guarded(
        self,
        collections: Callable[[], Iterable[int]],
        body: Callable[[], Awaitable[T]],
        *,
        claims: Set[Hashable] | None = None,
    ) -> T:
        """Run ``body`` holding the locks of ``collections()``, shielded from the caller's cancellation (rule 3).

        ``claims``: the body writes only these records (segment ids; (collection, channel) pairs of DM channel
        watches): the collections' locks are taken shared and the records claimed (``querymeta.locks``), so saves
        of other records run beside it.
        """
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(self._locked(collections, body, claims))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.add_done_callback(_log_abandoned_write)
            raise

    async def _locked(
        self, collections: Callable[[], Iterable[int]], body: Callable[[], Awaitable[T]], claims: Set[Hashable] | None
    ) -> T:
        """Take the locks in id order; if the set grew while waiting (``remove_node``), take them again."""
        while True:
            wanted = sorted(set(collections()))
            async with contextlib.AsyncExitStack() as stack:
                for cid in wanted:
                    lock = self._lock(cid)
                    await stack.enter_async_context(lock.exclusive() if claims is None else lock.shared())
                if claims is not None:
                    await stack.enter_async_context(self._claims.claim(claims))
                if set(collections()) <= set(wanted):
                    return await body()
