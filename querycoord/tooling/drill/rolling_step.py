"""A query node's lifecycle as the rolling drill drives it: cordon, drain, uncordon, and where it stands.

The calls are the coordinator's CordonNode, DrainNode and UncordonNode (``NodeLifecycleRequest`` ->
``NodeLifecycleResponse``), and ShowNodes for each node's ``lifecycle`` (ACTIVE, CORDONED, DRAINING, DRAINED) and
``drain`` progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import grpc

from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient

POLL_S = 0.2


class StepError(Exception):
    """A lifecycle call was refused; the message names the call, the node and the answer."""


@dataclass(frozen=True)
class NodeState:
    """One node as ShowNodes lists it: "online"/"offline", its lifecycle name (ACTIVE, CORDONED, DRAINING,
    DRAINED) and, while draining or once drained, the copies it still holds and why it waits."""

    state: str
    lifecycle: str
    copies_left: int
    waiting: str = ""


def state_of(info: qc.NodeInfo) -> NodeState:
    return NodeState(info.state, qc.NodeLifecycle.Name(info.lifecycle).removeprefix("NODE_LIFECYCLE_"),
                     info.drain.copies_left, info.drain.waiting)


async def call(client: QueryCoordClient, method: str, node_id: int) -> None:
    """``method`` (CordonNode, UncordonNode, DrainNode) for ``node_id``; ``StepError`` unless it succeeded."""
    resp = await client.query(method, qc.NodeLifecycleRequest(node_id=node_id))
    if resp.status.error_code != common_pb2.SUCCESS:
        raise StepError(f"{method} {node_id}: {common_pb2.ErrorCode.Name(resp.status.error_code)} "
                        f"{resp.status.reason}")


async def nodes(client: QueryCoordClient) -> dict[int, NodeState]:
    """Every node the leader lists; {} when no leader answered."""
    with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
        resp = await client.query("ShowNodes", qc.ShowNodesRequest())
        if resp.status.error_code == common_pb2.SUCCESS:
            return {n.node_id: state_of(n) for n in resp.nodes}
    return {}


async def wait_node(client: QueryCoordClient, node_id: int, timeout: float, *, state: str = "",
                    lifecycle: str = "") -> NodeState | None:
    """Until the leader lists ``node_id`` with ``state`` and ``lifecycle`` (each "" for any): its entry then, or
    None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = (await nodes(client)).get(node_id)
        if got is not None and state in ("", got.state) and lifecycle in ("", got.lifecycle):
            return got
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(POLL_S)


async def drain(client: QueryCoordClient, node_id: int, timeout: float, stall: float) -> NodeState | None:
    """Cordon ``node_id`` and drain it: its entry once DRAINED, or once the drain has said why it waits (its
    progress's ``waiting``) with the same copies left for ``stall`` seconds (DESIGN rule 10: it waits on no
    impossible move, so it may wait for a node that is not coming), or after ``timeout`` seconds (its last entry;
    None when the leader did not list it). ``StepError`` if a call was refused."""
    await call(client, "CordonNode", node_id)
    await call(client, "DrainNode", node_id)
    deadline = time.monotonic() + timeout
    last: NodeState | None = None
    since = time.monotonic()
    while True:
        got = (await nodes(client)).get(node_id)
        if got is not None and got.lifecycle == "DRAINED":
            return got
        if got is None or not got.waiting or last is None or (got.copies_left, got.waiting) != (
                last.copies_left, last.waiting):
            since = time.monotonic()
        last = got or last
        if time.monotonic() - since > stall or time.monotonic() > deadline:
            return last
        await asyncio.sleep(POLL_S)


async def uncordon(client: QueryCoordClient, node_id: int) -> None:
    await call(client, "UncordonNode", node_id)


__all__ = ["NodeState", "StepError", "call", "drain", "nodes", "state_of", "uncordon", "wait_node"]
