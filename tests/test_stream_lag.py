"""Lag and progress of streams: what the stream nodes report, as ShowStreams, ``stream show`` and /metrics show it.

The end-to-end test runs real processes (two coordinators, two reference stream nodes) and makes one node stop
processing a stream (its ``pause`` control command: the tasks stay RUNNING and keep reporting while the source
advances), fails another stream's trigger, and kills the leader: the new leader shows lag again from the nodes'
next reports, never a value of its own. The other tests hold the pieces: the node's progress model, how a stream's
figures are derived from its tasks', and the cardinality bound of the per-stream gauges.
"""

from __future__ import annotations

import random
import types
from pathlib import Path
from typing import Any

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import stream_pb2 as sp
from querycoord.console.draw_progress import progress_line
from querycoord.nodes.streamnode_state import StreamNodeState
from querycoord.serving.stream_metrics import stream_progress_families
from querycoord.stream.plan import RUNNER, PlannedTask
from querycoord.stream.progress import checkpoint_age_seconds, lag_seconds, stream_progress
from querycoord.stream.runtime import StreamRuntime, TaskRuntime
from tests.spawn import Processes, spawn_snode_host
from tests.stream_client import stub_for, wait_for
from tests.test_metrics import has, scrape, value
from tests.test_stream_cli import Cli

COORD_FLAGS = ("--stream-scale", "0.1", "--http-listen", "127.0.0.1:0")
# Far beyond what a task that keeps up lags (one heartbeat tick of 100 ms, plus the report's age).
SMALL_MS = 3_000
# A paused stream's lag must pass this before the test looks at the surfaces.
LAGGING_MS = 4_000


# ----- the node's progress model -----------------------------------------------------------------------------------
def _running_node() -> StreamNodeState:
    node = StreamNodeState(7, vgroups=[1], groups=1, init_delay_s=0.0)
    for task_id in (1, 2):
        info = sp.TaskId(stream_id=3, task_id=task_id, sid=1, kind=sp.CALC_READER, vgroup_id=1)
        reply = sp.HeartbeatReply(leader_revision=1, deploys=[sp.StreamDeploy(
            stream_id=3, readers=[sp.ReaderDeploy(task=info)])])
        assert node.apply_reply(reply, 0.0).accepted
    return node


def test_node_reports_progress_that_keeps_up_until_paused_and_catches_up_when_resumed() -> None:
    node = _running_node()
    assert all(r.processed_ms == 0 for r in node.reports()), "INIT tasks have processed nothing yet"
    node.tick(1.0, 10_000)  # RUNNING now: it begins at the source's newest event
    for wall in (10_100, 10_200):
        node.tick(1.0, wall)
    reps = {r.task_id: r for r in node.reports()}
    assert {r.source_ms for r in reps.values()} == {10_200}
    assert {r.processed_ms for r in reps.values()} == {10_100}, "a task that keeps up lags by one tick"

    node.pause(3, 2)
    for wall in (10_300, 15_000, 20_200):
        node.tick(1.0, wall)
    reps = {r.task_id: r for r in node.reports()}
    assert reps[1].processed_ms == 15_000 and reps[2].processed_ms == 10_100, "only task 2 stopped processing"
    assert {r.status for r in reps.values()} == {sp.TASK_RUNNING}, "a paused task still runs and reports"

    node.resume(3)
    node.tick(1.0, 20_300)
    assert {r.processed_ms for r in node.reports()} == {20_200}, "resumed: caught up at the next tick"
    node.tick(1.0, 20_100)  # a clock step back never moves the source or a task backwards
    assert {(r.source_ms, r.processed_ms) for r in node.reports()} == {(20_300, 20_300)}


# ----- the leader's derivation -------------------------------------------------------------------------------------
def _task(task_id: int, processed_ms: int, source_ms: int) -> TaskRuntime:
    return TaskRuntime(task=PlannedTask(kind=RUNNER, task_id=task_id), status=sp.TASK_RUNNING,
                       processed_ms=processed_ms, source_ms=source_ms)


def test_stream_progress_is_the_slowest_task_and_the_largest_lag_of_tasks_that_reported() -> None:
    assert stream_progress([]) == (0, 0)
    assert stream_progress([_task(1, 0, 5_000)]) == (0, 0), "no progress reported: none made up"
    tasks = [_task(1, 9_000, 9_500), _task(2, 8_000, 9_900), _task(3, 0, 9_900), _task(4, 9_800, 9_700)]
    assert stream_progress(tasks) == (8_000, 1_900)

    info = sp.StreamStatusInfo(processed_ms=8_000, lag_ms=1_900)
    assert lag_seconds(info) == 1.9 and lag_seconds(sp.StreamStatusInfo(lag_ms=5)) is None
    if "checkpoint_ms" not in sp.StreamStatusInfo.DESCRIPTOR.fields_by_name:
        assert checkpoint_age_seconds(info, 100.0) is None, "no checkpoint field in this build: unknown"
    assert progress_line(info, 100.0).startswith("processed up to ")
    assert progress_line(sp.StreamStatusInfo(), 100.0) == "no task has reported progress"


def _runtime(stream_id: int, lag_ms: int, *, failed: bool = False) -> StreamRuntime:
    rt = StreamRuntime(sdef=sp.StreamDef(id=stream_id, name=f"s{stream_id}"))
    if failed:
        rt.stop_code = 1002
    else:
        rt.tasks[1] = _task(1, 50_000, 50_000 + lag_ms)
    return rt


def _families(streams: dict[int, StreamRuntime], limit: int) -> dict[str, dict[str, float]]:
    manager: Any = types.SimpleNamespace(streams=streams)
    out: dict[str, dict[str, float]] = {}
    for family in stream_progress_families(manager, limit):
        out[family.name] = {s.labels.get("stream", ""): s.value for s in family.samples}
    return out


def test_per_stream_gauges_keep_failed_then_most_lagging_streams_within_the_bound() -> None:
    rng = random.Random(4)
    lags = {i: rng.randrange(0, 100_000) for i in range(1, 41)}
    streams = {i: _runtime(i, lag) for i, lag in lags.items()}
    streams[41] = _runtime(41, 0, failed=True)

    every = _families(streams, 1000)
    assert every["querycoord_stream_metrics_omitted"] == {"": 0}
    assert every["querycoord_stream_failed"] == {str(i): (1 if i == 41 else 0) for i in streams}
    assert every["querycoord_stream_lag_seconds"] == {str(i): lag / 1000 for i, lag in lags.items()}
    assert "41" not in every["querycoord_stream_processed_timestamp_seconds"], "a stopped stream has no progress"

    bounded = _families(streams, 5)
    assert bounded["querycoord_stream_metrics_omitted"] == {"": 36}
    most_lagging = sorted(lags, key=lambda i: -lags[i])[:4]
    assert set(bounded["querycoord_stream_failed"]) == {"41", *map(str, most_lagging)}


# ----- end to end --------------------------------------------------------------------------------------------------
async def test_lag_shows_on_every_surface_grows_with_a_paused_node_and_survives_a_leader_change(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    async with Processes(etcd, root_path, tmp_path) as p:
        first = await p.coordinator(*COORD_FLAGS, name="coord-a")
        await first.wait_event("leader", timeout=30)
        second = await p.coordinator(*COORD_FLAGS, name="coord-b")
        node_a = p.keep(await spawn_snode_host(etcd, root_path, tmp_path, "1", name="sn-a"))
        node_b = p.keep(await spawn_snode_host(etcd, root_path, tmp_path, "2", name="sn-b"))

        async with stub_for(first.address) as stub:
            for node in (node_a, node_b):
                created = await stub.CreateSnode(sp.CreateSnodeRequest(node_id=node.node_id))
                assert created.status.error_code == common_pb2.SUCCESS, created
            ids: dict[str, int] = {}

            async def created_all() -> tuple[bool, Any]:
                for name in ("s1", "s2"):
                    resp = await stub.CreateStream(sp.CreateStreamRequest(
                        name=name, source_db="db", source_vgroup_ids=[1, 2], num_calc_scan_plans=1,
                        num_calc_subplans=2, runner_deploys=2, if_not_exists=True))
                    if resp.status.error_code != common_pb2.SUCCESS:
                        return False, resp.status  # no snode heard yet
                    ids[name] = resp.stream.id
                return True, ids

            await wait_for(created_all, "both streams created (an snode heard)", timeout=30, interval=0.2)

            async def show() -> dict[str, sp.StreamStatusInfo]:
                resp = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                return {i.stream.name: i for i in resp.streams}

            async def keeping_up() -> tuple[bool, Any]:
                got = await show()
                ok = all(i.state == sp.STREAM_RUNNING and i.processed_ms and i.lag_ms < SMALL_MS
                         and all(t.processed_ms for t in i.tasks) for i in got.values())
                return ok, {n: (i.state, i.processed_ms, i.lag_ms) for n, i in got.items()}

            await wait_for(keeping_up, "both streams running with a small lag", timeout=40)

            # Node a stops processing s1: its tasks there keep reporting RUNNING while their lag grows.
            ack = await node_a.command(f"pause {ids['s1']}")
            assert ack["ok"] and ack["paused"] == [[ids["s1"], 0]], ack

            async def s1_lagging() -> tuple[bool, Any]:
                got = await show()
                return got["s1"].lag_ms >= LAGGING_MS, got["s1"]

            s1 = await wait_for(s1_lagging, "s1 lagging behind its source", timeout=30)
            slow = {t.task.task_id for t in s1.tasks if t.lag_ms >= LAGGING_MS}
            assert slow and all(t.task.node_id == node_a.node_id for t in s1.tasks if t.task.task_id in slow), s1
            assert all(t.lag_ms < SMALL_MS for t in s1.tasks if t.task.node_id == node_b.node_id), s1
            assert s1.state == sp.STREAM_RUNNING, "lagging is not failing"
            assert s1.processed_ms == min(t.processed_ms for t in s1.tasks)
            s2 = (await show())["s2"]
            assert s2.lag_ms < SMALL_MS, s2

            # The CLI, a real process: the JSON carries the lag, the tables its columns.
            cli = Cli(subprocess_env, first.address)
            doc = await cli.json("stream", "show", "s1")
            record = doc["streams"][0]
            assert record["lag_s"] >= LAGGING_MS / 1000 and record["processed_ms"] > 0, record
            assert {t["task_id"] for t in record["tasks"] if t["lag_s"] >= LAGGING_MS / 1000} >= slow, record
            lines = (await cli.ok("stream", "show", "s1")).splitlines()
            assert lines[2].strip().startswith("progress: processed up to ") and ", lag " in lines[2], lines
            assert lines[3].strip().startswith("checkpoint: "), lines
            assert lines[4].split()[-2:] == ["PROCESSED", "LAG"], lines
            summary = (await cli.ok("stream", "show", "--summary")).splitlines()
            assert summary[0].split()[-2:] == ["PROCESSED", "LAG"], summary
            row = next(r.split() for r in summary[2:] if r.split()[0] == "s1")
            assert float(row[-1].removesuffix("s")) >= LAGGING_MS / 1000, summary

            samples = await scrape(first)
            s1_label, s2_label = str(ids["s1"]), str(ids["s2"])
            assert value(samples, "querycoord_stream_lag_seconds", stream=s1_label) >= LAGGING_MS / 1000
            assert value(samples, "querycoord_stream_lag_seconds", stream=s2_label) < SMALL_MS / 1000
            assert value(samples, "querycoord_stream_processed_timestamp_seconds", stream=s1_label) > 0
            assert value(samples, "querycoord_stream_failed", stream=s1_label) == 0
            assert value(samples, "querycoord_stream_metrics_omitted") == 0

            # s2's trigger fails: the stream is stopped by an error and its failed gauge says so.
            trigger = next(t.task for t in s2.tasks if t.task.kind == sp.TRIGGER)
            host = node_a if trigger.node_id == node_a.node_id else node_b
            assert (await host.command(f"fail {trigger.task_id} disk full"))["ok"]

            async def s2_failed() -> tuple[bool, Any]:
                got = await scrape(first)
                return value(got, "querycoord_stream_failed", stream=s2_label) == 1, got

            failed = await wait_for(s2_failed, "s2's failed gauge at 1", timeout=20, interval=0.05)
            assert not any(n == "querycoord_stream_lag_seconds" and ("stream", s2_label) in ls
                           for n, ls in failed), "a stopped stream has no lag series (no progress)"
            before_kill = (await show())["s1"].lag_ms

        # The leader dies; the standby takes over and knows nothing of progress until the nodes report again.
        await first.kill()
        await second.wait_event("leader", timeout=30)
        async with stub_for(second.address) as stub:
            async def s1_shown_again() -> tuple[bool, Any]:
                resp = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                got = {i.stream.name: i for i in resp.streams}
                s1_now = got.get("s1")
                ok = (not resp.watching and s1_now is not None and s1_now.state == sp.STREAM_RUNNING
                      and s1_now.processed_ms != 0)
                return ok, got

            got = await wait_for(s1_shown_again, "s1 running with progress on the new leader", timeout=60)
            assert got["s1"].lag_ms >= before_kill, "still paused: its lag, from the nodes, only grew"
            samples = await scrape(second)
            assert value(samples, "querycoord_stream_lag_seconds", stream=s1_label) >= before_kill / 1000
            assert has(samples, "querycoord_stream_failed")

            ack = await node_a.command(f"resume {ids['s1']}")
            assert ack["ok"] and ack["paused"] == [], ack

            async def caught_up() -> tuple[bool, Any]:
                resp = await stub.ShowStreams(sp.ShowStreamsRequest(streams=[sp.StreamRef(name="s1")]))
                return resp.streams[0].processed_ms and resp.streams[0].lag_ms < SMALL_MS, resp.streams[0]

            await wait_for(caught_up, "s1 caught up once resumed", timeout=30)
