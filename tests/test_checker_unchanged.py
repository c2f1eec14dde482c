"""Skipping unchanged collections (``checkers.unchanged``): a pass that skips gives what a pass comparing everything
gives, over random sequences of changes to a real query meta, real node states and the targets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.client import EtcdClient
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import data_pb2, querynode_pb2
from querycoord.checkers import Checker, Diff, Held, diff
from querycoord.checkers.distribution import NodeReport, _Fill, _report_of
from querycoord.checkers.unchanged import Unchanged
from querycoord.common.target import Target, TargetSegment
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode_state import QueryNodeState
from querycoord.querymeta import QueryMeta
from tests.cluster import QueryCluster, running_cluster, wait_until

COLL = data_pb2.LOAD_TYPE_COLLECTION
NODES = (1, 2, 3)
REPLICA = 7  # collection 1's one replica (nodes 1-3); collection 2 was loaded before replicas (replica 0)


def load(state: QueryNodeState, cid: int, pid: int, sids: list[int]) -> None:
    state.load_segments(querynode_pb2.LoadSegmentsRequest(node_id=state.node_id, collection_id=cid, infos=[
        data_pb2.SegmentLoadInfo(segment_id=s, collection_id=cid, partition_id=pid, mem_size=1) for s in sids]))


@dataclass
class World:
    """What a pass reads: query meta, the nodes' states (those ``online`` answer), the targets and their marks."""

    meta: QueryMeta
    nodes: dict[int, QueryNodeState] = field(default_factory=dict)
    online: set[int] = field(default_factory=lambda: set(NODES))
    targets: dict[int, Target] = field(default_factory=dict)
    target_marks: dict[int, int] = field(default_factory=dict)
    loads: dict[int, list[tuple[int, int, list[int]]]] = field(default_factory=dict)  # node -> its loads, in order
    next_id: int = 1000

    def node_load(self, node: int, cid: int, pid: int, sids: list[int]) -> None:
        load(self.nodes[node], cid, pid, sids)
        self.loads.setdefault(node, []).append((cid, pid, sids))


async def build(meta: QueryMeta) -> World:
    w = World(meta)
    for n in NODES:
        w.nodes[n] = QueryNodeState(1 << 30, n)
    await meta.add_collection(1, COLL, [10], replicas=[
        data_pb2.ReplicaInfo(replica_id=REPLICA, collection_id=1, node_ids=list(NODES))])
    await meta.add_collection(2, COLL, [20])
    for cid, pid, replica in ((1, 10, REPLICA), (2, 20, 0)):
        sids = [cid * 100 + i for i in range(6)]
        w.targets[cid] = Target(segments={s: TargetSegment(s, pid) for s in sids}, channels=set())
        records = []
        for i, s in enumerate(sids):
            node = NODES[i % len(NODES)]
            records.append(data_pb2.SegmentInfo(segment_id=s, collection_id=cid, partition_id=pid, node_id=node,
                                                replica_id=replica, state=data_pb2.SEGMENT_STATE_SEALED))
            w.node_load(node, cid, pid, [s])
        await meta.save_segments(records)
    return w


def collect(w: World, known: dict[int, tuple[int, dict[int, int]]]) -> tuple[Held, set[int], dict[int, NodeReport]]:
    """``distribution.collect_reports`` without the transport: each online node's own answer."""
    fill = _Fill(set())
    reports: dict[int, NodeReport] = {}
    for n in sorted(w.online):
        incarnation, versions = known.get(n, (0, {}))
        dist = w.nodes[n].distribution(ids_only=True, incarnation=incarnation, known=versions)
        reports[n] = _report_of(dist, known.get(n))
        for g in dist.segment_groups:
            for sid in g.segment_ids:
                fill.held.segments.add(sid, n)
                fill.held.segment_collection[sid] = (g.collection_id, g.partition_id)
        fill.channels(n, dist.channels)
    return fill.held, set(reports), reports


def a_pass(w: World, unchanged: Unchanged) -> tuple[Diff, set[int]]:
    """One pass as the driver makes it (marks, candidates, collect, settle, compare, remember)."""
    meta = w.meta
    cids = meta.collection_ids()
    online = frozenset(w.online)
    marks: dict[int, Hashable] = {c: (meta.change_mark(c), w.target_marks.get(c, 0), online) for c in cids}
    candidates = unchanged.candidates(marks)
    held, reachable, reports = collect(w, unchanged.known(candidates))
    skip, again = unchanged.settle(candidates, reports, set(NODES), held.channels)
    if again:
        held, reachable, reports = collect(w, {})
        skip = set()
    targets = {c: t for c, t in w.targets.items() if c in cids and c not in skip}
    d = diff(meta, targets, held, reachable=reachable, online=set(NODES), busy=skip)
    unchanged.after(list(targets), d, marks, reports, set(NODES), held.channels, set(cids), cids)
    return d, skip


def flat(d: Diff, skip: set[int]) -> tuple[object, ...]:
    return (sorted((c, r.SerializeToString()) for c, r in d.repairs.items() if c not in skip),
            sorted((c, sorted(p.items())) for c, p in d.progress.items() if c not in skip),
            sorted((c, sorted(p.items())) for c, p in d.replica_progress.items() if c not in skip))


def whole(d: Diff, cid: int) -> bool:
    return (cid not in d.repairs and all(h == t for h, t in d.progress[cid].values())
            and all(h == t for h, t in d.replica_progress[cid].values()))


async def change(w: World, op: tuple[str, int, int]) -> None:
    """One change, behind the coordinator's back or through its records."""
    kind, a, b = op
    node = NODES[a % len(NODES)]
    cid = 1 + b % 2
    state = w.nodes[node]
    if kind == "lose":  # the node drops a segment by itself
        held = sorted(state.segments)
        if held:
            state.release_segments(querynode_pb2.ReleaseSegmentsRequest(segment_ids=[held[b % len(held)]]))
    elif kind == "heal":  # the node loads what the records place on it again
        for c, t in w.targets.items():
            pid = next(iter(meta_pids)) if (meta_pids := w.meta.partition_ids(c)) else 0
            mine = [s for s in t.segments if node in w.meta.segment_copies(s).values() and s not in state.segments]
            if mine and pid:
                w.node_load(node, c, pid, mine)
    elif kind == "stray":  # the node loads a segment of no target
        w.next_id += 1
        w.node_load(node, cid, cid * 10, [w.next_id])
    elif kind == "restart":  # restarted under its id, loading the same as before: the same version numbers
        fresh = QueryNodeState(1 << 30, node)
        for c, pid, sids in w.loads.get(node, []):
            load(fresh, c, pid, sids)
        w.nodes[node] = fresh
    elif kind == "silent":
        w.online.discard(node)
    elif kind == "back":
        w.online.add(node)
    else:
        await record_change(w, kind, a, cid)


async def record_change(w: World, kind: str, a: int, cid: int) -> None:
    """A change of the targets or of query meta."""
    node = NODES[a % len(NODES)]
    if kind == "target_add" and cid in w.targets:
        w.next_id += 1
        w.targets[cid].segments[w.next_id] = TargetSegment(w.next_id, cid * 10)
        w.target_marks[cid] = w.target_marks.get(cid, 0) + 1
    elif kind == "target_drop" and cid in w.targets and w.targets[cid].segments:
        sids = sorted(w.targets[cid].segments)
        del w.targets[cid].segments[sids[a % len(sids)]]
        w.target_marks[cid] = w.target_marks.get(cid, 0) + 1
    elif kind == "forget_record":
        sids = w.meta.segment_ids_of(cid)
        if sids:
            await w.meta.remove_segments([sids[a % len(sids)]])
    elif kind == "forget_node":  # a node's records and replica membership go
        await w.meta.remove_node(node)
    elif kind == "release" and w.meta.has_collection(cid):
        await w.meta.release_collection(cid)
        w.targets.pop(cid, None)
        w.target_marks[cid] = w.target_marks.get(cid, 0) + 1


OPS = st.tuples(st.sampled_from(["noop", "lose", "heal", "stray", "restart", "silent", "back", "target_add",
                                 "target_drop", "forget_record", "forget_node", "release"]),
                st.integers(0, 5), st.integers(0, 5))



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=12))
def test_a_pass_that_skips_finds_what_a_full_pass_finds(on_etcd: tuple[asyncio.AbstractEventLoop, EtcdClient],
                                                         ops: list[tuple[str, int, int]]) -> None:
    loop, client = on_etcd

    async def run() -> None:
        meta = QueryMeta(MetaKV(client, f"test/unchanged-{uuid.uuid4().hex[:12]}"))
        await meta.reload()
        w = await build(meta)
        skipping = Unchanged()
        d, skip = a_pass(w, skipping)
        assert not skip and whole(d, 1) and whole(d, 2), "everything held as recorded: nothing to do"
        for op in [("noop", 0, 0), *ops]:
            await change(w, op)
            for _ in range(2):  # a second pass over the same state: skipping what the first found whole
                full, _ = a_pass(w, Unchanged(enabled=False))
                d, skip = a_pass(w, skipping)
                assert flat(d, skip) == flat(full, skip), f"after {op}: a compared collection differs"
                for cid in skip:
                    assert whole(full, cid), f"after {op}: collection {cid} skipped, but a full pass finds work"
        if not ops:
            assert skip == {1, 2}, "nothing changed: both collections skipped"
        await meta.kv.remove_prefix("")

    loop.run_until_complete(run())


def test_a_node_leaves_out_only_what_it_was_told_and_only_for_its_own_incarnation() -> None:
    state = QueryNodeState(1 << 30, 4)
    load(state, 1, 10, [100, 101])
    load(state, 2, 20, [200])
    full = state.distribution(ids_only=True)
    versions = {v.collection_id: v.version for v in full.versions}
    assert set(versions) == {1, 2} and full.incarnation
    asked = state.distribution(ids_only=True, incarnation=full.incarnation, known={1: versions[1]})
    assert [g.collection_id for g in asked.segment_groups] == [2], "collection 1 is unchanged: left out"
    other = state.distribution(ids_only=True, incarnation=full.incarnation + 1, known={1: versions[1]})
    assert [g.collection_id for g in other.segment_groups] == [1, 2], "another incarnation: everything"
    state.release_segments(querynode_pb2.ReleaseSegmentsRequest(segment_ids=[101]))
    moved = state.distribution(ids_only=True, incarnation=full.incarnation, known={1: versions[1]})
    assert [list(g.segment_ids) for g in moved.segment_groups] == [[100], [200]], "collection 1 moved: sent"
    restarted = QueryNodeState(1 << 30, 4)
    load(restarted, 1, 10, [100, 101])
    again = restarted.distribution(ids_only=True, incarnation=full.incarnation, known={1: versions[1]})
    assert restarted.versions[1] == versions[1], "the same loads give the same version number"
    assert [g.collection_id for g in again.segment_groups] == [1], "a restarted node is another incarnation"


def test_a_node_leaves_out_the_collections_the_asker_skips_and_answers_every_version() -> None:
    state = QueryNodeState(1 << 30, 5)
    load(state, 1, 10, [100, 101])
    load(state, 2, 20, [200])
    skipped = state.distribution(ids_only=True, skip=[1])
    assert [g.collection_id for g in skipped.segment_groups] == [2], "collection 1 skipped: left out"
    assert {v.collection_id for v in skipped.versions} == {1, 2}, "versions in full"
    both = state.distribution(ids_only=True, skip=[1, 2, 3])
    assert not both.segment_groups and {v.collection_id for v in both.versions} == {1, 2}
    infos = state.distribution(skip=[1])  # a full answer (SegmentInfo each) leaves nothing out
    assert {s.segment_id for s in infos.segments} == {100, 101, 200}


def whole_on_nodes(c: QueryCluster, cid: int, count: int) -> bool:
    """Every segment of the collection held by exactly one node, as the nodes themselves report it."""
    held: list[int] = []
    for n in c.nodes:
        if not n.healthy:
            continue
        dist = n.state.distribution(ids_only=True)
        held += [s for g in dist.segment_groups if g.collection_id == cid for s in g.segment_ids]
    return len(held) == len(set(held)) == count


async def one_pass(checker: Checker) -> None:
    runs = checker.runs
    checker.kick()
    await wait_until(lambda: checker.passes > runs, "a pass")


async def steady(c: QueryCluster, coord: int = 0) -> Leadership:
    """The leader (``c.coords[coord]``) after passes that skipped the collection (found whole, and unchanged)."""
    lead = c.coords[coord].coord.leadership
    assert lead is not None and lead.checker is not None
    checker = lead.checker
    skipped = checker.unchanged.skipped
    for _ in range(3):
        await one_pass(checker)
    await wait_until(lambda: checker.unchanged.skipped > skipped, "a pass that skipped the unchanged collection")
    return lead


async def test_a_segment_a_node_dropped_by_itself_is_repaired_though_nothing_else_changed(
        etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None, None], checker_interval=0.3) as c:
        cid = await c.create_collection("dropped", partitions=2, segments=10)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = await steady(c)
        node = max(c.nodes, key=lambda n: len(n.state.segments))
        lost = sorted(node.state.segments)[:2]
        node.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=lost))
        await wait_until(lambda: lead.checker.repairs > 0, "the next pass found the dropped copies")
        await c.wait_idle()
        held = {s for n in c.nodes for g in n.state.distribution(ids_only=True).segment_groups for s in g.segment_ids}
        assert set(lost) <= held, "the dropped segments are held again"
        assert whole_on_nodes(c, cid, 10)


async def test_a_node_restarted_under_its_id_with_the_same_version_is_not_skipped(
        etcd: EtcdCluster, root_path: str) -> None:
    """A node whose process was replaced under its session, holding less but reporting the very version numbers
    of its last run: its new incarnation tells the pass it must look."""
    async with running_cluster(etcd, root_path, [None, None], checker_interval=0.3) as c:
        cid = await c.create_collection("restarted", partitions=1, segments=6)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = await steady(c)
        victim = c.nodes[1]
        before = victim.state
        # The node's process is replaced by a fresh one behind the coordinator's back, under the same session: it
        # holds one segment, loaded once (its version of the collection may well equal the old one).
        fresh = QueryNodeState(before.capacity_bytes, before.node_id)
        fresh.fence = before.fence
        one = min(before.segments)
        load(fresh, cid, before.segments[one].partition_id, [one])
        fresh.versions = dict(before.versions)  # the very version numbers of the old run
        victim.state = fresh
        repairs = lead.checker.repairs
        await wait_until(lambda: lead.checker.repairs > repairs, "the pass compared the restarted node's collection")
        await c.wait_idle()
        assert whole_on_nodes(c, cid, 6)


async def test_a_new_leader_compares_what_the_old_one_skipped(etcd: EtcdCluster, root_path: str) -> None:
    """What a pass skips is this leadership's memory only: a copy dropped as the leader changes is repaired by
    the new leader, whose first pass compares everything."""
    async with QueryCluster(etcd, root_path) as c:
        c.config.checker_interval = 0.3
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node()
        cid = await c.create_collection("switched", partitions=1, segments=8)
        await c.load_collection(cid)
        await c.wait_idle()
        await steady(c)
        await c.start_coordinator()
        node = max(c.nodes, key=lambda n: len(n.state.segments))
        lost = min(node.state.segments)
        await c.coords[0].stop()
        node.state.release_segments(querynode_pb2.ReleaseSegmentsRequest(collection_id=cid, segment_ids=[lost]))
        new = await c.wait_leader()
        assert new is c.coords[1]
        await wait_until(lambda: whole_on_nodes(c, cid, 8), "the new leader reloaded the dropped copy")
        await c.wait_idle()
        lead = await steady(c, 1)
        assert lead.checker.repairs >= 1 and whole_on_nodes(c, cid, 8)
