"""Read probes of ``bench_scale_ops.py``: a standby's reads, GetSegmentInfo, ``status -o json`` and the status
page, ``meta verify`` as a process; each a median (ms) or a wall and peak RSS.

Imported by the scripts as a sibling module (see ``benchlib``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import urllib.error
import urllib.request

from benchlib import BenchError
from scale_cluster import ScaleCluster
from scale_ops_probes import byte_compile_project, timed_process

from meta.config import EtcdConfig
from proto import querycoord_pb2 as qc
from proto import querycoord_pb2_grpc
from querycoord.security.grpc_channels import make_channel
from querycoord.tooling.harness import Member

MAX_IDS = 65_536  # ids in one request (limits.max_ids_per_request)


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 1)


async def standby_reads(c1: Member, cid: int, reads: int) -> float:
    """Median ms of ShowCollections and GetReplicas sent to the standby itself (never redirected)."""
    channel = make_channel(c1.address)
    stub = querycoord_pb2_grpc.QueryCoordStub(channel)
    took: list[float] = []
    try:
        for _ in range(reads):
            for method, req in (("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid])),
                                ("GetReplicas", qc.GetReplicasRequest(collection_id=cid))):
                t = time.perf_counter()
                resp = await getattr(stub, method)(req, timeout=300)
                took.append(time.perf_counter() - t)
                if resp.status.error_code != 0:
                    raise BenchError(f"the standby did not answer {method}: {resp.status.reason}")
    finally:
        await channel.close()
    return median_ms(took)


async def segment_info(cl: ScaleCluster, reads: int) -> tuple[float, int]:
    # The ids the nodes hold (asking the coordinator for every segment would be a message of them all).
    ids = sorted({sid for n in cl.nodes for sid, seg in n.state.segments.items()
                  if seg.collection_id == cl.collection_id})[:MAX_IDS]
    took: list[float] = []
    for _ in range(reads):
        t = time.perf_counter()
        resp = await cl.client_of_c0.query("GetSegmentInfo", qc.GetSegmentInfoRequest(segment_ids=ids))
        took.append(time.perf_counter() - t)
        if resp.status.error_code != 0 or len(resp.infos) < len(ids):
            raise BenchError(f"GetSegmentInfo of {len(ids)} ids: {resp.status.reason or len(resp.infos)} infos")
    return median_ms(took), len(ids)


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "querycoord.cli", *args]


async def status_reads(cl: ScaleCluster, config: EtcdConfig, reads: int) -> tuple[float, float, float, list[str]]:
    """(``status -o json`` ms, ``--help`` ms: a process's floor, status page ms, the page's failed answers); the
    times are medians, a failed answer's included (a page that fails is timed until it says so)."""
    etcd = ("--etcd-endpoints", ",".join(config.endpoints), "--root", cl.kv.root)
    status: list[float] = []
    floor: list[float] = []
    page: list[float] = []
    failed: list[str] = []
    await asyncio.to_thread(byte_compile_project)  # the processes load .pyc, as an installed querycoord does
    for _ in range(reads):
        wall, _rss, code, out = await asyncio.to_thread(timed_process, cli_argv("status", *etcd, "-o", "json"))
        if code != 0 or not out.lstrip().startswith("{"):
            raise BenchError(f"querycoord status -o json exited {code}")
        status.append(wall)
        floor.append((await asyncio.to_thread(timed_process, cli_argv("--help")))[0])
    for _ in range(reads):
        await asyncio.sleep(1.1)  # the page's snapshot serves a second: never reuse it
        t = time.perf_counter()
        code, body = await asyncio.to_thread(_get, f"http://{cl.http0}/")
        page.append(time.perf_counter() - t)
        if code != 200 or b"<html" not in body[:200].lower():
            failed.append(f"HTTP {code}: {body[:200].decode(errors='replace').strip()}")
    return median_ms(status), median_ms(floor), median_ms(page), failed


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=300) as resp:
            return resp.status, bytes(resp.read())
    except urllib.error.HTTPError as exc:  # the page's own refusal (503 when it was not ready in time)
        return exc.code, exc.read()


async def meta_verify(cl: ScaleCluster, config: EtcdConfig) -> tuple[float, float, int]:
    argv = cli_argv("meta", "verify", "--etcd-endpoints", ",".join(config.endpoints), "--root", cl.kv.root,
                    "--timeout", "600")
    wall, rss_kib, code, _out = await asyncio.to_thread(timed_process, argv)
    if code not in (0, 1):
        raise BenchError(f"querycoord meta verify exited {code}")
    return wall, rss_kib / 1024, code


__all__ = ["MAX_IDS", "cli_argv", "median_ms", "meta_verify", "segment_info", "standby_reads", "status_reads"]
