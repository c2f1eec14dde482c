"""Query meta against the catalog and the live query nodes.

Query meta says what is loaded where; it may only name collections and
partitions the catalog has (the catalog refuses to drop a loaded collection,
so only an outside hand breaks this), segments and channels of what is
loaded, and nodes that are alive: records on a node without a session are
facts about a process that is gone, which the checker re-derives from the
nodes that remain (it loads what no node holds).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Protocol

from google.protobuf.message import DecodeError

from meta.kv import KeyValue
from meta.session import SessionInfo, role_prefix, session_key
from meta.txn import Compare, Op, absent, delete, delete_prefix, modified_at, put
from proto import catalog_pb2
from proto.data_pb2 import SegmentInfo
from querycoord.catalog.store import COLLECTIONS_PREFIX
from querycoord.catalog.store import collection_key as catalog_key
from querycoord.common.protocol import QUERYNODE_ROLE
from querycoord.querymeta import keys
from querycoord.querymeta.copies import Copyable, copies, without_node
from querycoord.querymeta.errors import CorruptRecord
from querycoord.querymeta.index import MetaIndex
from querycoord.querymeta.records import collection_percentage, copy_message, decode_into

from .problems import Fix, Found, Problem, delete_fix
from .segment_stream import StreamedSegments
from .snapshot import Snapshot


class SegmentRecords(Protocol):
    """What the checks read of the segment records: from the snapshot (``SnapshotSegments``), or streamed
    (``segment_stream.StreamedSegments``) when the snapshot was read without them."""

    @property
    def partitions(self) -> Mapping[int, Collection[int]]:
        """collection -> the partitions that have decoded records."""

    def partition_keys(self, cid: int, pid: int) -> list[str]:
        """The keys under the partition's segment prefix that are not corrupt records, in key order."""

    def collection_keys(self, cid: int) -> list[str]:
        """Likewise under the collection's segment prefix."""

    def on_dead_nodes(self) -> Iterable[tuple[KeyValue, SegmentInfo, list[int]]]:
        """(record, segment, nodes without a session it names), by segment id."""


class SnapshotSegments:
    """``SegmentRecords`` of a snapshot that holds the segment records, decoded into ``index``."""

    def __init__(self, snap: Snapshot, index: MetaIndex):
        self.snap, self.index = snap, index

    @property
    def partitions(self) -> Mapping[int, Collection[int]]:
        return self.index.segments_by_partition

    def partition_keys(self, cid: int, pid: int) -> list[str]:
        return [kv.key for kv in self.snap.under(keys.segment_partition_prefix(cid, pid))]

    def collection_keys(self, cid: int) -> list[str]:
        return [kv.key for kv in self.snap.under(keys.segment_collection_prefix(cid))]

    def on_dead_nodes(self) -> Iterator[tuple[KeyValue, SegmentInfo, list[int]]]:
        live = live_nodes(self.snap)
        for seg in sorted(self.index.segments.values(), key=lambda s: s.segment_id):
            kv = self.snap.get(keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id))
            dead = sorted(n for n in copies(seg).values() if n not in live)
            if dead and kv is not None:
                yield kv, seg, dead


def decode_query_meta(snap: Snapshot, found: Found | None = None, *,
                      streamed: Iterable[Problem] | None = None) -> MetaIndex:
    """Query meta as a leader's reload builds it; corrupt records are reported (with ``found``) and skipped.
    ``streamed``: the snapshot has no segment records; these are the problems of those that were read apart
    (reported in their turn, so problems come in the same order)."""
    index = MetaIndex()
    for prefix in keys.ALL_PREFIXES:
        if streamed is not None and prefix == keys.SEGMENT_PREFIX:
            for problem in streamed:
                if found is not None:
                    found.add(problem)
            continue
        for item in snap.under(prefix):
            try:
                decode_into(index, prefix, item.key, item.value)
            except CorruptRecord as exc:
                if found is not None:
                    found.add(Problem("corrupt-query-meta", (item.key,), exc.reason,
                                      delete_fix("delete the record", [item])))
    return index


def decode_catalog(snap: Snapshot, found: Found | None = None) -> dict[int, catalog_pb2.CollectionDescription | None]:
    """Catalog collections by id (None: the key exists but does not decode)."""
    out: dict[int, catalog_pb2.CollectionDescription | None] = {}
    for item in snap.under(COLLECTIONS_PREFIX):
        tail = item.key[len(COLLECTIONS_PREFIX):]
        try:
            desc: catalog_pb2.CollectionDescription | None = catalog_pb2.CollectionDescription.FromString(item.value)
        except DecodeError:
            desc = None
        if desc is None or str(desc.collection_id) != tail:
            if found is not None:
                found.add(Problem("corrupt-catalog-record", (item.key,), "not a CollectionDescription for its key"))
            if tail.isdigit():
                out[int(tail)] = None
            continue
        out[desc.collection_id] = desc
    return out


def live_nodes(snap: Snapshot, role: str = QUERYNODE_ROLE) -> set[int]:
    return {info.server_id for kv in snap.under(role_prefix(role))
            if (info := SessionInfo.parse(kv.key, kv.value)) is not None}


def _collection_keys(snap: Snapshot, segs: SegmentRecords, cid: int) -> list[str]:
    out = [kv.key for kv in [snap.get(keys.collection_key(cid))] if kv is not None]
    out += segs.collection_keys(cid)
    for prefix in (keys.dm_channel_prefix(cid), keys.delta_channel_prefix(cid)):
        out += [kv.key for kv in snap.under(prefix)]
    return out


def _guard_load_record(snap: Snapshot, cid: int) -> Compare:
    """The load record as the check saw it: unchanged, or still absent."""
    kv = snap.get(keys.collection_key(cid))
    return absent(keys.collection_key(cid)) if kv is None else modified_at(kv.key, kv.mod_revision)


def _drop_collection_ops(cid: int) -> list[Op]:
    """``QueryMeta.release_collection``'s txn: the record and one range delete per record kind."""
    return [delete(keys.collection_key(cid)), delete_prefix(keys.segment_collection_prefix(cid)),
            delete_prefix(keys.dm_channel_prefix(cid)), delete_prefix(keys.delta_channel_prefix(cid))]


def _dropped_collections(snap: Snapshot, index: MetaIndex, segs: SegmentRecords, catalog: Mapping[int, object],
                         found: Found) -> set[int]:
    cids = set(index.collections) | set(segs.partitions) | set(index.dm_channels)
    cids |= set(index.delta_channels)
    gone = {cid for cid in cids if cid not in catalog}
    for cid in sorted(gone):
        named = [key for key in _collection_keys(snap, segs, cid) if key not in found.claimed]
        fix = Fix(f"release collection {cid} from query meta (record and range deletes)",
                  tuple(_drop_collection_ops(cid)), (absent(catalog_key(cid)), _guard_load_record(snap, cid)))
        found.add(Problem("query-meta-of-dropped-collection", tuple(named),
                          f"collection {cid} is not in the catalog ({catalog_key(cid)} is missing)", fix))
    return gone


def _dropped_partitions(snap: Snapshot, index: MetaIndex, segs: SegmentRecords, cid: int,
                        desc: catalog_pb2.CollectionDescription, found: Found) -> None:
    have = {p.partition_id for p in desc.partitions}
    info = index.collections.get(cid)
    listed = {p.partition_id for p in info.partitions} | set(info.released_partition_ids) if info else set()
    gone = sorted((listed | set(segs.partitions.get(cid, ()))) - have)
    if not gone:
        return
    record = snap.get(keys.collection_key(cid))
    rewrite = info is not None and record is not None and bool(set(gone) & listed)
    named = [record.key] if rewrite and record is not None else []
    for pid in gone:
        named += segs.partition_keys(cid, pid)
    ops: list[Op] = [delete_prefix(keys.segment_partition_prefix(cid, pid)) for pid in gone]
    if rewrite and info is not None:
        kept = [p for p in info.partitions if p.partition_id in have]
        if not kept:
            ops = _drop_collection_ops(cid)
        else:
            changed = copy_message(info)
            del changed.partitions[:]
            changed.partitions.extend(kept)
            del changed.released_partition_ids[:]
            changed.released_partition_ids.extend(p for p in info.released_partition_ids if p in have)
            changed.in_memory_percentage = collection_percentage(changed)
            ops.append(put(keys.collection_key(cid), changed.SerializeToString()))
    cat = snap.get(catalog_key(cid))
    assert cat is not None
    fix = Fix(f"forget partitions {gone} of collection {cid} (segment range deletes, load record rewritten)",
              tuple(ops), (modified_at(cat.key, cat.mod_revision), _guard_load_record(snap, cid)))
    found.add(Problem("query-meta-of-dropped-partition", tuple(key for key in named if key not in found.claimed),
                      f"collection {cid} has no partition {', '.join(map(str, gone))} in the catalog", fix))


def _unloaded(snap: Snapshot, index: MetaIndex, segs: SegmentRecords, cid: int, found: Found) -> None:
    """Range deletes (as a release makes them), so a fix stays one small txn however many records there are."""
    info = index.collections.get(cid)
    loaded = {p.partition_id for p in info.partitions} if info is not None else set()
    pids = [pid for pid in sorted(segs.partitions.get(cid, ())) if pid not in loaded]
    prefixes = [keys.segment_partition_prefix(cid, pid) for pid in pids]
    named = [key for pid in pids for key in segs.partition_keys(cid, pid)]
    if info is None:
        prefixes += [keys.dm_channel_prefix(cid), keys.delta_channel_prefix(cid)]
        named += [kv.key for prefix in prefixes[-2:] for kv in snap.under(prefix)]
    named = [key for key in named if key not in found.claimed]
    if named:
        what = "collection is not loaded" if info is None else "partitions are not loaded"
        fix = Fix("delete the records (range deletes, as a release)", tuple(delete_prefix(p) for p in prefixes),
                  (_guard_load_record(snap, cid),))
        found.add(Problem("query-meta-of-unloaded", tuple(named),
                          f"collection {cid}: {len(named)} segment or channel records, but the {what}", fix))


def _dead_copies_fix(kv: KeyValue, rec: Copyable, dead: list[int], what: str) -> Fix:
    """Delete the record when every copy is on a dead node; else rewrite it without the dead copies."""
    guards: tuple[Compare, ...] = tuple(absent(session_key(QUERYNODE_ROLE, n)) for n in dead)
    rest: Copyable | None = rec
    for node in dead:
        rest = without_node(rest, node) if rest is not None else None
    if rest is None:
        return delete_fix(f"delete the record (the checker {what} again on a live node)", [kv], guards)
    return Fix(f"drop the copies on nodes {dead} from the record (the checker {what} again in their replicas)",
               (put(kv.key, rest.SerializeToString()),), (*guards, modified_at(kv.key, kv.mod_revision)))


def _dead_nodes(snap: Snapshot, index: MetaIndex, segs: SegmentRecords, found: Found) -> None:
    live = live_nodes(snap)
    for record, seg, dead in segs.on_dead_nodes():
        if record.key not in found.claimed:
            found.add(Problem("segment-on-dead-node", (record.key,),
                              f"segment {seg.segment_id} is recorded on nodes {dead}, which have no session",
                              _dead_copies_fix(record, seg, dead, "loads it")))
    for cid, channels in sorted(index.dm_channels.items()):
        for name, watch in sorted(channels.items()):
            kv = snap.get(keys.dm_channel_key(cid, name))
            dead = sorted(n for n in copies(watch).values() if n not in live)
            if dead and kv is not None and kv.key not in found.claimed:
                found.add(Problem("channel-on-dead-node", (kv.key,),
                                  f"DM channel {name} is recorded on nodes {dead}, which have no session",
                                  _dead_copies_fix(kv, watch, dead, "watches it")))


def check_query(snap: Snapshot, found: Found, streamed: StreamedSegments | None = None) -> None:
    """Every query meta check; ``streamed``: the segment records, read apart from ``snap`` (which lacks them)."""
    index = decode_query_meta(snap, found, streamed=None if streamed is None else streamed.corrupt)
    segs: SegmentRecords = SnapshotSegments(snap, index) if streamed is None else streamed
    catalog = decode_catalog(snap, found)
    gone = _dropped_collections(snap, index, segs, catalog, found)
    for cid, desc in sorted(catalog.items()):
        if desc is not None and cid not in gone:
            _dropped_partitions(snap, index, segs, cid, desc, found)
    cids = (set(segs.partitions) | set(index.dm_channels) | set(index.delta_channels)) - gone
    for cid in sorted(cids):
        _unloaded(snap, index, segs, cid, found)
    _dead_nodes(snap, index, segs, found)


__all__ = ["SegmentRecords", "SnapshotSegments", "check_query", "decode_catalog", "decode_query_meta", "live_nodes"]
