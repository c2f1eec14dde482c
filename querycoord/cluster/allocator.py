"""Where segments and channels go: memory-aware for segments, fewest channels for channels.

Segments: among online nodes (minus excluded, within included), skip nodes
at or above the memory limit (90 % by default); each segment goes to the
node with the lowest memory rate that stays under the limit after adding it.
Channels: the online node watching the fewest DM channels.

With ``wait`` (NodeDown balance, handoff) an allocation that finds no room
retries every ``wait_interval`` until ``deadline``; Milvus waited forever
without cancellation. Cancellation is the caller's task being cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from proto import common_pb2
from querycoord.cluster.nodes import Node
from querycoord.errors import CoordError


class NoAvailableNode(CoordError):
    """No online node can take the work; the message says why."""

    code = common_pb2.NO_AVAILABLE_NODE


@dataclass
class Usage:
    """Memory and channel load per node as the allocator counts them."""

    memory: dict[int, int]
    channels: dict[int, int]


def _candidates(nodes: Iterable[Node], exclude: Sequence[int], include: Sequence[int]) -> list[Node]:
    return [n for n in nodes if n.online and n.node_id not in exclude and (not include or n.node_id in include)]


def allocate_segments(
    sizes: Sequence[tuple[int, int]],
    nodes: Iterable[Node],
    usage: Usage,
    *,
    exclude: Sequence[int] = (),
    include: Sequence[int] = (),
    memory_limit: float = 0.9,
) -> dict[int, int]:
    """Map each (segment id, mem size) to a node id; raises ``NoAvailableNode`` if one does not fit.

    ``usage.memory`` is updated with what was placed, so successive calls see each other.
    """
    cands = _candidates(nodes, exclude, include)
    if not cands:
        raise NoAvailableNode(f"no online query node to load segments on (excluded {sorted(exclude)})")
    placed: dict[int, int] = {}
    # Largest first: fewer dead ends when memory is tight.
    for seg_id, size in sorted(sizes, key=lambda x: -x[1]):
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
            raise NoAvailableNode(
                f"no query node has room for segment {seg_id} ({size} bytes) under {memory_limit:.0%} of capacity "
                f"(candidates {[n.node_id for n in cands]})"
            )
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


class CollectionReleasing(NoAvailableNode):
    """The collection is being released: waiting for room to place its work would only hold the release up."""


async def allocate_waiting(
    attempt: Callable[[], dict],
    *,
    wait: bool,
    deadline: float,
    wait_interval: float = 1.0,
) -> dict:
    """Run ``attempt`` once, or with ``wait`` until it succeeds or the monotonic ``deadline`` passes."""
    while True:
        try:
            return attempt()
        except CollectionReleasing:
            raise
        except NoAvailableNode as exc:
            if not wait or time.monotonic() + wait_interval > deadline:
                raise NoAvailableNode(f"{exc}; gave up at the task's deadline" if wait else str(exc)) from None
            await asyncio.sleep(wait_interval)
