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
import json
import math
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from etcd3aio._protobuf import (
    Compare,
    LeaseGrantRequest,
    LeaseKeepAliveRequest,
    LeaseRevokeRequest,
    PutRequest,
    RequestOp,
    TxnRequest,
)
from loguru import logger

from meta.client import is_transient
from meta.errors import MetaError
from meta.idalloc import IdAllocator
from meta.kv import MetaKV
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
        d = json.loads(raw)
        return cls(int(d["ServerID"]), str(d["ServerName"]), str(d["Address"]), dict(d.get("Extra") or {}))

    @classmethod
    def parse(cls, key: str, raw: bytes) -> SessionInfo | None:
        """``from_json``, or None (logged) for a value that is not a session: anyone who can write under
        the prefix can put anything there, and one bad value must not stop a watcher."""
        try:
            return cls.from_json(raw)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            logger.warning("session key {} ignored: not a valid session value ({}: {})", key,
                           type(exc).__name__, exc)
            return None


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
    ):
        if ttl < MIN_TTL:
            raise ValueError(f"session TTL must be at least {MIN_TTL:g}s, got {ttl:g}s")
        self.kv = kv
        self.role = check_role(role)
        self.address = address
        # etcd leases are whole seconds.
        self.ttl = math.ceil(ttl)
        self.extra = dict(extra or {})
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self.lease_id = 0
        self.info: SessionInfo | None = None
        self.create_revision = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._last_keepalive = 0.0

    @property
    def server_id(self) -> int:
        if self.info is None:
            raise RuntimeError("session not started")
        return self.info.server_id

    async def start(self) -> SessionInfo:
        """Take a ServerID, grant the lease, write the key, and start keepalive and the key watch."""
        client = self.kv.client
        server_id = (await IdAllocator(self.kv, SERVER_ID_KEY, block_size=1).allocate(1))[0]
        lease = await client.call(
            "Lease.Grant",
            lambda t: client.lease.LeaseGrant(LeaseGrantRequest(TTL=self.ttl), metadata=client.metadata, timeout=t),
        )
        self.lease_id = lease.ID
        self._last_keepalive = time.monotonic()
        info = SessionInfo(server_id, self.role, self.address, self.extra)
        key = self.kv.abs_key(info.key)
        txn = TxnRequest(
            compare=[Compare(result=Compare.EQUAL, target=Compare.CREATE, key=key, create_revision=0)],
            success=[RequestOp(request_put=PutRequest(key=key, value=info.to_json(), lease=self.lease_id))],
        )
        resp = await client.call(
            f"register session {info.key}", lambda t: client.kv.Txn(txn, metadata=client.metadata, timeout=t)
        )
        if not resp.succeeded:
            await self._revoke()
            raise SessionError(f"session key {info.key} already exists; ServerID counter {SERVER_ID_KEY} was reset?")
        self.create_revision = resp.header.revision
        self.info = info
        self._tasks = [
            asyncio.create_task(self._keepalive(), name=f"session-keepalive-{info.key}"),
            asyncio.create_task(self._watch_key(), name=f"session-watch-{info.key}"),
        ]
        logger.info("session {} registered (lease {:x}, ttl {}s, address {})", info.key, self.lease_id, self.ttl,
                    self.address)
        return info

    def _mark_lost(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()
            level = "INFO" if reason == "closed" else "WARNING"
            logger.log(level, "session {} ended: {}", self.info.key if self.info else "?", reason)

    async def _keepalive_once(self, timeout: float) -> int:
        """One keepalive round trip; returns the TTL etcd reports (<= 0: the lease is gone)."""
        client = self.kv.client

        async def requests():
            yield LeaseKeepAliveRequest(ID=self.lease_id)

        call = client.lease.LeaseKeepAlive(requests(), metadata=client.metadata, timeout=timeout)
        try:
            async for resp in call:
                return resp.TTL
            raise TimeoutError("lease keepalive stream closed without an answer")
        finally:
            call.cancel()

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
            async for item in watch_prefix(self.kv, key, self.create_revision + 1, reconnect_deadline=None):
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
        with contextlib.suppress(Exception):
            await client.call(
                "Lease.Revoke",
                lambda t: client.lease.LeaseRevoke(
                    LeaseRevokeRequest(ID=self.lease_id), metadata=client.metadata, timeout=t
                ),
                deadline=2.0,
            )

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
            sessions[info.server_id] = info
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
            infos = [i for x in item.snapshot.kvs if (i := SessionInfo.parse(x.key, x.value)) is not None]
            known = {info.key: info for info in infos}
            yield SessionSnapshot({i.server_id: i for i in infos}, item.revision)
            continue
        for e in item.events:
            if e.type is EventType.PUT:
                parsed = SessionInfo.parse(e.key, e.value)
                if parsed is None:
                    continue
                info = parsed
                known[e.key] = info
                yield SessionEvent(EventType.PUT, info, e.mod_revision)
            else:
                gone = known.pop(e.key, None)
                if gone is not None:
                    yield SessionEvent(EventType.DELETE, gone, e.mod_revision)
