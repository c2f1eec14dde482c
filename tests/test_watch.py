"""watch_prefix against real etcd: no event lost or repeated across restarts, member loss and compaction."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from meta.client import connect
from meta.config import EtcdConfig
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.watch import EventType, Resync, WatchBatch, WatchEvent, watch_prefix


async def collect(kv: MetaKV, prefix: str, start: int, until_key: str, sink: list) -> None:
    """Append every item until ``until_key`` shows up (in an event or a resync snapshot)."""
    async for item in watch_prefix(kv, prefix, start):
        sink.append(item)
        if isinstance(item, WatchBatch) and any(e.key == until_key for e in item.events):
            return
        if isinstance(item, Resync) and until_key in item.snapshot.as_dict():
            return


def events_of(items: list) -> list[WatchEvent]:
    return [e for it in items if isinstance(it, WatchBatch) for e in it.events]


def apply_events(state: dict[str, bytes], events: Iterable[WatchEvent]) -> None:
    """What a watcher that mirrors the keys does with a batch."""
    for e in events:
        if e.type is EventType.PUT:
            state[e.key] = e.value
        else:
            state.pop(e.key, None)


@dataclass
class Watched:
    """A client's keys under a root and a watch of its ``k/`` keys that collects ``items`` until ``k/end``."""

    kv: MetaKV
    start: int
    items: list
    watcher: asyncio.Task[None]


@contextlib.asynccontextmanager
async def watched(config: EtcdConfig, root: str) -> AsyncIterator[Watched]:
    """A watch of ``k/`` under ``root`` from the next revision on, on a client of its own (closed on exit)."""
    client = await connect(config)
    try:
        kv = MetaKV(client, root)
        start = await kv.revision() + 1
        items: list = []
        yield Watched(kv, start, items, asyncio.create_task(collect(kv, "k/", start, "k/end", items)))
    finally:
        await client.close()


async def assert_none_lost(config: EtcdConfig, root: str, n: int, disrupt: Callable[[int], Awaitable[None]]) -> None:
    """Write ``n`` keys, ``disrupt(i)`` after the i-th: the watch saw every revision exactly once."""
    async with watched(config, root) as w:
        keys = [f"k/{i:04d}" for i in range(n)]
        for i, key in enumerate(keys):
            await w.kv.save(key, str(i))
            await disrupt(i)
        last = await w.kv.save("k/end", "")
        await asyncio.wait_for(w.watcher, 60)
        assert_exact(events_of(w.items), w.start, last, keys)


async def test_events_in_order_with_relative_keys(kv: MetaKV) -> None:
    start = await kv.revision() + 1
    items: list = []
    watcher = asyncio.create_task(collect(kv, "w/", start, "w/end", items))
    await kv.save("w/a", "1")
    await kv.save("other/x", "not watched")
    await kv.multi_save({"w/b": "2", "w/c": "3"})
    await kv.remove("w/a")
    await kv.save("w/end", "")
    await asyncio.wait_for(watcher, 30)
    evs = events_of(items)
    assert [(e.type, e.key, e.value) for e in evs] == [
        (EventType.PUT, "w/a", b"1"),
        (EventType.PUT, "w/b", b"2"),
        (EventType.PUT, "w/c", b"3"),
        (EventType.DELETE, "w/a", b""),
        (EventType.PUT, "w/end", b""),
    ]
    assert evs[1].mod_revision == evs[2].mod_revision, "one txn is one revision"


async def test_start_revision_replays_history(kv: MetaKV) -> None:
    first = await kv.save("h/1", "a")
    await kv.save("h/2", "b")
    items: list = []
    await asyncio.wait_for(collect(kv, "h/", first, "h/2", items), 30)
    assert [e.key for e in events_of(items)] == ["h/1", "h/2"]


@pytest.fixture
def own_etcd(tmp_path: Path):
    """A member of our own, so that restarting it disturbs no other test."""
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        yield cluster


def assert_exact(evs: list[WatchEvent], first_rev: int, last_rev: int, keys: list[str]) -> None:
    """Only our writer writes to this cluster, so every revision up to the end marker is exactly one event.

    The range ends at the end marker's first event, not at the revision the writer's ``save`` returned:
    when a member dies, a save whose answer was lost is retried and may commit twice (the writer then
    sees the second revision, the watcher stops at the first). Both are still one event per revision.
    """
    marker = evs[-1].key
    end = next(i for i, e in enumerate(evs) if e.key == marker)
    revs = [e.mod_revision for e in evs[:end + 1]]
    assert revs[-1] <= last_rev
    assert revs == list(range(first_rev, revs[-1] + 1)), "an event was lost or repeated"
    assert set(keys) <= {e.key for e in evs}


async def test_no_event_lost_or_repeated_across_etcd_restart(own_etcd: EtcdCluster) -> None:
    async def restart(i: int) -> None:
        if i == 100:
            own_etcd.kill_member(0)  # SIGKILL: the stream breaks mid-flight
            await asyncio.sleep(0.5)
            await asyncio.to_thread(own_etcd.restart_member, 0)
        if i == 200:
            own_etcd.stop_member(0)  # graceful stop this time
            await asyncio.to_thread(own_etcd.restart_member, 0)

    await assert_none_lost(own_etcd.config(call_timeout=1.0, deadline=30.0), "restart", 300, restart)


async def test_compacted_revision_yields_resync_then_events(kv: MetaKV, client) -> None:
    old = await kv.save("c/1", "a")
    await kv.save("c/2", "b")
    await kv.remove("c/1")
    now = await kv.save("c/3", "c")
    await client.raw.kv.compact(now, physical=True)
    state: dict[str, bytes] = {}
    seen_resync = False
    async for item in watch_prefix(kv, "c/", old):
        if isinstance(item, Resync):
            seen_resync = True
            assert item.revision >= now
            state = item.snapshot.as_dict()
            await kv.save("c/4", "d")
            await kv.remove("c/2")
            await kv.save("c/end", "")
            continue
        apply_events(state, item.events)
        if "c/end" in state:
            break
    assert seen_resync
    assert state == (await kv.load_prefix("c/")).as_dict() == {"c/3": b"c", "c/4": b"d", "c/end": b""}


async def test_compaction_while_disconnected_resyncs(own_etcd: EtcdCluster) -> None:
    """The watch is down while its resume revision is compacted away: it must resync, not stall."""
    async with watched(own_etcd.config(call_timeout=1.0, deadline=30.0), "compact") as w:
        await w.kv.save("k/0", "")
        while not events_of(w.items):
            await asyncio.sleep(0.05)
        own_etcd.kill_member(0)
        await asyncio.to_thread(own_etcd.restart_member, 0)
        # Write and compact before the watch reconnects (it backs off at least 50 ms).
        other = await connect(own_etcd.config())
        try:
            okv = MetaKV(other, "compact")
            for i in range(1, 50):
                await okv.save(f"k/{i}", "")
            rev = await okv.remove("k/0")
            await other.raw.kv.compact(rev, physical=True)
            await okv.save("k/end", "")
        finally:
            await other.close()
        await asyncio.wait_for(w.watcher, 60)
        final: dict[str, bytes] = {}
        for it in w.items:
            if isinstance(it, Resync):
                final = it.snapshot.as_dict()
            else:
                apply_events(final, it.events)
        assert final == (await w.kv.load_prefix("k/")).as_dict()
        assert "k/0" not in final and len(final) == 50


async def test_no_event_lost_when_members_of_a_cluster_die(tmp_path: Path) -> None:
    """3 members; each in turn is SIGKILLed and restarted while we write and watch."""
    with EtcdCluster(tmp_path / "etcd3", size=3) as cluster:
        async def kill_in_turn(i: int) -> None:
            if i in (60, 120, 180):
                victim = i // 60 - 1
                cluster.kill_member(victim)
                await asyncio.sleep(0.3)
                await asyncio.to_thread(cluster.restart_member, victim)

        config = EtcdConfig(endpoints=tuple(cluster.endpoints), call_timeout=1.0, deadline=30.0)
        await assert_none_lost(config, "members", 240, kill_in_turn)
