"""Bounds every gRPC server keeps on what its callers may hold: concurrent calls, streams, and the calls anyone may
make without a credential.

Why: the standard health service (Check, Watch, List) is open to anyone who
completes TLS, and a Watch stream lives as long as its caller wants. Its
request is one service name, yet gRPC admits any message up to the server's
limit (16 MiB): a stranger's Watch with a 15 MiB name pinned about 64 MiB of
the coordinator for as long as the stream stayed open, with no bound on how
many. Here a request of an open method larger than ``OPEN_MESSAGE_BYTES`` is
refused (RESOURCE_EXHAUSTED) before it is decoded or kept, at most
``MAX_OPEN_STREAMS`` Watch streams are open at once, and the server admits at
most ``MAX_CONCURRENT_RPCS`` calls in all (gRPC answers the next
RESOURCE_EXHAUSTED) and ``MAX_STREAMS_PER_CONNECTION`` on one connection
(further ones wait in the client, as HTTP/2 prescribes).

gRPC still receives a whole message before any handler sees it, so a refused
request costs its size once, briefly; what no longer happens is keeping it.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from querycoord.common.metrics import OPEN_CALLS_REFUSED
from querycoord.security.auth_rules import OPEN, RULES
from querycoord.security.grpc_intercept import Behaviour, WrappingInterceptor

# A health request is a service name: a kilobyte is plenty.
OPEN_MESSAGE_BYTES = 1024
# Open Watch streams at once (load balancers and probes: a handful each).
MAX_OPEN_STREAMS = 64
# Calls in progress at once on one server, streams included; the next is answered RESOURCE_EXHAUSTED at once.
MAX_CONCURRENT_RPCS = 1000
# HTTP/2 streams at once on one connection (a client queues the next until one ends).
MAX_STREAMS_PER_CONNECTION = 256


def server_options() -> list[tuple[str, Any]]:
    """The gRPC channel arguments of a server that bound what one connection may hold."""
    return [("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION)]


class OpenCallBounds(WrappingInterceptor):
    """Put it first among a server's interceptors: it sees the raw request bytes of open methods (the security
    interceptor decodes them later) and refuses large ones, and counts open streams (see module docstring).
    No open method streams its requests: those handlers are left as they are."""

    def __init__(self, max_bytes: int = OPEN_MESSAGE_BYTES, max_streams: int = MAX_OPEN_STREAMS):
        super().__init__()
        self.max_bytes = max_bytes
        self.max_streams = max_streams
        self.streams = 0  # open streams of open methods now

    def _applies(self, method: str) -> bool:
        return RULES.get(method) == OPEN

    def _decoded(self, raw: Any, deserializer: Callable[[bytes], Any] | None) -> tuple[Any, int]:
        """The request and its size; None for one too large (not decoded, never kept)."""
        size = len(raw) if isinstance(raw, bytes) else raw.ByteSize()
        if size > self.max_bytes:
            return None, size
        return (deserializer(raw) if deserializer is not None and isinstance(raw, bytes) else raw), size

    async def _refuse(self, method: str, size: int, context: grpc.aio.ServicerContext) -> None:
        # Called with no reference to the request left: the abort's traceback must not keep megabytes alive
        # until the cyclic GC runs (rarely, on a coordinator: process.py raises its thresholds).
        OPEN_CALLS_REFUSED.labels("too large").inc()
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"{method.rsplit('/', 1)[-1]}: a request of {size} bytes; this method, open to "
                            f"callers without a credential, takes at most {self.max_bytes}")

    def _wrap_unary(self, method: str, behaviour: Behaviour, deserializer: Callable[[bytes], Any] | None) -> Behaviour:
        async def call(raw: Any, context: grpc.aio.ServicerContext) -> Any:
            request, size = self._decoded(raw, deserializer)
            del raw
            if request is None:
                await self._refuse(method, size, context)
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return call

    def _wrap_unary_stream(self, method: str, behaviour: Behaviour,
                           deserializer: Callable[[bytes], Any] | None) -> Behaviour:
        async def admit(request: Any, size: int, context: grpc.aio.ServicerContext) -> Any:
            if request is None:
                await self._refuse(method, size, context)
            if self.streams >= self.max_streams:
                OPEN_CALLS_REFUSED.labels("too many streams").inc()
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"{method.rsplit('/', 1)[-1]}: {self.streams} streams are open, the most this "
                                    "server keeps for callers without a credential; retry later")
            return request

        if inspect.isasyncgenfunction(behaviour):
            async def stream(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                request, size = self._decoded(raw, deserializer)
                del raw
                request = await admit(request, size, context)
                self.streams += 1
                try:
                    async for item in behaviour(request, context):
                        yield item
                finally:
                    self.streams -= 1

            return stream

        async def writer(raw: Any, context: grpc.aio.ServicerContext) -> Any:
            request, size = self._decoded(raw, deserializer)
            del raw
            request = await admit(request, size, context)
            self.streams += 1
            try:
                return await behaviour(request, context)
            finally:
                self.streams -= 1

        return writer


__all__ = ["MAX_CONCURRENT_RPCS", "MAX_OPEN_STREAMS", "MAX_STREAMS_PER_CONNECTION", "OPEN_MESSAGE_BYTES",
           "OpenCallBounds", "server_options"]
