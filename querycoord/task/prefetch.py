"""The catalog records of a repair's next parts, read while the parts before them run.

A lost node's repair larger than one etcd write goes in parts, one after the other (``checkers.lost``): each part
first reads the catalog records (binlogs) of what it loads, a range read of each partition that holds them, and only
then plans and loads: the nodes wait while it reads. So when a part is queued, the records of the copies that come
after it (the next parts, as far as can be told now: ``checkers.lost.READ_AHEAD_PARTS``) are read in the
background, one part after the other, and each later repair of that collection takes them instead of reading them
again (``RepairTask``). A part already being read is not read again by the next part's start.

What is taken is checked as a fresh read would be: only segments the followed catalog copy, brought up to etcd's
revision first, still holds (one compacted or dropped meanwhile is not loaded), and only segments the repair asks
for; whatever the read did not bring (a part that turned out different, a failed read) is read then as before.
``KEEP`` reads per collection at most (the queued part's and those of the parts after it), kept in the leader's
memory (a new leader reads afresh); a chain that stops drops them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence

from loguru import logger

from proto import data_pb2
from querycoord.catalog.broker import Broker

# Partitions read at once (as a repair's own read: ``task.repair.PARTITION_READS``).
PARTITION_READS = 8
# Seconds a repair waits for the followed catalog copy to reach etcd's revision before it trusts what was read
# ahead (past them it reads everything itself).
CATCH_UP = 5.0
# Reads kept per collection: the queued part's and those of the parts read ahead after it
# (``checkers.lost.READ_AHEAD_PARTS``).
KEEP = 4


class CatalogPrefetch:
    """Background catalog reads of segments a repair of a collection is expected to load next."""

    def __init__(self) -> None:
        # collection -> its reads not taken yet, oldest first (the queued part's, then the parts after it), each with
        # the segment ids it reads
        self._reads: dict[int, list[tuple[frozenset[int], asyncio.Future[dict[int, data_pb2.SegmentBinlogs]]]]] = {}
        self._generation: dict[int, int] = {}  # collection -> its drops (a take's leftovers after one are not kept)
        self.started = 0  # reads started (tests, logs)
        self.taken = 0  # records a repair took instead of reading them

    def start(self, broker: Broker, collection_id: int, parts: Sequence[Mapping[int, Sequence[int]]]) -> None:
        """Read the catalog records of ``parts`` (each partition -> segment ids) of ``collection_id`` in the
        background, one part after the other, after the reads of the collection still running; segments a kept
        read covers already are not read again. At most ``KEEP`` reads of one collection are kept: a newer one
        pushes out the oldest."""
        reads = self._reads.setdefault(collection_id, [])
        covered = frozenset().union(*(ids for ids, _ in reads))
        for part in parts:
            wanted = {pid: [s for s in ids if s not in covered] for pid, ids in part.items()}
            wanted = {pid: ids for pid, ids in wanted.items() if ids}
            if not wanted:
                continue
            after = reads[-1][1] if reads else None
            task = asyncio.get_running_loop().create_task(_read(broker, collection_id, wanted, after),
                                                          name=f"catalog-prefetch-{collection_id}")
            task.add_done_callback(_retrieved)  # best effort: a read that fails and that nobody takes is no error
            reads.append((frozenset(s for ids in wanted.values() for s in ids), task))
            self.started += 1
        while len(reads) > KEEP:
            _forget(reads.pop(0)[1])
        if not reads:
            self._reads.pop(collection_id, None)

    def done(self, collection_id: int) -> bool:
        """Whether every read of ``collection_id`` has ended (tests)."""
        return all(t.done() for _, t in self._reads.get(collection_id, ()))

    def drop(self, collection_id: int) -> None:
        """Forget (and stop) the reads of ``collection_id``, if any."""
        self._generation[collection_id] = self._generation.get(collection_id, 0) + 1
        for _, task in self._reads.pop(collection_id, ()):
            _forget(task)

    async def take(self, collection_id: int, segment_ids: Collection[int]) -> dict[int, data_pb2.SegmentBinlogs]:
        """The records of ``segment_ids`` read for ``collection_id`` by the reads that cover any of them (waiting for
        them if they still run), by segment id; those reads are taken, the others (a later part's) stay, and so do
        the records they brought that were not asked for (a part a little larger than the one before it takes
        the first records of the next part's read, and that part takes the rest). A failed read brings nothing."""
        reads = self._reads.get(collection_id, [])
        wanted = set(segment_ids)
        mine = [task for ids, task in reads if not ids.isdisjoint(wanted)]
        reads[:] = [(ids, task) for ids, task in reads if ids.isdisjoint(wanted)]
        if not reads:
            self._reads.pop(collection_id, None)
        generation = self._generation.get(collection_id, 0)
        out: dict[int, data_pb2.SegmentBinlogs] = {}
        for task in mine:
            try:
                out.update(await asyncio.shield(task))
            except asyncio.CancelledError:
                if not task.cancelled():  # the caller is cancelled, not the read: nobody takes these reads now
                    for read in mine:
                        _forget(read)
                    raise
            except Exception as exc:  # the repair reads them itself
                logger.info("catalog prefetch of collection {} failed ({}); read again", collection_id, exc)
        rest = {s: rec for s, rec in out.items() if s not in wanted}
        if rest and self._generation.get(collection_id, 0) == generation:  # not dropped meanwhile
            left: asyncio.Future[dict[int, data_pb2.SegmentBinlogs]] = asyncio.get_running_loop().create_future()
            left.set_result(rest)
            self._reads.setdefault(collection_id, []).insert(0, (frozenset(rest), left))
        return {s: rec for s, rec in out.items() if s in wanted}

    async def close(self) -> None:
        """Stop every read (the leadership ends: a new leader reads afresh)."""
        for cid in list(self._reads):
            self.drop(cid)


def _retrieved(task: asyncio.Future[dict[int, data_pb2.SegmentBinlogs]]) -> None:
    if not task.cancelled():
        task.exception()


def _forget(task: asyncio.Future[dict[int, data_pb2.SegmentBinlogs]]) -> None:
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()  # a failed read nobody takes is no "never retrieved" warning


async def _read(broker: Broker, collection_id: int, by_partition: dict[int, list[int]],
                after: asyncio.Future[dict[int, data_pb2.SegmentBinlogs]] | None) -> dict[int, data_pb2.SegmentBinlogs]:
    if after is not None:
        await asyncio.wait([after])  # one part's read after the other: the earliest part is ready first
    gate = asyncio.Semaphore(PARTITION_READS)

    async def one(pid: int, ids: list[int]) -> list[data_pb2.SegmentBinlogs]:
        async with gate:
            _, binlogs = await broker.get_recovery_info(collection_id, pid, ids)
        return binlogs

    parts = await asyncio.gather(*(one(pid, ids) for pid, ids in sorted(by_partition.items())))
    return {b.segment_id: b for part in parts for b in part}


__all__ = ["CATCH_UP", "CatalogPrefetch"]
