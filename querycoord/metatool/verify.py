"""``querycoord meta verify``: every check over one snapshot, and the keys nobody owns.

Checks run in a fixed order and a key is covered by the first problem that
names it, so ``repair`` sends one fix per key. Read while a leader runs, the
snapshot is a moment of a moving system: a tree being removed in several
txns can show for that moment as a committed trigger without children, and a
release in flight as records of something not loaded. Run it again to
confirm; ``repair`` never writes beside a live leader.
"""

from __future__ import annotations

from dataclasses import dataclass

from meta.kv import MetaKV
from querycoord.catalog.segment_ids import INDEX_PREFIX as SEGMENT_ID_INDEX_PREFIX
from querycoord.catalog.store import SEGMENTS_PREFIX
from querycoord.querymeta import keys as qkeys

from . import snapshot
from .check_query import check_query, live_nodes
from .check_streams import check_streams
from .check_tasks import check_tasks
from .owners import owner_of
from .problems import KINDS, Found, Problem, delete_fix
from .segment_stream import StreamedSegments, read_segments
from .snapshot import Snapshot

# What no check reads and the catalog owns by its prefix: the catalog's segment records and their id index (a
# million keys each at scale). ``take`` leaves them out of verify's snapshot; a key equal to one of these
# prefixes (nobody's) is still read, and reported.
NOT_READ = (SEGMENTS_PREFIX, SEGMENT_ID_INDEX_PREFIX)


async def take(kv: MetaKV) -> Snapshot:
    """The snapshot ``verify`` needs: everything under the root at one revision but ``NOT_READ``."""
    return await snapshot.take(kv, skip_under=NOT_READ)


@dataclass(frozen=True)
class Streamed:
    """What ``meta verify`` reads: the snapshot without query meta's segment records, and those records read
    apart, page by page at its revision (``segment_stream``), kept only as what the checks need of them."""

    snap: Snapshot
    segments: StreamedSegments


async def take_streamed(kv: MetaKV) -> Streamed:
    """``take`` without the segment records, which are streamed after it: memory bounded by one page and a few
    bytes per segment, not by the whole prefix; ``verify`` finds the same."""
    snap = await snapshot.take(kv, skip_under=NOT_READ, skip_whole=(qkeys.SEGMENT_PREFIX,))
    return Streamed(snap, await read_segments(kv, snap.revision, live_nodes(snap)))


def _unknown_keys(snap: Snapshot, found: Found) -> None:
    for key in snap.keys:
        if owner_of(key) is None and key not in found.claimed:
            found.add(Problem("unknown-key", (key,), "no module of querycoord writes here",
                              delete_fix("delete the key", [snap.items[key]])))


def verify(snap: Snapshot, streamed: StreamedSegments | None = None) -> list[Problem]:
    """Every problem in ``snap``, ordered by kind (``problems.KINDS``), each with its keys and its fix;
    ``streamed``: the segment records ``snap`` was read without (``take_streamed``)."""
    found = Found()
    check_tasks(snap, found)
    check_query(snap, found, streamed)
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


__all__ = ["NOT_READ", "Streamed", "summary", "take", "take_streamed", "verify"]
