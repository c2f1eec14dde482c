"""Unique, strictly increasing ids, reserved from etcd in blocks.

The design in three rules:

* **Blocks make allocation cheap.** One etcd key (e.g. ``idalloc/task``)
  holds the next free id as a decimal string. An allocator reserves a whole
  block of ``block_size`` ids with one write and then hands them out from
  memory, so a thousand ids cost one etcd round trip instead of a thousand.
* **Reserve before use gives monotonicity across restarts.** The reservation
  is persisted (the stored value moved past the block) *before* any id of the
  block is handed out. Whatever happens next (crash, SIGKILL, restart,
  failover), every id ever returned is below the stored value, and a new
  allocator starts from the stored value: it never goes back. The price is
  gaps: the unused rest of a block is lost when its process dies. Ids are
  unique and increasing, not dense.
* **Compare-and-swap gives uniqueness.** The stored value is advanced with a
  compare-and-swap (``expected`` = the value just read; absent = start at 1),
  so of two allocators that read the same value only one wins the block; the
  other re-reads and tries the next one. The stored value only ever grows, so
  comparing values is safe (no ABA). Any number of allocators, in one process
  or many, may share a key.

A CAS whose answer is lost in transit (the client retries transient errors)
may have been applied; the retry then fails the compare, the allocator
re-reads and reserves a later block. The earlier block is wasted, never
handed out twice. The same holds when ``allocate`` is cancelled mid-way.

Never delete or lower the key: allocators would then hand out old ids again.
An allocator that sees the stored value below what it already reserved
refuses to continue (``MetaError``) rather than return a duplicate.
"""

from __future__ import annotations

import asyncio
import random

from meta.errors import MetaError
from meta.kv import MetaKV

DEFAULT_BLOCK_SIZE = 1000
DEFAULT_MAX_ROUNDS = 100
FIRST_ID = 1
# Ids usually end up in int64 fields (protobuf, databases): refuse to go past.
MAX_ID = 2**63 - 1

# Back-off after a lost CAS: jittered, doubling from _BACKOFF_BASE up to _BACKOFF_CAP seconds.
_BACKOFF_BASE = 0.0005
_BACKOFF_CAP = 0.05


class IdAllocator:
    """Hands out unique, strictly increasing ids reserved in blocks under ``key`` (see module docstring).

    ``kv`` may be a plain ``MetaKV`` or a leader's ``FencedKV``. Uniqueness
    does not need the fence (the CAS alone gives it, so standbys, workers or
    tools may allocate on the same key); a fenced view only adds that a
    deposed leader gets ``NotLeader`` instead of an id.

    ``max_rounds`` bounds how many CAS rounds in a row one reservation may
    lose to other allocators before ``MetaError`` is raised.
    """

    def __init__(
        self,
        kv: MetaKV,
        key: str,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_rounds: int = DEFAULT_MAX_ROUNDS,
    ):
        if not key:
            raise ValueError("the id allocator needs a key name, e.g. 'idalloc/task'")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_rounds must be a positive integer, got {max_rounds!r}")
        self.kv = kv
        self.key = key
        self.block_size = block_size
        self.max_rounds = max_rounds
        # The block in hand: ids [_next, _end) are reserved in etcd and not yet handed out.
        self._next = 0
        self._end = 0
        # One reservation at a time: callers waiting for the lock find the block
        # the holder reserved instead of reserving another one for the same need.
        self._lock = asyncio.Lock()

    @property
    def remaining(self) -> int:
        """Ids reserved and not yet handed out (lost if the process dies now)."""
        return self._end - self._next

    async def allocate(self, n: int = 1) -> range:
        """Return ``n`` consecutive new ids, all above every id this key has handed out so far.

        Served from the block in hand when it holds ``n`` ids; otherwise one
        block of ``max(n, block_size)`` ids is reserved (one CAS, retried on
        contention) and persisted before any of them is returned.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"allocate(n) needs an int count of ids, got {type(n).__name__}")
        if n < 1:
            raise ValueError(f"allocate(n) needs n >= 1 (the number of ids wanted), got {n}")
        async with self._lock:
            if self._end - self._next < n:
                await self._reserve(n)
            start = self._next
            self._next += n
            return range(start, start + n)

    async def _reserve(self, n: int) -> None:
        """Move the stored next-free id past a new block holding at least ``n`` ids (lock held)."""
        for attempt in range(self.max_rounds):
            current = await self.kv.get_kv(self.key)
            expected = None if current is None else current.value
            stored = FIRST_ID if current is None else self._parse(current.value)
            if stored < self._end:
                raise MetaError(
                    f"id allocator {self.key}: the stored next id {stored} is below {self._end}, which this "
                    f"allocator already reserved; the key was deleted or rewritten, so ids would repeat. "
                    f"Restore it to at least {self._end} (never delete or lower an id allocator key)."
                )
            if stored == self._end and self._end > 0:
                # Nobody reserved since our block: extend it, keeping its unused rest.
                start, size = self._next, max(n - (self._end - self._next), self.block_size)
            else:
                start, size = stored, max(n, self.block_size)
            end = stored + size
            if end - 1 > MAX_ID:
                raise MetaError(
                    f"id allocator {self.key}: reserving {size} ids from {stored} would pass the int64 "
                    f"maximum {MAX_ID}; nothing was reserved"
                )
            if await self.kv.compare_and_swap(self.key, expected, str(end)):
                # Persisted: only now may ids of [start, end) be handed out.
                self._next, self._end = start, end
                return
            # Another allocator took this block: back off a little, re-read, try the next one.
            await asyncio.sleep(random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt)))
        raise MetaError(
            f"id allocator {self.key}: lost the compare-and-swap to other allocators {self.max_rounds} "
            f"times in a row, giving up (nothing was handed out). Contention on this key is too high: "
            f"use a larger block_size, fewer allocators per key, or retry later."
        )

    def _parse(self, raw: bytes) -> int:
        try:
            value = int(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            value = 0
        if value < FIRST_ID:
            raise MetaError(
                f"id allocator {self.key}: the stored value {raw[:40]!r} is not a decimal next id >= {FIRST_ID}; "
                f"refusing to guess. Fix or remove the key only if no id from it is in use."
            )
        return value


__all__ = ["DEFAULT_BLOCK_SIZE", "FIRST_ID", "MAX_ID", "IdAllocator"]
