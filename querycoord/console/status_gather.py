"""What ``querycoord status`` shows: who leads, who stands by, the nodes and etcd's members, read from etcd.

``gather_status`` reads etcd, not a coordinator, so it works with no leader
at all. The coordinators are the live coordinator sessions joined (by
address) with their election keys, whose order says who leads and who is
next (or, for a credential that may not read the election, with what each
coordinator says of its own place); each is then asked for its gRPC health
and its own view (``GetCoordinatorState``), and one that does not answer is
shown as such, not as an error. The nodes are the live node sessions with
their lifecycles; the etcd members come from
``meta.ops.maintenance.cluster_status``. Only etcd itself being unreachable
is an error. The coordinators' status page shows the same
(``querycoord.console.status_view``, which adds what only the leader knows).

A module of its own, importing nothing of the checker, the leader's engine or
the console's drawing: ``querycoord status`` is a short-lived process, and
what it imports is most of its run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meta.client import connect
from meta.config import EtcdConfig
from meta.errors import MetaAuthError
from meta.kv import MetaKV
from meta.ops.maintenance import cluster_status
from meta.session import SessionInfo, list_sessions, role_prefix
from proto import querycoord_pb2 as qc
from querycoord.cluster.lifecycle import PREFIX as LIFECYCLE_PREFIX
from querycoord.common.checker_activation import activation_record, read_activation
from querycoord.common.protocol import QUERYCOORD_ROLE, QUERYNODE_ROLE, STREAMNODE_ROLE
from querycoord.leader.switchover import Candidate, call_coordinator, candidates, switchover_holder
from querycoord.security.grpc_channels import make_channel

# A coordinator that has not answered its health check by then is shown as not answering.
PROBE_TIMEOUT = 1.0


async def all_of(*steps: Awaitable[Any]) -> list[Any]:
    """The results of ``steps``, run side by side (independent reads: each waits on etcd or a coordinator, not on
    another). The first failure cancels the others and is raised as itself: none is left running on a client
    the caller is about to close, to fail later with nobody to hear it."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


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
    async def read_queue() -> list[Candidate] | None:
        try:
            return await candidates(kv)
        except MetaAuthError:
            return None

    snap, queue = await all_of(kv.load_prefix(role_prefix(QUERYCOORD_ROLE)), read_queue())
    sessions = snap.kvs
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
    coordinators, query_nodes, stream_nodes, switchover, activation, lifecycles = await all_of(
        coordinator_rows(kv, probe_timeout), list_sessions(kv, QUERYNODE_ROLE), list_sessions(kv, STREAMNODE_ROLE),
        switchover_holder(kv), read_activation(kv), lifecycle_names(kv))
    controls = activation_record(activation)
    leader = next((c["address"] for c in coordinators if c["role"] == "leader"), None)
    rows = node_rows(query_nodes.sessions, QUERYNODE_ROLE)
    for row in rows:
        row["lifecycle"] = lifecycles.get(row["id"], "active")
    return {"leader": leader, "switchover": switchover, "controls": controls, "coordinators": coordinators,
            "query_nodes": rows,
            "stream_nodes": node_rows(stream_nodes.sessions, STREAMNODE_ROLE)}


async def gather_status(config: EtcdConfig, root: str, *, probe_timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    """Everything ``querycoord status`` shows, as one JSON-ready dict; ``MetaError`` when etcd does not answer."""
    async def view_of_root() -> dict[str, Any]:
        async with await connect(config) as client:
            return await session_view(MetaKV(client, root), probe_timeout)

    # Side by side: the members' status (their own connections) need not wait for the sessions and the probes.
    view, etcd = await asyncio.gather(view_of_root(), cluster_status(config))
    return {"root": root, **view, "etcd": etcd.as_dict()}


__all__ = ["PROBE_TIMEOUT", "all_of", "coordinator_health", "coordinator_rows", "gather_status", "lifecycle_names",
           "node_rows", "session_view"]
