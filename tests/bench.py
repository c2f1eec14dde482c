"""Runs one of scripts/bench_*.py as a user would; the bench tests check its report and that it cleaned up.

Timings are never asserted (they do not belong in tests): only the report's shape and what the run left behind.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.procs import pids_mentioning


def run_bench(project_root: Path, env: dict[str, str], script: str, *args: str,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python scripts/<script> <args>`` from the project root, its output captured as text."""
    return subprocess.run(
        [sys.executable, str(project_root / "scripts" / script), *args],
        cwd=project_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def report(proc: subprocess.CompletedProcess[str], table_header: str) -> tuple[list[str], dict[str, Any]]:
    """The stdout lines of a run that succeeded and its result: a table (a line starting ``table_header``) comes
    first, the JSON result is the last line."""
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith(table_header) for line in lines[:-1]), proc.stdout
    return lines, json.loads(lines[-1])


def assert_etcd_cleaned_up(stderr: str) -> None:
    """The embedded etcd the script announced on stderr is gone, and so is its data dir."""
    m = re.search(r"embedded etcd pid (\d+) .* data dir (\S+)", stderr)
    assert m, stderr
    assert not Path(m.group(2)).exists()
    assert pids_mentioning(m.group(2)) == []
