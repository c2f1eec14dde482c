"""Segments: every target segment held once in every replica, on the node its record names.

Per target segment, a fast path: when the nodes that hold it are exactly its recorded copies, one per replica,
each on a node of its replica (any node for a collection loaded before replicas), the segment is held
everywhere it should be and needs nothing: it only counts towards progress. Checking that reads the record's
copy fields, not a dict per segment (``copies``) and a dict and sets per segment (``split``). Every other
segment takes the general path (the rules in full): missing in a replica (loaded, unless its recorded node
is silent: unknown), held on another node of its replica than recorded (adopted), held twice in a replica or
by a node in no replica (released). Both paths give what the general path alone gives
(tests/test_checker_diff_paths.py compares them with the rules written once, on random states).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Mapping

from proto import data_pb2
from querycoord.checkers.releases import Sources
from querycoord.checkers.replicas import ReplicaView
from querycoord.checkers.scan import Scan, repair_of
from querycoord.common.target import TargetSegment


class Tally:
    """One collection's progress: partition -> (held, total), replica -> [held, total]."""

    __slots__ = ("per_replica", "progress")

    def __init__(self, loaded: set[int], replicas: list[int]):
        self.progress: dict[int, tuple[int, int]] = {p: (0, 0) for p in loaded}
        self.per_replica = {r: [0, 0] for r in replicas}


def check_segments(scan: Scan, cid: int, view: ReplicaView, tsegs: Mapping[int, TargetSegment], tally: Tally,
                   keep_sources: Sources) -> Generator[None, None, None]:
    """Every target segment of collection ``cid`` (see module docstring); yields every ``scan.every`` segments."""
    holders = scan.held.segments
    first, second, rest = holders.first, holders.second, holders.rest
    progress = tally.progress
    shape, r0, r1, legacy, replica_of = view.shape, view.r0, view.r1, view.legacy, view.replica_of
    places = scan.meta.segment_places()  # (collection, partition, flat copies: replica, node, ...) by segment
    fast_pids: list[int] = []  # partition of each segment that took the fast path
    segments = list(tsegs.values())
    step = scan.every or len(segments) or 1
    for start in range(0, len(segments), step):
        if start:
            yield
        for seg in segments[start:start + step]:
            sid = seg.segment_id
            if shape == 1:
                node = first.get(sid)
                if node is not None and sid not in second and (legacy or replica_of.get(node) == r0):
                    place = places.get(sid)
                    if place is not None:
                        flat = place[2]  # its one copy is in r0, on the node that holds it
                        if len(flat) == 2 and flat[1] == node and flat[0] == r0:
                            pid = seg.partition_id
                            if pid not in progress:
                                progress[pid] = (0, 0)
                            fast_pids.append(pid)
                            continue
            elif shape == 2:
                a = first.get(sid)
                b = second.get(sid)
                if a is not None and b is not None and sid not in rest:
                    place = places.get(sid)
                    if place is not None and _copies_are(place[2], r0, r1, a, b, replica_of):
                        pid = seg.partition_id
                        if pid not in progress:
                            progress[pid] = (0, 0)
                        fast_pids.append(pid)
                        continue
            _general(scan, cid, view, seg, tally, keep_sources)
    _count_fast(tally, fast_pids, view.replicas)


def _copies_are(flat: tuple[int, ...], r0: int, r1: int, a: int, b: int, replica_of: dict[int, int]) -> bool:
    """True only when the record's copies (``flat``: replica, node, replica, node by replica) are ``{r0: x, r1: y}``
    with ``{x, y} == {a, b}``, x a node of replica ``r0`` and y of ``r1``. False sends the segment to the general
    path."""
    if len(flat) != 4 or flat[0] != r0 or flat[2] != r1:
        return False
    x, y = flat[1], flat[3]
    return ((x == a and y == b) or (x == b and y == a)) and replica_of.get(x) == r0 and replica_of.get(y) == r1


def _count_fast(tally: Tally, fast_pids: list[int], replicas: list[int]) -> None:
    """A fast segment is held in each replica: one held and one expected per replica."""
    progress, per_replica = tally.progress, tally.per_replica
    for pid, count in Counter(fast_pids).items():
        h, t = progress[pid]
        progress[pid] = (h + count * len(replicas), t + count * len(replicas))
        for replica in replicas:
            per_replica[replica][0] += count
            per_replica[replica][1] += count


def _general(scan: Scan, cid: int, view: ReplicaView, seg: TargetSegment, tally: Tally,
             keep_sources: Sources) -> None:
    """The general path: the rules in full for one target segment."""
    release, out, progress = scan.release, scan.out, tally.progress
    by_replica, strays = view.split(scan.held.segments.get(seg.segment_id, set()))
    recorded_copies = scan.meta.segment_copies(seg.segment_id)
    for extra in sorted(strays):
        release(cid, extra, seg.segment_id)
    for replica in view.replicas:
        holding = by_replica.get(replica, set())
        recorded = recorded_copies.get(replica, 0)
        unknown = recorded in scan.silent
        h, t = progress.get(seg.partition_id, (0, 0))
        counted = 1 if holding or (unknown and recorded not in scan.gone) else 0
        progress[seg.partition_id] = (h + counted, t + 1)
        tally.per_replica[replica][0] += counted
        tally.per_replica[replica][1] += 1
        if holding:
            keep = recorded if recorded in holding else min(holding)
            if recorded != keep:  # ``add`` builds the entry in place (``append`` would copy a message built aside)
                repair_of(out, cid).adopt.add(
                    segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                    node_id=keep, replica_id=replica, state=data_pb2.SEGMENT_STATE_SEALED,
                    compaction_from=list(seg.compaction_from))
            for extra in sorted(holding - {keep}):
                release(cid, extra, seg.segment_id)
        elif not unknown:
            keep_sources.note(seg)  # serve the sources until the result is loaded
            repair_of(out, cid).missing_segments.add(
                segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                node_id=recorded, replica_id=replica, mem_size=seg.mem_size)
