"""scripts/bench_heartbeat.py runs end to end at a tiny size (timings are not asserted: they do not belong in tests)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EXPECTED_KEYS = {"nodes", "streams", "p50_ms", "p99_ms", "watch_adopt_s"}


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def test_bench_heartbeat_tiny_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(project_root / "scripts" / "bench_heartbeat.py"), "--nodes", "10", "--streams", "50"],
        cwd=project_root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("measure") for line in lines), proc.stdout  # the table came first
    result = json.loads(lines[-1])
    assert set(result) == EXPECTED_KEYS
    assert result["nodes"] == 10 and result["streams"] == 50
    for key in ("p50_ms", "p99_ms", "watch_adopt_s"):
        assert isinstance(result[key], int | float) and result[key] >= 0, (key, result[key])
    assert "adopted / redeploys" in proc.stdout and "50/0" in proc.stdout

    # The embedded etcd it started is gone.
    m = re.search(r"embedded etcd pid (\d+) .* data dir (\S+)", proc.stderr)
    assert m, proc.stderr
    assert not Path(m.group(2)).exists()
    assert _processes_mentioning(m.group(2)) == []


def test_bench_heartbeat_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(project_root / "scripts" / "bench_heartbeat.py"), "--nodes", "2", "--snodes", "3"],
        cwd=project_root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "--snodes must be <= --nodes" in proc.stderr
