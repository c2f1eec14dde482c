"""The shape every server interceptor of ours shares: each method handler wrapped once, its behaviours replaced.

A subclass says which methods it wraps (``_applies``) and what becomes of a handler's behaviour
(``_wrap_unary``, ``_wrap_unary_stream``, ``_wrap_request_stream``); the handler of a unary request is
rebuilt without its deserializer, so the wrapper sees the raw request bytes and decodes them itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Behaviour = Callable[..., Any]


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """Wraps the handlers of the methods it applies to, once per handler (not on every call)."""

    def __init__(self) -> None:
        # method -> (the service's handler, its wrapped copy)
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    def _applies(self, method: str) -> bool:
        """Whether ``method``'s handler is wrapped (every method by default)."""
        return True

    def _wrap_unary(self, method: str, behaviour: Behaviour, deserializer: Callable[[bytes], Any] | None) -> Behaviour:
        """The behaviour of a unary-request, unary-response method, given the raw request bytes."""
        raise NotImplementedError

    def _wrap_unary_stream(self, method: str, behaviour: Behaviour,
                           deserializer: Callable[[bytes], Any] | None) -> Behaviour:
        """The behaviour of a unary-request, streaming-response method, given the raw request bytes."""
        return self._wrap_unary(method, behaviour, deserializer)

    def _wrap_request_stream(self, method: str, behaviour: Behaviour) -> Behaviour | None:
        """The behaviour of a streaming-request method (its requests decoded by gRPC); None: left as it is."""
        return None

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or not self._applies(method):
            return handler  # None: an unknown method, which gRPC answers UNIMPLEMENTED
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: Any) -> Any:
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary, handler.request_deserializer),
                request_deserializer=None, response_serializer=serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_unary_stream(method, handler.unary_stream, handler.request_deserializer),
                request_deserializer=None, response_serializer=serializer)
        if handler.stream_unary is not None:
            behaviour = self._wrap_request_stream(method, handler.stream_unary)
            return handler if behaviour is None else grpc.stream_unary_rpc_method_handler(
                behaviour, request_deserializer=handler.request_deserializer, response_serializer=serializer)
        behaviour = self._wrap_request_stream(method, handler.stream_stream)
        return handler if behaviour is None else grpc.stream_stream_rpc_method_handler(
            behaviour, request_deserializer=handler.request_deserializer, response_serializer=serializer)


__all__ = ["Behaviour", "WrappingInterceptor"]
