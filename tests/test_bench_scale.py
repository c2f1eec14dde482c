"""scripts/bench_scale.py and scripts/bench_scale_ops.py run end to end at a tiny size: every key of their JSON line,
with values of the right kind, and nothing left behind (timings are never asserted: they do not belong in tests)."""

from __future__ import annotations

from pathlib import Path

from tests.bench import assert_etcd_cleaned_up, report, run_bench

OPS_KEYS = {
    "segments", "load_s", "checker_pass_cpu_s", "checker_pass_s", "node_down_repair_s", "node_down_repair_ratio",
    "drain_s", "drain_ratio", "takeover_two_down_over_ttl_s", "meta_verify_s", "meta_verify_rss_mb", "status_ms",
    "status_page_ms", "segment_info_ms", "standby_read_ms", "leader_rss_kib_per_segment",
    "standby_rss_kib_per_segment", "settle_s", "node_down_repair_raw_s", "node_down_repair_records", "drain_raw_s",
    "drain_records", "takeover_two_down_whole_s", "status_floor_ms", "checker_window_cpu_s", "status_page_failed",
    "leader_loop_blocked_max_s", "new_leader_loop_blocked_max_s", "takeover_two_down_leading_s",
    "node_down_repair_leader_cpu_s", "node_down_repair_nodes_cpu_s", "node_down_repair_machine_busy",
}
POSITIVE = OPS_KEYS - {"segments", "settle_s", "standby_rss_kib_per_segment", "leader_rss_kib_per_segment",
                       "checker_window_cpu_s", "status_page_failed", "leader_loop_blocked_max_s",
                       "new_leader_loop_blocked_max_s", "takeover_two_down_leading_s",
                       # CPU over a repair of 1,500 segments may be under /proc's clock tick
                       "node_down_repair_leader_cpu_s", "node_down_repair_nodes_cpu_s", "node_down_repair_machine_busy"}


def test_bench_scale_ops_quick_run(project_root: Path, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    profiles = tmp_path / "prof"
    proc = run_bench(project_root, subprocess_env, "bench_scale_ops.py", "--sizes", "1500", "--ttl", "3",
                     "--passes", "1", "--reads", "1", "--raw-rounds", "1", "--checker-interval", "1",
                     "--profile-leader", str(profiles), "--profile-standby", str(profiles), timeout=600)
    lines, result = report(proc, "== 1,500 segments")
    assert set(result) == OPS_KEYS
    assert all(isinstance(v, list) and len(v) == 1 for v in result.values()), result
    assert result["segments"] == [1500]
    for key in POSITIVE:
        assert isinstance(result[key][0], int | float) and result[key][0] > 0, (key, result[key])
    # The repair and the drain each rewrote at least the segment records of what moved (1,500 over 8 nodes).
    assert result["node_down_repair_records"][0] >= 1500 // 8 // 2
    assert result["drain_records"][0] >= 1500 // 8 // 2
    assert 0 <= result["node_down_repair_machine_busy"][0] <= 1
    assert result["node_down_repair_leader_cpu_s"][0] >= 0 and result["node_down_repair_nodes_cpu_s"][0] >= 0
    assert result["status_page_failed"] == [0]  # a small cluster's page answers
    assert "node-down repair" in proc.stdout and "drain of one node" in proc.stdout
    # The leader's profiles cover its steady passes, the repair and the drain, the standby's its takeover (its raw
    # profiles in a directory of their own), and their top functions went to stderr.
    assert sorted(p.name for p in profiles.iterdir()) == ["checker-1500.prof", "drain-1500.prof", "repair-1500.prof",
                                                          "standby", "takeover-1500.prof"]
    assert "leader profile" in proc.stderr and "standby profile" in proc.stderr and "cumulative" in proc.stderr
    assert "takeover steps" in proc.stdout
    assert not any(line.startswith("{") for line in lines[:-1]), proc.stdout
    assert_etcd_cleaned_up(proc.stderr)


def test_bench_scale_quick_run(project_root: Path, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    profiles = tmp_path / "prof"
    logs = tmp_path / "logs"
    proc = run_bench(project_root, subprocess_env, "bench_scale.py", "--sizes", "1500", "--queued", "40", "--ttl",
                     "3", "--profile-standby", str(profiles), "--coord-logs", str(logs), timeout=600)
    _lines, result = report(proc, "== 1,500 segments")
    assert result["segments"] == [1500]
    assert result["queued"] == [40]
    assert result["meta_source"] == ["warm standby copy"]
    # The standby's profile covers its takeover; the new leader's steps are in the table.
    assert (profiles / "takeover-1500.prof").is_file() and "standby profile" in proc.stderr
    assert "the new leader's steps" in proc.stdout and "streams" in proc.stdout
    # ``--coord-logs`` kept the coordinators' logs at INFO: the takeover's timeline is there.
    kept = "".join(f.read_text() for f in (logs / "s1500").glob("*.log"))
    assert " INFO " in kept and "leads with fence" in kept, sorted(p.name for p in (logs / "s1500").iterdir())
    for key in ("load_s", "takeover_over_ttl_s", "lease_s", "etcd_bytes_per_segment", "rss_kib_per_segment"):
        assert isinstance(result[key][0], float) and result[key][0] > 0, (key, result[key])
    assert_etcd_cleaned_up(proc.stderr)


def test_bench_scale_ops_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_scale_ops.py", "--nodes", "4")
    assert proc.returncode == 2
    assert "--nodes must be >= 5" in proc.stderr
    proc = run_bench(project_root, subprocess_env, "bench_scale_ops.py", "--sizes", "ten")
    assert proc.returncode == 2
    assert "--sizes: not a list of integers" in proc.stderr
