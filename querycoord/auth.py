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

import contextlib
import contextvars
import enum
import hashlib
import inspect
import ipaddress
import os
import re
import time
import tomllib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from loguru import logger

from proto import catalog_pb2, querycoord_pb2, querynode_pb2, stream_pb2
from querycoord.limits import INT64_MAX
from querycoord.metrics import AUTH_CONFIG_STALE, AUTH_RELOAD_ERRORS


class Role(enum.StrEnum):
    ADMIN = "admin"
    READER = "reader"
    NODE = "node"
    COORDINATOR = "coordinator"


# ----- the method -> role table ---------------------------------------------------------------------------------------
OPEN: frozenset[Role] = frozenset()  # no credential needed (health)
ANYONE = frozenset(Role)  # any known principal
READ = frozenset({Role.READER, Role.ADMIN, Role.COORDINATOR})
ADMIN = frozenset({Role.ADMIN})
NODE = frozenset({Role.NODE})
COORDINATOR = frozenset({Role.COORDINATOR})

SERVICES: tuple[ServiceDescriptor, ...] = (
    querycoord_pb2.DESCRIPTOR.services_by_name["QueryCoord"],
    catalog_pb2.DESCRIPTOR.services_by_name["Catalog"],
    stream_pb2.DESCRIPTOR.services_by_name["StreamMgmt"],
    querynode_pb2.DESCRIPTOR.services_by_name["QueryNode"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
)

# Service (by its name in the .proto) -> method -> the roles that may call it.
_TABLE: dict[str, dict[str, frozenset[Role]]] = {
    "QueryCoord": {
        "ShowCollections": READ, "ShowPartitions": READ, "GetPartitionStates": READ, "GetSegmentInfo": READ,
        "GetComponentStates": READ, "ListTasks": READ, "GetTask": READ, "ShowNodes": READ,
        "GetCoordinatorState": READ, "GetReplicas": READ, "CheckHealth": READ, "Explain": READ,
        "LoadCollection": ADMIN, "ReleaseCollection": ADMIN, "LoadPartitions": ADMIN, "ReleasePartitions": ADMIN,
        "LoadBalance": ADMIN, "Switchover": ADMIN,
        "StepBack": COORDINATOR,  # only a leader asks, during a switchover
    },
    "Catalog": {
        "DescribeCollection": READ, "ShowCollections": READ, "ShowPartitions": READ, "GetRecoveryInfo": READ,
        "CreateCollection": ADMIN, "DropCollection": ADMIN, "AddSegments": ADMIN,
    },
    "StreamMgmt": {
        "ShowStreams": READ,
        "CreateStream": ADMIN, "DropStream": ADMIN, "StopStream": ADMIN, "StartStream": ADMIN,
        "CreateSnode": ADMIN, "DropSnode": ADMIN,
        "StreamHeartbeat": NODE,  # and only as the node its credential names (require_node)
    },
    "QueryNode": {
        "LoadSegments": COORDINATOR, "ReleaseSegments": COORDINATOR, "WatchDmChannels": COORDINATOR,
        "ReleaseDmChannels": COORDINATOR,
        "WatchDeltaChannels": COORDINATOR, "AddQueryChannel": COORDINATOR, "ReleaseCollection": COORDINATOR,
        "ReleasePartitions": COORDINATOR,
        "GetSegmentInfo": READ, "GetDataDistribution": READ, "GetComponentStates": READ,
    },
    "Health": {"Check": OPEN, "Watch": OPEN, "List": OPEN},
    "ServerReflection": {"ServerReflectionInfo": ANYONE},
}


def _rules() -> dict[str, frozenset[Role]]:
    """``/package.Service/Method`` -> roles, for every method of ``SERVICES`` that has a rule. A rule naming a
    method the descriptors do not have is a bug here, caught at import."""
    rules: dict[str, frozenset[Role]] = {}
    for service in SERVICES:
        table = _TABLE.get(service.name, {})
        methods = {m.name for m in service.methods}
        unknown = set(table) - methods
        if unknown:
            raise RuntimeError(f"access rules for methods {service.full_name} does not have: {sorted(unknown)}")
        for name, roles in table.items():
            rules[f"/{service.full_name}/{name}"] = roles
    return rules


RULES: Mapping[str, frozenset[Role]] = _rules()


def missing_rules() -> list[str]:
    """RPCs of the served services without an access rule (each is refused to everyone until it gets one)."""
    return [f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods if f"/{s.full_name}/{m.name}" not in RULES]


# ----- principals -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Principal:
    """Who calls: ``name`` (from the principals file), its ``role``, its node id (``node`` role), and how it was
    recognised (``token`` or ``certificate``)."""

    name: str
    role: Role
    node_id: int | None = None
    via: str = "token"

    def __str__(self) -> str:
        node = f", node {self.node_id}" if self.node_id is not None else ""
        return f"{self.name} ({self.role}{node}, by {self.via})"


class Refused(Exception):
    """A call not admitted: ``code`` is UNAUTHENTICATED or PERMISSION_DENIED; the message says why (no secret)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class _CertRule:
    pattern: re.Pattern[str]
    principal: str
    role: Role
    node_id: int | None


def token_digest(token: str) -> str:
    """The SHA-256 (hex) by which a principals file knows a token."""
    return hashlib.sha256(token.encode()).hexdigest()


class PrincipalsError(ValueError):
    """A principals file that cannot be used; the message names the file, the line and the entry."""


# A principals or token file larger than this is refused rather than read (a token file pointed at a device or a
# log must not make a reload read without end).
MAX_FILE_BYTES = 1 << 20


class _Reader:
    """Reads the files a principals table is made of, bounded, and keeps a digest of exactly what it read (or
    failed to read), in order: the same files read again give the same digest iff nothing changed."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self._hash = hashlib.sha256()

    def read(self, path: Path) -> bytes:
        """The file's bytes; ``OSError`` (recorded in the digest too) when unreadable."""
        self.files.append(path)
        self._hash.update(os.fsencode(path) + b"\0")
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            self._hash.update(f"error {exc.errno}\0".encode())
            raise
        self._hash.update(f"{len(data)}\0".encode() + data)
        return data

    @property
    def digest(self) -> bytes:
        return self._hash.digest()


def _fingerprint(files: Iterable[Path]) -> bytes:
    """The digest ``_Reader`` would have after reading ``files`` (unreadable ones included)."""
    reader = _Reader()
    for path in files:
        with contextlib.suppress(OSError):
            reader.read(path)
    return reader.digest


@dataclass(frozen=True)
class _Table:
    """The credentials of one reading of a principals file, and what it was read from."""

    tokens: dict[str, Principal]
    certs: list[_CertRule]
    files: tuple[Path, ...]
    fingerprint: bytes


def _text(reader: _Reader, path: Path, what: str) -> str:
    try:
        data = reader.read(path)
    except OSError as exc:
        raise PrincipalsError(f"{what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise PrincipalsError(f"{what} {path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise PrincipalsError(f"{what} {path} is not UTF-8 text (byte {exc.start})") from None


def _header_lines(text: str, table: str) -> list[int]:
    """The line of each ``[[table]]`` header, in order (the n-th entry's line when the file uses headers)."""
    pattern = re.compile(r'^[ \t]*\[\[[ \t]*"?' + re.escape(table) + r'"?[ \t]*\]\]', re.MULTILINE)
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def _key_line(text: str, key: str) -> int | None:
    """The first line that opens table ``key`` or sets it (``[key]``, ``[[key]]``, ``key = ...``)."""
    pattern = re.compile(r'^[ \t]*(\[+[ \t]*"?' + re.escape(key) + r'"?[ \t]*[\].]|"?' + re.escape(key)
                         + r'"?[ \t]*=)', re.MULTILINE)
    m = pattern.search(text)
    return None if m is None else text.count("\n", 0, m.start()) + 1


def _at(path: Path, line: int | None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def _parse(path: Path, reader: _Reader | None = None) -> _Table:
    """The principals file at ``path``; ``PrincipalsError`` names the file, the line and what is wrong, whatever
    the file holds (never another exception: a malformed file is refused, not a traceback at the next call).
    ``reader`` records the files read, also when it fails (a reload watches them)."""
    reader = reader or _Reader()
    text = _text(reader, path, "--auth-tokens-file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"at line (\d+)", str(exc))
        raise PrincipalsError(f"{_at(path, int(m.group(1)) if m else None)}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"token", "certificate"})
    if unknown:
        raise PrincipalsError(f"{_at(path, _key_line(text, unknown[0]))}: unknown tables {unknown} (known: "
                              "[[token]], [[certificate]])")
    entries: dict[str, list[Any]] = {}
    for table in ("token", "certificate"):
        value = data.get(table, [])
        if not isinstance(value, list):
            raise PrincipalsError(f"{_at(path, _key_line(text, table))}: {table} must be [[{table}]] tables, got "
                                  f"{type(value).__name__}")
        entries[table] = value

    def where(table: str, i: int) -> str:
        lines = _header_lines(text, table)
        line = lines[i] if len(lines) == len(entries[table]) else _key_line(text, table)
        return f"{_at(path, line)}: [[{table}]] #{i + 1}"

    tokens: dict[str, Principal] = {}
    certs: list[_CertRule] = []
    for i, entry in enumerate(entries["token"]):
        at = where("token", i)
        principal, role, node_id = _common(entry, at, {"principal", "role", "node_id", "sha256", "token_file"})
        digest = entry.get("sha256")
        if "token_file" in entry:
            name = entry["token_file"]
            if not isinstance(name, str) or not name:
                raise PrincipalsError(f"{at}: token_file must name a file, got {name!r}")
            secret = _text(reader, Path(name), f"{at}: token_file").strip()
            if not secret:
                raise PrincipalsError(f"{at}: token_file {name} is empty")
            digest = token_digest(secret)
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            raise PrincipalsError(f"{at}: give sha256 (64 hex digits of the token's SHA-256) or token_file")
        tokens[digest.lower()] = Principal(principal, role, node_id, "token")
    for i, entry in enumerate(entries["certificate"]):
        at = where("certificate", i)
        if not isinstance(entry, dict):
            raise PrincipalsError(f"{at}: expected a table")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise PrincipalsError(f"{at}: name (the certificate's common name or DNS name) is required")
        if name.count("{node_id}") > 1:
            raise PrincipalsError(f"{at}: name may hold {{node_id}} once, got {name!r}")
        entry = {"principal": name, **entry}
        principal, role, node_id = _common(entry, at, {"name", "principal", "role", "node_id"},
                                           node_id_in_name="{node_id}" in name)
        regex = re.escape(name).replace(re.escape("{node_id}"), r"(?P<node_id>[1-9][0-9]{0,17})")
        certs.append(_CertRule(re.compile(regex), principal, role, node_id))
    return _Table(tokens, certs, tuple(reader.files), reader.digest)


def _common(entry: Any, where: str, keys: set[str], *,
            node_id_in_name: bool = False) -> tuple[str, Role, int | None]:
    if not isinstance(entry, dict):
        raise PrincipalsError(f"{where}: expected a table")
    extra = set(entry) - keys
    if extra:
        raise PrincipalsError(f"{where}: unknown keys {sorted(extra)} (known: {', '.join(sorted(keys))})")
    principal = entry.get("principal")
    if not isinstance(principal, str) or not principal:
        raise PrincipalsError(f"{where}: principal (a name for the logs) is required")
    try:
        role = Role(str(entry.get("role")))
    except ValueError:
        raise PrincipalsError(f"{where}: role must be one of {', '.join(r.value for r in Role)}, "
                              f"got {entry.get('role')!r}") from None
    node_id = entry.get("node_id")
    if node_id is not None and (not isinstance(node_id, int) or isinstance(node_id, bool)
                                or not 0 < node_id <= INT64_MAX):
        raise PrincipalsError(f"{where}: node_id must be a positive integer, got {node_id!r}")
    if role is Role.NODE and node_id is None and not node_id_in_name:
        raise PrincipalsError(f"{where}: a node principal names its node: node_id = N (or {{node_id}} in the "
                              "certificate name)")
    if role is not Role.NODE and (node_id is not None or node_id_in_name):
        raise PrincipalsError(f"{where}: only a node principal has a node_id")
    return principal, role, node_id


# Authenticators whose table in force is older than their files (the last reload failed): the stale gauge.
_stale: weakref.WeakSet[Authenticator] = weakref.WeakSet()
AUTH_CONFIG_STALE.set_function(lambda: len(_stale))


class Authenticator:
    """The credentials a server accepts, from a principals file (see module docstring).

    Every ``RELOAD_INTERVAL`` seconds (looked at when a call comes) the
    principals file and every token file it names are read again and compared
    with what the table in force was made of (a digest of their bytes, not
    their times: a token file rewritten within the same clock tick counts). A
    change is parsed; a file that no longer parses leaves the previous table in
    force, is logged once as an error naming the file and line, counted
    (``querycoord_auth_reload_errors_total``) and shown stale
    (``querycoord_auth_config_stale``) until a reading succeeds.
    """

    RELOAD_INTERVAL = 1.0

    def __init__(self, path: Path):
        self.path = path
        table = _parse(path)
        self._tokens, self._certs = table.tokens, table.certs
        self._watched: tuple[Path, ...] = table.files
        self._seen = table.fingerprint
        self._checked = time.monotonic()

    @classmethod
    def load(cls, path: Path) -> Authenticator:
        return cls(path)

    @property
    def stale(self) -> bool:
        """Whether the table in force is older than the files (their last change could not be used)."""
        return self in _stale

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.RELOAD_INTERVAL:
            return
        self._checked = now
        if _fingerprint(self._watched) == self._seen:
            return
        reader = _Reader()
        try:
            table = _parse(self.path, reader)
        except Exception as exc:  # PrincipalsError; anything else is a bug here, and must not fail the call either
            self._watched, self._seen = tuple(reader.files), reader.digest
            _stale.add(self)
            AUTH_RELOAD_ERRORS.inc()
            reason = str(exc) if isinstance(exc, PrincipalsError) else f"{self.path}: {type(exc).__name__}: {exc}"
            logger.error("principals file {} changed but cannot be used; the previous table stays in force: {}",
                         self.path, reason)
            return
        self._tokens, self._certs = table.tokens, table.certs
        self._watched, self._seen = table.files, table.fingerprint
        _stale.discard(self)
        logger.info("principals file {} re-read: {} tokens, {} certificate names", self.path, len(self._tokens),
                    len(self._certs))

    def identify(self, metadata: Iterable[tuple[str, Any]],
                 auth_context: Callable[[], Mapping[str, Iterable[bytes]]]) -> Principal:
        """The caller's principal; ``Refused(UNAUTHENTICATED)`` when it has no known credential. ``auth_context``
        (the TLS peer's properties) is asked only when no token was sent."""
        self._maybe_reload()
        header = [v for k, v in metadata if k == "authorization"]
        if header:
            value = header[0] if isinstance(header[0], str) else header[0].decode(errors="replace")
            scheme, _, token = value.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Refused(grpc.StatusCode.UNAUTHENTICATED,
                              "the authorization metadata is not 'Bearer <token>'")
            found = self._tokens.get(token_digest(token.strip()))
            if found is None:
                raise Refused(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not known to this server")
            return found
        names = certificate_names(auth_context())
        for name in names:
            for rule in self._certs:
                m = rule.pattern.fullmatch(name)
                if m is not None:
                    node_id = int(m.group("node_id")) if "node_id" in m.groupdict() else rule.node_id
                    return Principal(rule.principal.replace("{node_id}", str(node_id)), rule.role, node_id,
                                     "certificate")
        if names:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED,
                          f"the client certificate ({', '.join(sorted(set(names)))}) names no known principal")
        raise Refused(grpc.StatusCode.UNAUTHENTICATED,
                      "no credential: send 'authorization: Bearer <token>' metadata or a client certificate")


def _is_dns_name(name: str) -> bool:
    """A DNS name, not an IP address, URI or e-mail address (gRPC lists every SAN kind under one property)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return bool(name) and not any(c in name for c in ":/@")
    return False


def certificate_names(peer: Mapping[str, Iterable[bytes]]) -> list[str]:
    """The names a client certificate is known by: its common name and its DNS subject alternative names only.
    An IP address is where a certificate may be used, not who holds it: a file naming ``10.0.0.5`` would
    otherwise admit every certificate issued for that host, whatever its common name."""
    common = [n.decode(errors="replace") for n in peer.get("x509_common_name", ())]
    sans = [n.decode(errors="replace") for n in peer.get("x509_subject_alternative_name", ())]
    return common + [n for n in sans if _is_dns_name(n)]


def authorize(principal: Principal, method: str) -> None:
    """``Refused(PERMISSION_DENIED)`` unless ``principal``'s role may call ``method`` (``/pkg.Service/Method``)."""
    roles = RULES.get(method)
    if roles is None:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{_short(method)} has no access rule: refused to all")
    if roles and principal.role not in roles:
        needs = " or ".join(sorted(r.value for r in roles))
        raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                      f"{principal.name} (role {principal.role}) may not call {_short(method)}: it needs {needs}")


def _short(method: str) -> str:
    """``/querycoord.query.QueryCoord/LoadCollection`` -> ``QueryCoord/LoadCollection``."""
    service, _, name = method.strip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"


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
    logger.warning("{} refused {} from {}: {}", code.name, _short(method) if method.startswith("/") else method,
                   peer, reason)


Behaviour = Callable[..., Any]


class SecurityInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every method handler of a server: authenticate and authorize (with an ``Authenticator``), then decode
    the request itself, so undecodable bytes are INVALID_ARGUMENT with one short log line, not UNKNOWN and a
    traceback (see module docstring)."""

    def __init__(self, authenticator: Authenticator | None):
        self.authenticator = authenticator
        # method -> (the service's handler, its wrapped copy): wrapped once, not on every call.
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None  # an unknown method: gRPC answers UNIMPLEMENTED
        method: str = details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, method: str, handler: Any) -> Any:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary, handler.request_deserializer),
                request_deserializer=None, response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary(method, handler.unary_stream, handler.request_deserializer),
                request_deserializer=None, response_serializer=handler.response_serializer)
        # Streaming requests (reflection): admitted here, decoded by gRPC.
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(method, handler.stream_unary, None),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            self._unary(method, handler.stream_stream, None),
            request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)

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
                           _short(method), context.peer(), len(raw), type(exc).__name__)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request does not decode as {_short(method)}'s request message")
            raise  # not reached

    def _unary(self, method: str, behaviour: Behaviour, deserializer: Callable[[bytes], Any] | None) -> Behaviour:
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
