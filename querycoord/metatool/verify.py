"""``querycoord meta verify``: every check over one snapshot, and the keys nobody owns.

Checks run in a fixed order and a key is covered by the first problem that
names it, so ``repair`` sends one fix per key. Read while a leader runs, the
snapshot is a moment of a moving system: a tree being removed in several
txns can show for that moment as a committed trigger without children, and a
release in flight as records of something not loaded. Run it again to
confirm; ``repair`` never writes beside a live leader.
"""

from __future__ import annotations

from .check_query import check_query
from .check_streams import check_streams
from .check_tasks import check_tasks
from .owners import owner_of
from .problems import KINDS, Found, Problem, delete_fix
from .snapshot import Snapshot


def _unknown_keys(snap: Snapshot, found: Found) -> None:
    for key, kv in sorted(snap.items.items()):
        if owner_of(key) is None and key not in found.claimed:
            found.add(Problem("unknown-key", (key,), "no module of querycoord writes here",
                              delete_fix("delete the key", [kv])))


def verify(snap: Snapshot) -> list[Problem]:
    """Every problem in ``snap``, ordered by kind (``problems.KINDS``), each with its keys and its fix."""
    found = Found()
    check_tasks(snap, found)
    check_query(snap, found)
    check_streams(snap, found)
    _unknown_keys(snap, found)
    order = {kind: i for i, kind in enumerate(KINDS)}
    return sorted(found.problems, key=lambda p: order[p.kind])


def summary(problems: list[Problem]) -> dict[str, int]:
    """Problems counted by kind."""
    out: dict[str, int] = {}
    for p in problems:
        out[p.kind] = out.get(p.kind, 0) + 1
    return out


__all__ = ["summary", "verify"]
