"""Query meta's segment records for ``verify``, read page by page and kept as what the checks need of them.

A million segment records held as keys, values and decoded messages are most
of what ``meta verify`` would hold at that scale. Streamed, each page is
decoded and checked (as ``QueryMeta.reload`` decodes it: the record parses,
matches its key, and no earlier key holds the same segment id) and then
dropped; what is kept is compact: the segment ids of each partition in key
order (8 bytes each: the keys of a partition or collection are rebuilt from
them when a problem names them), each id's place for the twin check, the
records that do not decode (with their problem), and the records that name a
query node without a session (with their value, for the fix). Peak memory is
then one page and these, not the whole prefix.

Every page is read at the revision of the rest of verify's snapshot, so the
records are the ones the other checks saw.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import grpc

from meta.kv import KeyValue, MetaKV
from proto.data_pb2 import SegmentInfo
from querycoord.querymeta import keys
from querycoord.querymeta.copies import copies
from querycoord.querymeta.errors import CorruptRecord
from querycoord.querymeta.index import MetaIndex, Place, SegmentTable
from querycoord.querymeta.records import decode_into

from .problems import Problem, delete_fix

# Keys per page: the first page, then twice as many each page up to MAX_PAGE_SIZE (etcd counts the whole rest of
# the range for every page, so small pages over a million keys cost it O(n^2 / page)); a page over the gRPC
# receive limit is halved, and pages stay below that size from then on.
PAGE_SIZE = 1000
MAX_PAGE_SIZE = 50_000


class _Places(SegmentTable):
    """Only each segment's place (collection, partition): what ``decode_into``'s twin check reads."""

    def put(self, seg: SegmentInfo, raw: bytes | None = None) -> Place:
        place: Place = (seg.collection_id, seg.partition_id, ())
        place = self._shared.setdefault(place, place)
        self._places[seg.segment_id] = place
        return place


class _Sink(MetaIndex):
    """A ``MetaIndex`` that keeps no segment, only its place, and hands the decoded record to the caller."""

    def __init__(self) -> None:
        super().__init__()
        self.segments = _Places()
        self.last: SegmentInfo | None = None

    def put_segment(self, seg: SegmentInfo, raw: bytes | None = None) -> None:
        self.segments.put(seg)
        self.last = seg


class StreamedSegments:
    """What ``check_query`` needs of the segment records (see module docstring), filled by ``add`` in key
    order."""

    def __init__(self, live: set[int]):
        self.live = live
        self.corrupt: list[Problem] = []  # in key order, as the decode reports them
        # collection -> partition -> segment ids, in key order (partitions in the order their keys come)
        self.partitions: dict[int, dict[int, array[int]]] = {}
        self._dead: list[tuple[int, KeyValue, list[int]]] = []
        self._sink = _Sink()

    def add(self, item: KeyValue) -> None:
        sink = self._sink
        sink.last = None
        try:
            decode_into(sink, keys.SEGMENT_PREFIX, item.key, item.value)
        except CorruptRecord as exc:
            self.corrupt.append(Problem("corrupt-query-meta", (item.key,), exc.reason,
                                        delete_fix("delete the record", [item])))
            return
        seg = sink.last
        assert seg is not None
        by_pid = self.partitions.setdefault(seg.collection_id, {})
        sids = by_pid.get(seg.partition_id)
        if sids is None:
            sids = by_pid[seg.partition_id] = array("q")
        sids.append(seg.segment_id)
        dead = sorted(n for n in copies(seg).values() if n not in self.live)
        if dead:
            self._dead.append((seg.segment_id, item, dead))

    def partition_keys(self, cid: int, pid: int) -> list[str]:
        """The keys of the records decoded under the partition's prefix, in key order."""
        return [keys.segment_key(cid, pid, sid) for sid in self.partitions.get(cid, {}).get(pid, ())]

    def collection_keys(self, cid: int) -> list[str]:
        return [k for pid in self.partitions.get(cid, {}) for k in self.partition_keys(cid, pid)]

    def on_dead_nodes(self) -> Iterator[tuple[KeyValue, SegmentInfo, list[int]]]:
        """Records with copies on nodes without a session, by segment id: the record, the segment, those
        nodes."""
        for _sid, item, dead in sorted(self._dead, key=lambda d: d[0]):
            yield item, SegmentInfo.FromString(item.value), dead


async def read_segments(kv: MetaKV, revision: int, live: set[int], page_size: int = PAGE_SIZE,
                        max_page_size: int = MAX_PAGE_SIZE) -> StreamedSegments:
    """Every key from ``keys.SEGMENT_PREFIX`` (the key equal to it included) as of ``revision``, page by page."""
    out = StreamedSegments(live)
    start = ""
    ceiling = max(page_size, max_page_size)
    while True:
        try:
            page, more = await kv.range_page(keys.SEGMENT_PREFIX, start=start, limit=page_size, revision=revision)
        except grpc.aio.AioRpcError as exc:  # a page over the gRPC receive limit (large records): halve it
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or page_size == 1:
                raise
            page_size = ceiling = max(1, page_size // 2)
            continue
        for item in page:
            out.add(item)
        if not more or not page:
            return out
        start = page[-1].key + "\x00"
        page_size = min(page_size * 2, ceiling)


__all__ = ["MAX_PAGE_SIZE", "PAGE_SIZE", "StreamedSegments", "read_segments"]
