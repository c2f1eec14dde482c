"""Leader election with the semantics of etcd's Go ``concurrency`` package.

Each candidate writes ``<prefix>/<lease id in hex>`` under its session's
lease; the key with the lowest create revision leads. A candidate waits
only for the key just before its own to disappear (no thundering herd),
then checks again. Winning yields a ``Fence`` (the key and its create
revision) that guards every write the leader makes: when the lease expires
the key is deleted, the next candidate leads, and the old fence no longer
matches anything in etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from meta.errors import MetaError, NotLeader
from meta.fence import Fence
from meta.kv import FencedKV, MetaKV
from meta.log import logger
from meta.session import Session
from meta.txn import absent, created_at, delete, get, put
from meta.watch import EventType, Resync, watch_prefix

ELECTION_PREFIX = "election/"
LEADER_RECORD_PREFIX = "leader-record/"


class SessionLost(MetaError):
    """The campaign's session was lost before (or while) winning."""


@dataclass(frozen=True)
class LeaderInfo:
    key: str  # relative to the root path
    value: bytes
    create_revision: int


class Election:
    """One candidate's view of the election ``name`` (see module docstring)."""

    def __init__(self, kv: MetaKV, session: Session, name: str):
        if not name or "/" in name:
            raise ValueError(f"election name {name!r} must be a non-empty word without '/'")
        self.kv = kv
        # The candidate reads and writes the election through a plain view whatever view it was given: a fence
        # guards a leader's writes, and campaigning is how one becomes the leader.
        self._own = kv if type(kv) is MetaKV else MetaKV(kv.client, kv.root)
        self.session = session
        self.prefix = f"{ELECTION_PREFIX}{name}/"
        self._key: str | None = None
        self._rev = 0
        self._abandoned = False

    @property
    def fence(self) -> Fence | None:
        """The fence of this candidate's key while it holds one (leading or queued)."""
        if self._key is None:
            return None
        return Fence(self.kv.abs_key(self._key).decode(), self._rev)

    async def campaign(self, value: bytes | str) -> Fence:
        """Queue for leadership and return the fence once this candidate leads.

        Raises ``SessionLost`` if the session is lost while waiting. If the
        wait is cancelled or fails, the candidate's key is removed so that it
        does not block the candidates behind it.
        """
        if self.session.campaign_lease_id == 0:
            raise RuntimeError("start the session before campaigning")
        val = value.encode() if isinstance(value, str) else value
        key = f"{self.prefix}{self.session.campaign_lease_id:x}"
        result = await self._own.txn([absent(key)], [put(key, val, self.session.campaign_lease_id)],
                                     on_failure_ops=[get(key)], operation=f"campaign {key}")
        self._key = key
        if result.succeeded:
            self._rev = result.revision
        else:
            # Same lease campaigned before (a retried call): keep our place in the queue.
            mine = result.responses[0]
            assert mine is not None  # the compare failed: the key exists, and the txn read it at that revision
            self._rev = mine.create_revision
            if mine.value != val:
                await self.proclaim(val)
        try:
            await self._wait_for_predecessors()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.resign())
            raise
        fence = self.fence
        assert fence is not None
        logger.info("election {}: won with {}", self.prefix, fence)
        return fence

    async def _wait_for_predecessors(self) -> None:
        while True:
            if self.session.lost.is_set():
                raise SessionLost(f"session lost while campaigning: {self.session.lost_reason}")
            pred, revision = await self._own.first_created(
                self.prefix, newest=True, max_create_revision=self._rev - 1, operation="election predecessors")
            if pred is None:
                return
            waiter = asyncio.create_task(self._wait_deleted(pred.key, revision + 1))
            lost = asyncio.create_task(self.session.lost.wait())
            try:
                await asyncio.wait({waiter, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (waiter, lost):
                    t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
            if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
                raise waiter.exception()  # type: ignore[misc]

    async def _wait_deleted(self, key: str, from_revision: int) -> None:
        async for item in watch_prefix(self.kv, key, from_revision, reconnect_deadline=None):
            if isinstance(item, Resync):
                if key not in item.snapshot.as_dict():
                    return
                continue
            if any(e.key == key and e.type is EventType.DELETE for e in item.events):
                return

    async def proclaim(self, value: bytes | str) -> None:
        """Change the leader's value without giving up leadership; ``NotLeader`` if the key is gone."""
        if self._key is None:
            raise NotLeader(self.prefix, 0, 0)
        val = value.encode() if isinstance(value, str) else value
        key = self._key
        result = await self._own.txn([created_at(key, self._rev)], [put(key, val, self.session.campaign_lease_id)],
                                     operation="proclaim")
        if not result.succeeded:
            raise NotLeader(self.kv.abs_key(key).decode(), self._rev, 0)

    async def resign(self) -> None:
        """Give up leadership (or a place in the queue) now, without waiting for the lease to expire."""
        if self._key is None or self._abandoned:
            return
        await self._own.txn([created_at(self._key, self._rev)], [delete(self._key)], operation="resign", deadline=5.0)
        logger.info("election {}: resigned {}", self.prefix, self._key)
        self._key = None
        self._rev = 0

    def abandon(self) -> None:
        """Resign nothing from now on, as a crashed candidate would: its key stays until its lease lapses (a test
        seam for crashing a holder inside the caller's event loop)."""
        self._abandoned = True

    async def leader(self) -> LeaderInfo | None:
        return await current_leader(self.kv, self.prefix)

    def observe(self) -> AsyncIterator[LeaderInfo | None]:
        return observe_leader(self.kv, self.prefix)


async def _leader_at(kv: MetaKV, prefix: str) -> tuple[LeaderInfo | None, int]:
    first, revision = await kv.first_created(prefix, operation="election leader")
    if first is None:
        return None, revision
    return LeaderInfo(first.key, first.value, first.create_revision), revision


async def current_leader(kv: MetaKV, prefix: str) -> LeaderInfo | None:
    """The candidate with the lowest create revision under ``prefix``, if any."""
    return (await _leader_at(kv, prefix))[0]


async def observe_leader(kv: MetaKV, prefix: str) -> AsyncIterator[LeaderInfo | None]:
    """Yield the current leader, then the leader after every change (``None`` while there is none)."""
    last, revision = await _leader_at(kv, prefix)
    yield last
    async for _item in watch_prefix(kv, prefix, revision + 1, reconnect_deadline=None):
        now = await current_leader(kv, prefix)
        if now != last:
            last = now
            yield now


def election_prefix(name: str) -> str:
    return f"{ELECTION_PREFIX}{name}/"


# ----- the leader record: what others may read of an election -------------------------------------------------------
# The election's keys name the candidates' leases (in the key, and in etcd's lease field of every read), and etcd
# lets anyone who knows a lease id renew it: whoever may read ``election/`` can keep a dead leader's key alive, and
# nobody leads while it does. So only the candidates read the election; everyone else (nodes checking a fence,
# readers) reads the leader record, a key without a lease that the leader writes through its fence on taking over.
@dataclass(frozen=True)
class LeaderRecord:
    revision: int  # the fence revision of the leader that wrote it
    value: str  # what it campaigned with (an address)


def leader_record_key(name: str) -> str:
    return f"{LEADER_RECORD_PREFIX}{name}"


async def publish_leader_record(kv: FencedKV, name: str, value: str) -> None:
    """Write the record of election ``name`` as its leader (fenced: a deposed leader's write is refused)."""
    body = json.dumps({"revision": kv.fence.revision, "value": value}, sort_keys=True)
    await kv.save(leader_record_key(name), body)


async def read_leader_record(kv: MetaKV, name: str) -> LeaderRecord | None:
    """The last leader's record, or None if no leader wrote one (or it does not parse: only a leader writes it).

    A leader that died leaves its record until the next one writes its own: the record says who led last, not
    that it lives; its revision only ever rises, which is what a fence check needs."""
    raw = await kv.get(leader_record_key(name))
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        revision, value = d["revision"], d["value"]
    except (ValueError, TypeError, KeyError):
        return None
    if isinstance(revision, bool) or not isinstance(revision, int) or revision <= 0 or not isinstance(value, str):
        return None
    return LeaderRecord(revision, value)
