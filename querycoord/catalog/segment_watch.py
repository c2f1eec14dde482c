"""The catalog's segment changes as a watch: one item per catalog txn, or the whole set after a compaction."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from meta.kv import MetaKV
from meta.watch import EventType, Resync, watch_prefix
from proto import data_pb2
from querycoord.catalog.keys import SEGMENTS_PREFIX, SegmentRef, parse_segment_key


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


async def watch_segments(kv: MetaKV, start_revision: int = 0) -> AsyncIterator[SegmentWatchItem]:
    """Segment additions and removals from ``start_revision`` on (0: from now), one item per catalog txn.

    Nothing is lost or repeated across etcd restarts; if the resume revision
    was compacted, a ``SegmentResync`` carries the whole segment set.
    """
    async for item in watch_prefix(kv, SEGMENTS_PREFIX, start_revision):
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
