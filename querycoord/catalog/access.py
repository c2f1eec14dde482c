"""The catalog's reads and writes in etcd that every part of ``CatalogStore`` shares.

``CatalogAccess`` sends one guarded txn, reads many keys at one revision, pages a range and looks a
collection up by id or name; ``CatalogStore`` is one, and its segment writer and recovery reads use
the store's own methods (so a test that replaces ``store.guarded_txn`` sees every catalog write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from meta.idalloc import IdAllocator
from meta.kv import MAX_PAGE_SIZE, MetaKV
from meta.txn import Compare, Op
from proto import catalog_pb2
from querycoord.catalog.checks import short_list
from querycoord.catalog.errors import CollectionNotFound, InvalidArgument, PartitionNotFound
from querycoord.catalog.keys import ID_KEY, collection_key, name_key

# Txns of one add_segments call (or reads of one lookup) sent at once.
DEFAULT_WRITE_CONCURRENCY = 8

# ``read_many``: keys of one run read as one range when the run has at least MIN_RANGE_KEYS keys and its range at
# most MAX_SPAN_PER_KEY keys per key wanted (a point read costs about fifty times what one more record of a range
# does); at most RUN_KEYS keys a run, so that a range read holds at most RUN_KEYS * MAX_SPAN_PER_KEY records.
MIN_RANGE_KEYS = 8
MAX_SPAN_PER_KEY = 16
RUN_KEYS = 4096


def key_runs(keys: Iterable[str]) -> list[list[str]]:
    """The distinct ``keys`` in order, cut into runs of at most ``RUN_KEYS`` keys under one parent (the key up to
    its last ``/``: a partition's segments), each a candidate for one range read.

    str order is etcd's byte order: UTF-8 keeps code point order."""
    runs: list[list[str]] = []
    parent: str | None = None
    for key in sorted(set(keys)):
        up = key.rpartition("/")[0]
        if up != parent or len(runs[-1]) >= RUN_KEYS:
            runs.append([])
            parent = up
        runs[-1].append(key)
    return runs


class CatalogAccess:
    """etcd access of the catalog: guarded txns, reads at one revision, the id allocator, collection lookups."""

    def __init__(self, kv: MetaKV, *, write_concurrency: int = DEFAULT_WRITE_CONCURRENCY):
        if write_concurrency < 1:
            raise ValueError(f"write_concurrency must be >= 1, got {write_concurrency}")
        self.kv = kv
        self.write_concurrency = write_concurrency
        self._ids = IdAllocator(kv, ID_KEY)

    async def guarded_txn(self, operation: str, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        """One guarded txn (limits checked by MetaKV before sending); returns whether the compares held."""
        return (await self.kv.txn(compares, ops, operation=operation)).succeeded

    async def read_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """``key -> (value, create_revision)`` of the keys that exist, all read at one revision.

        Keys are read in runs (``key_runs``): a run whose range holds few other keys is read as that one range
        (one call instead of one per key, each of which costs far more than the records read beside it); the
        others key by key. Reads that need no single revision, such as a repair's catalog records, go by
        ``meta.get_many`` instead (``catalog.recovery``).

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

        async def read_run(run: list[str]) -> None:
            if len(run) < MIN_RANGE_KEYS:
                await asyncio.gather(*(read(k) for k in run))
                return
            async with sem:
                span = await self.kv.count_between(run[0], run[-1], revision=revision)
            if span > len(run) * MAX_SPAN_PER_KEY:
                await asyncio.gather(*(read(k) for k in run))
                return
            async with sem:
                snap = await self.kv.load_prefix(run[0], until=run[-1] + "\x00", revision=revision,
                                                 page_size=min(span + 1, MAX_PAGE_SIZE))
            found.update(snap.select(run))

        await asyncio.gather(*(read_run(run) for run in key_runs(keys)))
        return found

    async def range_page(self, start: str, prefix: str, limit: int) -> tuple[list[tuple[str, bytes]], bool]:
        """Keys from ``start`` to the end of ``prefix``, at most ``limit``; and whether more follow."""
        items, more = await self.kv.range_page(prefix, start=start, limit=limit)
        return [(item.key, item.value) for item in items], more

    async def revision(self) -> int:
        """etcd's current revision: read it before a snapshot, then ``watch_segments(revision + 1)`` misses nothing."""
        return await self.kv.revision()

    async def allocate_ids(self, n: int) -> range:
        """``n`` fresh catalog ids (e.g. segment ids chosen before their binlog paths are written)."""
        return await self._ids.allocate(n)

    async def collection_and_revision(self, ref: int | str) -> tuple[catalog_pb2.CollectionDescription, int]:
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

    async def collection_with_partition(self, collection_id: int,
                                        partition_id: int) -> catalog_pb2.CollectionDescription:
        """The description of a collection that has ``partition_id``; ``PartitionNotFound`` if it has not."""
        desc, _ = await self.collection_and_revision(collection_id)
        if partition_id not in {p.partition_id for p in desc.partitions}:
            raise PartitionNotFound(
                f"partition {partition_id} does not exist in collection {collection_id} "
                f"(its partitions: {short_list(p.partition_id for p in desc.partitions)})"
            )
        return desc
