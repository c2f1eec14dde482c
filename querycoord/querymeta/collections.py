"""Loaded collections and their partitions: the load record (``CollectionLoadInfo``), the intent of a load.

One record per loaded collection: its load type, replicas, partitions with their states and percentages, and
the partitions released from a collection loaded as a whole. A record is always written in one put (rule 5 of
``core``); the collection's percentage is derived from its partitions' (``records.collection_percentage``), never
set directly. A release removes the collection's segment and channel records too (rule 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from proto import data_pb2

from .copies import copy_message
from .core import MetaCore, check_id, unique_ids
from .errors import CollectionNotLoaded, LoadTypeConflict, PartitionNotLoaded
from .progress import Progress
from .records import CollectionLoadInfo, add_partitions, collection_percentage
from .replicas import check_replicas

PartitionLoadInfo = data_pb2.PartitionLoadInfo
PartitionState = data_pb2.PartitionState

_LOAD_TYPES = (data_pb2.LOAD_TYPE_PARTITION, data_pb2.LOAD_TYPE_COLLECTION)


class Collections:
    """Reads and writes of the collections' load records; a release also drops the progress not yet flushed."""

    def __init__(self, core: MetaCore, progress: Progress):
        self._core = core
        self._progress = progress

    # ===== reads =======================================================================
    def collections(self) -> list[CollectionLoadInfo]:
        """Every loaded collection, by id."""
        loaded = self._core.index.collections
        return [copy_message(loaded[c]) for c in sorted(loaded)]

    def collection_ids(self) -> list[int]:
        return sorted(self._core.index.collections)

    def get_collection(self, collection_id: int) -> CollectionLoadInfo | None:
        info = self._core.index.collections.get(collection_id)
        return copy_message(info) if info is not None else None

    def has_collection(self, collection_id: int) -> bool:
        return collection_id in self._core.index.collections

    def has_partition(self, collection_id: int, partition_id: int) -> bool:
        """Whether the partition is loaded (a released partition is not)."""
        info = self._core.index.collections.get(collection_id)
        return info is not None and any(p.partition_id == partition_id for p in info.partitions)

    def partition_ids(self, collection_id: int) -> list[int]:
        """Loaded partitions of the collection in load order; [] when the collection is not loaded."""
        info = self._core.index.collections.get(collection_id)
        return [p.partition_id for p in info.partitions] if info is not None else []

    def get_partition(self, collection_id: int, partition_id: int) -> PartitionLoadInfo | None:
        info = self._core.index.collections.get(collection_id)
        for p in info.partitions if info is not None else ():
            if p.partition_id == partition_id:
                return copy_message(p)
        return None

    def get_load_type(self, collection_id: int) -> data_pb2.LoadType:
        """How the collection was loaded; ``LOAD_TYPE_UNSPECIFIED`` (0, falsy) when it is not loaded.

        Not an exception: every caller (the API's conflict checks, balance)
        asks this of collections that may well not be loaded.
        """
        info = self._core.index.collections.get(collection_id)
        return info.load_type if info is not None else data_pb2.LOAD_TYPE_UNSPECIFIED

    # ===== writes ======================================================================
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
        check_id("collection", collection_id)
        if load_type not in _LOAD_TYPES:
            raise ValueError(f"load type must be LOAD_TYPE_PARTITION or LOAD_TYPE_COLLECTION, got {load_type!r}")

        new_replicas = [copy_message(r) for r in replicas]
        check_replicas(collection_id, new_replicas)

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
        pids = unique_ids("partition", partition_ids)
        core = self._core

        async def body() -> CollectionLoadInfo:
            current = core.index.collections.get(collection_id)
            info = start(current)
            add_partitions(info, pids)
            if info != current:
                await core.commit(operation, [core.put_collection(info)], atomic=True)
            return copy_message(info)

        return await core.guarded(lambda: [collection_id], body)

    async def release_collection(self, collection_id: int) -> None:
        """Remove the collection record and all its segment, DM and delta channel records in ONE txn.

        Four operations whatever the size of the collection: the record and
        three range deletes. Sent even when memory knows nothing of the
        collection, so it also clears records a crash or a corrupt reload
        left behind. Releasing a collection that is not loaded is success.
        """
        check_id("collection", collection_id)
        core = self._core

        async def body() -> None:
            await core.commit("release_collection", [core.release_collection(collection_id)], atomic=True)
            self._progress.forget(collection_id)

        await core.guarded(lambda: [collection_id], body)

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
        check_id("collection", collection_id)
        pids = unique_ids("partition", partition_ids)
        core = self._core

        async def body() -> bool:
            current = core.index.collections.get(collection_id)
            if current is None:
                return False
            loaded = [p.partition_id for p in current.partitions]
            released = [p for p in pids if p in loaded]
            if not released:
                return False
            pending = self._progress.reports(collection_id)
            if len(released) == len(loaded):
                await core.commit("release_partitions", [core.release_collection(collection_id)], atomic=True)
                self._progress.forget(collection_id)
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
            mutations = [core.drop_partition_segments(collection_id, p) for p in released]
            for watch in core.index.dm_channels.get(collection_id, {}).values():
                if not gone.intersection(watch.partition_ids):
                    continue
                updated = copy_message(watch)
                del updated.partition_ids[:]
                updated.partition_ids.extend(p for p in watch.partition_ids if p not in gone)
                if updated.partition_ids:
                    mutations.append(core.put_dm_channel(updated))
                else:
                    mutations.append(core.drop_dm_channel(watch))
            mutations.append(core.put_collection(info))
            await core.commit("release_partitions", mutations, atomic=False)
            for pid in released:
                pending.pop(pid, None)
            return False

        return await core.guarded(lambda: [collection_id], body)

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
            check_id("partition", pid)
            if state not in PartitionState.values():
                raise ValueError(f"unknown partition state {state!r}")
            if isinstance(percentage, bool) or not isinstance(percentage, int) or not 0 <= percentage <= 100:
                raise ValueError(f"percentage must be an integer in 0..100, got {percentage!r}")
        core = self._core

        async def body() -> CollectionLoadInfo:
            current = core.loaded_collection(collection_id)
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
                await core.commit("set_partition_states", [core.put_collection(info)], atomic=True)
            return copy_message(info)

        return await core.guarded(lambda: [collection_id], body)
