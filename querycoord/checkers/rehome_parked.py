"""Parked replicas with no node: a sibling replica that can spare a node gives it (DESIGN rule 9).

A replica left with no online node and no spare is parked (``checkers.parked``) until a node joins. Spares are
shared between such replicas (``units.spare_share``), but one may still end up with every node: spares that came
while another replica of the collection was not yet parked, a unit too large for its share, nodes a balance moved
into one replica. Waiting for a node to join would then wait on what a move could make possible. So when a
replica of the collection holds more than one node and can spare one (``rehome_plan``: its other nodes take that
node's copies, under the memory limit, and the node then has room for what the parked replica lacks), the checker
queues a REHOME_NODE trigger (``task.rehome``): persisted like every trigger, so a new leader resumes it, and each
copy is held by its destination before the source lets it go, so neither replica ever holds a segment fewer times
than before. The parked replica is placed at the checker's next pass, on that node.

When no sibling can spare a node, the unit stays parked and its reason says so (and what would make it move).
One such trigger per collection per pass: the next pass weighs the collection again with the node moved.
"""

from __future__ import annotations

from loguru import logger

from proto import querycoord_pb2 as qc
from proto import task_pb2
from querycoord.cluster.allocator import Usage
from querycoord.task.parking import NO_NODE, Parked
from querycoord.task.rehome import RehomeNodeTask
from querycoord.task.rehome_plan import donor_for_drain
from querycoord.task.scheduler import Scheduler


def nodeless_parked(scheduler: Scheduler, collection_id: int) -> list[Parked]:
    """The collection's units parked for want of a node whose replica has no online node at all (a replica whose
    only node is draining is the drain's business: ``checkers.drain``)."""
    env = scheduler.env
    online = env.nodes.online_ids()
    return [u for u in env.parked.of(collection_id)
            if u.code == NO_NODE and u.replica_id
            and not any(n in online for n in env.meta.replica_nodes(collection_id, u.replica_id))]


async def rehome_to_parked(scheduler: Scheduler, collection_id: int, usage: Usage,
                           parked_now: dict[tuple[int, int], str]) -> bool:
    """Queue one REHOME_NODE trigger giving a parked node-less replica of the collection a node a sibling can
    spare (module docstring); the units no sibling can help say so in their reason (also in ``parked_now``).
    Whether a trigger was queued. ``usage`` is not changed."""
    env = scheduler.env
    for unit in nodeless_parked(scheduler, collection_id):
        # What the unit lacks, counted as one block: it must all fit on the one node it is given.
        move, why = donor_for_drain(env, collection_id, unit.replica_id, [(0, unit.segment_bytes)], [], usage)
        if move is None:
            if why and why not in unit.reason:
                unit.reason = f"{unit.reason}; {why}"
                parked_now[(collection_id, unit.replica_id)] = unit.reason
            continue
        reason = f"replica {unit.replica_id} has no online query node and no spare node is online"
        task = RehomeNodeTask.new(
            env, task_pb2.RehomeNodeRequest(collection_id=collection_id, move=move, reason=reason),
            trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=collection_id)
        await scheduler.enqueue(task)
        logger.info("checker: parked replica {} of collection {} takes node {} from replica {} (task {}): {}",
                    unit.replica_id, collection_id, move.node_id, move.from_replica_id, task.id, reason)
        return True
    return False
