"""One comparison's shared state: its inputs, the repairs it found per collection, and how a repair is described.

The per-kind steps (``segments``, ``channels``, ``releases``) each add to the ``Diff`` of one ``Scan``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from proto import task_pb2
from querycoord.checkers.distribution import Held
from querycoord.querymeta import QueryMeta


@dataclass
class Diff:
    repairs: dict[int, task_pb2.RepairRequest] = field(default_factory=dict)
    # collection -> partition -> (held, total) for every checked loaded collection
    progress: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    # collection -> replica -> (held, total)
    replica_progress: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)


def repair_of(d: Diff, cid: int) -> task_pb2.RepairRequest:
    """The repair of collection ``cid``, started empty on first use (built only then: the general path asks this
    once per segment it finds missing)."""
    req = d.repairs.get(cid)
    if req is None:
        req = d.repairs[cid] = task_pb2.RepairRequest()
    return req


@dataclass
class Scan:
    """What every step of one comparison reads (query meta, the nodes' reports) and adds to (``out``)."""

    meta: QueryMeta
    held: Held
    reachable: set[int]  # online nodes that reported
    silent: set[int]  # online nodes that did not: what meta places on them is neither missing nor extra
    every: int  # segments between two yields (0: never yield)
    out: Diff
    release: Callable[[int, int, int], None]  # (collection, node, segment): a copy to release
    # Silent nodes whose session is gone (their re-replication waits, ``checkers.left``): what meta places on them
    # is still neither missing nor extra, but counts as not held in progress (DESIGN rule 8: no node holds it).
    gone: frozenset[int] = frozenset()


def describe(req: task_pb2.RepairRequest) -> str:
    """What a repair will do, in one line (its ``reason``)."""
    copies = sum(len(ns.segment_ids) for ns in req.release_segments)
    watches = sum(len(nc.channel_names) for nc in req.release_dm_channels)
    found = [
        (req.missing_segments, f"{len(req.missing_segments)} segments held by no node"),
        (copies, f"{copies} copies to release"),
        (req.rewatch, f"{len(req.rewatch)} DM channels unwatched"),
        (req.release_collection_on_nodes, f"not loaded but held on nodes {list(req.release_collection_on_nodes)}"),
        (req.adopt, f"{len(req.adopt)} segments recorded on the wrong node"),
        (req.forget_segment_ids, f"{len(req.forget_segment_ids)} stale segment records"),
        (watches, f"{watches} DM channel watches to release"),
        (req.adopt_dm_channels, f"{len(req.adopt_dm_channels)} DM channel watches recorded on the wrong node"),
    ]
    return "; ".join(text for present, text in found if present)


def has_work(req: task_pb2.RepairRequest) -> bool:
    """Whether the repair has anything to do (parking may have taken all it had)."""
    return bool(req.missing_segments or req.release_segments or req.rewatch or req.release_collection_on_nodes
                or req.adopt or req.forget_segment_ids or req.release_dm_channels or req.adopt_dm_channels)
