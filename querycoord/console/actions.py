"""What a client does with a cluster: create, load, release and follow collections, list tasks and nodes,
create, stop, start, drop and show streams and snodes.

The ``querycoord`` command line and the demo both drive a cluster this way,
so both live on top of this module (and neither imports the other). A
request the cluster refuses becomes a ``Refusal`` whose ``reason`` is the
server's, which is what the user reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from google.protobuf.message import Message

from proto import catalog_pb2, common_pb2, data_pb2, stream_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.messages import rpc_method
from querycoord.common.protocol import parse_leader
from querycoord.common.wording import plural
from querycoord.console import draw
from querycoord.net.client import QueryCoordClient

MIB = 1 << 20


# Vector dimension of the collections `collection create` makes: it only sizes the rows of a segment.
DIM = 128


# AddSegments batches: far below gRPC's 4 MiB message cap and a size the catalog writes in a handful of txns.
ADD_BATCH_SEGMENTS = 2000


ADD_BATCH_BYTES = 512 * 1024


ADD_CONCURRENCY = 4


POLL_INTERVAL = 0.2


QUERYCOORD = qc.DESCRIPTOR.services_by_name["QueryCoord"]


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
    if rows < 0:
        raise ValueError(f"--rows must be >= 0, got {rows}")
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
        raise Refusal(f"collection {name} (id {cid}) was created but only {added} of "
                      f"{plural(segments, 'segment')} were added: {reason}")
    return desc, added


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
            if trig.state in (qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED):
                raise Refusal(f"load task #{task_id} failed: {trig.error}", trig.error_code)
            ended = trig.state == qc.TASK_STATE_EXPIRED
        if ended:
            pct = await percentage()
            if pct < 0:
                raise Refusal(f"load task #{task_id} ended but collection {collection_id} is not loaded "
                              f"(released meanwhile?)", common_pb2.NOT_FOUND)
            return pct
        await asyncio.sleep(interval)


async def _start_task(c: QueryCoordClient, request: Message, what: str) -> int:
    """Send a mutating QueryCoord request; the id of the task it started."""
    resp = await c.query(rpc_method(QUERYCOORD, request), request)
    return int(check(resp, what).task_id)


async def load(c: QueryCoordClient, desc: catalog_pb2.CollectionDescription, pids: Sequence[int] = (),
               replicas: int | None = None) -> int:
    """LoadCollection (or LoadPartitions) with ``replicas`` in-memory copies (None: the server's default, one
    for a new load); returns the task id (0: already loaded)."""
    cid = desc.collection_id
    req: qc.LoadPartitionsRequest | qc.LoadCollectionRequest = (
        qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids) if pids
        else qc.LoadCollectionRequest(collection_id=cid))
    if replicas is not None:
        req.replica_number = replicas
    return await _start_task(c, req, f"load {desc.name}")


async def release(c: QueryCoordClient, desc: catalog_pb2.CollectionDescription, pids: Sequence[int] = ()) -> int:
    """ReleaseCollection (or ReleasePartitions), answered once released everywhere; returns the task id."""
    cid = desc.collection_id
    req = (qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=pids) if pids
           else qc.ReleaseCollectionRequest(collection_id=cid))
    return await _start_task(c, req, f"release {desc.name}")


LOAD_TYPES = {data_pb2.LOAD_TYPE_COLLECTION: "collection", data_pb2.LOAD_TYPE_PARTITION: "partitions"}


async def collection_records(c: QueryCoordClient, refs: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Every catalog collection (or those named) with its load state, as ``collection show -o json`` prints it.

    ``load_type``, ``loaded_percentage`` and ``loaded_partitions`` are None for a collection that is not loaded.
    """
    cat = check(await c.catalog("ShowCollections", catalog_pb2.ShowCollectionsRequest()), "catalog show")
    summaries = {s.collection_id: s for s in cat.collections}
    if refs:
        ids = [(await describe(c, r)).collection_id for r in refs]
    else:
        ids = sorted(summaries)
    loaded = check(await c.query("ShowCollections", qc.ShowCollectionsRequest()), "show collections")
    infos = {i.collection_id: i for i in loaded.collections}
    records: list[dict[str, Any]] = []
    for cid in ids:
        s = summaries.get(cid)
        info = infos.get(cid)
        records.append({
            "id": cid, "name": s.name if s else None, "partitions": s.num_partitions if s else 0,
            "segments": s.num_segments if s else 0,
            "load_type": LOAD_TYPES.get(info.load_type, "?") if info is not None else None,
            "loaded_percentage": int(info.in_memory_percentage) if info is not None else None,
            "loaded_partitions": len(info.partitions) if info is not None else None,
        })
    return records


def collection_table_rows(records: Sequence[dict[str, Any]]) -> list[list[object]]:
    """``collection_records`` as rows under ``COLLECTION_HEADERS``."""
    rows: list[list[object]] = []
    for r in records:
        base = [r["id"], r["name"] or "?", r["partitions"], f"{r['segments']:,}"]
        if r["load_type"] is None:
            rows.append([*base, "-", "not loaded", "-"])
        else:
            rows.append([*base, r["load_type"], f"{r['loaded_percentage']}%", r["loaded_partitions"]])
    return rows


async def collection_rows(c: QueryCoordClient, refs: Sequence[str] = ()) -> list[list[object]]:
    """Rows of ``collection show``: every catalog collection (or those named) with its load state."""
    return collection_table_rows(await collection_records(c, refs))


COLLECTION_HEADERS = ("ID", "NAME", "PARTITIONS", "SEGMENTS", "LOAD TYPE", "LOADED", "LOADED PARTITIONS")


async def get_replicas(c: QueryCoordClient, collection_id: int) -> list[data_pb2.ReplicaInfo] | None:
    """GetReplicas: the replicas of a loaded collection by replica id; None when it is not loaded (NOT_FOUND)."""
    resp = await c.query("GetReplicas", qc.GetReplicasRequest(collection_id=collection_id))
    if resp.status.error_code == common_pb2.NOT_FOUND:
        return None
    return list(check(resp, f"replicas of collection {collection_id}").replicas)


async def wait_task(c: QueryCoordClient, task_id: int, children_limit: int = 0) -> qc.TaskTree:
    """Poll GetTask until the trigger is finished (EXPIRED, FAILED or CANCELLED); returns its tree."""
    while True:
        got = check(await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=children_limit)),
                    f"task {task_id}")
        if got.tree.trigger.state in (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED):
            return got.tree
        await asyncio.sleep(POLL_INTERVAL)


def segments_in(summary: str) -> int:
    """The count in a child summary like ``load 40 segments of collection 7`` (0 if absent)."""
    words = summary.split()
    return int(words[1]) if len(words) > 2 and words[0] == "load" and words[1].isdigit() else 0


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


def lifecycle_name(n: qc.NodeInfo) -> str:
    """``active``, ``cordoned``, ``draining`` or ``drained``."""
    return qc.NodeLifecycle.Name(n.lifecycle).removeprefix("NODE_LIFECYCLE_").lower()


def drain_record(n: qc.NodeInfo) -> dict[str, Any] | None:
    """A node's drain progress as JSON prints it; None when it never drained."""
    if not n.HasField("drain"):
        return None
    d = n.drain
    return {"copies_total": d.copies_total, "copies_left": d.copies_left, "started_ms": d.started_ms,
            "eta_ms": d.eta_ms, "waiting": d.waiting}


def drain_text(n: qc.NodeInfo, *, why: bool = False) -> str:
    """``3/10 left, eta 12:00:05`` (or ``waiting``, with ``why`` its reason); ``-`` when it never drained."""
    if not n.HasField("drain"):
        return "-"
    d = n.drain
    text = f"{d.copies_left}/{d.copies_total} left"
    if d.waiting:
        return f"{text}, waiting: {d.waiting}" if why else f"{text}, waiting"
    if d.eta_ms:
        text += ", eta " + time.strftime("%H:%M:%S", time.localtime(d.eta_ms / 1000))
    return text


def node_records(nodes: Sequence[qc.NodeInfo]) -> list[dict[str, Any]]:
    """Query nodes as ``nodes -o json`` prints them (memory in bytes)."""
    return [{"id": n.node_id, "address": n.address, "state": n.state, "segments": n.segment_count,
             "dm_channels": n.dm_channel_count, "memory_used_bytes": n.memory_used,
             "memory_capacity_bytes": n.memory_capacity, "lifecycle": lifecycle_name(n), "drain": drain_record(n)}
            for n in nodes]


def node_rows(nodes: Sequence[qc.NodeInfo]) -> list[list[object]]:
    rows: list[list[object]] = []
    for n in nodes:
        pct = f"{100 * n.memory_used / n.memory_capacity:.0f}%" if n.memory_capacity else "-"
        rows.append([n.node_id, n.address or "-", n.state, f"{n.segment_count:,}", n.dm_channel_count,
                     f"{draw.mib(n.memory_used)} / {draw.mib(n.memory_capacity)}", pct, lifecycle_name(n),
                     drain_text(n)])
    return rows


NODE_HEADERS = ("ID", "ADDRESS", "STATE", "SEGMENTS", "DM CHANNELS", "MEMORY", "USED", "LIFECYCLE", "DRAIN")


# ----- streams and snodes (StreamMgmt) -------------------------------------------------------------------------------
def parse_vgroups(text: str) -> list[int]:
    """``1,2,5-7`` -> [1, 2, 5, 6, 7]: positive vgroup ids, each once; ``ValueError`` naming the bad item."""
    out: list[int] = []
    for item in (x.strip() for x in text.split(",")):
        lo, sep, hi = item.partition("-")
        if not item or not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"expected vgroup ids like 1,2 or 1-4, got {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if first < 1 or last < first:
            raise ValueError(f"vgroup ids are positive and ranges ascending, got {item!r}")
        if last - first >= 4096:
            raise ValueError(f"vgroup range {item!r} is too large")
        for v in range(first, last + 1):
            if v in out:
                raise ValueError(f"vgroup {v} is listed twice in {text!r}")
            out.append(v)
    return out


def stream_ref(ref: str) -> stream_pb2.StreamRef:
    """A stream named by id (digits) or by name."""
    return stream_pb2.StreamRef(stream_id=int(ref)) if ref.isdigit() else stream_pb2.StreamRef(name=ref)


async def stream_call(c: QueryCoordClient, method: str, request: Message, what: str) -> Any:
    """A StreamMgmt call on the leader; a refusal is a ``Refusal`` with the server's reason."""
    return check(await c.stream(method, request), what)


async def create_stream_answer(
    c: QueryCoordClient,
    name: str,
    *,
    vgroups: Sequence[int],
    source_db: str = "db",
    trigger_vgroup: int = 0,
    scan_plans: int = 1,
    subplans: int = 2,
    runner_deploys: int = 0,
    if_not_exists: bool = False,
) -> stream_pb2.CreateStreamResponse:
    """CreateStream: readers on ``vgroups`` of ``source_db``, ``scan_plans`` calc scans, a runner DAG of
    ``subplans`` tasks deployed ``runner_deploys`` times (0: the coordinator's default, 3). The whole answer: the
    definition (``.stream``), ``already_exists`` (if_not_exists met a stream of that name, left as it is), and a
    status reason when the stream waits for something (vgroups no node leads)."""
    req = stream_pb2.CreateStreamRequest(
        name=name, source_db=source_db, source_vgroup_ids=list(vgroups), trigger_vgroup_id=trigger_vgroup,
        num_calc_scan_plans=scan_plans, num_calc_subplans=subplans, runner_deploys=runner_deploys,
        if_not_exists=if_not_exists)
    return await stream_call(c, "CreateStream", req, f"create stream {name}")


async def drop_stream(c: QueryCoordClient, ref: str, *, if_exists: bool = False) -> stream_pb2.StreamDef | None:
    """DropStream; None when ``if_exists`` and there was no such stream."""
    resp = await stream_call(c, "DropStream", stream_pb2.DropStreamRequest(stream=stream_ref(ref), if_exists=if_exists),
                             f"drop stream {ref}")
    return resp.stream if resp.HasField("stream") else None


async def stop_stream(c: QueryCoordClient, ref: str) -> stream_pb2.StreamDef:
    """StopStream: its tasks are undeployed with a checkpoint; the definition stays."""
    return (await stop_stream_noted(c, ref))[0]


async def stop_stream_noted(c: QueryCoordClient, ref: str) -> tuple[stream_pb2.StreamDef, str]:
    """StopStream, and the leader's note ("" when the final checkpoint was taken; else why it was not)."""
    resp = await stream_call(c, "StopStream", stream_pb2.StopStreamRequest(stream=stream_ref(ref)),
                             f"stop stream {ref}")
    return resp.stream, resp.status.reason


async def start_stream(c: QueryCoordClient, ref: str, *, ignore_untreated: bool = False) -> stream_pb2.StreamDef:
    """StartStream: a stopped stream is planned and deployed again (``ignore_untreated``: its tasks skip what was
    written while it was stopped)."""
    req = stream_pb2.StartStreamRequest(stream=stream_ref(ref), ignore_untreated=ignore_untreated)
    return (await stream_call(c, "StartStream", req, f"start stream {ref}")).stream


def answered_by_standby(show: stream_pb2.ShowStreamsResponse) -> bool:
    """A standby answers ShowStreams from etcd (SUCCESS with a reason naming the leader); the leader says nothing."""
    return bool(show.status.reason)


async def show_streams(c: QueryCoordClient, refs: Sequence[str] = (), *,
                       with_tasks: bool = True) -> stream_pb2.ShowStreamsResponse:
    """ShowStreams from the leader, every stream or those ``refs`` name (an unknown one is a NOT_FOUND Refusal).

    A standby answers it itself from etcd, without states or tasks, naming
    the leader in the status reason: the client then moves to that leader
    and asks again, so the answer is the leader's whenever one is named.
    """
    req = stream_pb2.ShowStreamsRequest(streams=[stream_ref(r) for r in refs], with_tasks=with_tasks)
    show = await stream_call(c, "ShowStreams", req, "show streams")
    for _ in range(3):
        leader = parse_leader(show.status.reason) if answered_by_standby(show) else None
        if not leader or leader == c.current:
            break
        c.prefer(leader)
        show = await stream_call(c, "ShowStreams", req, "show streams")
    found_ids = {i.stream.id for i in show.streams}
    found_names = {i.stream.name for i in show.streams}
    missing = [r for r in refs if (int(r) not in found_ids if r.isdigit() else r not in found_names)]
    if missing:
        raise Refusal(f"unknown stream{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}: "
                      f"{len(show.streams)} of the {len(refs)} named exist (see `querycoord stream show`)",
                      common_pb2.NOT_FOUND)
    return show


async def create_snode(c: QueryCoordClient, node_id: int) -> stream_pb2.SnodeInfo:
    """CreateSnode on stream node ``node_id`` (the node learns it from etcd and heartbeats it)."""
    return (await stream_call(c, "CreateSnode", stream_pb2.CreateSnodeRequest(node_id=node_id),
                              f"create snode on node {node_id}")).snode


async def drop_snode(c: QueryCoordClient, snode_id: int, *, force: bool = False) -> stream_pb2.DropSnodeResponse:
    """DropSnode: refused while streams depend on the snode unless ``force``; forced, the streams whose main snode
    it was move to its replica (the answer says how many, where) and their tasks are redeployed elsewhere."""
    return await stream_call(c, "DropSnode", stream_pb2.DropSnodeRequest(snode_id=snode_id, force=force),
                             f"drop snode {snode_id}")
