"""A lost node's repair, built at its forget from what query meta places on it, not found by a pass comparing
every segment of every collection.

Modelled on Milvus's node-down load balance, which builds its request from the lost node's segments and DM
channels. When a query node's session ends and its forget takes it out of its replicas (``watchers.forget_node``),
the segment records still naming it are exactly the copies it took with it, one per (segment, replica) (query
meta's per-node index), and the DM channel watches it had (read before the forget drops them) are the watches its
replicas lack. One REPAIR request per collection is built from them; the checker queues each through its own path
(``Checker.repair_lost``): units weighed and parked, inactive kinds dropped, cut to one etcd write, and only while
no trigger owns the collection.

Only what the target still holds is repaired (the followed catalog copy: a segment compacted or dropped meanwhile
is not loaded again); without a followed copy (a remote catalog) nothing is built and the pass does it. The checker
stays the safety net: whatever this leaves (a collection busy at the time, the rest of a cut repair, a segment the
copy did not know yet, a leader gone before the queue) the next pass finds by comparison, and a repair's planning
re-reads meta, so a copy loaded meanwhile is not loaded twice.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from proto import data_pb2, task_pb2
from querycoord.catalog.targets import CatalogTargets
from querycoord.querymeta import QueryMeta


def replica_of_copy(flat: tuple[int, ...], node_id: int) -> int | None:
    """The replica of the copy on ``node_id`` in a record's flat copies (replica, node, ...); None if it has none."""
    for i in range(0, len(flat) - 1, 2):
        if flat[i + 1] == node_id:
            return flat[i]
    return None


def lost_node_repairs(meta: QueryMeta, targets: CatalogTargets | None, node_id: int,
                      watches: Iterable[data_pb2.DmChannelWatchInfo],
                      skip: Collection[int] = ()) -> dict[int, task_pb2.RepairRequest]:
    """Collection -> the repair of what ``node_id`` (lost, already out of its replicas) held of it: every copy its
    segment records still place on it, and ``watches`` (its DM channel watches as recorded before the forget),
    each of a target segment or channel, in a replica that still exists. Collections in ``skip`` are left out."""
    return lost_nodes_repairs(meta, targets, {node_id: watches}, skip)


def lost_nodes_repairs(meta: QueryMeta, targets: CatalogTargets | None,
                       lost: Mapping[int, Iterable[data_pb2.DmChannelWatchInfo]],
                       skip: Collection[int] = ()) -> dict[int, task_pb2.RepairRequest]:
    """``lost_node_repairs`` of several lost nodes (``lost``: node -> its DM channel watches as recorded before its
    forget), one repair per collection for all of them: a takeover that forgets nodes gone while no leader watched
    queues one repair of each collection, not one for the first node while the others wait for it to end."""
    out: dict[int, task_pb2.RepairRequest] = {}
    if targets is None:
        return out
    replicas: dict[int, set[int]] = {}
    for node_id, watches in sorted(lost.items()):
        _add_segments(out, meta, targets, node_id, skip, replicas)
        _add_watches(out, meta, targets, watches, skip, replicas)
    return out


def _add_segments(out: dict[int, task_pb2.RepairRequest], meta: QueryMeta, targets: CatalogTargets, node_id: int,
                  skip: Collection[int], replicas: dict[int, set[int]]) -> None:
    """Add to ``out`` every copy the segment records still place on ``node_id``, of a target segment in a replica
    that still exists (``replicas``: each collection's, filled on first use)."""
    for (cid, pid, flat), ids in _by_place(meta, node_id).items():
        if cid in skip:
            continue
        replica = replica_of_copy(flat, node_id)
        if replica is None or replica not in replicas.setdefault(cid, set(meta.replica_ids(cid))):
            continue
        segments = targets.partition_segments(cid, pid) if meta.has_partition(cid, pid) else None
        if segments is None:
            continue
        get = segments.get
        found = [(sid, seg) for sid in ids if (seg := get(sid)) is not None]
        if not found:
            continue
        add = out.setdefault(cid, task_pb2.RepairRequest()).missing_segments.add
        for sid, seg in found:  # ``add`` builds each entry in place (``append`` would copy one built aside)
            add(segment_id=sid, collection_id=cid, partition_id=pid, node_id=node_id, replica_id=replica,
                mem_size=seg.mem_size)


def _add_watches(out: dict[int, task_pb2.RepairRequest], meta: QueryMeta, targets: CatalogTargets,
                 watches: Iterable[data_pb2.DmChannelWatchInfo], skip: Collection[int],
                 replicas: dict[int, set[int]]) -> None:
    """Add to ``out`` each of ``watches`` of a target DM channel, in a replica that still exists, to be watched
    again."""
    for w in watches:
        cid = w.collection_id
        channels = targets.dm_channels(cid)
        if cid in skip or channels is None or w.dm_channel not in channels or not meta.has_collection(cid) \
                or w.replica_id not in replicas.setdefault(cid, set(meta.replica_ids(cid))):
            continue
        out.setdefault(cid, task_pb2.RepairRequest()).rewatch.append(data_pb2.DmChannelWatchInfo(
            collection_id=cid, dm_channel=w.dm_channel, node_id=0, replica_id=w.replica_id,
            partition_ids=list(w.partition_ids)))


def _by_place(meta: QueryMeta, node_id: int) -> dict[tuple[int, int, tuple[int, ...]], list[int]]:
    """The ids of the copies recorded on ``node_id`` by their record's place (collection, partition, copies), sorted
    within each: what is decided once per place (records share their place tuple: a handful per node) is not
    decided again per segment."""
    places = meta.segment_places()
    ids = meta.segment_ids_on_node(node_id)
    out: dict[tuple[int, int, tuple[int, ...]], list[int]] = {}
    for sid, place in zip(ids, map(places.get, ids), strict=True):
        if place is not None:
            group = out.get(place)
            if group is None:
                out[place] = [sid]
            else:
                group.append(sid)
    return out


__all__ = ["lost_node_repairs", "lost_nodes_repairs", "replica_of_copy"]
