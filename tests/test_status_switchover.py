"""``querycoord status`` and ``querycoord switchover`` against real coordinator and node processes on a real etcd."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from meta.election import Election
from meta.kv import MetaKV
from meta.ops.child import child_env
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.common.messages import load_items
from querycoord.common.protocol import QUERYCOORD_ELECTION, QUERYCOORD_ROLE
from querycoord.leader.switchover import SWITCHOVER_KEY, candidates
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig, QueryNode
from tests.cluster import QueryCluster, wait_in_memory
from tests.spawn import MID_LOAD_FLAGS, Processes
from tests.test_cli_start import STATUS_NEEDS_NOT, run_probe

# Node calls of 600 ms, two at a time: the load takes about ten seconds, and a switchover
# started right after it began (the command's start-up included) lands in the middle.
SEGMENTS = 300
SLOW_LOAD_FLAGS = (*MID_LOAD_FLAGS, "--max-request-bytes", "1500")


async def cli(*argv: str, timeout: float = 120.0) -> tuple[int, str, str]:
    """``querycoord <argv>`` as a process: exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", *argv,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                env=child_env())
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def etcd_flags(etcd: EtcdCluster, root: str) -> tuple[str, ...]:
    return ("--etcd-endpoints", ",".join(etcd.endpoints), "--root", root)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def queued(kv: MetaKV, count: int, timeout: float = 60.0) -> list[str]:
    """The coordinators' addresses in election order, once ``count`` are queued."""
    deadline = time.monotonic() + timeout
    while len(queue := await candidates(kv)) < count:
        assert time.monotonic() < deadline, f"only {queue} queued"
        await asyncio.sleep(0.05)
    return [c.address for c in queue]


@contextlib.asynccontextmanager
async def silent_candidate(kv: MetaKV) -> AsyncIterator[str]:
    """A coordinator session queued in the election at an address where nothing answers."""
    address = f"127.0.0.1:{free_port()}"
    async with Session(kv, QUERYCOORD_ROLE, address, ttl=10) as session:
        campaign = asyncio.create_task(Election(kv, session, QUERYCOORD_ELECTION).campaign(address))
        try:
            yield address
        finally:
            campaign.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await campaign


async def test_status_shows_coordinators_nodes_and_etcd(etcd: EtcdCluster, root_path: str, kv: MetaKV,
                                                        tmp_path: Path) -> None:
    async with Processes(etcd, root_path, tmp_path) as procs:
        leader = await procs.coordinator(name="coord-a")
        await leader.next_event("leader", timeout=60)
        standby = await procs.coordinator(name="coord-b")
        qn = await procs.query_node("--ttl", "2", name="querynode")
        await procs.stream_node("--vgroups", "1,2", name="streamnode")
        await queued(kv, 2)
        async with silent_candidate(kv) as silent:
            await queued(kv, 3)
            r, modules = await asyncio.to_thread(run_probe, child_env(), tmp_path, "status",
                                                 *etcd_flags(etcd, root_path), "-o", "json")
            assert r.returncode == 0, r.stderr
            status = json.loads(r.stdout)
            # It asked each coordinator for its state (``since`` below) without the generated stub module.
            assert STATUS_NEEDS_NOT.isdisjoint(modules)
            code, table, err = await cli("status", *etcd_flags(etcd, root_path))
            assert code == 0, err
        print(table)

        assert status["leader"] == leader.address and status["switchover"] is None
        coords = {c["address"]: c for c in status["coordinators"]}
        assert list(coords) == [leader.address, standby.address, silent]
        lead, stand, quiet = coords[leader.address], coords[standby.address], coords[silent]
        assert (lead["role"], lead["health"], lead["queue_position"]) == ("leader", "SERVING", 0)
        assert lead["fence_revision"] == lead["election_revision"] > 0 and lead["server_id"] > 0
        assert (stand["role"], stand["health"], stand["queue_position"]) == ("standby", "NOT_SERVING", 1)
        assert stand["fence_revision"] is None and stand["election_revision"] > lead["election_revision"]
        assert lead["since"] and stand["since"] and lead["since"] <= time.time()
        # Registered and queued, but nothing answers there: shown as such, not an error.
        assert quiet["role"] == "standby" and quiet["health"].startswith("no answer") and quiet["since"] is None

        assert [(n["id"], n["address"], n["state"]) for n in status["query_nodes"]] == [
            (qn.node_id, qn.address, "online")]
        assert [(n["state"], n["vgroups"]) for n in status["stream_nodes"]] == [("online", [1, 2])]
        members = status["etcd"]["members"]
        assert len(members) == 1 and members[0]["error"] == "" and members[0]["version"]
        assert status["etcd"]["alarms"] == []

        for text in (leader.address, "leads", "standby #1", "no answer", "query nodes (1)", "stream nodes (1)",
                     "alarms: none"):
            assert text in table, text


async def test_status_without_etcd_is_one_error_line() -> None:
    code, out, err = await cli("status", "--etcd-endpoints", f"127.0.0.1:{free_port()}", "--root", "x",
                               "--timeout", "2")
    assert code == 1 and out == ""
    said, *errors = err.strip().splitlines()
    assert said.startswith('reading root "x" (from --root) at etcd '), err  # which deployment, then why not
    assert len(errors) == 1 and errors[0].startswith("error: "), err


class Loads:
    """What the query nodes' LoadSegments did, per segment: the task ids whose call newly loaded it, every task
    id that asked for it, and the leader (fence revision) of the call that loaded it."""

    def __init__(self) -> None:
        self.loaded: dict[int, list[int]] = defaultdict(list)
        self.asked: dict[int, set[int]] = defaultdict(set)
        self.by_leader: dict[int, int] = defaultdict(int)


def record_loads(nodes: list[QueryNode]) -> Loads:
    loads = Loads()
    for node in nodes:
        original = node.state.load_segments

        def load(request: Any, original: Any = original, node: QueryNode = node, **kwargs: Any) -> Any:
            before = set(node.state.segments)
            result = original(request, **kwargs)
            for info in load_items(request):  # infos, or the catalog's binlogs of a planned load
                loads.asked[info.segment_id].add(request.task_id)
                if info.segment_id not in before and info.segment_id in node.state.segments:
                    loads.loaded[info.segment_id].append(request.task_id)
                    loads.by_leader[request.fence.leader_revision] += 1
            return result

        node.state.load_segments = load  # type: ignore[method-assign]
    return loads


async def test_switchover_to_a_standby_during_a_load(etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """A leads, B and C stand by (B next in line); `switchover --to C` mid-load: B steps back, C leads, the load
    finishes, every segment is loaded once by the task planned for it, and no task key is left."""
    async with QueryCluster(etcd, root_path) as c:
        assert c.kv is not None
        for _ in range(3):
            await c.add_node(faults=FaultConfig(latency_ms=600))
        loads = record_loads(c.nodes)
        async with Processes(etcd, root_path, tmp_path) as procs:
            for name in ("coord-a", "coord-b", "coord-c"):
                await procs.coordinator(*SLOW_LOAD_FLAGS, name=name)
                await queued(c.kv, len(procs.started))
            a, b, cc = procs.started
            await a.next_event("leader", timeout=60)
            assert await queued(c.kv, 3) == [a.address, b.address, cc.address]
            fences = {q.address: q.create_revision for q in await candidates(c.kv)}

            catalog = CatalogStore(c.kv)
            desc, _ = await catalog.create_bulk_collection("switch", num_partitions=4, num_segments=SEGMENTS)
            cid = desc.collection_id
            addresses = ",".join(p.address for p in procs.started)
            client = QueryCoordClient(addresses, deadline=60)
            r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
            assert r.status.error_code == common_pb2.SUCCESS, r
            while sum(len(n.state.segments) for n in c.nodes) < 30:  # mid-load
                await asyncio.sleep(0.05)
            sent = time.time()
            code, out, err = await cli("--address", addresses, "switchover", "--to", cc.address, "-o", "json")
            held_then = sum(len(n.state.segments) for n in c.nodes)
            assert code == 0, err
            result = json.loads(out)
            assert (result["previous_leader"], result["leader"], result["stepped_back"]) == (
                a.address, cc.address, [b.address])
            took_over = await cc.next_event("leader", timeout=30)
            await a.next_event("standby", timeout=30)
            print(f"switchover at {held_then}/{SEGMENTS} segments: elected {result['handover_s']:.3f}s after the old "
                  f"leader resigned, serving {result['serving_s']:.3f}s after the command started; leader event "
                  f"{took_over['t'] - sent:.3f}s after the command was started (incl. its Python start-up)")

            await wait_in_memory(client, cid, timeout=120)
            print(f"load finished {time.time() - sent:.1f}s after the switchover command was started")
            await c.wait_no_task_keys(timeout=60)
            held = [set(n.state.segments) for n in c.nodes]
            assert sum(len(h) for h in held) == SEGMENTS == len(set().union(*held)), "each segment on exactly one node"
            assert sorted(loads.loaded) == sorted(set().union(*held))
            twice = {sid: tasks for sid, tasks in loads.loaded.items() if len(tasks) != 1}
            assert not twice, f"segments loaded more than once: {twice}"
            replanned = {sid: tasks for sid, tasks in loads.asked.items() if len(tasks) != 1}
            assert not replanned, f"segments asked for by more than one task: {replanned}"
            # Mid-load indeed: the old leader loaded some segments, the new one (its fence is its queued key) the rest.
            assert sorted(loads.by_leader) == [fences[a.address], fences[cc.address]], dict(loads.by_leader)
            # The new leader resumed the persisted trigger (same id) and finished it.
            got = await client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))
            assert got.status.error_code == common_pb2.SUCCESS, got
            assert got.tree.trigger.state == qc.TASK_STATE_EXPIRED, got.tree.trigger

            code, out, err = await cli("status", *etcd_flags(etcd, root_path), "-o", "json")
            assert code == 0, err
            status = json.loads(out)
            roles = {co["address"]: co["role"] for co in status["coordinators"]}
            assert status["leader"] == cc.address
            assert roles == {cc.address: "leader", a.address: "standby", b.address: "standby"}
            assert await c.kv.get(SWITCHOVER_KEY) is None
            await client.close()


async def test_switchover_refusals_then_to_the_next_in_line(etcd: EtcdCluster, root_path: str, kv: MetaKV,
                                                             tmp_path: Path) -> None:
    async with Processes(etcd, root_path, tmp_path) as procs:
        a = await procs.coordinator(name="coord-a")
        await a.next_event("leader", timeout=60)
        code, _, err = await cli("--address", a.address, "switchover")
        assert code == 1 and err.startswith("error: no standby coordinator"), err

        b = await procs.coordinator(name="coord-b")
        await queued(kv, 2)
        addresses = f"{a.address},{b.address}"
        nobody = f"127.0.0.1:{free_port()}"
        code, _, err = await cli("--address", addresses, "switchover", "--to", nobody)
        assert code == 1 and f"{nobody} is not a live standby" in err and b.address in err, err
        code, _, err = await cli("--address", addresses, "switchover", "--to", a.address)
        assert code == 1 and "already leads" in err, err

        await kv.save(SWITCHOVER_KEY, json.dumps({"from": "x:1", "to": "y:2", "started": time.time()}))
        code, _, err = await cli("--address", addresses, "switchover")
        assert code == 1 and "another switchover is in progress (from x:1 to y:2" in err, err
        await kv.remove(SWITCHOVER_KEY)
        assert await queued(kv, 2) == [a.address, b.address], "a refused switchover changes nothing"

        code, out, err = await cli("--address", addresses, "switchover")
        assert code == 0, err
        assert f"{a.address} led, {b.address} leads now" in out, out
        await b.next_event("leader", timeout=30)
        await a.next_event("standby", timeout=30)
        assert await queued(kv, 2) == [b.address, a.address]
        assert await kv.get(SWITCHOVER_KEY) is None

