"""The principals file: bearer tokens and client certificate names, each with its principal and role, re-read when
it changes (``Authenticator``; the file's format is in ``querycoord.security.auth``'s docstring)."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import re
import time
import tomllib
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from loguru import logger

from querycoord.common.limits import INT64_MAX
from querycoord.common.metrics import AUTH_CONFIG_STALE, AUTH_RELOAD_ERRORS
from querycoord.security.auth_rules import Principal, Refused, Role


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


def _short(method: str) -> str:
    """``/querycoord.query.QueryCoord/LoadCollection`` -> ``QueryCoord/LoadCollection``."""
    service, _, name = method.strip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"
