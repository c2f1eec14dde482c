"""scripts/bench_meta.py runs end to end at tiny sizes (timings are not asserted: they do not belong in tests)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

EXPECTED_KEYS = {"seq_put_ratio", "conc_put_ratio", "txn_ratio", "load_100k_s", "load_ratio"}


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def test_bench_meta_quick_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(project_root / "scripts" / "bench_meta.py"),
            "--keys",
            "2000",
            "--seconds",
            "0.3",
            "--rounds",
            "2",
        ],
        cwd=project_root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("measure") for line in lines), proc.stdout  # the table came first
    result = json.loads(lines[-1])
    assert set(result) == EXPECTED_KEYS
    for key, value in result.items():
        assert isinstance(value, int | float) and value > 0, (key, value)

    # The embedded etcd it started is gone.
    m = re.search(r"embedded etcd pid (\d+) .* data dir (\S+)", proc.stderr)
    assert m, proc.stderr
    assert not Path(m.group(2)).exists()
    assert _processes_mentioning(m.group(2)) == []


def test_bench_meta_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, str(project_root / "scripts" / "bench_meta.py"), "--txn-ops", "129"],
        cwd=project_root,
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--txn-ops must be in 1..128" in proc.stderr
