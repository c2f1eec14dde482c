"""A lost node's repair is queued by its forget, from what query meta places on it: on a real cluster (real etcd,
in-process gRPC query nodes, the victim a real node process killed with SIGKILL).

What must hold, as the query nodes themselves report it (their GetDataDistribution, each load they carried out):
with the checker's loop stopped the lost copies and DM channel watches are loaded again elsewhere (only the forget
can have queued that repair); with the checker running too, every segment is loaded once, not by the forget's
repair and again by a pass's; a node lost within its re-replication delay is not repaired by the forget; and a
leader stopped after the forget queued the repair, before it could end, leaves the new leader to finish it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from proto import querynode_pb2
from querycoord.common.messages import load_items
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode import QueryNode
from querycoord.nodes.querynode_faults import FaultConfig, FaultInjector
from querycoord.task.store import TASK_PREFIXES
from tests.cluster import QueryCluster, fast_scheduler, until, wait_until
from tests.truth import target_of

VICTIM = 901


def leadership(c: QueryCluster, index: int = 0) -> Leadership:
    lead = c.coords[index].coord.leadership
    assert lead is not None
    return lead


async def pause_checker(lead: Leadership) -> None:
    """Stop the leader's checker loop and what kicks it: no pass runs any more (the forget's repair still may)."""
    loops = [t for t in lead.tasks if t.get_name() in ("checker", "checker-kicks")]
    for t in loops:
        t.cancel()
    await asyncio.gather(*loops, return_exceptions=True)


def count_loads(nodes: list[QueryNode]) -> Counter[int]:
    """Every segment the nodes load from now on, once per load each carries out (their own state's loads)."""
    loaded: Counter[int] = Counter()
    for node in nodes:
        inner: Callable[..., Any] = node.state.load_segments

        def counted(request: querynode_pb2.LoadSegmentsRequest, *args: Any, _inner: Callable[..., Any] = inner,
                    **kw: Any) -> None:
            _inner(request, *args, **kw)  # raises when the node refuses: nothing is counted then
            loaded.update(i.segment_id for i in load_items(request))

        node.state.load_segments = counted  # type: ignore[method-assign]
    return loaded


async def distribution(c: QueryCluster, node_id: int) -> querynode_pb2.GetDataDistributionResponse:
    """What ``node_id`` answers to GetDataDistribution, asked by the leader's client."""
    lead = (await c.wait_leader()).coord.leadership
    assert lead is not None
    resp: querynode_pb2.GetDataDistributionResponse = await lead.nodes.client(node_id).call(
        "GetDataDistribution", querynode_pb2.GetDataDistributionRequest())
    return resp


def dm_channels(dist: querynode_pb2.GetDataDistributionResponse, cid: int) -> set[str]:
    """The DM channels of collection ``cid`` a node reports watching."""
    return {ch.channel_name for ch in dist.channels
            if ch.collection_id == cid and ch.kind == querynode_pb2.CHANNEL_KIND_DM}


async def shown_percentage(c: QueryCluster, cid: int) -> int:
    assert c.client is not None
    show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    assert show.status.error_code == 0, show.status
    return int(show.collections[0].in_memory_percentage)


async def loaded_with_victim(c: QueryCluster, tmp_path: Path, *, replicas: int = 1,
                             segment_count: int = 36) -> tuple[int, set[int], set[str]]:
    """Two in-process nodes per replica and node process ``VICTIM``; a collection loaded over them. Returns the
    collection and the segments and DM channels the victim holds (its own GetDataDistribution)."""
    await c.start_coordinator()
    await c.wait_leader()
    for _ in range(2 * replicas):
        await c.add_node()
    await c.start_node_process("--node-id", str(VICTIM), log_dir=tmp_path)
    cid = await c.create_collection("lost", partitions=2, segments=segment_count, channels=3)
    assert c.client is not None
    r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid, replica_number=replicas))
    assert r.status.error_code == 0, r
    await c.wait_loaded(cid, timeout=90)
    await c.wait_idle()
    dist = await distribution(c, VICTIM)
    segments = {s.segment_id for s in dist.segments if s.collection_id == cid}
    channels = dm_channels(dist, cid)
    assert segments and channels, "the load gave the victim segments and DM channels"
    return cid, segments, channels


async def kill_victim(c: QueryCluster) -> None:
    proc = next(p for p in c.procs if p.node_id == VICTIM)
    await proc.kill()  # SIGKILL: its session lapses after its TTL


async def assert_held_once(c: QueryCluster, cid: int, replicas: int = 1) -> None:
    """Every target segment and DM channel is held ``replicas`` times over the nodes, as each node reports it, and
    the leader's records name the nodes that hold each copy."""
    target = await target_of(c, cid)
    segs: Counter[int] = Counter()
    chans: Counter[str] = Counter()
    for node in c.nodes:
        dist = await distribution(c, node.node_id)
        held = {s.segment_id for s in dist.segments if s.collection_id == cid}
        segs.update(held)
        chans.update(dm_channels(dist, cid))
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        assert held == {s.segment_id for s in lead.meta.segments_on_node(node.node_id) if s.collection_id == cid}
    assert segs == Counter({s: replicas for s in target[0]}), "each segment held once per replica"
    assert chans == Counter({ch: replicas for ch in target[1]}), "each DM channel watched once per replica"


async def test_a_lost_nodes_copies_are_repaired_by_its_forget_with_the_checker_stopped(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        cid, lost_segments, lost_channels = await loaded_with_victim(c, tmp_path)
        lead = leadership(c)
        await pause_checker(lead)
        runs = lead.checker.runs
        loads = count_loads(c.nodes)

        await kill_victim(c)
        target = await target_of(c, cid)

        async def whole() -> bool:
            held: set[int] = set()
            for node in c.nodes:
                held |= {s.segment_id for s in (await distribution(c, node.node_id)).segments}
            return target[0] <= held and await shown_percentage(c, cid) == 100

        await until("the survivors hold everything and the leader shows 100 %", whole, timeout=90)
        await c.wait_idle()
        assert lead.checker.runs == runs, "no checker pass ran: the forget queued the repair"
        assert loads == Counter({s: 1 for s in lost_segments}), "each lost copy loaded once, nothing else"
        await assert_held_once(c, cid)
        watched: set[str] = set()
        for node in c.nodes:
            watched |= dm_channels(await distribution(c, node.node_id), cid)
        assert lost_channels <= watched
        assert not lead.meta.segments_on_node(VICTIM) and VICTIM not in lead.meta.known_node_ids()


async def test_with_the_checker_running_each_lost_copy_is_loaded_once(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.checker_interval = 0.2  # passes run all along the repair
        cid, lost_segments, _ = await loaded_with_victim(c, tmp_path, replicas=2)
        lead = leadership(c)
        loads = count_loads(c.nodes)
        runs = lead.checker.runs

        await kill_victim(c)
        await wait_until(lambda: VICTIM not in lead.meta.bound_node_ids(), "the leader forgot the lost node")
        await until("the leader shows the collection at 100 %", lambda: _is_100(c, cid), timeout=90)
        await c.wait_idle()
        await wait_until(lambda: lead.checker.runs >= runs + 5, "passes ran meanwhile and after")
        await c.wait_idle()
        assert loads == Counter({s: 1 for s in lost_segments}), "each lost copy loaded once, by one repair"
        await assert_held_once(c, cid, replicas=2)


async def _is_100(c: QueryCluster, cid: int) -> bool:
    return await shown_percentage(c, cid) == 100


async def test_a_node_lost_within_its_re_replication_delay_is_not_repaired_by_its_forget(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler()) as c:
        c.config.node_left_delay = 600
        cid, lost_segments, _ = await loaded_with_victim(c, tmp_path, replicas=2)
        lead = leadership(c)
        assert lead.left is not None
        loads = count_loads(c.nodes)
        repairs = lead.checker.repairs

        await kill_victim(c)
        await wait_until(lambda: VICTIM in lead.left.left, "the lost node waits for its re-replication")  # type: ignore[union-attr]
        runs = lead.checker.runs
        await wait_until(lambda: lead.checker.runs >= runs + 3, "three checker passes")
        assert not lead.scheduler.triggers and lead.checker.repairs == repairs, "nothing was queued"
        assert not loads, "nothing was loaded elsewhere"
        assert VICTIM in lead.meta.replica_node_ids(cid)
        assert {s.segment_id for s in lead.meta.segments_on_node(VICTIM)} == lost_segments


async def whole_under_the_next_leader(c: QueryCluster, cid: int, loads: Counter[int],
                                      lost_segments: Iterable[int]) -> None:
    """Stop leader c0 (the nodes' faults cleared) and wait for c1 to lead and show ``cid`` whole: every lost copy
    loaded once over both leaders (``loads``), each held once as the nodes report."""
    await c.coords[0].stop()
    for node in c.nodes:
        node.injector = FaultInjector(FaultConfig())
    new = await c.wait_leader()
    assert new is c.coords[1]
    await until("the new leader shows the collection at 100 %", lambda: _is_100(c, cid), timeout=90)
    await c.wait_idle()
    assert loads == Counter({s: 1 for s in lost_segments}), "each lost copy loaded once, over both leaders"
    await assert_held_once(c, cid)


async def test_a_leader_stopped_after_the_forget_queued_the_repair_leaves_it_to_the_next(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    # Slow retries: a refused load keeps the repair running for many seconds before it could fail.
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(retry_backoff=1.0, retry_backoff_max=2.0)) as c:
        cid, lost_segments, _ = await loaded_with_victim(c, tmp_path)
        await c.start_coordinator()  # the standby that takes over
        lead = leadership(c)
        await pause_checker(lead)
        runs = lead.checker.runs
        # The survivors refuse every load for now: the forget's repair is queued but cannot end under this leader.
        for node in c.nodes:
            node.injector = FaultInjector(FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"})))
        loads = count_loads(c.nodes)

        await kill_victim(c)
        await wait_until(lambda: any(t.KIND == qc.TASK_KIND_REPAIR
                                     and t.rec.trigger_condition == qc.TRIGGER_CONDITION_NODE_DOWN
                                     for t in lead.scheduler.triggers.values()),
                         "the forget queued the node-down repair")
        assert c.kv is not None
        assert sum([await c.kv.count_prefix(p) for p in TASK_PREFIXES]), "the repair is persisted"
        assert lead.checker.runs == runs, "no checker pass ran: the forget queued the repair"
        await whole_under_the_next_leader(c, cid, loads, lost_segments)
