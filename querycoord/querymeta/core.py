"""The state every part of the query meta shares, and the one write path they all take.

``MetaCore`` holds the in-memory ``MetaIndex``, the ``TxnWriter`` over the ``MetaKV`` the owner passed, the
collection locks and the writes in flight; it reloads the index from etcd and builds the ``Mutation`` of each
record kind. The managers (``collections``, ``replicas``, ``segments``, ``channels``, ``nodes``, ``progress``)
plan their writes from ``index`` and run them through ``guarded`` and ``commit``.

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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Set
from typing import TypeVar

from loguru import logger

from meta.kv import DEFAULT_PAGE_SIZE, MetaKV
from meta.txn import Op
from querycoord.common.yielding import every_few

from . import keys
from .batch import Mutation, TxnWriter
from .errors import CollectionNotLoaded, CorruptRecord, PartitionNotLoaded
from .index import MetaIndex
from .locks import CollectionLock, RecordClaims
from .records import (
    CollectionLoadInfo,
    DmChannelWatchInfo,
    SegmentInfo,
    VChannelInfo,
    decode_into,
    warn_orphans,
)

Record = CollectionLoadInfo | SegmentInfo | DmChannelWatchInfo | VChannelInfo
T = TypeVar("T")


def check_id(what: str, value: int) -> int:
    """Ids are positive int64: a 0 is almost always a field the caller forgot to set."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} id must be a positive integer, got {value!r}")
    return value


def unique_ids(what: str, ids: Iterable[int]) -> list[int]:
    """``ids`` checked (``check_id``), each once, in first-seen order."""
    seen: dict[int, None] = {}
    for i in ids:
        seen[check_id(what, i)] = None
    return list(seen)


def check_percentage(percentage: int) -> None:
    if isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100:
        raise ValueError(f"percentage must be an integer in 0..100, got {percentage!r}")


def _log_abandoned_write(task: asyncio.Task[object]) -> None:
    """Outcome of a write whose caller was cancelled: nobody else will look at it."""
    if task.cancelled():
        logger.warning("query meta write cancelled while in flight; memory may lag etcd until reload")
    elif task.exception() is not None:
        logger.warning("query meta write finished after its caller was cancelled, and failed: {}", task.exception())


class MetaCore:
    """The index, the writer, the locks and the writes in flight of one ``QueryMeta`` (see module docstring)."""

    def __init__(self, kv: MetaKV):
        self.kv = kv
        self.writer = TxnWriter(kv)
        self.index = MetaIndex()
        #: Bumped when the index is replaced (reload, adopt): see ``QueryMeta.change_mark``.
        self.generation = 0
        #: Keys the last ``reload`` skipped as corrupt, with the reason.
        self.corrupt: dict[str, str] = {}
        self._locks: dict[int, CollectionLock] = {}
        self._claims = RecordClaims()
        self._inflight: set[asyncio.Task[object]] = set()

    # ===== reload ================================================================
    async def reload(self, *, strict: bool = False, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        """Replace memory with what etcd holds under the four prefixes (paged loads).

        The new state is built aside and swapped in at once, so readers never
        see half a reload and a failed reload keeps the old state.

        A corrupt record (unparseable, or not matching its key) is logged,
        skipped and listed in ``corrupt`` unless ``strict``. Why skip
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
        snapshots = await asyncio.gather(*(self.kv.load_prefix(p, page_size=page_size) for p in keys.ALL_PREFIXES))
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
        self.index = fresh
        self.generation += 1
        self.corrupt = corrupt
        self.writer.in_doubt = False
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
        self.index = index
        self.generation += 1
        self.corrupt = dict(corrupt)
        self.writer.in_doubt = False
        logger.info(
            "query meta taken over from the warm standby's copy: {} collections, {} segments, {} DM channels, "
            "{} skipped as corrupt",
            len(index.collections),
            len(index.segments),
            sum(len(c) for c in index.dm_channels.values()),
            len(corrupt),
        )

    async def purge_corrupt(self) -> int:
        """Delete the keys the last ``reload`` skipped as corrupt (leader only); return how many.

        A key rewritten with a valid record since (it is in memory now) is kept.
        """
        live = {k for k, _ in self.index.records()}
        doomed = [k for k in self.corrupt if k not in live]
        mutations = [Mutation([self.writer.delete(k)], lambda _idx: None) for k in doomed]
        await self.commit("purge_corrupt", mutations, atomic=False)
        for k in doomed:
            self.corrupt.pop(k, None)
        return len(doomed)

    # ===== validation against memory ===============================================
    def loaded_collection(self, collection_id: int) -> CollectionLoadInfo:
        """The collection's load record in memory (not a copy); ``CollectionNotLoaded`` when it has none."""
        info = self.index.collections.get(collection_id)
        if info is None:
            raise CollectionNotLoaded(collection_id)
        return info

    def require_partition(self, collection_id: int, partition_id: int) -> None:
        info = self.loaded_collection(collection_id)
        if not any(p.partition_id == partition_id for p in info.partitions):
            raise PartitionNotLoaded(collection_id, partition_id)

    # ===== mutations (etcd ops + memory effect) =======================================
    def put_collection(self, info: CollectionLoadInfo) -> Mutation:
        return Mutation(
            [self.writer.put(keys.collection_key(info.collection_id), info)], lambda idx: idx.put_collection(info)
        )

    def release_collection(self, collection_id: int) -> Mutation:
        """The collection key and one range delete per record kind (rule 4)."""
        w = self.writer
        ops: list[Op] = [
            w.delete(keys.collection_key(collection_id)),
            w.delete_prefix(keys.segment_collection_prefix(collection_id)),
            w.delete_prefix(keys.dm_channel_prefix(collection_id)),
            w.delete_prefix(keys.delta_channel_prefix(collection_id)),
        ]
        return Mutation(ops, lambda idx: idx.drop_everything_of(collection_id))

    def put_segment(self, seg: SegmentInfo) -> Mutation:
        """The segment's put, and the delete of its old key when it moved to another partition."""
        key = keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id)
        put = self.writer.put(key, seg)
        ops: list[Op] = [put]
        old = self.index.segments.place(seg.segment_id)
        if old is not None:
            old_key = keys.segment_key(old[0], old[1], seg.segment_id)
            if old_key != key:
                ops.append(self.writer.delete(old_key))
        return Mutation(ops, lambda idx: idx.put_segment(seg, put.value))  # the bytes etcd got, not serialized again

    def drop_segment(self, seg: SegmentInfo) -> Mutation:
        key = keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id)
        sid = seg.segment_id
        return Mutation([self.writer.delete(key)], lambda idx: idx.drop_segment(sid))

    def drop_partition_segments(self, collection_id: int, partition_id: int) -> Mutation:
        op = self.writer.delete_prefix(keys.segment_partition_prefix(collection_id, partition_id))
        return Mutation([op], lambda idx: idx.drop_partition_segments(collection_id, partition_id))

    def put_dm_channel(self, watch: DmChannelWatchInfo) -> Mutation:
        key = keys.dm_channel_key(watch.collection_id, watch.dm_channel)
        return Mutation([self.writer.put(key, watch)], lambda idx: idx.put_dm_channel(watch))

    def drop_dm_channel(self, watch: DmChannelWatchInfo) -> Mutation:
        cid, channel = watch.collection_id, watch.dm_channel
        return Mutation(
            [self.writer.delete(keys.dm_channel_key(cid, channel))], lambda idx: idx.drop_dm_channel(cid, channel)
        )

    def put_delta_channel(self, info: VChannelInfo) -> Mutation:
        key = keys.delta_channel_key(info.collection_id, info.channel_name)
        return Mutation([self.writer.put(key, info)], lambda idx: idx.put_delta_channel(info))

    def drop_delta_channel(self, collection_id: int, channel: str) -> Mutation:
        return Mutation(
            [self.writer.delete(keys.delta_channel_key(collection_id, channel))],
            lambda idx: idx.drop_delta_channel(collection_id, channel),
        )

    # ===== running writes ==============================================================
    async def commit(self, operation: str, mutations: list[Mutation], *, atomic: bool) -> int:
        """Send ``mutations`` (``TxnWriter.commit``), applying each accepted txn to the current index; return the
        txns used."""
        return await self.writer.commit(operation, mutations, lambda: self.index, atomic=atomic)

    def lock(self, collection_id: int) -> CollectionLock:
        lock = self._locks.get(collection_id)
        if lock is None:
            lock = self._locks[collection_id] = CollectionLock()
        return lock

    def track(self, task: asyncio.Task[T]) -> None:
        """Count ``task`` among the writes in flight until it ends (``drain`` waits for it)."""
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def drain(self) -> None:
        """Wait for writes still in flight (also those whose callers were cancelled)."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    async def guarded(
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
        task: asyncio.Task[T] = asyncio.get_running_loop().create_task(self.locked(collections, body, claims))
        self.track(task)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                task.add_done_callback(_log_abandoned_write)
            raise

    async def locked(
        self, collections: Callable[[], Iterable[int]], body: Callable[[], Awaitable[T]], claims: Set[Hashable] | None
    ) -> T:
        """Take the locks in id order; if the set grew while waiting (``remove_node``), take them again."""
        while True:
            wanted = sorted(set(collections()))
            async with contextlib.AsyncExitStack() as stack:
                for cid in wanted:
                    lock = self.lock(cid)
                    await stack.enter_async_context(lock.exclusive() if claims is None else lock.shared())
                if claims is not None:
                    await stack.enter_async_context(self._claims.claim(claims))
                if set(collections()) <= set(wanted):
                    return await body()
