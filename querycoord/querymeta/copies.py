"""Copies of a segment or DM watch, one per replica: how a record lists them, and the per-copy views.

A persisted ``SegmentInfo`` / ``DmChannelWatchInfo`` lists every copy in its parallel ``replica_ids`` /
``node_ids``; ``node_id`` / ``replica_id`` name one copy (in a view handed to a reader: the copy on a node; in
the record: the lowest replica's). Replicas of one collection have disjoint nodes, so a node holds at most one
copy of a segment and (segment, node) names a copy. Pure functions: ``index``, ``records`` and the managers share
them.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import Message

from proto import data_pb2

M = TypeVar("M", bound=Message)


def copy_message(message: M) -> M:
    clone = type(message)()
    clone.CopyFrom(message)
    return clone


Copyable = TypeVar("Copyable", data_pb2.SegmentInfo, data_pb2.DmChannelWatchInfo)


def copies(rec: data_pb2.SegmentInfo | data_pb2.DmChannelWatchInfo) -> dict[int, int]:
    """Every copy of a segment or DM watch: replica id -> node id (a legacy record: its ``node_id`` in replica 0)."""
    if rec.node_ids:
        return dict(zip(rec.replica_ids, rec.node_ids, strict=False))
    return {rec.replica_id: rec.node_id} if rec.node_id else {}


def set_copies(rec: Copyable, by_replica: dict[int, int]) -> Copyable:
    """Write ``by_replica`` into the record's copy lists; ``node_id``/``replica_id`` name the lowest replica's copy.

    That first copy keeps readers of one node per segment right for a collection with one replica (and for
    records written before replicas existed).
    """
    del rec.replica_ids[:]
    del rec.node_ids[:]
    for replica_id in sorted(by_replica):
        rec.replica_ids.append(replica_id)
        rec.node_ids.append(by_replica[replica_id])
    first = min(by_replica) if by_replica else 0
    rec.replica_id = first
    rec.node_id = by_replica.get(first, 0)
    return rec


def with_copy(current: Copyable | None, view: Copyable) -> Copyable:
    """The record ``current`` with the copy ``view`` describes (its node, in its replica) added or moved.

    Fields other than the copies come from ``view`` (the newer facts); a node holds one copy at most, so another
    replica's copy on the same node is replaced.
    """
    out = copy_message(view)
    held = copies(current) if current is not None else {}
    held = {r: n for r, n in held.items() if n != view.node_id}
    if view.node_id:
        held[view.replica_id] = view.node_id
    return set_copies(out, held)


def without_node(rec: Copyable, node_id: int) -> Copyable | None:
    """The record without its copy on ``node_id``; None when no copy is left."""
    held = {r: n for r, n in copies(rec).items() if n != node_id}
    if not held:
        return None
    return set_copies(copy_message(rec), held)


def view_of(rec: Copyable, replica_id: int) -> Copyable:
    """One copy of a record: ``node_id``/``replica_id`` of that replica's copy, no copy lists."""
    out = copy_message(rec)
    node = copies(rec).get(replica_id, 0)
    del out.replica_ids[:]
    del out.node_ids[:]
    out.replica_id, out.node_id = replica_id, node
    return out
