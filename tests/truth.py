"""What the nodes themselves hold, against what the leader shows: the "false full" check.

A sample is false when the leader shows a collection at 100 %, or a replica at 100 %, while some segment of
the catalog's target or some DM channel of the collection is held by no online node of (each, or that)
replica, as the in-process nodes' own state says.

``false_full`` counts the healthy in-process nodes as the online ones. ``InProcessSources`` feeds the chaos
drill's sampler (``querycoord.tooling.drill.sampler``) from an in-process cluster instead (the leader's answers,
asked of the leader itself): online is what etcd's
sessions say (a node's lost session counts for a second more, the time the leader may take to see it), and a
node whose session is registered but that the test no longer runs (crashed, its lease not lapsed) holds what
nobody can know, so its replicas are not judged (``samples.false_full``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc

from meta.errors import MetaError
from proto import querycoord_pb2 as qc
from proto import querycoord_pb2_grpc
from querycoord.catalog.store import CatalogError, CatalogStore
from querycoord.nodes.querynode import QueryNode
from querycoord.security.grpc_channels import make_channel
from querycoord.task.history import TaskHistory
from querycoord.tooling.drill.invariants import node_view
from querycoord.tooling.drill.placement import Room
from querycoord.tooling.drill.sampler import Catalog, Reports, registered_sessions
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


class InProcessSources:
    """``sampler.Sources`` of an in-process cluster (module docstring): sessions from etcd, the nodes' own state
    (``nodes``: the ones the test runs, by default ``c.nodes``), the catalog as stored, the leader through the
    cluster's client."""

    def __init__(self, c: QueryCluster, cids: Iterable[int], nodes: Callable[[], Iterable[QueryNode]] | None = None):
        self.c = c
        self.cids = list(cids)
        self.nodes = nodes or (lambda: list(c.nodes))
        self._channels: dict[str, grpc.aio.Channel] = {}

    def leader(self) -> str | None:
        leaders = [x.address for x in self.c.coords if x.coord.is_leader]
        return leaders[0] if len(leaders) == 1 else None

    async def sessions(self) -> dict[int, int]:
        assert self.c.kv is not None
        return await registered_sessions(self.c.kv)

    async def reports(self) -> Reports:
        out: Reports = {}
        for n in self.nodes():
            if n.state.node_id:
                d = n.state.distribution()
                out[n.node_id] = (node_view(d), Room(d.memory_used, d.memory_capacity))
        return out

    async def catalog(self) -> Catalog:
        assert self.c.kv is not None
        cat = CatalogStore(self.c.kv)
        out: Catalog = {}
        for cid in self.cids:
            try:
                desc = await cat.describe_collection(cid)
                segs: dict[int, tuple[int, int]] = {}
                for p in desc.partitions:
                    _, binlogs = await cat.get_recovery_info(cid, p.partition_id)
                    segs.update({b.segment_id: (p.partition_id, b.mem_size) for b in binlogs})
            except (CatalogError, MetaError):
                continue
            out[cid] = (segs, frozenset(desc.dm_channels))
        return out

    async def ask(self, method: str, request: Any) -> Any:
        """The leader's own answer (a standby answers reads from etcd's persisted percentages: not what is
        judged here); None when no coordinator leads or it did not answer SUCCESS."""
        address = self.leader()
        if address is None:
            return None
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = make_channel(address)
        try:
            r = await getattr(querycoord_pb2_grpc.QueryCoordStub(ch), method)(request, timeout=5.0)
        except grpc.aio.AioRpcError:
            return None
        return r if r.status.error_code == 0 else None

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()


async def failed_triggers(c: QueryCluster) -> list[str]:
    """The failed triggers in the task history, with their errors: what a test of repairs wants empty."""
    assert c.kv is not None
    page = await TaskHistory(c.kv).page(after=0, newest_first=False, want=1000)
    return [f"{t.trigger.task_id} {t.trigger.summary}: {t.trigger.error}" for t in page
            if t.trigger.state == qc.TASK_STATE_FAILED]
