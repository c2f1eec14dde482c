"""Fencing proven with real processes: a paused leader's writes never land after a takeover."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from meta.election import ELECTION_PREFIX
from meta.ops.etcd_server import EtcdCluster
from meta.watch import EventType, WatchBatch, watch_prefix
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.net.client import QueryCoordClient
from querycoord.nodes.querynode import FaultConfig
from tests.cluster import QueryCluster, wait_in_memory
from tests.spawn import MID_LOAD_FLAGS, Spawned, spawn_coordinator


async def test_paused_leader_cannot_write_after_takeover_and_nodes_refuse_it(
    etcd: EtcdCluster, root_path: str, tmp_path: Path
) -> None:
    async with QueryCluster(etcd, root_path) as c:
        for _ in range(2):
            await c.add_node(faults=FaultConfig(latency_ms=200))
        old = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-old")
        new = None
        try:
            await old.next_event("leader", timeout=60)
            # a standby from the start
            new = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-new")
            catalog = CatalogStore(c.kv)
            first, _ = await catalog.create_bulk_collection("before", num_partitions=2, num_segments=200)
            client = QueryCoordClient([old.address, new.address], deadline=60, call_timeout=5)
            r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=first.collection_id))
            assert r.status.error_code == common_pb2.SUCCESS
            while not any(n.state.segments for n in c.nodes):  # the old leader is mid-load
                await asyncio.sleep(0.02)
            old_fence_seen = max(n.state.fence.leader_revision for n in c.nodes)

            old.signal(signal.SIGSTOP)  # past its TTL of 2 s: the standby takes over
            took_over = await new.next_event("leader", timeout=60)
            second, _ = await catalog.create_bulk_collection("after", num_partitions=1, num_segments=20)
            r = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=second.collection_id))
            assert r.status.error_code == common_pb2.SUCCESS, r
            old.signal(signal.SIGCONT)
            deposed = await old.next_event("standby", timeout=60)
            await asyncio.sleep(1.0)

            # etcd's history: when was the old leader key deleted?
            prev = deposed["previous"]
            key = c.kv.rel_key(prev["fence_key"].encode())
            deleted_at = None
            async for item in watch_prefix(c.kv, ELECTION_PREFIX, prev["fence_revision"]):
                assert isinstance(item, WatchBatch)
                for e in item.events:
                    if e.key == key and e.type is EventType.DELETE:
                        deleted_at = e.mod_revision
                if deleted_at is not None:
                    break
            assert deleted_at is not None
            print(f"old leader: {prev['writes']} writes accepted (last at revision {prev['last_write_revision']}), "
                  f"{prev['refused_writes']} refused; its key was deleted at revision {deleted_at}; "
                  f"new leader serving at t={took_over['t']:.3f}")
            assert prev["writes"] > 0, "the old leader did write while it led"
            assert prev["last_write_revision"] < deleted_at, "a write of the deposed leader landed after takeover"

            # Node-side fencing: the nodes now hold the new leader's revision, higher than the old one.
            assert all(n.state.fence.leader_revision > old_fence_seen for n in c.nodes)
            # Both loads complete under the new leader.
            for cid in (first.collection_id, second.collection_id):
                await wait_in_memory(client, cid, timeout=60)
            held = [set(n.state.segments) for n in c.nodes]
            assert sum(len(h) for h in held) == 220 == len(set().union(*held)), "no segment lost or doubled"
            await client.close()
        finally:
            await kill_all(old, new)


async def test_sigterm_resigns_so_a_standby_takes_over_at_once(
    etcd: EtcdCluster, root_path: str, tmp_path: Path
) -> None:
    first = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-first")
    second = None
    try:
        await first.next_event("leader", timeout=60)
        second = await spawn_coordinator(etcd, root_path, tmp_path, *MID_LOAD_FLAGS, name="coord-second")
        await asyncio.sleep(0.5)
        sent = time.time()
        first.signal(signal.SIGTERM)
        ev = await second.next_event("leader", timeout=60)
        print(f"takeover after SIGTERM (resign): {ev['t'] - sent:.2f}s (lease TTL 2s)")
        assert await first.wait(timeout=30) == 0
        assert ev["t"] - sent < 30, "the standby took over (bounded only to prove it happens)"
    finally:
        await kill_all(first, second)


async def kill_all(*children: Spawned | None) -> None:
    """SIGKILL (after SIGCONT, so a paused one dies too) whatever is still running."""
    for child in children:
        if child is not None:
            await child.kill()
