"""Segment allocation: the heap-based ``allocate_segments`` places exactly as the rule written out does.

The rule (querycoord/cluster/allocator.py): largest first; each segment goes to the candidate with the lowest
``(used + size) / capacity`` under the memory limit, the first candidate on a tie; a node at or over the limit
takes nothing. ``reference`` below is that rule written out (one pass over every candidate per segment: the
allocator's ``place_linear``, which it keeps for capacities too large for the heap); the two are compared on random
clusters, including failures part way.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from querycoord.cluster.allocator import (
    STEP_SEGMENTS,
    NoAvailableNode,
    Usage,
    allocate_segments,
    allocation_steps,
    place_linear,
)
from querycoord.cluster.nodes import Node, NodeState
from querycoord.common.yielding import run_steps, run_steps_with_turns

MiB = 1024 * 1024


def node(node_id: int, capacity: int, online: bool = True) -> Node:
    return Node(node_id, f"127.0.0.1:{node_id}", capacity, NodeState.ONLINE if online else NodeState.OFFLINE,
                client=None)  # type: ignore[arg-type]


def reference(sizes: list[tuple[int, int]], nodes: list[Node], memory: dict[int, int], *, exclude: list[int],
              include: list[int], memory_limit: float) -> tuple[dict[int, int] | str, dict[int, int]]:
    """The rule, one pass over the candidates per segment (the allocator's ``place_linear``) on the candidates
    and the order worked out here; returns (placement or the error, usage after)."""
    cands = [n for n in nodes if n.online and n.node_id not in exclude and (not include or n.node_id in include)]
    if not cands:
        return "no candidates", memory
    usage = Usage(memory=memory, channels={})
    return outcome(lambda: place_linear(sorted(sizes, key=lambda x: -x[1]), cands, usage, memory_limit), usage)


def run(sizes: list[tuple[int, int]], nodes: list[Node], memory: dict[int, int], *, exclude: list[int],
        include: list[int], memory_limit: float) -> tuple[dict[int, int] | str, dict[int, int]]:
    usage = Usage(memory=memory, channels={})
    return outcome(lambda: allocate_segments(sizes, nodes, usage, exclude=exclude, include=include,
                                             memory_limit=memory_limit), usage)


def outcome(place: Callable[[], dict[int, int]], usage: Usage) -> tuple[dict[int, int] | str, dict[int, int]]:
    """What ``place()`` placed, or its error in short, with the usage after."""
    try:
        return place(), usage.memory
    except NoAvailableNode as exc:
        text = str(exc)
        if text.startswith("no online query node"):
            return "no candidates", usage.memory
        assert text.startswith("no query node has room for segment "), text
        return f"no room for segment {text.split()[7]}", usage.memory


@pytest.mark.parametrize("seed", range(300))
def test_same_placement_as_the_rule_on_random_clusters(seed: int) -> None:
    rng = random.Random(seed)
    n_nodes = rng.randint(1, 9)
    # One capacity (the usual cluster), a few, or all different; sometimes a node offering none.
    caps = rng.choice([[1024 * MiB], [512 * MiB, 1024 * MiB], [rng.randint(1, 4096) * MiB for _ in range(n_nodes)]])
    nodes = [node(i + 1, rng.choice(caps) if rng.random() > 0.05 else 0, online=rng.random() > 0.1)
             for i in range(n_nodes)]
    rng.shuffle(nodes)
    memory = {n.node_id: rng.choice([0, 0, rng.randint(0, n.capacity or MiB)]) for n in nodes if rng.random() > 0.2}
    equal = rng.random() < 0.4  # bulk loads: every segment the same size
    size_of = rng.randint(1, 64) * MiB
    sizes = [(1000 + i, size_of if equal else rng.randint(0, 64 * MiB)) for i in range(rng.randint(0, 400))]
    exclude = [n.node_id for n in nodes if rng.random() < 0.15]
    include = [n.node_id for n in nodes if rng.random() < 0.5] if rng.random() < 0.3 else []
    limit = rng.choice([0.9, 0.9, 0.5, 1.0])
    want = reference(sizes, nodes, dict(memory), exclude=exclude, include=include, memory_limit=limit)
    got = run(sizes, nodes, dict(memory), exclude=exclude, include=include, memory_limit=limit)
    assert got == want


def test_ties_go_to_the_first_candidate_and_equal_sizes_deal_round_robin() -> None:
    nodes = [node(7, 1024 * MiB), node(3, 1024 * MiB), node(5, 1024 * MiB)]
    usage = Usage(memory={}, channels={})
    placed = allocate_segments([(i, MiB) for i in range(7)], nodes, usage)
    assert [placed[i] for i in range(7)] == [7, 3, 5, 7, 3, 5, 7]
    assert usage.memory == {7: 3 * MiB, 3: 2 * MiB, 5: 2 * MiB}


def test_the_lowest_rate_wins_across_capacities() -> None:
    # A node twice as large takes twice as much before the smaller one is emptier by rate.
    nodes = [node(1, 100 * MiB), node(2, 200 * MiB)]
    usage = Usage(memory={1: 10 * MiB, 2: 10 * MiB}, channels={})
    placed = allocate_segments([(i, 10 * MiB) for i in range(4)], nodes, usage)
    assert sorted(placed.values()) == [1, 2, 2, 2]
    assert usage.memory == {1: 20 * MiB, 2: 40 * MiB}


def test_no_room_raises_with_what_was_placed_counted() -> None:
    nodes = [node(1, 100 * MiB)]
    usage = Usage(memory={}, channels={})
    with pytest.raises(NoAvailableNode, match="no query node has room for segment 3"):
        allocate_segments([(1, 40 * MiB), (2, 40 * MiB), (3, 30 * MiB)], nodes, usage)
    assert usage.memory == {1: 80 * MiB}


def test_huge_capacities_use_the_rule_written_out() -> None:
    big = 2**60
    nodes = [node(1, big), node(2, big)]
    usage = Usage(memory={1: 2**57 + 1, 2: 2**57}, channels={})  # the same float rate: the first candidate
    want, _ = reference([(9, 1)], nodes, dict(usage.memory), exclude=[], include=[], memory_limit=0.9)
    assert allocate_segments([(9, 1)], nodes, usage) == want == {9: 1}


@pytest.mark.parametrize("caps", [[1024 * MiB] * 3, [512 * MiB, 1024 * MiB, 2048 * MiB]])
def test_the_steps_place_as_the_rule_and_give_a_turn_every_step_segments(caps: list[int]) -> None:
    """A coroutine placing a million segments runs ``allocation_steps`` with a turn at each step: the placement
    is the rule's (one capacity or several), and there is a step at least every ``STEP_SEGMENTS`` segments."""
    nodes = [node(i + 1, cap) for i, cap in enumerate(caps)]
    count = 2 * STEP_SEGMENTS + 10
    sizes = [(i, 1 + i % 97) for i in range(count)]
    steps = allocation_steps(sizes, nodes, usage := Usage(memory={}, channels={}))
    taken = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            placed = done.value
            break
        taken += 1
    assert taken >= count // STEP_SEGMENTS
    assert (placed, usage.memory) == reference(sizes, nodes, {}, exclude=[], include=[], memory_limit=0.9)
    assert run_steps(allocation_steps(sizes, nodes, Usage(memory={}, channels={}))) == placed


async def test_steps_run_with_turns_let_another_coroutine_run_in_between() -> None:
    nodes = [node(1, 1024 * MiB), node(2, 1024 * MiB)]
    sizes = [(i, 1) for i in range(3 * STEP_SEGMENTS)]
    placing = asyncio.ensure_future(run_steps_with_turns(allocation_steps(sizes, nodes, Usage({}, {}))))
    turns = 0
    while not placing.done():  # runs only when the placement gives the loop a turn
        turns += 1
        await asyncio.sleep(0)
    assert turns >= 3 and len(await placing) == len(sizes)
