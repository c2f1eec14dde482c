"""The comparison: the repairs that make the distribution (what nodes hold) match the target (what should be
held), and the load progress the nodes' reports show.

A pure function of plain data, so the rules are tested without a cluster. Per loaded collection not busy (a
trigger owns it until it ends) it runs the per-kind steps: ``segments``, ``releases`` (copies outside the
target, stale records), ``channels``; then copies of collections not loaded at all. ``diff_async`` is the same
comparison with a turn of the event loop every ``TURN_SEGMENTS`` segments: at a million segments one pass is
about a second of Python.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping

from querycoord.checkers.channels import check_channels
from querycoord.checkers.distribution import TURN_SEGMENTS, Held
from querycoord.checkers.releases import Releases, Sources, forget_unplaced, release_outside, release_unloaded
from querycoord.checkers.replicas import ReplicaView
from querycoord.checkers.scan import Diff, Scan, describe
from querycoord.checkers.segments import Tally, check_segments
from querycoord.checkers.whole import held_as_recorded
from querycoord.common.target import Target, TargetSegment
from querycoord.common.yielding import run_steps, run_steps_with_turns
from querycoord.querymeta import QueryMeta


def diff(
    meta: QueryMeta, targets: dict[int, Target], held: Held, *, reachable: set[int], online: set[int], busy: set[int],
    gone: frozenset[int] = frozenset(),
) -> Diff:
    """The repairs that make the distribution match the target (see module docstring).

    ``reachable``: online nodes that reported; what meta places on an online
    node that did not report (``online - reachable``) is unknown, so it is
    neither missing nor extra; ``gone``: those of them whose session is lost,
    whose copies count as not held. Runs without a turn of the event loop: see
    ``diff_async`` for the checker's pass.
    """
    return run_steps(_diff_steps(meta, targets, held, reachable=reachable, online=online, busy=busy, every=0,
                                 gone=gone))


async def diff_async(
    meta: QueryMeta, targets: dict[int, Target], held: Held, *, reachable: set[int], online: set[int], busy: set[int],
    every: int = TURN_SEGMENTS,
    gone: frozenset[int] = frozenset(),
    own_targets: bool = False,
) -> Diff:
    """``diff``, giving the event loop a turn every ``every`` segments (a million segments take a second or more:
    the session keepalive, the election watch and every gRPC answer, /metrics included, wait meanwhile).

    Why the turns do not make it wrong: each target is copied before the first turn, so a catalog change made
    meanwhile (a handoff replacing compaction sources by their result) is seen whole or not at all; ``held`` is
    the caller's own. Query meta may change between turns (a trigger's writes, a reload), so one collection
    may be seen partly before and partly after a change: the caller re-checks ``busy`` before it acts and drops
    what it found for a collection that became busy, a repair re-plans against current meta before it loads or
    releases anything (``task.repair``), progress is advisory and the next pass recomputes it. The checker is
    level-triggered: a difference a pass missed or saw half-way is found whole by the next one. (A trigger that
    starts and ends within one pass is not seen as busy: that window is the pass, between the catalog reads'
    awaits and the end of the comparison.)

    ``own_targets``: the caller's targets are its own and nothing changes them during the turns (the checker reads
    fresh copies for each pass): they are not copied again (a million segments' dict).
    """
    return await run_steps_with_turns(_diff_steps(meta, targets, held, reachable=reachable, online=online,
                                                  busy=busy, every=every, gone=gone, copy=not own_targets))


def _diff_steps(
    meta: QueryMeta, targets: dict[int, Target], held: Held, *, reachable: set[int], online: set[int], busy: set[int],
    every: int,
    gone: frozenset[int] = frozenset(),
    copy: bool = True,
) -> Generator[None, None, Diff]:
    """``diff``'s body: yields every ``every`` segments (never when 0), returns the ``Diff``; the targets are
    copied first when it yields and ``copy`` (see ``diff_async``)."""
    out = Diff()
    scan = Scan(meta, held, reachable, online - reachable, every, out, Releases(out), gone)
    # A snapshot of each target taken now (see diff_async): the caller's may be shared and change during turns.
    snapshot = bool(every) and copy
    work = [(cid, dict(t.segments) if snapshot else t.segments, set(t.channels) if snapshot else t.channels,
             _partitions(t, snapshot)) for cid, t in list(targets.items()) if cid not in busy]
    target_ids = set(targets)
    held_of = yield from _held_by_collection(held, every)
    for cid, tsegs, tchans, tparts in work:
        yield from _check_collection(scan, cid, tsegs, tchans, held_of.get(cid, []), tparts)
    release_unloaded(scan, held_of, target_ids, busy)
    for req in out.repairs.values():
        req.reason = describe(req)
    return out


def _partitions(target: Target, snapshot: bool) -> dict[int, dict[int, TargetSegment]]:
    """The target's segments by partition (copied when ``snapshot``, as its segments: see ``diff_async``); none
    unless they are exactly its segments, each in one partition."""
    parts = target.partitions
    if not parts or sum(map(len, parts.values())) != len(target.segments):
        return {}
    return {pid: dict(segs) for pid, segs in parts.items()} if snapshot else parts


def _held_by_collection(held: Held, every: int) -> Generator[None, None, dict[int, list[int]]]:
    """Held segments by collection, in report order (a pass per collection over all held segments is quadratic
    in collections). One collection held (the common case): no loop."""
    turn = every or -1  # segments until the next turn; never reaches 0 when not yielding
    held_of: dict[int, list[int]] = {}
    held_cids = {scid for scid, _pid in set(held.segment_collection.values())}  # (collection, partition) pairs
    if len(held_cids) == 1:
        held_of[held_cids.pop()] = list(held.segment_collection)
        return held_of
    for sid, (scid, _pid) in held.segment_collection.items():
        ids = held_of.get(scid)
        if ids is None:
            held_of[scid] = [sid]
        else:
            ids.append(sid)
        turn -= 1
        if not turn:
            turn = every
            yield
    return held_of


def _check_collection(scan: Scan, cid: int, tsegs: Mapping[int, TargetSegment], tchans: Iterable[str],
                      held_here: list[int], tparts: Mapping[int, Mapping[int, TargetSegment]]
                      ) -> Generator[None, None, None]:
    """Every step for one loaded collection; its progress goes to ``scan.out``. A collection held exactly as
    recorded is decided by whole groups (``whole``), and its per-segment steps are skipped."""
    meta = scan.meta
    loaded = set(meta.partition_ids(cid))
    view = ReplicaView(meta, cid)
    tally = Tally(loaded, view.replicas)
    keep_sources = Sources()
    whole = yield from held_as_recorded(scan, cid, view, tsegs, tparts, len(held_here), tally)
    if not whole:
        yield from check_segments(scan, cid, view, tsegs, tally, keep_sources)
        yield from release_outside(scan, cid, tsegs, held_here, keep_sources)
        yield from forget_unplaced(scan, cid, tsegs)
    check_channels(scan, cid, view, tchans, loaded)
    scan.out.progress[cid] = tally.progress
    scan.out.replica_progress[cid] = {r: (h, t) for r, (h, t) in tally.per_replica.items()}
