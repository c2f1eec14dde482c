"""Durable task history (querycoord/task/history.py): written with a finished tree's removal, pruned by count and
age, answered by every coordinator (leader, standby, new leader) and by the CLI. Real etcd, real clusters."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable
from typing import Any

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig
from querycoord.settings.coord_options import add_coord_options, config_from_args
from querycoord.task.history import HISTORY_PREFIX, MAX_RECORD_BYTES, TaskHistory, history_key, summarize
from querycoord.task.model import now_ms
from querycoord.task.store import TRIGGER_PREFIX, TaskStore, info_key, request_key
from tests.cluster import QueryCluster, fast_scheduler, running_cluster, until

FINISHED = (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED)


async def history_ids(kv: MetaKV) -> list[int]:
    return await TaskHistory(kv).ids()


async def list_history(client: QueryCoordClient, **kw: Any) -> list[qc.TaskTree]:
    """Every page of ListTasks(include_finished) with ``kw``, checked."""
    trees: list[qc.TaskTree] = []
    after = 0
    while True:
        resp = await client.query("ListTasks", qc.ListTasksRequest(include_finished=True, after_task_id=after, **kw))
        assert resp.status.error_code == common_pb2.SUCCESS, resp.status
        trees.extend(resp.trees)
        if not resp.next_after_task_id:
            return trees
        after = resp.next_after_task_id


async def get_task(client: QueryCoordClient, task_id: int) -> qc.GetTaskResponse:
    return await client.query("GetTask", qc.GetTaskRequest(task_id=task_id))


# ----- what a record holds ----------------------------------------------------------------------------------------
async def test_a_finished_load_leaves_its_history_record_and_no_task_key(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None, None]) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("hist", partitions=2, segments=24)
        task_id = (await c.load_collection(cid)).task_id
        await c.wait_idle()
        await c.wait_no_task_keys()
        tree = await TaskHistory(c.kv).get(task_id)
        assert tree is not None, "the finished load has a history record"
        t = tree.trigger
        assert (t.task_id, t.kind, t.collection_id) == (task_id, qc.TASK_KIND_LOAD_COLLECTION, cid)
        assert t.state == qc.TASK_STATE_EXPIRED and not t.error, "success (users read DONE)"
        assert t.trigger_condition == qc.TRIGGER_CONDITION_GRPC_REQUEST
        assert 0 < t.created_ms <= t.started_ms <= t.finished_ms <= now_ms()
        assert tree.child_counts.total == len(tree.children) > 0
        assert tree.child_counts.done == tree.child_counts.total, "every child succeeded"
        assert all(ch.parent_id == task_id and ch.state == qc.TASK_STATE_DONE and ch.retry_count >= 1
                   for ch in tree.children)
        node_ids = {n.node_id for n in c.nodes}
        loads = [ch for ch in tree.children if ch.kind == qc.TASK_KIND_LOAD_SEGMENT]
        assert loads and all(ch.node_id in node_ids for ch in loads), "children name their node"
        # GetTask and ListTasks answer from it: by the trigger id and by a child's id.
        for asked in (task_id, loads[0].task_id):
            got = await get_task(c.client, asked)
            assert got.status.error_code == common_pb2.SUCCESS and got.tree.trigger.task_id == task_id
        listed = {tr.trigger.task_id: tr for tr in await list_history(c.client, include_children=True)}
        assert listed[task_id].trigger.finished_ms == t.finished_ms
        assert len(listed[task_id].children) == len(tree.children)
        missing = await get_task(c.client, 10**15)
        assert missing.status.error_code == common_pb2.NOT_FOUND and "task history" in missing.status.reason


async def test_a_failed_and_a_cancelled_task_keep_their_error(etcd: EtcdCluster, root_path: str) -> None:
    broken = FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"}))
    async with running_cluster(etcd, root_path, [broken, broken]) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("doomed", partitions=1, segments=10)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS
        await c.wait_idle()
        await c.wait_no_task_keys()
        tree = await TaskHistory(c.kv).get(r.task_id)
        assert tree is not None
        assert tree.trigger.state == qc.TASK_STATE_FAILED and "could not be rescheduled" in tree.trigger.error
        assert tree.trigger.error_code != common_pb2.SUCCESS
        failed = [ch for ch in tree.children if ch.state == qc.TASK_STATE_FAILED]
        assert failed and all(ch.error and ch.retry_count >= 1 for ch in failed), "failed children keep theirs"
        assert tree.child_counts.failed == len(failed)
        got = await get_task(c.client, r.task_id)
        assert got.tree.trigger.error == tree.trigger.error


# ----- any coordinator answers ------------------------------------------------------------------------------------
async def test_standby_and_new_leader_answer_from_the_history(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        assert c.kv is not None
        first = await c.start_coordinator()
        await c.wait_leader()
        second = await c.start_coordinator()
        await c.add_node()
        cid = await c.create_collection("failover", partitions=1, segments=12)
        task_id = (await c.load_collection(cid)).task_id
        await c.wait_idle()
        await c.wait_no_task_keys()
        assert not second.coord.is_leader
        async with QueryCoordClient([second.address], deadline=15) as standby:
            got = await get_task(standby, task_id)
            assert got.status.error_code == common_pb2.SUCCESS, got.status
            assert got.tree.trigger.state == qc.TASK_STATE_EXPIRED and got.tree.children
            assert task_id in {tr.trigger.task_id for tr in await list_history(standby)}
        await first.stop()
        c.coords.remove(first)
        await until("the standby leads", lambda: asyncio.sleep(0, second.coord.is_leader))
        third = await c.start_coordinator()  # a new standby
        for address in (second.address, third.address):
            async with QueryCoordClient([address], deadline=15) as client:
                got = await get_task(client, task_id)
                assert got.status.error_code == common_pb2.SUCCESS, (address, got.status)
                assert got.tree.trigger.task_id == task_id and got.tree.trigger.state == qc.TASK_STATE_EXPIRED
                newest = await client.query("ListTasks", qc.ListTasksRequest(
                    include_finished=True, newest_first=True, states=FINISHED, limit=1))
                assert [tr.trigger.task_id for tr in newest.trees] == [task_id]


# ----- retention ---------------------------------------------------------------------------------------------------
async def test_the_leader_prunes_the_history_to_its_count(etcd: EtcdCluster, root_path: str) -> None:
    sched = fast_scheduler(history_keep=2, history_sweep_interval=0.2)
    async with running_cluster(etcd, root_path, [None], scheduler=sched) as c:
        assert c.client is not None and c.kv is not None
        cid = await c.create_collection("keep", partitions=1, segments=4)
        ids = []
        for _ in range(2):  # four trees finish: more than the two kept
            ids.append((await c.load_collection(cid)).task_id)
            r = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
            assert r.status.error_code == common_pb2.SUCCESS, r.status
            ids.append(r.task_id)
            await c.wait_idle()
        kv = c.kv
        await until("the history pruned to the newest two", lambda: _equal(history_ids(kv), sorted(ids)[-2:]))
        assert await TaskHistory(kv).count() == 2


async def _equal(got: Awaitable[Any], expected: Any) -> bool:
    return await got == expected


async def test_the_leader_prunes_records_older_than_the_max_age(etcd: EtcdCluster, root_path: str) -> None:
    sched = fast_scheduler(history_max_age=3600.0, history_sweep_interval=0.2)
    async with running_cluster(etcd, root_path, [], scheduler=sched) as c:
        assert c.kv is not None
        old, fresh = 10**15, 10**15 + 1
        for task_id, finished in ((old, now_ms() - 2 * 3600 * 1000), (fresh, now_ms())):
            info = qc.TaskInfo(task_id=task_id, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_EXPIRED)
            tree = summarize(info, [], started_ms=finished - 10, finished_ms=finished, max_children=10)
            await c.kv.save(history_key(task_id), tree.SerializeToString())  # as an outside hand would
        kv = c.kv
        await until("the old record pruned", lambda: _equal(history_ids(kv), [fresh]))


async def _write_record(kv: MetaKV, task_id: int, finished_ms: int) -> None:
    info = qc.TaskInfo(task_id=task_id, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_EXPIRED)
    tree = summarize(info, [], started_ms=finished_ms - 10, finished_ms=finished_ms, max_children=10)
    await kv.save(history_key(task_id), tree.SerializeToString())


async def test_pruning_by_count_keeps_the_records_that_finished_last_not_the_highest_ids(kv: MetaKV) -> None:
    """A long load with a low id finishes after later triggers: its record is the newest and must stay."""
    now = now_ms()
    for task_id, finished in ((10, now), (20, now - 3000), (30, now - 2000), (40, now - 1000)):
        await _write_record(kv, task_id, finished)
    history = TaskHistory(kv)
    assert await history.prune(keep=2, max_age_s=0, now_ms=now) == 2
    assert await history_ids(kv) == [10, 40]
    await _write_record(kv, 5, now + 1000)  # the same pruner again: it reads only the new record's time
    assert await history.prune(keep=2, max_age_s=0, now_ms=now) == 1
    assert await history_ids(kv) == [5, 10]


async def test_pruning_by_age_finds_an_old_record_behind_many_young_ones(kv: MetaKV) -> None:
    """Age goes by finish time over every record, not from the lowest id until some young ones in a row."""
    now = now_ms()
    for task_id in range(1, 81):
        await _write_record(kv, task_id, now - 1000)
    await _write_record(kv, 81, now - 2 * 3600 * 1000)  # the highest id, finished long ago
    await kv.save(history_key(82), b"\xff not a task tree")  # an outside hand's value: counts as oldest
    history = TaskHistory(kv)
    assert await history.prune(keep=1000, max_age_s=3600, now_ms=now) == 1
    assert await history_ids(kv) == [*range(1, 81), 82]
    assert await history.prune(keep=80, max_age_s=3600, now_ms=now) == 1
    assert await history_ids(kv) == list(range(1, 81))


# ----- the commit txn ---------------------------------------------------------------------------------------------
async def test_a_tree_larger_than_a_txn_writes_its_history_once_in_the_commit_txn(kv: MetaKV) -> None:
    store = TaskStore(kv)
    trigger = task_pb2.TaskRecord(id=1000, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_DONE,
                                  collection_id=7, created_ms=now_ms())
    trigger.load_collection.collection_id = 7
    children = []
    for i in range(150):  # 300 keys: three txns of at most 128 ops
        ch = task_pb2.TaskRecord(id=2000 + i, parent_id=1000, kind=qc.TASK_KIND_LOAD_SEGMENT,
                                 state=qc.TASK_STATE_DONE, node_id=1 + i % 3, retry_count=1, created_ms=now_ms())
        ch.load_segments.node_id = ch.node_id
        children.append(ch)
    await store.commit_children(trigger, children)
    trigger.state = qc.TASK_STATE_EXPIRED
    infos = [qc.TaskInfo(task_id=c.id, parent_id=1000, kind=c.kind, state=c.state, node_id=c.node_id,
                         retry_count=c.retry_count, error="x" * 1000) for c in children]
    history = summarize(qc.TaskInfo(task_id=1000, kind=trigger.kind, state=trigger.state, collection_id=7),
                        infos, started_ms=now_ms(), finished_ms=now_ms(), max_children=100)
    before = store.txns
    await store.remove_tree(trigger, children, history)
    assert store.txns - before >= 3, "the removal took several txns"
    assert all(v == 0 for v in (await store.count_keys()).values())
    written = await kv.get_kv(history_key(1000))
    assert written is not None and written.version == 1, "written exactly once"
    rev = written.mod_revision
    assert await kv.get_kv(request_key(trigger), revision=rev - 1) is not None, "the trigger existed just before"
    assert await kv.get_kv(request_key(trigger), revision=rev) is None, "and was removed in the history's txn"
    assert await kv.get_kv(info_key(1000), revision=rev) is None
    left = [ch.id for ch in children if await kv.get_kv(request_key(ch), revision=rev - 1) is not None]
    assert len(left) < 64, "most children went in earlier txns (the commit txn takes the last ones)"
    assert all([await kv.get_kv(request_key(ch), revision=rev) is None for ch in children])
    assert await kv.count_prefix(HISTORY_PREFIX) == 1
    stored = await TaskHistory(kv).get(1000)
    assert stored is not None and stored.child_counts.total == 150 and len(stored.children) == 100
    assert all(len(ch.error) <= 300 for ch in stored.children)
    assert (await TaskHistory(kv).find(2000 + 5)) == stored, "a listed child's id finds its trigger's record"


def test_a_record_stays_small_however_many_children() -> None:
    infos = [qc.TaskInfo(task_id=i, parent_id=1, kind=qc.TASK_KIND_LOAD_SEGMENT,
                         state=qc.TASK_STATE_FAILED if i % 7 == 0 else qc.TASK_STATE_DONE, node_id=i % 5,
                         error="e" * 2000, summary="load 400 segments of partitions " + "1, " * 200,
                         excluded_node_ids=list(range(50))) for i in range(2, 5002)]
    tree = summarize(qc.TaskInfo(task_id=1, error="boom " * 400), infos, started_ms=1, finished_ms=2,
                     max_children=5000)
    assert tree.ByteSize() <= MAX_RECORD_BYTES
    assert tree.child_counts.total == 5000 and tree.child_counts.failed == len([i for i in infos if i.state == 5])
    assert tree.children and all(ch.state == qc.TASK_STATE_FAILED for ch in tree.children), "failures listed first"
    assert tree.trigger.error == "boom " * 400


def test_history_options_reach_the_config_and_refuse_bad_values() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_coord_options(p)
    etcd = ["--etcd-endpoints", "127.0.0.1:2379"]
    cfg = config_from_args(p.parse_args([*etcd, "--history-keep", "5", "--history-max-age-s", "60"]))
    assert (cfg.scheduler.history_keep, cfg.scheduler.history_max_age) == (5, 60.0)
    for bad in (["--history-keep", "-1"], ["--history-max-age-s", "-2"], ["--history-sweep-interval", "0"]):
        try:
            config_from_args(p.parse_args([*etcd, *bad]))
        except ValueError as exc:
            assert bad[0] in str(exc)
        else:
            raise AssertionError(f"{bad} accepted")


# ----- the command line --------------------------------------------------------------------------------------------
async def _cli(env: dict[str, str], address: str, *args: str) -> tuple[int, str, str]:
    """``querycoord --address A <args>`` as a real process (asynchronously: the cluster runs in this loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "querycoord.cli", "--address", address, "--timeout", "15", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert b"Traceback" not in err, err.decode()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cli_tasks_history_and_show(etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str]) -> None:
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.client is not None
        cid = await c.create_collection("cli", partitions=1, segments=6)
        task_id = (await c.load_collection(cid)).task_id
        await c.wait_idle()
        await c.wait_no_task_keys()
        address = c.coords[0].address
        rc, out, err = await _cli(subprocess_env, address, "tasks", "--history", "-o", "json")
        assert rc == 0, err
        records = {r["task_id"]: r for r in json.loads(out)}
        rec = records[task_id]
        assert (rec["state"], rec["outcome"], rec["collection_id"]) == ("DONE", "DONE", cid)
        assert rec["finished_ms"] >= rec["started_ms"] >= rec["created_ms"] > 0
        rc, out, err = await _cli(subprocess_env, address, "tasks", "show", str(task_id), "-o", "json")
        assert rc == 0, err
        shown = json.loads(out)
        assert shown["task_id"] == task_id and shown["state"] == "DONE" and shown["children"]
        assert all(ch["state"] == "DONE" and ch["node_id"] == c.nodes[0].node_id for ch in shown["children"])
        rc, out, err = await _cli(subprocess_env, address, "tasks", "show", str(task_id))
        assert rc == 0, err
        assert f"#{task_id}" in out and "DONE" in out and "finished" in out
        rc, out, err = await _cli(subprocess_env, address, "tasks", "--history")
        assert rc == 0 and f"#{task_id}" in out and "DONE" in out, (out, err)
        rc, out, err = await _cli(subprocess_env, address, "tasks", "show", str(10**15))
        assert rc == 1 and err.startswith("error: ") and str(10**15) in err, err
        rc, out, err = await _cli(subprocess_env, address, "tasks", "show")
        assert rc == 2 and err.startswith("error: ") and "task id" in err, err



async def test_a_load_with_more_children_than_a_txn_holds_writes_its_history_in_the_commit_txn(
    etcd: EtcdCluster, root_path: str
) -> None:
    # Tiny LoadSegments requests: one child per segment or so, hundreds of task keys to remove.
    async with running_cluster(etcd, root_path, [None, None], scheduler=fast_scheduler(max_request_bytes=1)) as c:
        assert c.kv is not None
        cid = await c.create_collection("wide", partitions=1, segments=120)
        task_id = (await c.load_collection(cid)).task_id
        await c.wait_idle()
        await c.wait_no_task_keys()
        written = await c.kv.get_kv(history_key(task_id))
        assert written is not None and written.version == 1, "written exactly once"
        tree = qc.TaskTree.FromString(written.value)
        assert tree.child_counts.total > 64, "more children than one txn can remove (2 keys each, 128 ops)"
        assert len(tree.children) == min(tree.child_counts.total, 100)
        trigger_key = f"{TRIGGER_PREFIX}{task_id}"
        assert await c.kv.get_kv(trigger_key, revision=written.mod_revision - 1) is not None
        assert await c.kv.get_kv(trigger_key, revision=written.mod_revision) is None, "removed in the history's txn"

