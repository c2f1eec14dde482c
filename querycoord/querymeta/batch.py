"""Turning query-meta changes into etcd txns within etcd's limits, then into memory.

A change is a ``Mutation``: the etcd operations that must be sent together
(one txn) and its effect on the in-memory ``MetaIndex``. ``TxnWriter.commit``
packs mutations into txns with ``MetaKV.pack`` (at most ``MAX_TXN_OPS``
operations and ``TXN_BYTE_BUDGET`` bytes each, in order), sends each txn
through the ``MetaKV`` it was given (the leader's ``FencedKV`` adds the fence
guard to every one), and applies a txn's mutations to memory only after etcd
accepted that txn. So memory never shows what etcd does not have, and a
refused txn changes nothing in memory.

Two modes:

- ``atomic=True``: everything in one txn, or ``RequestTooLarge`` before
  anything is sent.
- ``atomic=False``: as many txns as the limits need, in order. A failure
  between txns leaves the earlier ones written (and applied to memory) and
  the later ones not. Callers use it only for records that tolerate a
  partial write and put any commit-point record last.

Every mutation is checked against the limits before the first txn is sent:
a single oversized record is refused with nothing written.

The ops are ``meta.txn`` values (range deletes share a txn with puts and key
deletes: ``release_collection`` is one txn), sent with ``MetaKV.txn``, which
``FencedKV`` guards; fencing therefore holds for every txn sent from here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from meta.errors import MetaUnavailable
from meta.kv import Batch, MetaKV, TxnResult
from meta.txn import TXN_BYTE_BUDGET, Delete, DeletePrefix, Op, Put, Unit

from .index import MetaIndex

__all__ = ["TXN_BYTE_BUDGET", "Mutation", "TxnWriter"]


@dataclass(slots=True)
class Mutation:
    """One logical change: etcd ops that go in the same txn, and their effect on memory."""

    ops: list[Op]
    apply: Callable[[MetaIndex], None]
    #: Bytes of ``ops`` in a txn when measured already (``Unit.ops_size``); -1: measured when packed.
    ops_size: int = -1


#: Txns of independent puts in flight at once, for all the writer's commits together: saves run side by side
#: (``querymeta.locks``), and a load's dozens of saves each keeping 8 in flight put hundreds on etcd at once.
_MAX_TXNS_IN_FLIGHT = 16


class TxnWriter:
    """Builds ops for one ``MetaKV`` and commits mutations (see module docstring).

    ``txns`` counts the write txns etcd accepted (the benchmark reports it).
    ``in_doubt`` is set when a txn ended in ``MetaUnavailable``: etcd may or
    may not have applied it (the answer was lost), so memory may now differ
    from etcd and the owner should ``reload`` once etcd answers again.
    ``NotLeader`` and ``RequestTooLarge`` are definite: nothing was written.
    """

    def __init__(self, kv: MetaKV):
        self.kv = kv
        self.txns = 0
        self.in_doubt = False
        self._in_flight: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def _slots(self) -> asyncio.Semaphore:
        """The writer's in-flight slots, for the running loop (a writer outlives no loop in practice; tests
        run one per test)."""
        loop = asyncio.get_running_loop()
        if self._in_flight is None or self._in_flight[0] is not loop:
            self._in_flight = (loop, asyncio.Semaphore(_MAX_TXNS_IN_FLIGHT))
        return self._in_flight[1]

    def put(self, key: str, message: Message) -> Put:
        return Put(key, message.SerializeToString())

    def independent_puts(self, puts: Sequence[Put], apply: Callable[[MetaIndex, int, int], None]) -> list[Mutation]:
        """Puts no txn needs together, as one mutation per range that fits a txn; ``apply(index, start, end)``
        is the memory effect of ``puts[start:end]``.

        Why: a mutation per record makes packing and applying a big load cost more than building the records.
        Each range still goes to etcd before memory shows it.
        """
        return [
            Mutation(list(puts[a:b]), lambda index, a=a, b=b: apply(index, a, b), size)  # type: ignore[misc]
            for a, b, size in self.kv.split_puts(puts)
        ]

    def delete(self, key: str) -> Delete:
        return Delete(key)

    def delete_prefix(self, prefix: str) -> DeletePrefix:
        return DeletePrefix(prefix)

    async def commit(
        self,
        operation: str,
        mutations: Sequence[Mutation],
        index: Callable[[], MetaIndex],
        *,
        atomic: bool,
    ) -> int:
        """Send ``mutations`` in txns, applying each txn to ``index()`` once etcd accepted it; return the count."""
        txns = self.kv.pack([Unit(m.ops, payload=m, ops_size=m.ops_size) for m in mutations], atomic=atomic)
        applied = self._applier(index)
        if not atomic and len(txns) > 1 and all(type(op) is Put for t in txns for op in t.ops):
            # Independent puts (rule 5 of ``core`` allows several txns): keep a few in flight instead of
            # waiting for each round trip; a 100,000-segment load spends most of its time here.
            await self._send_concurrently(operation, txns, applied)
            return len(txns)
        # Removals stay behind the saves they follow (a handoff never loses a segment first).
        try:
            await self.kv.write_packed(txns, operation=operation, on_sent=applied)
        except MetaUnavailable:
            self.in_doubt = True
            raise
        return len(txns)

    async def commit_streamed(
        self, operation: str, chunks: Iterable[Sequence[Mutation]], index: Callable[[], MetaIndex]
    ) -> int:
        """``commit`` of independent puts (``independent_puts``'s mutations, never ``atomic``) that ``chunks`` builds
        a txn or so at a time: each chunk's txns are on their way to etcd while the next chunk is built, instead of
        after the last one. Returns the txns used; every txn is tried, then the first error is raised.

        Why: a load's node answers with thousands of segments whose records cost as much CPU to build as etcd
        takes to write a few txns of them; building them all first kept etcd idle meanwhile, and the first write
        of the load started that much later. The caller makes sure no record can exceed a txn alone (a too large
        one would be refused with the chunks before it written).
        """
        applied = self._applier(index)
        sends: list[asyncio.Task[None]] = []
        loop = asyncio.get_running_loop()
        try:
            for mutations in chunks:
                for txn in self.kv.pack([Unit(m.ops, payload=m, ops_size=m.ops_size) for m in mutations]):
                    sends.append(loop.create_task(self._send_one(operation, txn, applied)))
                await asyncio.sleep(0)  # the new sends take their slots and go out before the next chunk is built
        finally:
            results = await asyncio.gather(*sends, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return len(sends)

    async def _send_one(self, operation: str, txn: Batch, applied: Callable[[Batch, TxnResult], None]) -> None:
        """One txn of independent puts in one of the writer's in-flight slots; applied to memory once accepted."""
        async with self._slots():
            try:
                result = await self.kv.txn((), txn.ops, operation=operation)
            except MetaUnavailable:
                self.in_doubt = True
                raise
        applied(txn, result)

    def _applier(self, index: Callable[[], MetaIndex]) -> Callable[[Batch, TxnResult], None]:
        """What follows each accepted txn: count it, apply its mutations to memory (etcd first, then memory)."""

        def applied(txn: Batch, _result: TxnResult) -> None:
            self.txns += 1
            target = index()
            for m in txn.payloads:
                m.apply(target)

        return applied

    async def _send_concurrently(
        self, operation: str, txns: Sequence[Batch], applied: Callable[[Batch, TxnResult], None]
    ) -> None:
        """Up to ``_MAX_TXNS_IN_FLIGHT`` txns of the writer at once; every one is tried, then the first error is
        raised."""
        sem = self._slots()

        async def send(i: int, txn: Batch) -> None:
            async with sem:
                try:
                    result = await self.kv.txn((), txn.ops, operation=f"{operation} ({i + 1}/{len(txns)})")
                except MetaUnavailable:
                    self.in_doubt = True
                    raise
            applied(txn, result)

        results = await asyncio.gather(*(send(i, t) for i, t in enumerate(txns)), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
