"""Which target segments and DM channels each replica of a collection lacks, by id and by name.

``state`` only counts (its figures are read on every ShowCollections); health and explain must also say *what*
is missing. Counted with the same judge (``state.Judge``), so a listed segment is exactly one the figures count as
missing. Listing costs a pass over the collection's target ids, done in C: the copies of a collection share a
few placement tuples (``SegmentTable``), so each id is mapped to the identity of its placement and tested against
the placements that do not count for a replica, without a Python step per segment.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from itertools import compress
from typing import TYPE_CHECKING

from querycoord.served.state import Judge

if TYPE_CHECKING:
    from querycoord.catalog.targets import CatalogTargets
    from querycoord.querymeta import QueryMeta

# Segment ids listed per replica unless asked otherwise, and at most.
SEGMENT_LIMIT = 100
SEGMENT_LIMIT_MAX = 1000


@dataclass
class ReplicaMissing:
    """What one replica lacks: the lowest ``limit`` missing segment ids, how many are missing, the channels."""

    segment_ids: list[int] = field(default_factory=list)
    segments: int = 0
    channels: list[str] = field(default_factory=list)


def missing_by_replica(meta: QueryMeta, collection_id: int, online: Set[int],
                       targets: CatalogTargets | None = None, *, limit: int = SEGMENT_LIMIT,
                       segments: bool = True) -> dict[int, ReplicaMissing] | None:
    """Replica -> what it lacks (every replica, empty when whole); None when the collection is not loaded.
    ``segments=False`` lists the channels only (and counts no segment): what health needs."""
    info = meta.get_collection(collection_id)
    if info is None:
        return None
    judge = Judge.of(info, online)
    out = {r: ReplicaMissing() for r in judge.replica_ids}
    if segments:
        _segments(meta, collection_id, [p.partition_id for p in info.partitions], judge, targets, out, limit)
    names: Iterable[str] | None = targets.dm_channels(collection_id) if targets else None
    watches = meta.dm_channel_copies(collection_id)
    if names is None:
        names = sorted(watches)
    for name in names:
        flat = tuple(x for r, n in sorted(watches.get(name, {}).items()) for x in (r, n))
        held = judge.good(flat)
        for r, missing in out.items():
            if r not in held:
                missing.channels.append(name)
    return out


def _segments(meta: QueryMeta, collection_id: int, partition_ids: list[int], judge: Judge,
              targets: CatalogTargets | None, out: dict[int, ReplicaMissing], limit: int) -> None:
    places = meta.segment_places()
    lacking: dict[int, list[int]] = {r: [] for r in out}
    for pid in partition_ids:
        ids: Iterable[int] | None = targets.partition_segment_ids(collection_id, pid) if targets else None
        ids = list(ids if ids is not None else meta.partition_segment_ids(collection_id, pid))
        placed = list(map(places.get, ids))
        # The placements that do not count for each replica, by identity (a segment no record places: None).
        bad: dict[int, set[int]] = {r: {id(None)} for r in out}
        for place in {id(p): p for p in placed if p is not None}.values():
            held = judge.good(place[2])
            for r in out:
                if r not in held:
                    bad[r].add(id(place))
        keys = list(map(id, placed))
        for r, ids_of_r in lacking.items():
            ids_of_r.extend(compress(ids, map(bad[r].__contains__, keys)))
    for r, missing in out.items():
        missing.segments = len(lacking[r])
        missing.segment_ids = heapq.nsmallest(limit, lacking[r]) if limit else []
