"""Who owns which keys under a deployment's root: anything else is a key nobody owns.

One table, so that a module that starts writing a new prefix adds it here
and ``querycoord meta verify`` does not report its keys as unknown.
"""

from __future__ import annotations

from meta.election import ELECTION_PREFIX, LEADER_RECORD_PREFIX
from meta.session import SESSION_PREFIX
from querycoord.catalog.segment_ids import INDEX_PREFIX as SEGMENT_ID_INDEX_PREFIX
from querycoord.catalog.store import COLLECTIONS_PREFIX, ID_KEY, NAMES_PREFIX, SEGMENTS_PREFIX
from querycoord.cluster.incarnations import PREFIX as INCARNATION_PREFIX
from querycoord.cluster.lifecycle import PREFIX as LIFECYCLE_PREFIX
from querycoord.leader.switchover import SWITCHOVER_KEY
from querycoord.leader.watchers import HANDOFF_REVISION_KEY
from querycoord.querymeta import keys as qkeys
from querycoord.stream import store as sstore
from querycoord.task.history import HISTORY_PREFIX
from querycoord.task.store import ACTIVE_PREFIX, INFO_PREFIX, TRIGGER_PREFIX

# (prefix or exact key, is_prefix, owner)
OWNED: tuple[tuple[str, bool, str], ...] = (
    (COLLECTIONS_PREFIX, True, "catalog"),
    (NAMES_PREFIX, True, "catalog"),
    (SEGMENTS_PREFIX, True, "catalog"),
    (SEGMENT_ID_INDEX_PREFIX, True, "catalog"),
    (ID_KEY, False, "catalog"),
    (qkeys.COLLECTION_PREFIX, True, "query meta"),
    (qkeys.SEGMENT_PREFIX, True, "query meta"),
    (qkeys.DM_CHANNEL_PREFIX, True, "query meta"),
    (qkeys.DELTA_CHANNEL_PREFIX, True, "query meta"),
    (INCARNATION_PREFIX, True, "query meta"),
    (LIFECYCLE_PREFIX, True, "node lifecycles"),
    (HANDOFF_REVISION_KEY, False, "handoff watcher"),
    (TRIGGER_PREFIX, True, "task store"),
    (ACTIVE_PREFIX, True, "task store"),
    (INFO_PREFIX, True, "task store"),
    (HISTORY_PREFIX, True, "task history"),
    (sstore.STREAMS_PREFIX, True, "stream store"),
    (sstore.NAMES_PREFIX, True, "stream store"),
    (sstore.SNODES_PREFIX, True, "stream store"),
    (sstore.RING_KEY, False, "stream store"),
    ("idalloc/", True, "id allocators"),
    (SESSION_PREFIX, True, "sessions"),
    (ELECTION_PREFIX, True, "elections"),
    (LEADER_RECORD_PREFIX, True, "elections (the leader record)"),
    (SWITCHOVER_KEY, False, "switchover"),
)


def owner_of(key: str) -> str | None:
    """The owner of ``key`` (relative to the root), or None when no module writes there."""
    for prefix, is_prefix, owner in OWNED:
        if (key.startswith(prefix) and len(key) > len(prefix)) if is_prefix else key == prefix:
            return owner
    return None


__all__ = ["OWNED", "owner_of"]
