"""``checkers.whole`` (a collection held exactly as recorded, decided by whole groups) changes nothing: on random
states that are held as recorded or one step from it, ``diff`` and ``diff_async`` over what ``distribution``
collects (groups included) give what the rules written once give (``reference_diff``), and the whole path is
taken exactly when nothing differs.

States are written through a real query meta on the suite's etcd; the nodes' reports go through the collector's
own ``_Fill`` as GetDataDistribution groups.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.client import EtcdClient
from meta.kv import MetaKV
from proto import data_pb2, querynode_pb2
from querycoord.checkers import diff, diff_async
from querycoord.checkers.distribution import Held, _Fill
from querycoord.common.target import Target, TargetSegment
from querycoord.querymeta import QueryMeta
from tests.cluster import QueryCluster, until, wait_until
from tests.test_checker_diff_paths import FOREIGN_REPLICA, NODES, RefHeld, flat, reference_diff

PERTURBATIONS = [
    None, None, None,  # held exactly as recorded: the whole path
    "missing copy", "stray copy on another node", "stale record", "target segment without a record",
    "second holder", "recorded on another node", "recorded under another replica", "reported twice by its node",
    "reported under another partition", "silent node", "held outside the target", "target partition not loaded",
    "recorded in another collection", "a second copy recorded",
]


@dataclass
class WholeState:
    cid: int
    replicas: list[data_pb2.ReplicaInfo]  # [] = loaded before replicas
    partitions: list[int]
    saves: list[list[data_pb2.SegmentInfo]]
    target: Target
    reports: list[tuple[int, int, int, int]]  # (node, segment, collection, partition)
    online: set[int]
    reachable: set[int]
    perturbation: str | None
    other_records: list[data_pb2.SegmentInfo] = field(default_factory=list)


@st.composite
def whole_states(draw: st.DrawFn) -> WholeState:
    cid = 1
    legacy = draw(st.integers(0, 3)) == 0
    members = [] if legacy else sorted(draw(st.sets(st.sampled_from(NODES), min_size=1)))
    replicas = [] if legacy else [data_pb2.ReplicaInfo(replica_id=1, collection_id=cid, node_ids=members)]
    replica = 0 if legacy else 1
    partitions = [10 + j for j in range(draw(st.integers(1, 3)))]
    segments = {100 + i: draw(st.sampled_from(partitions)) for i in range(draw(st.integers(1, 8)))}
    placed = {sid: draw(st.sampled_from(members or NODES)) for sid in segments}
    perturbation = draw(st.sampled_from(PERTURBATIONS))
    victim = draw(st.sampled_from(sorted(segments)))
    other = draw(st.sampled_from([n for n in NODES if n != placed[victim]]))
    saves: list[list[data_pb2.SegmentInfo]] = [[], []]
    records = dict(placed)
    record_replica = {sid: replica for sid in segments}
    if perturbation == "recorded on another node":
        records[victim] = other
    if perturbation == "recorded under another replica":
        record_replica[victim] = FOREIGN_REPLICA
    for sid, pid in segments.items():
        if perturbation == "target segment without a record" and sid == victim:
            continue
        saves[0].append(data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=pid,
                                             node_id=records[sid], replica_id=record_replica[sid]))
    if perturbation == "a second copy recorded":
        saves[1].append(data_pb2.SegmentInfo(segment_id=victim, collection_id=cid, partition_id=segments[victim],
                                             node_id=other, replica_id=FOREIGN_REPLICA))
    other_records = []
    if perturbation == "recorded in another collection":
        other_records.append(data_pb2.SegmentInfo(segment_id=victim, collection_id=2, partition_id=20,
                                                  node_id=placed[victim], replica_id=replica))
    if perturbation == "stale record":
        saves[0].append(data_pb2.SegmentInfo(segment_id=150, collection_id=cid, partition_id=partitions[0],
                                             node_id=placed[victim], replica_id=replica))
    target = Target(channels=set())
    for sid, pid in segments.items():
        target.segments[sid] = target.partitions.setdefault(pid, {})[sid] = TargetSegment(sid, pid)
    for pid in partitions:
        target.partitions.setdefault(pid, {})
    if perturbation == "target partition not loaded":
        target.segments[160] = target.partitions.setdefault(99, {})[160] = TargetSegment(160, 99)
    reports, online, reachable = _reports(placed, segments, perturbation, victim, other)
    if perturbation == "recorded in another collection":
        saves[0] = [s for s in saves[0] if s.segment_id != victim]
    return WholeState(cid, replicas, partitions, saves, target, reports, online, reachable, perturbation,
                      other_records)


def _reports(placed: dict[int, int], segments: dict[int, int], perturbation: str | None, victim: int,
             other: int) -> tuple[list[tuple[int, int, int, int]], set[int], set[int]]:
    """What the nodes report of collection 1 (each segment by the node it is placed on, but for the perturbation),
    and the online and reachable nodes."""
    cid = 1
    reports = [(placed[sid], sid, cid, pid) for sid, pid in segments.items()
               if not (perturbation == "missing copy" and sid == victim)]
    if perturbation == "stray copy on another node" or perturbation == "second holder":
        reports.append((other, victim, cid, segments[victim]))
    if perturbation == "reported twice by its node":  # in two groups (a group's own ids are a set)
        reports.append((placed[victim], victim, cid, 97))
    if perturbation == "reported under another partition":
        reports = [(n, s, c, 98 if s == victim else p) for n, s, c, p in reports]
    if perturbation == "held outside the target":
        reports.append((placed[victim], 170, cid, segments[victim]))
    online = set(NODES)
    reachable = set(online)
    if perturbation == "silent node":
        reachable.discard(placed[victim])
        reports = [r for r in reports if r[0] != placed[victim]]
    return reports, online, reachable


async def collected(reports: list[tuple[int, int, int, int]]) -> Held:
    """What ``distribution`` collects of ``reports``: each node's groups (collection, partition), in order."""
    fill = _Fill(set())
    for node in sorted({r[0] for r in reports}):
        groups: dict[tuple[int, int], list[int]] = {}
        for n, sid, cid, pid in reports:
            if n == node:
                groups.setdefault((cid, pid), []).append(sid)
        await fill.groups(node, [querynode_pb2.SegmentIdGroup(collection_id=c, partition_id=p, segment_ids=ids)
                                 for (c, p), ids in groups.items()])
    return fill.held


def reference_held(reports: list[tuple[int, int, int, int]]) -> RefHeld:
    ref = RefHeld()
    for node, sid, cid, pid in reports:
        ref.segments.setdefault(sid, set()).add(node)
        ref.segment_collection[sid] = (cid, pid)
    return ref


class Spy:
    """Counts the whole path's answers (``checkers.diff`` calls ``held_as_recorded``)."""

    def __init__(self) -> None:
        self.module = sys.modules["querycoord.checkers.diff"]  # the module: the package exports the function
        self.real = self.module.held_as_recorded
        self.taken = 0

    def __enter__(self) -> Spy:
        def spied(*args: Any) -> Any:
            whole = yield from self.real(*args)
            self.taken += bool(whole)
            return whole

        self.module.held_as_recorded = spied
        return self

    def __exit__(self, *_exc: object) -> None:
        self.module.held_as_recorded = self.real


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(state=whole_states(), every=st.integers(0, 3))
def test_the_whole_path_gives_what_the_rules_give(on_etcd: tuple[asyncio.AbstractEventLoop, EtcdClient],
                                                  state: WholeState, every: int) -> None:
    loop, client = on_etcd

    async def run() -> None:
        meta = QueryMeta(MetaKV(client, f"test/whole-{uuid.uuid4().hex[:12]}"))
        await meta.reload()
        await meta.add_collection(state.cid, data_pb2.LOAD_TYPE_PARTITION, state.partitions,
                                  replicas=state.replicas)
        if state.other_records:
            await meta.add_collection(2, data_pb2.LOAD_TYPE_PARTITION, [20],
                                      replicas=[data_pb2.ReplicaInfo(replica_id=1, collection_id=2,
                                                                     node_ids=list(NODES))])
            await meta.save_segments(state.other_records)
        for rnd in state.saves:
            if rnd:
                await meta.save_segments(rnd)
        targets = {state.cid: state.target}
        held, ref = await collected(state.reports), reference_held(state.reports)
        args: dict[str, Any] = {"reachable": state.reachable, "online": state.online, "busy": set()}
        expected = flat(reference_diff(meta, targets, ref, **args))
        with Spy() as spy:
            assert flat(diff(meta, targets, held, **args)) == expected
            assert flat(await diff_async(meta, targets, held, every=every, **args)) == expected
        if state.perturbation is None:
            assert spy.taken == 2, "held exactly as recorded: decided by whole groups"
        else:
            assert spy.taken == 0, f"{state.perturbation}: the per-segment steps decide"
        await meta.kv.remove_prefix("")

    loop.run_until_complete(run())


async def test_a_new_leader_finds_what_a_node_lost_while_no_leader_watched(etcd: object, root_path: str) -> None:
    """A real failover: a collection of one replica held exactly as recorded (the new leader's first pass decides
    it by whole groups), except that one node lost a segment while no leader watched. The new leader's first pass
    finds it (the per-segment steps decide that collection) and the nodes hold everything again, by their own
    GetDataDistribution."""
    async with QueryCluster(etcd, root_path) as c:  # type: ignore[arg-type]
        first = await c.start_coordinator()
        await c.wait_leader()
        nodes = [await c.add_node() for _ in range(3)]
        whole = await c.create_collection("whole", partitions=2, segments=30)
        lossy = await c.create_collection("lossy", partitions=2, segments=30)
        for cid in (whole, lossy):
            await c.load_collection(cid)
        second = await c.start_coordinator()
        await c.wait_idle()
        await first.stop()
        c.coords.remove(first)
        victim = next(n for n in nodes if any(s.collection_id == lossy for s in n.state.segments.values()))
        lost = min(sid for sid, s in victim.state.segments.items() if s.collection_id == lossy)
        # Dropped by the node itself (its state, not a leader's call): no leader was told.
        assert victim.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=lossy,
                                                                                   segment_ids=[lost])) == 1
        with Spy() as spy:
            assert await c.wait_leader() is second
            lead = second.coord.leadership
            assert lead is not None
            await wait_until(lambda: lead.checker.passes >= 1, "the new leader's first pass")
            assert spy.taken >= 1, "the whole collection was decided by whole groups"

        def held(cid: int) -> set[int]:
            """What the nodes themselves report of collection ``cid`` (their GetDataDistribution)."""
            return {s.segment_id for dist in c.distribution().values() for s in dist.segments
                    if s.collection_id == cid}

        await until("the lost segment held again", lambda: asyncio.sleep(0, lost in held(lossy)))
        await c.wait_idle()
        assert held(lossy) == set(lead.meta.segment_id_set(lossy)) and len(held(lossy)) == 30
        assert held(whole) == set(lead.meta.segment_id_set(whole)) and len(held(whole)) == 30
        await c.wait_loaded(lossy)
        await c.wait_loaded(whole)
