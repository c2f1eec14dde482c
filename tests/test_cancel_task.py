"""CancelTask: a queued or running trigger stops, its rollback undoes what the nodes hold, its tree goes to the
history as CANCELLED with the reason and who asked; the cancel survives a leader crash; bad ids are refused.
Real etcd, real coordinators and query nodes on loopback (slowed by their fault hooks), the CLI as a process."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from pathlib import Path

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.metatool import snapshot
from querycoord.metatool.verify import verify
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig
from querycoord.nodes.querynode_state import QueryNodeState
from querycoord.task.model import TaskCancelled
from querycoord.task.repair import RepairTask
from querycoord.task.store import TaskStore, cancel_key
from tests.cluster import MiB, QueryCluster, fast_scheduler, running_cluster
from tests.test_cli_messages import arun, one_error_line
from tests.test_explain import readme_block

README_LOAD = "querycoord collection load toobig --replicas 2      # two query nodes of 64 MiB; 20 segments of 5 MiB"
README_CANCEL = 'querycoord tasks cancel 7 --reason "wrong collection"'


def _shape(line: str) -> str:
    """A line with its ids and its caller left out: what a README example and a run must share."""
    return re.sub(r"\d+", "N", re.sub(r"\(by [^)]*\)", "(by WHO)", line))

SLOW = FaultConfig(latency_ms=800)


async def _ended(c: QueryCluster, task_id: int, timeout: float = 60.0) -> qc.TaskInfo:
    """The trigger once finished (from GetTask: the history's record)."""
    assert c.client is not None
    deadline = time.monotonic() + timeout
    while True:
        got = await c.client.query("GetTask", qc.GetTaskRequest(task_id=task_id))
        if got.status.error_code == common_pb2.SUCCESS and got.tree.trigger.state in (
                qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED):
            return got.tree.trigger
        assert time.monotonic() < deadline, f"task {task_id} did not finish: {got}"
        await asyncio.sleep(0.1)


def _holds(state: QueryNodeState, cid: int) -> bool:
    d = state.distribution()
    return any(s.collection_id == cid for s in d.segments) or any(ch.collection_id == cid for ch in d.channels)


async def _nodes_hold_nothing_of(c: QueryCluster, cid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while any(_holds(n.state, cid) for n in c.nodes if n.healthy):
        assert time.monotonic() < deadline, {n.node_id: n.state.distribution() for n in c.nodes}
        await asyncio.sleep(0.1)


async def _not_loaded(c: QueryCluster, cid: int) -> None:
    assert c.client is not None
    show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    assert show.status.error_code == common_pb2.NOT_FOUND, show


async def test_cancel_a_running_load_rolls_it_back_on_the_nodes(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [SLOW] * 2) as c:
        cid = await c.create_collection("slow", partitions=2, segments=20)
        assert c.client is not None
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        got = await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=r.task_id, reason="wrong collection"))
        assert got.status.error_code == common_pb2.SUCCESS, got.status
        assert got.task.task_id == r.task_id
        t = await _ended(c, r.task_id)
        assert t.state == qc.TASK_STATE_CANCELLED, t
        assert t.error_code == common_pb2.CANCELLED and "wrong collection" in t.error and "(by " in t.error, t
        await _not_loaded(c, cid)
        await _nodes_hold_nothing_of(c, cid)
        hist = await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True, collection_id=cid))
        assert [tr.trigger.state for tr in hist.trees if tr.trigger.task_id == r.task_id] == \
            [qc.TASK_STATE_CANCELLED]
        again = await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=r.task_id))
        assert again.status.error_code == common_pb2.CONFLICT, again.status
        assert again.status.reason == f"task {r.task_id} already finished: CANCELLED"
        await c.wait_no_task_keys()


async def test_cancel_a_balance_midway_loses_no_segment(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [FaultConfig(latency_ms=400) for _ in range(3)]) as c:
        cid = await c.create_collection("moving", partitions=1, segments=30)
        await c.load_collection(cid)
        await c.wait_idle()
        before = {sid: sum(sid in n.state.segments for n in c.nodes) for n in c.nodes for sid in n.state.segments}
        assert before and all(v == 1 for v in before.values()), before
        src = max(c.nodes, key=lambda n: len(n.state.segments))
        assert c.client is not None
        r = await c.client.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[src.node_id]))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        got = await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=r.task_id, reason="stop moving"))
        assert got.status.error_code == common_pb2.SUCCESS, got.status
        t = await _ended(c, r.task_id)
        assert t.state == qc.TASK_STATE_CANCELLED, t
        await c.wait_idle()
        after = {sid: sum(sid in n.state.segments for n in c.nodes) for sid in before}
        assert all(after[sid] >= before[sid] for sid in before), {s: n for s, n in after.items() if n < 1}


async def test_a_cancelled_tree_is_cancelled_from_the_end_of_its_rollback(etcd: EtcdCluster, root_path: str) -> None:
    """The rollback of a cancelled tree ends with the tree CANCELLED, never FAILED: the executor awaits that
    rollback through another task, and GetTask once answered in that step, showing a cancelled balance FAILED."""
    async with running_cluster(etcd, root_path, [None]) as c:
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        cid = await c.create_collection("rolled", partitions=1, segments=2)
        t = RepairTask.new(lead.scheduler.env, task_pb2.RepairRequest(reason="x"),
                           trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
        t.cancel_why = "stop"
        await lead.scheduler.children.fail(t, TaskCancelled("cancelled: stop"))
        assert t.rec.state == qc.TASK_STATE_CANCELLED, t.rec


async def test_a_cancel_survives_a_leader_crash_right_after_it(etcd: EtcdCluster, root_path: str) -> None:
    """The cancel is on the trigger's record before anything is undone: the new leader finishes the tree as
    cancelled (rolled back), never resumes the load."""
    async with QueryCluster(etcd, root_path) as c:
        first = await c.start_coordinator()
        await c.wait_leader()
        await c.start_coordinator()
        for _ in range(2):
            await c.add_node(capacity=1024 * MiB, faults=FaultConfig(latency_ms=1500))
        cid = await c.create_collection("crash", partitions=2, segments=20)
        assert c.client is not None
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        got = await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=r.task_id, reason="leader test"))
        assert got.status.error_code == common_pb2.SUCCESS, got.status
        c.coords.remove(first)
        c.client.addresses.remove(first.address)
        await first.crash()
        new = await c.wait_leader(timeout=60)
        assert new is not first
        t = await _ended(c, r.task_id, timeout=90)
        assert t.state == qc.TASK_STATE_CANCELLED and "leader test" in t.error, t
        await _not_loaded(c, cid)
        await _nodes_hold_nothing_of(c, cid, timeout=90)


async def test_bad_ids_are_refused_clearly(etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [SLOW] * 2) as c:
        done = await c.create_collection("done", partitions=1, segments=4)
        loaded = await c.load_collection(done)
        await c.wait_idle()
        assert c.client is not None

        async def cancel(task_id: int) -> common_pb2.Status:
            return (await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=task_id))).status  # type: ignore[union-attr]

        st = await cancel(loaded.task_id)
        assert (st.error_code, st.reason) == (common_pb2.CONFLICT, f"task {loaded.task_id} already finished: DONE")
        st = await cancel(10**12)
        assert st.error_code == common_pb2.NOT_FOUND and "unknown" in st.reason, st
        st = await cancel(0)
        assert st.error_code == common_pb2.ILLEGAL_ARGUMENT and "task_id" in st.reason, st
        cid = await c.create_collection("running", partitions=2, segments=20)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        tree = (await c.client.query("GetTask", qc.GetTaskRequest(task_id=r.task_id))).tree
        child = tree.children[0].task_id
        st = await cancel(child)
        assert (st.error_code, st.reason) == (common_pb2.ILLEGAL_ARGUMENT,
                                              f"task {child} is a child of trigger {r.task_id}; cancel {r.task_id}")
        await c.wait_loaded(cid)
        release = asyncio.create_task(c.client.query("ReleaseCollection",
                                                     qc.ReleaseCollectionRequest(collection_id=cid)))
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        deadline = time.monotonic() + 30
        while not (ids := [t.id for t in lead.scheduler.pending(cid)]):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        st = await cancel(ids[0])
        assert st.error_code == common_pb2.ILLEGAL_ARGUMENT and "is a release, which cannot be cancelled" in st.reason
        assert (await release).status.error_code == common_pb2.SUCCESS


async def test_cli_cancel_and_an_admission_refusal(etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str],
                                                   project_root: Path) -> None:
    """The CLI as a process: one-line refusals with their exit codes, and README's examples as printed. One
    segment per LoadSegments call, one call at a time per node, each slow: the load still runs when the CLI
    process has started."""
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(max_request_bytes=1)) as c:
        coord = await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node(capacity=64 * MiB, faults=FaultConfig(latency_ms=1500))
        addr = ("--address", coord.address)
        r = await arun(subprocess_env, "tasks", "cancel", "999999", *addr)
        assert r.returncode == 1
        one_error_line(r, "task 999999 is unknown")
        r = await arun(subprocess_env, "tasks", "cancel", *addr)
        assert r.returncode == 2
        one_error_line(r, "needs a task id")
        big = await c.create_collection("toobig", partitions=2, segments=20)
        r = await arun(subprocess_env, "collection", "load", "toobig", "--replicas", "2", *addr)
        assert r.returncode == 1
        line = one_error_line(r, f"load of collection {big} needs 2 replicas x", "missing, about")
        assert [line.replace(f"collection {big} ", "collection 1 ")] == readme_block(project_root, README_LOAD)
        cid = await c.create_collection("small", partitions=1, segments=16)
        assert c.client is not None
        load = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        r = await arun(subprocess_env, "tasks", "cancel", str(load.task_id), "--reason", "wrong collection", *addr)
        assert r.returncode == 0, r.stderr
        assert f"task #{load.task_id} CANCELLED: cancelled: wrong collection (by " in r.stdout, r.stdout
        assert [_shape(x) for x in r.stdout.strip().splitlines()] == \
            [_shape(x) for x in readme_block(project_root, README_CANCEL)]
        await _nodes_hold_nothing_of(c, cid)


def _race_the_commit(c: QueryCluster, store: TaskStore, *, hold: bool) -> asyncio.Event:
    """Make the leader's plan commit race a CancelTask, deterministically: the commit's record is built (as the
    store builds its txn, before sending it), then the cancel is written and answered, then the commit's txn is
    sent. ``hold``: the tree then stops there (the leader dies with the plan committed and the cancel stored).
    The event is set once the commit is written."""
    committed = asyncio.Event()
    plain = store.commit_children

    async def racing(trigger: task_pb2.TaskRecord, children: Sequence[task_pb2.TaskRecord]) -> None:
        in_flight = task_pb2.TaskRecord()
        in_flight.CopyFrom(trigger)
        assert c.client is not None
        got = await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=trigger.id, reason="race"))
        assert got.status.error_code == common_pb2.SUCCESS, got.status
        await plain(in_flight, children)
        committed.set()
        if hold:
            await asyncio.Event().wait()

    store.commit_children = racing  # type: ignore[method-assign]
    return committed


async def test_a_cancel_written_while_the_plan_commits_holds_on_this_leader(etcd: EtcdCluster,
                                                                             root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        leader = await c.start_coordinator()
        await c.wait_leader()
        for _ in range(2):
            await c.add_node(capacity=1024 * MiB)
        cid = await c.create_collection("race", partitions=1, segments=8)
        lead = leader.coord.leadership
        assert lead is not None and c.client is not None
        _race_the_commit(c, lead.scheduler.env.store, hold=False)
        r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
        assert r.status.error_code == common_pb2.SUCCESS, r.status
        t = await _ended(c, r.task_id)
        assert t.state == qc.TASK_STATE_CANCELLED and "race" in t.error, t
        await _not_loaded(c, cid)
        await _nodes_hold_nothing_of(c, cid)
        await c.wait_no_task_keys()


async def test_a_cancel_written_while_the_plan_commits_holds_after_a_leader_change(etcd: EtcdCluster,
                                                                                    root_path: str) -> None:
    """The leader dies right after the racing commit: the new leader reloads the committed tree and must find the
    cancel (it is not on the record the commit wrote), so it rolls the tree back instead of resuming the load. A
    cancel key with no trigger is dropped by that reload."""
    async with QueryCluster(etcd, root_path) as c:
        first = await c.start_coordinator()
        await c.wait_leader()
        await c.start_coordinator()
        for _ in range(2):
            await c.add_node(capacity=1024 * MiB)
        cid = await c.create_collection("race", partitions=1, segments=8)
        lead = first.coord.leadership
        assert lead is not None and c.client is not None
        committed = _race_the_commit(c, lead.scheduler.env.store, hold=True)
        only_first = QueryCoordClient([first.address], deadline=30)
        load = asyncio.create_task(only_first.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid)))
        try:
            await asyncio.wait_for(committed.wait(), 60)
            task_id = next(i for i, t in lead.scheduler.triggers.items() if t.collection_id == cid)
            assert c.kv is not None
            assert await c.kv.get(cancel_key(task_id)) is not None
            problems = verify(await snapshot.take(c.kv))  # a cancel with its trigger is no orphan
            assert problems == [], [p.as_dict() for p in problems]
            await c.kv.save(cancel_key(10**9), "stray (by an outside hand)")  # the next leader's reload drops it
            c.coords.remove(first)
            c.client.addresses.remove(first.address)
            await first.crash()
        finally:
            load.cancel()
            with contextlib.suppress(BaseException):
                await load
            await only_first.close()
        new = await c.wait_leader(timeout=60)
        assert new is not first
        t = await _ended(c, task_id, timeout=90)
        assert t.state == qc.TASK_STATE_CANCELLED and "race" in t.error, t
        await _not_loaded(c, cid)
        await _nodes_hold_nothing_of(c, cid)
        await c.wait_no_task_keys()


async def test_the_cancel_key_lives_exactly_as_long_as_its_trigger(kv) -> None:
    """Written only while the trigger's record exists, untouched by the record's rewrites, removed in the txn
    that removes the trigger; a stray one (an outside hand) is what reload finds as an orphan."""
    store = TaskStore(kv)
    trigger = task_pb2.TaskRecord(id=5, kind=qc.TASK_KIND_LOAD_COLLECTION, state=qc.TASK_STATE_UNDO)
    trigger.load_collection.collection_id = 1
    assert not await store.mark_cancel(5, "too early (by admin)")
    assert await kv.get(cancel_key(5)) is None
    await store.add_trigger(trigger)
    assert await store.mark_cancel(5, "wrong collection (by admin)")
    trigger.state = qc.TASK_STATE_DONE
    child = task_pb2.TaskRecord(id=6, parent_id=5, kind=qc.TASK_KIND_LOAD_SEGMENT, state=qc.TASK_STATE_UNDO)
    child.load_segments.collection_id = 1
    await store.commit_children(trigger, [child])  # the plan's commit rewrites the record
    await kv.save(cancel_key(77), "no such trigger")
    records = await store.load_all()
    assert await store.load_cancels({r.id for r in records if r.parent_id == 0}) == \
        {5: "wrong collection (by admin)"}
    assert store.orphan_cancel_keys == [cancel_key(77)]
    await store.remove_tree(trigger, [child])
    await store.remove_keys(store.orphan_cancel_keys)
    assert all(v == 0 for v in (await store.count_keys()).values()), await store.count_keys()
    assert not await store.mark_cancel(5, "too late (by admin)")
    assert await kv.get(cancel_key(5)) is None


async def test_cancel_of_a_load_whose_tree_ended_says_it_finished_and_writes_no_cancel_key(
        etcd: EtcdCluster, root_path: str) -> None:
    """Between a tree's end and the removal of its keys the trigger is still queued, but too late to cancel
    (``TriggerQueue.finishing``): CancelTask answers as it does for a tree in the history, and stores nothing."""
    async with running_cluster(etcd, root_path, [None]) as c:
        assert c.client is not None
        cid = await c.create_collection("ending", partitions=1, segments=4)
        env = (await c.wait_leader()).coord.leadership.scheduler.env
        gate, removing = asyncio.Event(), asyncio.Event()
        remove = env.store.remove_tree

        async def held_remove(trigger: task_pb2.TaskRecord, *args: object) -> None:  # the real removal, held
            if trigger.kind == qc.TASK_KIND_LOAD_COLLECTION:
                removing.set()
                await gate.wait()
            await remove(trigger, *args)  # type: ignore[arg-type]

        env.store.remove_tree = held_remove  # type: ignore[method-assign]
        try:
            r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
            assert r.status.error_code == common_pb2.SUCCESS, r.status
            await asyncio.wait_for(removing.wait(), 30)
            got = await c.client.query("CancelTask", qc.CancelTaskRequest(task_id=r.task_id, reason="too late"))
            cancel_keys = await env.store.kv.count_prefix(cancel_key(r.task_id))
        finally:
            gate.set()
            env.store.remove_tree = remove  # type: ignore[method-assign]
        assert got.status.error_code == common_pb2.CONFLICT, got.status
        assert got.status.reason == f"task {r.task_id} already finished: DONE", got.status
        assert (await _ended(c, r.task_id)).state == qc.TASK_STATE_EXPIRED
        assert cancel_keys == 0, "no cancel key was stored for it"
        await c.wait_no_task_keys()
