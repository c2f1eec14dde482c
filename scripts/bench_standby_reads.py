"""Standby reads under many readers: latency and the standby's memory at N segments.

A test holds the leadership (a session and the election key), so one real
``querycoord coord`` process stands by; the query meta holds one collection of
--segments segments. Rounds of --readers concurrent ShowCollections and
GetReplicas calls go to the standby; the table shows per round the slowest and
median call, refusals (RESOURCE_EXHAUSTED) and the standby's RSS before and its
peak after. Then the leadership is revoked and the standby must take over. The
last line is one JSON object.

    python scripts/bench_standby_reads.py --segments 100000 --readers 16,48
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchlib import BenchError, arg_parser, report, run_on_etcd

from meta.client import connect
from meta.config import EtcdConfig
from meta.election import Election
from meta.kv import MetaKV
from meta.ops.child import ChildProcess, child_env
from meta.session import Session
from proto import common_pb2, data_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.common.protocol import QUERYCOORD_ELECTION, QUERYCOORD_ROLE
from querycoord.querymeta import QueryMeta
from querycoord.security.grpc_channels import make_channel
from querycoord.tooling.harness import coord_argv


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


async def _fill(kv: MetaKV, fence: Any, segments: int) -> None:
    meta = QueryMeta(kv.fenced(fence))
    await meta.reload()
    await meta.add_collection(1, data_pb2.LOAD_TYPE_COLLECTION, [10])
    for start in range(0, segments, 2000):
        await meta.save_segments([data_pb2.SegmentInfo(
            segment_id=100 + i, collection_id=1, partition_id=10, node_id=1 + i % 3, mem_size=100, num_rows=10,
            state=data_pb2.SEGMENT_STATE_SEALED) for i in range(start, min(segments, start + 2000))])


async def _round(stub: Any, readers: int) -> dict[str, Any]:
    async def timed(call: Any) -> tuple[float, int]:
        began = time.monotonic()
        resp = await call
        return time.monotonic() - began, resp.status.error_code

    calls = [timed(stub.ShowCollections(qc.ShowCollectionsRequest(), timeout=300)) for _ in range(readers)]
    calls += [timed(stub.GetReplicas(qc.GetReplicasRequest(collection_id=1), timeout=300)) for _ in range(readers)]
    out = await asyncio.gather(*calls)
    took = [t for t, _ in out]
    return {"calls": len(out), "median_ms": round(1000 * statistics.median(took), 1),
            "max_ms": round(1000 * max(took), 1),
            "refused": sum(code == common_pb2.RESOURCE_EXHAUSTED for _, code in out),
            "failed": sum(code not in (common_pb2.SUCCESS, common_pb2.RESOURCE_EXHAUSTED) for _, code in out)}


async def bench(etcd: EtcdConfig, args: argparse.Namespace) -> dict[str, Any]:
    client = await connect(etcd)
    root = f"bench-standby-reads/{uuid.uuid4().hex[:8]}"
    kv = MetaKV(client, root)
    session = Session(kv, QUERYCOORD_ROLE, "127.0.0.1:1", ttl=5)
    await session.start()
    fence = await Election(kv, session, QUERYCOORD_ELECTION).campaign("127.0.0.1:1")
    await _fill(kv, fence, args.segments)
    argv = coord_argv(",".join(etcd.endpoints), root, "127.0.0.1:0", 2, log_level="WARNING")
    coord = await ChildProcess.spawn("standby", argv, env=child_env())
    result: dict[str, Any] = {"segments": args.segments}
    try:
        ready = await coord.wait_event("ready", 120)
        channel = make_channel(ready["address"])
        stub = querycoord_pb2_grpc.QueryCoordStub(channel)
        first = await stub.GetReplicas(qc.GetReplicasRequest(collection_id=1), timeout=300)
        if first.status.error_code != common_pb2.SUCCESS:
            raise BenchError(f"the standby did not answer: {first.status.reason}")
        baseline = _kib(coord.pid, "VmRSS")
        result["baseline_rss_mib"] = round(baseline / 1024, 1)
        print(f"{'readers':>8} {'calls':>6} {'median ms':>10} {'max ms':>8} {'refused':>8} {'failed':>7} "
              f"{'peak RSS MiB':>13}", file=args.out)
        for readers in args.readers:
            r = await _round(stub, readers)
            peak = _kib(coord.pid, "VmHWM")
            r["peak_rss_mib"] = round(peak / 1024, 1)
            print(f"{readers:>8} {r['calls']:>6} {r['median_ms']:>10} {r['max_ms']:>8} {r['refused']:>8} "
                  f"{r['failed']:>7} {r['peak_rss_mib']:>13}", file=args.out, flush=True)
            result[f"readers_{readers}"] = r
        await channel.close()
        await session.close(revoke=True)
        began = time.monotonic()
        await coord.wait_event("leader", 120)
        result["takeover_s"] = round(time.monotonic() - began, 2)
        result["standby_alive"] = coord.proc.returncode is None
    finally:
        await coord.kill()
        await session.close()
        await kv.remove_prefix("")
        await client.close()
    return result


def main() -> int:
    p = arg_parser(__doc__ or "", verbose_help="progress on stderr")
    p.add_argument("--segments", type=int, default=100_000)
    p.add_argument("--readers", default="16,48", help="concurrent readers of each call per round (comma-separated)")
    args = p.parse_args()
    try:
        args.readers = [int(r) for r in args.readers.split(",") if r.strip()]
    except ValueError:
        p.error("--readers: comma-separated positive integers")
    if args.segments <= 0 or not args.readers or min(args.readers) <= 0:
        p.error("--segments and --readers must be positive")
    args.out = sys.stdout
    return report(lambda: run_on_etcd(bench, args, "bench-standby-reads-"), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
