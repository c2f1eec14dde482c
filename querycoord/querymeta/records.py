"""Query meta records: how they are stored (stripped), read back (checked against their key), and derived.

Pure functions on the protobuf records, no I/O, so that the managers keep to
the write protocol (``core``) and ``reload`` and the writers agree on one
definition of a valid record.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError, Message
from loguru import logger

from proto import data_pb2
from querycoord.common.messages import LoadItem

from . import keys
from .copies import copy_message
from .errors import CorruptRecord
from .index import MetaIndex

CollectionLoadInfo = data_pb2.CollectionLoadInfo
SegmentInfo = data_pb2.SegmentInfo
DmChannelWatchInfo = data_pb2.DmChannelWatchInfo
VChannelInfo = data_pb2.VChannelInfo
SEALED = data_pb2.SEGMENT_STATE_SEALED

M = TypeVar("M", bound=Message)


def collection_percentage(info: CollectionLoadInfo) -> int:
    """The collection's in-memory percentage: the floor of its partitions' mean.

    Integer floor makes 100 reachable only when every partition is at 100
    (Milvus: "set to 100 only once all children are Done"); no partitions: 0.
    """
    if not info.partitions:
        return 0
    return sum(p.in_memory_percentage for p in info.partitions) // len(info.partitions)


def stored_segment(seg: SegmentInfo) -> SegmentInfo:
    """The record as persisted: a copy without index file paths (the catalog has them)."""
    stored = copy_message(seg)
    for index_info in stored.index_infos:
        del index_info.index_file_paths[:]
    return stored


def loaded_record(info: LoadItem, node_id: int, replica_id: int) -> SegmentInfo:
    """The record of a copy ``node_id`` just loaded from ``info`` (a load info it was sent), in its stored form
    (no index infos: the catalog has them). ``QueryMeta.save_loaded`` writes these bytes without making the
    message for a segment with no record yet (tests/test_querymeta.py checks the two agree)."""
    seg = SegmentInfo()
    seg.segment_id = info.segment_id
    seg.collection_id = info.collection_id
    seg.partition_id = info.partition_id
    seg.node_id = node_id
    seg.replica_id = replica_id
    seg.mem_size = info.mem_size
    seg.num_rows = info.num_rows
    seg.state = SEALED
    if info.compaction_from:
        seg.compaction_from.extend(info.compaction_from)
    seg.dm_channel = info.insert_channel
    return seg


def stored_delta_channel(info: VChannelInfo) -> VChannelInfo:
    """The record as persisted: a copy without flushed/dropped segment ids (unbounded; the catalog has them)."""
    stored = copy_message(info)
    del stored.flushed_segment_ids[:]
    del stored.dropped_segment_ids[:]
    return stored


def add_partitions(info: CollectionLoadInfo, partition_ids: list[int]) -> None:
    """Add partitions not yet loaded (NOT_PRESENT, 0 %), un-release them, and recompute the percentage."""
    loaded = {p.partition_id for p in info.partitions}
    new = [p for p in partition_ids if p not in loaded]
    for pid in new:
        info.partitions.add(partition_id=pid, state=data_pb2.PARTITION_STATE_NOT_PRESENT, in_memory_percentage=0)
    if new and info.released_partition_ids:
        still = [p for p in info.released_partition_ids if p not in set(new)]
        del info.released_partition_ids[:]
        info.released_partition_ids.extend(still)
    info.in_memory_percentage = collection_percentage(info)


def _parse(cls: type[M], key: str, value: bytes) -> M:
    message = cls()
    try:
        message.ParseFromString(value)
    except DecodeError as exc:
        raise CorruptRecord(key, f"not a {cls.__name__}: {exc}") from exc
    return message


def _expect_key(key: str, expected: str, ids_ok: bool) -> None:
    if not ids_ok:
        raise CorruptRecord(key, "a required id is 0 or negative")
    if key != expected:
        raise CorruptRecord(key, f"the record belongs under {expected!r}")


def decode_into(index: MetaIndex, prefix: str, key: str, value: bytes, *, replace: bool = False) -> None:
    """Parse one stored record, check that it matches its key, and add it to ``index``.

    ``replace``: the record is a newer value of a key ``index`` may already hold (a watch event), not a second
    record of the same segment.
    """
    if prefix == keys.COLLECTION_PREFIX:
        info = _parse(CollectionLoadInfo, key, value)
        _expect_key(key, keys.collection_key(info.collection_id), info.collection_id > 0)
        index.put_collection(info)
    elif prefix == keys.SEGMENT_PREFIX:
        seg = _parse(SegmentInfo, key, value)
        ids_ok = min(seg.collection_id, seg.partition_id, seg.segment_id) > 0
        _expect_key(key, keys.segment_key(seg.collection_id, seg.partition_id, seg.segment_id), ids_ok)
        twin = index.segments.place(seg.segment_id)
        if twin is not None:
            other = keys.segment_key(twin[0], twin[1], seg.segment_id)
            if not (replace and other == key):
                raise CorruptRecord(key, f"segment {seg.segment_id} is already stored under {other!r}")
        index.put_segment(seg)
    elif prefix == keys.DM_CHANNEL_PREFIX:
        watch = _parse(DmChannelWatchInfo, key, value)
        expected = keys.dm_channel_key(watch.collection_id, watch.dm_channel)
        _expect_key(key, expected, watch.collection_id > 0 and bool(watch.dm_channel))
        index.put_dm_channel(watch)
    else:
        delta = _parse(VChannelInfo, key, value)
        expected = keys.delta_channel_key(delta.collection_id, delta.channel_name)
        _expect_key(key, expected, delta.collection_id > 0 and bool(delta.channel_name))
        index.put_delta_channel(delta)


def drop_key(index: MetaIndex, prefix: str, key: str) -> None:
    """Remove what ``index`` holds under ``key`` (a deleted key); a key it does not hold changes nothing.

    A segment is dropped only if its record is the one stored under ``key``: when a record moves to another key
    (another partition) in one txn, the new key's put and the old key's delete arrive in either order.
    """
    rest = key[len(prefix):]
    if prefix == keys.COLLECTION_PREFIX:
        if rest.isdigit():
            index.drop_collection(int(rest))
        return
    head, _, tail = rest.partition("/")
    if not head.isdigit():
        return
    cid = int(head)
    if prefix == keys.SEGMENT_PREFIX:
        sid_text = tail.rpartition("/")[2]
        sid = int(sid_text) if sid_text.isdigit() else 0
        place = index.segments.place(sid)
        if place is not None and keys.segment_key(place[0], place[1], sid) == key:
            index.drop_segment(sid)
    elif prefix == keys.DM_CHANNEL_PREFIX:
        index.drop_dm_channel(cid, tail)
    else:
        index.drop_delta_channel(cid, tail)


def warn_orphans(index: MetaIndex) -> None:
    """Log records whose collection or partition is not loaded (kept: they are what etcd holds)."""
    orphan_segments = 0
    for cid, parts in index.segments_by_partition.items():
        info = index.collections.get(cid)
        loaded = {p.partition_id for p in info.partitions} if info is not None else set()
        orphan_segments += sum(len(sids) for pid, sids in parts.items() if pid not in loaded)
    orphan_channels = sum(len(c) for cid, c in index.dm_channels.items() if cid not in index.collections)
    orphan_channels += sum(len(c) for cid, c in index.delta_channels.items() if cid not in index.collections)
    if orphan_segments or orphan_channels:
        logger.warning(
            "query meta holds {} segment and {} channel records of collections or partitions that are not "
            "loaded; a release of their collection removes them",
            orphan_segments,
            orphan_channels,
        )
