"""Lower the percentages persisted in query meta to what online nodes serve.

The leader shows the lower of the persisted and the derived figures (``state.shown_collection``), so for its own
answers this is not needed; it is for whoever reads etcd instead (a standby, ``querycoord meta show``, the next
leader before its first check): when a node is lost, what it held stops counting there too, in the same moment
as it leaves query meta. Only ever lowers: raising is the checker's, from what nodes report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from proto import data_pb2
from querycoord.served.state import CollectionServed

if TYPE_CHECKING:
    from querycoord.querymeta import QueryMeta

PARTIAL = data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY


async def persist_lowered(meta: QueryMeta, collection_ids: Iterable[int],
                          served: Callable[[int], CollectionServed | None]) -> int:
    """Write lowered partition and replica percentages of ``collection_ids`` where ``served`` says less than
    what is persisted; returns how many collections were written."""
    written = 0
    for cid in collection_ids:
        info = meta.get_collection(cid)
        now = served(cid)
        if info is None or now is None:
            continue
        states: dict[int, tuple[data_pb2.PartitionState, int]] = {}
        for p in info.partitions:
            live = now.partition_percentage(p.partition_id)
            if live < p.in_memory_percentage:
                states[p.partition_id] = (PARTIAL, live)
        replicas = {r.replica_id: now.replicas[r.replica_id].percentage for r in info.replicas
                    if r.replica_id in now.replicas and now.replicas[r.replica_id].percentage < r.in_memory_percentage}
        if states:
            await meta.set_partition_states(cid, states)
        if replicas:
            await meta.set_replica_percentages(cid, replicas)
        written += bool(states or replicas)
    return written
