"""``checkers.diff``'s fast path and turns change nothing: on random small states, ``diff`` and ``diff_async``
give what the rules written once give (``reference_diff``: the diff of before the fast path, copied verbatim).

States are written through a real query meta on the suite's etcd (no mock of etcd or the KV layer): collections
with 1-3 replicas or loaded before replicas, records with copies in, out of and beside their replicas, nodes
holding exactly their recorded copies (the fast path) or with strays, missing and extra copies, silent and
offline nodes, busy collections, segments of unloaded partitions and collections, DM channels.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.client import EtcdClient
from meta.kv import MetaKV
from proto import data_pb2, task_pb2
from querycoord.checkers import Diff, Held, Holders, describe, diff, diff_async
from querycoord.common.target import Target, TargetSegment
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies

NODES = list(range(1, 5))  # few nodes: holders and records often meet
FOREIGN_REPLICA = 9  # a replica id no collection has: a copy recorded beside the collection's replicas


@dataclass
class RefHeld:
    """``Held`` as it was: a set of nodes per segment."""

    segments: dict[int, set[int]] = field(default_factory=dict)
    segment_collection: dict[int, tuple[int, int]] = field(default_factory=dict)
    channels: dict[tuple[int, str], set[int]] = field(default_factory=dict)


# ----- the reference: querycoord/checker.py's diff before the fast path ----------------------------------------
def _repair(d: Diff, cid: int) -> task_pb2.RepairRequest:
    return d.repairs.setdefault(cid, task_pb2.RepairRequest())


def reference_diff(
    meta: QueryMeta,
    targets: dict[int, Target],
    held: RefHeld,
    *,
    reachable: set[int],
    online: set[int],
    busy: set[int],
) -> Diff:
    """``checker.diff`` without its fast path, in the plain style of a reference: one loop per rule,
    including compaction sources kept through chains and one DM channel watcher per replica.

    ``reachable``: online nodes that reported; what meta places on an online
    node that did not report (``online - reachable``) is unknown, so it is
    neither missing nor extra.
    """
    out = Diff()
    silent = online - reachable
    for cid, target in targets.items():
        if cid in busy:
            continue
        loaded = set(meta.partition_ids(cid))
        progress: dict[int, tuple[int, int]] = {p: (0, 0) for p in loaded}
        replicas = meta.replica_ids(cid)
        members = {r: set(meta.replica_nodes(cid, r)) for r in replicas}
        legacy = replicas == [0]  # loaded before replicas: any node serves its one copy

        def split(nodes: set[int], members: dict[int, set[int]] = members, legacy: bool = legacy
                  ) -> tuple[dict[int, set[int]], set[int]]:
            """Holders by replica, and holders in no replica (strays)."""
            if legacy:
                return {0: set(nodes)}, set()
            by: dict[int, set[int]] = {}
            strays: set[int] = set()
            for n in nodes:
                r = next((r for r, m in members.items() if n in m), 0)
                (by.setdefault(r, set()) if r else strays).add(n)
            return by, strays

        per_replica = {r: [0, 0] for r in replicas}
        keep_sources: set[int] = set()
        compacting: set[int] = set()  # partitions with a compaction result missing: their sources through chains
        for seg in target.segments.values():
            by_replica, strays = split(held.segments.get(seg.segment_id, set()))
            recorded_copies = meta.segment_copies(seg.segment_id)
            for extra in sorted(strays):
                _release(out, cid, extra, seg.segment_id)
            for replica in replicas:
                holders = by_replica.get(replica, set())
                recorded = recorded_copies.get(replica, 0)
                unknown = recorded in silent
                h, t = progress.get(seg.partition_id, (0, 0))
                counted = 1 if holders or unknown else 0
                progress[seg.partition_id] = (h + counted, t + 1)
                per_replica[replica][0] += counted
                per_replica[replica][1] += 1
                if holders:
                    keep = recorded if recorded in holders else min(holders)
                    if recorded != keep:
                        _repair(out, cid).adopt.append(data_pb2.SegmentInfo(
                            segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                            node_id=keep, replica_id=replica, state=data_pb2.SEGMENT_STATE_SEALED,
                            compaction_from=list(seg.compaction_from)))
                    for extra in sorted(holders - {keep}):
                        _release(out, cid, extra, seg.segment_id)
                elif not unknown:
                    keep_sources.update(seg.compaction_from)  # serve the sources until the result is loaded
                    if seg.compaction_from:
                        compacting.add(seg.partition_id)
                    _repair(out, cid).missing_segments.append(data_pb2.SegmentInfo(
                        segment_id=seg.segment_id, collection_id=cid, partition_id=seg.partition_id,
                        node_id=recorded, replica_id=replica))
        # Copies of this collection that are not in the target: released partitions, compacted away.
        for sid, (scid, spid) in held.segment_collection.items():
            if scid != cid or sid in target.segments or sid in keep_sources or spid in compacting:
                continue
            for node in sorted(held.segments.get(sid, ())):
                _release(out, cid, node, sid)
        # Meta records of segments that are neither in the target nor held anywhere.
        for sid in meta.segment_ids_of(cid):  # ids, not copies of a million records
            if sid not in target.segments and sid not in held.segments \
                    and not silent.intersection(meta.segment_copies(sid).values()):
                _repair(out, cid).forget_segment_ids.append(sid)
        # DM channels: each target channel watched by a reachable node of every replica, or re-watched.
        pids = [] if meta.get_load_type(cid) == data_pb2.LOAD_TYPE_COLLECTION else sorted(loaded)
        # One watcher per replica (the recorded one when it watches, else the lowest id, then recorded); every
        # other watcher (a second one in a replica, one in no replica) stops watching.
        for name in sorted(target.channels):
            by_replica, strays = split(held.channels.get((cid, name), set()))
            recorded_w = meta.get_dm_channel(cid, name)
            watch_copies = copies(recorded_w) if recorded_w is not None else {}
            watch_parts = list(recorded_w.partition_ids) if recorded_w is not None else pids
            extra = set(strays)
            for replica in replicas:
                node = watch_copies.get(replica, 0)
                watchers = by_replica.get(replica, set())
                if watchers:
                    keep = node if node in watchers else min(watchers)
                    extra |= watchers - {keep}
                    if keep != node:
                        _repair(out, cid).adopt_dm_channels.append(data_pb2.DmChannelWatchInfo(
                            collection_id=cid, dm_channel=name, node_id=keep, replica_id=replica,
                            partition_ids=watch_parts))
                    continue
                if node in silent:
                    continue  # its node did not report: unknown
                _repair(out, cid).rewatch.append(data_pb2.DmChannelWatchInfo(
                    collection_id=cid, dm_channel=name, node_id=node if node in reachable else 0,
                    replica_id=replica, partition_ids=watch_parts))
            for node in sorted(extra):
                _release_channel(out, cid, node, name)
        out.progress[cid] = progress
        out.replica_progress[cid] = {r: (h, t) for r, (h, t) in per_replica.items()}
    # Nodes holding anything of a collection that is not loaded at all.
    stray: dict[int, set[int]] = {}
    for sid, (scid, _pid) in held.segment_collection.items():
        if scid not in targets and scid not in busy and not meta.has_collection(scid):
            stray.setdefault(scid, set()).update(held.segments.get(sid, ()))
    for (scid, _name), nodes in held.channels.items():
        if scid not in targets and scid not in busy and not meta.has_collection(scid):
            stray.setdefault(scid, set()).update(nodes)
    for scid, nodes in stray.items():
        _repair(out, scid).release_collection_on_nodes.extend(sorted(nodes))
    for req in out.repairs.values():
        req.reason = describe(req)
    return out


def _release(d: Diff, cid: int, node: int, sid: int) -> None:
    req = _repair(d, cid)
    for ns in req.release_segments:
        if ns.node_id == node:
            if sid not in ns.segment_ids:
                ns.segment_ids.append(sid)
            return
    req.release_segments.append(task_pb2.NodeSegments(node_id=node, segment_ids=[sid]))


def _release_channel(d: Diff, cid: int, node: int, name: str) -> None:
    req = _repair(d, cid)
    for nc in req.release_dm_channels:
        if nc.node_id == node:
            nc.channel_names.append(name)
            return
    req.release_dm_channels.append(task_pb2.NodeChannels(node_id=node, channel_names=[name]))


# ----- random states -------------------------------------------------------------------------------------------
@dataclass
class Coll:
    cid: int
    load_type: int
    replicas: list[data_pb2.ReplicaInfo]  # [] = loaded before replicas
    partitions: list[int]
    segments: dict[int, int]  # sid -> partition (loaded partitions only: meta refuses others)


@dataclass
class State:
    colls: list[Coll]
    saves: list[list[data_pb2.SegmentInfo]]  # rounds of copies (one copy of a segment per round)
    watches: list[data_pb2.DmChannelWatchInfo]
    targets: dict[int, Target]
    reports: list[tuple[int, int, int, int]]  # (node, segment, collection, partition) in report order
    held_channels: dict[tuple[int, str], set[int]]
    reachable: set[int]
    online: set[int]
    busy: set[int]


@st.composite
def collections(draw: st.DrawFn, cid: int) -> Coll:
    n_replicas = draw(st.integers(0, 3))  # 0: loaded before replicas
    ids = draw(st.permutations([1, 2, 3, 4]))[:n_replicas]  # not always in ascending order
    replicas = []
    if n_replicas:
        group = {n: draw(st.integers(0, n_replicas)) for n in NODES}  # 0: a spare node, in no replica
        replicas = [data_pb2.ReplicaInfo(replica_id=r, collection_id=cid,
                                         node_ids=[n for n in NODES if group[n] == i + 1])
                    for i, r in enumerate(ids)]
    partitions = [cid * 10 + j for j in range(draw(st.integers(1, 2)))]
    segments = {cid * 100 + i: draw(st.sampled_from(partitions)) for i in range(draw(st.integers(0, 6)))}
    load_type = draw(st.sampled_from([data_pb2.LOAD_TYPE_COLLECTION, data_pb2.LOAD_TYPE_PARTITION]))
    return Coll(cid, load_type, replicas, partitions, segments)


@st.composite
def states(draw: st.DrawFn) -> State:
    colls = [draw(collections(cid)) for cid in range(1, draw(st.integers(1, 3)) + 1)]
    saves: list[list[data_pb2.SegmentInfo]] = [[], [], []]
    targets: dict[int, Target] = {}
    holders: dict[int, tuple[int, int, set[int]]] = {}  # sid -> (collection, partition, nodes)
    watches = []
    held_channels: dict[tuple[int, str], set[int]] = {}
    for c in colls:
        replica_ids = [r.replica_id for r in c.replicas] or [0]
        members = {r.replica_id: list(r.node_ids) for r in c.replicas}
        target = Target()
        for sid, pid in c.segments.items():
            mode = draw(st.sampled_from(["consistent", "near", "random"]))
            if mode == "consistent":  # held exactly where recorded, one copy per replica: the fast path
                placed = {r: draw(st.sampled_from(members.get(r) or NODES)) for r in replica_ids}
            elif mode == "near":  # one copy per replica, each maybe under another replica id or on any node
                placed = {}
                for r in replica_ids:
                    same = draw(st.integers(0, 2)) > 0
                    member = draw(st.integers(0, 2)) > 0
                    placed[r if same else draw(st.sampled_from([*replica_ids, 0, FOREIGN_REPLICA]))] = draw(
                        st.sampled_from((members.get(r) if member else None) or NODES))
            else:
                placed = {draw(st.sampled_from([*replica_ids, 0, FOREIGN_REPLICA])): draw(st.sampled_from(NODES))
                          for _ in range(draw(st.integers(0, 3)))}
            consistent = mode != "random"
            for i, (r, n) in enumerate(placed.items()):
                saves[i].append(data_pb2.SegmentInfo(segment_id=sid, collection_id=c.cid, partition_id=pid,
                                                     node_id=n, replica_id=r, state=data_pb2.SEGMENT_STATE_SEALED))
            nodes: set[int] = set(placed.values()) if consistent else draw(st.sets(st.sampled_from(NODES),
                                                                                     max_size=3))
            if mode == "near" and draw(st.booleans()):  # held almost where recorded: one node more, less or other
                change = draw(st.sampled_from(["add", "drop", "swap"]))
                if change != "add" and nodes:
                    nodes.discard(draw(st.sampled_from(sorted(nodes))))
                if change != "drop":
                    nodes.add(draw(st.sampled_from(NODES)))
            reported_empty: bool = draw(st.booleans())
            if nodes or reported_empty:
                holders[sid] = (c.cid, pid, nodes)
            if draw(st.integers(0, 5)) > 0:  # mostly in the target; else a stale record (or a stray copy)
                sources = tuple(draw(st.sets(st.sampled_from([*c.segments, c.cid * 100 + 50]), max_size=2)))
                target.segments[sid] = TargetSegment(sid, pid, sources)
        for i in range(draw(st.integers(0, 2))):  # target segments meta has no record of
            sid = c.cid * 100 + 20 + i
            target.segments[sid] = TargetSegment(sid, draw(st.sampled_from(c.partitions)))
            if draw(st.booleans()):
                holders[sid] = (c.cid, target.segments[sid].partition_id, set(draw(st.sets(st.sampled_from(NODES),
                                                                                          max_size=2))))
        if draw(st.booleans()):  # a copy of a released partition (or compacted away), still held
            holders[c.cid * 100 + 50] = (c.cid, c.cid * 10 + 9, {draw(st.sampled_from(NODES))})
        for j in range(draw(st.integers(0, 2))):
            name = f"dml-{c.cid}-{j}"
            target.channels.add(name)
            if draw(st.booleans()):
                watches.append(data_pb2.DmChannelWatchInfo(collection_id=c.cid, dm_channel=name,
                                                           node_id=draw(st.sampled_from(NODES)),
                                                           replica_id=draw(st.sampled_from(replica_ids))))
            nodes = set(draw(st.sets(st.sampled_from(NODES), max_size=2)))
            if nodes:
                held_channels[c.cid, name] = nodes
        if draw(st.integers(0, 4)) > 0:  # mostly checked; else the collection is loaded but has no target
            targets[c.cid] = target
    if draw(st.booleans()):  # a collection that is not loaded at all, still held: strays
        holders[900] = (9, 90, {draw(st.sampled_from(NODES))})
        held_channels[9, "dml-9-0"] = {draw(st.sampled_from(NODES))}
    reports = [(n, sid, cid, pid) for sid, (cid, pid, nodes) in holders.items() for n in sorted(nodes)]
    reports += [(0, sid, cid, pid) for sid, (cid, pid, nodes) in holders.items() if not nodes]  # held by none
    order = draw(st.permutations(range(len(reports))))
    online = set(draw(st.sets(st.sampled_from(NODES), min_size=1)))
    return State(
        colls=colls, saves=saves, watches=watches, targets=targets,
        reports=[reports[i] for i in order], held_channels=held_channels,
        reachable=online - set(draw(st.sets(st.sampled_from(NODES), max_size=2))), online=online,
        busy=set(draw(st.sets(st.sampled_from([1, 2, 3, 9]), max_size=2))))


def held_both(state: State) -> tuple[Held, RefHeld]:
    """The same reports as the new ``Held`` (built as ``distribution.collect`` builds it: ``Holders.add`` in report
    order) and as the reference's sets."""
    new, ref = Held(channels={k: set(v) for k, v in state.held_channels.items()}), RefHeld(
        channels={k: set(v) for k, v in state.held_channels.items()})
    for node, sid, cid, pid in state.reports:
        if node:
            new.segments.add(sid, node)
            ref.segments.setdefault(sid, set()).add(node)
        else:
            new.segments[sid] = set()
            ref.segments.setdefault(sid, set())
        new.segment_collection[sid] = ref.segment_collection[sid] = (cid, pid)
    return new, ref


async def write(meta: QueryMeta, state: State) -> None:
    for c in state.colls:
        await meta.add_collection(c.cid, c.load_type, c.partitions, replicas=c.replicas)  # type: ignore[arg-type]
    for rnd in state.saves:
        if rnd:
            await meta.save_segments(rnd)
    if state.watches:
        await meta.save_dm_channel_watch(state.watches)


def flat(d: Diff) -> tuple[Any, ...]:
    """Everything a Diff says, order included (a repeated field's order is part of a message's equality)."""
    return (list(d.repairs.items()), [(c, list(p.items())) for c, p in d.progress.items()],
            [(c, list(p.items())) for c, p in d.replica_progress.items()])



@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(state=states(), every=st.integers(1, 4))
def test_the_fast_diff_gives_what_the_rules_give(on_etcd: tuple[asyncio.AbstractEventLoop, EtcdClient],
                                                 state: State, every: int) -> None:
    loop, client = on_etcd

    async def run() -> None:
        meta = QueryMeta(MetaKV(client, f"test/diff-paths-{uuid.uuid4().hex[:12]}"))
        await meta.reload()
        await write(meta, state)
        new, ref = held_both(state)
        assert {s: new.segments[s] for s in new.segments} == ref.segments, "Holders reads as the sets"
        args: dict[str, Any] = {"reachable": state.reachable, "online": state.online, "busy": state.busy}
        expected = flat(reference_diff(meta, state.targets, ref, **args))
        assert flat(diff(meta, state.targets, new, **args)) == expected
        assert flat(await diff_async(meta, state.targets, new, every=every, **args)) == expected
        # The checker leaves busy collections' segments out of what it collects (checkers.distribution.collect): the
        # same diff.
        unbusy, _ = held_both(replace(state, reports=[r for r in state.reports if r[2] not in state.busy]))
        assert flat(await diff_async(meta, state.targets, unbusy, every=every, **args)) == expected
        await meta.kv.remove_prefix("")

    loop.run_until_complete(run())


def test_holders_read_as_a_mapping_of_sets() -> None:
    h = Holders()
    h.add(1, 5)
    h.add(1, 5)
    h.add(1, 6)
    h.add(1, 7)
    h.add(1, 6)
    h[2] = {3}
    h[3] = set()
    assert dict(h.items()) == {1: {5, 6, 7}, 2: {3}, 3: set()}
    assert 3 in h and 4 not in h and len(h) == 3
    h[1] = [8]
    del h[3]
    assert dict(h.items()) == {1: {8}, 2: {3}} and h.get(3) is None
    with pytest.raises(TypeError):
        h.setdefault(4, set()).add(1)  # the old idiom would add to a copy: refused, not lost


# Cases the random states reach rarely: each is one step from the fast path and needs a repair.
NEAR_MISSES = {
    "a third holder beside both replicas' copies": ([[1], [2]], [(1, 1), (2, 2)], {1, 2, 3}),
    "a copy under a replica the collection does not have": ([[1], [2]], [(1, 1), (FOREIGN_REPLICA, 2)], {1, 2}),
    "copies swapped between the replicas' nodes": ([[1], [2]], [(1, 2), (2, 1)], {1, 2}),
    "held by the replicas' nodes, one copy recorded on another": ([[1, 3], [2]], [(1, 3), (2, 2)], {1, 2}),
    "a copy on a spare node": ([[1]], [(1, 3)], {3}),
    "the one copy recorded under another replica": ([[1]], [(FOREIGN_REPLICA, 1)], {1}),
    "held by one node, recorded on another of the replica": ([[1, 2]], [(1, 2)], {1}),
    "loaded before replicas, held by two nodes": ([], [(0, 1)], {1, 2}),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
async def test_one_step_from_the_fast_path_is_the_general_path(kv: MetaKV, case: str) -> None:
    groups, recorded, nodes = NEAR_MISSES[case]
    meta = QueryMeta(kv)
    await meta.reload()
    await meta.add_collection(1, data_pb2.LOAD_TYPE_COLLECTION, [10], replicas=[
        data_pb2.ReplicaInfo(replica_id=i + 1, collection_id=1, node_ids=g) for i, g in enumerate(groups)])
    for replica, node in recorded:
        await meta.save_segments([data_pb2.SegmentInfo(segment_id=100, collection_id=1, partition_id=10,
                                                       node_id=node, replica_id=replica)])
    targets = {1: Target(segments={100: TargetSegment(100, 10)})}
    new, ref = Held(), RefHeld()
    for n in sorted(nodes):
        new.segments.add(100, n)
        ref.segments.setdefault(100, set()).add(n)
        new.segment_collection[100] = ref.segment_collection[100] = (1, 10)
    args: dict[str, Any] = {"reachable": {1, 2, 3}, "online": {1, 2, 3}, "busy": set()}
    expected = reference_diff(meta, targets, ref, **args)
    assert expected.repairs, "a repair is due"
    assert flat(diff(meta, targets, new, **args)) == flat(expected)
