"""``querycoord meta show|verify|repair`` on a real etcd, against records a real load wrote.

Every problem is planted with a plain ``MetaKV``, as an outside hand would. Verify must find each with its keys and
nothing on the healthy records; a dry run writes nothing; ``--apply`` removes exactly what was planted (the stream
left on a dropped snode is moved) and leaves every healthy key as it was (same value, same mod revision). Beside a
live leader the repair refuses and writes nothing. The CLI runs as a subprocess for show, verify and the refusal.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest

from meta.election import current_leader, election_prefix
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import data_pb2, stream_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.protocol import QUERYCOORD_ELECTION
from querycoord.metatool import repair, show, snapshot
from querycoord.metatool.verify import verify
from querycoord.querymeta import keys as qkeys
from querycoord.stream.store import name_key as stream_name_key
from querycoord.stream.store import snode_key, stream_key
from querycoord.task.store import save_unit
from tests.cluster import QueryCluster

pytestmark = pytest.mark.timeout(240)


async def cli(env: dict[str, str], etcd: EtcdCluster, root: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``querycoord meta ARGS`` as a subprocess, without blocking the loop (in-process sessions keep their leases)."""
    argv = [sys.executable, "-m", "querycoord.cli", "meta", *args, "--etcd-endpoints", ",".join(etcd.endpoints),
            "--root", root]
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode(), err.decode())


def said(etcd: EtcdCluster, root: str) -> list[str]:
    """What ``cli`` prints on stderr when all goes well: the deployment it reads, nothing else."""
    return [f'reading root "{root}" (from --root) at etcd {",".join(etcd.endpoints)} (from --etcd-endpoints)']


async def state(kv: MetaKV) -> dict[str, tuple[bytes, int]]:
    """Every key under the root with its value and mod revision."""
    snap = await snapshot.take(kv)
    return {k: (v.value, v.mod_revision) for k, v in snap.items.items()}


async def wait_no_leader(kv: MetaKV, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while await current_leader(kv, election_prefix(QUERYCOORD_ELECTION)) is not None:
        assert time.monotonic() < deadline, "the stopped coordinator's election key is still there"
        await asyncio.sleep(0.1)


def task_keys(rec: task_pb2.TaskRecord) -> dict[str, bytes]:
    return save_unit(rec).saves


def problems_by_kind(problems: list[Any]) -> dict[str, list[tuple[str, ...]]]:
    out: dict[str, list[tuple[str, ...]]] = {}
    for p in problems:
        out.setdefault(p["kind"] if isinstance(p, dict) else p.kind, []).append(
            tuple(p["keys"] if isinstance(p, dict) else p.keys))
    return out


async def loaded_cluster(cluster: QueryCluster) -> tuple[int, list[int], int, int]:
    """A coordinator and a node; a collection loaded and one not: (loaded, its partitions, node, not loaded)."""
    await cluster.start_coordinator()
    await cluster.wait_leader()
    node = await cluster.add_node()
    await cluster.wait_node_online(node.node_id)
    cid = await cluster.create_collection("orders", partitions=2, segments=6)
    spare = await cluster.create_collection("spare", partitions=1, segments=2)
    await cluster.load_collection(cid)
    await cluster.wait_idle()
    await cluster.wait_no_task_keys()
    leader = cluster.coords[0].coord
    assert leader.catalog is not None
    pids = [p.partition_id for p in await leader.catalog.show_partitions(cid)]
    return cid, pids, node.node_id, spare


async def plant(kv: MetaKV, cid: int, pid: int, node_id: int, spare: int) -> dict[str, list[tuple[str, ...]]]:
    """Write one of each problem as an outside hand would; returns the problems verify must report, by kind."""
    now = int(time.time() * 1000)
    orphan_child = task_pb2.TaskRecord(id=9001, parent_id=9000, kind=qc.TASK_KIND_LOAD_SEGMENT,
                                       state=qc.TASK_STATE_DOING, node_id=3, collection_id=cid, created_ms=now)
    orphan_child.load_segments.SetInParent()
    done_trigger = task_pb2.TaskRecord(id=9200, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_DONE,
                                       collection_id=cid, created_ms=now)
    done_trigger.load_collection.collection_id = cid
    no_request = task_pb2.TaskRecord(id=9300, kind=qc.TASK_KIND_RELEASE_COLLECTION, state=qc.TASK_STATE_UNDO,
                                     collection_id=cid, created_ms=now)
    no_request.release_collection.collection_id = cid
    no_request_info = task_keys(no_request)["queryCoord-taskInfo/9300"]
    dropped_coll = 777777
    dead = data_pb2.SegmentInfo(segment_id=880001, collection_id=cid, partition_id=pid, node_id=999, num_rows=5,
                                mem_size=1024)
    gone_part = data_pb2.SegmentInfo(segment_id=880002, collection_id=cid, partition_id=888888, node_id=999)
    gone_coll_seg = data_pb2.SegmentInfo(segment_id=880003, collection_id=dropped_coll, partition_id=1, node_id=999)
    gone_coll = data_pb2.CollectionLoadInfo(collection_id=dropped_coll, load_type=data_pb2.LOAD_TYPE_COLLECTION)
    gone_coll.partitions.add(partition_id=1, state=data_pb2.PARTITION_STATE_IN_MEMORY, in_memory_percentage=100)
    lost_stream = stream_pb2.StreamDef(id=2, name="lost_stream", source_db="db", source_vgroup_ids=[1],
                                       main_snode_id=55, runner_deploys=1, num_calc_subplans=1)
    unloaded = data_pb2.DmChannelWatchInfo(collection_id=spare, dm_channel="ch-x", node_id=node_id)
    misfiled = data_pb2.SegmentInfo(segment_id=1, collection_id=cid, partition_id=pid, node_id=node_id)
    saves: dict[str, bytes] = {
        qkeys.dm_channel_key(spare, "ch-x"): unloaded.SerializeToString(),
        qkeys.segment_key(cid, pid, 880009): misfiled.SerializeToString(),
        **task_keys(orphan_child), **task_keys(done_trigger),
        "queryCoord-triggerTask/9100": b"",
        "queryCoord-taskCancel/9400": b"no trigger (by admin)",
        "queryCoord-taskInfo/9300": no_request_info,
        qkeys.segment_key(cid, pid, dead.segment_id): dead.SerializeToString(),
        qkeys.segment_key(cid, 888888, gone_part.segment_id): gone_part.SerializeToString(),
        qkeys.collection_key(dropped_coll): gone_coll.SerializeToString(),
        qkeys.segment_key(dropped_coll, 1, gone_coll_seg.segment_id): gone_coll_seg.SerializeToString(),
        stream_key(2): lost_stream.SerializeToString(),
        stream_name_key("lost_stream"): b"2",
        "stream/checkpoints/77": b"\x08\x4d\x10\x03",  # stream 77 does not exist
        "mystery/key": b"who wrote this?",
    }
    await kv.multi_save(saves)
    return {
        "child-without-trigger": [("queryCoord-activeTask/9001", "queryCoord-taskInfo/9001")],
        "request-without-record": [("queryCoord-triggerTask/9100",)],
        "record-without-request": [("queryCoord-taskInfo/9300",)],
        "committed-trigger-without-children": [("queryCoord-triggerTask/9200", "queryCoord-taskInfo/9200")],
        "cancel-without-trigger": [("queryCoord-taskCancel/9400",)],
        "query-meta-of-dropped-collection": [(qkeys.collection_key(dropped_coll),
                                              qkeys.segment_key(dropped_coll, 1, gone_coll_seg.segment_id))],
        "query-meta-of-unloaded": [(qkeys.dm_channel_key(spare, "ch-x"),)],
        "corrupt-query-meta": [(qkeys.segment_key(cid, pid, 880009),)],
        "query-meta-of-dropped-partition": [(qkeys.segment_key(cid, 888888, gone_part.segment_id),)],
        "segment-on-dead-node": [(qkeys.segment_key(cid, pid, dead.segment_id),)],
        "stream-on-dropped-snode": [(stream_key(2),)],
        "stream-record-without-stream": [("stream/checkpoints/77",)],
        "unknown-key": [("mystery/key",)],
    }


async def healthy_streams(kv: MetaKV, node_id: int) -> None:
    """An snode and a stream on it, as the stream store writes them (healthy)."""
    snode = stream_pb2.SnodeInfo(id=1, node_id=node_id, replica_id=0, create_ms=1)
    sdef = stream_pb2.StreamDef(id=1, name="healthy_stream", source_db="db", source_vgroup_ids=[1],
                                main_snode_id=1, runner_deploys=1, num_calc_subplans=1)
    await kv.multi_save({snode_key(1): snode.SerializeToString(), stream_key(1): sdef.SerializeToString(),
                         stream_name_key("healthy_stream"): b"1"})


async def test_verify_finds_each_planted_problem_and_repair_removes_only_them(etcd, root_path, subprocess_env):
    async with QueryCluster(etcd, root_path) as cluster:
        kv = cluster.kv
        assert kv is not None
        cid, pids, node_id, spare = await loaded_cluster(cluster)
        await cluster.coords[0].stop()  # no leader: the node keeps its session
        await wait_no_leader(kv)
        await healthy_streams(kv, node_id)

        healthy_snap = await snapshot.take(kv)
        assert verify(healthy_snap) == [], [p.as_dict() for p in verify(healthy_snap)]
        healthy = await state(kv)
        loaded = show.show(healthy_snap, "segments")
        assert loaded and all(r["node_live"] and r["collection_id"] == cid for r in loaded), loaded

        expected = await plant(kv, cid, pids[0], node_id, spare)
        planted = await state(kv)
        found = verify(await snapshot.take(kv))
        assert problems_by_kind([p for p in found]) == expected, [p.as_dict() for p in found]

        # the CLI: verify -o json lists the same problems and exits 1; show -o json decodes the planted segment
        r = await cli(subprocess_env, etcd, root_path, "verify", "-o", "json")
        assert r.returncode == 1 and r.stderr.splitlines() == said(etcd, root_path), r
        assert problems_by_kind(json.loads(r.stdout)["problems"]) == expected
        r = await cli(subprocess_env, etcd, root_path, "show", "segments", "-o", "json")
        assert r.returncode == 0 and r.stderr.splitlines() == said(etcd, root_path), r
        rows = {row["segment_id"]: row for row in json.loads(r.stdout)["rows"]}
        assert rows[880001]["node_id"] == 999 and rows[880001]["node_live"] is False
        assert {row["segment_id"] for row in loaded} <= set(rows)
        r = await cli(subprocess_env, etcd, root_path, "show", "streams")
        assert r.returncode == 0 and "lost_stream" in r.stdout and "healthy_stream" in r.stdout, r

        # dry run: says what it would do, writes nothing
        dry = await repair.dry_run(kv)
        assert not dry.applied and {o.result for o in dry.outcomes} == {"would fix"}
        assert problems_by_kind([o.problem for o in dry.outcomes]) == expected
        r = await cli(subprocess_env, etcd, root_path, "repair")
        assert r.returncode == 0 and "dry run" in r.stdout, r
        assert await state(kv) == planted

        # --apply (in-process here; the CLI's own --apply is the refusal below): every fix made under its own fence
        report = await repair.apply(kv)
        assert report.applied and "own fence" in report.how, report.how
        assert {o.result for o in report.outcomes} == {"fixed"}, [o.as_dict() for o in report.outcomes]
        after = await state(kv)
        assert verify(await snapshot.take(kv)) == []
        assert after == {**healthy, stream_key(2): after[stream_key(2)],
                         stream_name_key("lost_stream"): planted[stream_name_key("lost_stream")]}
        assert stream_pb2.StreamDef.FromString(after[stream_key(2)][0]).main_snode_id == 1
        assert not [k for k in after if k.startswith(("session/metarepair", "election/"))]


async def test_repair_refuses_beside_a_live_leader(etcd, root_path, subprocess_env):
    async with QueryCluster(etcd, root_path) as cluster:
        kv = cluster.kv
        assert kv is not None
        coord = await cluster.start_coordinator()
        await cluster.wait_leader()
        await kv.save("mystery/key", "planted")

        with pytest.raises(repair.LeaderLive) as refused:
            await repair.apply(kv)
        assert coord.address in str(refused.value) and "nothing was written" in str(refused.value)
        dry = await repair.dry_run(kv)
        assert dry.leader == coord.address and "--apply would refuse" in dry.how
        assert [o.problem.keys for o in dry.outcomes] == [("mystery/key",)]

        r = await cli(subprocess_env, etcd, root_path, "repair", "--apply")
        said_first, *lines = r.stderr.strip().splitlines()
        assert said_first == said(etcd, root_path)[0], r
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), r
        assert coord.address in lines[0] and "never writes beside a live leader" in lines[0], lines
        assert await kv.get("mystery/key") == b"planted"
        assert coord.coord.is_leader
        leader = await current_leader(kv, election_prefix(QUERYCOORD_ELECTION))
        assert leader is not None and leader.value.decode() == coord.address
        assert not [k for k in await state(kv) if k.startswith("session/metarepair")]


async def test_a_second_repair_on_the_same_root_is_refused(kv):
    await kv.save("mystery/key", "planted")
    async with Session(kv, repair.REPAIR_ROLE, "other-repair", ttl=4, server_id=repair.REPAIR_SERVER_ID):
        with pytest.raises(repair.RepairRefused, match="another meta repair runs"):
            await repair.apply(kv)
        assert await kv.get("mystery/key") == b"planted"
        assert await current_leader(kv, election_prefix(QUERYCOORD_ELECTION)) is None
    report = await repair.apply(kv)  # once the other one is gone
    assert [(o.problem.keys, o.result) for o in report.outcomes] == [(("mystery/key",), "fixed")]
    assert await kv.get("mystery/key") is None
