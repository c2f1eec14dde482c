"""Delayed re-replication: a query node that left is forgotten only ``node_left_delay`` seconds later, while the
rest of the cluster still serves everything it served.

Modelled on Elasticsearch's ``index.unassigned.node_left.delayed_timeout``. When a node's session is gone and
**every** collection it served (it is a member of one of its replicas, or meta places a copy or a DM channel on
it) keeps at least one whole replica on online nodes (DESIGN rule 8: what nodes hold, ``served``), the forget that
would re-replicate its copies elsewhere waits: the node stays a member of its replicas, its records stay in query
meta (and count for nothing: it is not online), and the checker takes them for unknown, neither missing nor extra.
Otherwise (a collection with no other whole replica) it is forgotten at once: no delay holds back a repair that
restores service. The checker weighs every left node again at each pass: once its delay is over, or once some
collection it served has no whole replica left (another node died), it is forgotten and the checker repairs.

A node back under its id within the delay is still its replicas' member: the copies its previous process held are
forgotten (a new process holds nothing it was not given), and the checker loads what its replicas lack on their
own nodes, that node among them, instead of on others; what a node kept across the gap is adopted as it is.

When each node left is persisted (``queryCoord-nodeLeft/<id>``: the wall time in ms, through the fenced view), so a
new leader counts the delay from when the node was lost; a node a new leader finds gone with no record (lost while
no leader watched) counts from the takeover.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from loguru import logger

from meta.kv import MetaKV
from querycoord.querymeta import QueryMeta
from querycoord.served.state import ServedView

PREFIX = "queryCoord-nodeLeft/"


def left_key(node_id: int) -> str:
    return f"{PREFIX}{node_id}"


def served_collections(meta: QueryMeta, node_id: int) -> set[int]:
    """The collections ``node_id`` serves: a member of one of their replicas, or a copy or a watch on it."""
    out = meta.collections_on_node(node_id)
    out |= {c.collection_id for c in meta.channels_on_node(node_id)}
    out |= {cid for cid in meta.collection_ids() if meta.replica_of_node(cid, node_id)}
    return out


async def forget_copies(meta: QueryMeta, node_id: int) -> None:
    """Forget the copies and DM channel watches meta places on ``node_id``; its replica memberships stay."""
    segments = meta.segment_ids_on_node(node_id)
    if segments:
        await meta.remove_segment_copies(node_id, segments)
    by_collection: dict[int, list[str]] = {}
    for w in meta.channels_on_node(node_id):
        by_collection.setdefault(w.collection_id, []).append(w.dm_channel)
    for cid, names in sorted(by_collection.items()):
        await meta.remove_dm_channel_copies(node_id, cid, names)


class LeftNodes:
    """The nodes whose re-replication waits, with when each left (see module docstring)."""

    def __init__(self, kv: MetaKV, delay: float, *, on_due: Callable[[], None] | None = None):
        """``kv``: the fenced view; ``on_due``: called when a node's delay ends (the checker's kick)."""
        self.kv = kv
        self.delay = delay
        self.on_due = on_due
        self.left: dict[int, int] = {}  # node id -> wall time it left, in ms

    async def load(self) -> None:
        """The records of earlier leaders; malformed ones are logged and left out."""
        snap = await self.kv.load_prefix(PREFIX)
        for item in snap.kvs:
            try:
                self.left[int(item.key[len(PREFIX):])] = int(item.value)
            except ValueError:
                logger.warning("left nodes: ignoring malformed record {}={!r}", item.key, item.value[:40])

    def due_ms(self, node_id: int) -> int:
        """When ``node_id``'s delay ends (wall time, ms); 0 when it is not waiting."""
        at = self.left.get(node_id)
        return 0 if at is None else at + int(self.delay * 1000)

    def waiting(self) -> dict[int, int]:
        """Node id -> when its delay ends (ms), for every node whose re-replication waits."""
        return {n: self.due_ms(n) for n in sorted(self.left)}

    async def hold(self, node_id: int, meta: QueryMeta, served: ServedView | None) -> bool:
        """Whether forgetting ``node_id`` (gone) waits now: the delay is on and not over, and every collection it
        served keeps a whole replica on online nodes. A first hold records when it left."""
        if self.delay <= 0:
            return False
        now = int(time.time() * 1000)
        at = self.left.get(node_id, now)
        if now >= at + int(self.delay * 1000):
            logger.info("query node {} left {:.0f}s ago: its copies are re-replicated now", node_id,
                        (now - at) / 1000)
            return False
        lacking = self._unprotected(node_id, meta, served)
        if lacking:
            logger.info("query node {} left: collections {} have no other whole replica; repaired at once",
                        node_id, lacking)
            return False
        if node_id not in self.left:
            # Recorded before the write: the session watch's forget and a checker pass's may hold one node at
            # once, and the second must take the first one's time, not write its own a millisecond later.
            self.left[node_id] = at
            try:
                await self.kv.save(left_key(node_id), str(at).encode())
            except BaseException:
                self.left.pop(node_id, None)
                raise
            logger.info("query node {} left: every collection it served keeps a whole replica; its copies are "
                        "re-replicated in {:.0f}s unless it comes back", node_id, self.delay)
            if self.on_due is not None:
                asyncio.get_running_loop().call_later(self.delay + 0.05, self.on_due)
        return True

    @staticmethod
    def _unprotected(node_id: int, meta: QueryMeta, served: ServedView | None) -> list[int]:
        """The collections ``node_id`` served that no whole replica on online nodes serves now."""
        if served is None:
            return sorted(served_collections(meta, node_id))
        out = []
        for cid in sorted(served_collections(meta, node_id)):
            state = served.collection(cid)
            if state is not None and not any(r.whole for r in state.replicas.values()):
                out.append(cid)
        return out

    async def drop(self, node_id: int) -> None:
        """``node_id`` is forgotten or back: its delay is over."""
        if self.left.pop(node_id, None) is not None:
            await self.kv.remove(left_key(node_id))
