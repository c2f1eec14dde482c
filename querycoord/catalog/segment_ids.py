"""The catalog's segment id index: a segment id is used at most once in its collection, across partitions.

Why: segment keys are per partition (``catalog/segments/<cid>/<pid>/<sid>``), so a compare on the new key
only sees its own partition. An id already held by another partition of the collection was accepted, and the
collection could never load again (two partitions claiming one segment). Each segment now has an index key::

    catalog/sid-index/<cid>/<sid:019d>      "<pid>": the partition that holds segment <sid>
    catalog/sid-index/<cid>/complete        written when the collection's index covers all its segments

created in the txn that adds the segment under a ``create_revision == 0`` compare (of two concurrent adds
of one id, in two partitions or one, exactly one wins), deleted in the txn that removes the segment (a
compaction's sources), and removed with the collection (one range delete). The prefix sorts after
``catalog/segments/``, outside the range the checker's catalog copy (``catalog.targets``) reads and follows,
so the index costs that copy nothing.

Collections written before the index existed have no ``complete`` marker: the first ``add_segments`` to
such a collection builds its index from its segment keys (``ensure_index``: a keys-only read and txns of 120
index puts, each guarded by its segments still existing and the marker still absent), then writes the
marker. New collections are created with the marker. A deployment that still runs an older coordinator next
to a new one (a rolling upgrade) may add segments without index keys meanwhile; restart the old ones first.

Cost: two keys per segment instead of one (the index key is about 60 bytes), so ``add_segments`` fits 64
segments in a txn instead of 127, and adding segments takes about half as long again. Explicit ids are also
read before writing (one range read of the index for a run of new ids) so that a clash refuses the whole
request, which costs about as much again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

from loguru import logger

from meta.kv import MetaKV
from meta.txn import Compare, Op, Unit, absent, created_at, delete, put
from querycoord.catalog.errors import CollectionNotFound, Conflict

INDEX_PREFIX = "catalog/sid-index/"
_MARKER = "complete"
#: Up to this many ids are looked up key by key (``held``), more by a range read of the index.
_FEW_POINT_READS = 16
#: Keys per page of an index range read.
_INDEX_PAGE = 1000
#: Attempts to build an index while segments change under it (compactions of an older coordinator).
_BUILD_ATTEMPTS = 5


def index_prefix(collection_id: int) -> str:
    return f"{INDEX_PREFIX}{collection_id}/"


def index_key(collection_id: int, segment_id: int) -> str:
    return f"{INDEX_PREFIX}{collection_id}/{segment_id:019d}"


def marker_key(collection_id: int) -> str:
    """Present once every segment of the collection has its index key (see module docstring)."""
    return f"{INDEX_PREFIX}{collection_id}/{_MARKER}"


def holder(value: bytes) -> int:
    """The partition an index value names (-1: not one of ours)."""
    text = value.decode(errors="replace")
    return int(text) if text.isdigit() else -1


def add_ops(collection_id: int, partition_id: int, segment_id: int) -> tuple[Op, Compare]:
    """The index put of a new segment and its compare: the id is not held in the collection yet."""
    key = index_key(collection_id, segment_id)
    return put(key, str(partition_id)), absent(key)


def remove_op(collection_id: int, segment_id: int) -> Op:
    """The index delete that goes with removing a segment (a compaction source)."""
    return delete(index_key(collection_id, segment_id))


def taken_reason(collection_id: int, clashes: Iterable[tuple[int, int, int]]) -> str:
    """What the caller reads for ``(segment id, partition asked, partition holding)`` clashes."""
    items = sorted(clashes)
    parts = []
    for sid, asked, held in items[:10]:
        where = f"partition {held}" if held >= 0 else "an unreadable index record"
        same = " (with other binlogs)" if held == asked else ""
        parts.append(f"segment id {sid} is already held by {where}{same}")
    more = f", and {len(items) - 10} more" if len(items) > 10 else ""
    return (f"collection {collection_id}: {'; '.join(parts)}{more} (a segment id is unique within its collection, "
            f"across partitions: allocate new ids, send 0)")


#: Point reads of keys at one revision: ``key -> (value, create revision)`` of those that exist.
ReadKeys = Callable[[Sequence[str]], Awaitable[dict[str, tuple[bytes, int]]]]


async def held(kv: MetaKV, collection_id: int, ids: Iterable[int], *, read_keys: ReadKeys) -> dict[int, int]:
    """Segment id -> the partition holding it, for those of ``ids`` the collection's index has.

    A few ids: one read each. More: the index range from the smallest id on, in pages, up to the largest (the
    ids of one request are mostly a run of new ids: one short read); after four keys read per id (ids spread
    over a large collection) the ids not reached yet are read one by one. Either way the cost stays in
    proportion to the request, not to the collection."""
    wanted = sorted(set(ids))
    if len(wanted) <= _FEW_POINT_READS:
        return await _held_points(collection_id, wanted, read_keys)
    out: dict[int, int] = {}
    prefix, last = index_prefix(collection_id), index_key(collection_id, wanted[-1])
    start, budget, asked = index_key(collection_id, wanted[0]), 4 * len(wanted), set(wanted)
    while budget > 0:
        items, more = await kv.range_page(prefix, start=start, limit=min(_INDEX_PAGE, budget))
        budget -= len(items)
        for item in items:
            if item.key > last:
                return out
            sid = _tail_id(item.key)
            if sid in asked:
                out[sid] = holder(item.value)
        if not more or not items:
            return out
        start = items[-1].key + "\x00"
    rest = [i for i in wanted if index_key(collection_id, i) >= start]
    return out | await _held_points(collection_id, rest, read_keys)


async def _held_points(collection_id: int, ids: list[int], read_keys: ReadKeys) -> dict[int, int]:
    found = await read_keys([index_key(collection_id, i) for i in ids])
    return {_tail_id(k): holder(v) for k, (v, _) in found.items()}


def _tail_id(key: str) -> int:
    """The segment id of an index key (-1 for the marker)."""
    tail = key.rsplit("/", 1)[1]
    return int(tail) if tail.isdigit() else -1


async def ensure_index(kv: MetaKV, collection_id: int, *, collection_key: str, collection_revision: int,
                       segment_prefix: str) -> bool:
    """Make sure the collection's index is complete; returns whether it had to be built (False: the usual case).

    Builds it for a collection written before the index existed, from the keys under ``segment_prefix``
    (``<pid>/<sid>``). Every txn is guarded by the collection still being the one read (``collection_key``
    created at ``collection_revision``), the marker still absent (another process that finished first makes the
    rest moot) and each indexed segment still existing. A txn whose compares fail is explained: marker present
    (done), collection gone (``CollectionNotFound``), else the segments moved and the build starts over.
    """
    marker = marker_key(collection_id)
    for _attempt in range(_BUILD_ATTEMPTS):
        if await kv.get_kv(marker) is not None:
            return False
        snap = await kv.load_prefix(segment_prefix, keys_only=True)
        owners: dict[int, tuple[int, str, int]] = {}  # sid -> (pid, segment key, its create revision)
        for item in snap.kvs:
            pid, sid = _pid_sid(item.key[len(segment_prefix):])
            if sid < 0:
                continue
            if sid in owners:  # written before the index: the very clash it refuses now; the first one is kept
                logger.warning("catalog: segment id {} of collection {} is in partitions {} and {}; its index "
                               "names {}", sid, collection_id, owners[sid][0], pid, owners[sid][0])
                continue
            owners[sid] = (pid, item.key, item.create_revision)
        guards = [absent(marker), created_at(collection_key, collection_revision)]
        units = [Unit([put(index_key(collection_id, sid), str(pid))], [created_at(key, rev)], guards)
                 for sid, (pid, key, rev) in sorted(owners.items())]
        units.append(Unit([put(marker, b"")], [], guards))
        if await _write_in_order(kv, units, f"index the segment ids of collection {collection_id}"):
            logger.info("catalog: indexed the {} segment ids of collection {} (written before the index)",
                        len(owners), collection_id)
            return True
        kvx = await kv.get_kv(collection_key)
        if kvx is None or kvx.create_revision != collection_revision:
            raise CollectionNotFound(f"collection {collection_id} was dropped while its segment ids were indexed")
    if await kv.get_kv(marker) is not None:
        return False
    raise Conflict(f"collection {collection_id}: its segments kept changing while their ids were indexed "
                   f"(an older coordinator adding or compacting?); retry")


async def _write_in_order(kv: MetaKV, units: Sequence[Unit], operation: str) -> bool:
    """The units in as few txns as etcd's limits allow, in order (the marker's last); False at the first txn
    whose compares fail (earlier ones stay: index keys of segments that exist are true whoever wrote them)."""
    results = await kv.write_packed(kv.pack(units), operation=operation)
    return all(r.succeeded for r in results)


def _pid_sid(rest: str) -> tuple[int, int]:
    """(partition, segment) of a segment key's tail ``<pid>/<sid>``; (-1, -1) for anything else."""
    parts = rest.split("/")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return -1, -1
    return int(parts[0]), int(parts[1])


__all__ = ["INDEX_PREFIX", "add_ops", "ensure_index", "held", "holder", "index_key", "index_prefix",
           "marker_key", "remove_op", "taken_reason"]
