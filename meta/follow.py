"""A copy of a key range kept in memory by one watch, that can say "I am as new as etcd is now".

Why a class of its own: a warm standby's query meta and the checker's view of
the catalog both need the same three things: read the range once, apply
every later change in order (starting over from a fresh read whenever the
watch cannot resume), and, before the copy is trusted, wait until it holds
every change up to etcd's current revision. The last part needs a watch
progress request, because an idle watch cannot otherwise tell "nothing
changed" from "not there yet".

Subclasses decide what the copy is (``replace`` with a whole snapshot,
``apply`` a batch of events); this class owns the task, the revision and the
waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from meta.errors import MetaError
from meta.kv import MetaKV
from meta.log import logger
from meta.loops import follow_forever
from meta.watch import Resync, WatchBatch, watch_prefix

# How often ``catch_up`` asks for a progress notification again while it waits (one can be lost on a reconnect).
PROGRESS_EVERY = 0.2
# Back-off after the watch or a read failed, before the copy is read again.
RESTART_DELAY = 1.0


class CopyBroken(MetaError):
    """The copy was dropped while a caller waited for it (its watch or read failed; it is being read again)."""


class RangeFollower:
    """Reads ``[prefix, through]`` once, then follows it; ``catch_up`` before trusting the copy."""

    name = "range"

    def __init__(self, kv: MetaKV, prefix: str, through: str | None = None):
        self._kv = kv
        self._prefix = prefix
        self._through = through
        self.revision = 0  # every change up to here is in the copy (0: no copy)
        self.events = 0  # changes applied since the last full read
        self._moved = asyncio.Condition()
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ----- what a subclass provides ------------------------------------------------------------------------------
    async def replace(self, items: Iterable[tuple[str, bytes]], revision: int) -> None:
        """Forget the copy; build it from every key and value of the range as of ``revision`` (``items`` is read
        once, lazily: give the loop turns while reading it, ``every_few``)."""
        raise NotImplementedError

    def apply(self, batch: WatchBatch) -> None:
        """Apply changes in revision order (never called before the first ``replace``)."""
        raise NotImplementedError

    def drop(self) -> None:
        """Forget the copy (it is broken; a fresh read follows)."""

    def after_read(self, keys: int) -> None:
        """A full read of ``keys`` keys was applied and its raw records are freed (a subclass may hand the
        memory back to the OS)."""

    # ----- life cycle -----------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.revision > 0 and self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"follow-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # asyncio.wait, not ``await task`` under suppress(CancelledError): that would also swallow a
            # cancellation of the caller (a coordinator stopped while it takes over, in ``take``), which then
            # went on to lead while ``stop`` waited for it.
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                logger.debug("following {} ended with {}", self.name, task.exception())
        self.revision = 0
        self.drop()

    async def catch_up(self, timeout: float) -> int:
        """Wait until the copy holds every change etcd has now; its revision. ``TimeoutError``, ``MetaError``.

        A copy still being read is waited for (within ``timeout``): reading it again would take as long.
        """
        # asyncio.timeout, never asyncio.wait_for: on Python 3.11 wait_for can swallow a cancellation of the
        # caller that arrives as the awaited call completes; a coordinator stopped while it took over then went on
        # to lead while its stop waited for it.
        async with asyncio.timeout(timeout):
            while not self.ready:
                if self._task is None or self._task.done():
                    raise CopyBroken(f"no copy of {self._prefix!r}")
                await asyncio.sleep(0.01)
            target = await self._kv.revision()
            await self._wait_for(target)
        return self.revision

    async def _wait_for(self, target: int) -> None:
        async with self._moved:
            while self.revision < target:
                if not self.ready:
                    raise CopyBroken(f"the copy of {self._prefix!r} broke while catching up")
                self._progress.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PROGRESS_EVERY):
                        await self._moved.wait()

    async def _run(self) -> None:
        # A broken copy is dropped, never used; it is read again after a pause (a failure logged and counted).
        await follow_forever(f"follow {self.name}", self._follow, pause=RESTART_DELAY, client=self._kv.client,
                             after=self._forget)

    def _forget(self) -> None:
        """Drop the copy and its revision: the next follow reads everything again."""
        self.revision = 0
        self.drop()

    async def _follow(self) -> None:
        revision, keys = await self._read()
        self.after_read(keys)
        # aclosing: a cancelled follower closes its watch at once (its gRPC stream and request generator), rather
        # than leaving the suspended generator, and the stream, to the garbage collector.
        async with contextlib.aclosing(watch_prefix(self._kv, self._prefix, revision + 1, through=self._through,
                                                    reconnect_deadline=None,
                                                    progress_wanted=self._progress)) as stream:
            async for item in stream:
                if isinstance(item, Resync):
                    keys = len(item.snapshot)
                    await self.replace(item.snapshot.iter_items(), item.revision)
                    self.events = 0
                else:
                    keys = 0
                    self.apply(item)
                    self.events += len(item.events)
                revision = item.revision
                del item  # a Resync's snapshot (every raw record of the range) must not live on while we wait
                if keys:
                    self.after_read(keys)
                await self._moved_to(revision)

    async def _read(self) -> tuple[int, int]:
        """The first full read (revision, keys); its raw records are freed on return (the copy is all that is
        kept)."""
        snapshot = await self._kv.load_prefix(self._prefix, through=self._through)
        await self.replace(snapshot.iter_items(), snapshot.revision)
        await self._moved_to(snapshot.revision)
        return snapshot.revision, len(snapshot)

    async def _moved_to(self, revision: int) -> None:
        async with self._moved:
            self.revision = max(self.revision, revision)
            self._moved.notify_all()
