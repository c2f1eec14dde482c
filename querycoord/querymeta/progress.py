"""Load progress reported without waiting: partition and replica percentages, persisted in the background.

A child that finished cannot await a write from its callback, so it reports here; the reports of a collection are
coalesced (at most one put in flight per collection, carrying the latest values) and only ever raise a
percentage. Progress is advisory: the final ``set_partition_state`` of a load is what counts.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from querycoord.common.partition_state import IN_MEMORY, PARTIAL

from .copies import copy_message
from .core import MetaCore, check_id, check_percentage
from .records import collection_percentage


class Progress:
    """Reports not yet persisted, per collection, and the flush that persists them."""

    def __init__(self, core: MetaCore):
        self._core = core
        self._partitions: dict[int, dict[int, int]] = {}
        self._replicas: dict[int, dict[int, int]] = {}
        self._flushing: set[int] = set()

    def set_progress(self, collection_id: int, partition_id: int, percentage: int) -> None:
        """Report a partition's load progress without waiting; it is persisted in the background.

        For callbacks that cannot await (a child finished). Reports are
        coalesced per collection (at most one put in flight per collection,
        carrying the latest values) and only ever raise a percentage: a late
        report cannot undo a ``set_partition_state(..., IN_MEMORY, 100)`` or
        lower progress already stored. State becomes PARTIAL_IN_MEMORY, or
        IN_MEMORY at 100. Memory changes only once etcd has the put (rule 1),
        so the new value shows after the flush; ``drain`` waits for it. A
        failed flush is logged and dropped: progress is advisory, the final
        ``set_partition_state`` is what counts. Reports for partitions that
        are not loaded (or get released meanwhile) are ignored.
        """
        check_id("partition", partition_id)
        check_percentage(percentage)
        pending = self._partitions.setdefault(collection_id, {})
        pending[partition_id] = max(percentage, pending.get(partition_id, 0))
        self._flush_soon(collection_id)

    def set_replica_progress(self, collection_id: int, replica_id: int, percentage: int) -> None:
        """Report one replica's load progress, as ``set_progress`` does for a partition (coalesced, raised only)."""
        check_percentage(percentage)
        pending = self._replicas.setdefault(collection_id, {})
        pending[replica_id] = max(percentage, pending.get(replica_id, 0))
        self._flush_soon(collection_id)

    def reports(self, collection_id: int) -> dict[int, int]:
        """The collection's partition reports not flushed yet (partition -> percentage), the live dict: a release
        of partitions drops their entries from it."""
        return self._partitions.get(collection_id, {})

    def forget(self, collection_id: int) -> None:
        """Drop the collection's partition reports not flushed yet (the collection was released)."""
        self._partitions.pop(collection_id, None)

    def _flush_soon(self, collection_id: int) -> None:
        if collection_id not in self._flushing:
            self._flushing.add(collection_id)
            self._core.track(asyncio.get_running_loop().create_task(self._flush(collection_id)))

    async def _flush(self, collection_id: int) -> None:
        core = self._core
        try:
            while self._partitions.get(collection_id) or self._replicas.get(collection_id):
                pending = self._partitions.pop(collection_id, {})
                replicas = self._replicas.pop(collection_id, {})

                async def body(pending: dict[int, int] = pending, replicas: dict[int, int] = replicas) -> None:
                    current = core.index.collections.get(collection_id)
                    if current is None:
                        return
                    info = copy_message(current)
                    for r in info.replicas:
                        r.in_memory_percentage = max(r.in_memory_percentage, replicas.get(r.replica_id, 0))
                    for p in info.partitions:
                        want = pending.get(p.partition_id)
                        if want is None or want <= p.in_memory_percentage or p.state == IN_MEMORY:
                            continue
                        p.in_memory_percentage = want
                        p.state = IN_MEMORY if want == 100 else PARTIAL
                    info.in_memory_percentage = collection_percentage(info)
                    if info != current:
                        await core.commit("set_progress", [core.put_collection(info)], atomic=True)

                await core.locked(lambda: [collection_id], body, None)
        except Exception as exc:
            logger.warning("load progress of collection {} not persisted (advisory, dropped): {}", collection_id, exc)
        finally:
            self._flushing.discard(collection_id)
