"""Kill the coordinator leader while 50 streams run; the standby adopts them all in WATCH.

Everything is a real process: two coordinators (``querycoord coord --scaled``) and three stream nodes
(``querycoord streamnode``), driven through the StreamMgmt gRPC stub. After the SIGKILL the
new leader must show every stream RUNNING with the very same task table (task id, kind, deploy, index, SID, node)
and must not have redeployed anything. "Zero redeploys" is checked three ways:

* ShowStreams ``deploy_times`` is 0 for every stream on the new leader (any re-plan, e.g. a stream found incomplete
  or the WATCH fallback, bumps it) and every SID is unchanged (a single-task redeploy bumps the SID);
* the manager's own counters, scraped from the new leader's ``/metrics``: 50 adoptions and no redeploy;
* each stream node's held tasks (its ``tasks`` control command) are the same instances before and after, while the
  node has meanwhile accepted replies carrying the new leader's (higher) fencing revision.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from meta.fence import Fence
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, stream_pb2
from querycoord.settings.config import StreamConfig
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import StreamStore
from tests.spawn import Processes, Spawned
from tests.stream_client import stub_for, wait_for
from tests.test_metrics import scrape, value

sp = stream_pb2
STREAMS = 50

# The coordinators: the scaled preset, and the metrics endpoint the counters are read from. WATCH ends as soon as
# every live node has reported; its timeout only bounds a node that never does, so it is generous here: on a loaded
# machine three nodes at 100 ms heartbeats may need more than the preset's 2 s to report to a leader still starting.
COORD_FLAGS = ("--stream-watch-timeout", "10", "--http-listen", "127.0.0.1:0")


async def counters(coord: Spawned) -> dict[str, float]:
    """The leader's stream counters, from its /metrics."""
    samples = await scrape(coord)
    return {"adopted": value(samples, "querycoord_stream_adoptions_total"),
            "redeploys": value(samples, "querycoord_stream_redeploys_total"),
            "watching": value(samples, "querycoord_stream_manager_watching"),
            "running": value(samples, "querycoord_streams", state="running")}


async def held(node: Spawned) -> tuple[int, set[tuple[Any, ...]]]:
    """The node's highest seen leader revision and its held task instances (its ``tasks`` control command)."""
    ans = await node.command("tasks")
    assert ans["ok"], ans
    tasks = {(t["stream_id"], t["task_id"], t["sid"], t["kind"], t["deploy_id"], t["task_idx"], t["status"])
             for t in ans["tasks"]}
    return int(ans["leader_revision"]), tasks


def task_table(show: sp.ShowStreamsResponse) -> dict[int, list[tuple[int, ...]]]:
    """Per stream: every task's identity (task id, kind, deploy, index, SID, vgroup, snode, node, scan plan, top)."""
    return {
        info.stream.id: sorted((t.task.task_id, t.task.kind, t.task.deploy_id, t.task.task_idx, t.task.sid,
                                t.task.vgroup_id, t.task.snode_id, t.task.node_id, t.task.scan_plan_idx,
                                int(t.task.top)) for t in info.tasks)
        for info in show.streams
    }


def all_running(show: sp.ShowStreamsResponse) -> bool:
    return (show.status.error_code == common_pb2.SUCCESS and not show.watching and len(show.streams) == STREAMS
            and all(info.state == sp.STREAM_RUNNING and len(info.tasks) > 0
                    and all(t.status == sp.TASK_RUNNING for t in info.tasks) for info in show.streams))


def summary(show: sp.ShowStreamsResponse) -> dict[str, Any]:
    states: dict[str, int] = {}
    for info in show.streams:
        name = sp.StreamState.Name(info.state)
        states[name] = states.get(name, 0) + 1
    return {"watching": show.watching, "states": states, "reason": show.status.reason}


async def test_leader_killed_while_50_streams_run_standby_adopts_all_without_redeploy(
    etcd: EtcdCluster, root_path: str, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    async with Processes(etcd, root_path, tmp_path) as procs:

        def logs() -> str:
            return "\n".join(p.tail(20) for p in procs.started)

        first = await procs.coordinator("--scaled", *COORD_FLAGS, name="coord-a")
        await first.next_event("leader", timeout=20)
        second = await procs.coordinator("--scaled", *COORD_FLAGS, name="coord-b")
        nodes = list(await asyncio.gather(*(
            procs.stream_node("--vgroups", str(vg), "--snode", "--heartbeat-ms", "100", "--groups", "2",
                              "--init-delay-ms", "100", "--ttl", "10", name=f"node{vg}") for vg in (1, 2, 3))))
        timings["processes_up"] = time.monotonic() - t0

        async with stub_for(first.address) as stub:
            for node in nodes:
                created = await stub.CreateSnode(sp.CreateSnodeRequest(node_id=node.node_id))
                assert created.status.error_code == common_pb2.SUCCESS, created

            async def snodes_heard() -> tuple[bool, Any]:
                # CreateStream needs a live snode: retry until one heartbeated.
                resp = await stub.CreateStream(sp.CreateStreamRequest(
                    name="s0", source_db="db", source_vgroup_ids=[1, 2], num_calc_scan_plans=1, num_calc_subplans=2,
                    runner_deploys=2, if_not_exists=True))
                return resp.status.error_code == common_pb2.SUCCESS, resp.status

            await wait_for(snodes_heard, "an snode heartbeating", timeout=15, interval=0.2)
            for i in range(1, STREAMS):
                vgroups = [[1, 2], [2, 3], [1, 3], [1, 2, 3]][i % 4]
                resp = await stub.CreateStream(sp.CreateStreamRequest(
                    name=f"s{i}", source_db="db", source_vgroup_ids=vgroups, num_calc_scan_plans=1 + i % 2,
                    num_calc_subplans=2, runner_deploys=1 + i % 3))
                assert resp.status.error_code == common_pb2.SUCCESS, resp

            async def running_on_first() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                return all_running(show), show

            try:
                before = await wait_for(running_on_first, "50 streams RUNNING on the first leader", timeout=30)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{logs()}") from None
        timings["all_running"] = time.monotonic() - t0
        table_before = task_table(before)
        assert len(table_before) == STREAMS
        assert len({row[7] for rows in table_before.values() for row in rows}) == 3, "tasks on all three nodes"
        assert all(info.deploy_times == 1 for info in before.streams), "each stream planned once"
        stats_first = await counters(first)
        assert stats_first["redeploys"] == 0 and stats_first["running"] == STREAMS, stats_first
        expected = {(sid, row[0], row[4], row[7]) for sid, rows in table_before.items() for row in rows}

        async def nodes_hold_exactly_the_table() -> tuple[bool, Any]:
            # Stale instances (e.g. of a double plan) are undeployed by later heartbeats: wait until only the
            # leader's tasks are held, all RUNNING, so the snapshot below is settled.
            held_now = {n.node_id: await held(n) for n in nodes}
            have = {(t[0], t[1], t[2], node) for node, (_, ts) in held_now.items() for t in ts}
            ok = have == expected and all(t[6] == "RUNNING" for _, ts in held_now.values() for t in ts)
            return ok, held_now if ok else {"missing": len(expected - have), "extra": sorted(have - expected)[:10]}

        held_before = await wait_for(nodes_hold_exactly_the_table, "nodes holding the leader's tasks", timeout=10)

        # SIGKILL the leader; the standby takes over once the leader's lease expires.
        await first.kill()
        killed_at = time.monotonic()
        await second.next_event("leader", timeout=20)
        timings["takeover_s"] = time.monotonic() - killed_at

        async with stub_for(second.address) as stub:
            async def running_on_second() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                return all_running(show), summary(show)

            try:
                await wait_for(running_on_second, "50 streams RUNNING on the new leader after WATCH", timeout=60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{logs()}") from None
            timings["adopted_s"] = time.monotonic() - killed_at
            # Let a few more heartbeats and stream ticks pass: nothing may change afterwards either.
            await asyncio.sleep(1.0)
            after = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
        assert all_running(after), summary(after)

        table_after = task_table(after)
        assert table_after == table_before, "identical task snapshot (task id, kind, deploy, index, SID, node)"
        assert [info.deploy_times for info in after.streams] == [0] * STREAMS, "no stream was re-planned"
        stats = await counters(second)
        assert stats == {"adopted": STREAMS, "redeploys": 0, "watching": 0, "running": STREAMS}, stats
        for node in nodes:
            revision, now = await held(node)
            old_revision, old_held = held_before[node.node_id]
            assert revision > old_revision, f"node {node.node_id} never heard the new leader"
            assert now == old_held, f"node {node.node_id}: its task instances changed"
        timings["total_s"] = time.monotonic() - t0
        print(json.dumps({k: round(v, 2) for k, v in timings.items()}))


async def test_concurrent_heartbeats_plan_a_new_stream_once(kv: MetaKV) -> None:
    """Found by the failover test above: two heartbeats in flight both plan the same pending stream.

    ``Deploy.plan_pending`` snapshots the plan queue, awaits the id allocator and only then discards the stream, so a
    second heartbeat arriving during the await plans it again: fresh task ids, ``deploy_times`` 2, and whichever plan
    lands first may already have been handed out (then undeployed as unknown tasks).
    """
    await kv.save("election/leader", "me")
    item = await kv.get_kv("election/leader")
    assert item is not None
    store = StreamStore(kv.fenced(Fence(kv.abs_key("election/leader").decode(), item.create_revision)))
    a, b = await store.create_snode(11), await store.create_snode(12)
    mgr = StreamManager(store, leader_revision=100, config=StreamConfig(watch_timeout=1.0))
    await mgr.start()
    mgr.set_live_nodes([11, 12])
    hb = {n: sp.HeartbeatRequest(node_id=n, snode_id=s.id, vgroup_ids=[v], num_stream_groups=1)
          for n, s, v in ((11, a, 1), (12, b, 2))}
    for req in hb.values():
        await mgr.handle_heartbeat(req)
    sdef = await store.create_stream(sp.CreateStreamRequest(name="s", source_db="db", source_vgroup_ids=[1, 2],
                                                            num_calc_scan_plans=1, num_calc_subplans=2,
                                                            runner_deploys=2), [a.id, b.id])
    mgr.put_stream(sdef)
    replies = await asyncio.gather(*(mgr.handle_heartbeat(req) for req in hb.values()))
    given = {t.task_id for r in replies for d in r.deploys for t in _deployed(d)}
    assert given <= set(mgr.streams[sdef.id].tasks), "a node was handed a task the leader no longer knows"
    assert mgr.show_streams().streams[0].deploy_times == 1


def _deployed(d: sp.StreamDeploy) -> list[sp.TaskId]:
    tasks = [r.task for r in d.readers] + [r.task for r in d.runners]
    if d.HasField("trigger"):
        tasks.append(d.trigger.task)
    return tasks
