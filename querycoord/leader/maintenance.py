"""Node maintenance on the leader: cordon, uncordon and drain a query node, and the node as ShowNodes shows it.

Each change is one fenced write of the node's lifecycle record (``cluster.lifecycle``), so a new leader keeps it;
the moves a drain needs are the checker's (``checkers.drain``), kicked here so they start at once. A node id
the leader knows nothing of (no session now, no record in query meta, no lifecycle) is NOT_FOUND.
"""

from __future__ import annotations

import math
import time

from proto import querycoord_pb2 as qc
from querycoord.cluster.lifecycle import GRACEFUL_STOP, OPERATOR, NodeLifecycles
from querycoord.common.errors import NotFound
from querycoord.leader.view import Leadership


def lifecycles_of(lead: Leadership) -> NodeLifecycles:
    if lead.lifecycles is None:  # every leadership built by the coordinator has them
        raise NotFound("node lifecycles are not kept by this leader")
    return lead.lifecycles


def holds_placements(lead: Leadership, node_id: int) -> bool:
    """Whether what query meta places on a node is shown as the node's: it has a session, or it was lost within
    its re-replication delay (its copies wait for it, ``checkers.left``). A node lost past that holds nothing, and
    the segment records still naming it count for nothing until the repair that loads them elsewhere rewrites them
    (``watchers.forget_node``)."""
    return lead.nodes.get(node_id) is not None or (lead.left is not None and node_id in lead.left.left)


def node_info(lead: Leadership, node_id: int) -> qc.NodeInfo:
    """One query node: session, what query meta places on it, its lifecycle and drain progress.

    Counted from query meta's per-node index (``segment_count_on_node``, O(1)), never by listing the node's
    copies: ShowNodes asks this of every node, and the status page asks ShowNodes every second."""
    meta = lead.meta
    node = lead.nodes.get(node_id)
    info = qc.NodeInfo(node_id=node_id, state="offline")
    if holds_placements(lead, node_id):
        info.memory_used, info.segment_count = meta.node_memory_usage(node_id), meta.segment_count_on_node(node_id)
        info.dm_channel_count = len(meta.channels_on_node(node_id))
    if node is not None:
        info.address, info.state, info.memory_capacity = node.address, node.state.value, node.capacity
    due_ms = lead.left.due_ms(node_id) if lead.left is not None else 0
    if due_ms and not lead.nodes.is_online(node_id):
        info.state, info.rereplicate_at_ms = left_state(due_ms), due_ms
    if lead.lifecycles is not None:
        info.lifecycle = lead.lifecycles.state(node_id)
        progress = lead.lifecycles.progress(node_id)
        if progress is not None:
            info.drain.CopyFrom(progress)
    return info


def shown_node_ids(lead: Leadership) -> list[int]:
    """The nodes ShowNodes lists: those with a session, and those offline with a lifecycle (a drained node
    stopped for maintenance is still shown, with its state), and those lost whose re-replication waits."""
    ids = set(lead.nodes.nodes)
    if lead.lifecycles is not None:
        ids |= set(lead.lifecycles.records)
    if lead.left is not None:
        ids |= set(lead.left.left)  # lost, its re-replication delayed (``checkers.left``)
    return sorted(ids)


def left_state(due_ms: int) -> str:
    """How a node whose re-replication waits is shown: "left, re-replication in 42s"."""
    return f"left, re-replication in {max(0, math.ceil(due_ms / 1000 - time.time()))}s"


def _known(lead: Leadership, node_id: int) -> None:
    lifecycles = lifecycles_of(lead)
    if (lead.nodes.get(node_id) is None and node_id not in lifecycles.records
            and node_id not in lead.meta.known_node_ids()):
        raise NotFound(f"query node {node_id} is unknown: no session, no record in query meta, no lifecycle "
                       "(querycoord nodes lists the known ones)")


async def cordon(lead: Leadership, node_id: int) -> qc.NodeInfo:
    _known(lead, node_id)
    await lifecycles_of(lead).cordon(node_id)
    return node_info(lead, node_id)


async def uncordon(lead: Leadership, node_id: int) -> qc.NodeInfo:
    _known(lead, node_id)
    await lifecycles_of(lead).uncordon(node_id)
    lead.checker.kick()  # it may be the spare a parked replica waits for
    return node_info(lead, node_id)


async def drain(lead: Leadership, node_id: int, *, graceful_stop: bool) -> qc.NodeInfo:
    _known(lead, node_id)
    node = lead.nodes.get(node_id)
    copies = lead.meta.segment_count_on_node(node_id) + len(lead.meta.channels_on_node(node_id))
    await lifecycles_of(lead).drain(node_id, reason=GRACEFUL_STOP if graceful_stop else OPERATOR,
                                    incarnation=node.created if node is not None else 0, copies=copies)
    lead.checker.kick()
    lead.checker.drain_soon()  # its first moves now, not after the pass's comparison
    return node_info(lead, node_id)
