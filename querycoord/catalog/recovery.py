"""Recovery reads: a partition's DM channels and sealed segments, whole or paged by segment id (what a load reads)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from operator import itemgetter

from meta.get_many import get_many
from meta.txn import MAX_TXN_OPS
from proto import catalog_pb2, data_pb2
from querycoord.catalog.access import CatalogAccess
from querycoord.catalog.binlogs import add_flushed, parse_binlogs
from querycoord.catalog.errors import InvalidArgument
from querycoord.catalog.keys import parse_segment_key, segment_key, segment_prefix

# A filtered lookup reads its ids by txns of gets (``meta.get_many``: exactly the records wanted, 128 a txn), or the
# partition's whole prefix when the ids are at least 1 / ``_PREFIX_SHARE`` of its segments (a range then reads few
# records not wanted). Up to ``MAX_TXN_OPS`` ids go by one txn without asking the partition's size first.
_PREFIX_SHARE = 3
_VALUE = itemgetter(1)


@dataclass(frozen=True, slots=True)
class RecoveryPage:
    """One page of ``get_recovery_page``: channels, binlogs in segment id order, and where to continue (0: done).

    Each channel's ``flushed_segment_ids`` lists the segments of *this* page in
    that channel; the union over all pages is the whole partition's.
    """

    channels: list[data_pb2.VChannelInfo]
    binlogs: list[data_pb2.SegmentBinlogs]
    next_after_segment_id: int


async def read_recovery_page(access: CatalogAccess, collection_id: int, partition_id: int,
                             segment_ids: Iterable[int] | None, after_segment_id: int, page_size: int) -> RecoveryPage:
    """DM channels and sealed segments of a partition (all of them, or those of ``segment_ids``) with segment
    ids > ``after_segment_id``, at most ``page_size`` (0: all)."""
    if after_segment_id < 0 or page_size < 0:
        raise InvalidArgument(
            f"after_segment_id and page_size must be >= 0, got {after_segment_id} and {page_size}"
        )
    desc = await access.collection_with_partition(collection_id, partition_id)
    prefix = segment_prefix(collection_id, partition_id)
    next_after = 0
    pairs: list[tuple[str, bytes]]
    if segment_ids is None and not page_size and not after_segment_id:
        # A whole partition (every load): the records alone, no key decoded.
        values = (await access.kv.load_prefix(prefix)).values()
        return _recovery_page(desc, collection_id, parse_binlogs(values), 0)
    if segment_ids is not None:
        ids = sorted({i for i in segment_ids if i > after_segment_id})
        if page_size and len(ids) > page_size:
            ids, next_after = ids[:page_size], ids[page_size - 1]
        if len(ids) > MAX_TXN_OPS and len(ids) * _PREFIX_SHARE >= await access.kv.count_prefix(prefix):
            wanted = {segment_key(collection_id, partition_id, i) for i in ids}
            pairs = [(k, v) for k, v in (await access.kv.load_prefix(prefix)).items() if k in wanted]
        else:
            # A lost or drained node's eighth of a partition: a range over it read and parsed eight records for
            # each one wanted (most of a repair's plan at 100,000 segments), key-by-key reads a round trip each.
            got = await get_many(access.kv, [segment_key(collection_id, partition_id, i) for i in ids],
                                 operation=f"recovery records of partition {partition_id}")
            pairs = sorted(got.items())
    elif page_size:
        pairs, more = await access.range_page(prefix + f"{after_segment_id + 1:019d}", prefix, page_size)
        if more and pairs:
            next_after = parse_segment_key(pairs[-1][0]).segment_id
    else:  # the segments after after_segment_id, unpaged
        first = prefix + f"{after_segment_id + 1:019d}"
        pairs = [(k, v) for k, v in (await access.kv.load_prefix(prefix)).items() if k >= first]

    return _recovery_page(desc, collection_id, parse_binlogs(list(map(_VALUE, pairs))), next_after)


def _recovery_page(desc: catalog_pb2.CollectionDescription, collection_id: int,
                   binlogs: list[data_pb2.SegmentBinlogs], next_after: int) -> RecoveryPage:
    """The page of ``binlogs``: the collection's channels, each listing its segments of the page."""
    channels = [data_pb2.VChannelInfo(collection_id=collection_id, channel_name=c) for c in desc.dm_channels]
    add_flushed(channels, binlogs)
    return RecoveryPage(channels, binlogs, next_after)
