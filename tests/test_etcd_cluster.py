"""A real 3-member etcd cluster: the meta layer rides out a leader crash, and says so when quorum is lost.

Attempts are counted by wrapping the client's single retry policy
(``EtcdClient.call``), so "how many writes needed a second attempt" is
measured without timing anything. Time bounds here only prove termination.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from etcd3aio.kv import prefix_range_end

from meta.client import EtcdClient
from meta.config import EtcdConfig
from meta.errors import MetaUnavailable
from meta.etcd_pb import RangeRequest
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster

T = TypeVar("T")
GENEROUS = 60.0


class CountingClient(EtcdClient):
    """An ``EtcdClient`` that records how many attempts each operation took."""

    def __init__(self, config: EtcdConfig):
        super().__init__(config)
        self.attempts: dict[str, int] = {}

    async def call(self, operation: str, fn: Callable[[float], Awaitable[T]], **kwargs: object) -> T:
        count = 0

        async def counted(timeout: float) -> T:
            nonlocal count
            count += 1
            return await fn(timeout)

        try:
            return await super().call(operation, counted, **kwargs)  # type: ignore[arg-type]
        finally:
            self.attempts[operation] = count


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    with EtcdCluster(tmp_path / "etcd", size=3, stop_timeout=5.0) as c:
        yield c


def wait_leader(cluster: EtcdCluster) -> int:
    """The raft leader's index, polled: the metrics endpoint may be slow to answer on a loaded machine."""
    deadline = time.monotonic() + GENEROUS
    while (leader := cluster.leader_index()) is None:
        assert time.monotonic() < deadline, "no raft leader"
        time.sleep(0.1)
    return leader


async def local_count(endpoint: str, prefix: bytes) -> int:
    """Keys under ``prefix`` in one member's own store (a serializable read is not sent to the leader)."""
    async with EtcdClient(EtcdConfig(endpoints=(endpoint,), call_timeout=2.0, deadline=5.0)) as client:
        req = RangeRequest(key=prefix, range_end=prefix_range_end(prefix), count_only=True, serializable=True)
        resp = await client.call("local count", lambda t: client.kv.Range(req, timeout=t))
        return resp.count


async def test_writes_go_on_when_the_leader_is_killed(cluster: EtcdCluster) -> None:
    """SIGKILL the raft leader mid-stream: every write completes, at the cost of a retry for a few.

    With call_timeout 1 s, a write caught by the crash fails one attempt (the
    connection to the dead member breaks, or the survivors are still electing
    a leader) and the next attempt goes through. Then the killed member
    restarts on the same ports and data dir and catches up: its own store
    (read serializably, without the leader) holds every key.
    """
    n_writes, kill_at = 400, 50
    client = CountingClient(cluster.config(call_timeout=1.0, deadline=10.0))
    await client.connect()
    kv = MetaKV(client, "failover")
    leader = wait_leader(cluster)
    reached_kill_point = asyncio.Event()

    async def writer() -> None:
        for i in range(n_writes):
            if i == kill_at:
                reached_kill_point.set()
                await asyncio.sleep(0)  # let the test kill the leader now, between two writes
            await kv.save(f"w/{i:05d}", str(i))

    try:
        task = asyncio.create_task(writer())
        await reached_kill_point.wait()
        cluster.kill_member(leader)
        await asyncio.wait_for(task, GENEROUS)  # raises whatever the writer raised

        retried = {op: n for op, n in client.attempts.items() if op.startswith("save ") and n > 1}
        # Writes go one at a time, so only those sent while the cluster elected a new leader retried; how many
        # attempts each took depends on how long the election took (on a loaded machine, over 3 s: 4 attempts).
        assert len(retried) <= 5, f"too many writes needed a retry: {retried}"
        snap = await kv.load_prefix("w/")
        assert snap.as_dict() == {f"w/{i:05d}": str(i).encode() for i in range(n_writes)}

        assert wait_leader(cluster) != leader

        cluster.restart_member(leader)
        assert cluster.members[leader].healthy()
        prefix = kv.abs_prefix("w/")
        for _ in range(int(GENEROUS / 0.2)):
            if await local_count(cluster.members[leader].endpoint, prefix) == n_writes:
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail("the restarted member never caught up")
        cluster.wait_healthy()
        await kv.save("after-restart", "ok")
        assert await kv.get("after-restart") == b"ok"
    finally:
        await client.close()


async def test_majority_down_raises_meta_unavailable_then_recovers(cluster: EtcdCluster) -> None:
    """With 2 of 3 members dead a write cannot commit: ``MetaUnavailable`` names the endpoints, no hang.

    After the members restart, the same client writes again.
    """
    deadline = 2.0
    client = await EtcdClient(cluster.config(call_timeout=0.5, deadline=deadline)).connect()
    kv = MetaKV(client, "quorum")
    try:
        await kv.save("before", "1")
        leader = wait_leader(cluster)
        victims = [leader, (leader + 1) % 3]  # the survivor is a follower with no one to follow
        for i in victims:
            cluster.kill_member(i)

        for op in (lambda: kv.save("during", "x"), lambda: kv.get("before")):
            with pytest.raises(MetaUnavailable) as e:
                await asyncio.wait_for(op(), GENEROUS)
            message = str(e.value)
            for endpoint in cluster.endpoints:
                assert endpoint in message
            assert e.value.elapsed < GENEROUS

        for i in victims:
            cluster.restart_member(i)
        cluster.wait_healthy()
        await kv.save("after", "2")
        assert await kv.get("before") == b"1"
        assert await kv.get("after") == b"2"
    finally:
        await client.close()
