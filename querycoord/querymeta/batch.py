"""Turning query-meta changes into etcd txns within etcd's limits, then into memory.

A change is a ``Mutation``: the etcd operations that must be sent together
(one txn) and its effect on the in-memory ``MetaIndex``. ``TxnWriter.commit``
packs mutations into txns of at most ``MAX_TXN_OPS`` operations and
``TXN_BYTE_BUDGET`` bytes, in order, sends each txn through the ``MetaKV`` it
was given (the leader's ``FencedKV`` adds the fence guard to every one), and
applies a txn's mutations to memory only after etcd accepted that txn. So
memory never shows what etcd does not have, and a refused txn changes
nothing in memory.

Two modes:

- ``atomic=True``: everything in one txn, or ``RequestTooLarge`` before
  anything is sent.
- ``atomic=False``: as many txns as the limits need, in order. A failure
  between txns leaves the earlier ones written (and applied to memory) and
  the later ones not. Callers use it only for records that tolerate a
  partial write and put any commit-point record last.

Every mutation is checked against the limits before the first txn is sent:
a single oversized record is refused with nothing written.

Note on ``MetaKV`` internals: range deletes have to share a txn with puts and
key deletes (``release_collection`` is one txn), which ``MetaKV``'s public
API cannot express, so the ops are built with its ``_put_op`` /
``_delete_op`` / ``_delete_prefix_op`` helpers and sent with ``_write``, the
one method ``FencedKV`` overrides to add the guard. Fencing therefore holds
for every txn sent from here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from etcd3aio._protobuf import RequestOp
from google.protobuf.message import Message

from meta.errors import MetaUnavailable, RequestTooLarge
from meta.kv import MAX_TXN_BYTES, MAX_TXN_OPS, MetaKV

from .index import MetaIndex

#: Bytes a ``RequestOp`` adds to a ``TxnRequest`` besides its own size (field tag and length varint).
OP_OVERHEAD = 5
#: Room left in every txn for the leader fence's compare and failure read (a few hundred bytes at most).
TXN_HEADROOM = 16 * 1024
TXN_BYTE_BUDGET = MAX_TXN_BYTES - TXN_HEADROOM


@dataclass(slots=True)
class Mutation:
    """One logical change: etcd ops that go in the same txn, and their effect on memory."""

    ops: list[RequestOp]
    apply: Callable[[MetaIndex], None]
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = sum(op.ByteSize() + OP_OVERHEAD for op in self.ops)


def plan_txns(mutations: Sequence[Mutation], *, atomic: bool) -> list[list[Mutation]]:
    """Pack ``mutations`` (in order) into txns within the limits; raise ``RequestTooLarge`` if impossible."""
    total_ops = sum(len(m.ops) for m in mutations)
    total_bytes = sum(m.size for m in mutations)
    if atomic:
        if total_ops > MAX_TXN_OPS or total_bytes > TXN_BYTE_BUDGET:
            raise RequestTooLarge(total_ops, total_bytes + TXN_HEADROOM, MAX_TXN_OPS, MAX_TXN_BYTES)
        return [list(mutations)] if mutations else []
    for m in mutations:
        if len(m.ops) > MAX_TXN_OPS or m.size > TXN_BYTE_BUDGET:
            raise RequestTooLarge(len(m.ops), m.size + TXN_HEADROOM, MAX_TXN_OPS, MAX_TXN_BYTES)
    txns: list[list[Mutation]] = []
    current: list[Mutation] = []
    n_ops = n_bytes = 0
    for m in mutations:
        if current and (n_ops + len(m.ops) > MAX_TXN_OPS or n_bytes + m.size > TXN_BYTE_BUDGET):
            txns.append(current)
            current, n_ops, n_bytes = [], 0, 0
        current.append(m)
        n_ops += len(m.ops)
        n_bytes += m.size
    if current:
        txns.append(current)
    return txns


_MAX_TXNS_IN_FLIGHT = 8


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

    def put(self, key: str, message: Message) -> RequestOp:
        return self.kv._put_op(key, message.SerializeToString())

    def delete(self, key: str) -> RequestOp:
        return self.kv._delete_op(key)

    def delete_prefix(self, prefix: str) -> RequestOp:
        return self.kv._delete_prefix_op(prefix)

    async def commit(
        self,
        operation: str,
        mutations: Sequence[Mutation],
        index: Callable[[], MetaIndex],
        *,
        atomic: bool,
    ) -> int:
        """Send ``mutations`` in txns, applying each txn to ``index()`` once etcd accepted it; return the count."""
        txns = plan_txns(mutations, atomic=atomic)

        async def send(i: int, txn: Sequence[Mutation]) -> None:
            ops = [op for m in txn for op in m.ops]
            name = operation if len(txns) == 1 else f"{operation} ({i + 1}/{len(txns)})"
            try:
                await self.kv._write(name, ops)
            except MetaUnavailable:
                self.in_doubt = True
                raise
            self.txns += 1
            target = index()
            for m in txn:
                m.apply(target)

        if not atomic and len(txns) > 1 and all(op.HasField("request_put") for t in txns for m in t for op in m.ops):
            # Independent puts (rule 5 allows several txns): keep a few in flight instead of
            # waiting for each round trip; a 100,000-segment load spends most of its time here.
            sem = asyncio.Semaphore(_MAX_TXNS_IN_FLIGHT)

            async def bounded(i: int, txn: Sequence[Mutation]) -> None:
                async with sem:
                    await send(i, txn)

            results = await asyncio.gather(*(bounded(i, t) for i, t in enumerate(txns)), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        else:
            # Removals stay behind the saves they follow (a handoff never loses a segment first).
            for i, txn in enumerate(txns):
                await send(i, txn)
        return len(txns)
