"""A prefix watch that neither loses nor repeats an event, across etcd restarts and compactions.

``etcd3aio``'s own watch resumes from the revision in the response header,
which can skip events (a ``created`` response or a catch-up batch carries the
store's current revision, not the last one delivered). This watch resumes
from the last delivered event's revision + 1, which is exact.

When the revision to resume from was compacted, the events in between are
gone for good; the watch then re-lists the prefix and yields a ``Resync``
with the full state, after which events continue from the snapshot's
revision + 1. Consumers replace their state on ``Resync`` and apply
``WatchBatch`` events on top of it.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import grpc
from etcd3aio.kv import prefix_range_end

from meta.client import is_transient
from meta.errors import MetaError, MetaUnavailable
from meta.etcd_pb import WatchCreateRequest, WatchRequest
from meta.kv import MetaKV, PrefixSnapshot
from meta.log import logger

_PUT = 0  # mvccpb.Event.EventType


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change of one key; ``key`` is relative to the root path."""

    type: EventType
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    prev_value: bytes | None = None
    lease: int = 0  # the lease the key was written under (0: none, and for a DELETE)


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """Events in revision order. Every change up to ``revision`` has now been delivered.

    ``events`` is empty for a progress notification.
    """

    events: list[WatchEvent]
    revision: int


@dataclass(frozen=True, slots=True)
class Resync:
    """The resume revision was compacted: here is the whole prefix; forget what you knew."""

    snapshot: PrefixSnapshot

    @property
    def revision(self) -> int:
        return self.snapshot.revision


WatchItem = WatchBatch | Resync


class WatchCancelled(MetaError):
    """etcd cancelled the watch for a reason that retrying cannot fix (e.g. permission denied)."""


async def _watch_requests(create: WatchCreateRequest, stop: asyncio.Event,
                          progress_wanted: asyncio.Event | None) -> AsyncGenerator[WatchRequest, None]:
    """What one watch stream sends: ``create``, then a progress request whenever ``progress_wanted`` is set, until
    ``stop`` (the stream is over)."""
    yield WatchRequest(create_request=create)
    while progress_wanted is not None:
        wanted = asyncio.ensure_future(progress_wanted.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({wanted, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wanted.cancel()
            stopped.cancel()
        if stop.is_set():
            return
        progress_wanted.clear()
        yield WatchRequest(progress_request={})
    await stop.wait()


async def watch_prefix(
    kv: MetaKV,
    prefix: str,
    start_revision: int,
    *,
    prev_kv: bool = False,
    reconnect_deadline: float | None = 60.0,
    progress_notify: bool = False,
    through: str | None = None,
    progress_wanted: asyncio.Event | None = None,
    exact: bool = False,
) -> AsyncGenerator[WatchItem, None]:
    """Yield every change under ``prefix`` from ``start_revision`` on (0: from now).

    The stream is re-opened after any transient failure (etcd restarted, the
    member behind it died or lost its raft leader), resuming exactly after the
    last delivered event. ``reconnect_deadline`` bounds how long the watch may
    stay disconnected before it raises ``MetaUnavailable`` (``None``: keep
    trying until cancelled; its owner must then bound it).

    ``through``: watch every key from ``prefix`` up to and including the keys under ``through`` (neighbouring
    prefixes as one stream, so one revision says how far all of them are).

    ``progress_wanted``: whenever it is set, the watch clears it and asks etcd for a progress notification
    (etcd >= 3.4); etcd answers once the stream has sent everything up to its current revision, and the watch
    yields an empty ``WatchBatch`` with that revision. Why: an idle watch cannot otherwise tell "nothing
    happened" from "not there yet" (a standby taking over waits on this).

    ``exact``: watch the key ``prefix`` alone, not the keys it prefixes (a node's role may read its own session
    key and not ``session/querynode-12`` beside ``session/querynode-1``); a resync then re-reads that one key.
    """
    if exact and through is not None:
        raise ValueError("an exact watch covers one key: through= does not apply")
    client = kv.client
    start = kv.abs_prefix(prefix)
    end = b"" if exact else prefix_range_end(kv.abs_prefix(through if through is not None else prefix))
    next_rev = start_revision if start_revision > 0 else await kv.revision() + 1
    backoff = 0.05
    disconnected_since: float | None = None
    # Like clientv3.WithRequireLeader: a member cut off from its raft leader
    # cancels the stream instead of silently serving nothing.
    metadata = (*(client.metadata or ()), ("hasleader", "true"))

    while True:
        stop_requests = asyncio.Event()
        create = WatchCreateRequest(
            key=start, range_end=end, start_revision=next_rev, prev_kv=prev_kv, progress_notify=progress_notify
        )
        call = client.watch.Watch(_watch_requests(create, stop_requests, progress_wanted), metadata=metadata)
        compacted = False
        try:
            async for resp in call:
                if resp.compact_revision > 0:
                    compacted = True
                    break
                if resp.canceled:
                    if is_transient_cancel(resp.cancel_reason):
                        break
                    raise WatchCancelled(f"etcd cancelled the watch on {prefix!r}: {resp.cancel_reason}")
                if resp.created:
                    disconnected_since = None
                    backoff = 0.05
                    continue
                if resp.events:
                    events = [_event(kv, e) for e in resp.events]
                    next_rev = events[-1].mod_revision + 1
                    yield WatchBatch(events, events[-1].mod_revision)
                elif resp.header.revision >= next_rev - 1:
                    # Progress notification: only sent to synced watchers, so
                    # nothing up to this revision is still to come (it may be
                    # the last delivered event's own revision: an idle watch).
                    next_rev = max(next_rev, resp.header.revision + 1)
                    yield WatchBatch([], resp.header.revision)
        except grpc.aio.AioRpcError as exc:
            if not is_transient(exc):
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED and client.config.user is not None:
                    logger.info("watch on {!r}: auth token expired, logging in again", prefix)
                    await client.reauthenticate()
                    metadata = (*(client.metadata or ()), ("hasleader", "true"))
                    continue
                raise
            logger.debug("watch on {!r} interrupted ({}); resuming at revision {}", prefix, exc.code().name, next_rev)
        finally:
            stop_requests.set()
            call.cancel()

        if compacted:
            snapshot = await kv.load_key(prefix) if exact else await kv.load_prefix(prefix, through=through)
            logger.info(
                "watch on {!r}: revision {} was compacted; resynced at revision {} ({} keys)",
                prefix, next_rev, snapshot.revision, len(snapshot.kvs),
            )
            next_rev = snapshot.revision + 1
            yield Resync(snapshot)
            del snapshot  # every raw record of the prefix: not kept in this frame until the next compaction
            continue

        now = time.monotonic()
        disconnected_since = disconnected_since or now
        if reconnect_deadline is not None and now - disconnected_since > reconnect_deadline:
            raise MetaUnavailable(client.endpoints, f"watch {prefix!r}", now - disconnected_since, None)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 1.0)


def is_transient_cancel(reason: str) -> bool:
    """Cancellations a new stream may not see again (the member lost its leader, is stopping)."""
    return any(s in reason for s in ("no leader", "leader changed", "stopped", "shutdown", "timed out"))


def _event(kv: MetaKV, e: object) -> WatchEvent:
    raw = e.kv  # type: ignore[attr-defined]
    prev = e.prev_kv.value if e.HasField("prev_kv") else None  # type: ignore[attr-defined]
    if e.type == _PUT:  # type: ignore[attr-defined]
        return WatchEvent(EventType.PUT, kv.rel_key(raw.key), raw.value, raw.mod_revision, raw.create_revision, prev,
                          raw.lease)
    return WatchEvent(EventType.DELETE, kv.rel_key(raw.key), b"", raw.mod_revision, raw.create_revision, prev)
