"""A query node's lifecycle as the rolling drill drives it: cordon, drain, uncordon, and where it stands.

The calls are the coordinator's CordonNode, DrainNode and UncordonNode (``NodeLifecycleRequest`` ->
``NodeLifecycleResponse``), and ShowNodes for each node's ``lifecycle`` (ACTIVE, CORDONED, DRAINING, DRAINED) and
``drain`` progress. ``LIFECYCLE`` says whether this build's protocol has them: without, the drill skips the
cordon and the drain and stops nodes with SIGTERM alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import grpc

from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient

LIFECYCLE = hasattr(qc, "NodeLifecycleRequest")
_QC: Any = qc  # the lifecycle messages, where this build's protocol has them
POLL_S = 0.2


class StepError(Exception):
    """A lifecycle call was refused; the message names the call, the node and the answer."""


@dataclass(frozen=True)
class NodeState:
    """One node as ShowNodes lists it: "online"/"offline", its lifecycle name ("" without the field) and, while
    draining, the copies it still holds."""

    state: str
    lifecycle: str
    copies_left: int


def _lifecycle_name(info: Any) -> str:
    if not LIFECYCLE:
        return ""
    enum = _QC.NodeLifecycle
    return str(enum.Name(info.lifecycle)).removeprefix("NODE_LIFECYCLE_")


async def call(client: QueryCoordClient, method: str, node_id: int) -> None:
    """``method`` (CordonNode, UncordonNode, DrainNode) for ``node_id``; ``StepError`` unless it succeeded."""
    request = _QC.NodeLifecycleRequest(node_id=node_id)
    resp = await client.query(method, request)
    if resp.status.error_code != common_pb2.SUCCESS:
        raise StepError(f"{method} {node_id}: {common_pb2.ErrorCode.Name(resp.status.error_code)} "
                        f"{resp.status.reason}")


async def nodes(client: QueryCoordClient) -> dict[int, NodeState]:
    """Every node the leader lists; {} when no leader answered."""
    with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
        resp = await client.query("ShowNodes", qc.ShowNodesRequest())
        if resp.status.error_code == common_pb2.SUCCESS:
            return {n.node_id: NodeState(n.state, _lifecycle_name(n),
                                         int(getattr(getattr(n, "drain", None), "copies_left", 0)))
                    for n in resp.nodes}
    return {}


async def wait_node(client: QueryCoordClient, node_id: int, timeout: float, *, state: str = "",
                    lifecycle: str = "") -> NodeState | None:
    """Until the leader lists ``node_id`` with ``state`` and ``lifecycle`` (each "" for any): its entry then, or
    None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = (await nodes(client)).get(node_id)
        if got is not None and state in ("", got.state) and (not LIFECYCLE or lifecycle in ("", got.lifecycle)):
            return got
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(POLL_S)


async def drain(client: QueryCoordClient, node_id: int, timeout: float) -> NodeState | None:
    """Cordon ``node_id``, drain it and wait until it is DRAINED: its entry then, or None after ``timeout``
    seconds (``StepError`` if a call was refused)."""
    await call(client, "CordonNode", node_id)
    await call(client, "DrainNode", node_id)
    return await wait_node(client, node_id, timeout, lifecycle="DRAINED")


async def uncordon(client: QueryCoordClient, node_id: int) -> None:
    await call(client, "UncordonNode", node_id)


__all__ = ["LIFECYCLE", "NodeState", "StepError", "call", "drain", "nodes", "uncordon", "wait_node"]
