"""The rolling drill, small and end to end: etcd, 2 coordinators and 4 query nodes as processes, a 2-replica and a
1-replica collection, a client loading and releasing another collection, and every query node in turn drained,
stopped with SIGTERM, started again under its id and uncordoned.

What is asserted is what must hold on any machine: no sample found the 2-replica collection without a whole
replica by the nodes' own reports, every node was restarted and is back online (and ACTIVE), and the JSON line
says so, with every key the README shows. Times are reported, never asserted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def test_small_rolling_drill_keeps_a_whole_replica_at_every_sample(subprocess_env: dict[str, str], tmp_path: Path,
                                                                   project_root: Path) -> None:
    cmd = [sys.executable, "-m", "querycoord.cli", "drill", "rolling", "--nodes", "4", "--collections-two", "1",
           "--collections-one", "1", "--segments", "120", "--churn-collections", "1", "--churn-segments", "20",
           "--seed", "3", "--work-dir", str(tmp_path / "drill")]
    proc = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=400)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr[-3000:]}"
    s = json.loads(out.strip().splitlines()[-1])
    assert list(s)[:8] == ["nodes_restarted", "samples", "unserved_samples", "one_replica_unserved_s_max", "moves",
                           "recovery_moves", "balance_moves", "duration_s"]
    assert s["nodes_restarted"] == 4 and s["unserved_samples"] == 0, out
    assert s["exited_on_their_own"] == 0 and s["nodes_not_active"] == 0 and s["never_whole"] == 0, out
    assert s["samples"] > 0 and s["moves"] == s["recovery_moves"] + s["balance_moves"] + s["drain_moves"]
    assert s["moves"] > 0 and s["churn_ops"] > 0, out  # each node's copies went somewhere, the client worked
    assert "RESULT: " in out and "  101 " in out and "  104 " in out  # the table, a row per node
    readme = (project_root / "README.md").read_text()
    shown = readme[readme.index('It ends with `{"nodes_restarted": '):]
    keys = re.findall(r'"(\w+)": ', shown[:shown.index("}`")])
    assert len(keys) >= 8 and set(keys) <= set(s), set(keys) - set(s)
