"""What ``querycoord status`` and the coordinators' status page show, gathered in one place.

Two readers, one gathering:

* ``gather_status`` (``querycoord.console.status_gather``, named here too:
  a module of its own, light to import) is ``querycoord status``: it reads etcd, not a
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
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import grpc

from meta.ops.maintenance import cluster_status
from proto import querycoord_pb2 as qc
from querycoord.console import draw, draw_progress
from querycoord.console.actions import LOAD_TYPES, Refusal, check, collection_records, node_records, show_streams
from querycoord.console.draw_health import health_record
from querycoord.console.status_gather import (
    PROBE_TIMEOUT,
    coordinator_health,
    coordinator_rows,
    gather_status,
    node_rows,
    session_view,
)
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient

if TYPE_CHECKING:
    from querycoord.leader.view import CoordinatorView

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


# ----- coordinators, nodes and etcd (``querycoord status``) ---------------------------------------------------------
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
