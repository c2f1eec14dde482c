"""gRPC client of one query node; every call carries the leader's fence.

Reads carry it too: a node raises its fence mark on any call, so once a new
leader has only read a node's distribution (the checker), a late
mutation from the deposed leader is already refused there.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from proto import common_pb2, querynode_pb2, querynode_pb2_grpc
from querycoord.common.errors import CoordError
from querycoord.security.grpc_channels import GrpcSecurity, make_channel


class NodeError(CoordError):
    """A node refused a call (status) or could not be reached (transport).

    ``reason`` is the node's own (or the transport's); ``str()`` names the node, the method and the code.
    """

    def __init__(self, node_id: int, method: str, code: common_pb2.ErrorCode, reason: str, *,
                 transport: bool = False):
        super().__init__(reason, code)
        self.node_id, self.method, self.transport = node_id, method, transport

    def __str__(self) -> str:
        code = self.code
        name = common_pb2.ErrorCode.Name(code) if code in common_pb2.ErrorCode.values() else str(code)
        return f"query node {self.node_id} {self.method}: {name}: {self.reason}"


class QueryNodeClient:
    """One channel per node; ``fence`` is stamped on mutating requests by ``call``.

    The channel is this process's (``grpc_channels``): with TLS it presents the coordinator's certificate (mutual
    TLS), so the node knows a coordinator calls. It never carries the coordinator's bearer token: a node is
    whatever registered a session in etcd, and a token it received would let it call the coordinators and the
    other nodes as the coordinator; a certificate proves itself in the handshake and gives the node nothing to
    replay.
    """

    def __init__(self, node_id: int, address: str, *, timeout: float = 10.0, security: GrpcSecurity | None = None):
        self.node_id = node_id
        self.address = address
        self.timeout = timeout
        self._channel = make_channel(
            address,
            security,
            bearer=False,
            options=[
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = querynode_pb2_grpc.QueryNodeStub(self._channel)
        self.fence: querynode_pb2.CoordFence | None = None

    async def call(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """Send ``request``; raise ``NodeError`` unless the node answered SUCCESS."""
        if self.fence is not None and hasattr(request, "fence"):
            request.fence.CopyFrom(self.fence)
        if hasattr(request, "node_id"):
            request.node_id = self.node_id
        try:
            resp = await getattr(self._stub, method)(request, timeout=timeout or self.timeout)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller was cancelled
            # grpc.aio cancels calls in flight when their channel is closed (the node's session ended and
            # the node was forgotten): for the caller that is a failed call, not a cancellation of itself.
            raise NodeError(self.node_id, method, common_pb2.UNEXPECTED_ERROR,
                            "the connection to the node was closed while the call was in flight (node gone)",
                            transport=True) from None
        except grpc.aio.AioRpcError as exc:
            raise NodeError(
                self.node_id, method, common_pb2.UNEXPECTED_ERROR, f"{exc.code().name}: {exc.details()}", transport=True
            ) from exc
        status = resp.status if hasattr(resp, "status") else None
        if status is not None and status.error_code != common_pb2.SUCCESS:
            raise NodeError(self.node_id, method, status.error_code, status.reason)
        return resp

    async def close(self) -> None:
        await self._channel.close()
