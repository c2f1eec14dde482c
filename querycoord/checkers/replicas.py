"""Replicas and their members: which replica a holder serves, and the nodes query meta still refers to that are
gone.

A holder in no replica of its collection is a stray (its copy is released); a collection loaded before
replicas (its one replica is 0) is served by any node. A pass first forgets every node query meta refers to
that is not online, so a dead node never holds a replica or counts as holding anything past one pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from loguru import logger

from querycoord.querymeta import QueryMeta
from querycoord.task.model import TaskEnv


class ReplicaView:
    """One collection's replicas as query meta has them now: members, and the shape the fast path checks."""

    __slots__ = ("legacy", "members", "r0", "r1", "replica_of", "replicas", "shape")

    def __init__(self, meta: QueryMeta, cid: int):
        self.replicas = meta.replica_ids(cid)
        self.members = {r: set(meta.replica_nodes(cid, r)) for r in self.replicas}
        self.legacy = self.replicas == [0]  # loaded before replicas: any node serves its one copy
        # The fast path's view: the replica of each member node, as ``split`` finds it.
        self.replica_of: dict[int, int] = {}
        for r in self.replicas:
            for n in self.members[r]:
                self.replica_of.setdefault(n, r)
        ordered = sorted(self.replicas)
        n = len(self.replicas)
        self.shape = n if len(set(self.replicas)) == n and n <= 2 else 0  # 1 or 2 distinct replicas, else 0
        self.r0 = ordered[0] if self.shape else 0
        self.r1 = ordered[1] if self.shape == 2 else 0

    def split(self, nodes: set[int]) -> tuple[dict[int, set[int]], set[int]]:
        """Holders by replica, and holders in no replica (strays)."""
        if self.legacy:
            return {0: set(nodes)}, set()
        by: dict[int, set[int]] = {}
        strays: set[int] = set()
        for n in nodes:
            r = next((r for r, m in self.members.items() if n in m), 0)
            (by.setdefault(r, set()) if r else strays).add(n)
        return by, strays


async def forget_offline(env: TaskEnv, forget: Callable[[int], Awaitable[None]], forgotten: list[int]) -> None:
    """Forget (``forget``: ``watchers.forget_node``) every node that is not online and still serves a replica or
    watches a DM channel (its session went while forgetting it failed, or while no leader watched); each is added
    to ``forgotten``. Segment copies left on a forgotten node need no forget: they count for nothing and the
    repair moves them."""
    for node_id in sorted(env.meta.bound_node_ids() - env.nodes.online_ids()):
        logger.info("checker: query node {} is not online but query meta still refers to it: forgetting it",
                    node_id)
        await forget(node_id)
        forgotten.append(node_id)
