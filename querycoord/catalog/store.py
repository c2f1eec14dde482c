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
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

from google.protobuf.message import DecodeError

from meta.idalloc import IdAllocator
from meta.kv import Batch, FencedKV, MetaKV
from meta.txn import Compare, Op, Put, Unit, absent, created_at, delete, delete_prefix, put
from meta.watch import EventType, Resync, watch_prefix
from proto import catalog_pb2, data_pb2
from querycoord.catalog import segment_ids
from querycoord.catalog.errors import (
    STATUS_SOURCE,
    AddSegmentsIncomplete,
    CatalogError,
    CollectionExists,
    CollectionNotFound,
    Conflict,
    InvalidArgument,
    NotFound,
    PartitionNotFound,
    SegmentIdTaken,
    status_of,
)
from querycoord.limits import DEFAULT_LIMITS, Limits
from querycoord.querymeta.keys import collection_key as load_record_key

CATALOG_PREFIX = "catalog/"
COLLECTIONS_PREFIX = "catalog/collections/"
NAMES_PREFIX = "catalog/collection-names/"
SEGMENTS_PREFIX = "catalog/segments/"
ID_KEY = "catalog/idalloc/id"

# Limits as in Milvus (proxy.maxPartitionNum, maxShardNum, maxFieldNum, maxDimension, maxNameLength): the
# defaults of ``querycoord.limits.Limits``, which a store is given (the coordinator's configuration).
MAX_PARTITIONS = DEFAULT_LIMITS.max_partitions
MAX_DM_CHANNELS = DEFAULT_LIMITS.max_dm_channels
DEFAULT_DM_CHANNELS = 2
MAX_FIELDS = DEFAULT_LIMITS.max_fields
MAX_DIM = 32768
MAX_NAME_LENGTH = DEFAULT_LIMITS.max_name_length
DEFAULT_PARTITION_NAME = "_default"
# Milvus gives user fields ids from 100 on (0 and 1 are the row id and timestamp system fields).
FIRST_FIELD_ID = 100

# Txns of one add_segments call (or reads of one lookup) sent at once.
DEFAULT_WRITE_CONCURRENCY = 8
# Above this many ids a filtered lookup reads the partition's prefix instead of key by key.
_MAX_POINT_READS = 1024

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VECTOR_TYPES = (catalog_pb2.DATA_TYPE_FLOAT_VECTOR, catalog_pb2.DATA_TYPE_BINARY_VECTOR)


# ----- keys -----------------------------------------------------------------------------------------------------------
def collection_key(collection_id: int) -> str:
    return f"{COLLECTIONS_PREFIX}{collection_id}"


def name_key(name: str) -> str:
    return f"{NAMES_PREFIX}{name}"


def segment_prefix(collection_id: int, partition_id: int | None = None) -> str:
    """Prefix of a collection's segments, or of one partition's."""
    if partition_id is None:
        return f"{SEGMENTS_PREFIX}{collection_id}/"
    return f"{SEGMENTS_PREFIX}{collection_id}/{partition_id}/"


def segment_key(collection_id: int, partition_id: int, segment_id: int) -> str:
    return f"{SEGMENTS_PREFIX}{collection_id}/{partition_id}/{segment_id:019d}"


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """Where a segment lives; all a removal event can tell (the value is gone)."""

    collection_id: int
    partition_id: int
    segment_id: int


def parse_segment_key(key: str) -> SegmentRef:
    """Inverse of ``segment_key`` (``key`` relative to the root path)."""
    cid, pid, sid = key[len(SEGMENTS_PREFIX) :].split("/")
    return SegmentRef(int(cid), int(pid), int(sid))


# ----- results --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RecoveryPage:
    """One page of ``get_recovery_page``: channels, binlogs in segment id order, and where to continue (0: done).

    Each channel's ``flushed_segment_ids`` lists the segments of *this* page in
    that channel; the union over all pages is the whole partition's.
    """

    channels: list[data_pb2.VChannelInfo]
    binlogs: list[data_pb2.SegmentBinlogs]
    next_after_segment_id: int


@dataclass(frozen=True, slots=True)
class SegmentChange:
    """Segment changes made by one catalog txn (one etcd revision).

    A compaction shows up as one change: the new segment in ``added`` (its
    ``compaction_from`` names what it replaces) and the sources in ``removed``.
    Dropping a collection removes all its segments in one change.
    """

    revision: int
    added: list[data_pb2.SegmentBinlogs] = field(default_factory=list)
    removed: list[SegmentRef] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SegmentResync:
    """The watch's resume revision was compacted away: here is every segment as of ``revision``; forget the rest."""

    revision: int
    segments: list[data_pb2.SegmentBinlogs]


SegmentWatchItem = SegmentChange | SegmentResync


# ----- helpers --------------------------------------------------------------------------------------------------------
def parse_binlogs(values: list[bytes]) -> list[data_pb2.SegmentBinlogs]:
    """Parse catalog segment records, all in one call to the protobuf library.

    Why: a message made and parsed per record cost twice the parse itself (a recovery read of a whole
    collection parses every segment). The records are framed as the ``binlogs`` field of one
    ``GetRecoveryInfoResponse`` (tag and length in front of each) and parsed at once: the messages are the ones
    parsing each record gives (a length-delimited field is parsed as a message of its own). A record that does not
    parse is parsed again alone, so the error is the one it always was (``_parse_each``).
    """
    if len(values) < 2:
        return _parse_each(values)
    out: list[data_pb2.SegmentBinlogs] = []
    for start in range(0, len(values), _PARSE_CHUNK):
        out += _parse_framed(values[start:start + _PARSE_CHUNK])
    return out


def _parse_framed(values: list[bytes]) -> list[data_pb2.SegmentBinlogs]:
    """``parse_binlogs`` of up to ``_PARSE_CHUNK`` records, framed and parsed as one message."""
    framed: list[bytes] = [b""] * (2 * len(values))
    framed[::2] = map(_FRAME_HEADS.__getitem__, map(len, values))  # head before each record, all in C
    framed[1::2] = values
    response = catalog_pb2.GetRecoveryInfoResponse()
    try:
        response.ParseFromString(b"".join(framed))
    except DecodeError:
        return _parse_each(values)
    return list(response.binlogs)


def _parse_each(values: list[bytes]) -> list[data_pb2.SegmentBinlogs]:
    """``parse_binlogs`` one message per record."""
    out = []
    for value in values:
        seg = data_pb2.SegmentBinlogs()
        seg.ParseFromString(value)
        out.append(seg)
    return out


# Records parsed as one message: the framed copy stays small, and far from protobuf's 2 GiB message limit.
_PARSE_CHUNK = 8192
# Field 3 (``binlogs``) of GetRecoveryInfoResponse, length-delimited: the tag byte of each framed record.
_BINLOGS_TAG = bytes([(catalog_pb2.GetRecoveryInfoResponse.BINLOGS_FIELD_NUMBER << 3) | 2])


class _FrameHeads(dict[int, bytes]):
    """Tag and base-128 varint length in front of a framed record, by record length; each made on first use
    (the records of a catalog have few distinct lengths), and forgotten past 65,536 of them."""

    def __missing__(self, length: int) -> bytes:
        out = bytearray(_BINLOGS_TAG)
        n = length
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        head = bytes(out)
        if len(self) >= 65536:
            self.clear()
        self[length] = head
        return head


# The heads ``_parse_framed`` puts in front of records, by record length.
_FRAME_HEADS = _FrameHeads()


def _add_flushed(channels: list[data_pb2.VChannelInfo], binlogs: list[data_pb2.SegmentBinlogs]) -> None:
    """List each segment of ``binlogs`` in its insert channel's ``flushed_segment_ids`` (in order; a channel
    that is not one of ``channels`` is skipped): collected per channel, then added with one call each."""
    by_name = {c.channel_name: c for c in channels}
    ids: dict[str, list[int]] = {name: [] for name in by_name}
    for segment_id, name in zip(map(_SEGMENT_ID, binlogs), map(_INSERT_CHANNEL, binlogs), strict=True):
        found = ids.get(name)
        if found is not None:
            found.append(segment_id)
    for name, ch in by_name.items():
        ch.flushed_segment_ids.extend(ids[name])


_SEGMENT_ID = attrgetter("segment_id")
_INSERT_CHANNEL = attrgetter("insert_channel")
_VALUE = itemgetter(1)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _check_name(kind: str, name: str, limit: int = MAX_NAME_LENGTH) -> None:
    """Milvus's naming rule; it also keeps names usable as etcd key segments."""
    if not name:
        raise InvalidArgument(f"{kind} name is empty")
    if len(name) > limit:
        raise InvalidArgument(f"{kind} name {name[:40]!r}... is {len(name)} characters long (limit {limit})")
    if not _NAME_RE.match(name):
        raise InvalidArgument(
            f"{kind} name {name!r} is invalid: it must start with a letter or '_' and contain only letters, "
            f"digits and '_'"
        )


def _short_list(values: Iterable[object], limit: int = 10) -> str:
    items = list(values)
    text = ", ".join(map(str, items[:limit]))
    return text + (f", ... ({len(items)} in all)" if len(items) > limit else "")


@dataclass(slots=True)
class _Unit:
    """Segments that must be written in one txn: they share compaction sources (usually just one segment)."""

    segments: list[data_pb2.SegmentBinlogs] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)  # source key -> create revision read at validation


def _segment_ids(batch: Batch) -> list[int]:
    """Ids of the segments one txn of ``add_segments`` adds."""
    return [seg.segment_id for unit in batch.payloads for seg in unit.segments]


def _segment_puts(batch: Batch) -> dict[str, bytes]:
    """Key -> value of every segment one txn of ``add_segments`` writes."""
    return {op.key: op.value for op in batch.ops if isinstance(op, Put)}


def _collections(batch: Batch) -> list[int]:
    """Collections whose segments one txn of ``add_segments`` adds."""
    return sorted({seg.collection_id for unit in batch.payloads for seg in unit.segments})


class CatalogStore:
    """The catalog in etcd (see module docstring). One instance per process; any number may share a root path."""

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
        if write_concurrency < 1:
            raise ValueError(f"write_concurrency must be >= 1, got {write_concurrency}")
        self.kv = kv
        self.channel_prefix = channel_prefix
        self.write_concurrency = write_concurrency
        # Partitions, channels, fields and name lengths a collection may have; the gRPC service checks requests
        # against the same limits before they get here.
        self.limits = limits
        self._ids = IdAllocator(kv, ID_KEY)
        self._indexed: set[tuple[int, int]] = set()  # (collection, create revision) whose id index is complete

    # ----- low-level etcd access ------------------------------------------------------------------------------------
    async def _txn(self, operation: str, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        """One guarded txn (limits checked by MetaKV before sending); returns whether the compares held."""
        return (await self.kv.txn(compares, ops, operation=operation)).succeeded

    async def _get_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """``key -> (value, create_revision)`` of the keys that exist, all read at one revision.

        Plain Range calls, not read-only txns: etcd before 3.5.5 panics when a
        read-only txn is cancelled (etcd-io/etcd#14110), and a coordinator that
        loses leadership or is killed cancels its reads.
        """
        found: dict[str, tuple[bytes, int]] = {}
        if not keys:
            return found
        revision = await self.kv.revision()
        sem = asyncio.Semaphore(self.write_concurrency * 8)

        async def read(key: str) -> None:
            async with sem:
                item = await self.kv.get_kv(key, revision=revision)
            if item is not None:
                found[item.key] = (item.value, item.create_revision)

        await asyncio.gather(*(read(k) for k in keys))
        return found

    async def _range_page(self, start: str, prefix: str, limit: int) -> tuple[list[tuple[str, bytes]], bool]:
        """Keys from ``start`` to the end of ``prefix``, at most ``limit``; and whether more follow."""
        items, more = await self.kv.range_page(prefix, start=start, limit=limit)
        return [(item.key, item.value) for item in items], more

    async def revision(self) -> int:
        """etcd's current revision: read it before a snapshot, then ``watch_segments(revision + 1)`` misses nothing."""
        return await self.kv.revision()

    async def allocate_ids(self, n: int) -> range:
        """``n`` fresh catalog ids (e.g. segment ids chosen before their binlog paths are written)."""
        return await self._ids.allocate(n)

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
        _check_name("collection", name, limits.max_name_length)
        names = self._partition_names(partition_names, num_partitions, limits)
        if num_channels < 0 or num_channels > limits.max_dm_channels:
            raise InvalidArgument(
                f"num_dm_channels must be in 0..{limits.max_dm_channels} (0 means 2), got {num_channels}")
        num_channels = num_channels or DEFAULT_DM_CHANNELS
        schema = self._checked_schema(name, schema, limits)

        ids = await self._ids.allocate(1 + len(names))
        cid = ids[0]
        now = _now_ms()
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
        if await self._txn(f"create collection {name}", [absent(nkey)], ops):
            return desc
        owner = await self.kv.get(nkey)
        if owner == str(cid).encode():
            return desc  # our own txn, applied before its answer was lost and retried by the client
        raise CollectionExists(
            f"collection name {name!r} is already used by collection {owner.decode() if owner else '?'}; "
            f"choose another name or drop that collection first"
        )

    @staticmethod
    def _partition_names(partition_names: Sequence[str], num_partitions: int, limits: Limits) -> list[str]:
        """The partition names to create, checked. The counts are checked BEFORE any name is built: a request
        for 2**31 - 1 partitions once built that many names and took the coordinator down at 23 GB."""
        if partition_names and num_partitions and num_partitions != len(partition_names):
            raise InvalidArgument(
                f"num_partitions is {num_partitions} but {len(partition_names)} partition names were given; "
                f"give one or the other"
            )
        if num_partitions < 0:
            raise InvalidArgument(f"num_partitions must be >= 0, got {num_partitions}")
        requested = max(num_partitions, len(partition_names))
        if requested > limits.max_partitions:
            raise InvalidArgument(f"{requested} partitions requested (num_partitions / partition_names); a "
                                  f"collection has at most {limits.max_partitions} (limit max_partitions)")
        if partition_names:
            names = list(partition_names)
        elif num_partitions:
            names = [f"partition_{i}" for i in range(num_partitions)]
        else:
            names = [DEFAULT_PARTITION_NAME]
        for pname in names:
            _check_name("partition", pname, limits.max_name_length)
        dup = sorted(n for n, count in Counter(names).items() if count > 1)
        if dup:
            raise InvalidArgument(f"partition names must be unique; repeated: {_short_list(dup)}")
        return names

    @staticmethod
    def _checked_schema(
        name: str, schema: catalog_pb2.CollectionSchema | None, limits: Limits = DEFAULT_LIMITS
    ) -> catalog_pb2.CollectionSchema:
        """A copy of ``schema`` with its name set and field ids assigned, after Milvus's checks."""
        out = catalog_pb2.CollectionSchema()
        if schema is not None:
            out.CopyFrom(schema)
        if out.name and out.name != name:
            raise InvalidArgument(f"schema name {out.name!r} differs from the collection name {name!r}")
        out.name = name
        if len(out.fields) > limits.max_fields:
            raise InvalidArgument(f"schema has {len(out.fields)} fields; at most {limits.max_fields} are allowed")
        seen_names: set[str] = set()
        used_ids = {f.field_id for f in out.fields if f.field_id}
        if len(used_ids) != len([f for f in out.fields if f.field_id]):
            raise InvalidArgument("schema field ids must be unique")
        if any(f.field_id < 0 for f in out.fields):
            raise InvalidArgument("schema field ids must be >= 0 (0 = assign)")
        next_id = FIRST_FIELD_ID
        for f in out.fields:
            _check_name("field", f.name, limits.max_name_length)
            if f.name in seen_names:
                raise InvalidArgument(f"schema field name {f.name!r} is repeated")
            seen_names.add(f.name)
            if f.data_type == catalog_pb2.DATA_TYPE_NONE or f.data_type not in catalog_pb2.DataType.values():
                raise InvalidArgument(f"field {f.name!r} has no valid data type ({f.data_type})")
            if f.data_type in _VECTOR_TYPES:
                if not 0 < f.dim <= MAX_DIM:
                    raise InvalidArgument(f"vector field {f.name!r} needs a dim in 1..{MAX_DIM}, got {f.dim}")
                if f.data_type == catalog_pb2.DATA_TYPE_BINARY_VECTOR and f.dim % 8:
                    raise InvalidArgument(f"binary vector field {f.name!r} needs a dim divisible by 8, got {f.dim}")
            elif f.dim:
                raise InvalidArgument(f"scalar field {f.name!r} must not have a dim (got {f.dim})")
            if not f.field_id:
                while next_id in used_ids:
                    next_id += 1
                f.field_id = next_id
                used_ids.add(next_id)
        primaries = [f.name for f in out.fields if f.is_primary_key]
        if len(primaries) > 1:
            raise InvalidArgument(f"a schema has at most one primary key field; got {', '.join(primaries)}")
        return out

    async def _load_collection(self, ref: int | str) -> tuple[catalog_pb2.CollectionDescription, int]:
        """The description of a collection (by id or name) and its key's create revision."""
        if isinstance(ref, str):
            if not ref:
                raise InvalidArgument("collection name is empty (give a collection id or name)")
            raw_id = await self.kv.get(name_key(ref))
            if raw_id is None:
                raise CollectionNotFound(f"collection {ref!r} does not exist in the catalog")
            cid = int(raw_id)
        else:
            if isinstance(ref, bool) or not isinstance(ref, int) or ref <= 0:
                raise InvalidArgument(f"name the collection: its id must be a positive integer (got {ref!r})")
            cid = ref
        kvx = await self.kv.get_kv(collection_key(cid))
        if kvx is None:
            raise CollectionNotFound(f"collection {ref!r} does not exist in the catalog")
        desc = catalog_pb2.CollectionDescription()
        desc.ParseFromString(kvx.value)
        return desc, kvx.create_revision

    async def describe_collection(self, ref: int | str) -> catalog_pb2.CollectionDescription:
        """The collection by id (int) or name (str); ``CollectionNotFound`` if absent."""
        desc, _ = await self._load_collection(ref)
        return desc

    async def show_partitions(self, collection_id: int | str) -> list[catalog_pb2.PartitionInfo]:
        desc, _ = await self._load_collection(collection_id)
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
                values = [v for _, v in (await self.kv.load_prefix(segment_prefix(desc.collection_id))).items()]
                seg = data_pb2.SegmentBinlogs()
                for value in values:
                    seg.ParseFromString(value)
                    out.num_rows += seg.num_rows
                out.num_segments = len(values)
            return out

        return list(await asyncio.gather(*(summary(d) for d in descs)))

    async def drop_collection(self, ref: int | str) -> catalog_pb2.CollectionDescription:
        """Remove a collection, its name and all its segments in one txn; returns what was dropped."""
        desc, create_rev = await self._load_collection(ref)
        cid = desc.collection_id
        ops: list[Op] = [delete(collection_key(cid)), delete(name_key(desc.name)), delete_prefix(segment_prefix(cid)),
                         delete_prefix(segment_ids.index_prefix(cid))]
        guards = [created_at(collection_key(cid), create_rev), absent(load_record_key(cid))]
        if not await self._txn(f"drop collection {cid}", guards, ops):
            if await self.kv.get_kv(load_record_key(cid)) is not None:
                raise Conflict(f"collection {desc.name} (id {cid}) is loaded: release it before dropping it")
            if await self.kv.get_kv(collection_key(cid)) is not None:  # pragma: no cover - ids are never reused
                raise Conflict(f"collection {cid} changed while it was being dropped; retry")
            # Gone either way: dropped by a concurrent call or by our own retried txn.
        return desc

    # ----- segments -------------------------------------------------------------------------------------------------
    async def add_segments(self, segments: Sequence[data_pb2.SegmentBinlogs], collection_id: int = 0) -> list[int]:
        """Add sealed segments; returns their ids in request order.

        ``segment_id`` 0 is allocated; ``collection_id`` 0 takes the argument;
        ``insert_channel`` empty is assigned round-robin (by segment id) over
        the collection's DM channels. ``compaction_from`` names segments of the
        same partition that the new one replaces: they are removed in the txn
        that adds it. Everything is validated before anything is written; the
        segments are then written in as few txns as etcd's limits allow (many
        segments per txn, a compaction group never split), several at once.
        A txn failing after others were written raises ``AddSegmentsIncomplete``.

        A segment id is unique within its collection, across partitions (``segment_ids``): an explicit id
        held already raises ``SegmentIdTaken`` (ALREADY_EXISTS, naming the partition that holds it) before
        anything is written; one held with exactly the binlogs sent (a re-sent request) is left as it is.
        Two concurrent requests adding one id: one wins, the other is refused the same way.
        """
        if not segments:
            raise InvalidArgument("no segments to add")
        segs = [data_pb2.SegmentBinlogs() for _ in segments]
        for seg, given in zip(segs, segments, strict=True):
            seg.CopyFrom(given)
        colls = await self._validate_segments(segs, collection_id)
        for cid, (_, rev) in colls.items():
            await self._ensure_index(cid, rev)
        requested = segs  # the ids are returned in this order (those to allocate are set on these very messages)
        explicit = {s.segment_id for s in segs if s.segment_id}
        missing = len(segs) - len(explicit)
        new_ids = iter(await self._ids.allocate(missing) if missing else ())
        for seg in segs:
            if seg.segment_id == 0:
                seg.segment_id = next(new_ids)
            if not seg.insert_channel:
                channels = colls[seg.collection_id][0].dm_channels
                seg.insert_channel = channels[seg.segment_id % len(channels)]

        segs = await self._without_resent(segs, explicit)  # after the channels are assigned: compared as stored
        if not segs:
            return [s.segment_id for s in requested]  # every segment is stored already, exactly as sent
        sources = await self._read_sources(segs)
        units = self._units(segs, sources)
        coll_revs = {cid: rev for cid, (_, rev) in colls.items()}
        chunks = self.kv.pack([self._txn_unit(u, coll_revs) for u in units])
        await self._write_chunks(chunks, len(segs), coll_revs)
        return [s.segment_id for s in requested]

    async def _ensure_index(self, collection_id: int, revision: int) -> None:
        """``segment_ids.ensure_index`` once per collection and process (a marker never goes while its
        collection stays: a drop removes both, and ids are never reused)."""
        if (collection_id, revision) in self._indexed:
            return
        await segment_ids.ensure_index(self.kv, collection_id, collection_key=collection_key(collection_id),
                                       collection_revision=revision, segment_prefix=segment_prefix(collection_id))
        if len(self._indexed) >= 1 << 16:
            self._indexed.clear()
        self._indexed.add((collection_id, revision))

    async def _without_resent(self, segs: list[data_pb2.SegmentBinlogs],
                              explicit_ids: set[int]) -> list[data_pb2.SegmentBinlogs]:
        """``segs`` less those stored already exactly as sent; ``SegmentIdTaken`` if an id the request names
        (``explicit_ids``) is held otherwise (another partition, or other binlogs). Read before anything is
        written, so a clash refuses the whole request, however many txns it would take. Allocated ids are
        fresh and not read: the txn's compares still guard them."""
        explicit = [s for s in segs if s.segment_id in explicit_ids]
        if not explicit:
            return segs
        held: dict[tuple[int, int], int] = {}
        for cid in sorted({s.collection_id for s in explicit}):
            ids = [s.segment_id for s in explicit if s.collection_id == cid]
            found = await segment_ids.held(self.kv, cid, ids, read_keys=self._get_many)
            held.update(((cid, sid), pid) for sid, pid in found.items())
        if not held:
            return segs
        mine = [s for s in explicit if held.get((s.collection_id, s.segment_id)) == s.partition_id]
        stored = await self._get_many([segment_key(s.collection_id, s.partition_id, s.segment_id) for s in mine])
        resent = {(s.collection_id, s.segment_id) for s in mine
                  if stored.get(segment_key(s.collection_id, s.partition_id, s.segment_id), (b"", 0))[0]
                  == s.SerializeToString()}
        clashes: dict[int, list[tuple[int, int, int]]] = {}
        for s in explicit:
            where = held.get((s.collection_id, s.segment_id))
            if where is not None and (s.collection_id, s.segment_id) not in resent:
                clashes.setdefault(s.collection_id, []).append((s.segment_id, s.partition_id, where))
        if clashes:
            raise SegmentIdTaken("; ".join(segment_ids.taken_reason(cid, items) for cid, items in
                                           sorted(clashes.items())) + "; nothing of this request was written")
        return [s for s in segs if (s.collection_id, s.segment_id) not in resent]

    async def _validate_segments(
        self, segs: list[data_pb2.SegmentBinlogs], collection_id: int
    ) -> dict[int, tuple[catalog_pb2.CollectionDescription, int]]:
        """Check every segment against the request and the catalog; returns the collections involved."""
        if collection_id < 0:
            raise InvalidArgument(f"collection_id must be >= 0, got {collection_id}")
        for i, seg in enumerate(segs):
            if seg.collection_id == 0:
                if not collection_id:
                    raise InvalidArgument(f"segment #{i}: collection_id is 0 and the request names no collection")
                seg.collection_id = collection_id
            elif collection_id and seg.collection_id != collection_id:
                raise InvalidArgument(
                    f"segment #{i} belongs to collection {seg.collection_id}, but the request is for collection "
                    f"{collection_id}"
                )
        colls: dict[int, tuple[catalog_pb2.CollectionDescription, int]] = {}
        for cid in sorted({s.collection_id for s in segs}):
            colls[cid] = await self._load_collection(cid)
        # Once per collection, not per segment: segments x partitions was quadratic in the request.
        partitions = {cid: {p.partition_id for p in desc.partitions} for cid, (desc, _) in colls.items()}
        channels = {cid: set(desc.dm_channels) for cid, (desc, _) in colls.items()}

        seen: set[int] = set()
        for i, seg in enumerate(segs):
            what = f"segment #{i}" + (f" (id {seg.segment_id})" if seg.segment_id else "")
            desc = colls[seg.collection_id][0]
            if seg.segment_id < 0:
                raise InvalidArgument(f"{what}: segment_id must be >= 0 (0 = allocate), got {seg.segment_id}")
            if seg.segment_id:
                if seg.segment_id in seen:
                    raise InvalidArgument(f"{what}: segment id {seg.segment_id} appears twice in the request")
                seen.add(seg.segment_id)
            if seg.partition_id not in partitions[seg.collection_id]:
                raise PartitionNotFound(
                    f"{what}: partition {seg.partition_id} does not exist in collection {desc.collection_id} "
                    f"(its partitions: {_short_list(p.partition_id for p in desc.partitions)})"
                )
            if seg.num_rows < 0 or seg.mem_size < 0:
                raise InvalidArgument(
                    f"{what}: num_rows and mem_size must be >= 0, got {seg.num_rows} and {seg.mem_size}"
                )
            if seg.insert_channel and seg.insert_channel not in channels[seg.collection_id]:
                raise InvalidArgument(
                    f"{what}: insert channel {seg.insert_channel!r} is not a DM channel of collection "
                    f"{desc.collection_id} ({', '.join(desc.dm_channels)}); leave it empty to have one assigned"
                )
            if any(not p for p in seg.binlog_paths):
                raise InvalidArgument(f"{what}: a binlog path is empty")
            srcs = list(seg.compaction_from)
            if len(set(srcs)) != len(srcs) or any(s <= 0 for s in srcs):
                raise InvalidArgument(f"{what}: compaction_from must list distinct positive ids, got {srcs}")
            if seg.segment_id and seg.segment_id in srcs:
                raise InvalidArgument(f"{what}: a segment cannot replace itself")
        new_ids = {s.segment_id for s in segs if s.segment_id}
        for i, seg in enumerate(segs):
            both = new_ids.intersection(seg.compaction_from)
            if both:
                raise InvalidArgument(
                    f"segment #{i}: compaction sources {_short_list(sorted(both))} are added by this same request; "
                    f"add sources first, then what replaces them"
                )
        return colls

    async def _read_sources(self, segs: list[data_pb2.SegmentBinlogs]) -> dict[str, int]:
        """Create revisions of every compaction source, which must be in the new segment's partition."""
        keys = sorted({segment_key(s.collection_id, s.partition_id, src) for s in segs for src in s.compaction_from})
        if not keys:
            return {}
        found = await self._get_many(keys)
        for seg in segs:
            missing = [
                src for src in seg.compaction_from if segment_key(seg.collection_id, seg.partition_id, src) not in found
            ]
            if missing:
                raise NotFound(
                    f"segment {seg.segment_id}: compaction sources {_short_list(missing)} are not in partition "
                    f"{seg.partition_id} of collection {seg.collection_id} (already compacted away, dropped, never "
                    f"added, or in another partition: compaction stays within a partition)"
                )
        return {k: rev for k, (_, rev) in found.items()}

    @staticmethod
    def _units(segs: list[data_pb2.SegmentBinlogs], sources: dict[str, int]) -> list[_Unit]:
        """Group segments sharing a compaction source (union-find): each group must land in one txn."""
        parent = list(range(len(segs)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[str, int] = {}
        for i, seg in enumerate(segs):
            for src in seg.compaction_from:
                key = segment_key(seg.collection_id, seg.partition_id, src)
                if key in owner:
                    parent[find(i)] = find(owner[key])
                else:
                    owner[key] = i
        groups: dict[int, _Unit] = {}
        for i, seg in enumerate(segs):
            unit = groups.setdefault(find(i), _Unit())
            unit.segments.append(seg)
            for src in seg.compaction_from:
                key = segment_key(seg.collection_id, seg.partition_id, src)
                unit.sources[key] = sources[key]
        return list(groups.values())

    @staticmethod
    def _txn_unit(unit: _Unit, coll_revs: dict[int, int]) -> Unit:
        """The ops and compares of one group: its segments' puts and its sources' deletes (each with its id's
        index key), guarded by the sources still being the ones read, every id being free in its collection
        (its index key absent) and (once per txn) its collections existing."""
        ops: list[Op] = []
        compares: list[Compare] = []
        for seg in unit.segments:
            ops.append(put(segment_key(seg.collection_id, seg.partition_id, seg.segment_id), seg.SerializeToString()))
            index_put, free = segment_ids.add_ops(seg.collection_id, seg.partition_id, seg.segment_id)
            ops.append(index_put)
            compares.append(free)
        for key, rev in unit.sources.items():
            src = parse_segment_key(key)
            ops += [delete(key), segment_ids.remove_op(src.collection_id, src.segment_id)]
            compares.append(created_at(key, rev))
        cids = sorted({s.collection_id for s in unit.segments})
        shared = [created_at(collection_key(cid), coll_revs[cid]) for cid in cids]
        return Unit(ops, compares, shared, payload=unit)

    async def _write_chunks(self, chunks: list[Batch], total: int, coll_revs: dict[int, int]) -> None:
        """The txns of one ``add_segments``, several at once (independent: each holds whole groups)."""
        sem = asyncio.Semaphore(self.write_concurrency)

        async def write(chunk: Batch) -> None:
            async with sem:
                if not await self._txn(f"add {len(_segment_ids(chunk))} segments", chunk.compares, chunk.ops):
                    await self._explain_failed_chunk(chunk, coll_revs)

        results = await asyncio.gather(*(write(c) for c in chunks), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return
        written = [
            sid
            for c, r in zip(chunks, results, strict=True)
            if not isinstance(r, BaseException)
            for sid in _segment_ids(c)
        ]
        if not written:
            raise failures[0]
        raise AddSegmentsIncomplete(failures[0], written, total) from failures[0]

    async def _explain_failed_chunk(self, chunk: Batch, coll_revs: dict[int, int]) -> None:
        """A chunk's compares failed: return if it was our own retried txn, else raise why."""
        puts = _segment_puts(chunk)
        current = await self._get_many(list(puts))
        if len(current) == len(puts) and all(current[k][0] == v for k, v in puts.items()):
            return  # applied by an earlier attempt whose answer was lost
        for cid in _collections(chunk):
            kvx = await self.kv.get_kv(collection_key(cid))
            if kvx is None or kvx.create_revision != coll_revs[cid]:
                raise CollectionNotFound(f"collection {cid} was dropped while its segments were being added")
        clashes: dict[int, list[tuple[int, int, int]]] = {}
        same: list[int] = []  # added meanwhile by another request, exactly as this one sends them
        for seg in (seg for unit in chunk.payloads for seg in unit.segments):
            held = current.get(segment_ids.index_key(seg.collection_id, seg.segment_id))
            if held is None:
                continue
            where = segment_ids.holder(held[0])
            skey = segment_key(seg.collection_id, seg.partition_id, seg.segment_id)
            if where == seg.partition_id and skey in current and current[skey][0] == puts[skey]:
                same.append(seg.segment_id)
            else:
                clashes.setdefault(seg.collection_id, []).append((seg.segment_id, seg.partition_id, where))
        if clashes:
            raise SegmentIdTaken("; ".join(segment_ids.taken_reason(cid, items) for cid, items in
                                           sorted(clashes.items())) + "; nothing of this txn was written")
        if same:
            raise Conflict(f"segments {_short_list(sorted(same))} were added meanwhile by another request, with the "
                           f"same binlogs; nothing of this txn was written: re-send the request (what is stored "
                           f"stays)")
        raise Conflict(
            "compaction sources of this request were removed concurrently (another compaction replaced them); "
            "nothing of this txn was written"
        )

    # ----- recovery ---------------------------------------------------------------------------------------------------
    async def _partition(self, collection_id: int, partition_id: int) -> catalog_pb2.CollectionDescription:
        desc, _ = await self._load_collection(collection_id)
        if partition_id not in {p.partition_id for p in desc.partitions}:
            raise PartitionNotFound(
                f"partition {partition_id} does not exist in collection {collection_id} "
                f"(its partitions: {_short_list(p.partition_id for p in desc.partitions)})"
            )
        return desc

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
        if after_segment_id < 0 or page_size < 0:
            raise InvalidArgument(
                f"after_segment_id and page_size must be >= 0, got {after_segment_id} and {page_size}"
            )
        desc = await self._partition(collection_id, partition_id)
        prefix = segment_prefix(collection_id, partition_id)
        next_after = 0
        pairs: list[tuple[str, bytes]]
        if segment_ids is None and not page_size and not after_segment_id:
            # A whole partition (every load): the records alone, no key decoded.
            values = (await self.kv.load_prefix(prefix)).values()
            return self._recovery_page(desc, collection_id, parse_binlogs(values), 0)
        if segment_ids is not None:
            ids = sorted({i for i in segment_ids if i > after_segment_id})
            if page_size and len(ids) > page_size:
                ids, next_after = ids[:page_size], ids[page_size - 1]
            if len(ids) <= _MAX_POINT_READS:
                found = await self._get_many([segment_key(collection_id, partition_id, i) for i in ids])
                pairs = sorted((k, v) for k, (v, _) in found.items())
            else:
                wanted = {segment_key(collection_id, partition_id, i) for i in ids}
                pairs = [(k, v) for k, v in (await self.kv.load_prefix(prefix)).items() if k in wanted]
        elif page_size:
            pairs, more = await self._range_page(prefix + f"{after_segment_id + 1:019d}", prefix, page_size)
            if more and pairs:
                next_after = parse_segment_key(pairs[-1][0]).segment_id
        else:  # the segments after after_segment_id, unpaged
            first = prefix + f"{after_segment_id + 1:019d}"
            pairs = [(k, v) for k, v in (await self.kv.load_prefix(prefix)).items() if k >= first]

        return self._recovery_page(desc, collection_id, parse_binlogs(list(map(_VALUE, pairs))), next_after)

    @staticmethod
    def _recovery_page(desc: catalog_pb2.CollectionDescription, collection_id: int,
                       binlogs: list[data_pb2.SegmentBinlogs], next_after: int) -> RecoveryPage:
        channels = [data_pb2.VChannelInfo(collection_id=collection_id, channel_name=c) for c in desc.dm_channels]
        _add_flushed(channels, binlogs)
        return RecoveryPage(channels, binlogs, next_after)

    # ----- watch ------------------------------------------------------------------------------------------------------
    async def watch_segments(self, start_revision: int = 0) -> AsyncIterator[SegmentWatchItem]:
        """Segment additions and removals from ``start_revision`` on (0: from now), one item per catalog txn.

        Nothing is lost or repeated across etcd restarts; if the resume revision
        was compacted, a ``SegmentResync`` carries the whole segment set.
        """
        async for item in watch_prefix(self.kv, SEGMENTS_PREFIX, start_revision):
            if isinstance(item, Resync):
                segs = []
                for _, value in item.snapshot.items():
                    seg = data_pb2.SegmentBinlogs()
                    seg.ParseFromString(value)
                    segs.append(seg)
                yield SegmentResync(item.revision, segs)
                continue
            change: SegmentChange | None = None
            for ev in item.events:
                if change is None or change.revision != ev.mod_revision:
                    if change is not None:
                        yield change
                    change = SegmentChange(ev.mod_revision)
                if ev.type is EventType.PUT:
                    seg = data_pb2.SegmentBinlogs()
                    seg.ParseFromString(ev.value)
                    change.added.append(seg)
                else:
                    change.removed.append(parse_segment_key(ev.key))
            if change is not None:
                yield change

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
    "STATUS_SOURCE",
    "AddSegmentsIncomplete",
    "CatalogError",
    "CatalogStore",
    "CollectionExists",
    "CollectionNotFound",
    "Conflict",
    "InvalidArgument",
    "NotFound",
    "PartitionNotFound",
    "RecoveryPage",
    "SegmentChange",
    "SegmentIdTaken",
    "SegmentRef",
    "SegmentResync",
    "SegmentWatchItem",
    "collection_key",
    "name_key",
    "parse_segment_key",
    "segment_key",
    "segment_prefix",
    "status_of",
]
