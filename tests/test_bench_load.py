"""scripts/bench_load.py runs end to end at tiny sizes (the ratio is not asserted: timings do not belong in tests)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.bench import assert_etcd_cleaned_up, report, run_bench
from tests.procs import pids_mentioning

EXPECTED_KEYS = ["segments", "nodes", "children", "etcd_txns", "wall_s", "raw_s", "ratio"]


def test_bench_load_quick_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_load.py", "--segments", "300", "--partitions", "2",
                     "--nodes", "2", "--raw-rounds", "1")
    lines, result = report(proc, "wall_s")
    assert list(result) == EXPECTED_KEYS
    assert result["segments"] == 300
    assert result["nodes"] == 2
    # At least one LoadSegments child per node, a DM channel watch, and per node a delta and query channel watch.
    assert isinstance(result["children"], int) and result["children"] >= 2 + 1 + 2 * 2
    # 300 segment records need at least 3 txns of 128; the task tree at least its trigger, commit and removal.
    assert isinstance(result["etcd_txns"], int) and 3 + 3 <= result["etcd_txns"] < 1000
    for key in ("wall_s", "raw_s", "ratio"):
        assert isinstance(result[key], float) and result[key] > 0, (key, result[key])
    assert result["wall_s"] < 60
    # ratio = wall_s / raw_s of the unrounded times; wall_s and raw_s are rounded to 4 decimals and ratio to 3, so
    # the quotient of the printed times may differ by their rounding (a 4 ms raw write moves it over 1 %).
    rounding = result["ratio"] * 0.00005 * (1 / result["wall_s"] + 1 / result["raw_s"]) + 0.0005
    assert abs(result["ratio"] - result["wall_s"] / result["raw_s"]) <= 0.01 * result["ratio"] + rounding
    # Nothing else on stdout is JSON (the coordinator's leadership events go to stderr).
    assert not any(line.startswith("{") for line in lines[:-1]), proc.stdout
    # The embedded etcd it started is gone, and so is its data dir; no query node process is left.
    assert_etcd_cleaned_up(proc.stderr)


def test_bench_load_node_processes(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_load.py", "--segments", "200", "--partitions", "2",
                     "--nodes", "2", "--raw-rounds", "1", "--node-processes")
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["segments"] == 200 and result["nodes"] == 2
    assert "node processes" in proc.stdout
    m = re.search(r"embedded etcd pid \d+ on (\S+),", proc.stderr)
    assert m, proc.stderr
    assert pids_mentioning(m.group(1)) == []  # the node processes got the endpoint on their command line


def test_bench_load_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_load.py", "--nodes", "0")
    assert proc.returncode == 2
    assert "--nodes must be >= 1" in proc.stderr
