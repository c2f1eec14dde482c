"""``make demo`` (``python -m querycoord.demo``) end to end, at a smaller size, as a real process."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tests import procs


def _gone(fragment: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while procs.pids_matching(fragment) and time.monotonic() < deadline:
        time.sleep(0.1)
    return procs.pids_matching(fragment)


def test_cluster_demo_survives_a_node_and_a_leader_kill_and_leaves_no_process(subprocess_env) -> None:
    before = set(procs.etcd_pids_under("querycoord-demo-"))
    # Small collections, small requests and one child at a time per load: the load still takes a couple of
    # seconds, so there is a "mid-load" to kill a node in (demo_a) and the leading coordinator in (demo_b).
    proc = subprocess.Popen(
        [sys.executable, "-m", "querycoord.demo", "--partitions", "4", "--segments", "240",
         "--request-bytes", "1500", "--concurrency", "2", "--latency-ms", "200", "--kill-leader-at", "25"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out + err
    assert "Traceback" not in err, err
    assert re.search(r"SIGKILL query node \d+ \(pid \d+\) at \d+%", out), out
    m = re.search(r"task #\d+: (\d+) child(?:ren)? meant for node (\d+) were rescheduled to nodes?", out)
    assert m and int(m.group(1)) >= 1, out
    dead = m.group(2)
    assert re.search(rf"├── #\d+\s+LoadSegment .* replaces #\d+\s+excluded \[{dead}\]", out), out
    assert "demo_a loaded: 100%" in out and "demo_b loaded: 100%" in out, out
    # The leader is SIGKILLed during the load of demo_b; the standby takes over and the load goes on to 100 %.
    assert re.search(r"coordinator (\S+) \(pid \d+\) leads; (\S+) \(pid \d+\) stands by", out), out
    b_part = out[out.index("LoadCollection demo_b"):out.index("demo_b loaded: 100%")]
    kill = re.search(r"SIGKILL coordinator (\S+) \(pid \d+\) at (\d+)%", b_part)
    assert kill and 0 < int(kill.group(2)) < 100, out
    took = re.search(r"coordinator (\S+) took over after (\d+\.\d+)s \(reconciled, resumed the load\)", b_part)
    assert took and took.group(1) != kill.group(1), out
    assert 0 < float(took.group(2)) < 15, out  # the lease TTL is 2 s
    assert b_part.index(kill.group(0)) < b_part.index(took.group(0)), out
    assert re.search(r"loading demo_b \[█+\] 100%", out), out
    assert re.search(r"replaced the killed coordinator with a standby at \S+ \(pid \d+\)", out), out
    assert re.search(r"ReleaseCollection demo_a \(task #\d+\) done", out), out
    summary = out[out.index("\nsummary"):]
    assert re.search(r"^\s+\d+\s+demo_a\s+4\s+240\s+-\s+not loaded", summary, re.M), summary
    assert re.search(r"^\s+\d+\s+demo_b\s+2\s+160\s+collection\s+100%\s+2$", summary, re.M), summary
    # After the takeover the new leader lists the tasks it resumed (demo_b's load) or ran (the release).
    assert re.search(r"tasks known to the new leader: \d+ triggers \(.*LoadCollection x\d.*ReleaseCollection x1\),"
                     r"\s+\d+ children \((\d+) from rescheduling\), 0 failed", summary), summary
    assert "segments held by online nodes: 160" in summary, summary
    m = re.search(r"leader takeover: (\d+\.\d+)s \((\S+) SIGKILLed, (\S+) took over", summary)
    assert m and m.group(1) == took.group(2) and m.group(2) == kill.group(1) and m.group(3) == took.group(1), summary
    assert re.search(r"elapsed: [\d.]+s", summary) and out.rstrip().endswith("done: every process stopped")
    assert len(out.splitlines()) < 70, "the demo output stays readable"
    assert set(procs.etcd_pids_under("querycoord-demo-")) <= before, "etcd outlived the demo"
    assert not _gone(f"--root demo-{proc.pid}"), "a coordinator or query node outlived the demo"


def test_election_demo_still_runs(subprocess_env) -> None:
    out = subprocess.run([sys.executable, "-m", "querycoord.demo", "--election"], capture_output=True, text=True,
                         env=subprocess_env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused by etcd" in out.stdout
    assert re.search(r"takeover after SIGKILL: \d+\.\d+s", out.stdout)
    assert not procs.pids_matching("meta.campaign"), "a candidate process outlived the demo"
