"""Many keys read by txns of gets: a repair's catalog records, an eighth of each partition's.

Why not the other reads: a key read alone is one round trip each (a lost node's 125,000 records at a million
segments); a range over keys spread thinly reads every key between them (eight times the records wanted when a
node held an eighth of each partition, all parsed by the reader). A txn of ``MAX_TXN_OPS`` gets reads exactly
the keys wanted in one round trip.

Why each txn carries a delete in its failure branch, which never runs (the txn has no compare, so its success
branch is taken): etcd before 3.5.5 panics when a read-only txn is cancelled (etcd-io/etcd#14110, DESIGN: the
embedded etcd is 3.5.1, and a coordinator that loses its leadership cancels its reads). A txn with a write op is
not read-only to etcd: it is applied through raft, where a caller's cancel does not reach. The delete names a key
nothing writes (``NEVER_WRITTEN``): even taken, it would delete nothing.

Each txn reads at its own revision: callers that need one snapshot read a range instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

from meta.kv import MetaKV
from meta.txn import MAX_TXN_OPS, delete

# The never-taken branch's key: under the reader's root, so that a role allowed to write there may send the txn.
NEVER_WRITTEN = "_get_many/never-written"
# Txns in flight at once: etcd batches concurrent proposals into one raft round.
CONCURRENCY = 8


async def get_many(kv: MetaKV, keys: Sequence[str], *, concurrency: int = CONCURRENCY,
                   operation: str = "get_many") -> dict[str, bytes]:
    """``key -> value`` of those of ``keys`` that exist, read by txns of at most ``MAX_TXN_OPS`` gets
    (``MetaKV.txn_values``: no object per key but the value), ``concurrency`` at once. A txn whose answer exceeds
    the client's receive limit (records of many binlogs) is read again in halves."""
    found: dict[str, bytes] = {}
    distinct = list(dict.fromkeys(keys))
    gate = asyncio.Semaphore(concurrency)
    guard = (delete(NEVER_WRITTEN),)

    async def read(batch: Sequence[str]) -> None:
        try:
            async with gate:
                values = await kv.txn_values(batch, on_failure_ops=guard, operation=operation)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or len(batch) == 1:
                raise
            half = len(batch) // 2
            await asyncio.gather(read(batch[:half]), read(batch[half:]))
            return
        found.update(values)

    await asyncio.gather(*(read(distinct[i:i + MAX_TXN_OPS]) for i in range(0, len(distinct), MAX_TXN_OPS)))
    return found


__all__ = ["CONCURRENCY", "NEVER_WRITTEN", "get_many"]
