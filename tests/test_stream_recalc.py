"""Stream recalculation: persisted requests run by every runner, finished once per runner slot, resumed by a new
leader, given again to a runner redeployed meanwhile; bad input refused; listed by ``stream show`` (CLI processes).

The nodes are the reference stream node's state machine under real sessions (``tests.real_stream_nodes``); what
they ran is read from the nodes themselves (``StreamNodeState.recalc_runs``: finished runs per (stream,
recalculation, task, SID)), never from the leader.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from querycoord.common.limits import Limits
from querycoord.common.validate import InvalidField
from querycoord.serving.stream_service import check_heartbeat
from querycoord.stream.recalc import MAX_ACTIVE_PER_STREAM, MAX_RANGE_MS
from querycoord.stream.recalc_store import RECALCS_PREFIX, stream_recalcs_prefix
from querycoord.stream.store import InvalidStream, StreamNotFound, StreamStateConflict, StreamStore
from tests.real_stream_nodes import (
    RealNode,
    lose_runner_snode,
    manager,
    round_,
    run_until,
    running_streams,
    sp,
)
from tests.spawn import Processes
from tests.stream_client import stub_for, wait_for
from tests.streams import Clock
from tests.test_stream_cli import Cli


def recalc_of(mgr, stream_id: int, recalc_id: int) -> sp.RecalcInfo:
    info = next(s for s in mgr.show_streams().streams if s.stream.id == stream_id)
    return next(r for r in info.recalcs if r.recalc_id == recalc_id)


def runs(nodes: list[RealNode], recalc_id: int) -> dict[tuple[int, int], int]:
    """(task, SID) -> finished runs of the recalculation, summed over the nodes."""
    out: dict[tuple[int, int], int] = {}
    for n in nodes:
        for (_, rid, task, sid), count in n.state.recalc_runs.items():
            if rid == recalc_id:
                out[(task, sid)] = out.get((task, sid), 0) + count
    return out


def runner_slots(mgr, stream_id: int) -> dict[int, tuple[int, int]]:
    """The leader's runners of a stream: task id -> (deploy, index)."""
    return {t.task.task_id: (t.task.deploy_id, t.task.task_idx) for t in mgr.streams[stream_id].tasks.values()
            if t.task.kind == sp.RUNNER}


async def test_a_recalc_runs_on_every_runner_once_and_ends_done(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 2) as (nodes, sdefs, mgr):
        s = sdefs[0]
        info = await mgr.recalculate(s.id, 1_000, 61_000)
        assert (info.state, info.tasks_total, info.tasks_done) == (sp.RECALC_PENDING, 4, 0)  # 2 deploys x 2 tasks
        await run_until(mgr, nodes, clock, lambda: recalc_of(mgr, s.id, info.recalc_id).state == sp.RECALC_DONE,
                        what="recalculation done")
        done = recalc_of(mgr, s.id, info.recalc_id)
        assert (done.tasks_done, done.tasks_total) == (4, 4) and done.finished_ms >= done.created_ms > 0
        for _ in range(20):  # long after: nothing runs again, nothing is reported any more
            await round_(mgr, nodes, clock)
        slots = runner_slots(mgr, s.id)
        sid_of = {t.task.task_id: t.task.sid for t in mgr.streams[s.id].tasks.values()}
        assert runs(nodes, info.recalc_id) == {(tid, sid_of[tid]): 1 for tid in slots}
        assert all(not t.recalcs_done for n in nodes for t in n.state.tasks.values())
        # Only the stream asked: the other stream's runners ran nothing.
        assert not any(k[0] == sdefs[1].id for n in nodes for k in n.state.recalc_runs)
        # Persisted as the leader shows it.
        raw = (await kv.load_prefix(stream_recalcs_prefix(s.id))).values()
        persisted = [sp.RecalcRecord.FromString(v) for v in raw]
        assert [(r.info.state, r.info.tasks_done, len(r.done)) for r in persisted] == [(sp.RECALC_DONE, 4, 4)]


async def test_a_new_leader_finishes_a_recalc_exactly_once_per_runner(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 1) as (nodes, sdefs, old):
        s = sdefs[0]
        nodes[0].state.recalc_delay_s, nodes[1].state.recalc_delay_s = 0.2, 3.0
        info = await old.recalculate(s.id, 0, 3_600_000)
        await run_until(old, nodes, clock, lambda: recalc_of(old, s.id, info.recalc_id).tasks_done > 0,
                        what="some runners done")
        before = recalc_of(old, s.id, info.recalc_id)
        assert before.state == sp.RECALC_RUNNING and 0 < before.tasks_done < before.tasks_total, before
        # A finished run whose report the old leader never got: the node reports it to the next leader.
        for _ in range(40):
            clock.advance(0.1)
            for n in nodes:
                n.state.tick(clock())
        assert any(t.recalcs_done for n in nodes for t in n.state.tasks.values())
        new = await manager(store, kv, clock, revision=200)  # the old leader's memory is gone with it
        assert recalc_of(new, s.id, info.recalc_id).tasks_done == before.tasks_done  # resumed from etcd
        await run_until(new, nodes, clock, lambda: recalc_of(new, s.id, info.recalc_id).state == sp.RECALC_DONE,
                        what="recalculation done under the new leader")
        for _ in range(10):
            await round_(new, nodes, clock)
        got = runs(nodes, info.recalc_id)
        assert set(got.values()) == {1} and len(got) == 4, got
        assert recalc_of(new, s.id, info.recalc_id).tasks_done == 4


async def test_a_runner_redeployed_mid_recalc_gets_it_again_and_it_completes(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    layout = [([], True), ([], True), ([], True), ([1, 2], False), ([3], False)]
    async with running_streams(store, kv, clock, 3, layout=layout) as (nodes, sdefs, mgr):
        for n in nodes:
            n.state.recalc_delay_s = 2.0
        recalcs = {s.id: (await mgr.recalculate(s.id, 0, 1_000)).recalc_id for s in sdefs}
        for _ in range(5):  # ordered and running, not finished
            await round_(mgr, nodes, clock)
        lost, stream_id, alive = await lose_runner_snode(mgr, kv, nodes)
        lost_runs = {k for k in lost.state.recalc_runs}
        await run_until(mgr, alive, clock, lambda: all(recalc_of(mgr, sid, rid).state == sp.RECALC_DONE
                                                       for sid, rid in recalcs.items()),
                        rounds=200, what="every recalculation done after the node loss")
        rid = recalcs[stream_id]
        got = runs(alive, rid)
        assert set(got.values()) == {1}, got
        # Every runner slot finished on its current instance (the redeployed ones with their new SID).
        current = {(t.task.task_id, t.task.sid) for t in mgr.streams[stream_id].tasks.values()
                   if t.task.kind == sp.RUNNER}
        assert current <= set(got) | {(k[2], k[3]) for k in lost_runs if k[1] == rid}
        redeployed = {(tid, sid) for tid, sid in current if sid > 1}
        assert redeployed and redeployed <= set(got)  # the new instances got the order and ran it
        assert recalc_of(mgr, stream_id, rid).tasks_done == recalc_of(mgr, stream_id, rid).tasks_total


async def test_bad_recalc_requests_are_refused_and_a_drop_removes_the_records(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 2) as (_nodes, sdefs, mgr):
        s, other = sdefs
        with pytest.raises(StreamNotFound):
            await mgr.recalculate(999_999, 0, 1)
        for lo, hi, words in ((5, 5, "must be before"), (9, 2, "must be before"), (-1, 5, ">= 0"),
                              (0, MAX_RANGE_MS + 1, "days per request")):
            with pytest.raises(InvalidStream, match=words):
                await mgr.recalculate(s.id, lo, hi)
        mgr.put_stream(await store.stop_stream(other.id))
        with pytest.raises(StreamStateConflict, match="start it first"):
            await mgr.recalculate(other.id, 0, 10)
        for i in range(MAX_ACTIVE_PER_STREAM):
            await mgr.recalculate(s.id, i, i + 10)
        with pytest.raises(StreamStateConflict, match="not finished"):
            await mgr.recalculate(s.id, 0, 10)
        assert await kv.count_prefix(RECALCS_PREFIX) == MAX_ACTIVE_PER_STREAM  # nothing of the refusals written
        # A node's report of a recalculation is checked like the rest of a heartbeat.
        bad = sp.HeartbeatRequest(node_id=1, tasks=[sp.TaskStatusReport(
            stream_id=1, task_id=2, sid=1, kind=sp.RUNNER, status=sp.TASK_RUNNING, recalcs_done=[0])])
        with pytest.raises(InvalidField, match="recalcs_done"):
            check_heartbeat(bad, Limits())
        # A drop takes the stream's recalculations with it; a new leader loads none.
        dropped = await store.drop_stream(s.id)
        mgr.remove_stream(dropped.id)
        await mgr.drop_recalcs(dropped.id)
        assert await kv.count_prefix(RECALCS_PREFIX) == 0
        assert not (await manager(store, kv, clock, revision=300)).recalcs.by_stream


async def test_stream_recalc_cli_and_a_leader_killed_mid_recalc(
    etcd: EtcdCluster, root_path: str, subprocess_env: dict[str, str], tmp_path: Path, project_root: Path
) -> None:
    """Real processes: ``stream recalc`` starts one, the leader is SIGKILLed while the runners run it, the standby
    finishes it; every runner instance ran it once (the nodes' own counts); ``stream show`` lists it."""
    async with Processes(etcd, root_path, tmp_path) as p:
        flags = ("--stream-scale", "0.1", "--stream-watch-timeout", "5")
        first = await p.coordinator(*flags, name="coord-a")
        await first.wait_event("leader", timeout=30)
        second = await p.coordinator(*flags, name="coord-b")
        cli = Cli(subprocess_env, f"{first.address},{second.address}")
        node = await p.stream_node("--vgroups", "1,2", "--snode", "--heartbeat-ms", "100", "--groups", "2",
                                   "--init-delay-ms", "100", "--ttl", "10", "--recalc-delay-ms", "2500", name="sn-a")
        await cli.ok("snode", "create", str(node.node_id))

        async def created() -> tuple[bool, str]:
            code, _out, err = await cli.run("stream", "create", "s1", "--vgroups", "1,2", "--subplans", "2",
                                           "--runner-deploys", "2", "--if-not-exists")
            return code == 0, err

        await wait_for(created, "stream created (an snode heartbeating)", timeout=30, interval=0.3)

        async def running() -> tuple[bool, object]:
            data = await cli.json("stream", "show", "s1")
            return data["streams"][0]["state"] == "running", data["streams"][0]["state"]

        await wait_for(running, "stream s1 running", timeout=60, interval=0.5)
        await cli.refused("stream", "recalc", "s1", "--from", "yesterday", "--to", "1000", fragment="bad time",
                          code=2)
        await cli.refused("stream", "recalc", "s1", "--from", "2000", "--to", "1000", fragment="must be before",
                          code=2)
        await cli.refused("stream", "recalc", "nope", "--from", "0", "--to", "1000", fragment="unknown stream")
        out = await cli.ok("stream", "recalc", "s1", "--from", "2024-05-01T00:00:00Z", "--to", "2024-05-02",
                           "--wait")
        # README's example of this command, line for line (the recalculation id aside).
        readme = (project_root / "README.md").read_text()
        example = readme[readme.index("### Recalculation"):].split("```text\n", 1)[1].split("```", 1)[0]
        assert re.sub(r"#\d+", "#N", out) == re.sub(r"#\d+", "#N", example), (out, example)
        # The leader killed while the runners run the second one (each run takes 2.5 s).
        async with stub_for(first.address) as stub:
            resp = await stub.RecalculateStream(sp.RecalculateStreamRequest(
                stream=sp.StreamRef(name="s1"), from_ms=0, to_ms=86_400_000))
            assert resp.status.error_code == 0, resp.status
            rid = resp.recalc.recalc_id

            async def ordered() -> tuple[bool, object]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest())
                r = next(r for r in show.streams[0].recalcs if r.recalc_id == rid)
                return r.state == sp.RECALC_RUNNING, sp.RecalcState.Name(r.state)

            await wait_for(ordered, "recalculation ordered", timeout=30, interval=0.1)
        await first.kill()
        await second.wait_event("leader", timeout=30)

        async def finished() -> tuple[bool, object]:
            data = await cli.json("stream", "show", "s1")
            rec = next(r for r in data["streams"][0]["recalcs"] if r["recalc_id"] == rid)
            return rec["state"] == "done", rec

        rec = await wait_for(finished, "the new leader finishes the recalculation", timeout=60, interval=0.5)
        assert (rec["tasks_done"], rec["tasks_total"]) == (4, 4)
        ans = await node.command("tasks")
        counts = [n for (_, r, _, _, n) in ans["recalc_runs"] if r == rid]
        assert counts == [1, 1, 1, 1], ans["recalc_runs"]
        shown = await cli.ok("stream", "show", "s1")
        assert f"recalc #{rid} 1970-01-01T00:00:00.000Z .. 1970-01-02T00:00:00.000Z: done 4/4 runners" in shown
