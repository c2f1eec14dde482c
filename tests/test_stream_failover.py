"""Issue 5 §4: kill the coordinator leader while 50 streams run; the standby adopts them all in WATCH.

Everything is a real process: two coordinators (``COORD`` below, a scaled-down stream config) and three stream
nodes (``python -m querycoord.nodes.streamnode``), driven through the StreamMgmt gRPC stub. After the SIGKILL the
new leader must show every stream RUNNING with the very same task table (task id, kind, deploy, index, SID, node)
and must not have redeployed anything. "Zero redeploys" is checked three ways:

* ShowStreams ``deploy_times`` is 0 for every stream on the new leader (any re-plan, e.g. a stream found incomplete
  or the WATCH fallback, bumps it) and every SID is unchanged (a single-task redeploy bumps the SID);
* the manager's own counters (``adopted``, ``redeploys``), which the coordinator snippet dumps to a JSON file since
  no RPC exposes them: ``adopted == 50`` and ``redeploys == 0``;
* each stream node's held tasks (its ``tasks`` control command) are the same instances before and after, while the
  node has meanwhile accepted replies carrying the new leader's (higher) fencing revision.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from meta.etcd_server import EtcdCluster
from meta.fence import Fence
from meta.kv import MetaKV
from proto import common_pb2, stream_pb2
from querycoord.config import StreamConfig
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import StreamStore
from tests.stream_client import stub_for, wait_for

sp = stream_pb2
STREAMS = 50

# A coordinator process with the stream manager scaled down. It also dumps the manager's counters to argv[3]
# every 100 ms (the counters are for tests and drills; no RPC exposes them).
COORD = """
import asyncio, json, logging, os, sys
from meta.config import EtcdConfig
from querycoord.config import CoordConfig
from querycoord.logs import setup_logging
from querycoord.process import CoordinatorProcess
from querycoord.config import StreamConfig
from querycoord.config import SchedulerConfig
import querycoord.process as qp

setup_logging("WARNING")
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
stream = StreamConfig(watch_timeout=3.0, task_silence=5.0, min_start_delay=0.2, error_retry_delay=0.5,
                      max_retry_delay=2.0, reset_after=5.0, health_interval=0.5, isolation=5.0, vgroup_lost_stop=20.0)
cfg = CoordConfig(etcd=EtcdConfig.from_endpoints(sys.argv[1]), root=sys.argv[2], listen="127.0.0.1:0",
                  session_ttl=2, rpc_timeout=5, auto_balance_interval=0,
                  scheduler=SchedulerConfig(retry_backoff=0.05, wait_interval=0.2),
                  stream=stream, stream_tick=0.1)
stats_path = sys.argv[3]

async def dump_stats(proc):
    while True:
        lead = proc.coord.leadership
        mgr = lead.streams if lead is not None else None
        if mgr is not None:
            stats = {"adopted": mgr.adopted, "redeploys": mgr.redeploys, "state": mgr.state.value,
                     "streams": len(mgr.streams)}
            with open(stats_path + ".tmp", "w") as f:
                json.dump(stats, f)
            os.replace(stats_path + ".tmp", stats_path)
        await asyncio.sleep(0.1)

class Proc(CoordinatorProcess):
    async def start(self):
        await super().start()
        self._stats_task = asyncio.create_task(dump_stats(self))

qp.CoordinatorProcess = Proc
sys.exit(asyncio.run(qp.run_coordinator(cfg)))
"""


class Coordinator:
    def __init__(self, etcd: EtcdCluster, root: str, env: dict[str, str], tmp: Path, name: str):
        self.stats_path = tmp / f"{name}.stats.json"
        self.log = tmp / f"{name}.log"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", COORD, ",".join(etcd.endpoints), root,
                                          str(self.stats_path)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, text=True, env=env)
        ready = self._next_event("ready")
        self.address: str = ready["address"]

    def _next_event(self, kind: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"coordinator exited before {kind!r}:\n{self.tail()}")
            ev = json.loads(line)
            if ev["event"] == kind:
                return ev

    async def wait_leader(self, timeout: float = 20.0) -> dict[str, Any]:
        return await asyncio.wait_for(asyncio.to_thread(self._next_event, "leader"), timeout)

    def stats(self) -> dict[str, Any]:
        try:
            return json.loads(self.stats_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def tail(self, lines: int = 40) -> str:
        return f"--- {self.log.name}\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class StreamNode:
    """One ``querycoord.nodes.streamnode`` process with its stdin control channel."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path, node_id: int):
        self.proc, self.log, self.node_id = proc, log, node_id

    @classmethod
    async def spawn(cls, etcd: EtcdCluster, root: str, env: dict[str, str], tmp: Path, vgroup: int) -> StreamNode:
        log = tmp / f"node{vgroup}.log"
        args = ["-m", "querycoord.nodes.streamnode", "--etcd-endpoints", ",".join(etcd.endpoints), "--root", root,
                "--vgroups", str(vgroup), "--snode", "--heartbeat-ms", "100", "--groups", "2",
                "--init-delay-ms", "100", "--ttl", "10"]
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(sys.executable, *args, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE, stderr=err, env=env)
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        ready = json.loads(line) if line else {}
        assert ready.get("event") == "ready", f"stream node did not start:\n{log.read_text(errors='replace')}"
        return cls(proc, log, int(ready["node_id"]))

    async def control(self, cmd: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd.encode() + b"\n")
        await self.proc.stdin.drain()
        while True:
            ans = json.loads(await asyncio.wait_for(self.proc.stdout.readline(), 10))
            if ans.get("event") == "ack" and ans.get("cmd") == cmd.split()[0]:
                assert ans["ok"], ans
                return ans

    async def held(self) -> tuple[int, set[tuple[Any, ...]]]:
        """The node's highest seen leader revision and its held task instances."""
        ans = await self.control("tasks")
        tasks = {(t["stream_id"], t["task_id"], t["sid"], t["kind"], t["deploy_id"], t["task_idx"], t["status"])
                 for t in ans["tasks"]}
        return int(ans["leader_revision"]), tasks

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


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
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    coords: list[Coordinator] = []
    nodes: list[StreamNode] = []

    def logs() -> str:
        return "\n".join([c.tail() for c in coords] + [
            f"--- {n.log.name}\n" + "\n".join(n.log.read_text(errors="replace").splitlines()[-20:]) for n in nodes])

    try:
        first = await asyncio.to_thread(Coordinator, etcd, root_path, subprocess_env, tmp_path, "coord-a")
        coords.append(first)
        await first.wait_leader()
        second = await asyncio.to_thread(Coordinator, etcd, root_path, subprocess_env, tmp_path, "coord-b")
        coords.append(second)
        nodes = list(await asyncio.gather(*(StreamNode.spawn(etcd, root_path, subprocess_env, tmp_path, vg)
                                            for vg in (1, 2, 3))))
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
        stats_first = await wait_for(lambda: _stats_ready(first), "the first leader's counters", timeout=5)
        assert stats_first["redeploys"] == 0, stats_first
        expected = {(sid, row[0], row[4], row[7]) for sid, rows in table_before.items() for row in rows}

        async def nodes_hold_exactly_the_table() -> tuple[bool, Any]:
            # Stale instances (e.g. of a double plan) are undeployed by later heartbeats: wait until only the
            # leader's tasks are held, all RUNNING, so the snapshot below is settled.
            held = {n.node_id: await n.held() for n in nodes}
            have = {(t[0], t[1], t[2], node) for node, (_, ts) in held.items() for t in ts}
            ok = have == expected and all(t[6] == "RUNNING" for _, ts in held.values() for t in ts)
            return ok, held if ok else {"missing": len(expected - have), "extra": sorted(have - expected)[:10]}

        held_before = await wait_for(nodes_hold_exactly_the_table, "nodes holding the leader's tasks", timeout=10)

        # SIGKILL the leader; the standby takes over once the leader's lease expires.
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        killed_at = time.monotonic()
        await second.wait_leader(timeout=20)
        timings["takeover_s"] = time.monotonic() - killed_at

        async with stub_for(second.address) as stub:
            async def running_on_second() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                return all_running(show), summary(show)

            try:
                await wait_for(running_on_second, "50 streams RUNNING on the new leader after WATCH", timeout=20)
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
        stats = second.stats()
        assert stats == {"adopted": STREAMS, "redeploys": 0, "state": "normal", "streams": STREAMS}, stats
        for node in nodes:
            revision, held = await node.held()
            old_revision, old_held = held_before[node.node_id]
            assert revision > old_revision, f"node {node.node_id} never heard the new leader"
            assert held == old_held, f"node {node.node_id}: its task instances changed"
        timings["total_s"] = time.monotonic() - t0
        print(json.dumps({k: round(v, 2) for k, v in timings.items()}))
    finally:
        for node in nodes:
            await node.stop()
        for c in coords:
            await asyncio.to_thread(c.stop)


async def _stats_ready(coord: Coordinator) -> tuple[bool, dict[str, Any]]:
    stats = coord.stats()
    return bool(stats), stats


async def test_concurrent_heartbeats_plan_a_new_stream_once(kv: MetaKV) -> None:
    """Found by the failover test above: two heartbeats in flight both plan the same pending stream.

    ``_plan_pending`` snapshots ``_to_plan``, awaits the id allocator and only then discards the stream, so a second
    heartbeat arriving during the await plans it again: fresh task ids, ``deploy_times`` 2, and whichever plan lands
    first may already have been handed out (then undeployed as unknown tasks).
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
