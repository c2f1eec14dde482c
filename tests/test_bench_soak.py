"""scripts/bench_soak.py runs end to end for a few cycles (boundedness shows only over a long run: not asserted), and
what keeps the coordinator's memory flat over one: a finished trigger tree is freed at once."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.nodes.querynode import FaultConfig
from tests.bench import assert_etcd_cleaned_up, report, run_bench
from tests.cluster import QueryCluster

EXPECTED_KEYS = ["cycles", "etcd_db_mb_start", "etcd_db_mb_max", "etcd_db_mb_end", "rss_mb_start", "rss_mb_end"]


def test_bench_soak_quick_run(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_soak.py", "--cycles", "3", "--sample-every", "2",
                     "--segments", "20", "--keep-revisions", "100", "--quota-mb", "256", timeout=180)
    lines, result = report(proc, "cycle")
    assert list(result) == EXPECTED_KEYS
    assert result["cycles"] == 3
    # A row at the start, after cycle 2 and after the last cycle.
    rows = [line.split() for line in lines[:-1] if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 2, 3], proc.stdout
    assert 0 < result["etcd_db_mb_start"] <= result["etcd_db_mb_max"]
    assert result["etcd_db_mb_end"] <= result["etcd_db_mb_max"]
    assert result["rss_mb_start"] > 0 and result["rss_mb_end"] > 0
    assert not any(line.startswith("{") for line in lines[:-1]), proc.stdout
    assert_etcd_cleaned_up(proc.stderr)


def test_bench_soak_rejects_bad_arguments(project_root: Path, subprocess_env: dict[str, str]) -> None:
    proc = run_bench(project_root, subprocess_env, "bench_soak.py", "--cycles", "0")
    assert proc.returncode == 2
    assert "--cycles must be >= 1" in proc.stderr


async def test_a_finished_trigger_tree_is_freed_without_the_cyclic_gc(etcd: EtcdCluster, root_path: str) -> None:
    """The soak's RSS stays flat only if a finished tree is freed at once: coordinators raise the GC thresholds so far
    (process.py) that a reference cycle left by a tree would be collected rarely or never."""
    async with QueryCluster(etcd, root_path) as c:
        coord = await c.start_coordinator()
        await c.add_node(faults=FaultConfig(latency_ms=100))
        cid = await c.create_collection("freed", partitions=1, segments=8)
        await c.wait_leader()
        lead = coord.coord.leadership
        assert lead is not None and c.client is not None
        gc.disable()
        try:
            r = await c.client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
            trigger = lead.scheduler.find(r.task_id)
            assert trigger is not None and trigger.children, "the load is still running"
            refs = [weakref.ref(trigger), *(weakref.ref(child) for child in trigger.children)]
            del trigger
            await c.wait_loaded(cid)
            await c.wait_idle()
            # Another trigger, so that the dispatch loop's last one is no longer the load.
            released = await c.client.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
            assert released.status.error_code == 0, released
            await c.wait_idle()
            await asyncio.sleep(0.1)  # the gRPC calls and the jobs let go of them
            assert [ref for ref in refs if ref() is not None] == []
        finally:
            gc.enable()
