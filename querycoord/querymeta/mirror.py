"""A standby's copy of the query meta, kept current by one etcd watch: the warm standby.

Why: a takeover that starts with ``QueryMeta.reload`` reads every record
(a million segments: tens of seconds of etcd paging and decoding) after the
old leader's lease has already expired. Users feel that as
downtime on top of the TTL. A standby has nothing to do while it waits for
the election, so it reads the same records once, then follows one watch
over the four query meta prefixes (``COLLECTION_PREFIX`` through
``SEGMENT_PREFIX``: one stream, so one revision says how far all of them
are). When it wins, ``take`` asks etcd how far the store is, waits for the
watch to get there (a progress request answers even when nothing changed)
and hands over an index equal to a reload at that revision. Nothing can be
written after that revision by anyone but the new leader: the old leader's
writes are fenced on its election key, which is gone once this one won.

Anything unusual (the copy not built yet, the watch broken, etcd slow to
answer) makes ``take`` return None and the caller reloads instead: the
mirror makes a takeover fast, never different.
"""

from __future__ import annotations

from collections.abc import Iterable

from loguru import logger

from meta.errors import MetaError
from meta.follow import RangeFollower
from meta.kv import MetaKV
from meta.watch import EventType, WatchBatch
from querycoord.common import memory
from querycoord.common.yielding import every_few

from . import keys
from .errors import CorruptRecord
from .index import MetaIndex
from .records import decode_into, drop_key, warn_orphans

# The first and last of the four prefixes in key order: one range holds all of them (and one stray key,
# queryCoord-handoffRevision, which is skipped).
FIRST_PREFIX = keys.COLLECTION_PREFIX
LAST_PREFIX = keys.SEGMENT_PREFIX
_META_PREFIXES = tuple(sorted(keys.ALL_PREFIXES, key=len, reverse=True))
# How long ``take`` waits for the copy to reach etcd's revision before the caller reloads instead.
CATCH_UP_TIMEOUT = 5.0


def _prefix_of(key: str) -> str | None:
    for prefix in _META_PREFIXES:
        if key.startswith(prefix):
            return prefix
    return None


class MetaMirror(RangeFollower):
    """The copy (``start`` it while standing by); ``take`` it once, when this coordinator wins."""

    name = "the query meta (warm standby)"

    def __init__(self, kv: MetaKV):
        super().__init__(kv, FIRST_PREFIX, LAST_PREFIX)
        self._index: MetaIndex | None = None
        self._corrupt: dict[str, str] = {}

    async def take(self, timeout: float = CATCH_UP_TIMEOUT) -> tuple[MetaIndex, dict[str, str], int] | None:
        """The copy as of etcd's current revision, its corrupt keys and that revision; the mirror stops.

        None: no usable copy (not read yet, broken, or etcd slow): the caller reloads.
        """
        try:
            try:
                revision = await self.catch_up(timeout)
            except (TimeoutError, MetaError) as exc:
                logger.warning("warm standby: no usable copy of the query meta ({}); reloading it instead",
                               exc or "it did not catch up in time")
                return None
            index, corrupt = self._index, self._corrupt
            if index is None:
                return None
            self._index = None  # the caller owns it now: nothing applies changes to it any more
            return index, corrupt, revision
        finally:
            await self.stop()

    @property
    def index(self) -> MetaIndex | None:
        """The copy as far as the watch got (None: none yet, or taken); ``catch_up`` first to be current. A standby
        reads it (``querycoord.serving.standby_reads``) in place: it changes between awaits, never during a read."""
        return self._index

    def drop(self) -> None:
        self._index = None
        self._corrupt = {}

    async def replace(self, items: Iterable[tuple[str, bytes]], revision: int) -> None:
        fresh = MetaIndex()
        corrupt: dict[str, str] = {}
        async for key, value in every_few(items):  # built aside: turns are safe
            prefix = _prefix_of(key)
            if prefix is None:
                continue
            try:
                decode_into(fresh, prefix, key, value)
            except CorruptRecord as exc:
                corrupt[key] = exc.reason
        warn_orphans(fresh)
        self._index, self._corrupt = fresh, corrupt
        logger.info("warm standby: query meta copied at revision {} ({} collections, {} segments); following it",
                    revision, len(fresh.collections), len(fresh.segments))

    def after_read(self, keys: int) -> None:
        if keys >= memory.LARGE_TASK_SEGMENTS:
            memory.trim()  # the raw read is freed: hand its pages back (a million records: hundreds of MB)

    def apply(self, batch: WatchBatch) -> None:
        index = self._index
        assert index is not None
        for ev in batch.events:
            prefix = _prefix_of(ev.key)
            if prefix is None:
                continue
            self._corrupt.pop(ev.key, None)
            if ev.type is EventType.DELETE:
                drop_key(index, prefix, ev.key)
                continue
            try:
                decode_into(index, prefix, ev.key, ev.value, replace=True)
            except CorruptRecord as exc:
                # What a reload would skip: drop what the key held before, and list it as a reload does.
                drop_key(index, prefix, ev.key)
                self._corrupt[ev.key] = exc.reason
