"""Where segments and channels go: memory-aware for segments, fewest channels for channels.

Segments: among online nodes (minus excluded, within included), skip nodes
at or above the memory limit (90 % by default); each segment goes to the
node with the lowest memory rate that stays under the limit after adding it.
Channels: the online node watching the fewest DM channels.

An allocation that finds no room raises ``NoAvailableNode`` at once: nothing
waits for room inside a trigger (Milvus's NodeDown balance waited forever; the
caller parks what it cannot place, ``task.parking``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from proto import common_pb2
from querycoord.cluster.nodes import Node
from querycoord.common.errors import CoordError
from querycoord.common.yielding import TURN_EVERY, Steps, run_steps


class NoAvailableNode(CoordError):
    """No online node can take the work; the message says why."""

    code = common_pb2.NO_AVAILABLE_NODE


@dataclass
class Usage:
    """Memory and channel load per node as the allocator counts them."""

    memory: dict[int, int]
    channels: dict[int, int]


_SIZE = itemgetter(1)


def _candidates(nodes: Iterable[Node], exclude: Sequence[int], include: Sequence[int]) -> list[Node]:
    return [n for n in nodes if n.online and n.node_id not in exclude and (not include or n.node_id in include)]


#: Segments placed between two steps of ``allocation_steps`` (a few milliseconds).
STEP_SEGMENTS = 8 * TURN_EVERY


def allocate_segments(
    sizes: Sequence[tuple[int, int]],
    nodes: Iterable[Node],
    usage: Usage,
    *,
    exclude: Sequence[int] = (),
    include: Sequence[int] = (),
    memory_limit: float = 0.9,
) -> dict[int, int]:
    """``allocation_steps`` in one stretch (see there)."""
    return run_steps(allocation_steps(sizes, nodes, usage, exclude=exclude, include=include,
                                      memory_limit=memory_limit))


def allocation_steps(
    sizes: Sequence[tuple[int, int]],
    nodes: Iterable[Node],
    usage: Usage,
    *,
    exclude: Sequence[int] = (),
    include: Sequence[int] = (),
    memory_limit: float = 0.9,
) -> Steps[dict[int, int]]:
    """Map each (segment id, mem size) to a node id; raises ``NoAvailableNode`` if one does not fit.

    ``usage.memory`` is updated with what was placed, so successive calls see each other.

    The rule (module docstring): largest segment first; each goes to the candidate with the lowest
    ``(used + size) / capacity`` that stays under ``memory_limit``, the first candidate on a tie; a node already
    at or over the limit takes nothing. Nodes of one capacity rank by ``used`` alone, so each capacity keeps its
    nodes in a heap keyed by (used, candidate order) and a segment compares one node per capacity:
    O(segments x (capacities + log nodes)) instead of O(segments x nodes), same placements (``place_linear``
    is the rule written out, kept for capacities too large for the rates to be told apart exactly).

    A step every ``STEP_SEGMENTS`` segments (``common.yielding``): a coroutine placing a million segments gives
    the event loop a turn there (placing them in one stretch held it for most of a second).
    """
    cands = _candidates(nodes, exclude, include)
    if not cands:
        raise NoAvailableNode(f"no online query node to load segments on (excluded {sorted(exclude)})")
    # Largest first: fewer dead ends when memory is tight. Stable, ties in the given order (reverse keeps it so),
    # and keyed in C: a lambda per segment was most of the sort.
    ordered = sorted(sizes, key=_SIZE, reverse=True)
    usable = [n for n in cands if n.capacity > 0]
    if any(n.capacity >= _EXACT_CAPACITY for n in usable) or len({n.node_id for n in usable}) != len(usable):
        return place_linear(ordered, cands, usage, memory_limit)
    yield  # the sort: a step of its own
    memory = usage.memory
    # capacity -> heap of (used, candidate index, node id)
    heaps: dict[int, list[tuple[int, int, int]]] = {}
    for i, n in enumerate(usable):
        heaps.setdefault(n.capacity, []).append((memory.get(n.node_id, 0), i, n.node_id))
    groups = list(heaps.items())
    for _, h in groups:
        heapq.heapify(h)
    placed: dict[int, int] = {}
    if len(groups) == 1:  # the usual cluster: one node size; the loop below with the comparisons inlined
        cap, h = groups[0]
        replace = heapq.heapreplace
        for start in range(0, len(ordered), STEP_SEGMENTS):
            if start:
                yield
            for seg_id, size in ordered[start:start + STEP_SEGMENTS]:
                used, i, node_id = h[0]
                total = used + size
                # A size >= 0 cannot lower the rate: ``used / cap`` is then checked by the second test (division
                # is monotonic), so it is computed only for a negative size.
                if total / cap >= memory_limit or (size < 0 and used / cap >= memory_limit):
                    raise _no_room(seg_id, size, memory_limit, cands)
                placed[seg_id] = node_id
                replace(h, (total, i, node_id))
                memory[node_id] = total
        return placed
    return (yield from _place_by_capacity(ordered, groups, cands, usage, memory_limit))


def _place_by_capacity(ordered: Sequence[tuple[int, int]], groups: list[tuple[int, list[tuple[int, int, int]]]],
                       cands: Sequence[Node], usage: Usage, memory_limit: float) -> Steps[dict[int, int]]:
    """``allocation_steps`` for nodes of several capacities: ``groups`` holds each capacity's heap."""
    memory = usage.memory
    placed: dict[int, int] = {}
    for k, (seg_id, size) in enumerate(ordered, 1):
        if k % STEP_SEGMENTS == 0:
            yield
        best: list[tuple[int, int, int]] | None = None
        best_key = (2.0, 0)
        for cap, h in groups:
            used, i, _ = h[0]
            if used / cap >= memory_limit:
                continue
            rate = (used + size) / cap
            if rate < memory_limit and (rate, i) < best_key:
                best, best_key = h, (rate, i)
        if best is None:
            raise _no_room(seg_id, size, memory_limit, cands)
        used, i, node_id = best[0]
        placed[seg_id] = node_id
        heapq.heapreplace(best, (used + size, i, node_id))
        memory[node_id] = used + size
    return placed


# Below this capacity (bytes, 4 PiB) distinct integer usages give distinct float rates, so ranking a capacity's
# nodes by ``used`` is exactly ranking them by rate as the rule does.
_EXACT_CAPACITY = 2**52


def _no_room(seg_id: int, size: int, memory_limit: float, cands: Sequence[Node]) -> NoAvailableNode:
    return NoAvailableNode(
        f"no query node has room for segment {seg_id} ({size} bytes) under {memory_limit:.0%} of capacity "
        f"(candidates {[n.node_id for n in cands]})"
    )


def place_linear(ordered: Sequence[tuple[int, int]], cands: Sequence[Node], usage: Usage,
                 memory_limit: float) -> dict[int, int]:
    """``allocate_segments``'s rule, one pass over the candidates per segment: ``ordered`` (largest first) placed
    on ``cands``, ``usage`` counted as it goes; ``NoAvailableNode`` for the first segment no candidate has room for.
    The heap-based placement is tested against it."""
    placed: dict[int, int] = {}
    for seg_id, size in ordered:
        best: Node | None = None
        best_rate = 2.0
        for n in cands:
            used = usage.memory.get(n.node_id, 0)
            if n.capacity <= 0 or used / n.capacity >= memory_limit:
                continue
            rate = (used + size) / n.capacity
            if rate < memory_limit and rate < best_rate:
                best, best_rate = n, rate
        if best is None:
            raise _no_room(seg_id, size, memory_limit, cands)
        placed[seg_id] = best.node_id
        usage.memory[best.node_id] = usage.memory.get(best.node_id, 0) + size
    return placed


def allocate_channels(
    channels: Sequence[str],
    nodes: Iterable[Node],
    usage: Usage,
    *,
    exclude: Sequence[int] = (),
    include: Sequence[int] = (),
) -> dict[str, int]:
    cands = _candidates(nodes, exclude, include)
    if not cands:
        raise NoAvailableNode(f"no online query node to watch channels on (excluded {sorted(exclude)})")
    placed = {}
    for ch in channels:
        best = min(cands, key=lambda n: (usage.channels.get(n.node_id, 0), n.node_id))
        placed[ch] = best.node_id
        usage.channels[best.node_id] = usage.channels.get(best.node_id, 0) + 1
    return placed
