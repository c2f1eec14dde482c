"""Sessions: a process announces its role and address under a lease, and learns when it lost them.

A session key ``session/<role>-<server_id>`` holds JSON ``{ServerID,
ServerName, Address, Extra}`` (the shape Milvus uses) and lives only as long
as the session's lease. The lease is kept alive every TTL/3. The session is
*lost* (``Session.lost`` set) when etcd says the lease expired, when no
keepalive has succeeded for a whole TTL (etcd may have expired it without us
hearing), or when the key is deleted. A lost session is never revived: its
owner stops what depended on it and starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from meta.client import is_transient
from meta.errors import MetaError
from meta.idalloc import IdAllocator
from meta.kv import MetaKV
from meta.log import logger
from meta.loops import keep_running
from meta.txn import KeyValue, TxnResult, absent, get, put
from meta.watch import EventType, Resync, watch_prefix

SESSION_PREFIX = "session/"
SERVER_ID_KEY = "idalloc/server-id"
DEFAULT_TTL = 10.0
MIN_TTL = 2.0
_ROLE = re.compile(r"^[a-z0-9_]+$")


@dataclass(frozen=True)
class SessionInfo:
    server_id: int
    role: str
    address: str
    extra: dict[str, Any] = field(default_factory=dict)
    # The create revision of the session key when it was read from etcd (0: not read from etcd). Each
    # registration creates the key anew, so two incarnations of a fixed server id never share it: a watcher tells
    # a restarted process from the one it knew by this, not by the id.
    created: int = field(default=0, compare=False)

    @property
    def key(self) -> str:
        return session_key(self.role, self.server_id)

    def to_json(self) -> bytes:
        return json.dumps(
            {"ServerID": self.server_id, "ServerName": self.role, "Address": self.address, "Extra": self.extra},
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> SessionInfo:
        """The session a value holds; ``ValueError`` saying what is wrong with anything else.

        Strict, because the value is input: whoever can write under the prefix can put anything there. The
        id must be a positive int64 (not a string, float or bool), the role a plain word, the address a short
        printable token, the extra an object.
        """
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise ValueError(f"not a JSON object but {type(d).__name__}")
        sid = d.get("ServerID")
        if isinstance(sid, bool) or not isinstance(sid, int) or not 0 < sid <= _INT64_MAX:
            raise ValueError(f"ServerID {_short(sid)} is not a positive 64-bit integer")
        role = d.get("ServerName")
        if not isinstance(role, str) or not _ROLE.match(role):
            raise ValueError(f"ServerName {_short(role)} is not a role ([a-z0-9_]+)")
        address = d.get("Address")
        if not isinstance(address, str) or len(address) > MAX_ADDRESS_LENGTH or not (
                address.isprintable() and not any(c.isspace() for c in address)):
            raise ValueError(f"Address {_short(address)} is not an address (printable, at most "
                             f"{MAX_ADDRESS_LENGTH} characters, no spaces)")
        extra = d.get("Extra") or {}
        if not isinstance(extra, dict):
            raise ValueError(f"Extra {_short(extra)} is not a JSON object")
        return cls(sid, role, address, extra)

    @classmethod
    def parse(cls, key: str, raw: bytes) -> SessionInfo | None:
        """``from_json`` of the value at ``key``, or None for a value that is not the session its key names:
        one bad value must never stop a watcher. Logged in one short line, once per key and value."""
        try:
            if len(raw) > MAX_SESSION_VALUE_BYTES:  # never parsed: a node could make every watcher chew on MiBs
                raise ValueError(f"{len(raw)} bytes, more than {MAX_SESSION_VALUE_BYTES}")
            info = cls.from_json(raw)
            if not key.endswith(info.key):  # session/<role>-<id>: a value claiming another key's identity
                raise ValueError(f"it claims to be {info.key}")
            return info
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
            _report_invalid(key, raw, exc)
            return None


# How long past its TTL a lease that nobody renews may take to expire before a fixed id counts as taken.
_HOLDER_EXPIRY_SLACK = 30.0
# A session value is input: these bound what is accepted (see ``SessionInfo.from_json``).
MAX_ADDRESS_LENGTH = 1024
# A session value is about 200 bytes; one larger than this is not parsed (``meta.session_guard`` fences it).
MAX_SESSION_VALUE_BYTES = 64 * 1024
_INT64_MAX = (1 << 63) - 1
# Keys whose bad value was already logged (key -> hash of the value), so a watcher that re-reads a snapshot does
# not log the same garbage again; bounded, cleared when full.
_reported: dict[str, int] = {}
_MAX_REPORTED = 1024


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _report_invalid(key: str, raw: bytes, exc: BaseException) -> None:
    digest = hash(raw)
    if _reported.get(key) == digest:
        return
    if len(_reported) >= _MAX_REPORTED:
        _reported.clear()
    _reported[key] = digest
    reason = str(exc) if not isinstance(exc, RecursionError) else "nested too deeply"
    shown_key = key if len(key) <= 100 else key[:100] + "..."
    logger.warning("session key {} ignored: not a valid session value ({}: {})", shown_key, type(exc).__name__,
                   reason[:120])


def check_role(role: str) -> str:
    """Roles are plain words: ``session/<role>-`` must never be a prefix of another role's keys."""
    if not _ROLE.match(role):
        raise ValueError(f"session role {role!r} must match [a-z0-9_]+")
    return role


def session_key(role: str, server_id: int) -> str:
    return f"{SESSION_PREFIX}{check_role(role)}-{server_id}"


def role_prefix(role: str) -> str:
    return f"{SESSION_PREFIX}{check_role(role)}-"


class SessionError(MetaError):
    """A session could not be registered (e.g. its key exists already)."""


class SessionIdTaken(SessionError):
    """A fixed server id is held by a live session: another process runs with the same id."""


def check_server_id(server_id: int) -> int:
    """A fixed server id is a positive int64 (ids end up in protobuf int64 fields)."""
    if isinstance(server_id, bool) or not isinstance(server_id, int) or not 1 <= server_id <= 2**63 - 1:
        raise ValueError(f"server id must be a positive 64-bit integer, got {server_id!r}")
    return server_id


class Session:
    """A registered role and address under a lease (see module docstring)."""

    def __init__(
        self,
        kv: MetaKV,
        role: str,
        address: str,
        *,
        ttl: float = DEFAULT_TTL,
        extra: dict[str, Any] | None = None,
        server_id: int | None = None,
        private_lease: bool = False,
    ):
        """``server_id``: register under this fixed id instead of allocating one from ``SERVER_ID_KEY`` (a node
        whose etcd role may write only its own session key cannot write the shared counter).

        ``private_lease``: also keep a second lease, ``campaign_lease_id``, that no key others read carries: etcd
        returns a key's lease id on every read and lets anyone renew a lease whose id they know, so a candidate
        whose election key shared the session key's lease could be kept leading after death by whoever may read
        its session. Losing either lease loses the session."""
        if ttl < MIN_TTL:
            raise ValueError(f"session TTL must be at least {MIN_TTL:g}s, got {ttl:g}s")
        self.kv = kv
        self.role = check_role(role)
        self.address = address
        # etcd leases are whole seconds.
        self.ttl = math.ceil(ttl)
        self.extra = dict(extra or {})
        self.fixed_id = None if server_id is None else check_server_id(server_id)
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self.lease_id = 0
        self.private_lease = private_lease
        self.private_lease_id = 0
        self.info: SessionInfo | None = None
        self.create_revision = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._last_keepalive = 0.0

    @property
    def campaign_lease_id(self) -> int:
        """The lease an election key of this session carries: the private one if the session keeps one."""
        return self.private_lease_id if self.private_lease else self.lease_id

    @property
    def server_id(self) -> int:
        if self.info is None:
            raise RuntimeError("session not started")
        return self.info.server_id

    async def start(self) -> SessionInfo:
        """Take a ServerID (or the fixed one), grant the lease, write the key if absent, and start keepalive and
        the key watch.

        A fixed id whose key another session holds is waited for while that session's lease runs down: a node
        restarted under its id finds its dead predecessor's session there until etcd expires it (late, on a
        loaded machine). A live holder renews its lease, which shows as its TTL going back up:
        ``SessionIdTaken`` then, within a third of the holder's TTL.
        """
        if self.fixed_id is not None:
            server_id = self.fixed_id
        else:
            server_id = (await IdAllocator(self.kv, SERVER_ID_KEY, block_size=1).allocate(1))[0]
        info = SessionInfo(server_id, self.role, self.address, self.extra)
        held: tuple[int, float, float] | None = None  # the holder's lease, its TTL when first seen, and when
        while True:
            result = await self._register_once(info)
            if result.succeeded:
                break
            if self.fixed_id is None:
                raise SessionError(
                    f"session key {info.key} already exists; ServerID counter {SERVER_ID_KEY} was reset?")
            holder = result.responses[0] if result.responses else None
            lease = holder.lease if holder is not None else 0
            if holder is not None and not lease:
                raise SessionIdTaken(self._taken_message(info, holder))
            if lease:
                ttl = await self._holder_ttl(lease)
                now = time.monotonic()
                if held is None or held[0] != lease:
                    held = (lease, ttl, now)
                    logger.info("session {} is held by another lease ({:.0f}s left); waiting for it to expire "
                                "(the session of a node restarted under this id) unless its holder renews it",
                                info.key, ttl)
                else:
                    expected = held[1] - (now - held[2])
                    # Renewed (its TTL went back up): a live process holds this id. Not renewed, the lease expires,
                    # however late etcd gets to it on a loaded machine; a bound keeps a stuck etcd from hanging us.
                    if ttl > expected + 1.5 or now - held[2] > held[1] + _HOLDER_EXPIRY_SLACK:
                        raise SessionIdTaken(self._taken_message(info, holder))
            await asyncio.sleep(0.5)
        self.create_revision = result.revision
        self.info = info
        if self.private_lease:
            try:
                self.private_lease_id = await self._grant("Lease.Grant (private)")
            except BaseException:
                await self._revoke()
                raise
        self._tasks = [
            asyncio.create_task(self._guarded("session keepalive", self._keepalive),
                                name=f"session-keepalive-{info.key}"),
            asyncio.create_task(self._guarded("session watch", self._watch_key), name=f"session-watch-{info.key}"),
        ]
        logger.info("session {} registered (lease {:x}, ttl {}s, address {})", info.key, self.lease_id, self.ttl,
                    self.address)
        return info

    async def _guarded(self, loop: str, body: Callable[[], Awaitable[None]]) -> None:
        """``body`` run again whatever it raises (``meta.loops``: a keepalive loop that died would leave a session
        this process believes alive while its lease expires); a closed client ends the session."""
        await keep_running(loop, body, client=self.kv.client, first_pause=0.1, max_pause=1.0)
        if self.kv.client.closed:
            self._mark_lost("the etcd client was closed")

    async def _register_once(self, info: SessionInfo) -> TxnResult:
        """Grant a lease and create the key under it if absent (else read who holds it); a failed attempt revokes
        its lease."""
        self.lease_id = await self._grant("Lease.Grant")
        self._last_keepalive = time.monotonic()
        key = info.key
        try:
            result = await self.kv.txn([absent(key)], [put(key, info.to_json(), self.lease_id)],
                                       on_failure_ops=[get(key)], operation=f"register session {key}")
        except BaseException:
            await self._revoke()  # e.g. a user without permission on the key: leave no lease behind
            raise
        if not result.succeeded:
            await self._revoke()
        return result

    async def _grant(self, operation: str) -> int:
        return await self.kv.client.grant_lease(self.ttl, operation)

    async def _holder_ttl(self, lease_id: int) -> float:
        """Seconds the lease holding our key has left (our own TTL if etcd does not say)."""
        try:
            ttl = await self.kv.client.lease_time_to_live(lease_id)
        except MetaError:
            return float(self.ttl)
        return float(max(ttl, 0))

    def _taken_message(self, info: SessionInfo, kv: KeyValue | None) -> str:
        """Who holds the fixed id (its address, from the failed txn's read), and what to do."""
        holder = ""
        if kv is not None:
            other = SessionInfo.parse(info.key, kv.value)
            holder = f" (at {other.address})" if other is not None else ""
            if kv.lease == 0:
                holder += ", a key without a lease: delete it by hand"
        return (f"server id {info.server_id} is taken: a live {self.role} session {info.key} exists{holder}; "
                f"another {self.role} runs with this id: give each one its own id")

    def _mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            level = "INFO" if reason == "closed" else "WARNING"
            logger.log(level, "session {} ended: {}", self.info.key if self.info else "?", reason)

    async def _keepalive_once(self, timeout: float) -> int:
        """One keepalive round trip of each lease; the lowest TTL etcd reports (<= 0: a lease is gone)."""
        ttl = await self._keepalive_lease(self.lease_id, timeout)
        if self.private_lease_id and ttl > 0:
            ttl = min(ttl, await self._keepalive_lease(self.private_lease_id, timeout))
        return ttl

    async def _keepalive_lease(self, lease_id: int, timeout: float) -> int:
        return await self.kv.client.keepalive_lease_once(lease_id, timeout)

    async def _keepalive(self) -> None:
        interval = self.ttl / 3
        while not self.lost.is_set():
            # A process paused (SIGSTOP, GC, swap) past its TTL must not trust a lease etcd may have expired.
            silent = time.monotonic() - self._last_keepalive
            if silent > self.ttl:
                self._mark_lost(f"no keepalive succeeded for {silent:.1f}s (TTL {self.ttl}s)")
                return
            try:
                ttl = await self._keepalive_once(timeout=max(0.2, min(interval, self.ttl - silent)))
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                if not is_transient(exc):
                    self._mark_lost(f"keepalive failed: {exc}")
                    return
                await asyncio.sleep(min(0.25, interval))
                continue
            if ttl <= 0:
                self._mark_lost("etcd expired the lease")
                return
            self._last_keepalive = time.monotonic()
            await asyncio.sleep(interval)

    async def _watch_key(self) -> None:
        assert self.info is not None
        key = self.info.key
        try:
            async for item in watch_prefix(self.kv, key, self.create_revision + 1, reconnect_deadline=None,
                                           exact=True):
                if isinstance(item, Resync):
                    if key not in item.snapshot.as_dict():
                        self._mark_lost("session key deleted")
                        return
                    continue
                if any(e.key == key and e.type is EventType.DELETE for e in item.events):
                    self._mark_lost("session key deleted")
                    return
        except MetaError as exc:
            self._mark_lost(f"session key watch failed: {exc}")

    async def _revoke(self) -> None:
        client = self.kv.client
        for lease_id in (self.private_lease_id, self.lease_id):
            if not lease_id:
                continue
            with contextlib.suppress(Exception):
                await client.revoke_lease(lease_id, deadline=2.0)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop keepalive; with ``revoke`` the key disappears at once instead of after the TTL."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        if revoke and self.lease_id:
            await self._revoke()
        self._mark_lost("closed")

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@dataclass(frozen=True)
class SessionSnapshot:
    """Every live session of a role at ``revision`` (replaces what the watcher knew)."""

    sessions: dict[int, SessionInfo]
    revision: int


@dataclass(frozen=True)
class SessionEvent:
    type: EventType  # PUT: a session appeared; DELETE: it is gone
    info: SessionInfo
    revision: int


async def list_sessions(kv: MetaKV, role: str) -> SessionSnapshot:
    snap = await kv.load_prefix(role_prefix(role))
    sessions = {}
    for item in snap.kvs:
        info = SessionInfo.parse(item.key, item.value)
        if info is not None:
            sessions[info.server_id] = dataclasses.replace(info, created=item.create_revision)
    return SessionSnapshot(sessions, snap.revision)


async def watch_sessions(
    kv: MetaKV, role: str, *, reconnect_deadline: float | None = 60.0
) -> AsyncIterator[SessionSnapshot | SessionEvent]:
    """The current sessions of ``role`` with their revision, then each add and delete.

    After a compaction a fresh ``SessionSnapshot`` is yielded: the consumer
    diffs it against what it knew (sessions missing from it were deleted).
    """
    prefix = role_prefix(role)
    snap = await list_sessions(kv, role)
    known = {info.key: info for info in snap.sessions.values()}
    yield snap
    async for item in watch_prefix(kv, prefix, snap.revision + 1, reconnect_deadline=reconnect_deadline):
        if isinstance(item, Resync):
            infos = [dataclasses.replace(i, created=x.create_revision) for x in item.snapshot.kvs
                     if (i := SessionInfo.parse(x.key, x.value)) is not None]
            known = {info.key: info for info in infos}
            yield SessionSnapshot({i.server_id: i for i in infos}, item.revision)
            continue
        for e in item.events:
            if e.type is EventType.PUT:
                parsed = SessionInfo.parse(e.key, e.value)
                if parsed is None:
                    continue
                info = dataclasses.replace(parsed, created=e.create_revision)
                known[e.key] = info
                yield SessionEvent(EventType.PUT, info, e.mod_revision)
            else:
                gone = known.pop(e.key, None)
                if gone is not None:
                    yield SessionEvent(EventType.DELETE, gone, e.mod_revision)
