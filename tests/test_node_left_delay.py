"""Delayed re-replication: a lost node whose collections all keep a whole replica is forgotten only after
``node_left_delay``; back in time under its id, it is loaded again itself and nothing moves elsewhere; a collection
with no other whole replica is repaired at once; the delay survives a leader change."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from pytest import MonkeyPatch

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querynode_pb2
from proto import querycoord_pb2 as qc
from querycoord.checkers import left as left_module
from querycoord.checkers.left import LeftNodes
from querycoord.metatool import snapshot
from querycoord.metatool.verify import verify
from querycoord.nodes.querynode import QueryNode
from querycoord.querymeta import QueryMeta
from tests.cluster import QueryCluster, wait_until

SEGMENTS = 40


async def _two_replicas(c: QueryCluster, tmp_path: Path, delay: float) -> tuple[int, int, QueryNode, QueryNode]:
    """A collection with two replicas, one on a node process (id 901, to kill) and one on an in-process node, and a
    spare in-process node that joins after the load. Returns (collection, the process's node id, kept, spare)."""
    c.config.node_left_delay = delay
    await c.start_coordinator()
    await c.wait_leader()
    kept = await c.add_node()
    await c.start_node_process("--node-id", "901", log_dir=tmp_path)
    cid = await c.create_collection("delayed", partitions=2, segments=SEGMENTS)
    assert c.client is not None
    r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=2))
    assert r.status.error_code == common_pb2.SUCCESS, r
    await c.wait_loaded(cid, timeout=90)
    spare = await c.add_node()
    await c.wait_node_online(spare.node_id)
    return cid, 901, kept, spare


async def _held_by(c: QueryCluster, node_id: int) -> set[int]:
    lead = (await c.wait_leader()).coord.leadership
    assert lead is not None
    if not lead.nodes.is_online(node_id):
        return set()
    resp = await lead.nodes.client(node_id).call("GetDataDistribution", querynode_pb2.GetDataDistributionRequest())
    return {s.segment_id for s in resp.segments}


async def _shown_state(c: QueryCluster, node_id: int) -> qc.NodeInfo | None:
    assert c.client is not None
    resp = await c.client.query("ShowNodes", qc.ShowNodesRequest())
    return next((n for n in resp.nodes if n.node_id == node_id), None)


async def test_node_back_within_the_delay_is_loaded_again_and_nothing_moves(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        cid, victim, kept, spare = await _two_replicas(c, tmp_path, delay=120)
        kept_before = set(kept.state.segments)
        assert len(kept_before) == SEGMENTS and not spare.state.segments
        lead = c.coords[0].coord.leadership
        assert lead is not None and lead.left is not None
        proc = c.procs[-1]
        await proc.kill()
        await wait_until(lambda: victim in lead.left.left, "the lost node waits for its re-replication")
        info = await _shown_state(c, victim)
        assert info is not None and info.state.startswith("left, re-replication in") and info.rereplicate_at_ms
        explained = await c.client.query("Explain", qc.ExplainRequest(collection_id=cid))  # type: ignore[union-attr]
        assert any(f"node {victim} left, re-replication in" in u.reason_text for u in explained.units), explained
        # It is still its replica's member, and nothing is loaded elsewhere meanwhile (several checker passes).
        runs = lead.checker.runs
        await wait_until(lambda: lead.checker.runs >= runs + 3, "three checker passes")
        assert victim in lead.meta.replica_node_ids(cid)
        assert not spare.state.segments and spare.in_flight["LoadSegments"] == 0
        # What is recorded (and what a standby shows) is what nodes hold: the lost node's replica is not whole.
        shown = {r.replica_id: r.in_memory_percentage for r in lead.meta.replicas_of(cid)}
        gone_replica = lead.meta.replica_of_node(cid, victim)
        assert shown[gone_replica] < 100 and all(p == 100 for r, p in shown.items() if r != gone_replica), shown
        # The record of when it left is a key `meta verify` knows.
        assert c.kv is not None
        unknown = [p for p in verify(await snapshot.take(c.kv)) if p.kind == "unknown-key"]
        assert not unknown, unknown
        await c.start_node_process("--node-id", str(victim), log_dir=tmp_path)
        await wait_until(lambda: victim not in lead.left.left, "the node is taken back")
        await c.wait_loaded(cid, timeout=90)
        assert await _held_by(c, victim) == kept_before
        assert not spare.state.segments, "nothing was loaded on the spare"
        assert set(kept.state.segments) == kept_before
        assert spare.peak_in_flight["LoadSegments"] == 0
        assert not (await c.kv.load_prefix("queryCoord-nodeLeft/")).kvs  # type: ignore[union-attr]


async def test_node_not_back_in_time_is_re_replicated_after_the_delay(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        cid, victim, kept, spare = await _two_replicas(c, tmp_path, delay=4)
        lead = c.coords[0].coord.leadership
        assert lead is not None and lead.left is not None
        await c.procs[-1].kill()
        await wait_until(lambda: victim in lead.left.left, "the lost node waits for its re-replication")
        assert not spare.state.segments
        await wait_until(lambda: len(spare.state.segments) == SEGMENTS, "the spare took the lost replica's copies",
                         timeout=90)
        assert victim not in lead.left.left and victim not in lead.meta.replica_node_ids(cid)
        assert len(kept.state.segments) == SEGMENTS


async def test_collection_without_another_whole_replica_is_repaired_at_once(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.node_left_delay = 600
        await c.start_coordinator()
        await c.wait_leader()
        kept = await c.add_node()
        proc, ready = await c.start_node_process(log_dir=tmp_path)
        cid = await c.create_collection("single", partitions=2, segments=SEGMENTS)
        await c.load_collection(cid, timeout=90)
        lead = c.coords[0].coord.leadership
        assert lead is not None and lead.left is not None
        assert lead.meta.segments_on_node(ready["node_id"]), "the node to kill holds copies"
        await proc.kill()
        await wait_until(lambda: len(kept.state.segments) == SEGMENTS, "the survivor holds every segment",
                         timeout=90)
        assert ready["node_id"] not in lead.left.left


async def test_the_delay_survives_a_leader_change(etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.scheduler.max_recoveries_per_node = 3
        cid, victim, _kept, spare = await _two_replicas(c, tmp_path, delay=120)
        await c.start_coordinator()
        first = c.coords[0]
        lead = first.coord.leadership
        assert lead is not None and lead.left is not None
        await c.procs[-1].kill()
        await wait_until(lambda: victim in lead.left.left, "the lost node waits for its re-replication")
        left_at = lead.left.left[victim]
        await first.stop()
        second = c.coords[1]
        await wait_until(lambda: second.coord.leadership is not None, "the standby took over")
        new = second.coord.leadership
        assert new is not None and new.left is not None
        assert new.left.left.get(victim) == left_at, "the delay counts from when the node left"
        assert new.env.throttle.budgets["recovery"].per_node == 3
        info = await _shown_state(c, victim)
        assert info is not None and info.state.startswith("left, re-replication in")
        runs = new.checker.runs
        await wait_until(lambda: new.checker.runs >= runs + 2, "two checker passes of the new leader")
        assert not spare.state.segments and victim in new.meta.replica_node_ids(cid)


async def test_two_forgets_holding_one_node_at_once_record_one_time(kv: MetaKV, monkeypatch: MonkeyPatch) -> None:
    """The session watch's forget and a checker pass's may hold one lost node at once. Both must take the time the
    first one recorded: the second once wrote its own a millisecond later, so a new leader counted the delay from
    another time than the old one had (CI saw ``...108 == ...109``)."""
    clock = iter(range(1_000_000, 1_000_100))
    monkeypatch.setattr(left_module, "time", SimpleNamespace(time=lambda: next(clock) / 1000))
    left = LeftNodes(kv, delay=120)
    meta = QueryMeta(kv)
    held = await asyncio.gather(left.hold(901, meta, None), left.hold(901, meta, None))
    assert held == [True, True]
    assert left.left == {901: 1_000_000}, "the second hold took the first one's time"
    fresh = LeftNodes(kv, delay=120)
    await fresh.load()
    assert fresh.left == left.left, "what a new leader loads is what the old one counts from"
