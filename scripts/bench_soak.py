"""Soak: load, balance and release one collection over and over; etcd's db size and the coordinator's RSS stay flat.

Setup (not measured): an embedded etcd as ``querycoord etcd`` runs it (auto
compaction in revision mode every 5 minutes keeping ``--keep-revisions``,
an explicit backend quota) or ``--etcd-endpoints``; one coordinator process
(``querycoord coord``, auto balance off); ``--nodes`` query node processes;
a catalog collection of ``--segments`` segments in ``--partitions``
partitions.

Each cycle: LoadCollection until 100 % in memory and the task finished; a
LoadBalance of everything on the fullest node to the others, until
finished; ReleaseCollection (answered once released everywhere). Every
trigger writes and then deletes its task keys and the segment records, so
without compaction etcd's history, and so its db file, would grow with
every cycle.

A table row every ``--sample-every`` cycles (and at the start and the end):
cycle, elapsed seconds, etcd revision and compacted revision, db size and
the part in use, the coordinator's RSS. The last line printed is::

    {"cycles": ..., "etcd_db_mb_start": ..., "etcd_db_mb_max": ..., "etcd_db_mb_end": ...,
     "rss_mb_start": ..., "rss_mb_end": ...}

(start: after setup, before the first cycle; db size of the member asked).
Bounded means: once the first auto compaction ran, the db size stops
growing (freed pages are reused) and the RSS stays where the first cycles
took it, however many cycles follow.

Example: ``python scripts/bench_soak.py --cycles 20 --sample-every 5`` (quick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchlib import BenchError, add_cluster_options, arg_parser, check_cluster_options, report, require_positive
from loguru import logger

from meta.client import EtcdClient, connect
from meta.config import EtcdConfig
from meta.kv import MetaKV
from meta.ops.etcd_server import DEFAULT_QUOTA_BYTES, EtcdCluster
from meta.ops.maintenance import DEFAULT_KEEP_REVISIONS, MIB, compacted_revision
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.console.actions import Refusal, check, create_collection, load, release
from querycoord.net.client import QueryCoordClient
from querycoord.tooling.harness import QUERY_NODE, Harness

DONE_STATES = (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED)


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MiB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise BenchError(f"no VmRSS for pid {pid}")


async def db_status(client: EtcdClient) -> tuple[int, int, int]:
    """(revision, db size, db size in use) of the member the client talks to."""
    maintenance = client.raw.maintenance
    assert maintenance is not None
    st = await client.call("Maintenance.Status", lambda t: maintenance.status(timeout=t))
    return st.header.revision, st.dbSize, st.dbSizeInUse


async def wait_task(c: QueryCoordClient, task_id: int, what: str, poll: float) -> None:
    """Until trigger ``task_id`` finished; a failed one ends the soak."""
    if not task_id:
        return
    while True:
        got = await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=1))
        if got.status.error_code == common_pb2.SUCCESS and got.tree.trigger.state in DONE_STATES:
            if got.tree.trigger.state == qc.TASK_STATE_FAILED:
                raise BenchError(f"{what} (task {task_id}) failed: {got.tree.trigger.error}")
            return
        check(got, f"task {task_id}")
        await asyncio.sleep(poll)


async def loaded_percentage(c: QueryCoordClient, cid: int) -> int:
    show = await c.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    if show.status.error_code == common_pb2.NOT_FOUND:
        return -1
    check(show, "show collections")
    return int(show.collections[0].in_memory_percentage) if show.collections else -1


async def one_cycle(c: QueryCoordClient, desc, poll: float) -> None:  # type: ignore[no-untyped-def]
    cid = desc.collection_id
    await wait_task(c, await load(c, desc), "load", poll)
    while await loaded_percentage(c, cid) < 100:
        await asyncio.sleep(poll)
    nodes = check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes").nodes
    fullest = max(nodes, key=lambda n: n.segment_count)
    if fullest.segment_count:
        resp = check(await c.query("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[fullest.node_id])),
                     "load balance")
        await wait_task(c, resp.task_id, "balance", poll)
    await wait_task(c, await release(c, desc), "release", poll)


def fmt_row(cells: list[object]) -> str:
    return "  ".join(str(x).rjust(w) for x, w in zip(cells, (7, 8, 10, 10, 8, 10, 8), strict=True))


async def soak(config: EtcdConfig, args: argparse.Namespace, work: Path) -> dict[str, object]:
    root = f"bench/{uuid.uuid4().hex[:8]}"
    client = await connect(config)
    harness = Harness(config.endpoints, root, work, ttl=args.ttl, log_level="WARNING")
    qclient: QueryCoordClient | None = None
    try:
        coord = await harness.start_coordinator(0, "127.0.0.1:0", "--auto-balance-interval", "0")
        for i in range(args.nodes):
            await harness.start_node(QUERY_NODE, i, "--capacity-mb", str(args.node_capacity_mb))
        await harness.wait_leader(60)
        qclient = QueryCoordClient([coord.address], deadline=60, call_timeout=60)
        deadline = time.monotonic() + 60
        while len(check(await qclient.query("ShowNodes", qc.ShowNodesRequest()), "show nodes").nodes) < args.nodes:
            if time.monotonic() > deadline:
                raise BenchError(f"{args.nodes} query nodes did not come online within 60s")
            await asyncio.sleep(0.1)
        desc, added = await create_collection(qclient, "soak", partitions=args.partitions, segments=args.segments,
                                              segment_mb=args.segment_mb)
        logger.info("collection {} with {} segments; coordinator pid {}", desc.collection_id, added, coord.child.pid)

        started = time.monotonic()
        samples: list[tuple[float, float]] = []  # (db MiB, rss MiB)

        async def sample(cycle: int) -> None:
            rev, db, in_use = await db_status(client)
            compacted = await compacted_revision(client, rev)
            rss = rss_mb(coord.child.pid)
            samples.append((db / MIB, rss))
            print(fmt_row([cycle, f"{time.monotonic() - started:.0f}", rev, compacted, f"{db / MIB:.2f}",
                           f"{in_use / MIB:.2f}", f"{rss:.1f}"]), file=args.out, flush=True)

        print(fmt_row(["cycle", "elapsed", "revision", "compacted", "db_mb", "in_use_mb", "rss_mb"]), file=args.out,
              flush=True)
        await sample(0)
        for cycle in range(1, args.cycles + 1):
            await one_cycle(qclient, desc, args.poll)
            if cycle % args.sample_every == 0 or cycle == args.cycles:
                await sample(cycle)
            if not coord.running:
                raise BenchError(f"the coordinator exited during cycle {cycle}; see {coord.child.log_path}")
        dbs = [d for d, _ in samples]
        return {"cycles": args.cycles, "etcd_db_mb_start": round(dbs[0], 2), "etcd_db_mb_max": round(max(dbs), 2),
                "etcd_db_mb_end": round(dbs[-1], 2), "rss_mb_start": round(samples[0][1], 1),
                "rss_mb_end": round(samples[-1][1], 1)}
    except Refusal as exc:
        raise BenchError(f"the cluster refused a request: {exc.reason}") from exc
    finally:
        if qclient is not None:
            await qclient.close()
        await harness.stop()
        if args.etcd_endpoints:
            with contextlib.suppress(Exception):
                await MetaKV(client, root).remove_prefix("")
        await client.close()


def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        work = Path(tmp)
        if args.etcd_endpoints:
            return asyncio.run(soak(EtcdConfig.from_endpoints(args.etcd_endpoints), args, work))
        cluster = EtcdCluster(work / "etcd", quota_backend_bytes=args.quota_mb * MIB,
                              auto_compaction_retention=args.keep_revisions)
        with cluster:
            member = cluster.members[0]
            print(f"embedded etcd pid {member.pid} on {member.endpoint}, data dir {member.data_dir}",
                  file=sys.stderr, flush=True)
            return asyncio.run(soak(cluster.config(), args, work))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = arg_parser(__doc__, verbose_help="log progress to stderr")
    m = p.add_argument_group("soak")
    m.add_argument("--cycles", type=int, default=1000, help="load/balance/release cycles (default 1000)")
    m.add_argument("--sample-every", type=int, default=50, help="a table row every N cycles (default 50)")
    g = add_cluster_options(p, segments=100, partitions=2, nodes=2, poll=0.02, node_help="query node processes")
    g.add_argument("--segment-mb", type=float, default=1.0, help="memory size of a segment (default 1)")
    g.add_argument("--node-capacity-mb", type=int, default=1024, help="memory of each node (default 1024)")
    e = p.add_argument_group("embedded etcd")
    e.add_argument("--keep-revisions", type=int, default=DEFAULT_KEEP_REVISIONS,
                   help=f"auto compaction retention (default {DEFAULT_KEEP_REVISIONS})")
    e.add_argument("--quota-mb", type=int, default=DEFAULT_QUOTA_BYTES // MIB,
                   help=f"backend quota (default {DEFAULT_QUOTA_BYTES // MIB})")
    args = p.parse_args(argv)
    check_cluster_options(p, args)
    require_positive(p, args, ("cycles", "sample_every", "node_capacity_mb", "quota_mb"))
    if args.segment_mb <= 0:
        p.error("--segment-mb must be > 0")
    if args.keep_revisions < 0:
        p.error("--keep-revisions must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = sys.stdout  # the table; the processes' output goes to stderr
    return report(lambda: run(args), verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
