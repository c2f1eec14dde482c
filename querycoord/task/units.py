"""Where one repair unit (a replica of a collection) may go: its nodes, the spares it is given, the placement.

Shared by the planners (``children.plan_children``: a repair, a handoff, a reschedule) and by the checker, which
weighs a unit in memory before it queues anything (``assess``): both must agree on what "can be placed" means,
or the checker would queue repairs that then fail.

Spares: a replica left with no online node gets one spare (an online node serving no replica of the collection),
the emptiest first, before anything is planned for it, so that every replica regains a node when spares come
back (Milvus 2.2 hands new nodes to replicas at once); without it, the first replica to plan took every spare
and the others waited for ever. A replica whose own nodes lack room may still take more spares, which join it, but
first only its fair share (``spare_share``): spares that come online while a repair is already planning (after
its ``give_spares``) are shared between the collection's replicas with no online node, so one of them never takes
every spare while another waits with none. Only a unit that fits in no fair share takes them all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from loguru import logger

from querycoord.cluster.allocator import NoAvailableNode, Usage, allocate_channels, allocation_steps
from querycoord.common.wording import mib_exact
from querycoord.common.yielding import Steps, run_steps, run_steps_with_turns
from querycoord.task.model import TaskEnv
from querycoord.task.parking import NO_NODE, NO_ROOM, Parked

Placement = dict[str, dict]  # {"segments": segment id -> node, "channels": channel name -> node}


def usage_of(env: TaskEnv) -> Usage:
    nodes = [n.node_id for n in env.nodes.online()]
    return Usage(
        memory={n: env.meta.node_memory_usage(n) for n in nodes},
        channels={n: len(env.meta.channels_on_node(n)) for n in nodes},
    )


def spares_of(env: TaskEnv, collection_id: int) -> list[int]:
    """Online nodes serving no replica of the collection, emptiest first; an ineligible node (cordoned, or not
    heard since the takeover) is no spare."""
    taken = env.meta.replica_node_ids(collection_id) | env.nodes.ineligible_ids()
    spares = [n.node_id for n in env.nodes.online() if n.node_id not in taken]
    return sorted(spares, key=lambda n: (env.meta.node_memory_usage(n), n))


def nodeless_replicas(env: TaskEnv, collection_id: int) -> list[int]:
    """The collection's replicas with no online node, by replica id."""
    online = env.nodes.online_ids()
    return [r for r in env.meta.replica_ids(collection_id)
            if r and not any(n in online for n in env.meta.replica_nodes(collection_id, r))]


def spare_plan(env: TaskEnv, collection_id: int) -> dict[int, int]:
    """replica -> the spare it is given: one each for the replicas with no online node, by replica id."""
    return dict(zip(nodeless_replicas(env, collection_id), spares_of(env, collection_id), strict=False))


def spare_share(env: TaskEnv, collection_id: int, replica_id: int, spares: int) -> int:
    """How many of ``spares`` spare nodes one unit of ``replica_id`` takes first (its fair share): with k
    replicas of the collection left with no online node, one of them takes ceil(spares / k); any other replica
    leaves one spare for each of them. At least one when there is any spare (a unit with no node needs one)."""
    if spares <= 0:
        return 0
    nodeless = nodeless_replicas(env, collection_id)
    if replica_id in nodeless:
        return max(1, math.ceil(spares / len(nodeless)))
    return max(1, spares - len(nodeless))


async def give_spares(env: TaskEnv, collection_id: int) -> dict[int, int]:
    """Apply ``spare_plan`` (the spares join their replicas in query meta); returns it."""
    plan = spare_plan(env, collection_id)
    for replica, node in sorted(plan.items()):
        await env.meta.add_replica_nodes(collection_id, replica, [node])
    return plan


def candidates(env: TaskEnv, collection_id: int, replica_id: int, *, exclude: Sequence[int] = (),
               include: Sequence[int] = (), with_spares: bool = False, planned: Sequence[int] = (),
               spares: Sequence[int] | None = None) -> list[int]:
    """Online nodes that may take the replica's work: its own (and ``planned`` spares it is about to get), with
    ``with_spares`` every spare too (or only ``spares`` when given); minus ``exclude`` and the ineligible nodes,
    within ``include`` when given."""
    members = set(env.meta.replica_nodes(collection_id, replica_id)) | set(planned)
    if with_spares:
        members |= set(spares_of(env, collection_id) if spares is None else spares)
    online = env.nodes.eligible_ids()
    allowed = [n for n in sorted(members) if n in online and n not in exclude]
    return [n for n in allowed if n in include] if include else allowed


def usable_spares(env: TaskEnv, collection_id: int, *, exclude: Sequence[int] = (), include: Sequence[int] = (),
                  planned: Sequence[int] = ()) -> list[int]:
    """The spares a unit could be given (``spares_of``'s order, emptiest first), minus ``planned`` ones (already
    its own), ``exclude`` and the ineligible, within ``include`` when given."""
    eligible = env.nodes.eligible_ids()
    return [n for n in spares_of(env, collection_id)
            if n in eligible and n not in exclude and n not in planned and (not include or n in include)]


def place(env: TaskEnv, sizes: Sequence[tuple[int, int]], channels: Sequence[str], allowed: Sequence[int],
          usage: Usage, *, exclude: Sequence[int] = ()) -> Placement:
    """Segments (memory-aware) and channels on ``allowed`` nodes (all but ``exclude`` when empty); ``usage`` is
    updated with what was placed; an ineligible node (cordoned, unheard) takes nothing. ``NoAvailableNode`` when
    something does not fit."""
    return run_steps(place_steps(env, sizes, channels, allowed, usage, exclude=exclude))


async def place_with_turns(env: TaskEnv, sizes: Sequence[tuple[int, int]], channels: Sequence[str],
                           allowed: Sequence[int], usage: Usage, *, exclude: Sequence[int] = ()) -> Placement:
    """``place``, giving the event loop turns while it places (a load's million segments)."""
    return await run_steps_with_turns(place_steps(env, sizes, channels, allowed, usage, exclude=exclude))


def place_steps(env: TaskEnv, sizes: Sequence[tuple[int, int]], channels: Sequence[str], allowed: Sequence[int],
                usage: Usage, *, exclude: Sequence[int] = ()) -> Steps[Placement]:
    """``place`` cut in steps (``allocator.allocation_steps``)."""
    nodes = list(env.nodes.nodes.values())
    if ineligible := env.nodes.ineligible_ids():
        exclude = [*exclude, *sorted(ineligible)]
    segments = (yield from allocation_steps(sizes, nodes, usage, exclude=exclude, include=allowed,
                                            memory_limit=env.config.memory_limit)) if sizes else {}
    return {
        "segments": segments,
        "channels": allocate_channels(list(channels), nodes, usage, exclude=exclude, include=allowed)
        if channels else {},
    }


def _try_place(env: TaskEnv, sizes: Sequence[tuple[int, int]], channels: Sequence[str], allowed: Sequence[int],
               usage: Usage, exclude: Sequence[int]) -> Steps[Placement | None]:
    """``place`` on ``allowed``, counted in ``usage`` only when everything fits; None when it does not."""
    trial = Usage(dict(usage.memory), dict(usage.channels))
    try:
        placed = yield from place_steps(env, sizes, channels, allowed, trial, exclude=exclude)
    except NoAvailableNode:
        return None
    usage.memory.update(trial.memory)
    usage.channels.update(trial.channels)
    return placed


def place_unit(env: TaskEnv, collection_id: int, replica_id: int, sizes: Sequence[tuple[int, int]],
               channels: Sequence[str], usage: Usage, *, exclude: Sequence[int] = (), include: Sequence[int] = (),
               planned: Sequence[int] = ()) -> Placement:
    """Place one unit: on the replica's own nodes, else with its fair share of the spares too, else with every
    spare (module docstring); replica 0 (a collection loaded before replicas) anywhere. ``NoAvailableNode`` says
    why it cannot be placed."""
    return run_steps(place_unit_steps(env, collection_id, replica_id, sizes, channels, usage, exclude=exclude,
                                      include=include, planned=planned))


async def place_unit_with_turns(env: TaskEnv, collection_id: int, replica_id: int,
                                sizes: Sequence[tuple[int, int]], channels: Sequence[str], usage: Usage, *,
                                exclude: Sequence[int] = (), include: Sequence[int] = (),
                                planned: Sequence[int] = ()) -> Placement:
    """``place_unit``, giving the event loop turns while it places (a load's million segments)."""
    return await run_steps_with_turns(place_unit_steps(env, collection_id, replica_id, sizes, channels, usage,
                                                       exclude=exclude, include=include, planned=planned))


def place_unit_steps(env: TaskEnv, collection_id: int, replica_id: int, sizes: Sequence[tuple[int, int]],
                     channels: Sequence[str], usage: Usage, *, exclude: Sequence[int] = (),
                     include: Sequence[int] = (), planned: Sequence[int] = ()) -> Steps[Placement]:
    """``place_unit`` cut in steps (``allocator.allocation_steps``)."""
    if not replica_id:
        return (yield from place_steps(env, sizes, channels, include, usage, exclude=exclude))
    own = candidates(env, collection_id, replica_id, exclude=exclude, include=include, planned=planned)
    if own and (placed := (yield from _try_place(env, sizes, channels, own, usage, exclude))) is not None:
        return placed
    wider = candidates(env, collection_id, replica_id, exclude=exclude, include=include, with_spares=True,
                       planned=planned)
    if not wider:
        raise NoAvailableNode(f"replica {replica_id} of collection {collection_id} has no online node "
                              f"(excluded {sorted(exclude)}) and no spare node is online")
    spares = usable_spares(env, collection_id, exclude=exclude, include=include, planned=planned)
    share = spare_share(env, collection_id, replica_id, len(spares))
    if 0 < share < len(spares):
        fair = candidates(env, collection_id, replica_id, exclude=exclude, include=include, with_spares=True,
                          planned=planned, spares=spares[:share])
        if (placed := (yield from _try_place(env, sizes, channels, fair, usage, exclude))) is not None:
            return placed
    trial = Usage(dict(usage.memory), dict(usage.channels))
    placed = yield from place_steps(env, sizes, channels, wider, trial, exclude=exclude)
    usage.memory.update(trial.memory)
    usage.channels.update(trial.channels)
    return placed


def _mib(n: int) -> str:
    return mib_exact(n)


class Sized(Protocol):
    """A segment as a unit lists it: a checker's missing copy, a catalog binlog or a load info."""

    @property
    def segment_id(self) -> int: ...

    @property
    def mem_size(self) -> int: ...


def assess(env: TaskEnv, collection_id: int, replica_id: int, segments: Sequence[Sized],
           channels: Sequence[str], usage: Usage, *, planned: Sequence[int] = ()) -> Parked | None:
    """Whether the unit can be placed now (None, and ``usage`` counts it), or why not (a ``Parked``)."""
    sizes = [(s.segment_id, s.mem_size) for s in segments]
    try:
        place_unit(env, collection_id, replica_id, sizes, channels, usage, planned=planned)
        return None
    except NoAvailableNode as exc:
        why = str(exc)
    total = sum(size for _sid, size in sizes)
    wider = candidates(env, collection_id, replica_id, with_spares=True, planned=planned) if replica_id else \
        sorted(env.nodes.eligible_ids())
    parked = Parked(collection_id=collection_id, replica_id=replica_id, code=NO_NODE, reason="",
                    segments=len(sizes), segment_bytes=total, channels=len(channels))
    if not wider:
        offline = [n for n in env.meta.replica_nodes(collection_id, replica_id) if not env.nodes.is_online(n)]
        gone = f" (its nodes {offline} are offline)" if offline else ""
        parked.reason = (f"replica {replica_id} has no online query node{gone} and no spare node is online: "
                         "waiting for a query node to join")
        return parked
    limit = env.config.memory_limit
    room = {}
    for n in wider:
        node = env.nodes.get(n)
        if node is not None:
            room[n] = max(0, int(node.capacity * limit) - usage.memory.get(n, 0))
    short = max(0, total - sum(room.values()))
    if short:
        detail = f"{_mib(short)} more memory is needed under {limit:.0%} of capacity"
    else:
        largest = max((size for _sid, size in sizes), default=0)
        detail = (f"the largest segment ({_mib(largest)}) fits on no single node under {limit:.0%} of capacity"
                  if sizes else why)
    free = ", ".join(f"node {n}: {_mib(b)} free" for n, b in sorted(room.items()))
    parked.code, parked.short_bytes, parked.room = NO_ROOM, short, room
    parked.reason = (f"no room for {len(sizes)} segments ({_mib(total)}) of replica {replica_id} on nodes {wider} "
                     f"({free}): {detail}; waiting for memory to be freed or a node to join")
    return parked


def park_unplaced(env: TaskEnv, collection_id: int, replica_id: int, segments: Sequence[Sized],
                  channels: Sequence[str] = (), *, by: str, error: Exception) -> Parked:
    """A trigger found a unit it cannot place when it ran (the world moved since the checker weighed it): park
    it with its reason (``assess``'s, else the error's) rather than fail the other units' work."""
    parked = assess(env, collection_id, replica_id, segments, channels, usage_of(env)) or Parked(
        collection_id=collection_id, replica_id=replica_id, code=NO_ROOM, reason=str(error),
        segments=len(segments), segment_bytes=sum(s.mem_size for s in segments), channels=len(channels))
    parked.by = by
    env.parked.park(parked)
    logger.info("{}: replica {} of collection {} parked: {}", by, replica_id, collection_id, parked.reason)
    return parked
