"""Lower the percentages persisted in query meta to what online nodes serve (and to what a release is dropping).

The leader shows the lower of the persisted and the derived figures (``state.shown_collection``), so for its own
answers this is not needed; it is for whoever reads etcd instead (a standby, ``querycoord meta show``, the next
leader before its first check): when a node is lost, what it held stops counting there too, in the same moment
as it leaves query meta. Only ever lowers: raising is the checker's, from what nodes report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from querycoord.common.partition_state import IN_MEMORY, PARTIAL, PartitionState
from querycoord.served.state import CollectionServed

if TYPE_CHECKING:
    from querycoord.querymeta import QueryMeta



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
        states: dict[int, tuple[PartitionState, int]] = {}
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


async def persist_raised(meta: QueryMeta, collection_id: int, now: CollectionServed | None) -> bool:
    """Raise the persisted partition and replica percentages of ``collection_id`` to what ``now`` (its served
    figures) says where that is more (a partition at 100 % is IN_MEMORY again); True when something was written.

    Only against the catalog's own target (``target_from_catalog``): meta's records standing in for it would let
    a collection missing a segment meta never recorded claim 100 %. The caller makes sure no trigger owns the
    collection (a load's percentages are its own until it ends) and that the catalog copy is current."""
    info = meta.get_collection(collection_id)
    if info is None or now is None or not now.target_from_catalog:
        return False
    states: dict[int, tuple[PartitionState, int]] = {}
    for p in info.partitions:
        if p.partition_id not in now.partitions:
            continue
        live = now.partition_percentage(p.partition_id)
        if live > p.in_memory_percentage:
            states[p.partition_id] = (IN_MEMORY if live == 100 else PARTIAL, live)
    replicas = {r.replica_id: now.replicas[r.replica_id].percentage for r in info.replicas
                if r.replica_id in now.replicas and r.replica_id not in now.joining
                and now.replicas[r.replica_id].percentage > r.in_memory_percentage}
    if states:
        await meta.set_partition_states(collection_id, states)
    if replicas:
        await meta.set_replica_percentages(collection_id, replicas)
    return bool(states or replicas)


async def persist_releasing(meta: QueryMeta, collection_id: int, partition_ids: Iterable[int] | None = None) -> None:
    """Lower the persisted percentages of what a release is about to drop: the partitions to 0 %, each replica to
    the share of the collection's segments that stays (0 % for the whole collection).

    Why: the leader shows the lower of these and what online nodes serve by query meta's copies, and meta forgets
    the released copies only when the release ends. A release whose child waits for a node that died (until its
    session lapses) would otherwise show the collection whole for that long while its nodes hold nothing of it
    (DESIGN rule 8). Two puts, whatever the collection's size; if the release never commits (its leader died
    first), the checker's next pass sets them from the nodes."""
    info = meta.get_collection(collection_id)
    if info is None:
        return
    loaded = {p.partition_id for p in info.partitions}
    going = loaded if partition_ids is None else loaded & set(partition_ids)
    if not going:
        return
    await meta.set_partition_states(collection_id, {pid: (PARTIAL, 0) for pid in sorted(going)})
    stays = 0
    if going != loaded:
        counts = {pid: len(meta.segment_ids_of(collection_id, pid)) for pid in loaded}
        total = sum(counts.values())
        stays = sum(n for pid, n in counts.items() if pid not in going) * 100 // total if total else 100
    await meta.set_replica_percentages(collection_id, {r.replica_id: min(r.in_memory_percentage, stays)
                                                       for r in info.replicas})
