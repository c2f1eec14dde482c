"""A collection's health as CheckHealth answers it: its colour, each replica's figures, what is missing in words.

Pure: from the served figures (``state``) and the channels each replica lacks (``missing``), so what the RPC, the
CLI, the status page and the gauges show is one derivation of what online nodes hold.
"""

from __future__ import annotations

from collections.abc import Mapping

from proto import querycoord_pb2 as qc
from querycoord.served.missing import ReplicaMissing
from querycoord.served.state import GREEN, RED, YELLOW, CollectionServed

STATES = {GREEN: qc.HEALTH_STATE_GREEN, YELLOW: qc.HEALTH_STATE_YELLOW, RED: qc.HEALTH_STATE_RED}
# Channels named per replica in the ``missing`` sentence at most (the list in ReplicaHealth has them all).
NAMED_CHANNELS = 5


def worst(states: list[qc.HealthState]) -> qc.HealthState:
    """The worst of health states (GREEN when there is none): RED > YELLOW > GREEN."""
    return max(states, default=qc.HEALTH_STATE_GREEN)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}" if n else ""


def _channels(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED_CHANNELS])
    more = f" and {len(names) - NAMED_CHANNELS} more" if len(names) > NAMED_CHANNELS else ""
    return f"DM channel{'s' if len(names) > 1 else ''} {shown}{more}"


def missing_text(served: CollectionServed, missing: Mapping[int, ReplicaMissing]) -> str:
    """What is missing, in one line: what no replica holds, then each replica's lack (empty when green). A replica a
    grow is still adding is left out: its progress is in its own entry, and the collection does not count it."""
    parts = []
    if served.unserved_segments or served.unserved_channels:
        held_by_none = [_count(served.unserved_segments, "segment"), _count(served.unserved_channels, "DM channel")]
        parts.append(" and ".join(p for p in held_by_none if p) + " held by no replica")
    for rid, r in sorted(served.replicas.items()):
        if r.whole or rid in served.joining:
            continue
        lacks = []
        if r.missing_segments:
            lacks.append(f"{r.missing_segments} of {r.segments} segments")
        names = missing.get(rid, ReplicaMissing()).channels
        if names:
            lacks.append(_channels(names))
        where = "" if r.nodes else " (no online node)"
        if r.offline_nodes:
            where = f" (node{'s' if len(r.offline_nodes) > 1 else ''} {', '.join(map(str, r.offline_nodes))} offline)"
        parts.append(f"replica {rid} lacks {' and '.join(lacks)}{where}")
    return "; ".join(parts)


def collection_health(served: CollectionServed, missing: Mapping[int, ReplicaMissing],
                      name: str = "") -> qc.CollectionHealth:
    """The CheckHealth entry of one loaded collection."""
    replicas = [
        qc.ReplicaHealth(replica_id=rid, percentage=r.percentage, whole=r.whole, segments=r.segments,
                         missing_segments=r.missing_segments, channels=r.channels,
                         missing_channels=missing.get(rid, ReplicaMissing()).channels,
                         online_node_ids=r.nodes, offline_node_ids=r.offline_nodes)
        for rid, r in sorted(served.replicas.items())
    ]
    return qc.CollectionHealth(collection_id=served.collection_id, name=name, state=STATES[served.health],
                               percentage=served.percentage, replicas=replicas,
                               unserved_segments=served.unserved_segments,
                               unserved_channels=served.unserved_channels, missing=missing_text(served, missing))
