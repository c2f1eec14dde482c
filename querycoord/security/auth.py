"""Who may call what: principals from bearer tokens or client certificates, roles, one method->role table, and the
server interceptor that enforces them (and refuses undecodable requests).

**Principals.** A server configured with a principals file
(``--auth-tokens-file``, TOML) knows two kinds of credential:

* ``[[token]]``: a bearer token, sent as ``authorization: Bearer <token>``
  metadata, known by its SHA-256 (``sha256 = "<hex>"``) or by a file holding
  it (``token_file = "/etc/querycoord/tokens/x"``); the file of principals
  never has to hold a secret itself.
* ``[[certificate]]``: a client certificate (mutual TLS) whose common name or
  a DNS subject alternative name is ``name``; ``{node_id}`` in the name
  (``streamnode-{node_id}``) reads the node's id from the certificate.

Each names a ``principal`` and its ``role``; a ``node`` principal also its
``node_id``. A token, when sent, decides (a wrong one is refused even with a
good certificate); otherwise the certificate does. The file and the token
files it names are re-read when any of them changes (looked at once a
second at most), so a token is added, rotated or revoked without a restart;
a change that cannot be used keeps the previous table in force, logs one
error naming the file and line and sets a metric (``Authenticator``). A
malformed file is always a ``PrincipalsError`` naming the file and line:
refused at start, never a traceback at the next call.

**Roles** (``RULES``, one table for every service, keyed by the services'
descriptors): ``admin`` may mutate (load, release, create, drop, balance,
switchover, stream DDL); ``reader`` may show, list, get and ask states;
``node`` may send heartbeats (and only as itself: ``require_node``);
``coordinator`` is what coordinators present to query nodes (whose mutations
only a coordinator may send) and to each other (``StepBack``, asked by a
leader during a switchover). ``admin`` and ``coordinator`` may read too. The
gRPC health service is open to all (probes; Kubernetes uses the HTTP
``/healthz``, but load balancers may use gRPC health); reflection needs any
known principal. A method without a rule is refused (fail closed), and
``missing_rules`` (checked by a test) lists RPCs of the served services
that have none.

**Answers.** No or unknown credential: UNAUTHENTICATED; a known principal
whose role the method does not allow: PERMISSION_DENIED. Bytes that do not
decode as the method's request: INVALID_ARGUMENT, with one short log line
(never a traceback): the interceptor takes decoding out of gRPC's hands and
does it itself. Refusals are logged (rate limited) by principal and method,
never with a token.
"""

from __future__ import annotations

import contextvars
import inspect
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from loguru import logger

from querycoord.security.auth_principals import Authenticator, PrincipalsError, certificate_names, token_digest
from querycoord.security.auth_rules import (
    ADMIN,
    ANYONE,
    COORDINATOR,
    NODE,
    OPEN,
    READ,
    RULES,
    SERVICES,
    Principal,
    Refused,
    Role,
    authorize,
    missing_rules,
    short_method,
)
from querycoord.security.grpc_intercept import Behaviour, WrappingInterceptor

# ----- the caller of the call being served ----------------------------------------------------------------------------
_CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("querycoord_caller", default=None)


def caller() -> Principal | None:
    """The authenticated principal of the call being served; None when the server authenticates nobody."""
    return _CALLER.get()


async def require_node(context: grpc.aio.ServicerContext, node_id: int, *, snode_id: int = 0,
                       snode_owner: Mapping[int, int] | None = None, what: str = "heartbeat") -> None:
    """A node may speak only for itself: abort PERMISSION_DENIED unless the caller's credential names ``node_id``
    and (``snode_id``) the snode is not recorded for another node. No-op when authentication is off."""
    who = _CALLER.get()
    if who is None:
        return
    reason = ""
    if who.node_id != node_id:
        reason = f"{who.name} is node {who.node_id}, not node {node_id}: a {what} is accepted only from its node"
    elif snode_id and snode_owner is not None:
        owner = snode_owner.get(snode_id)
        if owner is not None and owner != node_id:
            reason = f"{who.name} claims snode {snode_id}, which is recorded for node {owner}"
    if reason:
        _log_refusal(grpc.StatusCode.PERMISSION_DENIED, context, "node identity", reason)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)


# ----- the interceptor ------------------------------------------------------------------------------------------------
_LOG_EVERY = 5.0
_last_logged: dict[tuple[str, str], float] = {}


def _log_refusal(code: grpc.StatusCode, context: Any, method: str, reason: str) -> None:
    """One line per (code, method) at most every few seconds: a flood of refused calls does not flood the log."""
    key = (code.name, method)
    now = time.monotonic()
    if now - _last_logged.get(key, -_LOG_EVERY) < _LOG_EVERY:
        return
    _last_logged[key] = now
    peer = context.peer() if context is not None else "?"
    logger.warning("{} refused {} from {}: {}", code.name, short_method(method) if method.startswith("/") else method,
                   peer, reason)


class SecurityInterceptor(WrappingInterceptor):
    """Wraps every method handler of a server: authenticate and authorize (with an ``Authenticator``), then decode
    the request itself, so undecodable bytes are INVALID_ARGUMENT with one short log line, not UNKNOWN and a
    traceback (see module docstring)."""

    def __init__(self, authenticator: Authenticator | None):
        super().__init__()
        self.authenticator = authenticator

    def _wrap_request_stream(self, method: str, behaviour: Behaviour) -> Behaviour:
        """Streaming requests (reflection): admitted here, decoded by gRPC."""
        return self._wrap_unary(method, behaviour, None)

    async def _admit(self, method: str, context: grpc.aio.ServicerContext) -> Principal | None:
        if self.authenticator is None or RULES.get(method) == OPEN:
            return None
        try:
            principal = self.authenticator.identify(context.invocation_metadata() or (), context.auth_context)
            authorize(principal, method)
        except Refused as refused:
            _log_refusal(refused.code, context, method, str(refused))
            await context.abort(refused.code, str(refused))
            raise  # not reached: abort raises
        return principal

    async def _decode(self, method: str, raw: Any, deserializer: Callable[[bytes], Any] | None,
                      context: grpc.aio.ServicerContext) -> Any:
        if deserializer is None:
            return raw
        try:
            return deserializer(raw)
        except Exception as exc:
            logger.warning("INVALID_ARGUMENT: {} from {}: {} bytes do not decode as its request ({})",
                           short_method(method), context.peer(), len(raw), type(exc).__name__)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request does not decode as {short_method(method)}'s request message")
            raise  # not reached

    def _wrap_unary(self, method: str, behaviour: Behaviour,
                    deserializer: Callable[[bytes], Any] | None) -> Behaviour:
        """The handler's behaviour behind admission and decoding, in the same style (coroutine, async generator)."""
        if inspect.isasyncgenfunction(behaviour):
            async def stream(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                principal = await self._admit(method, context)
                request = await self._decode(method, raw, deserializer, context)
                token = _CALLER.set(principal)
                try:
                    async for item in behaviour(request, context):
                        yield item
                finally:
                    _CALLER.reset(token)

            return stream

        async def call(raw: Any, context: grpc.aio.ServicerContext) -> Any:
            principal = await self._admit(method, context)
            request = await self._decode(method, raw, deserializer, context)
            token = _CALLER.set(principal)
            try:
                result = behaviour(request, context)
                if inspect.isawaitable(result):
                    result = await result
                return result
            finally:
                _CALLER.reset(token)

        return call


__all__ = [
    "ADMIN",
    "ANYONE",
    "COORDINATOR",
    "NODE",
    "OPEN",
    "READ",
    "RULES",
    "SERVICES",
    "Authenticator",
    "Principal",
    "PrincipalsError",
    "Refused",
    "Role",
    "SecurityInterceptor",
    "authorize",
    "caller",
    "certificate_names",
    "missing_rules",
    "require_node",
    "token_digest",
]
