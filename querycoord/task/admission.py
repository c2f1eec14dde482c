"""Load admission (Milvus's load precheck): a load whose segments cannot fit the nodes its replicas may use is
refused before anything is queued or written, with how much memory is missing and how many nodes would make it fit.

The rule, checked the way the trigger will place the load (``triggers._LoadTrigger._plan``), on the nodes
``eligible_nodes`` returns and under the allocator's memory limit (``cluster.allocator``):

* the sizes are the catalog's ``mem_size`` of each segment the load would load: the asked partitions (all of a
  collection's for LoadCollection) that are not loaded yet, minus segments query meta already places (the same
  sizes the allocator weighs);
* a first load (the collection is not in query meta) splits the eligible nodes into one group per replica as
  ``split_nodes`` does, and every group must take a whole copy (``allocate_segments`` over that group alone):
  the replica count must fit the nodes, and each replica's share must fit its own nodes, not just the sum;
* partitions added to a loaded collection are placed replica by replica as ``units.place_unit`` places them:
  on the replica's own online nodes, else with the spare nodes too (a spare one replica takes is not offered
  to the next);
* a load with no eligible node at all is NO_AVAILABLE_NODE, as the trigger would say; one that does not fit is
  RESOURCE_EXHAUSTED ("not enough query node memory").

What admission cannot foresee (a node leaving after it, another load admitted at the same moment) is still met
by the trigger: a unit it cannot place fails the load, or parks for the checker once the load answered.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Sequence
from operator import itemgetter

from loguru import logger

from meta.errors import MetaError
from proto import common_pb2
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.nodes import Node
from querycoord.common.errors import CoordError
from querycoord.common.partition_state import NOT_PRESENT
from querycoord.task.model import TaskEnv
from querycoord.task.triggers import split_nodes
from querycoord.task.units import place_unit_with_turns, place_with_turns, usage_of

# How long admission waits for the followed catalog copy to be current before it reads the catalog instead.
CATCH_UP = 5.0


class NotEnoughMemory(CoordError):
    """A load that does not fit the query nodes' memory; the reason says how much is missing."""

    code = common_pb2.RESOURCE_EXHAUSTED


def eligible_nodes(env: TaskEnv) -> list[Node]:
    """The query nodes a new load may be placed on: online ones that are not cordoned, draining or drained
    (``cluster.lifecycle``), nor silent since the takeover (``NodeManager.ineligible_ids``)."""
    eligible = env.nodes.eligible_ids()
    return [n for n in env.nodes.online() if n.node_id in eligible]


def human(size: int) -> str:
    """Bytes as an operator reads them: GiB from 1 GiB up, else MiB."""
    if size >= 1 << 30:
        return f"{size / (1 << 30):.1f} GiB"
    return f"{size / (1 << 20):.1f} MiB"


async def load_sizes(env: TaskEnv, collection_id: int, partition_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(segment id, mem size) of the segments a load of ``partition_ids`` would load (see module docstring): from
    the followed catalog copy when it is current, else from the catalog."""
    meta = env.meta
    info = meta.get_collection(collection_id)
    unloaded = {p.partition_id for p in info.partitions if p.state == NOT_PRESENT} if info else set()
    todo = [p for p in partition_ids if not meta.has_partition(collection_id, p) or p in unloaded]
    if not todo:
        return []
    sizes: list[tuple[int, int]] | None = None
    if env.targets is not None:
        try:
            await env.targets.catch_up(CATCH_UP)
        except (TimeoutError, MetaError) as exc:
            logger.info("admission: the catalog copy is not current ({}); reading the catalog", exc or "timeout")
        else:
            target = env.targets.target(collection_id, todo)
            if target is not None:
                sizes = []
                for part in target.partitions.values():  # a partition at a time, a turn between
                    sizes += [(s.segment_id, s.mem_size) for s in part.values()]
                    await asyncio.sleep(0)
    if sizes is None:
        sizes = []
        for pid in todo:
            _, binlogs = await env.broker.get_recovery_info(collection_id, pid)
            sizes += [(b.segment_id, b.mem_size) for b in binlogs]
    placed = meta.segment_places()
    if placed.keys().isdisjoint(map(itemgetter(0), sizes)):  # a first load: nothing to leave out (checked in C)
        return sizes
    return [s for s in sizes if s[0] not in placed]


async def admit_load(env: TaskEnv, collection_id: int, partition_ids: Sequence[int], replicas: int) -> None:
    """Refuse (``NotEnoughMemory``, ``NoAvailableNode``) a load of ``partition_ids`` with ``replicas`` copies that
    cannot be placed now (see module docstring); return when it fits."""
    sizes = await load_sizes(env, collection_id, partition_ids)
    nodes = eligible_nodes(env)
    if not nodes:
        if sizes or not env.meta.has_collection(collection_id):
            unheard = sorted(env.nodes.unheard & env.nodes.online_ids())
            why = f" ({unheard} have not answered this coordinator yet)" if unheard else ""
            raise NoAvailableNode(f"no online query node to load collection {collection_id} on{why}")
        return
    if not sizes:
        return
    await check_fits(env, collection_id, sizes, replicas, nodes)


async def check_fits(env: TaskEnv, collection_id: int, sizes: list[tuple[int, int]], replicas: int,
                     nodes: list[Node]) -> None:
    """``NotEnoughMemory`` unless every replica's copy of ``sizes`` can be placed on ``nodes`` (module docstring);
    the placements give the event loop turns (a million segments per replica)."""
    usage = usage_of(env)
    ids = [n.node_id for n in nodes]
    groups: list[list[int]]
    shortfalls: list[int] = []
    failed = False
    if env.meta.has_collection(collection_id):
        groups = []
        not_eligible = sorted(env.nodes.online_ids() - set(ids))
        taken: list[int] = []  # spares an earlier replica took
        for replica in env.meta.replica_ids(collection_id):
            before = dict(usage.memory)
            try:
                placed = await place_unit_with_turns(env, collection_id, replica, sizes, [], usage,
                                                     exclude=[*not_eligible, *taken])
            except NoAvailableNode:
                own = [n for n in env.meta.replica_nodes(collection_id, replica) if n in ids] if replica else ids
                if not own and not [n for n in ids if n not in env.meta.replica_node_ids(collection_id)]:
                    raise  # no node at all for this replica: the trigger's own answer
                failed = True
                groups.append(own)
                shortfalls.append(_shortfall(env, sizes, own, before))
                continue
            used = set(placed["segments"].values())
            members = set(env.meta.replica_nodes(collection_id, replica))
            taken += sorted(used - members)
            groups.append(sorted(used))
    else:
        groups = split_nodes(ids, replicas, memory={n: usage.memory.get(n, 0) for n in ids})
        for group in groups:
            before = dict(usage.memory)
            try:
                await place_with_turns(env, sizes, [], group, usage)
            except NoAvailableNode:
                failed = True
                shortfalls.append(_shortfall(env, sizes, group, before))
    if failed:
        raise NotEnoughMemory(refusal(env, collection_id, sizes, len(groups), nodes, shortfalls))


def _free(env: TaskEnv, node_ids: Sequence[int], memory: dict[int, int]) -> int:
    """Memory the nodes may still take under the memory limit."""
    limit = env.config.memory_limit
    free = 0
    for n in node_ids:
        node = env.nodes.get(n)
        if node is not None:
            free += max(0, int(node.capacity * limit) - memory.get(n, 0))
    return free


def _shortfall(env: TaskEnv, sizes: list[tuple[int, int]], group: Sequence[int], memory: dict[int, int]) -> int:
    """How much more memory one replica's copy needs than its nodes have free (at least 1 byte: a copy whose
    total fits but whose segments do not pack is still short)."""
    return max(1, sum(s for _, s in sizes) - _free(env, group, memory))


def refusal(env: TaskEnv, collection_id: int, sizes: list[tuple[int, int]], replicas: int, nodes: list[Node],
            shortfalls: list[int]) -> str:
    """The reason a load is refused: what it needs, what is free, what is missing, how many usual nodes more."""
    per_replica = sum(s for _, s in sizes)
    ids = [n.node_id for n in nodes]
    free = _free(env, ids, usage_of(env).memory)
    missing = max(per_replica * replicas - free, sum(shortfalls))
    usual = int(statistics.median(n.capacity for n in nodes))
    usable = max(1, int(usual * env.config.memory_limit))
    more = max(math.ceil(missing / usable), sum(math.ceil(s / usable) for s in shortfalls), 1)
    largest = max(s for _, s in sizes)
    if largest >= usable:
        more_text = f"segment sizes up to {human(largest)} fit no node of {human(usual)}: larger nodes"
    else:
        more_text = f"about {more} more node{'s' if more > 1 else ''} of {human(usual)}"
    copies = f"{replicas} replica{'s' if replicas > 1 else ''}"
    return (f"load of collection {collection_id} needs {copies} x {human(per_replica)}; the nodes that can take "
            f"them have {human(free)} free (under {env.config.memory_limit:.0%} of capacity): {human(missing)} "
            f"missing, {more_text}")


__all__ = ["NotEnoughMemory", "admit_load", "check_fits", "eligible_nodes", "human", "load_sizes",
           "refusal"]
