"""A leader's long stretches of work over many segments give its event loop turns: a load's placement and a drain's
reads of the drained node's copies run in steps, and other coroutines run between the steps.

Real etcd, a real coordinator and real in-process query nodes on this test's event loop. No timing is asserted:
a watcher coroutine (it runs only when the loop gets a turn) looks at the loop's other tasks at each turn (the
chain of coroutines each awaits) and records which of the stepped computations it found suspended mid-way; that
the work was then done is checked on the nodes themselves (what they report holding).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.cluster.allocator import STEP_SEGMENTS
from tests.cluster import QueryCluster, drain, fast_scheduler, wait_until

SEGMENTS = 2 * STEP_SEGMENTS + 4_000  # several placement steps; a drained node holds many read chunks
STEPPED = ("run_steps_with_turns", "read_segment_sizes_on_node")


def awaiting(coro: object) -> set[str]:
    """The names of the coroutines (and generators) a suspended task's coroutine awaits, down the chain."""
    names: set[str] = set()
    for _ in range(60):
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if code is None:
            break
        names.add(code.co_name)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return names


async def watch_turns(seen: Counter[str]) -> None:
    """At every turn of the loop, count the stepped computations some other task is suspended in."""
    me = asyncio.current_task()
    while True:
        await asyncio.sleep(0)
        for task in asyncio.all_tasks():
            if task is me or task.done():
                continue
            names = awaiting(task.get_coro())
            for name in STEPPED:
                if name in names:
                    seen[name] += 1


async def test_a_large_load_and_a_drain_of_its_node_let_other_coroutines_run_between_steps(
        etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path, scheduler=fast_scheduler(trigger_timeout=300.0), session_ttl=10.0) as c:
        await c.start_coordinator()
        leader = await c.wait_leader()
        cid = await c.create_collection("big", partitions=2, segments=SEGMENTS)
        for _ in range(2):
            node = await c.add_node(capacity=1 << 42, ttl=10.0)
            await c.wait_node_online(node.node_id)
        seen: Counter[str] = Counter()
        watcher = asyncio.create_task(watch_turns(seen))
        try:
            await c.load_collection(cid, timeout=240)
            placed_in_steps = seen["run_steps_with_turns"]
            assert placed_in_steps >= 2, "the load's admission and placement ran with turns between steps"
            assert sum(len(n.state.segments) for n in c.nodes) == SEGMENTS, "the nodes hold every segment once"

            victim = max(c.nodes, key=lambda n: len(n.state.segments))
            survivor = next(n for n in c.nodes if n is not victim)
            lead = leader.coord.leadership
            assert lead is not None and lead.lifecycles is not None
            await drain(c, victim.node_id)
            await wait_until(lambda: lead.lifecycles is not None
                             and lead.lifecycles.state(victim.node_id) == qc.NODE_LIFECYCLE_DRAINED,
                             "the drain ends", timeout=240)
            assert seen["read_segment_sizes_on_node"] >= 2, "the drain read the node's copies with turns between chunks"
            assert not victim.state.segments, "the drained node holds nothing (its own report)"
            assert len(survivor.state.segments) == SEGMENTS, "the other node holds every segment (its own report)"
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
