"""What the nodes themselves hold, against what the leader shows: the "false full" check of issue 24.

A sample is false when the leader shows a collection at 100 %, or a replica at 100 %, while some segment of
the catalog's target or some DM channel of the collection is held by no online node of (each, or that)
replica, as the in-process nodes' own state says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from tests.cluster import QueryCluster


async def target_of(c: QueryCluster, cid: int) -> tuple[set[int], set[str]]:
    """The catalog's sealed segments of every partition and the collection's DM channels."""
    assert c.kv is not None
    cat = CatalogStore(c.kv)
    segments: set[int] = set()
    for p in await cat.show_partitions(cid):
        _, binlogs = await cat.get_recovery_info(cid, p.partition_id)
        segments |= {b.segment_id for b in binlogs}
    desc = await cat.describe_collection(cid)
    return segments, set(desc.dm_channels)


def held_by(c: QueryCluster, node_ids: set[int]) -> tuple[set[int], set[str]]:
    """Segments and DM channels the healthy in-process nodes among ``node_ids`` hold, by their own state."""
    segs: set[int] = set()
    chans: set[str] = set()
    for n in c.nodes:
        if n.healthy and n.node_id in node_ids:
            segs |= set(n.state.segments)
            chans |= {name for name in n.state.dm_channels}
    return segs, chans


async def false_full(c: QueryCluster, cid: int, target: tuple[set[int], set[str]]) -> str | None:
    """A description of what the leader shows as whole but the nodes do not hold; None when it is true."""
    assert c.client is not None
    show = await c.client.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[cid]))
    reps = await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
    if show.status.error_code or reps.status.error_code:
        return None
    # Read the nodes after the answers: what they hold now is what they held when the answers were made, or more.
    lacking: dict[int, tuple[int, int]] = {}
    for r in reps.replicas:
        segs, chans = held_by(c, set(r.node_ids))
        missing = (len(target[0] - segs), len(target[1] - chans))
        if any(missing):
            lacking[r.replica_id] = missing
            if r.in_memory_percentage == 100:
                return f"replica {r.replica_id} shown at 100 % lacks {missing[0]} segments, {missing[1]} channels"
    if show.collections[0].in_memory_percentage == 100 and lacking:
        return f"collection {cid} shown at 100 % while replicas lack (segments, channels): {lacking}"
    return None


async def until_true(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 60.0,
                     every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(every)
