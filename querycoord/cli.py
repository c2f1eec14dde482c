"""The ``querycoord`` command line.

Server commands: ``etcd`` (embedded etcd), ``coord`` (one coordinator),
``querynode`` (a reference query node), ``up`` (the all-in-one cluster),
``demo``. Client commands talk to the coordinators named by ``--address``
(any of them: the client follows the leader): ``collection
create|load|release|show``, ``balance``, ``tasks``, ``nodes``.

A client command that is refused prints ``error: <reason>`` (the Status
reason, which says what was wrong) and exits 1; an unreachable coordinator
is reported with the addresses tried. Never a traceback: a refused request
is an answer, not a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from proto import catalog_pb2, common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord import draw
from querycoord.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.logs import setup_logging

if TYPE_CHECKING:
    from querycoord.cluster_runner import AllInOne

DEFAULT_ADDRESS = "127.0.0.1:19531"
MIB = 1 << 20
# Vector dimension of the collections `collection create` makes: it only sizes the rows of a segment.
DIM = 128
# AddSegments batches: far below gRPC's 4 MiB message cap and a size the catalog writes in a handful of txns.
ADD_BATCH_SEGMENTS = 2000
ADD_BATCH_BYTES = 512 * 1024
ADD_CONCURRENCY = 4
POLL_INTERVAL = 0.2


class Refusal(Exception):
    """A request answered with a non-SUCCESS Status; ``reason`` is what the user reads."""

    def __init__(self, reason: str, code: int = common_pb2.UNEXPECTED_ERROR):
        super().__init__(reason)
        self.reason = reason
        self.code = code


def check(resp: Any, what: str = "") -> Any:
    """``resp`` if its Status is SUCCESS, else ``Refusal`` with the server's reason."""
    st = resp.status
    if st.error_code != common_pb2.SUCCESS:
        name = common_pb2.ErrorCode.Name(st.error_code) if st.error_code in common_pb2.ErrorCode.values() else "?"
        raise Refusal(st.reason or f"{what} failed ({name})", st.error_code)
    return resp


# ----- server commands ---------------------------------------------------------------------------------------------
def cmd_etcd(args: argparse.Namespace) -> int:
    """Run the embedded etcd in the foreground until Ctrl-C or SIGTERM."""
    from meta.etcd_server import EtcdCluster, EtcdNotFound, EtcdStartError

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="querycoord-etcd-"))
    try:
        cluster = EtcdCluster(data_dir, size=args.members).start()
    except (EtcdNotFound, EtcdStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"etcd running: --etcd-endpoints {','.join(cluster.endpoints)}  (data in {data_dir}; Ctrl-C stops)")
    sys.stdout.flush()
    try:
        while not stop.wait(0.5):
            dead = [m.name for m in cluster.members if not m.running]
            if dead:
                print(f"error: etcd member(s) {dead} exited; see logs in {data_dir}", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


def cmd_coord(args: argparse.Namespace) -> int:
    """Run one coordinator until SIGTERM/SIGINT (it campaigns; with others running it may stand by)."""
    from meta.errors import MetaError
    from querycoord.cluster_runner import listen_problem
    from querycoord.coord_options import config_from_args
    from querycoord.process import run_coordinator

    try:
        config = config_from_args(args)
        problem = listen_problem(config.listen)
        if problem:
            raise ValueError(problem)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_coordinator(config))
    except (MetaError, OSError, RuntimeError) as exc:  # grpc raises RuntimeError when it cannot bind
        print(f"error: the coordinator could not start: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def cmd_up(args: argparse.Namespace) -> int:
    """The all-in-one cluster in the foreground: Ctrl-C or SIGTERM stops every process it started."""
    try:
        return asyncio.run(_run_up(args))
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers were installed: nothing was started yet
        return 130


async def _run_up(args: argparse.Namespace) -> int:
    from querycoord.cluster_runner import AllInOne, ClusterStartError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        cluster = AllInOne(nodes=args.nodes, listen=args.listen, data_dir=args.data_dir, ttl=args.ttl,
                           root=args.root, node_capacity_mb=args.node_capacity_mb, log_level=args.log_level)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    starting = asyncio.create_task(cluster.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await cluster.stop()
        print("stopped before the cluster was ready; every process it started is gone", flush=True)
        return 0
    stopping.cancel()
    try:
        starting.result()
    except ClusterStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    code = 0
    try:
        _print_endpoints(cluster)
        reported: set[int] = set()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
            for child in cluster.exited():
                if child.pid in reported:
                    continue
                reported.add(child.pid)
                print(f"warning: {child.name} (pid {child.pid}) exited with code {child.proc.returncode}; "
                      f"see {child.log_path}", file=sys.stderr, flush=True)
                if child is cluster.coordinator:
                    print("error: the coordinator is gone; stopping the cluster", file=sys.stderr, flush=True)
                    code = 1
                    stop.set()
            if not cluster.etcd_running():
                print(f"error: etcd exited; see {cluster.data_dir}/etcd; stopping the cluster", file=sys.stderr,
                      flush=True)
                code = 1
                stop.set()
    finally:
        print("stopping: coordinator, query nodes, etcd ...", flush=True)
        await cluster.stop()
    print("stopped: every process of the cluster is gone", flush=True)
    return code


def _print_endpoints(cluster: AllInOne) -> None:
    kept = "kept" if cluster.keeps_data else "removed on exit"
    coord = cluster.coordinator
    assert coord is not None
    lines = [
        f"querycoord all-in-one cluster is up (data in {cluster.data_dir}, {kept})",
        f"  etcd endpoints  {','.join(cluster.etcd_endpoints)}",
        f"  coordinator     {cluster.coordinator_address}  (leader, pid {coord.pid}, log {coord.log_path})",
    ]
    for n in cluster.nodes:
        lines.append(f"  query node {n.node_id:<4} {n.address}  (pid {n.pid}, log {n.log_path})")
    addr = "" if cluster.coordinator_address == DEFAULT_ADDRESS else f" --address {cluster.coordinator_address}"
    lines.append(f"ready: try `querycoord nodes{addr}`; Ctrl-C stops everything")
    print("\n".join(lines), flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from querycoord import demo

    return demo.run_from_args(args)


# ----- client plumbing -----------------------------------------------------------------------------------------
ClientFn = Callable[[QueryCoordClient, argparse.Namespace], Awaitable[int]]


def client_command(fn: ClientFn) -> Callable[[argparse.Namespace], int]:
    """Run ``fn`` with a client; turn refusals, an unreachable coordinator and Ctrl-C into messages and codes."""

    def handler(args: argparse.Namespace) -> int:
        async def main() -> int:
            async with QueryCoordClient(args.address, deadline=args.timeout,
                                        call_timeout=max(args.timeout, 60.0)) as c:
                return await fn(c, args)

        try:
            return asyncio.run(main())
        except Refusal as exc:
            print(f"error: {exc.reason}", file=sys.stderr)
            return 1
        except CoordinatorUnavailable as exc:
            print(f"error: no leading coordinator answered at {args.address} within {args.timeout:g}s; is "
                  f"`querycoord up` or `querycoord coord` running there? ({exc})", file=sys.stderr)
            return 1
        except grpc.aio.AioRpcError as exc:
            print(f"error: {exc.code().name} from the coordinator at {args.address}: {exc.details()}",
                  file=sys.stderr)
            return 1
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("\ninterrupted: the request, if sent, goes on in the cluster; see `querycoord tasks`",
                  file=sys.stderr)
            return 130

    return handler


async def describe(c: QueryCoordClient, ref: str) -> catalog_pb2.CollectionDescription:
    """A collection named by id (digits) or by name, from the catalog: NOT_FOUND becomes a Refusal."""
    req = catalog_pb2.DescribeCollectionRequest()
    if ref.isdigit():
        req.collection_id = int(ref)
    else:
        req.collection_name = ref
    return check(await c.catalog("DescribeCollection", req), f"describe {ref}").collection


def partition_ids(desc: catalog_pb2.CollectionDescription, values: Sequence[str] | None) -> list[int]:
    """Partition ids from ``--partitions`` values (ids or names, comma- or space-separated)."""
    if not values:
        return []
    by_name = {p.name: p.partition_id for p in desc.partitions}
    known = set(by_name.values())
    out: list[int] = []
    for item in (x.strip() for v in values for x in v.split(",")):
        if not item:
            continue
        pid = int(item) if item.isdigit() else by_name.get(item)
        if pid is None or pid not in known:
            raise Refusal(f"collection {desc.name} (id {desc.collection_id}) has no partition {item!r}; it has "
                          f"{len(desc.partitions)}: {', '.join(p.name for p in desc.partitions[:8])}"
                          f"{' ...' if len(desc.partitions) > 8 else ''}", common_pb2.NOT_FOUND)
        if pid not in out:
            out.append(pid)
    return out


# ----- collection create ----------------------------------------------------------------------------------------
async def create_collection(
    c: QueryCoordClient,
    name: str,
    *,
    partitions: int,
    segments: int,
    channels: int = 2,
    segment_mb: float = 1.0,
    rows: int = 0,
) -> tuple[catalog_pb2.CollectionDescription, int]:
    """CreateCollection, then AddSegments in batches (several in flight); returns the description and the count.

    Batches stay far below gRPC's 4 MiB message cap; the catalog splits each
    into etcd txns itself. A failure after some batches leaves those segments
    in the catalog (the error says how many), as the Catalog API documents.
    """
    from querycoord.task.assign import merge_by_size

    if segments < 0:
        raise ValueError(f"--segments must be >= 0, got {segments}")
    if segment_mb <= 0:
        raise ValueError(f"--segment-mb must be positive, got {segment_mb}")
    schema = catalog_pb2.CollectionSchema(name=name, fields=[
        catalog_pb2.FieldSchema(name="id", data_type=catalog_pb2.DATA_TYPE_INT64, is_primary_key=True),
        catalog_pb2.FieldSchema(name="vec", data_type=catalog_pb2.DATA_TYPE_FLOAT_VECTOR, dim=DIM),
    ])
    resp = await c.catalog("CreateCollection", catalog_pb2.CreateCollectionRequest(
        collection_name=name, schema=schema, num_partitions=partitions, num_dm_channels=channels))
    desc = check(resp, f"create collection {name}").collection
    if not segments:
        return desc, 0
    cid = desc.collection_id
    pids = [p.partition_id for p in desc.partitions]
    mem = int(segment_mb * MIB)
    nrows = rows or max(1, mem // (DIM * 4 + 8))

    def batches() -> list[list[data_pb2.SegmentBinlogs]]:
        segs = [
            data_pb2.SegmentBinlogs(collection_id=cid, partition_id=pid, num_rows=nrows, mem_size=mem,
                                    binlog_paths=[f"insert_log/{cid}/{pid}/{i}/{k}" for k in range(2)])
            for i, pid in ((i, pids[i % len(pids)]) for i in range(segments))
        ]
        return merge_by_size(segs, ADD_BATCH_BYTES, max_items=ADD_BATCH_SEGMENTS)

    sem = asyncio.Semaphore(ADD_CONCURRENCY)
    added = 0

    async def send(batch: list[data_pb2.SegmentBinlogs]) -> None:
        nonlocal added
        async with sem:
            r = await c.catalog("AddSegments", catalog_pb2.AddSegmentsRequest(collection_id=cid, segments=batch))
        check(r, "add segments")
        added += len(r.segment_ids)

    results = await asyncio.gather(*(send(b) for b in batches()), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        first = errors[0]
        reason = first.reason if isinstance(first, Refusal) else str(first)
        raise Refusal(f"collection {name} (id {cid}) was created but only {added} of {segments} segments were "
                      f"added: {reason}")
    return desc, added


async def _collection_create(c: QueryCoordClient, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    desc, n = await create_collection(c, args.name, partitions=args.partitions, segments=args.segments,
                                      channels=args.channels, segment_mb=args.segment_mb, rows=args.rows)
    print(f"created collection {desc.name} (id {desc.collection_id}): {len(desc.partitions)} partitions, "
          f"{len(desc.dm_channels)} DM channels, {n:,} segments of {draw.mib(int(args.segment_mb * MIB))} "
          f"in {time.monotonic() - t0:.1f}s")
    return 0


# ----- collection load -------------------------------------------------------------------------------------------
ProgressHook = Callable[[int], Awaitable[None]]


async def follow_load(
    c: QueryCoordClient,
    collection_id: int,
    task_id: int,
    bar: draw.ProgressBar | None = None,
    *,
    on_progress: ProgressHook | None = None,
    interval: float = POLL_INTERVAL,
) -> int:
    """Poll the in-memory percentage (ShowCollections) until 100 % or the load task ends; returns the percentage.

    The task is watched as well as the percentage: a failed load is rolled
    back, so the collection simply disappears from ShowCollections and only
    the task says why (``Refusal``); and a load that ended while the
    collection was released meanwhile would otherwise be waited for forever.
    """

    async def percentage() -> int:
        show = await c.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[collection_id]))
        if show.status.error_code == common_pb2.NOT_FOUND:
            return -1  # not loaded (yet: the plan is not persisted; or any more: rolled back or released)
        check(show, "show collections")
        pct = int(show.collections[0].in_memory_percentage) if show.collections else -1
        if pct >= 0:
            if bar is not None:
                bar.update(pct, f"task #{task_id}")
            if on_progress is not None:
                await on_progress(pct)
        return pct

    while True:
        pct = await percentage()
        if pct >= 100 or not task_id:
            return pct
        got = await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=1))
        ended = got.status.error_code == common_pb2.NOT_FOUND
        if got.status.error_code == common_pb2.SUCCESS:
            trig = got.tree.trigger
            if trig.state == qc.TASK_STATE_FAILED:
                raise Refusal(f"load task #{task_id} failed: {trig.error}", trig.error_code)
            ended = trig.state == qc.TASK_STATE_EXPIRED
        if ended:
            pct = await percentage()
            if pct < 0:
                raise Refusal(f"load task #{task_id} ended but collection {collection_id} is not loaded "
                              f"(released meanwhile?)", common_pb2.NOT_FOUND)
            return pct
        await asyncio.sleep(interval)


async def load(c: QueryCoordClient, desc: catalog_pb2.CollectionDescription, pids: Sequence[int] = ()) -> int:
    """LoadCollection (or LoadPartitions); returns the task id (0: already loaded)."""
    cid = desc.collection_id
    if pids:
        resp = await c.query("LoadPartitions", qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids))
    else:
        resp = await c.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid))
    return int(check(resp, f"load {desc.name}").task_id)


async def _collection_load(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    pids = partition_ids(desc, args.partitions)
    what = f"{desc.name} (id {desc.collection_id})" + (f" partitions {pids}" if pids else "")
    t0 = time.monotonic()
    task_id = await load(c, desc, pids)
    if task_id == 0:
        print(f"{what} is already loaded")
        return 0
    if args.no_wait:
        print(f"load of {what} queued as task #{task_id}; follow it with `querycoord tasks --task {task_id}`")
        return 0
    bar = draw.ProgressBar(f"loading {desc.name}")
    try:
        pct = await follow_load(c, desc.collection_id, task_id, bar)
    except Refusal:
        bar.finish("failed")
        raise
    bar.finish(f"task #{task_id}")
    if pct < 100:
        print(f"load task #{task_id} of {what} ended with the collection {pct}% in memory; "
              f"see `querycoord tasks --task {task_id}`")
        return 1
    print(f"loaded {what} in {time.monotonic() - t0:.1f}s (task #{task_id})")
    return 0


# ----- collection release --------------------------------------------------------------------------------------
async def release(c: QueryCoordClient, desc: catalog_pb2.CollectionDescription, pids: Sequence[int] = ()) -> int:
    """ReleaseCollection (or ReleasePartitions), answered once released everywhere; returns the task id."""
    cid = desc.collection_id
    if pids:
        resp = await c.query("ReleasePartitions", qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=pids))
    else:
        resp = await c.query("ReleaseCollection", qc.ReleaseCollectionRequest(collection_id=cid))
    return int(check(resp, f"release {desc.name}").task_id)


async def _collection_release(c: QueryCoordClient, args: argparse.Namespace) -> int:
    desc = await describe(c, args.collection)
    pids = partition_ids(desc, args.partitions)
    what = f"{desc.name} (id {desc.collection_id})" + (f" partitions {pids}" if pids else "")
    t0 = time.monotonic()
    task_id = await release(c, desc, pids)
    if task_id == 0:
        print(f"{what} was not loaded: nothing to release")
    else:
        print(f"released {what} in {time.monotonic() - t0:.1f}s (task #{task_id})")
    return 0


# ----- collection show ------------------------------------------------------------------------------------------
LOAD_TYPES = {data_pb2.LOAD_TYPE_COLLECTION: "collection", data_pb2.LOAD_TYPE_PARTITION: "partitions"}


async def collection_rows(c: QueryCoordClient, refs: Sequence[str] = ()) -> list[list[object]]:
    """Rows of ``collection show``: every catalog collection (or those named) with its load state."""
    cat = check(await c.catalog("ShowCollections", catalog_pb2.ShowCollectionsRequest()), "catalog show")
    summaries = {s.collection_id: s for s in cat.collections}
    if refs:
        ids = [(await describe(c, r)).collection_id for r in refs]
    else:
        ids = sorted(summaries)
    loaded = check(await c.query("ShowCollections", qc.ShowCollectionsRequest()), "show collections")
    infos = {i.collection_id: i for i in loaded.collections}
    rows: list[list[object]] = []
    for cid in ids:
        s = summaries.get(cid)
        info = infos.get(cid)
        name = s.name if s else "?"
        parts = s.num_partitions if s else 0
        segs = s.num_segments if s else 0
        if info is None:
            rows.append([cid, name, parts, f"{segs:,}", "-", "not loaded", "-"])
        else:
            rows.append([cid, name, parts, f"{segs:,}", LOAD_TYPES.get(info.load_type, "?"),
                         f"{info.in_memory_percentage}%", len(info.partitions)])
    return rows


COLLECTION_HEADERS = ("ID", "NAME", "PARTITIONS", "SEGMENTS", "LOAD TYPE", "LOADED", "LOADED PARTITIONS")


async def _collection_show(c: QueryCoordClient, args: argparse.Namespace) -> int:
    rows = await collection_rows(c, args.collections)
    if not rows:
        print("no collections; create one with `querycoord collection create NAME`")
        return 0
    print("\n".join(draw.table(COLLECTION_HEADERS, rows, right=(0, 2, 3, 5, 6))))
    return 0


# ----- balance ---------------------------------------------------------------------------------------------------
async def wait_task(c: QueryCoordClient, task_id: int, children_limit: int = 0) -> qc.TaskTree:
    """Poll GetTask until the trigger is finished (EXPIRED or FAILED); returns its tree."""
    while True:
        got = check(await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=children_limit)),
                    f"task {task_id}")
        if got.tree.trigger.state in (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED):
            return got.tree
        await asyncio.sleep(POLL_INTERVAL)


def _ints(values: Sequence[str] | None, what: str) -> list[int]:
    out: list[int] = []
    for item in (x.strip() for v in (values or ()) for x in v.split(",")):
        if not item:
            continue
        if not item.isdigit():
            raise ValueError(f"{what} must be numeric ids, got {item!r}")
        out.append(int(item))
    return out


async def _balance(c: QueryCoordClient, args: argparse.Namespace) -> int:
    req = qc.LoadBalanceRequest(source_node_ids=_ints(args.source, "--source"), dst_node_ids=_ints(args.dst, "--dst"),
                                sealed_segment_ids=_ints(args.segments, "--segments"),
                                collection_id=args.collection or 0)
    task_id = check(await c.query("LoadBalance", req), "load balance").task_id
    if args.no_wait:
        print(f"balance queued as task #{task_id}; follow it with `querycoord tasks --task {task_id}`")
        return 0
    tree = await wait_task(c, task_id)
    print("\n".join(draw.draw_tree(tree, max_children=args.max_children)))
    if tree.trigger.state == qc.TASK_STATE_FAILED:
        raise Refusal(f"balance task #{task_id} failed: {tree.trigger.error}", tree.trigger.error_code)
    moved = sum(segments_in(ch.summary) for ch in tree.children if ch.kind == qc.TASK_KIND_LOAD_SEGMENT)
    print(f"balance task #{task_id} finished: {moved:,} segments moved")
    return 0


def segments_in(summary: str) -> int:
    """The count in a child summary like ``load 40 segments of collection 7`` (0 if absent)."""
    words = summary.split()
    return int(words[1]) if len(words) > 2 and words[0] == "load" and words[1].isdigit() else 0


# ----- tasks -----------------------------------------------------------------------------------------------------
async def list_trees(c: QueryCoordClient, *, include_finished: bool, include_children: bool,
                     collection_id: int = 0, children_limit: int = 0) -> list[qc.TaskTree]:
    """Every page of ListTasks.

    Finished trees are always asked for with their children, which are then
    dropped here if not wanted: the server, asked for finished trees without
    children, clears the children of the history it keeps (so a later
    ``tasks --all --children`` would show none). Pages are small then:
    ``children_limit`` only applies to running trees, finished ones come
    whole, and a client accepts at most 4 MiB per answer.
    """
    ask_children = include_children or include_finished
    trees: list[qc.TaskTree] = []
    after = 0
    while True:
        resp = check(await c.query("ListTasks", qc.ListTasksRequest(
            include_finished=include_finished, include_children=ask_children, collection_id=collection_id,
            after_task_id=after, children_limit=children_limit or (0 if include_children else 1),
            limit=5 if ask_children else 0)), "list tasks")
        trees.extend(resp.trees)
        if not resp.next_after_task_id:
            break
        after = resp.next_after_task_id
    if not include_children:
        for tr in trees:
            del tr.children[:]
    return trees


async def _tasks(c: QueryCoordClient, args: argparse.Namespace) -> int:
    if args.task:
        got = check(await c.query("GetTask", qc.GetTaskRequest(task_id=args.task, children_limit=args.max_children)),
                    f"task {args.task}")
        print("\n".join(draw.draw_tree(got.tree, max_children=args.max_children)))
        return 0
    trees = await list_trees(c, include_finished=args.all, include_children=args.children,
                             collection_id=args.collection or 0, children_limit=args.max_children)
    if not trees:
        print("no task is queued or running" + ("" if args.all else " (--all also lists recently finished ones)"))
        return 0
    for i, tree in enumerate(trees):
        if args.children:
            if i:
                print()
            print("\n".join(draw.draw_tree(tree, max_children=args.max_children)))
        else:
            print(draw.trigger_line(tree.trigger, tree.child_counts))
    return 0


# ----- nodes -----------------------------------------------------------------------------------------------------
def node_rows(nodes: Sequence[qc.NodeInfo]) -> list[list[object]]:
    rows: list[list[object]] = []
    for n in nodes:
        pct = f"{100 * n.memory_used / n.memory_capacity:.0f}%" if n.memory_capacity else "-"
        rows.append([n.node_id, n.address, n.state, f"{n.segment_count:,}", n.dm_channel_count,
                     f"{draw.mib(n.memory_used)} / {draw.mib(n.memory_capacity)}", pct])
    return rows


NODE_HEADERS = ("ID", "ADDRESS", "STATE", "SEGMENTS", "DM CHANNELS", "MEMORY", "USED")


async def _nodes(c: QueryCoordClient, args: argparse.Namespace) -> int:
    resp = check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes")
    if not resp.nodes:
        print("no query node is registered; start one with `querycoord querynode` (or use `querycoord up`)")
        return 0
    print("\n".join(draw.table(NODE_HEADERS, node_rows(resp.nodes), right=(0, 3, 4, 6))))
    return 0


# ----- parser ------------------------------------------------------------------------------------------------------
def _client_options(suppress: bool) -> argparse.ArgumentParser:
    """``--address`` and ``--timeout``, accepted before or after the sub-command.

    Sub-commands declare them with SUPPRESS defaults so that a value given
    before the sub-command is not overwritten by the sub-command's default.
    """
    p = argparse.ArgumentParser(add_help=False)
    d = argparse.SUPPRESS
    p.add_argument("--address", default=d if suppress else os.environ.get("QUERYCOORD_ADDRESS", DEFAULT_ADDRESS),
                   help="comma-separated coordinator addresses (any of them; the leader is followed) "
                        f"(default $QUERYCOORD_ADDRESS or {DEFAULT_ADDRESS})")
    p.add_argument("--timeout", type=float, default=d if suppress else 15.0,
                   help="seconds to find a leading coordinator before giving up (default 15)")
    return p


def build_parser() -> argparse.ArgumentParser:
    from querycoord.coord_options import add_coord_options
    from querycoord.demo import add_demo_arguments
    from querycoord.drill import add_drill_parser
    from querycoord.nodes.querynode import add_querynode_parser
    from querycoord.nodes.streamnode import add_streamnode_parser

    parser = argparse.ArgumentParser(prog="querycoord", description="etcd-backed query coordinator",
                                     parents=[_client_options(False)])
    parser.add_argument("--log-level", default=None,
                        help="DEBUG, INFO, WARNING (default $QUERYCOORD_LOG_LEVEL or INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = [_client_options(True)]

    p = sub.add_parser("etcd", help="run the embedded etcd in the foreground")
    p.add_argument("--data-dir", help="data directory (kept across runs; default: a new temp dir)")
    p.add_argument("--members", type=int, default=1, choices=(1, 3), help="1 member, or a 3-member cluster")
    p.set_defaults(func=cmd_etcd)

    p = sub.add_parser("coord", help="run one coordinator (campaigns; leads or stands by)")
    add_coord_options(p)
    p.set_defaults(func=cmd_coord)

    add_querynode_parser(sub)
    add_streamnode_parser(sub)
    add_drill_parser(sub)

    p = sub.add_parser("up", help="run the all-in-one cluster (embedded etcd, a coordinator, query nodes)")
    p.add_argument("--nodes", type=int, default=3, help="query nodes to start (default 3)")
    p.add_argument("--listen", default=DEFAULT_ADDRESS, help=f"coordinator address (default {DEFAULT_ADDRESS})")
    p.add_argument("--data-dir", default=None, help="keep etcd data and logs here (default: a temp dir removed "
                                                    "on exit)")
    p.add_argument("--ttl", type=float, default=10.0, help="session TTL of the coordinator and nodes (default 10)")
    p.add_argument("--root", default="querycoord", help="meta root path in etcd (default querycoord)")
    p.add_argument("--node-capacity-mb", type=float, default=1024, help="memory of each query node (default 1024)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("demo", help="the demo that `make demo` runs")
    add_demo_arguments(p)
    p.set_defaults(func=cmd_demo)

    # collection ...
    p = sub.add_parser("collection", help="create, load, release and show collections")
    csub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = csub.add_parser("create", parents=client, help="create a collection with synthetic sealed segments")
    q.add_argument("name")
    q.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    q.add_argument("--segments", type=int, default=0, help="sealed segments spread over the partitions (default 0)")
    q.add_argument("--channels", type=int, default=2, help="DM channels (default 2)")
    q.add_argument("--segment-mb", type=float, default=1.0, help="memory size of each segment in MiB (default 1)")
    q.add_argument("--rows", type=int, default=0, help="rows per segment (default: derived from the size)")
    q.set_defaults(func=client_command(_collection_create))

    q = csub.add_parser("load", parents=client, help="load a collection (or partitions), with a progress bar")
    q.add_argument("collection", help="collection id or name")
    q.add_argument("--partitions", nargs="+", help="partition ids or names (default: the whole collection)")
    q.add_argument("--no-wait", action="store_true", help="return once the load is queued")
    q.set_defaults(func=client_command(_collection_load))

    q = csub.add_parser("release", parents=client, help="release a collection (or partitions)")
    q.add_argument("collection", help="collection id or name")
    q.add_argument("--partitions", nargs="+", help="partition ids or names (default: the whole collection)")
    q.set_defaults(func=client_command(_collection_release))

    q = csub.add_parser("show", parents=client, help="collections and their load state")
    q.add_argument("collections", nargs="*", help="collection ids or names (default: all)")
    q.set_defaults(func=client_command(_collection_show))

    p = sub.add_parser("balance", parents=client, help="move sealed segments off query nodes")
    p.add_argument("--source", nargs="+", required=True, help="source node ids")
    p.add_argument("--dst", nargs="+", help="destination node ids (default: any other online node)")
    p.add_argument("--segments", nargs="+", help="segment ids to move (default: every segment of the sources)")
    p.add_argument("--collection", type=int, default=0, help="only segments of this collection id")
    p.add_argument("--no-wait", action="store_true", help="return once the balance is queued")
    p.add_argument("--max-children", type=int, default=20, help="children drawn at most (0: all; default 20)")
    p.set_defaults(func=client_command(_balance))

    p = sub.add_parser("tasks", parents=client, help="task trees: queued and running (--all: recent ones too)")
    p.add_argument("--all", action="store_true", help="include recently finished trees")
    p.add_argument("--children", action="store_true", help="draw the children of each trigger")
    p.add_argument("--task", type=int, default=0, help="draw the tree of this task (trigger or child id)")
    p.add_argument("--collection", type=int, default=0, help="only tasks of this collection id")
    p.add_argument("--max-children", type=int, default=50, help="children drawn per tree at most (0: all; default 50)")
    p.set_defaults(func=client_command(_tasks))

    p = sub.add_parser("nodes", parents=client, help="query nodes and what they hold")
    p.set_defaults(func=client_command(_nodes))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
