"""The stream drill: a small run against real processes (2 coordinators, 3 stream nodes, 2 snodes, 8 streams)
passes with zero violation counts, and its observation counts what it should."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from proto import stream_pb2
from querycoord.tooling.drill.stream_checkpoints import CheckpointChecks
from querycoord.tooling.drill.stream_lag import LagSampler
from querycoord.tooling.drill.stream_observation import Fault, Observation
from querycoord.tooling.drill.streams import StreamDrillOptions, StreamDrillResult


def test_small_stream_drill_passes(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "querycoord.cli", "drill", "streams", "--nodes", "3",
           "--snodes", "2", "--streams", "8",
           "--leader-kills", "2", "--task-fails", "2", "--user-stops", "1", "--seed", "3", "--quiesce-timeout", "30",
           "--work-dir", str(tmp_path / "drill")]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=85)
    elapsed = time.monotonic() - started
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["streams"] == 8 and summary["leader_kills"] == 2
    assert summary["duplicate_tasks"] == 0 and summary["stale_tasks"] == 0 and summary["not_running"] == 0, out
    # 7 streams run (one stopped by the user), each counted once per leader kill.
    assert summary["adopted_without_redeploy"] + summary["redeploys"] == 14, out
    assert summary["recovered_s_max"] is not None and summary["recovered_s_max"] > 0
    assert summary["lag_samples"] > 0 and summary["lag_p99_s"] >= 0, out  # the leader showed progress throughout
    for kind in ("leader-kill", "node-kill", "vgroup-move", "task-fail"):
        assert kind in out, out
    assert "RESULT: every invariant held" in out
    assert elapsed < 90


def test_summary_counts_and_failure() -> None:
    result = StreamDrillResult(StreamDrillOptions(streams=5))
    result.faults = [Fault(1, "leader-kill", "", 0.0, recovered_s=1.5, adopted=4, redeployed=1),
                     Fault(2, "node-kill", "", 0.0, recovered_s=2.25),
                     Fault(3, "leader-kill", "", 0.0, recovered_s=1.0, adopted=5, redeployed=0)]
    result.final = Observation(watching=False)
    assert result.summary() == {"streams": 5, "leader_kills": 2, "adopted_without_redeploy": 9, "redeploys": 1,
                                "recovered_s_max": 2.25, "duplicate_tasks": 0, "stale_tasks": 0, "not_running": 0,
                                "recalcs": 0, "recalcs_not_done": 0, "recalc_duplicates": 0, "lag_p99_s": None,
                                "checkpoints": 0, "checkpoint_regressions": 0, "resumes_checked": 0,
                                "bad_resumes": 0}
    assert not result.failed
    result.recalc_duplicates = ["stream 1 recalc 2: task 3 SID 1 ran it 2 times"]
    assert result.summary()["recalc_duplicates"] == 1 and result.failed
    result.recalc_duplicates = []
    result.lag = LagSampler(show=None)  # type: ignore[arg-type]  # never run: only its samples are read
    result.lag.samples = [100] * 99 + [9_000] * 2  # ms
    assert result.summary()["lag_p99_s"] == 9.0 and result.summary()["lag_max_s"] == 9.0
    result.lag.samples = [100] * 200 + [9_000]
    assert result.summary()["lag_p99_s"] == 0.1 and result.summary()["lag_samples"] == 201
    result.final = Observation(watching=False, stale=["task 7 SID 1 on node 3: the leader's SID is 2"])
    assert result.summary()["stale_tasks"] == 1 and result.failed
    result.final = Observation(watching=False)
    result.violations.append("fault #2: not quiescent")
    assert result.failed


def _show(*consensus: tuple[int, int]) -> stream_pb2.ShowStreamsResponse:
    return stream_pb2.ShowStreamsResponse(streams=[
        stream_pb2.StreamStatusInfo(stream=stream_pb2.StreamDef(id=sid, name=f"s{sid}"), checkpoint_id=cid)
        for sid, cid in consensus])


def _task(stream_id: int, task_id: int, sid: int, resumed: int, held: int) -> dict[str, object]:
    return {"stream_id": stream_id, "task_id": task_id, "sid": sid, "status": "RUNNING", "resumed_from": resumed,
            "checkpoint_id": held}


def test_checkpoint_checks_catch_regressions_and_stale_resumes() -> None:
    checks = CheckpointChecks()
    checks.observe(_show((1, 5)), {7: {"tasks": [_task(1, 10, 1, 0, 5)]}})
    checks.observe(_show((1, 8)), {7: {"tasks": [_task(1, 10, 1, 0, 8)]}})
    assert checks.summary() == {"checkpoints": 2, "checkpoint_regressions": 0, "resumes_checked": 1,
                                "bad_resumes": 0}
    # A redeployed instance (SID 2) that resumed from 5 while the consensus was 8: an old checkpoint.
    checks.observe(_show((1, 8)), {8: {"tasks": [_task(1, 10, 2, 5, 5)]}})
    assert checks.summary()["bad_resumes"] == 1
    # The consensus a leader shows going back is a regression; a standby's answer (a reason) is not looked at.
    checks.observe(_show((1, 6)), {})
    standby = _show((1, 0))
    standby.status.reason = "not the leader"
    checks.observe(standby, {})
    assert checks.summary()["checkpoint_regressions"] == 1
    result = StreamDrillResult(StreamDrillOptions(streams=1), final=Observation(watching=False), checkpoints=checks)
    assert result.failed
