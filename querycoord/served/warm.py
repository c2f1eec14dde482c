"""A warm standby counts the copies of each partition by place while it follows, for the leader it may become.

Why: a takeover that finds query nodes gone (dead with the old leader, or while no leader watched) lowers the
persisted percentages from what the online nodes serve before it leads (``Coordinator._forget_gone``), and the
new leader's first readers (its metrics, ShowCollections) ask the same. Each count starts from how many of each
partition's target segments share each place of their records (``state.placed``): a pass over every segment,
0.3 s at a million, where the rest (which place counts for which replica, given the online nodes and the replicas'
members) is a pass over a few places. That first part depends on the segment records and the target alone, and a
warm standby follows both (its copy of the query meta, ``querymeta.mirror``, and the catalog's,
``catalog.targets``): it counts while it waits, the counts are kept with its copy of the query meta
(``QueryMeta.segment_view``), and the leader that adopts the copy (``QueryMeta.adopt``) counts again only the
partitions whose segment records or target changed since.

The same rounds group each node's copies of a quiet collection by place (``QueryMeta.places_on_node``): if the
node is among those the takeover finds gone, the repair it queues before it leads starts from those groups.

A collection is counted once its segment records and its target stayed as they were for a whole ``QUIET_S``:
not during a load or a repair, which change them all along (each count would be thrown away at once); one
partition per turn of the loop, whose other work is answering the standby's reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from loguru import logger

from meta.kv import MetaKV
from querycoord.catalog.targets import CatalogTargets
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.index import MetaIndex
from querycoord.querymeta.mirror import MetaMirror
from querycoord.served.state import placed

# How long a collection's segment records and target stay unchanged before a standby counts it (and how often
# it looks).
QUIET_S = 1.0


async def keep_counts_warm(kv: MetaKV, mirror: MetaMirror, targets: CatalogTargets, every: float = QUIET_S) -> None:
    """While standing by (cancelled when the campaign ends): every ``every`` seconds, count the quiet collections of
    the mirror's copy (see module docstring). A failure is logged and the next round tries again: the leader
    counts whatever was not counted here."""
    seen: dict[int, Hashable] = {}
    while True:
        await asyncio.sleep(every)
        try:
            await count_quiet(kv, mirror, targets, seen)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("warm standby: the served counts were not brought up to date ({})", exc)


async def count_quiet(kv: MetaKV, mirror: MetaMirror, targets: CatalogTargets, seen: dict[int, Hashable]) -> int:
    """One round: count the partitions of each collection whose marks are as ``seen`` last round (``seen`` is
    updated); returns how many partitions were counted or found counted. Stops when the copy is replaced or taken
    meanwhile (the loop turns between partitions)."""
    index = mirror.index
    if index is None or not targets.ready:
        seen.clear()
        return 0
    meta = QueryMeta.reading(kv, index)
    done = 0
    for cid in sorted(index.collections):
        mark = _marks(index, cid, targets)
        if seen.get(cid) != mark:
            seen[cid] = mark  # changed since the last round: counted once it stays so for a round
            continue
        for pid in sorted(meta.partition_ids(cid)):
            if mirror.index is not index or _marks(index, cid, targets) != mark:
                return done
            placed(meta, cid, pid, targets)
            done += 1
            await asyncio.sleep(0)
        for node in sorted(n for n, per in index.copies_by_node.items() if cid in per):
            if mirror.index is not index or _marks(index, cid, targets) != mark:
                return done
            meta.places_on_node(node, cid)  # what a takeover's repair of this node, if lost, starts from
            await asyncio.sleep(0)
    for cid in set(seen) - set(index.collections):
        del seen[cid]
    return done


def _marks(index: MetaIndex, cid: int, targets: CatalogTargets) -> Hashable:
    return id(index), index.segment_changes.get(cid, 0), targets.change_mark(cid)


__all__ = ["QUIET_S", "count_quiet", "keep_counts_warm"]
