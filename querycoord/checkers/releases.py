"""Stale copies and records: copies held outside the target (released partitions, compacted segments), copies
of collections not loaded at all, and segment records neither in the target nor held anywhere.

Compaction sources are kept while their result is missing in some replica (``Sources``): they still serve
its rows.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from proto import task_pb2
from querycoord.checkers.scan import Diff, Scan, repair_of
from querycoord.common.target import TargetSegment


class Releases:
    """Adds segment ``sid`` to the copies ``node`` should release for collection ``cid``: one entry per node, in
    the order the nodes come up, each segment once.

    Indexed by (collection, node), with each entry's segment ids as a set, so that listing a hundred thousand
    copies of a released partition stays linear.
    """

    def __init__(self, out: Diff):
        self.out = out
        self.entries: dict[tuple[int, int], tuple[task_pb2.NodeSegments, set[int]]] = {}

    def __call__(self, cid: int, node: int, sid: int) -> None:
        req = repair_of(self.out, cid)
        entry = self.entries.get((cid, node))
        if entry is None:
            self.entries[cid, node] = (req.release_segments.add(node_id=node, segment_ids=[sid]), {sid})
        elif sid not in entry[1]:
            entry[0].segment_ids.append(sid)
            entry[1].add(sid)


class Sources:
    """Held segments outside the target that may still serve a compaction result no replica holds yet.

    A missing result's direct sources are known (its ``compaction_from``), their own sources are not: the catalog
    drops a compacted segment's record in the txn that adds its result, so in a chain A -> B -> C whose B was never
    loaded (compacted again before its handoff ran, or parked for room), nothing on record says that C holds A's
    rows: not the catalog, not query meta (B was never recorded), not a node. Compaction stays within a partition
    (the catalog refuses sources of another), so while a result is missing, every held segment of its partition
    outside the target is kept: the whole chain, however long, until the result is held; the next pass releases
    them.
    """

    __slots__ = ("ids", "partitions")

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.partitions: set[int] = set()

    def note(self, seg: TargetSegment) -> None:
        """``seg`` is missing in some replica."""
        if seg.compaction_from:
            self.ids.update(seg.compaction_from)
            self.partitions.add(seg.partition_id)

    def spare(self, outside: set[int], where: dict[int, tuple[int, int]]) -> None:
        """Take the segments to keep out of ``outside`` (held segments not in the target; ``where``: their
        reported collection and partition)."""
        outside.difference_update(self.ids)
        if self.partitions and outside:
            outside.difference_update([s for s in outside if where[s][1] in self.partitions])


def release_outside(scan: Scan, cid: int, tsegs: Mapping[int, TargetSegment], held_here: list[int],
                    keep_sources: Sources) -> Generator[None, None, None]:
    """Copies of collection ``cid`` (``held_here``: its held segments, in report order) that are not in the
    target, but for the compaction sources still serving; yields every ``scan.every`` segments."""
    every = scan.every
    outside: set[int] = set()
    for start in range(0, len(held_here), every or len(held_here) or 1):
        yield
        outside.update(set(held_here[start:start + (every or len(held_here))]).difference(tsegs))  # in C
    keep_sources.spare(outside, scan.held.segment_collection)
    if outside:  # usually not
        holders = scan.held.segments
        for sid in held_here:
            if sid in outside:
                for node in sorted(holders.get(sid, ())):
                    scan.release(cid, node, sid)


def forget_unplaced(scan: Scan, cid: int, tsegs: Mapping[int, TargetSegment]) -> Generator[None, None, None]:
    """Meta records of segments that are neither in the target nor held anywhere (set arithmetic first: the ids
    of a million records, not their copies); a record on a silent node is unknown, so kept."""
    meta, holders, silent = scan.meta, scan.held.segments, scan.silent
    yield
    unplaced = meta.segment_id_set(cid)
    yield
    unplaced.difference_update(tsegs)
    for sid in sorted(unplaced):
        if sid not in holders and not silent.intersection(meta.segment_copies(sid).values()):
            repair_of(scan.out, cid).forget_segment_ids.append(sid)


def release_unloaded(scan: Scan, held_of: dict[int, list[int]], target_ids: set[int], busy: set[int]) -> None:
    """Nodes holding anything of a collection that is not loaded at all release the whole collection."""
    meta, held = scan.meta, scan.held
    stray: dict[int, set[int]] = {}
    for scid, sids in held_of.items():
        if scid not in target_ids and scid not in busy and not meta.has_collection(scid):
            nodes = stray.setdefault(scid, set())
            for sid in sids:
                nodes.update(held.segments.get(sid, ()))
    for (scid, _name), nodes in held.channels.items():
        if scid not in target_ids and scid not in busy and not meta.has_collection(scid):
            stray.setdefault(scid, set()).update(nodes)
    for scid, nodes in stray.items():
        repair_of(scan.out, scid).release_collection_on_nodes.extend(sorted(nodes))
