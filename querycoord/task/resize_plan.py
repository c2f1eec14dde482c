"""Where a resize puts new replicas and which replicas a shrink drops: shared by the job, which refuses a grow that
cannot fit before anything is queued, and by the trigger, which checks again when it runs (the cluster may have
changed in between) and must agree with the job.

A grow's new replicas get the spare nodes (online, serving no replica of the collection), dealt as a first load
deals nodes (``triggers.split_nodes``: the emptiest first, round robin), and each must hold every segment and DM
channel of the collection on its own nodes under the memory limit. When the spares are too few or too small, nodes
are taken from the collection's replicas that can spare them (``rehome_plan``): up to an even share of the
eligible nodes per replica first, then one more at a time while the new replicas still do not fit. The nodes taken
are the plan's ``rehomes``: they leave their replicas (``task.rehome``) before the new replicas are made. A grow
is refused only when it cannot fit even so. A shrink keeps the most complete replicas (what their online nodes
hold), ties by lowest id, and drops the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from proto import common_pb2, data_pb2, task_pb2
from querycoord.cluster.allocator import NoAvailableNode, Usage
from querycoord.common.errors import CoordError
from querycoord.common.replica_number import joining_replica_ids, serving_replica_ids
from querycoord.common.wording import mib_exact, plural
from querycoord.served.state import collection_served
from querycoord.task.model import TaskEnv
from querycoord.task.rehome_plan import DonorPicker
from querycoord.task.triggers import split_nodes
from querycoord.task.units import place, spares_of, usage_of


class NoRoomForReplicas(CoordError):
    """A grow's new replicas do not fit in the memory of the spare nodes."""

    code = common_pb2.RESOURCE_EXHAUSTED


class TooFewNodes(CoordError):
    """Too few spare nodes to give each new replica its own."""

    code = common_pb2.NO_AVAILABLE_NODE


@dataclass
class ResizePlan:
    """What a resize does to one collection: replicas dropped, node groups of replicas to create."""

    collection_id: int
    target: int
    dropped: list[int]
    new_groups: list[list[int]]
    rehomes: list[task_pb2.RehomeNode] = field(default_factory=list)  # nodes that leave their replicas first


def _count(n: int, what: str) -> str:
    return plural(n, what)


def _mib(n: int) -> str:
    return mib_exact(n)


def keep_order(env: TaskEnv, collection_id: int, replica_ids: Sequence[int]) -> list[int]:
    """``replica_ids`` from the one to keep first: most held (segments and DM channels, as online nodes serve
    them), ties by lowest id."""
    served = collection_served(env.meta, collection_id, env.nodes.online_ids())
    held = {r: (s.held + s.channels_held) for r, s in (served.replicas.items() if served else ())}
    return sorted(replica_ids, key=lambda r: (-held.get(r, 0), r))


def new_replica_groups(env: TaskEnv, collection_id: int, number: int, usage: Usage,
                       nodes: list[int] | None = None) -> list[list[int]]:
    """Node groups for ``number`` new replicas of the collection out of ``nodes`` (default: its spares), checked
    to hold all of it (``usage`` then counts them). ``TooFewNodes`` / ``NoRoomForReplicas`` say what is missing."""
    spares = spares_of(env, collection_id) if nodes is None else nodes
    if len(spares) < number:
        listed = f" (nodes {spares})" if spares else ""
        raise TooFewNodes(f"collection {collection_id} needs {_count(number, 'spare query node')} for "
                          f"{_count(number, 'new replica')} (each on its own nodes): {len(spares)} online{listed}; "
                          f"start {_count(number - len(spares), 'more query node')} or ask for fewer replicas")
    try:
        groups = split_nodes(spares, number, memory=dict(usage.memory))
    except NoAvailableNode as exc:
        raise TooFewNodes(str(exc)) from None
    segments = env.meta.segments_of(collection_id)
    sizes = [(s.segment_id, s.mem_size) for s in segments]
    channels = sorted({w.dm_channel for w in env.meta.dm_channels_of(collection_id)})
    total = sum(size for _sid, size in sizes)
    limit = env.config.memory_limit
    for i, group in enumerate(groups):
        trial = Usage(dict(usage.memory), dict(usage.channels))
        try:
            place(env, sizes, channels, group, trial)
        except NoAvailableNode:
            free = []
            for n in group:
                node = env.nodes.get(n)
                room = max(0, int(node.capacity * limit) - usage.memory.get(n, 0)) if node is not None else 0
                free.append(f"node {n}: {_mib(room)} free")
            raise NoRoomForReplicas(
                f"new replica {i + 1} of {number} of collection {collection_id} does not fit: "
                f"{len(sizes)} segments ({_mib(total)}) on nodes {group} ({', '.join(free)}) under "
                f"{limit:.0%} of capacity; free memory or start larger query nodes") from None
        usage.memory.update(trial.memory)
        usage.channels.update(trial.channels)
    return groups


def _copy(usage: Usage) -> Usage:
    return Usage(dict(usage.memory), dict(usage.channels))


def _groups_with_rehomes(env: TaskEnv, collection_id: int, number: int, target: int,
                         usage: Usage) -> tuple[list[list[int]], list[task_pb2.RehomeNode]]:
    """Groups for ``number`` new replicas, taking nodes from the replicas when the spares do not do (see module
    docstring); ``usage`` counts the moves and the new replicas."""
    spares = spares_of(env, collection_id)
    trial = _copy(usage)
    try:
        groups = new_replica_groups(env, collection_id, number, trial, spares)
    except (TooFewNodes, NoRoomForReplicas):
        pass
    else:
        usage.memory.update(trial.memory)
        usage.channels.update(trial.channels)
        return groups, []
    moved = _copy(usage)
    picker = DonorPicker(env, collection_id, moved)
    share = max(1, (picker.eligible_count() + len(spares)) // target)
    pool = list(spares)
    while len(pool) < number * share and (move := picker.take(keep_more_than=share)) is not None:
        pool.append(move.node_id)
    while True:
        trial = _copy(moved)
        try:
            groups = new_replica_groups(env, collection_id, number, trial, pool)
            break
        except (TooFewNodes, NoRoomForReplicas) as exc:
            move = picker.take()
            if move is None:
                raise _refusal(exc, collection_id, number, spares, picker) from None
            pool.append(move.node_id)
    usage.memory.clear()
    usage.memory.update(trial.memory)
    usage.channels.clear()
    usage.channels.update(trial.channels)
    return groups, picker.taken


def _refusal(exc: CoordError, collection_id: int, number: int, spares: list[int],
             picker: DonorPicker) -> CoordError:
    """Why a grow cannot fit even with nodes taken from the replicas: what is missing."""
    taken = [m.node_id for m in picker.taken]
    if isinstance(exc, TooFewNodes):
        have = len(spares) + len(taken)
        return TooFewNodes(
            f"collection {collection_id} needs {_count(number, 'query node')} for {_count(number, 'new replica')} "
            f"(each on its own nodes): {len(spares)} spare online and {len(taken)} its replicas can spare "
            f"(each keeps a node and room for what it holds); start {_count(max(1, number - have), 'more query node')} "
            "or ask for fewer replicas")
    extra = f" (with nodes {taken} taken from its replicas)" if taken else ""
    return NoRoomForReplicas(f"{exc}{extra}")


def plan_resize(env: TaskEnv, info: data_pb2.CollectionLoadInfo, target: int,
                usage: Usage | None = None, *, rehome: bool = True) -> ResizePlan:
    """The plan to bring the loaded collection ``info`` to ``target`` replicas (see module docstring). Replicas a
    grow is still adding count as replicas of a grow to ``target`` (a re-run); those past ``target`` are dropped.
    ``rehome`` False: spares only (a grow whose nodes were already taken from the replicas).
    """
    cid = info.collection_id
    counted = serving_replica_ids(info)
    joining = joining_replica_ids(info)
    if target < len(counted):
        keep = keep_order(env, cid, counted)[:target]
        dropped = [r for r in counted if r not in keep] + joining
        return ResizePlan(cid, target, sorted(dropped), [])
    extra = joining[target - len(counted):]
    wanted = target - len(counted) - (len(joining) - len(extra))
    if wanted <= 0:
        return ResizePlan(cid, target, extra, [])
    usage = usage or usage_of(env)
    if not rehome or joining:
        return ResizePlan(cid, target, extra, new_replica_groups(env, cid, wanted, usage))
    groups, rehomes = _groups_with_rehomes(env, cid, wanted, target, usage)
    return ResizePlan(cid, target, extra, groups, rehomes)
