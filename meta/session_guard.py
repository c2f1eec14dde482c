"""The leader's guard over node sessions: a session that grows too large or is rewritten too often is fenced.

A node's etcd role may write its own session key, and etcd neither bounds a
value below its request limit (1.5 MiB) nor counts a user's writes: a node
credential rewriting its key with large values fills etcd's quota, after
which every coordinator write is refused (NOSPACE). Every revision of the key
is kept until a compaction, so the cost is the sum of all writes, not the
last value. The guard watches the session keys of the roles it is given and,
when one value is larger than ``max_value_bytes`` or one key is written more
than ``max_writes`` times within ``window`` seconds, it *fences* the key:

* the lease under the key is revoked (the coordinator's role may write every
  key of the root, which is all etcd asks of a lease revoke), so the session
  ends at once and its watchers see the node go (a key written without a
  lease is deleted instead, through the leader's fenced view);
* the key stays quarantined for ``quarantine`` seconds: any new session under
  it is revoked again at once, and ``refused`` tells the node watchers not to
  take it online meanwhile;
* ``on_fence(key, reason)`` hears it once per fencing (one log line, a
  metric), never once per write.

What a node can still do is bounded by how fast the guard reacts (one watch
event), and the quarantine bounds what it can do again. Stopping a credential
for good is for an operator: remove the node's etcd user or role. The guard
reads each value only for its length: nothing it parses can be large.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meta.kv import MetaKV
from meta.log import logger
from meta.session import MAX_SESSION_VALUE_BYTES, SESSION_PREFIX, role_prefix
from meta.watch import EventType, Resync, watch_prefix

# Why a key was fenced (the metric's label values).
VALUE_SIZE = "value_size"
WRITE_RATE = "write_rate"
# Keys whose write times are remembered at most (one per node credential in practice); pruned when exceeded.
_MAX_TRACKED = 4096


@dataclass(frozen=True, slots=True)
class GuardLimits:
    """A node's session registers once; a few rewrites a minute is already far more than any node needs."""

    max_value_bytes: int = MAX_SESSION_VALUE_BYTES
    max_writes: int = 30
    window: float = 60.0
    quarantine: float = 60.0

    def check(self) -> GuardLimits:
        """``ValueError`` naming the limit that cannot work (a guard that fences everyone or nobody)."""
        if not 256 <= self.max_value_bytes <= MAX_SESSION_VALUE_BYTES:
            raise ValueError(f"session value limit must be between 256 and {MAX_SESSION_VALUE_BYTES} bytes, "
                             f"got {self.max_value_bytes}")
        if not 2 <= self.max_writes <= 100_000:
            raise ValueError(f"session write limit must be between 2 and 100000 writes, got {self.max_writes}")
        for name, value in (("window", self.window), ("quarantine", self.quarantine)):
            if not 1.0 <= value <= 86_400.0:  # also refuses NaN
                raise ValueError(f"session guard {name} must be between 1 and 86400 seconds, got {value}")
        return self


class SessionGuard:
    """Watches the session keys of ``roles`` and fences those that break ``limits`` (see module docstring).

    ``kv`` should be the leader's fenced view: the only write the guard makes (deleting a lease-less key) then
    stops with the leadership, like every other.
    """

    def __init__(self, kv: MetaKV, roles: Sequence[str], limits: GuardLimits | None = None,
                 on_fence: Callable[[str, str], None] | None = None):
        self.kv = kv
        self.prefixes = tuple(role_prefix(r) for r in roles)
        self.limits = (limits or GuardLimits()).check()
        self.on_fence = on_fence
        self._writes: dict[str, collections.deque[float]] = {}
        self._quarantined: dict[str, float] = {}  # key -> monotonic time its quarantine ends
        self.fenced: dict[str, int] = {VALUE_SIZE: 0, WRITE_RATE: 0}  # fencings by reason
        self.revoked = 0  # leases revoked (a fencing and every session retried in quarantine)
        self.watch_errors = 0

    def refused(self, key: str) -> bool:
        """Whether ``key`` (``session/<role>-<id>``) is quarantined: its node must not be taken online."""
        until = self._quarantined.get(key)
        if until is None:
            return False
        if time.monotonic() >= until:
            del self._quarantined[key]
            return False
        return True

    async def run(self) -> None:
        """Guard until cancelled; a failed watch (etcd trouble) is logged and restarted from a fresh read."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.watch_errors += 1
                logger.warning("session guard: watch failed ({}: {}); restarting it", type(exc).__name__,
                               str(exc)[:200])
            await asyncio.sleep(0.5)

    def _guarded(self, key: str) -> bool:
        return key.startswith(self.prefixes)

    async def _follow(self) -> None:
        snap = await self.kv.load_prefix(SESSION_PREFIX)
        for item in snap.kvs:  # values already there: only their size can be judged
            if self._guarded(item.key) and (len(item.value) > self.limits.max_value_bytes or self.refused(item.key)):
                await self._fence(item.key, item.lease, VALUE_SIZE, len(item.value))
        async for batch in watch_prefix(self.kv, SESSION_PREFIX, snap.revision + 1, reconnect_deadline=None):
            if isinstance(batch, Resync):
                continue  # compacted away: the events in between cannot be counted; new ones will be
            for e in batch.events:
                if e.type is EventType.PUT and self._guarded(e.key):
                    await self._judge(e.key, e.lease, len(e.value))

    async def _judge(self, key: str, lease: int, size: int) -> None:
        now = time.monotonic()
        if self.refused(key):
            await self._fence(key, lease, None, size)
            return
        if size > self.limits.max_value_bytes:
            await self._fence(key, lease, VALUE_SIZE, size)
            return
        times = self._writes.get(key)
        if times is None:
            if len(self._writes) >= _MAX_TRACKED:
                self._prune(now)
            times = self._writes[key] = collections.deque(maxlen=self.limits.max_writes + 1)
        times.append(now)
        while times and now - times[0] > self.limits.window:
            times.popleft()
        if len(times) > self.limits.max_writes:
            await self._fence(key, lease, WRITE_RATE, size)

    def _prune(self, now: float) -> None:
        for k in [k for k, t in self._writes.items() if not t or now - t[-1] > self.limits.window]:
            del self._writes[k]
        if len(self._writes) >= _MAX_TRACKED:
            self._writes.clear()

    async def _fence(self, key: str, lease: int, reason: str | None, size: int) -> None:
        """Revoke ``lease`` (or delete a lease-less key); ``reason`` None: a retry inside the quarantine."""
        if reason is not None:
            self.fenced[reason] = self.fenced.get(reason, 0) + 1
            self._quarantined[key] = time.monotonic() + self.limits.quarantine
            self._writes.pop(key, None)
            what = (f"a value of {size} bytes (limit {self.limits.max_value_bytes})" if reason == VALUE_SIZE else
                    f"more than {self.limits.max_writes} writes in {self.limits.window:g}s")
            logger.warning("session {} fenced: {}; its lease is revoked and the key refused for {:g}s (a node "
                           "credential filling etcd?)", key, what, self.limits.quarantine)
            if self.on_fence is not None:
                self.on_fence(key, reason)
        try:
            if lease:
                await self.kv.client.revoke_lease(lease, operation="Lease.Revoke (session guard)", deadline=5.0)
            else:
                await self.kv.remove(key)
            self.revoked += 1
        except Exception as exc:  # MetaError, or etcd's NOT_FOUND for a lease gone meanwhile
            # The lease expired meanwhile ("requested lease not found"), or etcd is away: the quarantine stays.
            logger.info("session guard: could not end session {}: {}", key, str(exc)[:200])

    async def __aenter__(self) -> SessionGuard:
        self._task = asyncio.create_task(self.run(), name="session-guard")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


__all__ = ["VALUE_SIZE", "WRITE_RATE", "GuardLimits", "SessionGuard"]
