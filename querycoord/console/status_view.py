"""What ``querycoord status`` and the coordinators' status page show, gathered in one place.

Two readers, one gathering:

* ``gather_status`` is ``querycoord status``: it reads etcd, not a
  coordinator, so it works with no leader at all. The coordinators are the
  live coordinator sessions joined (by address) with their election keys, whose
  order says who leads and who is next (or, for a credential that may not read
  the election, with what each coordinator says of its own place); each is then asked for its gRPC
  health and its own view (``GetCoordinatorState``), and one that does not
  answer is shown as such, not as an error. The nodes are the live node
  sessions; the etcd members come from ``meta.ops.maintenance.cluster_status``.
  Only etcd itself being unreachable is an error.
* ``StatusSource`` is what a coordinator's status page shows
  (``querycoord.console.status_page``, served on ``--http-listen``): the same
  sessions, coordinators and etcd members read through the coordinator's own
  etcd client, plus what only the leader knows, asked of it over gRPC as
  the CLI asks (ShowNodes, the catalog's and the query meta's collections,
  CheckHealth for each loaded collection's colour and live percentage,
  ListTasks for the running trees and, with ``include_finished``, the
  history, ShowStreams): so the page shows what ``querycoord nodes``,
  ``collection show``, ``health``, ``tasks`` and ``stream show`` show, on a
  standby as on the leader, and whatever those calls learn to answer shows
  up here too.
  Each part that cannot be read (no leader, etcd slow) is reported in
  ``errors`` under its name while the others are shown; a snapshot is
  gathered at most once per ``min_interval`` however many browsers poll.
  Every part is O(collections + nodes) at the leader (counts it keeps, never a
  walk over segments), and a request never waits for a gathering while the
  last snapshot is younger than ``max_age``: it is answered with that one
  (its ``generated_ms`` says when it was taken; the page shows its age) and a
  fresh one is gathered behind it for the next request. Only the first
  request, or one after a long quiet spell, waits for its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meta.client import connect
from meta.config import EtcdConfig
from meta.errors import MetaAuthError
from meta.kv import MetaKV
from meta.ops.maintenance import cluster_status
from meta.session import SessionInfo, list_sessions, role_prefix
from proto import querycoord_pb2 as qc
from querycoord.checkers.activation import activation_record, read_activation
from querycoord.cluster.lifecycle import PREFIX as LIFECYCLE_PREFIX
from querycoord.common.protocol import QUERYCOORD_ROLE, QUERYNODE_ROLE, STREAMNODE_ROLE
from querycoord.console import draw, draw_progress
from querycoord.console.actions import LOAD_TYPES, Refusal, check, collection_records, node_records, show_streams
from querycoord.console.draw_health import health_record
from querycoord.leader.switchover import Candidate, call_coordinator, candidates, switchover_holder
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.security.grpc_channels import make_channel

if TYPE_CHECKING:
    from querycoord.leader.view import CoordinatorView

# A coordinator that has not answered its health check by then is shown as not answering.
PROBE_TIMEOUT = 1.0

# The status page: how long one snapshot may take (the HTTP server gives the event loop 5 s per answer: first
# etcd's sessions and the coordinators' probes, then the leader's answers and etcd's members side by side), how
# often etcd's members are asked again (each status costs a connection and a few reads per member), and how
# much of each list it carries (a page, not an export: the CLI has the rest).
CLUSTER_TIMEOUT = 1.5
LEADER_TIMEOUT = 2.5
ETCD_REFRESH = 5.0
# The catalog's summaries (names, partitions, segment counts: the catalog reads every segment record for them) are
# asked again at most this often, and at most once per ten times what the last count took (a million segment
# records are seconds of etcd reads); the load state of each collection (the leader's query meta) on every
# snapshot. The count runs on its own, with its own timeout: a snapshot that cannot wait for it shows the counts
# of before.
CATALOG_REFRESH = 10.0
CATALOG_TIMEOUT = 120.0
# A snapshot younger than this answers a request at once (a fresh one is gathered behind it); an older one is
# not shown: the request waits for the fresh one.
MAX_AGE = 10.0
RUNNING_TREES = 30
CHILDREN_PER_TREE = 12
# Children asked for per running tree, of which the page shows the CHILDREN_PER_TREE most telling (``_telling``).
CHILDREN_ASKED = 200
HISTORY_TREES = 20
STREAM_TASKS = 60
COLLECTIONS = 200


# ----- coordinators, nodes and etcd (``querycoord status``) ------------------------------------------------------
async def coordinator_health(address: str, timeout: float) -> str:
    """The gRPC health of the coordinator at ``address`` (SERVING on the leader), or why it did not answer."""
    try:
        async with make_channel(address) as channel:
            resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                                  timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        return f"no answer ({exc.code().name})"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


async def _self_view(address: str, timeout: float) -> qc.GetCoordinatorStateResponse | None:
    try:
        return await call_coordinator(address, "GetCoordinatorState", qc.GetCoordinatorStateRequest(), timeout)
    except grpc.aio.AioRpcError:
        return None


async def coordinator_rows(kv: MetaKV, probe_timeout: float) -> list[dict[str, Any]]:
    """One row per coordinator address: the session that is queued in the election wins over a stale one (a
    coordinator that lost its leadership starts a new session; the old one lives until its lease expires).

    Sessions and election keys are matched by address (their leases differ: a candidate's election key carries a
    private lease). A credential that may not read the election (only coordinators may: its keys carry the leases
    that keep a leader leading) gets the queue from the coordinators themselves: each says its own election revision
    (``GetCoordinatorState``), so one that does not answer has no place in it."""
    sessions = (await kv.load_prefix(role_prefix(QUERYCOORD_ROLE))).kvs
    queue: list[Candidate] | None
    try:
        queue = await candidates(kv)
    except MetaAuthError:
        queue = None
    place = {c.address: (i, c) for i, c in enumerate(queue or [])}
    rows: dict[str, dict[str, Any]] = {}
    for item in sorted(sessions, key=lambda s: s.create_revision):
        info = SessionInfo.parse(item.key, item.value)
        if info is None:
            continue
        queued = place.get(info.address)
        role = "unknown" if queue is None else "starting" if queued is None else "leader" if queued[0] == 0 \
            else "standby"
        rows[info.address] = {"address": info.address, "server_id": info.server_id, "role": role,
                              "queue_position": None if queued is None else queued[0],
                              "election_revision": None if queued is None else queued[1].create_revision}
    for i, c in enumerate(queue or []):  # a candidate without a session: only while its lease expires
        rows.setdefault(c.address, {"address": c.address, "server_id": 0, "role": "leader" if i == 0 else "standby",
                                    "queue_position": i, "election_revision": c.create_revision})
    out = list(rows.values())

    async def probe(row: dict[str, Any]) -> None:
        row["health"], own = await asyncio.gather(coordinator_health(row["address"], probe_timeout),
                                                  _self_view(row["address"], probe_timeout))
        row["since"] = own.since_ms / 1000 if own is not None and own.since_ms else None
        if queue is None and own is not None and own.election_revision > 0:
            row["election_revision"] = own.election_revision
            row["role"] = "leader" if own.leader else "standby"

    await asyncio.gather(*(probe(r) for r in out))
    if queue is None:
        said = sorted((r for r in out if r["election_revision"] is not None), key=lambda r: r["election_revision"])
        for i, r in enumerate(said):
            r["queue_position"] = i
    for r in out:
        r["fence_revision"] = r["election_revision"] if r["role"] == "leader" else None
    return sorted(out, key=lambda r: (r["queue_position"] is None, r["queue_position"] or 0, r["address"]))


def node_rows(sessions: dict[int, SessionInfo], role: str) -> list[dict[str, Any]]:
    """The live sessions of query nodes (with the capacity they offer) or stream nodes (with their vgroups)."""
    rows: list[dict[str, Any]] = []
    for sid, info in sorted(sessions.items()):
        row: dict[str, Any] = {"id": sid, "address": info.address, "state": "online"}
        if role == QUERYNODE_ROLE:
            row["capacity_bytes"] = info.extra.get("capacity_bytes")
        else:
            row["vgroups"] = info.extra.get("vgroups", [])
        rows.append(row)
    return rows


async def lifecycle_names(kv: MetaKV) -> dict[int, str]:
    """node id -> its maintenance lifecycle as the leader persisted it (``cluster.lifecycle``; no record:
    active)."""
    out: dict[int, str] = {}
    for item in (await kv.load_prefix(LIFECYCLE_PREFIX)).kvs:
        try:
            out[int(item.key[len(LIFECYCLE_PREFIX):])] = str(json.loads(item.value)["state"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


async def session_view(kv: MetaKV, probe_timeout: float) -> dict[str, Any]:
    """Who leads, the coordinators, the query and stream nodes, a switchover in progress, and balance paused or
    check kinds turned off (``controls``), from etcd."""
    coordinators = await coordinator_rows(kv, probe_timeout)
    query_nodes = (await list_sessions(kv, QUERYNODE_ROLE)).sessions
    stream_nodes = (await list_sessions(kv, STREAMNODE_ROLE)).sessions
    switchover = await switchover_holder(kv)
    controls = activation_record(await read_activation(kv))
    leader = next((c["address"] for c in coordinators if c["role"] == "leader"), None)
    rows = node_rows(query_nodes, QUERYNODE_ROLE)
    lifecycles = await lifecycle_names(kv)
    for row in rows:
        row["lifecycle"] = lifecycles.get(row["id"], "active")
    return {"leader": leader, "switchover": switchover, "controls": controls, "coordinators": coordinators,
            "query_nodes": rows,
            "stream_nodes": node_rows(stream_nodes, STREAMNODE_ROLE)}


async def gather_status(config: EtcdConfig, root: str, *, probe_timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    """Everything ``querycoord status`` shows, as one JSON-ready dict; ``MetaError`` when etcd does not answer."""
    async with await connect(config) as client:
        view = await session_view(MetaKV(client, root), probe_timeout)
    etcd = await cluster_status(config)
    return {"root": root, **view, "etcd": etcd.as_dict()}


# ----- what only the leader knows (the status page) -----------------------------------------------------------------
_NODE_FIELDS = ("id", "address", "state", "segments", "dm_channels", "memory_used_bytes", "memory_capacity_bytes",
                "lifecycle", "drain")


def merge_nodes(sessions: list[dict[str, Any]], shown: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Query node sessions with what the leader's ShowNodes says of each (``node_records``): state, segments, DM
    channels and memory. A node the leader still lists after its session went (offline while its segments are
    balanced away) is kept; without the leader's answer (``None``) the numbers are None."""
    by_id = {n["id"]: n for n in shown or []}
    rows: list[dict[str, Any]] = []
    for s in sessions:
        n = by_id.pop(s["id"], None)
        rows.append({"id": s["id"], "address": s["address"], "state": n["state"] if n else s["state"],
                     "segments": n["segments"] if n else None, "dm_channels": n["dm_channels"] if n else None,
                     "memory_used_bytes": n["memory_used_bytes"] if n else None,
                     "memory_capacity_bytes": (n["memory_capacity_bytes"] if n else None) or s.get("capacity_bytes"),
                     "lifecycle": n["lifecycle"] if n else s.get("lifecycle"), "drain": n["drain"] if n else None})
    rows += [{k: n[k] for k in _NODE_FIELDS} for n in by_id.values()]
    return sorted(rows, key=lambda r: r["id"])


def _history_record(tree: qc.TaskTree) -> dict[str, object]:
    record = draw.tree_record(tree)
    t = tree.trigger
    # When it began and ended (the durable history's fields; 0 or absent on answers without them).
    started = getattr(t, "started_ms", 0) or t.created_ms
    finished = getattr(t, "finished_ms", 0) or t.updated_ms
    record.update(created_ms=t.created_ms, started_ms=started, finished_ms=finished)
    return record


# Which children of a running tree say most about it: failing ones, then those at work, then those waiting; the
# done ones only when nothing else is left.
_CHILD_ORDER = {qc.TASK_STATE_FAILED: 0, qc.TASK_STATE_CANCELLED: 0, qc.TASK_STATE_DOING: 1, qc.TASK_STATE_UNDO: 2}


def _telling(tree: qc.TaskTree, n: int) -> qc.TaskTree:
    """``tree`` with only its ``n`` most telling children (in id order); ``child_counts`` still counts all."""
    picked = sorted(tree.children, key=lambda c: (_CHILD_ORDER.get(c.state, 3), c.retry_count == 0, c.task_id))[:n]
    out = qc.TaskTree()
    out.CopyFrom(tree)
    del out.children[:]
    out.children.extend(sorted(picked, key=lambda c: c.task_id))
    return out


async def task_view(c: QueryCoordClient) -> dict[str, Any]:
    """The running trees (their most telling children and the counts of all) and the recent history, newest
    first: the answers of ListTasks (with ``include_finished`` for the history), as ``querycoord tasks`` asks
    them."""
    resp = check(await c.query("ListTasks", qc.ListTasksRequest(
        include_children=True, children_limit=CHILDREN_ASKED, limit=RUNNING_TREES)), "list tasks")
    running = [draw.tree_record(_telling(t, CHILDREN_PER_TREE)) for t in resp.trees]
    for record, tree in zip(running, resp.trees, strict=True):
        record["created_ms"] = tree.trigger.created_ms
    finished_states = [qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED]
    trees: list[qc.TaskTree] = []
    if "newest_first" in qc.ListTasksRequest.DESCRIPTOR.fields_by_name:
        page = check(await c.query("ListTasks", qc.ListTasksRequest(
            include_finished=True, states=finished_states, limit=HISTORY_TREES, newest_first=True)), "task history")
        trees = list(page.trees)
    else:  # oldest first: read every page and keep the last ones
        after = 0
        for _ in range(50):
            page = check(await c.query("ListTasks", qc.ListTasksRequest(
                include_finished=True, states=finished_states, after_task_id=after)), "task history")
            trees = [*trees, *page.trees][-HISTORY_TREES:]
            after = page.next_after_task_id
            if not after:
                break
    history = [_history_record(t) for t in sorted(trees, key=lambda t: t.trigger.task_id, reverse=True)]
    return {"running": running, "running_more": bool(resp.next_after_task_id), "history": history[:HISTORY_TREES]}


async def stream_view(c: QueryCoordClient) -> dict[str, Any]:
    """The streams with their tasks (kind, node, snode, SID, state) and what the stream manager is doing about
    each, and the snodes: ShowStreams from the leader, as ``querycoord stream show`` asks it."""
    show = await show_streams(c)
    now = time.time()
    streams: list[dict[str, Any]] = []
    for info in show.streams:
        d = info.stream
        tasks = [{"task_id": r.task.task_id, "kind": draw.STREAM_KIND_NAMES.get(r.task.kind, str(r.task.kind))
                  + (" (top)" if r.task.top else ""), "node_id": r.task.node_id, "vgroup_id": r.task.vgroup_id,
                  "snode_id": r.task.snode_id, "sid": r.task.sid, "state": draw.stream_task_status(r),
                  "error": r.error_message, "last_heard_ms": r.last_heard_ms,
                  **dict(zip(("processed", "lag"), draw_progress.task_progress_cells(r), strict=True))}
                 for r in sorted(info.tasks, key=lambda r: (r.task.kind, r.task.deploy_id, r.task.task_idx))]
        streams.append({"id": d.id, "name": d.name, "state": draw.stream_state_name(info.state),
                        "activity": draw.stream_activity(info, show, now), "source_db": d.source_db,
                        "main_snode_id": d.main_snode_id, "deploy_times": info.deploy_times,
                        "task_count": len(tasks), "tasks": tasks[:STREAM_TASKS],
                        "progress": draw_progress.progress_line(info, now), **draw_progress.progress_record(info, now)})
    live = set(show.live_snode_ids)
    snodes = [{"id": s.id, "node_id": s.node_id, "replica_id": s.replica_id, "dropping": s.dropping,
               "live": s.id in live} for s in show.snodes]
    return {"streams": streams, "snodes": snodes, "watching": show.watching}


async def _nodes(c: QueryCoordClient) -> list[dict[str, Any]]:
    return node_records(check(await c.query("ShowNodes", qc.ShowNodesRequest()), "show nodes").nodes)


def with_load_state(records: list[dict[str, Any]], loaded: list[Any]) -> list[dict[str, Any]]:
    """``collection_records`` rows with the load state of ``loaded`` (ShowCollections' ``CollectionLoadInfo``s)
    instead of theirs."""
    infos = {i.collection_id: i for i in loaded}
    out = []
    for r in records:
        info = infos.get(r["id"])
        out.append({**r, "load_type": LOAD_TYPES.get(info.load_type, "?") if info is not None else None,
                    "loaded_percentage": int(info.in_memory_percentage) if info is not None else None,
                    "loaded_partitions": len(info.partitions) if info is not None else None})
    return out


async def health_view(c: QueryCoordClient) -> dict[str, Any]:
    """CheckHealth, as ``querycoord health -o json`` prints it: the worst colour and each loaded collection's."""
    return health_record(check(await c.query("CheckHealth", qc.CheckHealthRequest()), "check health"))


def with_health(records: list[dict[str, Any]], health: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Collection rows with their health (None when not loaded, or without the leader's answer) and, when the
    leader answered, its live in-memory percentage: never above what online nodes of every replica hold."""
    by_id = {h["id"]: h for h in (health or {}).get("collections", [])}
    out = []
    for r in records:
        h = by_id.get(r["id"])
        row = {**r, "health": h["health"] if h else None, "missing": h["missing"] if h else None}
        if h is not None:
            row["loaded_percentage"] = h["loaded_percentage"]
        out.append(row)
    return out


def _reason(exc: BaseException, timeout: float) -> str:
    """One line saying why a part of the page could not be read."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, Refusal):
        return exc.reason.splitlines()[0] if exc.reason else "refused"
    if isinstance(exc, CoordinatorUnavailable):
        return exc.summary()
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details() or ''}".strip()
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


class StatusSource:
    """The status page's data of one coordinator (see module docstring): ``snapshot`` on its event loop."""

    def __init__(self, coord: CoordinatorView, *, min_interval: float = 1.0, max_age: float = MAX_AGE):
        self.coord = coord
        self.min_interval = min_interval
        self.max_age = max_age
        self._last: dict[str, Any] | None = None
        self._last_at = float("-inf")
        self._inflight: asyncio.Task[dict[str, Any]] | None = None
        self._etcd: dict[str, Any] | None = None
        self._etcd_at = float("-inf")
        self._catalog: list[dict[str, Any]] | None = None
        self._catalog_at = float("-inf")
        self._catalog_every = CATALOG_REFRESH
        self._counting: asyncio.Task[None] | None = None

    async def snapshot(self) -> dict[str, Any]:
        """The latest snapshot, at once while it is younger than ``max_age``; one older than ``min_interval``
        has a fresh one gathered behind it, for the next request. Without a snapshot young enough the caller
        waits for the fresh one; callers that wait meanwhile share it (a request that times out does not cancel
        it for the others)."""
        age = time.monotonic() - self._last_at
        if self._last is not None and age < self.min_interval:
            return self._last
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.create_task(self._gather(), name="status-page")
            self._inflight.add_done_callback(_retrieved)
        if self._last is not None and age < self.max_age:
            return self._last
        return await asyncio.shield(self._inflight)

    def _this(self) -> dict[str, Any]:
        coord = self.coord
        return {"address": coord.address, "server_id": coord.server_id,
                "role": "leader" if coord.is_leader else "standby", "since": coord.role_since}

    async def _gather(self) -> dict[str, Any]:
        coord = self.coord
        errors: dict[str, str] = {}

        async def part(name: str, work: Awaitable[Any], timeout: float = LEADER_TIMEOUT) -> Any:
            try:
                return await asyncio.wait_for(work, timeout)
            except Exception as exc:
                errors[name] = _reason(exc, timeout)
                return None

        view: dict[str, Any] = {}
        if coord.kv is None:
            errors["cluster"] = "not connected to etcd yet"
        else:
            view = await part("cluster", session_view(coord.kv, PROBE_TIMEOUT), CLUSTER_TIMEOUT) or {}
        leader = view.get("leader")
        # Without a leader the calls only it answers give up after one round instead of waiting for one.
        client = QueryCoordClient(coord.address, deadline=LEADER_TIMEOUT - 0.3 if leader else 0.5,
                                  call_timeout=LEADER_TIMEOUT - 0.5)
        if leader:
            client.prefer(leader)  # a standby answers some reads itself: ask the leader, who knows more
        try:
            nodes, collections, health, tasks, streams, etcd = await asyncio.gather(
                part("nodes", _nodes(client)), part("collections", self._collections(client)),
                part("health", health_view(client)), part("tasks", task_view(client)),
                part("streams", stream_view(client)), part("etcd", self._etcd_status()))
        finally:
            with contextlib.suppress(Exception):
                await client.close()
        snapshot = {
            "generated_ms": int(time.time() * 1000), "root": coord.config.root, "this": self._this(),
            "leader": leader, "switchover": view.get("switchover"), "controls": view.get("controls"),
            "coordinators": view.get("coordinators", []),
            "query_nodes": merge_nodes(view.get("query_nodes", []), nodes),
            "stream_nodes": view.get("stream_nodes", []), "collections": with_health(collections or [], health),
            "health": health["state"] if health else None,
            "tasks": tasks or {"running": [], "running_more": False, "history": []},
            "streams": streams or {"streams": [], "snodes": [], "watching": False},
            "etcd": etcd, "errors": errors,
        }
        self._last, self._last_at = snapshot, time.monotonic()
        return snapshot

    async def _collections(self, c: QueryCoordClient) -> list[dict[str, Any]]:
        """The catalog's collections with their load state (see ``CATALOG_REFRESH``)."""
        if self._counting is None and time.monotonic() - self._catalog_at >= self._catalog_every:
            self._counting = asyncio.create_task(self._count_catalog(), name="status-page-catalog")
            self._counting.add_done_callback(_retrieved)
        if self._catalog is None and self._counting is not None:
            await asyncio.shield(self._counting)  # the first count: nothing to show before it
        if self._catalog is None:
            raise RuntimeError("the catalog's collections are not counted yet")
        loaded = check(await c.query("ShowCollections", qc.ShowCollectionsRequest()), "show collections")
        return with_load_state(self._catalog, list(loaded.collections))

    async def _count_catalog(self) -> None:
        """The catalog's summaries, through a client of this count's own (a snapshot's client is closed when the
        snapshot is taken, and this may outlast it)."""
        started = time.monotonic()
        try:
            async with QueryCoordClient(self.coord.address, deadline=CATALOG_TIMEOUT,
                                        call_timeout=CATALOG_TIMEOUT) as client:
                records = (await collection_records(client))[:COLLECTIONS]
            self._catalog, self._catalog_at = records, time.monotonic()
            self._catalog_every = max(CATALOG_REFRESH, 10 * (self._catalog_at - started))
        finally:
            self._counting = None

    async def _etcd_status(self) -> dict[str, Any]:
        """etcd's members and alarms, asked again at most every ``ETCD_REFRESH`` seconds, with short timeouts (a
        member that is down costs one call timeout, not the coordinator's whole retry deadline)."""
        if self._etcd is not None and time.monotonic() - self._etcd_at < ETCD_REFRESH:
            return self._etcd
        config = self.coord.config.etcd
        quick = dataclasses.replace(config, call_timeout=min(config.call_timeout, 1.0),
                                    deadline=min(config.deadline, 2.0))
        self._etcd = etcd_for_page((await cluster_status(quick)).as_dict())
        self._etcd_at = time.monotonic()
        return self._etcd


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Consume the outcome of a gathering nobody waited for (``_gather`` reports its parts' failures itself)."""
    if not task.cancelled():
        task.exception()


def etcd_for_page(status: dict[str, Any]) -> dict[str, Any]:
    """``ClusterStatus.as_dict`` with member ids as hex strings ("" for none), as ``querycoord status`` prints
    them: they are 64-bit, past what a JavaScript number holds exactly."""

    def hexid(n: object) -> str:
        return f"{n:x}" if isinstance(n, int) and n else ""

    members = [{**m, "member_id": hexid(m["member_id"]), "leader": hexid(m["leader"])} for m in status["members"]]
    alarms = [{**a, "member_id": hexid(a["member_id"])} for a in status["alarms"]]
    return {**status, "members": members, "alarms": alarms}


__all__ = [
    "PROBE_TIMEOUT",
    "StatusSource",
    "coordinator_health",
    "coordinator_rows",
    "etcd_for_page",
    "gather_status",
    "health_view",
    "merge_nodes",
    "node_rows",
    "session_view",
    "stream_view",
    "task_view",
    "with_health",
    "with_load_state",
]
