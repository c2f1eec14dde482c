"""One connection to etcd, and the single retry policy every etcd call goes through.

``etcd3aio`` is kept behind this module (DESIGN.md: so it can be replaced).
Its own retry loop is switched off (one attempt per call) so that there is
exactly one policy, here: exponential back-off with jitter, a per-attempt
timeout, and an overall deadline after which ``MetaUnavailable`` names the
endpoints tried. Nothing retries forever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from etcd3aio import Etcd3Client, EtcdConnectionError, EtcdTransientError, EtcdUnauthenticatedError
from etcd3aio._protobuf import KVStub, LeaseStub, WatchStub
from loguru import logger
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from meta.config import EtcdConfig
from meta.errors import MetaUnavailable

T = TypeVar("T")

_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

_TRANSIENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def is_transient(exc: BaseException) -> bool:
    """Errors worth another attempt: the cluster may answer a moment later."""
    if isinstance(exc, EtcdConnectionError | EtcdTransientError | TimeoutError):
        return True
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in _TRANSIENT_CODES:
            return True
        # etcd answers these while it elects a raft leader or loses quorum.
        details = exc.details() or ""
        return exc.code() == grpc.StatusCode.UNKNOWN and (
            "leader changed" in details or "no leader" in details or "timed out" in details
        )
    return False


class EtcdClient:
    """An open channel to etcd plus the retry policy (see module docstring)."""

    def __init__(self, config: EtcdConfig):
        self.config = config
        self.endpoints = list(config.endpoints)
        tls = {}
        if config.ca_file is not None:
            tls["ca_cert"] = config.ca_file.read_bytes()
        if config.cert_file is not None and config.key_file is not None:
            tls["cert_chain"] = config.cert_file.read_bytes()
            tls["cert_key"] = config.key_file.read_bytes()
        server_name = config.tls_server_name
        if server_name is None and tls and len(self.endpoints) > 1:
            server_name = "localhost"
        self._raw = Etcd3Client(
            self.endpoints,
            rpc_max_attempts=1,
            tls_server_name=server_name,
            **tls,  # type: ignore[arg-type]
        )
        # gRPC's default reconnect back-off grows to 120 s; after an etcd restart
        # or failover we want the channel back within about a second.
        self._raw._manager.grpc_options.extend(_CHANNEL_OPTIONS)
        self._auth_lock = asyncio.Lock()
        self._connected = False
        self._metadata: tuple[tuple[str, str], ...] | None = None
        # Stubs used directly by meta (one request object per call, no second retry layer).
        self.kv: KVStub
        self.lease: LeaseStub
        self.watch: WatchStub

    @property
    def raw(self) -> Etcd3Client:
        """The underlying client; only ``meta`` modules use it (watch and lease streams)."""
        return self._raw

    @property
    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """gRPC metadata (the auth token) to pass on every stub call."""
        return self._metadata

    @property
    def channel(self) -> grpc.aio.Channel:
        return self._raw._channel  # type: ignore[return-value]

    async def connect(self) -> EtcdClient:
        """Open the channel and, with auth configured, log in (within the deadline)."""
        if not self._connected:
            await self._raw.connect()
            self.kv = KVStub(self.channel)
            self.lease = LeaseStub(self.channel)
            self.watch = WatchStub(self.channel)
            self._connected = True
            if self.config.user is not None:
                await self._authenticate()
        return self

    async def close(self) -> None:
        if self._connected:
            self._connected = False
            await self._raw.close()

    async def __aenter__(self) -> EtcdClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _authenticate(self) -> None:
        async with self._auth_lock:
            assert self._raw.auth is not None
            self._set_token(None)
            resp = await self.call(
                "Auth.Authenticate",
                lambda t: self._raw.auth.authenticate(  # type: ignore[union-attr]
                    self.config.user, self.config.password, timeout=t
                ),
                reauth=False,
            )
            self._set_token(resp.token)

    async def reauthenticate(self) -> None:
        """Log in again (an auth token expired on a long-lived stream)."""
        if self.config.user is not None:
            await self._authenticate()

    def _set_token(self, token: str | None) -> None:
        self._raw.set_token(token)
        self._metadata = (("token", token),) if token else None

    async def call(
        self,
        operation: str,
        fn: Callable[[float], Awaitable[T]],
        *,
        deadline: float | None = None,
        reauth: bool = True,
    ) -> T:
        """Run ``fn(attempt_timeout)`` until it succeeds, fails for good, or the deadline passes.

        Only transient errors are retried. An expired auth token is renewed
        once. Retried writes must be idempotent: an attempt whose answer was
        lost may have been applied (all writes of ``meta`` are).
        """
        budget = self.config.deadline if deadline is None else deadline
        started = time.monotonic()
        reauthed = False

        def attempt_timeout() -> float:
            return max(0.05, min(self.config.call_timeout, budget - (time.monotonic() - started)))

        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_delay(budget),
            wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.1),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    try:
                        return await fn(attempt_timeout())
                    except Exception as exc:
                        if reauth and not reauthed and self.config.user is not None and _is_auth_expired(exc):
                            reauthed = True
                            await self._authenticate()
                            return await fn(attempt_timeout())
                        if is_transient(exc):
                            logger.debug("etcd {} transient failure: {}", operation, exc)
                        raise
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            raise MetaUnavailable(self.endpoints, operation, time.monotonic() - started, cause) from cause
        raise AssertionError("unreachable")  # pragma: no cover


def _is_auth_expired(exc: BaseException) -> bool:
    if isinstance(exc, EtcdUnauthenticatedError):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and (
        exc.code() == grpc.StatusCode.UNAUTHENTICATED or "invalid auth token" in (exc.details() or "")
    )


async def connect(config: EtcdConfig) -> EtcdClient:
    """Open a client; fails with ``MetaUnavailable`` if etcd does not answer in time."""
    client = EtcdClient(config)
    await client.connect()
    try:
        await client.call("Maintenance.Status", lambda t: client.raw.maintenance.status(timeout=t))  # type: ignore[union-attr]
    except BaseException:
        await client.close()
        raise
    return client
