"""Which incarnation of each query node the leader last knew: the create revision of its session key.

Why: query meta records copies by node id, and a node started again under its fixed ``--node-id`` holds nothing
of what its previous process held. A leader that sees the session go away forgets that node's copies at once
(``watchers.forget_node``); but a node can die and come back while no leader watches (a whole cluster restarted
on its data dirs, a leader change during the restart), and the next leader would then take the records of the
dead process for copies the new one serves. So the leader persists, per node, the create revision of the session
it accepted (every registration creates the key anew, so two incarnations never share it); a new leader that
finds another revision there knows the node restarted and forgets its copies before it counts them.

A node with no record (written by a version without them, or accepted but not yet recorded when its leader died)
is taken as the incarnation it is now: that can only err towards trusting records the node itself made.
"""

from __future__ import annotations

from loguru import logger

from meta.kv import MetaKV

PREFIX = "queryCoord-nodeIncarnation/"


def incarnation_key(node_id: int) -> str:
    return f"{PREFIX}{node_id}"


class Incarnations:
    """The persisted incarnation of each query node (see module docstring); writes go through ``kv`` (fenced)."""

    def __init__(self, kv: MetaKV):
        self.kv = kv
        # Lost nodes whose record was kept because segment records still named them (``watchers.forget_node``):
        # dropped by ``drop_unnamed`` once the repair moved those records, so node ids that never come back
        # (a fresh id per start) leave no key behind.
        self.deferred: set[int] = set()

    async def load(self) -> dict[int, int]:
        """node id -> session create revision; malformed records are logged and left out."""
        out: dict[int, int] = {}
        snap = await self.kv.load_prefix(PREFIX)
        for item in snap.kvs:
            tail = item.key[len(PREFIX):]
            try:
                node, revision = int(tail), int(item.value)
            except ValueError:
                logger.warning("node incarnations: ignoring malformed record {}={!r}", item.key, item.value[:40])
                continue
            out[node] = revision
        return out

    async def save(self, node_id: int, created: int) -> None:
        await self.kv.save(incarnation_key(node_id), str(created).encode())

    async def drop(self, node_id: int) -> None:
        await self.kv.remove(incarnation_key(node_id))

    async def drop_unnamed(self, named: set[int], online: set[int], *, keep: set[int] | frozenset[int] = frozenset(),
                           recorded: set[int] | None = None) -> list[int]:
        """Drop the records of nodes that are not online and that no query meta record names (``named``), except
        ``keep`` (nodes within their re-replication delay): the deferred ones, or every recorded node of
        ``recorded`` (the records a new leader loaded). Returns the nodes dropped."""
        candidates = self.deferred if recorded is None else recorded | self.deferred
        stale = sorted(n for n in candidates if n not in named and n not in online and n not in keep)
        for node_id in stale:
            await self.drop(node_id)
            self.deferred.discard(node_id)
        if stale:
            logger.info("node incarnations: dropped the records of lost nodes {} (nothing names them any more)", stale)
        return stale
