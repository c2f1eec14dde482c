"""Which collections the queued and running triggers own, kept as triggers come and go.

Why kept rather than derived: the checker asks at every pass (which collections to leave to their trigger, which
are held only by balances a repair may pre-empt), and a pass is kicked whenever a trigger ends. Derived from every
trigger at every ask, 5,000 queued triggers (a new leader reloading an old leader's queue) cost O(n) per pass and
O(n) passes: minutes of the leader's CPU, most of a restart spent counting.

A trigger whose collections are its record's collection id (the base ``TriggerTask.collections``) owns the same
collections from queue to end: it is counted once when queued and uncounted when it leaves. A balance's collections
follow the copies on its source nodes (``LoadBalanceTask.collections``): those few triggers are asked each time.
"""

from __future__ import annotations

from collections import Counter

from querycoord.task.throttle import BALANCE, move_kind
from querycoord.task.triggers import TriggerTask


def _fixed(t: TriggerTask) -> bool:
    """Whether ``t``'s collections cannot change while it is queued (see module docstring)."""
    return type(t).collections is TriggerTask.collections and move_kind(t) != BALANCE


def _owned(t: TriggerTask) -> set[int]:
    return t.collections() | ({t.collection_id} if t.collection_id else set())


class CollectionOwners:
    """The index (see module docstring); ``add`` and ``remove`` are called with the queue's own changes."""

    def __init__(self) -> None:
        self._fixed: Counter[int] = Counter()  # collection -> fixed triggers owning it
        self._counted: dict[int, set[int]] = {}  # fixed trigger id -> what it was counted for
        self._asked: dict[int, TriggerTask] = {}  # trigger id -> trigger whose collections are asked each time

    def add(self, t: TriggerTask) -> None:
        if t.id in self._counted or t.id in self._asked:
            self.remove(t)
        if _fixed(t):
            owned = _owned(t)
            self._counted[t.id] = owned
            self._fixed.update(owned)
        else:
            self._asked[t.id] = t

    def remove(self, t: TriggerTask) -> None:
        self._asked.pop(t.id, None)
        owned = self._counted.pop(t.id, None)
        if owned:
            self._fixed.subtract(owned)
            for c in owned:
                if self._fixed[c] <= 0:
                    del self._fixed[c]

    def busy(self) -> set[int]:
        """Every collection a queued or running trigger owns."""
        out = set(self._fixed)
        for t in self._asked.values():
            out |= _owned(t)
        return out

    def balance_only(self) -> dict[int, list[TriggerTask]]:
        """Collections owned by balance triggers and by no other trigger, with those balances."""
        balances: dict[int, list[TriggerTask]] = {}
        others: set[int] = set()
        for t in sorted(self._asked.values(), key=lambda t: t.id):
            owned = _owned(t)
            if move_kind(t) == BALANCE:
                for c in owned:
                    balances.setdefault(c, []).append(t)
            else:
                others |= owned
        return {c: ts for c, ts in balances.items() if c not in others and c not in self._fixed}
