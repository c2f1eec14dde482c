"""Election against real etcd, in-process and across real processes killed with real signals."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest

from meta.election import Election, current_leader, election_prefix
from meta.errors import NotLeader
from meta.kv import MetaKV
from meta.ops.child import ChildProcess
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from meta.watch import EventType, WatchBatch, watch_prefix
from querycoord.tooling.campaign import EXIT_NOT_LEADER, spawn_candidate


async def start_candidates(kv: MetaKV, n: int, ttl: float = 2) -> list[tuple[Session, Election]]:
    out = []
    for i in range(n):
        s = Session(kv, "candidate", f"c{i}", ttl=ttl)
        await s.start()
        out.append((s, Election(kv, s, "e")))
    return out


async def queue_up(kv: MetaKV, election: Election, value: str) -> asyncio.Task:
    """Start a campaign and return once its key is in the queue (so queue order is known)."""
    before = await kv.count_prefix(election.prefix)
    task = asyncio.create_task(election.campaign(value))
    while await kv.count_prefix(election.prefix) == before:
        await asyncio.sleep(0.01)
    return task


async def test_lowest_create_revision_leads_and_resign_hands_over(kv: MetaKV) -> None:
    cands = await start_candidates(kv, 3)
    first = await cands[0][1].campaign("c0")
    waiting = [await queue_up(kv, e, f"c{i + 1}") for i, (_, e) in enumerate(cands[1:])]
    await asyncio.sleep(0.5)
    assert not any(t.done() for t in waiting), "only one leader at a time"
    leader = await current_leader(kv, election_prefix("e"))
    assert leader is not None and leader.value == b"c0" and leader.create_revision == first.revision
    await kv.fenced(first).save("state", "by c0")
    await cands[0][1].resign()
    second = await asyncio.wait_for(waiting[0], 10)
    assert not waiting[1].done(), "the third candidate waits for the second, not for the first"
    assert second.revision > first.revision
    with pytest.raises(NotLeader):
        await kv.fenced(first).save("state", "stale c0")
    await kv.fenced(second).save("state", "by c1")
    await cands[1][1].resign()
    await asyncio.wait_for(waiting[1], 10)
    assert (await current_leader(kv, election_prefix("e"))).value == b"c2"  # type: ignore[union-attr]
    for s, _ in cands:
        await s.close()


async def test_observe_follows_leader_changes(kv: MetaKV) -> None:
    cands = await start_candidates(kv, 2)
    seen: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def watch() -> None:
        async for leader in cands[0][1].observe():
            await seen.put(leader.value if leader else None)

    task = asyncio.create_task(watch())
    assert await asyncio.wait_for(seen.get(), 10) is None
    await cands[0][1].campaign("c0")
    assert await asyncio.wait_for(seen.get(), 10) == b"c0"
    second = await queue_up(kv, cands[1][1], "c1")
    await cands[0][1].proclaim("c0-renamed")
    assert await asyncio.wait_for(seen.get(), 10) == b"c0-renamed"
    await cands[0][1].resign()
    await second
    assert await asyncio.wait_for(seen.get(), 10) == b"c1"
    task.cancel()
    for s, _ in cands:
        await s.close()


async def test_cancelled_campaign_leaves_the_queue(kv: MetaKV) -> None:
    cands = await start_candidates(kv, 3)
    await cands[0][1].campaign("c0")
    middle = await queue_up(kv, cands[1][1], "c1")
    last = await queue_up(kv, cands[2][1], "c2")
    middle.cancel()
    with pytest.raises(asyncio.CancelledError):
        await middle
    await cands[0][1].resign()
    fence = await asyncio.wait_for(last, 10)
    assert (await current_leader(kv, election_prefix("e"))).create_revision == fence.revision  # type: ignore[union-attr]
    for s, _ in cands:
        await s.close()


async def test_lost_session_deposes_the_leader(kv: MetaKV) -> None:
    cands = await start_candidates(kv, 2)
    old = await cands[0][1].campaign("c0")
    nxt = asyncio.create_task(cands[1][1].campaign("c1"))
    await kv.client.raw.lease.revoke(cands[0][0].lease_id)  # as if its lease expired
    await asyncio.wait_for(cands[0][0].lost.wait(), 10)
    new = await asyncio.wait_for(nxt, 10)
    with pytest.raises(NotLeader):
        await kv.fenced(old).save("x", "stale")
    await kv.fenced(new).save("x", "fresh")
    for s, _ in cands:
        await s.close()


# ----- real processes -------------------------------------------------------------------------------


async def spawn_all(etcd: EtcdCluster, root: str, names: list[str], env: dict[str, str]) -> list[ChildProcess]:
    procs = []
    for name in names:
        p = await spawn_candidate(etcd.endpoints, root, name, ttl=2, env=env)
        await p.next_event("session")
        procs.append(p)
    return procs


async def leader_of(procs: list[ChildProcess]) -> tuple[ChildProcess, dict]:
    """Wait for the first 'leader' event among ``procs``."""
    tasks = {asyncio.create_task(p.next_event("leader")): p for p in procs}
    try:
        done, _ = await asyncio.wait(tasks, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert done, "nobody won the election within 30s"
        task = done.pop()
        return tasks[task], task.result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_standby_takes_over_after_sigkill_and_after_resign(
    etcd: EtcdCluster, subprocess_env: dict[str, str]
) -> None:
    root = f"test/election-procs-{uuid.uuid4().hex[:6]}"
    procs = await spawn_all(etcd, root, ["a", "b", "c"], subprocess_env)
    try:
        first, _ = await leader_of(procs)
        killed_at = time.time()
        first.send_signal(signal.SIGKILL)
        standbys = [p for p in procs if p is not first]
        second, ev = await leader_of(standbys)
        after_kill = ev["t"] - killed_at
        print(f"takeover after SIGKILL (TTL 2s): {after_kill:.2f}s")

        resign_at = time.time()
        second.send_signal(signal.SIGTERM)
        third, ev = await leader_of([p for p in standbys if p is not second])
        after_resign = ev["t"] - resign_at
        print(f"takeover after resign: {after_resign:.2f}s")
        assert await second.wait() == 0
        assert third.name not in (first.name, second.name)
    finally:
        for p in procs:
            await p.kill()


async def test_paused_leader_cannot_write_after_takeover(etcd: EtcdCluster, subprocess_env: dict[str, str]) -> None:
    """SIGSTOP the leader past its TTL, let the standby take over, SIGCONT: etcd refuses its writes."""
    root = f"test/election-stop-{uuid.uuid4().hex[:6]}"
    procs = await spawn_all(etcd, root, ["old", "new"], subprocess_env)
    try:
        old, old_lead = await leader_of(procs)
        new = procs[1] if old is procs[0] else procs[0]
        await old.next_event("write")
        old.send_signal(signal.SIGSTOP)
        _, new_lead = await leader_of([new])
        for _ in range(5):
            await new.next_event("write")
        old.send_signal(signal.SIGCONT)
        refused = await old.next_event("not_leader")
        assert await old.wait() == EXIT_NOT_LEADER
        assert "not leader" in refused["error"]

        # etcd's own history decides: find when the old leader key was deleted...
        from meta.client import connect

        client = await connect(etcd.config())
        kv = MetaKV(client, root)
        old_key = kv.rel_key(old_lead["key"].encode())
        deleted_at = None
        writes: list[tuple[int, bytes]] = []
        async for item in watch_prefix(kv, "", old_lead["revision"]):
            assert isinstance(item, WatchBatch)
            for e in item.events:
                if e.key == old_key and e.type is EventType.DELETE:
                    deleted_at = e.mod_revision
                if e.key == "campaign/owner":
                    writes.append((e.mod_revision, e.value))
            if item.revision >= await kv.revision():
                break
        await client.close()
        assert deleted_at is not None, "the old leader key was never deleted"
        assert new_lead["revision"] < deleted_at, "the standby queued (created its key) before the takeover"
        late = [v for rev, v in writes if rev > deleted_at]
        assert late, "the new leader wrote after the takeover"
        assert all(v.startswith(b"new:") for v in late), f"a write of the deposed leader landed: {late}"
        assert any(v.startswith(b"old:") for rev, v in writes if rev < deleted_at)
    finally:
        for p in procs:
            await p.kill()
