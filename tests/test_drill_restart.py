"""The restart drill, small and end to end: etcd, 2 coordinators and 3 query nodes as processes, 2,000 segments
(a 2-replica and two 1-replica collections), stopped and started again twice (one SIGTERM round, one SIGKILL).
Seed 0's first round stops the coordinators, then etcd, then the nodes (which cannot revoke their sessions any
more), and starts the coordinators first: with a TTL of 5 s the dead nodes' sessions, renewed by etcd's restart,
outlive them while a new leader takes over, which it showed at 100 % before the takeover asked the nodes.

What is asserted is what must hold on any machine: no sample showed 100 % that the nodes did not hold, no
trigger failed, every restart came back whole, and the JSON line says so. The issue's time bound (back whole
within the session TTL + 10 s) is the drill's own verdict on a quiet machine; on a loaded CI machine starting
six Python processes can take longer than that, so here a failure of that bound alone is accepted, and the time
is only asserted to be below the drill's own --whole-timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIME_BOUND = "more than the session TTL + 10 s"


def test_small_restart_drill_comes_back_whole_without_a_false_figure(subprocess_env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "querycoord.cli", "drill", "restart", "--restarts", "2", "--segments", "2000",
           "--replicated-segments", "200", "--nodes", "3", "--seed", "0", "--ttl", "5", "--whole-timeout", "90",
           "--work-dir", str(tmp_path / "drill")]
    proc = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=400)
    out = proc.stdout
    failed = [line for line in out.splitlines() if line.startswith("FAILED: ")]
    assert proc.returncode == 0 or (proc.returncode == 1 and failed and all(TIME_BOUND in f for f in failed)), \
        f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    s = json.loads(out.strip().splitlines()[-1])
    assert (s["restarts"], s["collections"], s["segments"], s["copies"]) == (2, 3, 2000, 2200), s
    assert s["false_full_samples"] == 0 and s["failed_triggers"] == 0 and s["never_whole"] == 0, out
    assert s["exited_on_their_own"] == 0 and s["unfinished_triggers"] == 0 and s["nodes_not_online"] == 0, out
    assert sorted(s["signals"]) == ["SIGKILL", "SIGTERM"]
    assert all(b is not None and 0 < b < 90 for b in s["back_whole_s"]), s
    assert s["leader_answered"] > 0 and s["samples"] >= s["leader_answered"]
    assert "RESULT: " in out and " 1  SIG" in out and " 2  SIG" in out  # the table, a row per restart
