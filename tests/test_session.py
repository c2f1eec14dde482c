"""Sessions against real etcd: registration, watcher, and every way a session is lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from meta.client import connect
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session, SessionEvent, SessionInfo, SessionSnapshot, list_sessions, watch_sessions
from meta.watch import EventType


async def test_register_writes_json_under_lease_and_close_removes_it(kv: MetaKV) -> None:
    s = Session(kv, "querynode", "127.0.0.1:1234", ttl=2, extra={"capacity": 100})
    info = await s.start()
    stored = await kv.get_kv(info.key)
    assert stored is not None and stored.lease == s.lease_id
    assert SessionInfo.from_json(stored.value) == info
    assert info.key == f"session/querynode-{info.server_id}"
    other = Session(kv, "querynode", "127.0.0.1:1235", ttl=2)
    info2 = await other.start()
    assert info2.server_id > info.server_id, "ServerIDs come from one counter"
    snap = await list_sessions(kv, "querynode")
    assert set(snap.sessions) == {info.server_id, info2.server_id}
    await s.close()
    assert await kv.get(info.key) is None, "closing revokes the lease at once"
    assert s.lost.is_set()
    await other.close()


async def test_keepalive_keeps_the_session_past_its_ttl(kv: MetaKV) -> None:
    s = Session(kv, "coord", "a", ttl=2)
    info = await s.start()
    await asyncio.sleep(5)
    assert not s.lost.is_set()
    assert await kv.get(info.key) is not None
    await s.close()


def test_ttl_below_minimum_is_refused(kv: MetaKV) -> None:
    with pytest.raises(ValueError, match="at least 2s"):
        Session(kv, "coord", "a", ttl=1)
    with pytest.raises(ValueError, match="must match"):
        Session(kv, "query-node", "a", ttl=2)


async def test_lost_when_key_deleted(kv: MetaKV) -> None:
    s = Session(kv, "coord", "a", ttl=10)
    info = await s.start()
    await kv.remove(info.key)
    await asyncio.wait_for(s.lost.wait(), 10)
    assert s.lost_reason == "session key deleted"
    await s.close()


async def test_lost_when_lease_revoked_behind_its_back(kv: MetaKV) -> None:
    s = Session(kv, "coord", "a", ttl=2)
    await s.start()
    await kv.client.raw.lease.revoke(s.lease_id)
    await asyncio.wait_for(s.lost.wait(), 10)
    assert s.lost_reason in ("session key deleted", "etcd expired the lease")
    await s.close()


async def test_lost_when_etcd_unreachable_longer_than_ttl(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd") as cluster:
        client = await connect(cluster.config(call_timeout=0.5, deadline=2.0))
        kv = MetaKV(client, "lost")
        s = Session(kv, "coord", "a", ttl=2)
        await s.start()
        try:
            cluster.kill_member(0)
            await asyncio.wait_for(s.lost.wait(), 15)
            assert "no keepalive succeeded" in (s.lost_reason or "")
        finally:
            await s.close(revoke=False)
            await client.close()


async def test_session_watcher_lists_then_streams_adds_and_deletes(kv: MetaKV) -> None:
    a = Session(kv, "querynode", "n1", ttl=2)
    await a.start()
    items: list = []
    seen_delete = asyncio.Event()

    async def consume() -> None:
        async for item in watch_sessions(kv, "querynode"):
            items.append(item)
            if isinstance(item, SessionEvent) and item.type is EventType.DELETE:
                seen_delete.set()
                return

    task = asyncio.create_task(consume())
    while not items:
        await asyncio.sleep(0.01)
    b = Session(kv, "querynode", "n2", ttl=2)
    await b.start()
    other_role = Session(kv, "coord", "c", ttl=2)
    await other_role.start()
    await b.close()
    await asyncio.wait_for(seen_delete.wait(), 10)
    await task
    first = items[0]
    assert isinstance(first, SessionSnapshot)
    assert set(first.sessions) == {a.server_id}
    events = [(i.type, i.info.address) for i in items[1:]]
    assert events == [(EventType.PUT, "n2"), (EventType.DELETE, "n2")], "other roles must not show up"
    assert items[1].revision > first.revision
    await a.close()
    await other_role.close()


async def test_killed_holder_disappears_after_ttl(kv: MetaKV) -> None:
    """A session whose owner stops keeping it alive is deleted by etcd when the TTL runs out."""
    s = Session(kv, "querynode", "dying", ttl=2)
    info = await s.start()
    # Simulate a crashed owner: stop keepalive without revoking.
    await s.close(revoke=False)
    deadline = asyncio.get_running_loop().time() + 15
    while await kv.get(info.key) is not None:
        assert asyncio.get_running_loop().time() < deadline, "etcd never expired the lease"
        await asyncio.sleep(0.1)
