"""The command line and the demo, run as real processes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from tests import procs


def run_querycoord(args: list[str], env: dict[str, str], **kw) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "querycoord.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw,
    )


def test_etcd_command_runs_in_foreground_and_stops_on_sigterm(subprocess_env, tmp_path) -> None:
    proc = run_querycoord(["etcd", "--data-dir", str(tmp_path / "d")], subprocess_env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"--etcd-endpoints (\S+)", line)
        assert m, f"no endpoints printed: {line!r}"
        pids = procs.etcd_pids_under(tmp_path)
        assert pids, "no etcd process with our data dir"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while procs.etcd_pids_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not procs.etcd_pids_under(tmp_path), "etcd outlived `querycoord etcd`"
        assert "its log:" in proc.stderr.read(), "the launcher must say where etcd logs"
    finally:
        proc.kill()


def test_demo_exits_zero_and_leaves_no_process(subprocess_env) -> None:
    before = set(procs.etcd_pids_under("querycoord-demo-"))
    out = subprocess.run(
        [sys.executable, "-m", "querycoord.demo"], capture_output=True, text=True, env=subprocess_env, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refused by etcd" in out.stdout
    assert re.search(r"takeover after SIGKILL: \d+\.\d+s", out.stdout)
    assert set(procs.etcd_pids_under("querycoord-demo-")) <= before
    assert not procs.pids_matching("meta.campaign"), "a candidate process outlived the demo"
