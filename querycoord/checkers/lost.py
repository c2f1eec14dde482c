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
from dataclasses import dataclass, field

from proto import data_pb2, task_pb2
from querycoord.catalog.targets import CatalogTargets
from querycoord.common.target import TargetSegment
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies

# A repeated message field's tag and length prefix, as encoded: what each entry adds beside its own bytes.
_FIELD_OVERHEAD = 3


def replica_of_copy(flat: tuple[int, ...], node_id: int) -> int | None:
    """The replica of the copy on ``node_id`` in a record's flat copies (replica, node, ...); None if it has none."""
    for i in range(0, len(flat) - 1, 2):
        if flat[i + 1] == node_id:
            return flat[i]
    return None


# Parts of a lost node's repair whose catalog records are read ahead (``task.prefetch``): read one after the other
# from the moment the first part is queued, so that each part finds its records read (at a million segments a part's
# read competes with the part before it for etcd and the loop, and one part ahead was not always done in time).
READ_AHEAD_PARTS = 3


@dataclass
class LostRepairs:
    """Collection -> the repair of what lost nodes held of it, each at most what one etcd write holds, and
    collection -> the copies left for a later part (not built: beyond the byte budget)."""

    requests: dict[int, task_pb2.RepairRequest] = field(default_factory=dict)
    later: dict[int, int] = field(default_factory=dict)
    # collection -> the next parts as far as can be told now (up to ``READ_AHEAD_PARTS``, each as many of the later
    # copies as its request holds), each partition -> segment ids: their catalog records are read ahead, one part
    # after the other (``task.prefetch``).
    ahead: dict[int, list[dict[int, list[int]]]] = field(default_factory=dict)
    # collection -> every copy the lost nodes' records place in it, built or not: ``lost_copy_count`` of them at
    # the build, counted on the way (what a repair's chain compares the next part's count with).
    copies: dict[int, int] = field(default_factory=dict)


def lost_node_ids(meta: QueryMeta, online: Collection[int]) -> set[int]:
    """Nodes only segment records still name: not online and in no replica, no DM channel watch on them (lost
    nodes a forget took out, ``watchers.forget_node``). Their copies count for nothing and wait for a repair."""
    return {n for n in meta.known_node_ids() - meta.bound_node_ids() if n not in online}


def lost_copy_count(meta: QueryMeta, node_ids: Iterable[int], collection_id: int) -> int:
    """How many copies of ``collection_id`` the records still place on ``node_ids`` (kept counted by query meta:
    asked at the end of each part of a repair, it walked the lost node's every copy)."""
    return sum(meta.copy_count_on_node(node_id, collection_id) for node_id in node_ids)


def unwatched_channels(meta: QueryMeta, targets: CatalogTargets | None,
                       collection_id: int) -> list[data_pb2.DmChannelWatchInfo]:
    """The target DM channels of ``collection_id`` that no watch record places in one of its replicas: what a
    forget took with a lost node and no repair watched again yet (a node lost while another's repair owned the
    collection: its forget could not queue them). Rewatches as the checker's channel check builds them."""
    channels = targets.dm_channels(collection_id) if targets is not None else None
    if channels is None or not meta.has_collection(collection_id):
        return []
    pids = [] if meta.get_load_type(collection_id) == data_pb2.LOAD_TYPE_COLLECTION \
        else sorted(meta.partition_ids(collection_id))
    out = []
    for name in sorted(channels):
        recorded = meta.get_dm_channel(collection_id, name)
        watched = copies(recorded) if recorded is not None else {}
        parts = list(recorded.partition_ids) if recorded is not None else pids
        out += [data_pb2.DmChannelWatchInfo(collection_id=collection_id, dm_channel=name, node_id=0,
                                            replica_id=replica, partition_ids=parts)
                for replica in meta.replica_ids(collection_id) if not watched.get(replica)]
    return out


def lost_repairs(meta: QueryMeta, targets: CatalogTargets | None, node_ids: Iterable[int],
                 watches: Iterable[data_pb2.DmChannelWatchInfo], skip: Collection[int] = (), *,
                 only: int | None = None, budget: int = 0) -> LostRepairs:
    """The repairs of what ``node_ids`` (lost, already out of their replicas) held: every copy their segment
    records still place on them, and ``watches`` (their DM channel watches as recorded before the forget), each
    of a target segment or channel, in a replica that still exists. Collections in ``skip`` are left out; with
    ``only``, every collection but that one.

    ``budget`` (bytes, 0: none): a collection's request stops growing once its encoded size reaches it, and the
    copies after are only counted (``later``), not built: one etcd write holds no more (``repair_size``), so
    building them would be work thrown away; the first of them (as many as the request holds) are named in
    ``ahead``. The DM channel watches come first (a cut never drops one)."""
    out = LostRepairs()
    if targets is None:
        return out
    requests, size = out.requests, dict[int, int]()
    replicas: dict[int, set[int]] = {}

    def wanted(cid: int) -> bool:
        return cid not in skip and (only is None or cid == only)

    for w in watches:
        cid = w.collection_id
        channels = targets.dm_channels(cid)
        if not wanted(cid) or channels is None or w.dm_channel not in channels or not meta.has_collection(cid) \
                or w.replica_id not in replicas.setdefault(cid, set(meta.replica_ids(cid))):
            continue
        watch = data_pb2.DmChannelWatchInfo(collection_id=cid, dm_channel=w.dm_channel, node_id=0,
                                            replica_id=w.replica_id, partition_ids=list(w.partition_ids))
        requests.setdefault(cid, task_pb2.RepairRequest()).rewatch.append(watch)
        size[cid] = size.get(cid, 0) + _FIELD_OVERHEAD + watch.ByteSize()
    for node_id in node_ids:
        for (cid, pid, flat), ids in _by_place(meta, node_id).items():
            if not wanted(cid):
                continue
            out.copies[cid] = out.copies.get(cid, 0) + len(ids)
            if budget and size.get(cid, 0) >= budget:
                _count_later(out, cid, pid, ids)
                continue
            replica = replica_of_copy(flat, node_id)
            if replica is None or replica not in replicas.setdefault(cid, set(meta.replica_ids(cid))):
                continue
            segments = targets.partition_segments(cid, pid) if meta.has_partition(cid, pid) else None
            if segments is None:
                continue
            _add_copies(out, size, (cid, pid, node_id, replica), ids, segments, budget)
    return out


def _add_copies(out: LostRepairs, size: dict[int, int], where: tuple[int, int, int, int], ids: list[int],
                segments: Mapping[int, TargetSegment], budget: int) -> None:
    """Add the copies ``ids`` of one place (``where``: collection, partition, lost node, replica) that the target
    ``segments`` holds to the collection's request while its encoded size (``size``) is under ``budget``; the rest are
    counted as later (``_count_later``). One pass over the ids, no (id, segment) pair built per copy: a place holds
    a node's copies of a partition (a hundred thousand at a million segments), and those pairs kept the cyclic GC
    busy."""
    cid, pid, node_id, replica = where
    get = segments.get
    add = None  # the collection's request's, once a copy of this place is in the target
    for i, sid in enumerate(ids):
        seg = get(sid)
        if seg is None:
            continue
        if add is None:
            add = out.requests.setdefault(cid, task_pb2.RepairRequest()).missing_segments.add
        elif budget and size.get(cid, 0) >= budget:
            _count_later(out, cid, pid, [s for s in ids[i:] if s in segments])
            return
        # ``add`` builds each entry in place (``append`` would copy one built aside)
        info = add(segment_id=sid, collection_id=cid, partition_id=pid, node_id=node_id, replica_id=replica,
                   mem_size=seg.mem_size)
        if budget:
            size[cid] = size.get(cid, 0) + _FIELD_OVERHEAD + info.ByteSize()


def _count_later(out: LostRepairs, cid: int, pid: int, ids: list[int]) -> None:
    """Count ``ids`` (copies of partition ``pid`` of ``cid``) as left for a later part, naming the first of the
    later copies in ``ahead``, part by part, while they fill fewer than ``READ_AHEAD_PARTS`` parts of the size of
    the request (the next parts as far as can be told)."""
    named = out.later.get(cid, 0)
    out.later[cid] = named + len(ids)
    per_part = len(out.requests[cid].missing_segments)
    limit = per_part * READ_AHEAD_PARTS
    start = 0
    while named < limit and start < len(ids):
        part, offset = divmod(named, per_part)
        take = min(per_part - offset, len(ids) - start)
        parts = out.ahead.setdefault(cid, [])
        while len(parts) <= part:
            parts.append({})
        parts[part].setdefault(pid, []).extend(ids[start:start + take])
        start += take
        named += take


def _by_place(meta: QueryMeta, node_id: int) -> dict[tuple[int, int, tuple[int, ...]], list[int]]:
    """The ids of the copies recorded on ``node_id`` by their record's place (collection, partition, copies): what
    is decided once per place (records share their place tuple: a handful per node) is not decided again per
    segment. Each collection's groups are kept with its segment records (``QueryMeta.places_on_node``)."""
    out: dict[tuple[int, int, tuple[int, ...]], list[int]] = {}
    for cid in sorted(meta.collections_on_node(node_id)):
        out.update(meta.places_on_node(node_id, cid))
    return out


__all__ = ["LostRepairs", "lost_copy_count", "lost_node_ids", "lost_repairs", "replica_of_copy",
           "unwatched_channels"]
