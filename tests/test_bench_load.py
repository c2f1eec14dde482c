"""scripts/bench_load.py runs end to end at tiny sizes (the ratio is not asserted: timings do not belong in tests)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EXPECTED_KEYS = ["segments", "nodes", "children", "etcd_txns", "wall_s", "raw_s", "ratio"]


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def _run(project_root: Path, env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(project_root / "scripts" / "bench_load.py"), *args],
        cwd=project_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_load_quick_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = _run(project_root, subprocess_env, "--segments", "300", "--partitions", "2", "--nodes", "2",
                "--raw-rounds", "1")
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("wall_s") for line in lines[:-1]), proc.stdout  # the table came first
    result = json.loads(lines[-1])
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
    assert abs(result["ratio"] - result["wall_s"] / result["raw_s"]) <= 0.01 * result["ratio"]
    # Nothing else on stdout is JSON (the coordinator's leadership events go to stderr).
    assert not any(line.startswith("{") for line in lines[:-1]), proc.stdout

    # The embedded etcd it started is gone, and so is its data dir; no query node process is left.
    m = re.search(r"embedded etcd pid (\d+) .* data dir (\S+)", proc.stderr)
    assert m, proc.stderr
    assert not Path(m.group(2)).exists()
    assert _processes_mentioning(m.group(2)) == []


def test_bench_load_node_processes(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = _run(project_root, subprocess_env, "--segments", "200", "--partitions", "2", "--nodes", "2",
                "--raw-rounds", "1", "--node-processes")
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["segments"] == 200 and result["nodes"] == 2
    assert "node processes" in proc.stdout
    m = re.search(r"embedded etcd pid \d+ on (\S+),", proc.stderr)
    assert m, proc.stderr
    assert _processes_mentioning(m.group(1)) == []  # the node processes got the endpoint on their command line


def test_bench_load_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = _run(project_root, subprocess_env, "--nodes", "0")
    assert proc.returncode == 2
    assert "--nodes must be >= 1" in proc.stderr
