"""``QueryMeta``: the coordinator's record of what is loaded, persisted in etcd.

What it stores (keys in ``keys``): one ``CollectionLoadInfo`` per loaded
collection (load type, replicas, partition states and percentages, released
partitions), one ``SegmentInfo`` per loaded segment (its copies: node and
replica, rows, memory), one ``DmChannelWatchInfo`` per watched DM channel
(which node of each replica; Milvus kept this only in memory and lost it on
restart) and the delta channels of each collection. A new leader calls
``reload`` and carries on from there; a standby builds one on a plain
``MetaKV`` and only calls ``reload`` and the getters.

``QueryMeta`` is a thin facade, as Milvus querycoordv2's ``meta.go`` over
its managers: each job lives in a manager of its own (``collections``,
``replicas``, ``segments``, ``channels``, ``nodes``, ``progress``), all over
one ``core.MetaCore`` (the index, the write path and its rules, reload). The
methods here only pass calls on, so callers need one object.

Getters return copies: the caller may modify them freely.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence, Set
from typing import Any

from meta.kv import DEFAULT_PAGE_SIZE, MetaKV
from proto import data_pb2
from querycoord.common.messages import LoadItem

from .channels import Channels
from .collections import Collections, PartitionLoadInfo
from .copies import copy_message
from .core import MetaCore, Record
from .index import MetaIndex
from .locks import CollectionLock
from .nodes import Nodes
from .progress import Progress
from .records import CollectionLoadInfo, DmChannelWatchInfo, SegmentInfo, VChannelInfo
from .replicas import Replicas
from .segments import Segments, SegmentSize


class QueryMeta:
    """Collections, partitions, replicas, segments and channels of the query coordinator (see module docstring)."""

    def __init__(self, kv: MetaKV):
        self._core = core = MetaCore(kv)
        self._progress = Progress(core)
        self._collections = Collections(core, self._progress)
        self._replicas = Replicas(core)
        self._segments = Segments(core)
        self._channels = Channels(core)
        self._nodes = Nodes(core)

    # ===== the store itself (``core.MetaCore``) =====================================
    @property
    def kv(self) -> MetaKV:
        return self._core.kv

    @property
    def index(self) -> MetaIndex:
        """The in-memory index every getter reads (a benchmark fills it directly, with no etcd behind it)."""
        return self._core.index

    def collection_lock(self, collection_id: int) -> CollectionLock:
        """The lock every write of the collection's records takes: shared by segment and channel saves, exclusive
        by writes that replace the collection's records (a test holds it shared to stand for a save in flight)."""
        return self._core.lock(collection_id)

    @property
    def txn_count(self) -> int:
        """Write txns etcd accepted from this instance (for benchmarks and tests)."""
        return self._core.writer.txns

    @property
    def needs_reload(self) -> bool:
        """A write ended in ``MetaUnavailable``: etcd may hold it or not; ``reload`` to be sure."""
        return self._core.writer.in_doubt

    @property
    def corrupt_keys(self) -> dict[str, str]:
        """Keys skipped by the last ``reload`` because their record is unreadable, with the reason."""
        return dict(self._core.corrupt)

    async def reload(self, *, strict: bool = False, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        await self._core.reload(strict=strict, page_size=page_size)

    def adopt(self, index: MetaIndex, corrupt: dict[str, str]) -> None:
        self._core.adopt(index, corrupt)

    @classmethod
    def reading(cls, kv: MetaKV, index: MetaIndex) -> QueryMeta:
        """A read-only view of ``index``, which another owner keeps current (the warm standby's mirror): a
        standby answers reads from it without a reload. Its getters copy what they return; use it between two
        awaits (the owner changes the index in place as etcd changes) and never write through it."""
        meta = cls(kv)
        meta._core.index = index
        return meta

    async def drain(self) -> None:
        """Wait for writes still in flight (also those whose callers were cancelled)."""
        await self._core.drain()

    def change_mark(self, collection_id: int) -> tuple[int, int]:
        """A value that changes whenever the collection's records change (a reload included): what a reader that
        derives something costly from them (``querycoord.served``) keys its cache by."""
        return self._core.generation, self._core.index.changes.get(collection_id, 0)

    def segment_view(self, name: str, collection_id: int, part: Hashable, key: Hashable,
                     derive: Callable[[], Any]) -> Any:
        """``derive()``, or what it returned for ``key`` while the collection's segment records were as now
        (``MetaIndex.segment_view``: kept with the index, so a warm standby's copy hands its views to the leader
        that adopts it). Read-only to the caller."""
        return self._core.index.segment_view(name, collection_id, part, key, derive)

    def has_segment_view(self, name: str, collection_id: int, part: Hashable, key: Hashable) -> bool:
        return self._core.index.has_segment_view(name, collection_id, part, key)

    def partition_view(self, name: str, collection_id: int, partition_id: int, key: Hashable,
                       derive: Callable[[], Any]) -> Any:
        """``segment_view`` of one partition's records alone (``MetaIndex.partition_view``)."""
        return self._core.index.partition_view(name, collection_id, partition_id, key, derive)

    def has_partition_view(self, name: str, collection_id: int, partition_id: int, key: Hashable) -> bool:
        return self._core.index.has_partition_view(name, collection_id, partition_id, key)

    def records(self) -> dict[str, Record]:
        """Every record in memory under its etcd key (copies): exactly what etcd must hold."""
        return {k: copy_message(v) for k, v in self._core.index.records()}

    async def purge_corrupt(self) -> int:
        return await self._core.purge_corrupt()

    # ===== collections and partitions (``collections.Collections``) ==================
    def collections(self) -> list[CollectionLoadInfo]:
        return self._collections.collections()

    def collection_ids(self) -> list[int]:
        return self._collections.collection_ids()

    def get_collection(self, collection_id: int) -> CollectionLoadInfo | None:
        return self._collections.get_collection(collection_id)

    def has_collection(self, collection_id: int) -> bool:
        return self._collections.has_collection(collection_id)

    def has_partition(self, collection_id: int, partition_id: int) -> bool:
        return self._collections.has_partition(collection_id, partition_id)

    def partition_ids(self, collection_id: int) -> list[int]:
        return self._collections.partition_ids(collection_id)

    def get_partition(self, collection_id: int, partition_id: int) -> PartitionLoadInfo | None:
        return self._collections.get_partition(collection_id, partition_id)

    def get_load_type(self, collection_id: int) -> data_pb2.LoadType:
        return self._collections.get_load_type(collection_id)

    async def add_collection(
        self,
        collection_id: int,
        load_type: data_pb2.LoadType,
        partition_ids: Iterable[int],
        *,
        replica_number: int = 1,
        replicas: Iterable[data_pb2.ReplicaInfo] = (),
    ) -> CollectionLoadInfo:
        return await self._collections.add_collection(
            collection_id, load_type, partition_ids, replica_number=replica_number, replicas=replicas)

    async def add_partitions(self, collection_id: int, partition_ids: Iterable[int]) -> CollectionLoadInfo:
        return await self._collections.add_partitions(collection_id, partition_ids)

    async def release_collection(self, collection_id: int) -> None:
        await self._collections.release_collection(collection_id)

    async def release_partitions(self, collection_id: int, partition_ids: Iterable[int]) -> bool:
        return await self._collections.release_partitions(collection_id, partition_ids)

    async def set_partition_state(
        self, collection_id: int, partition_id: int, state: data_pb2.PartitionState, percentage: int
    ) -> CollectionLoadInfo:
        return await self._collections.set_partition_state(collection_id, partition_id, state, percentage)

    async def set_partition_states(
        self, collection_id: int, states: Mapping[int, tuple[data_pb2.PartitionState, int]]
    ) -> CollectionLoadInfo:
        return await self._collections.set_partition_states(collection_id, states)

    # ===== load progress (``progress.Progress``) ======================================
    def set_progress(self, collection_id: int, partition_id: int, percentage: int) -> None:
        self._progress.set_progress(collection_id, partition_id, percentage)

    def set_replica_progress(self, collection_id: int, replica_id: int, percentage: int) -> None:
        self._progress.set_replica_progress(collection_id, replica_id, percentage)

    # ===== replicas (``replicas.Replicas``) ===========================================
    def replicas_of(self, collection_id: int) -> list[data_pb2.ReplicaInfo]:
        return self._replicas.replicas_of(collection_id)

    def replica_ids(self, collection_id: int) -> list[int]:
        return self._replicas.replica_ids(collection_id)

    def replica_nodes(self, collection_id: int, replica_id: int) -> list[int]:
        return self._replicas.replica_nodes(collection_id, replica_id)

    def replica_of_node(self, collection_id: int, node_id: int) -> int:
        return self._replicas.replica_of_node(collection_id, node_id)

    def replica_node_ids(self, collection_id: int) -> set[int]:
        return self._replicas.replica_node_ids(collection_id)

    async def add_replica_nodes(self, collection_id: int, replica_id: int, node_ids: Iterable[int]) -> None:
        await self._replicas.add_replica_nodes(collection_id, replica_id, node_ids)

    async def move_replica_node(self, collection_id: int, node_id: int, from_replica: int, to_replica: int) -> None:
        await self._replicas.move_replica_node(collection_id, node_id, from_replica, to_replica)

    async def set_replica_percentages(self, collection_id: int, percentages: Mapping[int, int]) -> None:
        await self._replicas.set_replica_percentages(collection_id, percentages)

    async def add_replicas(self, collection_id: int, replicas: Iterable[data_pb2.ReplicaInfo]) -> None:
        await self._replicas.add_replicas(collection_id, replicas)

    async def drop_replicas(self, collection_id: int, replica_ids: Iterable[int], replica_number: int) -> None:
        await self._replicas.drop_replicas(collection_id, replica_ids, replica_number)

    async def set_replica_number(self, collection_id: int, replica_number: int) -> None:
        await self._replicas.set_replica_number(collection_id, replica_number)

    # ===== segments (``segments.Segments``) ===========================================
    def get_segment(self, segment_id: int) -> SegmentInfo | None:
        return self._segments.get_segment(segment_id)

    def segment_copies(self, segment_id: int) -> dict[int, int]:
        return self._segments.segment_copies(segment_id)

    def segments_of(self, collection_id: int, partition_id: int | None = None) -> list[SegmentInfo]:
        return self._segments.segments_of(collection_id, partition_id)

    def segment_ids_of(self, collection_id: int, partition_id: int | None = None) -> list[int]:
        return self._segments.segment_ids_of(collection_id, partition_id)

    def segment_id_set(self, collection_id: int) -> set[int]:
        return self._segments.segment_id_set(collection_id)

    def segment_count(self, collection_id: int) -> int:
        return self._segments.segment_count(collection_id)

    def partition_segment_ids(self, collection_id: int, partition_id: int) -> Set[int]:
        return self._segments.partition_segment_ids(collection_id, partition_id)

    def segment_places(self) -> Mapping[int, tuple[int, int, tuple[int, ...]]]:
        return self._segments.segment_places()

    def segments_on_node(self, node_id: int) -> list[SegmentInfo]:
        return self._segments.segments_on_node(node_id)

    def segment_ids_on_node(self, node_id: int) -> list[int]:
        return self._segments.segment_ids_on_node(node_id)

    async def read_segments_on_node(self, node_id: int, collection_id: int = 0) -> list[SegmentInfo]:
        return await self._segments.read_segments_on_node(node_id, collection_id)

    def segment_ids_on_node_of(self, node_id: int, collection_id: int) -> list[int]:
        return self._segments.segment_ids_on_node_of(node_id, collection_id)

    def segment_ids_by_collection_on_node(self, node_id: int) -> dict[int, list[int]]:
        return self._segments.segment_ids_by_collection_on_node(node_id)

    def segment_sizes_on_node(self, node_id: int, collection_id: int) -> list[tuple[int, int]]:
        return self._segments.segment_sizes_on_node(node_id, collection_id)

    async def read_segment_sizes_on_node(self, node_id: int, collection_id: int) -> list[SegmentSize]:
        return await self._segments.read_segment_sizes_on_node(node_id, collection_id)

    def segment_count_on_node(self, node_id: int) -> int:
        return self._segments.segment_count_on_node(node_id)

    def collections_on_node(self, node_id: int) -> set[int]:
        return self._segments.collections_on_node(node_id)

    def places_on_node(self, node_id: int, collection_id: int) -> Mapping[tuple[int, int, tuple[int, ...]], list[int]]:
        return self._segments.places_on_node(node_id, collection_id)

    def copy_count_on_node(self, node_id: int, collection_id: int) -> int:
        return self._segments.copy_count_on_node(node_id, collection_id)

    def node_memory_usage(self, node_id: int) -> int:
        return self._segments.node_memory_usage(node_id)

    def segment_count_by_node(self) -> dict[int, int]:
        return self._segments.segment_count_by_node()

    async def save_segments(self, segments: Iterable[SegmentInfo]) -> int:
        return await self._segments.save_segments(segments)

    async def save_segments_and_remove(self, saves: Iterable[SegmentInfo], removals: Iterable[int]) -> int:
        return await self._segments.save_segments_and_remove(saves, removals)

    async def save_loaded(self, infos: Sequence[LoadItem], node_id: int, replica_id: int) -> int:
        return await self._segments.save_loaded(infos, node_id, replica_id)

    async def remove_segments(self, segment_ids: Iterable[int]) -> int:
        return await self._segments.remove_segments(segment_ids)

    async def remove_segment_copies(self, node_id: int, segment_ids: Iterable[int]) -> int:
        return await self._segments.remove_segment_copies(node_id, segment_ids)

    # ===== DM, delta and query channels (``channels.Channels``) =======================
    def dm_channels_of(self, collection_id: int) -> list[DmChannelWatchInfo]:
        return self._channels.dm_channels_of(collection_id)

    def get_dm_channel(self, collection_id: int, channel: str) -> DmChannelWatchInfo | None:
        return self._channels.get_dm_channel(collection_id, channel)

    def dm_channel_copies(self, collection_id: int) -> dict[str, dict[int, int]]:
        return self._channels.dm_channel_copies(collection_id)

    def channels_on_node(self, node_id: int) -> list[DmChannelWatchInfo]:
        return self._channels.channels_on_node(node_id)

    def channel_count_by_node(self) -> dict[int, int]:
        return self._channels.channel_count_by_node()

    async def save_dm_channel_watch(self, watches: Iterable[DmChannelWatchInfo]) -> int:
        return await self._channels.save_dm_channel_watch(watches)

    async def remove_dm_channels(self, collection_id: int, channels: Iterable[str]) -> int:
        return await self._channels.remove_dm_channels(collection_id, channels)

    async def remove_dm_channel_copies(self, node_id: int, collection_id: int, channels: Iterable[str]) -> int:
        return await self._channels.remove_dm_channel_copies(node_id, collection_id, channels)

    def get_delta_channels(self, collection_id: int) -> list[VChannelInfo]:
        return self._channels.get_delta_channels(collection_id)

    async def set_delta_channels(self, collection_id: int, infos: Iterable[VChannelInfo]) -> None:
        await self._channels.set_delta_channels(collection_id, infos)

    @staticmethod
    def query_channels(collection_id: int) -> tuple[str, str]:
        return Channels.query_channels(collection_id)

    # ===== nodes (``nodes.Nodes``) ====================================================
    def known_node_ids(self) -> set[int]:
        return self._nodes.known_node_ids()

    def bound_node_ids(self) -> set[int]:
        return self._nodes.bound_node_ids()

    async def remove_node(self, node_id: int, *, keep_segments: bool = False) -> int:
        return await self._nodes.remove_node(node_id, keep_segments=keep_segments)

    async def remove_collection_copies(self, collection_id: int, node_ids: Iterable[int]) -> int:
        return await self._nodes.remove_collection_copies(collection_id, node_ids)
