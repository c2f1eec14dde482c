"""scripts/bench_meta.py runs end to end at tiny sizes (timings are not asserted: they do not belong in tests)."""

from __future__ import annotations

from pathlib import Path

from tests.bench import assert_etcd_cleaned_up, report, run_bench

EXPECTED_KEYS = {"seq_put_ratio", "conc_put_ratio", "txn_ratio", "load_100k_s", "load_ratio"}


def test_bench_meta_quick_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_meta.py", "--keys", "2000", "--seconds", "0.3",
                     "--rounds", "2", timeout=120)
    _, result = report(proc, "measure")
    assert set(result) == EXPECTED_KEYS
    for key, value in result.items():
        assert isinstance(value, int | float) and value > 0, (key, value)
    assert_etcd_cleaned_up(proc.stderr)


def test_bench_meta_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_meta.py", "--txn-ops", "129")
    assert proc.returncode == 2
    assert "--txn-ops must be in 1..128" in proc.stderr
