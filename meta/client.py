"""One connection to etcd, and the single retry policy every etcd call goes through.

``etcd3aio`` is kept behind this module (DESIGN.md: so it can be replaced).
It also builds the requests of etcd's Lease service (grant, time to live,
keepalive, revoke), as ``meta.kv`` builds those of the KV service and
``meta.watch`` those of the Watch service: no other module of ``meta``
touches etcd3aio's protobufs.
Its own retry loop is switched off (one attempt per call) so that there is
exactly one policy, here: exponential back-off with jitter, a per-attempt
timeout, and an overall deadline after which ``MetaUnavailable`` names the
endpoints tried. Nothing retries forever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import TypeGuard, TypeVar

import grpc
from etcd3aio import (
    Etcd3Client,
    EtcdConnectionError,
    EtcdPermissionDeniedError,
    EtcdTransientError,
    EtcdUnauthenticatedError,
)

from meta import etcd_pb as pb
from meta import observe
from meta.config import EtcdConfig
from meta.errors import ClientClosed, MetaAuthError, MetaNoSpace, MetaRefused, MetaUnavailable, NotEtcd
from meta.log import logger
from meta.loops import keep_running
from meta.reach import refusals

T = TypeVar("T")

# Set (in a task's context) by an application whose writes there should wait out etcd's NOSPACE alarm instead of
# failing: ``call`` awaits it with the refusal, then tries the write again (a refused write was not applied).
NOSPACE_WAIT: ContextVar[Callable[[MetaNoSpace], Awaitable[None]] | None] = ContextVar("nospace_wait", default=None)

_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

_TRANSIENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# When etcd was found unreachable, by endpoints: shared by the clients of a process, so an outage is logged once
# ("unreachable", then "reachable again"), however many clients and calls notice it.
_unreachable_since: dict[tuple[str, ...], float] = {}


def brief(exc: BaseException | None) -> str:
    """One line for a log or a message (a gRPC error prints as a multi-line dump with its debug string)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        text = f"{exc.code().name}: {exc.details()}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _is_unreachable(exc: BaseException) -> bool:
    """Nothing answered at all (as opposed to an answer that says to retry, like "leader changed")."""
    if isinstance(exc, EtcdConnectionError | TimeoutError):
        return True
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in _TRANSIENT_CODES
# etcd answers INVALID_ARGUMENT or UNKNOWN (not UNAUTHENTICATED) to these refusals of credentials.
_AUTH_INVALID_ARGUMENT = ("user name is empty", "authentication failed", "revision of auth store is old")


def _auth_advice(user: str | None, details: str) -> str:
    if "user name is empty" in details:
        return "etcd has authentication enabled: configure the etcd user and password."
    if "authentication failed" in details:
        return f"The etcd user {user!r} does not exist or the password is wrong: check the etcd user and password."
    if "permission denied" in details:
        return (
            f"The etcd user {user!r} lacks permission: grant its role read/write on the keys "
            "(etcdctl role grant-permission) or use a user with the root role."
        )
    return "Check the etcd user and password."


def _auth_refusal(exc: BaseException) -> str | None:
    """etcd's reason when ``exc`` refuses the request's credentials, else None."""
    if isinstance(exc, EtcdUnauthenticatedError | EtcdPermissionDeniedError):
        return str(exc)
    if isinstance(exc, grpc.aio.AioRpcError):
        details = exc.details() or ""
        if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return details or exc.code().name
        refusal_codes = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN)
        if exc.code() in refusal_codes and any(m in details for m in _AUTH_INVALID_ARGUMENT):
            return details
    return None


def _is_nospace(exc: BaseException) -> TypeGuard[grpc.aio.AioRpcError]:
    """etcd's answer to a write while its NOSPACE alarm is raised."""
    return (isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "space exceeded" in (exc.details() or ""))


def _tls_hint(config: EtcdConfig, cause: BaseException | None) -> str:
    """What to fix when a failed TLS handshake is the reason etcd is unreachable.

    gRPC reports these as UNAVAILABLE like a stopped server, so without a hint
    the user would look for a dead etcd instead of a certificate problem.
    """
    text = str(cause)
    if "handshake failed" in text.lower() or "SSL_ERROR" in text:
        if "BAD_CERTIFICATE" in text or "CERTIFICATE_REQUIRED" in text:
            return (
                " etcd refused the TLS client certificate (none given, or not signed by the CA etcd trusts): "
                "set cert_file and key_file to a client certificate signed by etcd's --trusted-ca-file."
            )
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return (
                " The etcd server certificate was not accepted: check that ca_file is the CA that signed it "
                "and that the endpoint host (or tls_server_name) is in its SAN."
            )
        if "WRONG_VERSION_NUMBER" in text:
            return " etcd does not seem to serve TLS on these endpoints: drop ca_file or use etcd's TLS port."
        return " The TLS handshake failed: check ca_file, cert_file and key_file."
    if config.ca_file is None and "Socket closed" in text:
        return (
            " If etcd serves TLS (https client URLs), set ca_file, and cert_file/key_file when etcd "
            "checks client certificates."
        )
    return ""


def is_transient(exc: BaseException) -> bool:
    """Errors worth another attempt: the cluster may answer a moment later."""
    if isinstance(exc, EtcdConnectionError | EtcdTransientError | TimeoutError):
        return True
    if isinstance(exc, grpc.aio.AioRpcError):
        if exc.code() in _TRANSIENT_CODES:
            return True
        # etcd answers these while it elects a raft leader or loses quorum; "context
        # deadline exceeded" is our own deadline expiring on the server first (seen
        # on writes to a 3-member cluster with 2 members down).
        details = exc.details() or ""
        if exc.code() == grpc.StatusCode.INTERNAL and "Internal error from Core" in details:
            # Our own gRPC core failed to send or receive on a connection that broke under the call (etcd
            # killed mid-stream): the request never got an answer from etcd, so it is a transport failure.
            return True
        return exc.code() == grpc.StatusCode.UNKNOWN and (
            "leader changed" in details
            or "no leader" in details
            or "timed out" in details
            or "context deadline exceeded" in details
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
        self._raw._manager.grpc_options.extend(_CHANNEL_OPTIONS)  # noqa: SLF001 - the library takes no channel options
        self._auth_lock = asyncio.Lock()
        self._connected = False
        self._closed = False
        self._reach_key = tuple(self.endpoints)
        self._monitor: asyncio.Task[None] | None = None
        self._metadata: tuple[tuple[str, str], ...] | None = None
        # Stubs used directly by meta (one request object per call, no second retry layer).
        self.kv: pb.KVStub
        self.lease: pb.LeaseStub
        self.watch: pb.WatchStub

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
        return self._raw._channel  # noqa: SLF001 - the library exposes no channel

    @property
    def closed(self) -> bool:
        """``close`` was called: every call raises ``ClientClosed`` from now on, and loops that use this client
        stop (``meta.loops``)."""
        return self._closed

    @property
    def unreachable_since(self) -> float | None:
        """``time.monotonic()`` when etcd was found unreachable (by any client of this process), None while it
        answers."""
        return _unreachable_since.get(self._reach_key)

    def note_unreachable(self, why: str) -> None:
        if self._reach_key not in _unreachable_since:
            _unreachable_since[self._reach_key] = time.monotonic()
            logger.warning("etcd at {} is unreachable ({}); retrying", ", ".join(self.endpoints), why)

    def note_reachable(self, call_started: float | None = None) -> None:
        """``call_started``: when the call that succeeded was sent. An answer to a call sent before etcd was found
        unreachable (in flight when the connection failed) proves nothing: it would log "reachable again" right
        after "unreachable", and "unreachable" again at the next call."""
        since = _unreachable_since.get(self._reach_key)
        if since is None or (call_started is not None and call_started < since):
            return
        _unreachable_since.pop(self._reach_key, None)
        logger.info("etcd at {} is reachable again (after {:.1f}s)", ", ".join(self.endpoints),
                    time.monotonic() - since)

    async def _follow_connectivity(self) -> None:
        """Note when the channel fails and when it is ready again: calls notice only on their next attempt, and an
        idle coordinator may make none for seconds (its lease keepalive and watches do not go through ``call``)."""
        channel = self.channel
        state = channel.get_state(try_to_connect=False)
        while state != grpc.ChannelConnectivity.SHUTDOWN:
            await channel.wait_for_state_change(state)
            state = channel.get_state(try_to_connect=False)
            if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                self.note_unreachable("the connection failed")
            elif state == grpc.ChannelConnectivity.READY:
                self.note_reachable()

    async def connect(self) -> EtcdClient:
        """Open the channel and, with auth configured, log in (within the deadline)."""
        if not self._connected:
            await self._raw.connect()
            self.kv = pb.KVStub(self.channel)
            self.lease = pb.LeaseStub(self.channel)
            self.watch = pb.WatchStub(self.channel)
            self._connected = True
            self._monitor = asyncio.create_task(
                keep_running("etcd connectivity", self._follow_connectivity, client=self), name="etcd-connectivity")
            if self.config.user is not None:
                await self._authenticate()
        return self

    async def close(self) -> None:
        self._closed = True
        if self._connected:
            self._connected = False
            if self._monitor is not None:
                self._monitor.cancel()
            await self._raw.close()

    async def __aenter__(self) -> EtcdClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _authenticate(self) -> None:
        async with self._auth_lock:
            auth = self._raw.auth
            assert auth is not None
            user, password = self.config.user or "", self.config.password or ""
            self._set_token(None)
            try:
                resp = await self.call(
                    "Auth.Authenticate",
                    lambda t: auth.authenticate(user, password, timeout=t),
                    reauth=False,
                )
            except grpc.aio.AioRpcError as exc:
                # As etcd's own client does: credentials given to an etcd without auth
                # are not an error (auth may be enabled later; then "user name is
                # empty" makes ``call`` log in again).
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in (exc.details() or ""):
                    logger.info("etcd at {} has authentication disabled; connecting without a token", self.endpoints)
                    return
                raise
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

        The first attempt runs outside tenacity: building its retry state is a
        real share of a small call's client time, so only a failed first
        attempt pays for it (and only a process that retries imports it).

        Where ``NOSPACE_WAIT`` is set, a write refused for NOSPACE waits and is tried again. A closed client
        raises ``ClientClosed`` at once (its stubs are gone: what they would raise says nothing).
        """
        if self._closed:
            raise ClientClosed(operation)
        wait = NOSPACE_WAIT.get()
        if wait is not None:
            return await self._call_waiting_out_nospace(wait, operation, fn, deadline, reauth)
        budget = self.config.deadline if deadline is None else deadline
        started = time.monotonic()
        try:
            result = await fn(min(self.config.call_timeout, budget))
        except Exception as exc:
            can_relogin = reauth and self.config.user is not None and _is_auth_expired(exc)
            if not can_relogin:
                self._raise_if_refused(operation, exc)
                if not is_transient(exc):
                    raise
            if _is_unreachable(exc):
                self.note_unreachable(brief(exc))
            logger.debug("etcd {} failed once ({}); retrying within {:.1f}s", operation, brief(exc), budget)
        else:
            if self._reach_key in _unreachable_since:
                self.note_reachable(started)
            observe.etcd_call(operation, time.monotonic() - started)
            return result
        try:
            return await self._call_retrying(operation, fn, budget, started, reauth)
        finally:
            observe.etcd_call(operation, time.monotonic() - started)

    async def _call_waiting_out_nospace(self, wait: Callable[[MetaNoSpace], Awaitable[None]], operation: str,
                                        fn: Callable[[float], Awaitable[T]], deadline: float | None,
                                        reauth: bool) -> T:
        token = NOSPACE_WAIT.set(None)  # the attempts below raise; only this loop waits
        try:
            while True:
                try:
                    return await self.call(operation, fn, deadline=deadline, reauth=reauth)
                except MetaNoSpace as exc:
                    await wait(exc)
        finally:
            NOSPACE_WAIT.reset(token)

    def _raise_if_refused(self, operation: str, exc: BaseException) -> None:
        """What etcd refuses (credentials, a write while out of space) it refuses again on retry: say so now."""
        if _is_nospace(exc):
            raise MetaNoSpace(self.endpoints, operation, exc.details() or "NOSPACE") from exc
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise NotEtcd(self.endpoints, operation, exc.details() or "UNIMPLEMENTED") from exc
        refusal = _auth_refusal(exc)
        if refusal is not None:
            raise MetaAuthError(
                self.endpoints, operation, self.config.user, refusal, _auth_advice(self.config.user, refusal)
            ) from exc

    async def _call_retrying(
        self, operation: str, fn: Callable[[float], Awaitable[T]], budget: float, started: float, reauth: bool
    ) -> T:
        # Imported at the first retry, not with the client: most processes, a one-shot reader's above all, never
        # retry, and tenacity's import is a real share of a short command's start-up.
        from tenacity import AsyncRetrying, RetryError, retry_if_exception, stop_before_delay, wait_exponential_jitter

        reauthed = False

        def attempt_timeout() -> float:
            return max(0.05, min(self.config.call_timeout, budget - (time.monotonic() - started)))

        retrying = AsyncRetrying(
            retry=retry_if_exception(is_transient),
            stop=stop_before_delay(max(0.0, budget - (time.monotonic() - started))),
            wait=wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.1),
            reraise=False,
        )
        try:
            async for attempt in retrying:
                observe.etcd_retry(operation)  # the first attempt ran in ``call``: each one here is a retry
                with attempt:
                    try:
                        sent = time.monotonic()
                        result = await fn(attempt_timeout())
                        self.note_reachable(sent)
                        return result
                    except Exception as exc:
                        if reauth and not reauthed and self.config.user is not None and _is_auth_expired(exc):
                            reauthed = True
                            await self._authenticate()
                            return await fn(attempt_timeout())
                        self._raise_if_refused(operation, exc)
                        if is_transient(exc):
                            logger.debug("etcd {} transient failure: {}", operation, brief(exc))
                        raise
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            observe.etcd_unavailable(operation)
            raise MetaUnavailable(
                self.endpoints, operation, time.monotonic() - started, RuntimeError(brief(cause)) if cause else None,
                hint=_tls_hint(self.config, cause),
            ) from cause
        raise AssertionError("unreachable")  # pragma: no cover

    # ----- leases: the requests of etcd's Lease service are built here and nowhere else ----------------------------
    async def grant_lease(self, ttl: int, operation: str = "Lease.Grant") -> int:
        """A new lease of ``ttl`` whole seconds; its id."""
        lease = await self.call(
            operation, lambda t: self.lease.LeaseGrant(pb.LeaseGrantRequest(TTL=ttl), metadata=self.metadata, timeout=t)
        )
        return int(lease.ID)

    async def lease_time_to_live(self, lease_id: int) -> int:
        """Seconds the lease has left as etcd says (-1: it expired)."""
        resp = await self.call(
            "Lease.TimeToLive",
            lambda t: self.lease.LeaseTimeToLive(pb.LeaseTimeToLiveRequest(ID=lease_id), metadata=self.metadata,
                                                 timeout=t),
        )
        return int(resp.TTL)

    async def keepalive_lease_once(self, lease_id: int, timeout: float) -> int:
        """One keepalive round trip, not retried (the caller's loop is the retry); the TTL etcd answers with
        (<= 0: the lease is gone). ``TimeoutError`` when the stream closes without an answer."""

        async def requests() -> AsyncIterator[pb.LeaseKeepAliveRequest]:
            yield pb.LeaseKeepAliveRequest(ID=lease_id)

        call = self.lease.LeaseKeepAlive(requests(), metadata=self.metadata, timeout=timeout)
        try:
            async for resp in call:
                return int(resp.TTL)
            raise TimeoutError("lease keepalive stream closed without an answer")
        finally:
            call.cancel()

    async def revoke_lease(self, lease_id: int, *, operation: str = "Lease.Revoke", deadline: float | None = None
                           ) -> None:
        """End the lease now: every key attached to it is deleted."""
        await self.call(
            operation,
            lambda t: self.lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=lease_id), metadata=self.metadata, timeout=t),
            deadline=deadline,
        )


def _is_auth_expired(exc: BaseException) -> bool:
    """Worth one new login (callers check that credentials are configured).

    Besides an expired token, etcd says "user name is empty" when we hold no
    token (auth was enabled after we connected) and "revision of auth store is
    old" when a JWT predates a change of users or roles; etcd's Go client
    logs in again on both.
    """
    if isinstance(exc, EtcdUnauthenticatedError):
        return True
    details = (exc.details() or "") if isinstance(exc, grpc.aio.AioRpcError) else ""
    return isinstance(exc, grpc.aio.AioRpcError) and (
        exc.code() == grpc.StatusCode.UNAUTHENTICATED
        or "invalid auth token" in details
        or "user name is empty" in details
        or "revision of auth store is old" in details
    )


async def _open(config: EtcdConfig) -> EtcdClient:
    client = EtcdClient(config)
    try:
        await client.connect()
        await client.call("Maintenance.Status", lambda t: client.raw.maintenance.status(timeout=t))  # type: ignore[union-attr]
    except BaseException:
        await client.close()
        raise
    return client


async def connect(config: EtcdConfig, *, wait: bool = False) -> EtcdClient:
    """Open a client; fails with ``MetaUnavailable`` if etcd does not answer in time.

    ``wait``: keep trying until etcd answers instead (a server started before
    its etcd); the first failed attempt logs that etcd is unreachable, at once.
    Without it, and with ``config.refused_is_final``, ``MetaRefused`` comes at
    once when every endpoint refuses the TCP connection (``meta.reach``).
    """
    if not wait and config.refused_is_final:
        started = time.monotonic()
        refused = await refusals(config.endpoints, timeout=min(1.0, config.call_timeout))
        if refused is not None:
            raise MetaRefused(refused, "connect", time.monotonic() - started)
    while True:
        try:
            return await _open(config)
        except MetaUnavailable:
            if not wait:
                raise
