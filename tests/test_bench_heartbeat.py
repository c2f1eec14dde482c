"""scripts/bench_heartbeat.py runs end to end at a tiny size (timings are not asserted: they do not belong in tests)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.bench import assert_etcd_cleaned_up, report, run_bench

EXPECTED_KEYS = {"nodes", "streams", "p50_ms", "p99_ms", "watch_adopt_s", "checkpoint_round_s_p50",
                 "checkpoint_round_s_max", "checkpoint_round_heartbeats", "checkpoint_p99_ms"}


def test_bench_heartbeat_tiny_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_heartbeat.py", "--nodes", "10", "--streams", "50",
                     timeout=30)
    _, result = report(proc, "measure")
    assert set(result) == EXPECTED_KEYS
    assert result["nodes"] == 10 and result["streams"] == 50
    for key in ("p50_ms", "p99_ms", "watch_adopt_s", "checkpoint_round_s_p50", "checkpoint_round_s_max",
                "checkpoint_p99_ms"):
        assert isinstance(result[key], int | float) and result[key] >= 0, (key, result[key])
    assert "adopted / redeploys" in proc.stdout and "50/0" in proc.stdout
    # The checkpoint phase ran whole rounds: every stream committed, none abandoned.
    assert result["checkpoint_round_heartbeats"] >= 1 and "checkpoints committed / abandoned" in proc.stdout
    assert re.search(r"checkpoints committed / abandoned\s+[1-9]\d*/0\b", proc.stdout), proc.stdout
    assert_etcd_cleaned_up(proc.stderr)


def test_bench_heartbeat_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_heartbeat.py", "--nodes", "2", "--snodes", "3", timeout=30)
    assert proc.returncode == 2
    assert "--snodes must be <= --nodes" in proc.stderr
