"""What online nodes serve, computed once per collection and then held: for work during which it cannot change.

A takeover forgets every gone node in one go (``Coordinator._forget_gone``): the percentages are lowered with them
all offline, then each forget asks whether its node's re-replication may wait (``checkers.left``), which reads
every collection's served figures again. Each forget changes the records (the node leaves its replicas), so the
``ServedView`` cache misses and the figures of every segment are counted once more per node; yet they are the
same: the gone nodes were offline before the first forget, and a copy on an offline node counts for nothing
whether or not that node is still a replica's member. Only the replicas' lists of offline members differ, which
none of these readers look at. Without a followed catalog copy (meta's records stand in for the target), a DM
channel record the forget leaves with no watch goes, and a fresh count has one channel fewer to miss: the
snapshot then says less, never more (a node's re-replication starts at once rather than waiting).
"""

from __future__ import annotations

from querycoord.served.state import CollectionServed, ServedView


class ServedSnapshot(ServedView):
    """A ``ServedView`` whose answer for a collection is the first one computed, whatever changes after.

    Only for a span in which what online nodes serve does not change (no node joins, no copy is loaded): a node
    that comes online meanwhile is not counted, which can only make a collection look less served."""

    def __init__(self, view: ServedView):
        super().__init__(view.meta, view.nodes, view.targets)
        self._view = view
        self._held: dict[int, CollectionServed | None] = {}

    def collection(self, collection_id: int) -> CollectionServed | None:
        if collection_id not in self._held:
            self._held[collection_id] = self._view.collection(collection_id)
        return self._held[collection_id]


__all__ = ["ServedSnapshot"]
