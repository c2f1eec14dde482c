"""Which nodes a collection's replicas can spare: the choice behind re-homing a node (``task.rehome``).

A grow short of spare nodes, or a drain whose node is the only one of its replica, takes a node from another
replica of the same collection that has more nodes than it needs, as Milvus 2.4's replica manager re-assigns
nodes between replicas. A replica can spare a node when its other eligible nodes (online, not cordoned) can take
that node's copies of the collection (its segments, under the memory limit, and its DM channels): the node then
leaves with nothing its replica still needs. Among those, the node holding least of the collection goes first (the
fewest copies to move), ties by lowest id. A replica always keeps at least one node, and each pick is weighed
with the ones before it (two nodes taken from one replica: the copies of both fit on the rest).

What the picker counts in ``usage``: a donor's memory drops by what it holds of the collection (it releases that),
and the kept nodes' grows by it, so the caller can then place new work on the donors with the same usage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proto import task_pb2
from querycoord.cluster.allocator import NoAvailableNode, Usage
from querycoord.common.replica_number import serving_replica_ids
from querycoord.common.wording import mib_exact
from querycoord.task.model import TaskEnv
from querycoord.task.units import place


def mib(n: int) -> str:
    return mib_exact(n)


@dataclass
class Held:
    """What one node holds of one collection in its replica."""

    sizes: list[tuple[int, int]]  # (segment id, bytes)
    channels: list[str]

    @property
    def bytes(self) -> int:
        return sum(size for _sid, size in self.sizes)


def held_by(env: TaskEnv, collection_id: int, node_id: int) -> Held:
    """The node's copies of the collection as query meta records them (a node serves one replica of it)."""
    sizes = env.meta.segment_sizes_on_node(node_id, collection_id)
    channels = sorted(w.dm_channel for w in env.meta.channels_on_node(node_id) if w.collection_id == collection_id)
    return Held(sizes, channels)


class DonorPicker:
    """Picks nodes the collection's replicas can spare, one at a time (see module docstring).

    ``replicas``: the replicas that may give a node (by default every counted one, joining replicas left out).
    """

    def __init__(self, env: TaskEnv, collection_id: int, usage: Usage, replicas: Sequence[int] | None = None):
        self.env = env
        self.collection_id = collection_id
        self.usage = usage
        info = env.meta.get_collection(collection_id)
        ids = list(replicas) if replicas is not None else (serving_replica_ids(info) if info is not None else [])
        eligible = env.nodes.eligible_ids()
        self.kept: dict[int, list[int]] = {
            r: [n for n in env.meta.replica_nodes(collection_id, r) if n in eligible] for r in ids}
        self.taken: list[task_pb2.RehomeNode] = []

    def eligible_count(self) -> int:
        """The eligible nodes the replicas still keep."""
        return sum(len(nodes) for nodes in self.kept.values())

    def spare(self, keep_more_than: int = 1) -> list[tuple[int, int, Held]]:
        """(node, replica, what it holds) of every node a replica with more than ``keep_more_than`` nodes could
        give, least held first; not yet weighed for room."""
        out = []
        for replica, nodes in sorted(self.kept.items()):
            if len(nodes) <= max(1, keep_more_than):
                continue
            out += [(n, replica, held_by(self.env, self.collection_id, n)) for n in nodes]
        return sorted(out, key=lambda x: (x[2].bytes, x[0]))

    def take(self, keep_more_than: int = 1, *,
             fits: Callable[[int, Usage], bool] | None = None) -> task_pb2.RehomeNode | None:
        """The next node a replica with more than ``keep_more_than`` nodes can spare (its copies placed on the
        replica's other nodes in ``usage``), or None. ``fits(node, usage)``: a further condition on the node
        (a drain: the node must then take the draining node's copies)."""
        for node, replica, held in self.spare(keep_more_than):
            rest = [n for n in self.kept[replica] if n != node]
            trial = Usage(dict(self.usage.memory), dict(self.usage.channels))
            try:
                place(self.env, held.sizes, held.channels, rest, trial, exclude=[node])
            except NoAvailableNode:
                continue
            trial.memory[node] = max(0, trial.memory.get(node, 0) - held.bytes)
            trial.channels[node] = max(0, trial.channels.get(node, 0) - len(held.channels))
            if fits is not None and not fits(node, trial):
                continue
            self.usage.memory.clear()
            self.usage.memory.update(trial.memory)
            self.usage.channels.clear()
            self.usage.channels.update(trial.channels)
            self.kept[replica] = rest
            move = task_pb2.RehomeNode(node_id=node, from_replica_id=replica)
            self.taken.append(move)
            return move
        return None


def donor_for_drain(env: TaskEnv, collection_id: int, replica_id: int, sizes: Sequence[tuple[int, int]],
                    channels: Sequence[str], usage: Usage) -> tuple[task_pb2.RehomeNode | None, str]:
    """A node another replica of the collection can spare and that can then take what a draining node of
    ``replica_id`` holds (``sizes``, ``channels``), to join that replica; else None and what would make the drain
    move (``usage`` is not changed)."""
    info = env.meta.get_collection(collection_id)
    others = [r.replica_id for r in info.replicas if r.replica_id != replica_id] if info is not None else []
    if not replica_id or not others:
        return None, ""

    def fits(node: int, trial: Usage) -> bool:
        try:
            place(env, sizes, channels, [node], Usage(dict(trial.memory), dict(trial.channels)))
        except NoAvailableNode:
            return False
        return True

    picker = DonorPicker(env, collection_id, Usage(dict(usage.memory), dict(usage.channels)), others)
    move = picker.take(fits=fits)
    if move is not None:
        move.to_replica_id = replica_id
        return move, ""
    total = sum(size for _sid, size in sizes)
    limit = env.config.memory_limit
    return None, (f"no other replica of collection {collection_id} can spare a node that would take them (a "
                  "replica keeps a node and room on the rest for what it holds); add a query node with "
                  f"{mib(total)} free under {limit:.0%} of capacity")
