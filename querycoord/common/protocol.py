"""The wire-level contract between coordinators, nodes and clients, stated once.

Everything here is read by more than one process kind, so two copies would
drift apart silently: a renamed role leaves nodes invisible to the
coordinator, a reworded redirect leaves clients stuck on a standby. Every
module that speaks one of these names or formats imports it from here; no
module here imports anything of the coordinator.
"""

from __future__ import annotations

import re

# ----- session roles (meta.session: ``session/<role>/<server id>``) --------------------------------------------------
QUERYCOORD_ROLE = "querycoord"
QUERYNODE_ROLE = "querynode"
STREAMNODE_ROLE = "streamnode"
# What a stream node advertises as its address: it serves nothing (every action rides on heartbeat replies).
STREAMNODE_ADDRESS = "stream-node"

# ----- elections (meta.election: ``election/<name>/``) ----------------------------------------------------------------
QUERYCOORD_ELECTION = "querycoord"

# ----- gRPC services --------------------------------------------------------------------------------------------------
# The health-check service name a coordinator reports SERVING under while it leads.
QUERYCOORD_SERVICE = "querycoord.query.QueryCoord"

# ----- redirects: a standby names the leader ----------------------------------------------------------------------
# A standby answers NOT_LEADER (status) or UNAVAILABLE (gRPC) with a reason containing this phrase; the
# address ends at whitespace or one of ";,)" so the phrase can sit inside a longer sentence.
_LEADER_AT = re.compile(r"the leader is at (\S+?)(?:[;,)]|$)")


def leader_is_at(address: str) -> str:
    """The phrase a standby puts in its reason so clients can follow (``parse_leader`` reads it back)."""
    return f"the leader is at {address}"


def parse_leader(text: str | None) -> str | None:
    """The leader's address named in a NOT_LEADER reason or an UNAVAILABLE detail, if any."""
    m = _LEADER_AT.search(text or "")
    return m.group(1) if m else None


# ----- query node calls -------------------------------------------------------------------------------------------
# QueryNode RPCs that change what a node holds. A node refuses them from a stale leader (the fence), the
# coordinator stamps its fence on them, and fault injection only fails or counts these (reads never fail by
# injection, so a flaky node's holdings can always be seen).
MUTATING_METHODS: frozenset[str] = frozenset(
    {
        "LoadSegments",
        "ReleaseSegments",
        "WatchDmChannels",
        "ReleaseDmChannels",
        "WatchDeltaChannels",
        "AddQueryChannel",
        "ReleaseCollection",
        "ReleasePartitions",
    }
)

# ----- keys shared across processes (relative to the meta root) ---------------------------------------------------
# Snodes as persisted by the leader's stream store; a stream node reads its own from here.
SNODES_PREFIX = "stream/snodes/"

__all__ = [
    "MUTATING_METHODS",
    "QUERYCOORD_ELECTION",
    "QUERYCOORD_ROLE",
    "QUERYCOORD_SERVICE",
    "QUERYNODE_ROLE",
    "SNODES_PREFIX",
    "STREAMNODE_ADDRESS",
    "STREAMNODE_ROLE",
    "leader_is_at",
    "parse_leader",
]
