"""The locks ``QueryMeta``'s writes hold: per collection, shared or exclusive, and claims on segment ids.

Why two modes: with one exclusive lock per collection, the saves of a big load (one per child, each a few etcd
round trips) would run one after another, and the coordinator would sit idle waiting for etcd between them. Saves
of different segments or DM channel watches do not read or change each other's records, so they may overlap;
everything else (a release, partition states, a node's removal, progress) writes alone. A channel watch's save is
a shared holder too: writing alone, it would wait for the segment saves in flight and hold back every save queued
behind it.

- ``CollectionLock.shared``: any number of holders at once (segment and DM channel watch saves, segment removals).
- ``CollectionLock.exclusive``: one holder, no shared holder. Both kinds queue in one FIFO (an ``asyncio.Lock``
  taken briefly by a shared holder, for the whole write by an exclusive one), so an exclusive writer waiting is
  never overtaken by shared holders that came after it, and saves arriving all the time cannot starve it.
- ``RecordClaims``: a shared holder also claims the records it writes (segment ids, (collection, channel) pairs of
  DM channel watches), all at once, waiting while another holder has any of them (two replicas' children save
  the same segment's or channel's record: each adds its copy to what the other wrote, so they must not read the
  record at the same time).

Deadlock-free: collection locks are taken in id order (a shared holder waits for the FIFO of the next
collection only; an exclusive one waits for the shared holders of its collection, who hold all their locks or
wait further up the order), and claims are taken last, all at once, by holders that wait for nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Set
from contextlib import asynccontextmanager


class CollectionLock:
    """Shared or exclusive, in one FIFO (see the module docstring)."""

    __slots__ = ("_fifo", "_idle", "_shared")

    def __init__(self) -> None:
        self._fifo = asyncio.Lock()
        self._shared = 0
        self._idle = asyncio.Event()  # set while no shared holder
        self._idle.set()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._fifo:
            await self._idle.wait()
            yield

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._fifo:
            self._shared += 1
            self._idle.clear()
        try:
            yield
        finally:
            self._shared -= 1
            if not self._shared:
                self._idle.set()

    @property
    def shared_holders(self) -> int:
        return self._shared


class RecordClaims:
    """Records being written by shared holders (segment ids, (collection, channel) pairs); a claim waits until
    none of its records is claimed."""

    __slots__ = ("_claimed", "_waiters")

    def __init__(self) -> None:
        self._claimed: set[Hashable] = set()
        self._waiters: list[asyncio.Future[None]] = []

    @asynccontextmanager
    async def claim(self, ids: Set[Hashable]) -> AsyncIterator[None]:
        while not self._claimed.isdisjoint(ids):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:  # cancelled before a release woke it: no longer waiting
                    self._waiters.remove(waiter)
        self._claimed |= ids
        try:
            yield
        finally:
            self._claimed -= ids
            waiters, self._waiters = self._waiters, []
            for w in waiters:  # each checks again; those still overlapping wait anew
                if not w.done():
                    w.set_result(None)

    @property
    def waiting(self) -> int:
        """Claims waiting for a record another holds (a cancelled one stops waiting at once)."""
        return len(self._waiters)

    def __len__(self) -> int:
        return len(self._claimed)
