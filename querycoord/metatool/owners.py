"""Who owns which keys under a deployment's root: anything else is a key nobody owns.

One table, so that a module that starts writing a new prefix adds it here
and ``querycoord meta verify`` does not report its keys as unknown.
"""

from __future__ import annotations

from meta.election import ELECTION_PREFIX, LEADER_RECORD_PREFIX
from meta.session import SESSION_PREFIX
from querycoord.catalog.segment_ids import INDEX_PREFIX as SEGMENT_ID_INDEX_PREFIX
from querycoord.catalog.store import COLLECTIONS_PREFIX, ID_KEY, NAMES_PREFIX, SEGMENTS_PREFIX
from querycoord.checkers.activation import ACTIVATION_KEY
from querycoord.checkers.left import PREFIX as LEFT_PREFIX
from querycoord.cluster.incarnations import PREFIX as INCARNATION_PREFIX
from querycoord.cluster.lifecycle import PREFIX as LIFECYCLE_PREFIX
from querycoord.leader.switchover import SWITCHOVER_KEY
from querycoord.leader.watchers import HANDOFF_REVISION_KEY
from querycoord.querymeta import keys as qkeys
from querycoord.stream import store as sstore
from querycoord.stream.checkpoint_store import CHECKPOINTS_PREFIX
from querycoord.stream.recalc_store import RECALCS_PREFIX
from querycoord.task.history import HISTORY_PREFIX
from querycoord.task.store import ACTIVE_PREFIX, CANCEL_PREFIX, INFO_PREFIX, TRIGGER_PREFIX

# owner: (the prefixes it writes under, the exact keys it writes); owners are asked in this order.
OWNED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "catalog": ((COLLECTIONS_PREFIX, NAMES_PREFIX, SEGMENTS_PREFIX, SEGMENT_ID_INDEX_PREFIX), (ID_KEY,)),
    "query meta": ((qkeys.COLLECTION_PREFIX, qkeys.SEGMENT_PREFIX, qkeys.DM_CHANNEL_PREFIX,
                    qkeys.DELTA_CHANNEL_PREFIX, INCARNATION_PREFIX), ()),
    "node lifecycles": ((LIFECYCLE_PREFIX,), ()),
    "handoff watcher": ((), (HANDOFF_REVISION_KEY,)),
    "checker (kinds turned off, balance paused)": ((), (ACTIVATION_KEY,)),
    "checker (nodes left, re-replication delayed)": ((LEFT_PREFIX,), ()),
    "task store": ((TRIGGER_PREFIX, ACTIVE_PREFIX, INFO_PREFIX, CANCEL_PREFIX), ()),
    "task history": ((HISTORY_PREFIX,), ()),
    "stream store": ((sstore.STREAMS_PREFIX, sstore.NAMES_PREFIX, sstore.SNODES_PREFIX), (sstore.RING_KEY,)),
    "stream recalculations": ((RECALCS_PREFIX,), ()),
    "stream checkpoints": ((CHECKPOINTS_PREFIX,), ()),
    "id allocators": (("idalloc/",), ()),
    "sessions": ((SESSION_PREFIX,), ()),
    "elections": ((ELECTION_PREFIX,), ()),
    "elections (the leader record)": ((LEADER_RECORD_PREFIX,), ()),
    "switchover": ((), (SWITCHOVER_KEY,)),
}


def owner_of(key: str) -> str | None:
    """The owner of ``key`` (relative to the root), or None when no module writes there."""
    for owner, (prefixes, exact) in OWNED.items():
        if key in exact or any(key.startswith(p) and len(key) > len(p) for p in prefixes):
            return owner
    return None


__all__ = ["OWNED", "owner_of"]
