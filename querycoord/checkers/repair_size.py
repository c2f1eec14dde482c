"""A repair small enough for one etcd write: what does not fit waits for the next repair of the collection.

A repair is persisted as one record (its request: every segment it loads,
adopts, forgets or releases), and etcd refuses a request over 1.5 MiB. A node
lost with 125,000 segments made a 2.1 MB record: refused at every pass, so
nothing was ever repaired (DESIGN rule 9: repair never waits on the
impossible). The checker cuts each repair to ``max_repair_bytes``; the
collection is busy while it runs, and the pass after it finishes finds the
rest still missing and queues the next part, until nothing lacks.
"""

from __future__ import annotations

import math
from collections.abc import MutableSequence
from typing import Any

from proto import task_pb2

# Lists cut first to last: the largest records first (a whole segment record each), plain ids last.
_SEGMENT_LISTS = ("adopt", "missing_segments", "forget_segment_ids")


def _bytes_of(req: task_pb2.RepairRequest, name: str) -> int:
    """What field ``name`` adds to ``req``'s encoded size."""
    without = task_pb2.RepairRequest()
    without.CopyFrom(req)
    without.ClearField(name)
    return req.ByteSize() - without.ByteSize()


def _cut(items: MutableSequence[Any], over: int, weight: int) -> int:
    """Drop from the end of ``items`` about ``over`` of its ``weight`` bytes; how many went."""
    count = len(items)
    if not count or over <= 0:
        return 0
    drop = min(count, math.ceil(over * count / max(weight, 1)) + 1)
    del items[count - drop:]
    return drop


def bound_repair(req: task_pb2.RepairRequest, budget: int) -> int:
    """Cut ``req`` to at most ``budget`` encoded bytes, dropping segments from the end of its lists (what is
    kept is done now, the rest by a later repair); how many segment items were left out."""
    left = 0
    for name in _SEGMENT_LISTS:
        over = req.ByteSize() - budget
        if over <= 0:
            return left
        left += _cut(getattr(req, name), over, _bytes_of(req, name))
    for ns in reversed(req.release_segments):  # copies to release, node by node from the last
        over = req.ByteSize() - budget
        if over <= 0:
            break
        left += _cut(ns.segment_ids, over, ns.ByteSize())
    kept = [ns for ns in req.release_segments if ns.segment_ids]
    del req.release_segments[:]
    req.release_segments.extend(kept)
    return left


__all__ = ["bound_repair"]
