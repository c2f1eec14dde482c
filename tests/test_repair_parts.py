"""A lost node's repair larger than one etcd write goes in parts, each queued when the one before it ends
(``Checker._chain_lost``), not after a checker pass: on a real cluster (real etcd, in-process gRPC query nodes, the
victim a real node process killed with SIGKILL), with a small ``max_repair_bytes``.

What must hold, as the query nodes themselves report it (their GetDataDistribution, each load they carried out):
with the checker's loop stopped every lost copy is loaded again, once, in several parts; a leader stopped between
two parts leaves the new leader to finish, each copy still loaded once; a part that finds no room parks its unit
and the chain stops there (the task history shows no repair queued pass after pass), until a node with room joins.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import data_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.common import memory
from querycoord.nodes.querynode_faults import FaultConfig, FaultInjector
from querycoord.task.history import TaskHistory
from querycoord.task.parking import NO_ROOM
from querycoord.task.repair import RepairTask
from tests.cluster import MiB, QueryCluster, fast_scheduler, running_cluster, until, wait_until
from tests.test_repair_lost import (
    VICTIM,
    _is_100,
    assert_held_once,
    count_loads,
    distribution,
    dm_channels,
    kill_victim,
    leadership,
    loaded_with_victim,
    pause_checker,
    whole_under_the_next_leader,
)
from tests.truth import target_of

BUDGET = 300  # bytes of a persisted repair request: about ten segments a part
SEGMENT = 10_000 * (128 * 4 + 8)  # bytes accounted per segment of ``create_bulk_collection``


async def repairs(c: QueryCluster) -> list[Any]:
    """The finished REPAIR triggers, oldest first, from the persisted task history."""
    assert c.kv is not None
    page = await TaskHistory(MetaKV(c.kv.client, c.kv.root)).page(after=0, newest_first=False, want=1000)
    return [t.trigger for t in page if t.trigger.kind == qc.TASK_KIND_REPAIR]


async def test_a_lost_nodes_repair_goes_in_parts_each_queued_when_the_last_ends(
        etcd: EtcdCluster, root_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every part asks for a memory release (a full GC pass, 0.3 s at a million segments) soon after it ends: none
    # may run before the last part has ended (``memory.defer_while``: between two parts as during one).
    released: list[float] = []
    ended: list[float] = []
    release_soon = memory.release_soon
    monkeypatch.setattr(memory, "LARGE_TASK_SEGMENTS", 1)
    monkeypatch.setattr(memory, "RELEASE_DELAY", 0.005)
    monkeypatch.setattr(memory, "release_soon", lambda delay=0.005: release_soon(delay))
    monkeypatch.setattr(memory, "release_freed_memory", lambda: released.append(time.monotonic()) or True)
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(max_repair_bytes=BUDGET)) as c:
        cid, lost_segments, lost_channels = await loaded_with_victim(c, tmp_path, segment_count=90)
        lead = leadership(c)
        await pause_checker(lead)
        runs = lead.checker.runs
        loads = count_loads(c.nodes)
        lead.scheduler.finish_hooks.append(
            lambda t: ended.append(time.monotonic()) if t.KIND == qc.TASK_KIND_REPAIR else None)

        await kill_victim(c)
        await wait_until(lambda: VICTIM not in lead.meta.bound_node_ids(), "the leader forgot the lost node")
        target = await target_of(c, cid)

        async def whole() -> bool:
            held: set[int] = set()
            for node in c.nodes:
                held |= {s.segment_id for s in (await distribution(c, node.node_id)).segments}
            return target[0] <= held and await _is_100(c, cid)

        await until("the survivors hold everything and the leader shows 100 %", whole, timeout=90)
        await c.wait_idle()
        assert lead.checker.runs == runs, "no checker pass ran: each part was queued by the end of the last"
        assert loads == Counter({s: 1 for s in lost_segments}), "each lost copy loaded once, nothing else"
        await assert_held_once(c, cid)
        assert not lead.meta.segments_on_node(VICTIM) and VICTIM not in lead.meta.known_node_ids()
        watched: set[str] = set()
        for node in c.nodes:
            watched |= dm_channels(await distribution(c, node.node_id), cid)
        assert lost_channels <= watched, "the lost DM channel watches are watched again"
        done = await repairs(c)
        assert len(done) >= 3 and lead.checker.lost_parts == len(done) - 1, [t.summary for t in done]
        assert all(t.trigger_condition == qc.TRIGGER_CONDITION_NODE_DOWN and t.state != qc.TASK_STATE_FAILED
                   for t in done)
        assert all("more in a later repair" in t.summary for t in done[:-1]), [t.summary for t in done]
        assert "more in a later repair" not in done[-1].summary
        assert lead.scheduler.env.prefetch.taken > 0, "parts took catalog records read while the part before ran"
        await wait_until(lambda: any(r > ended[-1] for r in released), "the memory is released once the parts are done")
        assert len(ended) == len(done)
        assert not [r for r in released if ended[0] < r < ended[-1]], "no release ran between two parts"


async def test_two_nodes_lost_together_are_repaired_by_one_chain_of_parts(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """The second node's forget finds the collection owned by the first one's repair and queues nothing; the chain
    takes the second node's copies and DM channels in with the first's, and does not stop because copies of a node
    lost meanwhile outnumber what the first part moved."""
    other = VICTIM + 1
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(max_repair_bytes=BUDGET)) as c:
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node()
        for node_id in (VICTIM, other):
            await c.start_node_process("--node-id", str(node_id), log_dir=tmp_path)
        cid = await c.create_collection("two", partitions=2, segments=120, channels=4)
        await c.load_collection(cid, timeout=90)
        await c.wait_idle()
        lost: set[int] = set()
        lost_channels: set[str] = set()
        for node_id in (VICTIM, other):
            dist = await distribution(c, node_id)
            lost |= {s.segment_id for s in dist.segments if s.collection_id == cid}
            lost_channels |= dm_channels(dist, cid)
        assert lost and lost_channels
        lead = leadership(c)
        await pause_checker(lead)
        runs = lead.checker.runs
        loads = count_loads(c.nodes)

        for proc in list(c.procs):
            await proc.kill()  # SIGKILL, both at once
        await wait_until(lambda: not {VICTIM, other} & lead.meta.bound_node_ids(), "the leader forgot both nodes")
        target = await target_of(c, cid)

        async def whole() -> bool:
            held: set[int] = set()
            chans: set[str] = set()
            for node in c.nodes:
                dist = await distribution(c, node.node_id)
                held |= {s.segment_id for s in dist.segments}
                chans |= dm_channels(dist, cid)
            return target[0] <= held and target[1] <= chans and await _is_100(c, cid)

        await until("the survivors hold and watch everything, the leader shows 100 %", whole, timeout=90)
        await c.wait_idle()
        assert lead.checker.runs == runs, "no checker pass ran: the parts followed each other"
        assert loads == Counter({s: 1 for s in lost}), "each lost copy loaded once"
        await assert_held_once(c, cid)
        assert not {VICTIM, other} & lead.meta.known_node_ids()


async def test_a_leader_stopped_between_two_parts_leaves_the_rest_to_the_next(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    # Slow retries: the refused part keeps running under the first leader until it is stopped.
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(
            max_repair_bytes=BUDGET, retry_backoff=1.0, retry_backoff_max=2.0)) as c:
        cid, lost_segments, _ = await loaded_with_victim(c, tmp_path, segment_count=90)
        await c.start_coordinator()  # the standby that takes over
        lead = leadership(c)
        await pause_checker(lead)
        loads = count_loads(c.nodes)

        def refuse_after_the_first_part(trigger: Any) -> None:
            """Once a part ended, the survivors refuse every load: the next part cannot end under this leader."""
            if trigger.KIND == qc.TASK_KIND_REPAIR:
                for node in c.nodes:
                    node.injector = FaultInjector(FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"})))

        lead.scheduler.finish_hooks.append(refuse_after_the_first_part)
        await kill_victim(c)
        await wait_until(lambda: lead.checker.lost_parts >= 1 and bool(lead.scheduler.triggers),
                         "the first part ended and the second is queued", timeout=90)
        assert lead.meta.segments_on_node(VICTIM), "copies still wait on the lost node"
        await whole_under_the_next_leader(c, cid, loads, lost_segments)
        new_lead = leadership(c, 1)
        assert not new_lead.meta.segments_on_node(VICTIM)


async def test_a_part_with_no_room_parks_and_the_chain_stops(
        etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    # Each survivor has room for 26 segments under the 90 % limit: the victim's 20 copies do not all fit.
    room = int(26.5 * SEGMENT / 0.9)
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(max_repair_bytes=BUDGET)) as c:
        c.config.checker_interval = 0.2  # passes run all along
        await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node(capacity=room)
        await c.start_node_process("--node-id", str(VICTIM), log_dir=tmp_path)
        cid = await c.create_collection("tight", partitions=2, segments=60, channels=2)
        await c.load_collection(cid, timeout=90)
        await c.wait_idle()
        lost = {s.segment_id for s in (await distribution(c, VICTIM)).segments if s.collection_id == cid}
        held_before = {n.node_id: {s.segment_id for s in n.state.distribution().segments} for n in c.nodes}
        assert lost and sum(map(len, held_before.values())) + len(lost) == 60
        lead = leadership(c)
        loads = count_loads(c.nodes)

        await kill_victim(c)
        await wait_until(lambda: any(u.code == NO_ROOM for u in lead.scheduler.env.parked.of(cid)),
                         "the unit that finds no room is parked", timeout=90)
        await c.wait_idle()
        count = len(await repairs(c))
        runs = lead.checker.runs
        await wait_until(lambda: lead.checker.runs >= runs + 10, "ten more checker passes")
        await c.wait_idle()
        assert len(await repairs(c)) == count, "no repair is queued again while the unit has no room"
        assert count <= 1 + len(lost) // 5, "a bounded number of parts"
        assert all(n == 1 for n in loads.values()) and set(loads) < lost, "some lost copies loaded once each"
        for node in c.nodes:
            held = {s.segment_id for s in (await distribution(c, node.node_id)).segments}
            assert held_before[node.node_id] <= held and len(held) <= 26

        await c.add_node(capacity=1024 * MiB)  # room: the parked unit is placed
        await until("the leader shows the collection at 100 %", lambda: _is_100(c, cid), timeout=90)
        await c.wait_idle()
        await assert_held_once(c, cid)


async def test_a_record_read_ahead_of_a_segment_compacted_since_is_not_loaded(
        etcd: EtcdCluster, root_path: str) -> None:
    """The catalog records of a part are read while the part before it runs (``task.prefetch``); a segment
    compacted away in between is not planned from its record read ahead (the followed catalog copy, brought up to
    etcd's revision, no longer holds it), while the others are taken from the read."""
    async with running_cluster(etcd, root_path, [None, None]) as c:
        cid = await c.create_collection("ahead", partitions=1, segments=6)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = leadership(c)
        env = lead.scheduler.env
        catalog = c.coords[0].coord.catalog
        assert catalog is not None and env.targets is not None
        pid = (await catalog.show_partitions(cid))[0].partition_id
        _, binlogs = await catalog.get_recovery_info(cid, pid)
        ids = sorted(b.segment_id for b in binlogs)
        gone, kept = ids[0], ids[1:]

        env.prefetch.start(env.broker, cid, [{pid: ids}])
        await wait_until(lambda: env.prefetch.done(cid), "the read ahead ended")
        await catalog.add_segments([data_pb2.SegmentBinlogs(
            collection_id=cid, partition_id=pid, num_rows=100, mem_size=1 << 20, binlog_paths=["x"],
            compaction_from=[gone])])
        taken = env.prefetch.taken
        repair = RepairTask.new(env, task_pb2.RepairRequest(), trigger_condition=qc.TRIGGER_CONDITION_NODE_DOWN,
                                collection_id=cid)
        infos = await repair._load_infos([(pid, ids)])  # noqa: SLF001 (the plan's read, on its own)
        assert [i.segment_id for i in infos] == kept, "the compacted segment is not planned"
        assert env.prefetch.taken - taken == len(kept), "the others were taken from the read ahead"


async def test_parts_read_ahead_one_after_the_other_and_a_larger_part_leaves_the_rest_to_the_next(
        etcd: EtcdCluster, root_path: str) -> None:
    """The reads ahead of a repair's next parts (``task.prefetch``) run one after the other, a part already being
    read is not read again when the next part names it, and a part that takes more than its own read (parts are cut
    by bytes, not counts) leaves what it did not ask for to the part after it: every record is read once."""
    async with running_cluster(etcd, root_path, [None]) as c:
        cid = await c.create_collection("chained", partitions=1, segments=12)
        lead = leadership(c)
        env = lead.scheduler.env
        catalog = c.coords[0].coord.catalog
        assert catalog is not None
        pid = (await catalog.show_partitions(cid))[0].partition_id
        _, binlogs = await catalog.get_recovery_info(cid, pid)
        ids = sorted(b.segment_id for b in binlogs)
        prefetch = env.prefetch
        prefetch.start(env.broker, cid, [{pid: ids[0:4]}, {pid: ids[4:8]}])
        assert prefetch.started == 2
        prefetch.start(env.broker, cid, [{pid: ids[4:8]}, {pid: ids[8:12]}])  # the next part's start
        assert prefetch.started == 3, "the part being read is not read again"
        reads = [task for _, task in prefetch._reads[cid]]  # noqa: SLF001 (the order of the reads)
        await reads[0]
        assert not reads[2].done() or reads[1].done(), "one part after the other"
        got = await prefetch.take(cid, ids[0:6])  # a larger part: its own read and the first of the next one's
        assert sorted(got) == ids[0:6]
        got = await prefetch.take(cid, ids[6:12])
        assert sorted(got) == ids[6:12], "the rest of the second read, and the third"
        assert not prefetch._reads.get(cid)  # noqa: SLF001
        assert prefetch.started == 3
