"""Query nodes as the records name them: which nodes the records mention, and a gone node's removal from all of
them (segment copies, DM channel watches, replica membership) at once."""

from __future__ import annotations

from collections.abc import Iterable

from .copies import Copyable, without_node
from .core import MetaCore, check_id
from .replicas import leave_replicas


class Nodes:
    """Reads and the removal of the nodes named by the records."""

    def __init__(self, core: MetaCore):
        self._core = core

    def known_node_ids(self) -> set[int]:
        """Nodes that hold any segment or channel record or serve a replica (a new leader checks them against
        live sessions, and the checker forgets those that are gone)."""
        index = self._core.index
        members = {n for info in index.collections.values() for r in info.replicas for n in r.node_ids}
        return set(index.segments_by_node) | set(index.dm_channels_by_node) | members

    def bound_node_ids(self) -> set[int]:
        """Nodes that serve a replica or watch a DM channel: ``known_node_ids`` without the nodes named only by
        segment copies. A lost node is forgotten (``remove_node(keep_segments=True)``) once it is none of these;
        the copies still naming it count for nothing and are moved by the repair that loads them elsewhere."""
        index = self._core.index
        members = {n for info in index.collections.values() for r in info.replicas for n in r.node_ids}
        return set(index.dm_channels_by_node) | members

    async def remove_node(self, node_id: int, *, keep_segments: bool = False) -> int:
        """Remove the node's copies from every segment and DM channel record (a record left with no copy goes) and
        take the node out of every replica, in as few txns as the limits allow.

        Used by the node-down balance once the node's work was given to the
        survivors (their saves already moved those records to other nodes;
        what is left here is what could not be moved). Returns the txns used.

        ``keep_segments``: the segment records keep their copies on the node (a lost node's forget). They count
        for nothing once the node is in no replica and offline (``served``), and the repair that loads each
        elsewhere moves it with the one write it makes anyway (``with_copy`` replaces the replica's copy): no
        delete of every record first, and a leader that dies in between leaves the new one the same records.
        """
        check_id("node", node_id)
        core = self._core

        def cids() -> set[int]:
            index = core.index
            out = set() if keep_segments else set(index.copies_by_node.get(node_id, ()))
            out.update(c for c, _ in index.dm_channels_by_node.get(node_id, ()))
            out.update(i.collection_id for i in index.collections.values()
                       if any(node_id in r.node_ids for r in i.replicas))
            return out

        async def body() -> int:
            index = core.index
            mutations = []
            for sid in () if keep_segments else sorted(index.segments_by_node.get(node_id, ())):
                seg = index.segments[sid]
                rest = without_node(seg, node_id)
                mutations.append(core.put_segment(rest) if rest is not None else core.drop_segment(seg))
            for cid, channel in sorted(index.dm_channels_by_node.get(node_id, ())):
                watch = index.dm_channels[cid][channel]
                left = without_node(watch, node_id)
                mutations.append(core.put_dm_channel(left) if left is not None else core.drop_dm_channel(watch))
            for info in index.collections.values():
                if any(node_id in r.node_ids for r in info.replicas):
                    mutations.append(core.put_collection(leave_replicas(info, node_id)))
            return await core.commit(f"remove_node {node_id}", mutations, atomic=False)

        return await core.guarded(cids, body)

    async def remove_collection_copies(self, collection_id: int, node_ids: Iterable[int]) -> int:
        """Remove the collection's segment copies and DM channel watches on ``node_ids`` (a record left with no
        copy goes), other collections' untouched: the nodes of replicas a resize dropped. Returns the txns used."""
        nodes = set(node_ids)
        core = self._core

        async def body() -> int:
            index = core.index
            places = index.segments.places()
            sids = sorted({sid for n in nodes for sid in index.segments_by_node.get(n, ())
                           if places[sid][0] == collection_id})
            names = sorted({ch for n in nodes for cid, ch in index.dm_channels_by_node.get(n, ())
                            if cid == collection_id})
            mutations = []
            for sid in sids:
                seg = index.segments[sid]
                rest = _without_nodes(seg, nodes)
                mutations.append(core.put_segment(rest) if rest is not None else core.drop_segment(seg))
            for channel in names:
                watch = index.dm_channels[collection_id][channel]
                left = _without_nodes(watch, nodes)
                mutations.append(core.put_dm_channel(left) if left is not None else core.drop_dm_channel(watch))
            return await core.commit(f"remove_collection_copies {collection_id}", mutations, atomic=False)

        return await core.guarded(lambda: [collection_id], body)


def _without_nodes(rec: Copyable, nodes: set[int]) -> Copyable | None:
    """The record without its copies on ``nodes``; None when no copy is left."""
    out: Copyable | None = rec
    for n in sorted(nodes):
        if out is None:
            return None
        out = without_node(out, n)
    return out
