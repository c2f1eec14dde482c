"""A collection held exactly as recorded, decided by whole groups: the first pass after a takeover at scale.

The per-segment steps (``segments``, ``releases``) look at every target segment, every held one and every
record one by one: at a million segments, several lookups in million-entry tables each. A collection of one
replica (or loaded before replicas) whose nodes hold exactly its target, each segment once and where its record
places it, needs none of that, and that is decided here with a few operations in C per group a node reported
(``Held.groups``: node, partition, ids), not a Python statement per segment:

- every group's node serves the replica, its ids are all in the target's same partition, and none of them is
  held by a second node (``Holders.second``; a node that reported an id twice is its own second holder);
- the records of a group's ids share one place (records share their place tuple) that is this collection's,
  one copy, in the replica, on that node;
- the groups hold as many ids as the target has segments, and as many as the collection holds and records.

Then every target segment takes the per-segment fast path (held once, where recorded), no copy is held outside
the target and no record is outside it: ``diff`` gives exactly the progress the per-segment steps would give and
nothing to repair, and those steps are skipped. Anything else (a missing or extra copy, a stray, a stale
record, two replicas) returns False, and the per-segment steps decide the collection as before.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

from querycoord.checkers.replicas import ReplicaView
from querycoord.checkers.scan import Scan
from querycoord.checkers.segments import Tally
from querycoord.common.target import TargetSegment

Place = tuple[int, int, tuple[int, ...]]  # a record's (collection, partition, copies: replica, node, ...)


def held_as_recorded(scan: Scan, cid: int, view: ReplicaView, tsegs: Mapping[int, TargetSegment],
                     tparts: Mapping[int, Mapping[int, TargetSegment]], held_count: int, tally: Tally
                     ) -> Generator[None, None, bool]:
    """True when collection ``cid`` is held exactly as recorded (see module docstring): its progress is then
    added to ``tally``. False changes nothing. ``held_count``: the segments the nodes reported of it. Yields every
    ``scan.every`` segments (never when 0)."""
    groups = scan.held.groups.get(cid)
    if view.shape != 1 or not groups or not tparts or held_count != len(tsegs):
        return False
    if sum(len(ids) for _node, _pid, ids in groups) != len(tsegs) or not tparts.keys() <= tally.progress.keys():
        return False
    if scan.meta.segment_count(cid) != len(tsegs):
        return False  # records outside the target (or targets without a record)
    second = scan.held.segments.second
    places: Mapping[int, Place] = scan.meta.segment_places()
    counts: dict[int, int] = {}
    every, done = scan.every, 0
    for node, pid, ids in groups:
        target = tparts.get(pid)
        if target is None or not (view.legacy or view.replica_of.get(node) == view.r0):
            return False
        if not ids <= target.keys() or (second and not ids.isdisjoint(second)):
            return False
        if not _recorded_on(ids, places, (cid, view.r0, node)):
            return False
        counts[pid] = counts.get(pid, 0) + len(ids)
        done += len(ids)
        if every and done >= every:
            done = 0
            yield
    progress, per_replica = tally.progress, tally.per_replica
    for pid, count in counts.items():
        h, t = progress[pid]
        progress[pid] = (h + count, t + count)
    for replica in view.replicas:
        per_replica[replica][0] += len(tsegs)
        per_replica[replica][1] += len(tsegs)
    return True


def _recorded_on(ids: set[int], places: Mapping[int, Place], where: tuple[int, int, int]) -> bool:
    """Every id's record is of collection ``where[0]`` with one copy, in replica ``where[1]`` on node ``where[2]``:
    one lookup per id, then one look per distinct place (one, when the records share their tuple)."""
    cid, replica, node = where
    try:  # ``__getitem__``: a C call per id (a mapping proxy's ``get`` is a method call per id)
        found = set(map(id, map(places.__getitem__, ids)))
        if len(found) == 1:
            sample = places[next(iter(ids))]
            return sample[0] == cid and sample[2] == (replica, node)
        return all(p[0] == cid and p[2] == (replica, node) for p in set(map(places.__getitem__, ids)))
    except KeyError:  # an id without a record
        return False
