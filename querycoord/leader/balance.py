"""Auto balance: move segments from the fullest to the emptiest node.

Every ``interval`` the leader compares memory rates (query meta's segment
sizes over each online node's capacity). When the highest rate exceeds the
memory limit (90 %) or the spread between highest and lowest exceeds
``spread`` (30 %), it queues one LoadBalance (reason AUTO) moving just
enough segments, largest first, to bring the two nodes closest together.
Nothing is queued while another balance is pending, so balances never pile up. Cordoned, draining and
drained nodes (``cluster.lifecycle``) take no part. A copy moved onto a spare makes the spare join the copy's
replica; the balancer does that only for a replica with no more nodes than the collection's others
(``spare_may_join``), so spares even the replicas out rather than pile into one and leave another with a
single node (whose drain would then need a node from another replica: ``task.rehome``).

While balance is paused (``querycoord balance pause``: the ``balance`` check kind off,
``checkers.activation``) a round queues nothing. A balance already queued or running when the pause
comes is let finish: it is one bounded move, loading each segment on its destination before releasing
it from its source, so it never leaves a segment unserved, and cancelling it half-way would only roll
back loads already done. Repairs of lost copies are the checker's, not the balancer's, and run paused
or not; so do a user's LoadBalance calls (as Milvus runs manual transfers while its balance checker is
suspended): an operator who asks for a move while balance is paused wants that move.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from loguru import logger

from meta.loops import loop_failed
from proto import querycoord_pb2 as qc
from querycoord.checkers.activation import CheckerSwitches
from querycoord.querymeta import QueryMeta
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import LoadBalanceTask


def plan_move(rates: dict[int, tuple[int, int]], sizes: dict[int, list[tuple[int, int]]], *,
              spread: float, memory_limit: float,
              movable: Callable[[int, int, int], bool] | None = None) -> tuple[int, int, list[int]] | None:
    """(source, destination, segment ids) that narrows the gap, or None when balanced.

    ``rates``: node -> (used bytes, capacity); ``sizes``: node -> [(segment id, bytes)]; ``movable(src, segment,
    dst)``: whether that copy may go there (replicas: only within the copy's replica).
    """
    ends = move_ends(rates, spread=spread, memory_limit=memory_limit)
    if ends is None:
        return None
    src, dst = ends
    used_src, cap_src = rates[src]
    used_dst, cap_dst = rates[dst]
    moved: list[int] = []
    for seg, size in sorted(sizes.get(src, []), key=lambda x: -x[1]):
        if movable is not None and not movable(src, seg, dst):
            continue
        new_src, new_dst = (used_src - size) / cap_src, (used_dst + size) / cap_dst
        if new_dst >= memory_limit or new_dst > new_src:
            continue
        moved.append(seg)
        used_src, used_dst = used_src - size, used_dst + size
        if (used_src / cap_src) - (used_dst / cap_dst) <= spread / 2:
            break
    return (src, dst, moved) if moved else None


def move_ends(rates: dict[int, tuple[int, int]], *, spread: float,
              memory_limit: float) -> tuple[int, int] | None:
    """(source, destination) of the move ``plan_move`` would weigh: the fullest and the emptiest node by rate,
    or None when they are balanced. Only the source's copies are then weighed, so only its are read."""
    if len(rates) < 2:
        return None
    rate = {n: used / cap for n, (used, cap) in rates.items() if cap > 0}
    if not rate:
        return None
    src = max(rate, key=lambda n: (rate[n], n))
    dst = min(rate, key=lambda n: (rate[n], -n))
    if src == dst or not (rate[src] > memory_limit or rate[src] - rate[dst] > spread):
        return None
    return src, dst


def may_serve(meta: QueryMeta, collection_id: int, replica_id: int, node_id: int) -> bool:
    """Whether ``node_id`` may hold a copy of ``replica_id``: a node of that replica, or a spare (in no replica
    of the collection, it joins); replica 0 (loaded before replicas) any node."""
    if not replica_id:
        return True
    owner = meta.replica_of_node(collection_id, node_id)
    return owner in (0, replica_id)


def spare_may_join(meta: QueryMeta, collection_id: int, replica_id: int) -> bool:
    """Whether the auto balancer may give ``replica_id`` a spare node (moving a copy onto a spare makes it join
    the copy's replica): only a replica with no more nodes than any other of the collection, so spares even the
    replicas out instead of piling into the one on the fullest node and leaving another with a single node."""
    if not replica_id:
        return True
    sizes = {r: len(meta.replica_nodes(collection_id, r)) for r in meta.replica_ids(collection_id)}
    return sizes.get(replica_id, 0) <= min(sizes.values(), default=0)


async def auto_balance_loop(scheduler: Scheduler, interval: float, spread: float,
                            switches: CheckerSwitches | None = None) -> None:
    """Every ``interval``, one move if the spread calls for it and balance is not paused (``switches``); an
    error is logged and the loop goes on."""
    while not scheduler.stopped:
        await asyncio.sleep(interval)
        try:
            await auto_balance_once(scheduler, spread, switches)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if loop_failed("auto balance", exc, scheduler.env.store.kv.client):
                return


async def auto_balance_once(scheduler: Scheduler, spread: float, switches: CheckerSwitches | None = None) -> None:
    """One round: queue one move, or nothing (balanced, a balance pending, or balance paused)."""
    env = scheduler.env
    if switches is not None:
        switches.balance_rounds += 1
        if switches.balance_paused:
            return
    if any(t.KIND == qc.TASK_KIND_LOAD_BALANCE for t in scheduler.triggers.values()):
        return
    # A cordoned node neither takes copies nor gives them here: a draining one is emptied by the checker's drain.
    # Nor does one not heard since the takeover (``NodeManager.ineligible_ids``).
    ineligible = env.nodes.ineligible_ids()
    online = [n for n in env.nodes.online() if n.node_id not in ineligible]
    rates = {n.node_id: (env.meta.node_memory_usage(n.node_id), n.capacity) for n in online}
    ends = move_ends(rates, spread=spread, memory_limit=env.config.memory_limit)
    if ends is None:
        return
    # Only the source's copies are weighed (``plan_move``): only its are read, with turns of the event loop
    # (views of every copy of every node held the loop for seconds at a million segments, every round).
    src = ends[0]
    views = await env.meta.read_segments_on_node(src)
    sizes = {src: [(s.segment_id, s.mem_size) for s in views]}
    replica_of_copy = {(src, s.segment_id): (s.collection_id, s.replica_id) for s in views}
    del views
    if (switches is not None and switches.balance_paused) or any(
            t.KIND == qc.TASK_KIND_LOAD_BALANCE for t in scheduler.triggers.values()):
        return  # paused, or a balance queued, during the read's turns

    def movable(src: int, seg: int, dst: int) -> bool:
        cid, replica = replica_of_copy[(src, seg)]
        if not may_serve(env.meta, cid, replica, dst):
            return False
        return env.meta.replica_of_node(cid, dst) != 0 or spare_may_join(env.meta, cid, replica)

    move = plan_move(rates, sizes, spread=spread, memory_limit=env.config.memory_limit, movable=movable)
    if move is None:
        return
    src, dst, segs = move
    req = qc.LoadBalanceRequest(source_node_ids=[src], dst_node_ids=[dst], sealed_segment_ids=segs,
                                reason=qc.BALANCE_REASON_AUTO)
    task = LoadBalanceTask.new(env, req, trigger_condition=qc.TRIGGER_CONDITION_LOAD_BALANCE)
    await scheduler.enqueue(task)
    logger.info("auto balance: moving {} segments from node {} to node {} (task {})", len(segs), src, dst,
                task.id)
