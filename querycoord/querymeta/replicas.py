"""Replicas of a loaded collection: which nodes serve each, how far each is loaded, and what each holds.

A collection's replicas live in its ``CollectionLoadInfo`` (``replicas``: id, nodes, percentage); what a replica
holds (segment copies, DM channel watches) is read from the segment and channel records. Replicas of one
collection never share a node, so a node names at most one replica of it; the functions here resolve the replica
of a copy for the segment and channel writers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from proto import data_pb2

from .copies import copies, copy_message
from .core import MetaCore, check_id, check_percentage, unique_ids
from .index import MetaIndex
from .records import CollectionLoadInfo, DmChannelWatchInfo, SegmentInfo


def check_replicas(collection_id: int, replicas: list[data_pb2.ReplicaInfo]) -> None:
    """Replicas of a new load: positive distinct ids, of this collection, with disjoint nodes."""
    ids: set[int] = set()
    nodes: set[int] = set()
    for r in replicas:
        check_id("replica", r.replica_id)
        if r.replica_id in ids:
            raise ValueError(f"replica {r.replica_id} appears twice")
        if r.collection_id != collection_id:
            raise ValueError(f"replica {r.replica_id} belongs to collection {r.collection_id}, not {collection_id}")
        shared = nodes.intersection(r.node_ids)
        if shared:
            raise ValueError(f"nodes {sorted(shared)} are in two replicas of collection {collection_id}")
        ids.add(r.replica_id)
        nodes.update(r.node_ids)


def leave_replicas(info: CollectionLoadInfo, node_id: int) -> CollectionLoadInfo:
    """A copy of the record with ``node_id`` out of every replica (the node is gone)."""
    out = copy_message(info)
    for r in out.replicas:
        if node_id in r.node_ids:
            r.node_ids[:] = [n for n in r.node_ids if n != node_id]
    return out


def replica_of_node(index: MetaIndex, collection_id: int, node_id: int) -> int:
    """The replica of the collection the node serves; 0 when it serves none (a spare)."""
    info = index.collections.get(collection_id)
    for r in info.replicas if info is not None else ():
        if node_id in r.node_ids:
            return r.replica_id
    return 0


def sole_replica(index: MetaIndex, collection_id: int) -> int:
    """The collection's replica when it has exactly one; 0 otherwise."""
    info = index.collections.get(collection_id)
    return info.replicas[0].replica_id if info is not None and len(info.replicas) == 1 else 0


def with_replica(index: MetaIndex, view: SegmentInfo | DmChannelWatchInfo) -> SegmentInfo | DmChannelWatchInfo:
    """``view``, or a copy of it naming the replica of its node when it names none."""
    if view.replica_id or not view.node_id:
        return view
    out = copy_message(view)
    out.replica_id = replica_of_node(index, view.collection_id, view.node_id) or sole_replica(
        index, view.collection_id)
    return out


class Replicas:
    """Reads and writes of the collections' replicas."""

    def __init__(self, core: MetaCore):
        self._core = core

    # ===== reads =======================================================================
    def replicas_of(self, collection_id: int) -> list[data_pb2.ReplicaInfo]:
        """The collection's replicas by id, each with its nodes (sorted), progress, copies held and DM channels.

        A collection loaded before replicas existed has none recorded: it shows one replica, id 0, on the nodes
        that hold its copies. [] when the collection is not loaded. Derived once per change of the collection's
        records (``MetaIndex.view``), not per call: it walks every segment of the collection.
        """
        index = self._core.index
        info = index.collections.get(collection_id)
        if info is None:
            return []
        view = index.view("replicas", collection_id, lambda: self._derive(info))
        return [copy_message(r) for r in view]

    def _derive(self, info: CollectionLoadInfo) -> list[data_pb2.ReplicaInfo]:
        index = self._core.index
        collection_id = info.collection_id
        replicas = [copy_message(r) for r in info.replicas] or [data_pb2.ReplicaInfo(
            replica_id=0, collection_id=collection_id, in_memory_percentage=info.in_memory_percentage)]
        held: dict[int, int] = {}
        nodes: dict[int, set[int]] = {}
        places = index.segments.places()
        for sid in index.segment_ids_of(collection_id):
            flat = places[sid][2]
            for r, n in zip(flat[::2], flat[1::2], strict=True):
                held[r] = held.get(r, 0) + 1
                nodes.setdefault(r, set()).add(n)
        channels: dict[int, list[tuple[str, int]]] = {}
        for name, watch in sorted(index.dm_channels.get(collection_id, {}).items()):
            for r, n in copies(watch).items():
                channels.setdefault(r, []).append((name, n))
                nodes.setdefault(r, set()).add(n)
        for r in replicas:
            if not info.replicas:
                r.node_ids.extend(sorted(nodes.get(0, ())))
            r.node_ids[:] = sorted(r.node_ids)
            r.segment_count = held.get(r.replica_id, 0)
            watched = channels.get(r.replica_id, [])
            r.dm_channels.extend(name for name, _ in watched)
            r.dm_channel_nodes.extend(node for _, node in watched)
        return replicas

    def replica_ids(self, collection_id: int) -> list[int]:
        """Ids of the collection's replicas; [0] for a collection loaded before replicas, [] when not loaded."""
        info = self._core.index.collections.get(collection_id)
        if info is None:
            return []
        return [r.replica_id for r in info.replicas] or [0]

    def replica_nodes(self, collection_id: int, replica_id: int) -> list[int]:
        """The nodes of one replica (sorted); [] for an unknown replica or the implicit replica 0."""
        info = self._core.index.collections.get(collection_id)
        for r in info.replicas if info is not None else ():
            if r.replica_id == replica_id:
                return sorted(r.node_ids)
        return []

    def replica_of_node(self, collection_id: int, node_id: int) -> int:
        """The replica of the collection the node serves; 0 when it serves none (a spare)."""
        return replica_of_node(self._core.index, collection_id, node_id)

    def replica_node_ids(self, collection_id: int) -> set[int]:
        """Every node serving some replica of the collection."""
        info = self._core.index.collections.get(collection_id)
        return {n for r in info.replicas for n in r.node_ids} if info is not None else set()

    # ===== writes ======================================================================
    async def add_replica_nodes(self, collection_id: int, replica_id: int, node_ids: Iterable[int]) -> None:
        """Give nodes to a replica (spares that will hold its copies). A node already in another replica of the
        collection is refused (``ValueError``): replicas never share a node."""
        nodes = unique_ids("node", node_ids)
        core = self._core

        async def body() -> None:
            current = core.loaded_collection(collection_id)
            info = copy_message(current)
            target = next((r for r in info.replicas if r.replica_id == replica_id), None)
            if target is None:
                raise ValueError(f"collection {collection_id} has no replica {replica_id}")
            for n in nodes:
                other = next((r.replica_id for r in info.replicas if n in r.node_ids), 0)
                if other and other != replica_id:
                    raise ValueError(f"node {n} already serves replica {other} of collection {collection_id}")
                if n not in target.node_ids:
                    target.node_ids.append(n)
            if info != current:
                await core.commit("add_replica_nodes", [core.put_collection(info)], atomic=True)

        await core.guarded(lambda: [collection_id], body)

    async def move_replica_node(self, collection_id: int, node_id: int, from_replica: int, to_replica: int) -> None:
        """A node leaves ``from_replica`` of the collection and joins ``to_replica`` (0: none, it becomes a spare
        of the collection), in one put; the collection's other replicas and every other collection are untouched.
        Done already (not in ``from_replica``, in ``to_replica``): nothing written. ``ValueError`` when the node
        is in another replica than ``from_replica`` or a replica is unknown."""
        core = self._core

        async def body() -> None:
            current = core.loaded_collection(collection_id)
            info = copy_message(current)
            by_id = {r.replica_id: r for r in info.replicas}
            if from_replica not in by_id or (to_replica and to_replica not in by_id):
                raise ValueError(f"collection {collection_id} has no replica "
                                 f"{from_replica if from_replica not in by_id else to_replica}")
            owner = next((r.replica_id for r in info.replicas if node_id in r.node_ids), 0)
            if owner not in (0, from_replica, to_replica):
                raise ValueError(f"node {node_id} serves replica {owner} of collection {collection_id}, "
                                 f"not {from_replica}")
            source = by_id[from_replica]
            source.node_ids[:] = [n for n in source.node_ids if n != node_id]
            if to_replica and node_id not in by_id[to_replica].node_ids:
                by_id[to_replica].node_ids.append(node_id)
            if info != current:
                await core.commit("move_replica_node", [core.put_collection(info)], atomic=True)

        await core.guarded(lambda: [collection_id], body)

    async def set_replica_percentages(self, collection_id: int, percentages: Mapping[int, int]) -> None:
        """Set replicas' load percentages exactly (the checker's count of what their nodes hold); unknown
        replicas ignored; written only when something changes."""
        for pct in percentages.values():
            check_percentage(pct)
        core = self._core

        async def body() -> None:
            current = core.index.collections.get(collection_id)
            if current is None:
                return
            info = copy_message(current)
            for r in info.replicas:
                if r.replica_id in percentages:
                    r.in_memory_percentage = percentages[r.replica_id]
            if info != current:
                await core.commit("set_replica_percentages", [core.put_collection(info)], atomic=True)

        await core.guarded(lambda: [collection_id], body)

    async def add_replicas(self, collection_id: int, replicas: Iterable[data_pb2.ReplicaInfo]) -> None:
        """Add a grow's new replicas to the collection's record (one put), its ``replica_number`` kept: they join
        until ``set_replica_number`` records them. Ids already listed are skipped (a re-run); a node already in
        another replica of the collection is refused (``ValueError``)."""
        added = [copy_message(r) for r in replicas]
        core = self._core

        async def body() -> None:
            current = core.loaded_collection(collection_id)
            info = copy_message(current)
            known = {r.replica_id for r in info.replicas}
            info.replicas.extend(r for r in added if r.replica_id not in known)
            check_replicas(collection_id, list(info.replicas))
            if info != current:
                await core.commit("add_replicas", [core.put_collection(info)], atomic=True)

        await core.guarded(lambda: [collection_id], body)

    async def drop_replicas(self, collection_id: int, replica_ids: Iterable[int], replica_number: int) -> None:
        """Take replicas out of the collection's record and record ``replica_number`` (one put): a shrink's
        replicas stop counting at once; a failed grow's joining replicas go. Unknown ids are ignored; what their
        nodes still hold is released by the caller (``Nodes.remove_collection_copies`` for the records)."""
        gone = set(replica_ids)
        if replica_number < 1:
            raise ValueError(f"replica_number must be at least 1, got {replica_number}")
        core = self._core

        async def body() -> None:
            current = core.index.collections.get(collection_id)
            if current is None:
                return
            info = copy_message(current)
            kept = [copy_message(r) for r in info.replicas if r.replica_id not in gone]
            del info.replicas[:]
            info.replicas.extend(kept)
            info.replica_number = replica_number
            if info != current:
                await core.commit("drop_replicas", [core.put_collection(info)], atomic=True)

        await core.guarded(lambda: [collection_id], body)

    async def set_replica_number(self, collection_id: int, replica_number: int) -> None:
        """Record the collection's replica number (a grow whose new replicas are whole); one put."""
        if replica_number < 1:
            raise ValueError(f"replica_number must be at least 1, got {replica_number}")
        core = self._core

        async def body() -> None:
            current = core.loaded_collection(collection_id)
            if current.replica_number != replica_number:
                info = copy_message(current)
                info.replica_number = replica_number
                await core.commit("set_replica_number", [core.put_collection(info)], atomic=True)

        await core.guarded(lambda: [collection_id], body)
