"""Query nodes as the records name them: which nodes the records mention, and a gone node's removal from all of
them (segment copies, DM channel watches, replica membership) at once."""

from __future__ import annotations

from .copies import without_node
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

    async def remove_node(self, node_id: int) -> int:
        """Remove the node's copies from every segment and DM channel record (a record left with no copy goes) and
        take the node out of every replica, in as few txns as the limits allow.

        Used by the node-down balance once the node's work was given to the
        survivors (their saves already moved those records to other nodes;
        what is left here is what could not be moved). Returns the txns used.
        """
        check_id("node", node_id)
        core = self._core

        def cids() -> set[int]:
            index = core.index
            places = index.segments.places()
            out = {places[s][0] for s in index.segments_by_node.get(node_id, ())}
            out.update(c for c, _ in index.dm_channels_by_node.get(node_id, ()))
            out.update(i.collection_id for i in index.collections.values()
                       if any(node_id in r.node_ids for r in i.replicas))
            return out

        async def body() -> int:
            index = core.index
            mutations = []
            for sid in sorted(index.segments_by_node.get(node_id, ())):
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
