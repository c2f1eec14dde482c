"""The catalog kept in etcd: collections, partitions, DM channels and sealed segments.

This is the part of Milvus's RootCoord (collections, schemas, partitions,
channels) and DataCoord (sealed segments and their binlogs) that a query
coordinator needs. Everything lives under ``catalog/`` of the root path::

    catalog/idalloc/id                            next free id (collections, partitions, segments share it)
    catalog/collections/<cid>                     CollectionDescription (protobuf bytes)
    catalog/collection-names/<name>               "<cid>": the name index, unique by a create-revision compare
    catalog/segments/<cid>/<pid>/<sid:019d>       SegmentBinlogs (protobuf bytes)
    catalog/sid-index/<cid>/<sid:019d>            "<pid>": which partition holds the id (``segment_ids``)

Segment ids are zero-padded in keys so that etcd's key order is id order:
paging by segment id (``after_segment_id``) is then one range read.

Consistency rules, each enforced by etcd compares in the same txn as the write
(never by a read-then-write race):

* A collection name is used at most once: the name key is created with a
  ``create_revision == 0`` compare in the txn that writes the collection, so
  of two concurrent creates exactly one wins.
* A segment is only added to a collection that still exists (compare on the
  collection key's create revision), so a drop racing an add leaves no orphan.
* A segment id is used at most once in its collection, across partitions: its
  index key is created with a ``create_revision == 0`` compare in the txn that
  adds the segment, and deleted with it (``segment_ids``).
* A segment and the compaction sources it replaces never both exist: the
  sources are deleted in the txn that adds it, guarded by compares that they
  still exist, so two compactions cannot consume the same source.
* Dropping a collection removes its record, its name, all its segments and
  their id index in one txn (two key deletes and two range deletes), guarded by the absence of
  the query coordinator's load record of it under the same root: a loaded
  collection is released first (Milvus's RootCoord asks QueryCoord to
  release before it drops), and a load committing at the same moment either
  wins (the drop is refused) or finds the collection gone.

The catalog is not leader state: like RootCoord's clients, any process may
write it, and every write is guarded by its own compares. ``CatalogStore``
therefore takes a plain ``MetaKV``, not a leader's fenced view.

Writes retried by the etcd client after a lost answer may already have been
applied; each write recognises its own earlier success (the keys it wrote hold
exactly its values) instead of reporting a conflict with itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence

from meta.kv import FencedKV, MetaKV
from meta.txn import Op, absent, created_at, delete, delete_prefix, put
from proto import catalog_pb2, data_pb2
from querycoord.catalog import errors as catalog_errors
from querycoord.catalog import segment_ids
from querycoord.catalog.access import DEFAULT_WRITE_CONCURRENCY, CatalogAccess
from querycoord.catalog.checks import DEFAULT_DM_CHANNELS, check_name, checked_partition_names, checked_schema
from querycoord.catalog.errors import *  # noqa: F403  (re-exported: what a caller of the store catches)
from querycoord.catalog.errors import CollectionExists, Conflict, InvalidArgument
from querycoord.catalog.keys import (
    CATALOG_PREFIX,
    COLLECTIONS_PREFIX,
    ID_KEY,
    NAMES_PREFIX,
    SEGMENTS_PREFIX,
    SegmentRef,
    collection_key,
    name_key,
    parse_segment_key,
    segment_key,
    segment_prefix,
)
from querycoord.catalog.recovery import RecoveryPage, read_recovery_page
from querycoord.catalog.segment_watch import SegmentChange, SegmentResync, SegmentWatchItem, watch_segments
from querycoord.catalog.segment_writer import SegmentWriter
from querycoord.common.limits import DEFAULT_LIMITS, Limits
from querycoord.common.yielding import TURN_EVERY
from querycoord.querymeta.keys import collection_key as load_record_key

#: Segment records ``show_collections`` parses between two turns of the event loop (a few milliseconds).
STATS_CHUNK = 8 * TURN_EVERY


class CatalogStore(CatalogAccess):
    """The catalog in etcd (see module docstring). One instance per process; any number may share a root path.

    A facade: collections are created, listed and dropped here; ``SegmentWriter`` adds segments,
    ``recovery`` reads them for a load and ``segment_watch`` follows their changes.
    """

    def __init__(
        self,
        kv: MetaKV,
        *,
        channel_prefix: str = "by-dev-rootcoord",
        write_concurrency: int = DEFAULT_WRITE_CONCURRENCY,
        limits: Limits = DEFAULT_LIMITS,
    ):
        if isinstance(kv, FencedKV):
            raise TypeError(
                "CatalogStore needs a plain MetaKV: catalog writes are guarded by their own compares and may be "
                "made by any process, not only the coordinator's leader"
            )
        super().__init__(kv, write_concurrency=write_concurrency)
        self.channel_prefix = channel_prefix
        # Partitions, channels, fields and name lengths a collection may have; the gRPC service checks requests
        # against the same limits before they get here.
        self.limits = limits
        self._segments = SegmentWriter(self)

    # ----- collections ------------------------------------------------------------------------------------------
    async def create_collection(
        self,
        name: str,
        schema: catalog_pb2.CollectionSchema | None = None,
        *,
        partition_names: Sequence[str] = (),
        num_partitions: int = 0,
        num_channels: int = 0,
    ) -> catalog_pb2.CollectionDescription:
        """Create a collection with its partitions and DM channels; a name already in use raises ``CollectionExists``.

        Partitions: ``partition_names``, else ``num_partitions`` named
        ``partition_<i>``, else one named ``_default``. Channels: ``num_channels``
        (0 means 2, as in Milvus) named ``<prefix>-dml_<i>_<cid>v0``.
        """
        limits = self.limits
        check_name("collection", name, limits.max_name_length)
        names = checked_partition_names(partition_names, num_partitions, limits)
        if num_channels < 0 or num_channels > limits.max_dm_channels:
            raise InvalidArgument(
                f"num_dm_channels must be in 0..{limits.max_dm_channels} (0 means 2), got {num_channels}")
        num_channels = num_channels or DEFAULT_DM_CHANNELS
        schema = checked_schema(name, schema, limits)

        ids = await self.allocate_ids(1 + len(names))
        cid = ids[0]
        now = int(time.time() * 1000)
        desc = catalog_pb2.CollectionDescription(
            collection_id=cid,
            name=name,
            schema=schema,
            partitions=[
                catalog_pb2.PartitionInfo(partition_id=pid, name=pname, created_ms=now)
                for pid, pname in zip(ids[1:], names, strict=True)
            ],
            dm_channels=[f"{self.channel_prefix}-dml_{i}_{cid}v0" for i in range(num_channels)],
            created_ms=now,
        )
        nkey, ckey = name_key(name), collection_key(cid)
        # A new collection's segment id index is complete from the start (``segment_ids``: its marker).
        ops = [put(nkey, str(cid)), put(ckey, desc.SerializeToString()), put(segment_ids.marker_key(cid), b"")]
        if await self.guarded_txn(f"create collection {name}", [absent(nkey)], ops):
            return desc
        owner = await self.kv.get(nkey)
        if owner == str(cid).encode():
            return desc  # our own txn, applied before its answer was lost and retried by the client
        raise CollectionExists(
            f"collection name {name!r} is already used by collection {owner.decode() if owner else '?'}; "
            f"choose another name or drop that collection first"
        )

    async def describe_collection(self, ref: int | str) -> catalog_pb2.CollectionDescription:
        """The collection by id (int) or name (str); ``CollectionNotFound`` if absent."""
        desc, _ = await self.collection_and_revision(ref)
        return desc

    async def show_partitions(self, collection_id: int | str) -> list[catalog_pb2.PartitionInfo]:
        desc, _ = await self.collection_and_revision(collection_id)
        return list(desc.partitions)

    async def show_collections(self, *, with_stats: bool = True) -> list[catalog_pb2.CollectionSummary]:
        """Every collection, by id. ``with_stats`` also counts segments and rows (reads every segment record)."""
        snap = await self.kv.load_prefix(COLLECTIONS_PREFIX)
        descs = []
        for _, value in snap.items():
            desc = catalog_pb2.CollectionDescription()
            desc.ParseFromString(value)
            descs.append(desc)
        descs.sort(key=lambda d: d.collection_id)

        async def summary(desc: catalog_pb2.CollectionDescription) -> catalog_pb2.CollectionSummary:
            out = catalog_pb2.CollectionSummary(
                collection_id=desc.collection_id,
                name=desc.name,
                num_partitions=len(desc.partitions),
                created_ms=desc.created_ms,
            )
            if with_stats:
                # Parsed a chunk at a time with turns between (the catalog service runs on a coordinator's event
                # loop: a million records parsed in one stretch held it for seconds); no key is decoded.
                values = (await self.kv.load_prefix(segment_prefix(desc.collection_id))).values()
                seg = data_pb2.SegmentBinlogs()
                for start in range(0, len(values), STATS_CHUNK):
                    if start:
                        await asyncio.sleep(0)
                    for value in values[start:start + STATS_CHUNK]:
                        seg.ParseFromString(value)
                        out.num_rows += seg.num_rows
                out.num_segments = len(values)
            return out

        return list(await asyncio.gather(*(summary(d) for d in descs)))

    async def drop_collection(self, ref: int | str) -> catalog_pb2.CollectionDescription:
        """Remove a collection, its name and all its segments in one txn; returns what was dropped."""
        desc, create_rev = await self.collection_and_revision(ref)
        cid = desc.collection_id
        ops: list[Op] = [delete(collection_key(cid)), delete(name_key(desc.name)), delete_prefix(segment_prefix(cid)),
                         delete_prefix(segment_ids.index_prefix(cid))]
        guards = [created_at(collection_key(cid), create_rev), absent(load_record_key(cid))]
        if not await self.guarded_txn(f"drop collection {cid}", guards, ops):
            if await self.kv.get_kv(load_record_key(cid)) is not None:
                raise Conflict(f"collection {desc.name} (id {cid}) is loaded: release it before dropping it")
            if await self.kv.get_kv(collection_key(cid)) is not None:  # pragma: no cover - ids are never reused
                raise Conflict(f"collection {cid} changed while it was being dropped; retry")
            # Gone either way: dropped by a concurrent call or by our own retried txn.
        return desc

    # ----- segments -------------------------------------------------------------------------------------------------
    async def add_segments(self, segments: Sequence[data_pb2.SegmentBinlogs], collection_id: int = 0) -> list[int]:
        """Add sealed segments; returns their ids in request order (``SegmentWriter.add_segments``)."""
        return await self._segments.add_segments(segments, collection_id)

    # ----- recovery ---------------------------------------------------------------------------------------------------
    async def get_recovery_info(
        self, collection_id: int, partition_id: int, segment_ids: Iterable[int] | None = None
    ) -> tuple[list[data_pb2.VChannelInfo], list[data_pb2.SegmentBinlogs]]:
        """DM channels and sealed segments of a partition (all of them, or those of ``segment_ids``).

        Ids not in the partition (compacted away, dropped) are absent from the
        answer: callers compare with what they asked for. Each channel's
        ``flushed_segment_ids`` lists the answer's segments in that channel.
        """
        page = await self.get_recovery_page(collection_id, partition_id, segment_ids)
        return page.channels, page.binlogs

    async def get_recovery_page(
        self,
        collection_id: int,
        partition_id: int,
        segment_ids: Iterable[int] | None = None,
        *,
        after_segment_id: int = 0,
        page_size: int = 0,
    ) -> RecoveryPage:
        """``get_recovery_info`` restricted to segment ids > ``after_segment_id``, at most ``page_size`` (0: all)."""
        return await read_recovery_page(self, collection_id, partition_id, segment_ids, after_segment_id, page_size)

    # ----- watch ------------------------------------------------------------------------------------------------------
    def watch_segments(self, start_revision: int = 0) -> AsyncIterator[SegmentWatchItem]:
        """Segment additions and removals from ``start_revision`` on (0: from now), one item per catalog txn.

        Nothing is lost or repeated across etcd restarts; if the resume revision
        was compacted, a ``SegmentResync`` carries the whole segment set.
        """
        return watch_segments(self.kv, start_revision)

    # ----- bulk (demo, benchmarks) ----------------------------------------------------------------------------------
    async def create_bulk_collection(
        self,
        name: str,
        *,
        num_partitions: int,
        num_segments: int,
        num_channels: int = DEFAULT_DM_CHANNELS,
        rows_per_segment: int = 10_000,
        dim: int = 128,
        binlogs_per_segment: int = 2,
    ) -> tuple[catalog_pb2.CollectionDescription, list[int]]:
        """A collection with a pk + vector schema and ``num_segments`` synthetic segments spread over its partitions.

        Segments go through ``add_segments`` (validated, many per txn, txns in
        parallel), so the result is what a real ingest would have produced.
        """
        if num_segments < 0:
            raise InvalidArgument(f"num_segments must be >= 0, got {num_segments}")
        schema = catalog_pb2.CollectionSchema(
            fields=[
                catalog_pb2.FieldSchema(name="id", data_type=catalog_pb2.DATA_TYPE_INT64, is_primary_key=True),
                catalog_pb2.FieldSchema(name="vec", data_type=catalog_pb2.DATA_TYPE_FLOAT_VECTOR, dim=dim),
            ]
        )
        desc = await self.create_collection(
            name, schema, num_partitions=num_partitions, num_channels=num_channels
        )
        if not num_segments:
            return desc, []
        cid = desc.collection_id
        parts = [p.partition_id for p in desc.partitions]
        ids = await self.allocate_ids(num_segments)
        mem_size = rows_per_segment * (dim * 4 + 8)
        segs = []
        for i, sid in enumerate(ids):
            pid = parts[i % len(parts)]
            segs.append(
                data_pb2.SegmentBinlogs(
                    segment_id=sid,
                    collection_id=cid,
                    partition_id=pid,
                    num_rows=rows_per_segment,
                    mem_size=mem_size,
                    binlog_paths=[f"insert_log/{cid}/{pid}/{sid}/{k}" for k in range(binlogs_per_segment)],
                    insert_channel=desc.dm_channels[i % len(desc.dm_channels)],
                )
            )
        return desc, await self.add_segments(segs, collection_id=cid)


__all__ = [
    "CATALOG_PREFIX",
    "COLLECTIONS_PREFIX",
    "ID_KEY",
    "NAMES_PREFIX",
    "SEGMENTS_PREFIX",
    "CatalogStore",
    "RecoveryPage",
    "SegmentChange",
    "SegmentRef",
    "SegmentResync",
    "SegmentWatchItem",
    "collection_key",
    "name_key",
    "parse_segment_key",
    "segment_key",
    "segment_prefix",
]
__all__ += catalog_errors.__all__
