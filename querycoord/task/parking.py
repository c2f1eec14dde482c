"""Repair units that cannot be placed now, each with its reason: parked, never waited on (DESIGN rule 9).

A unit is one replica of one collection: what it lacks (segments, DM channels) is loaded on that replica's nodes
or on a spare that joins it, never elsewhere, so whether it can be placed depends on that replica alone. When it
cannot (no online node and no spare; no room under the memory limit), nothing waits inside a trigger: the unit is
parked here with its reason, and the checker, which is kicked by whatever can change that (a node joins or
returns, a release frees memory, a replica changes), weighs it again in memory at its next pass and queues a
repair only once it can be placed. So one unplaceable replica holds back neither another replica, nor another
collection, nor a release, and no failing trigger is queued pass after pass.

The registry is the leader's memory (rebuilt by the first passes after a takeover); ``explain`` reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

NO_NODE = "no_node"
NO_ROOM = "no_room"


@dataclass
class Parked:
    """Why one (collection, replica) unit is not placed, since when, and what it lacks."""

    collection_id: int
    replica_id: int
    code: str  # NO_NODE or NO_ROOM
    reason: str  # in words, for explain and logs
    segments: int = 0  # segments it lacks
    segment_bytes: int = 0
    channels: int = 0  # DM channels it lacks
    short_bytes: int = 0  # memory missing under the limit (NO_ROOM)
    room: dict[int, int] = field(default_factory=dict)  # candidate node -> bytes free under the limit
    since: float = field(default_factory=time.time)  # wall time it was first parked for this reason
    by: str = "checker"  # who parked it (the checker, or a trigger that found it unplaceable when it ran)


class ParkedUnits:
    """The parked units of one leadership, by (collection, replica)."""

    def __init__(self) -> None:
        self._units: dict[tuple[int, int], Parked] = {}
        self.parked_total = 0  # units parked (a re-park for the same reason does not count)

    def park(self, unit: Parked) -> Parked:
        """Park ``unit``; one already parked for the same reason keeps its ``since`` (it is the same wait)."""
        key = (unit.collection_id, unit.replica_id)
        old = self._units.get(key)
        if old is not None and old.code == unit.code:
            unit.since = old.since
        else:
            self.parked_total += 1
        self._units[key] = unit
        return unit

    def unpark(self, collection_id: int, replica_id: int) -> Parked | None:
        return self._units.pop((collection_id, replica_id), None)

    def get(self, collection_id: int, replica_id: int) -> Parked | None:
        return self._units.get((collection_id, replica_id))

    def of(self, collection_id: int) -> list[Parked]:
        return [u for (cid, _r), u in sorted(self._units.items()) if cid == collection_id]

    def all(self) -> list[Parked]:
        return [u for _key, u in sorted(self._units.items())]

    def keep_only(self, collection_id: int, replica_ids: set[int]) -> None:
        """Forget the collection's units outside ``replica_ids`` (whole now, or no longer its replicas)."""
        for key in [k for k in self._units if k[0] == collection_id and k[1] not in replica_ids]:
            del self._units[key]

    def drop_collections(self, loaded: set[int]) -> None:
        """Forget the units of collections that are no longer loaded."""
        for key in [k for k in self._units if k[0] not in loaded]:
            del self._units[key]

    def __len__(self) -> int:
        return len(self._units)
