"""``meta.get_many`` against the embedded etcd (3.5.1): exactly the keys asked for, no write, answers over the
client's receive limit read in halves, and a cancelled read does not take etcd down (etcd-io/etcd#14110: etcd
before 3.5.5 panics when a read-only txn is cancelled; these txns are not read-only to it)."""

from __future__ import annotations

import asyncio

import pytest

from meta.client import EtcdClient
from meta.errors import NotLeader
from meta.get_many import NEVER_WRITTEN, get_many
from meta.kv import MetaKV
from meta.txn import put
from tests.leader import LEADER_KEY, leader_fence


async def _fill(kv: MetaKV, n: int, size: int, prefix: str = "k/") -> dict[str, bytes]:
    values = {f"{prefix}{i:06d}": bytes([i % 251]) * size for i in range(n)}
    items = list(values.items())
    step = max(1, min(128, (1 << 20) // max(size, 1)))
    for start in range(0, len(items), step):
        await kv.txn((), [put(k, v) for k, v in items[start:start + step]])
    return values


async def test_reads_exactly_the_keys_that_exist_and_writes_nothing(kv: MetaKV) -> None:
    values = await _fill(kv, 700, 100)
    wanted = [k for i, k in enumerate(sorted(values)) if i % 3 == 0] + ["k/missing-1", "k/missing-2"]
    before = await kv.revision()
    got = await get_many(kv, wanted + wanted[:10])  # repeats are read once
    assert got == {k: values[k] for k in wanted if k in values}
    assert await kv.revision() == before, "a read moved the revision: something was written"
    assert await kv.get(NEVER_WRITTEN) is None


async def test_an_answer_over_the_receive_limit_is_read_in_halves(kv: MetaKV) -> None:
    values = await _fill(kv, 128, 60_000)  # 7.7 MB in one txn's answer: over the client's 4 MiB
    got = await get_many(kv, list(values))
    assert got == values


async def test_no_keys_is_no_call(kv: MetaKV) -> None:
    assert await get_many(kv, []) == {}


async def test_cancelled_reads_leave_etcd_answering(kv: MetaKV, client: EtcdClient) -> None:
    """etcd 3.5.1 panics (and exits) when a read-only txn's caller cancels it; these are cancelled mid-way many
    times, and etcd still answers, with nothing written."""
    values = await _fill(kv, 2000, 200)
    before = await kv.revision()
    for delay in (0, 0.001, 0.002, 0.005, 0.01) * 4:
        task = asyncio.create_task(get_many(kv, list(values)))
        await asyncio.sleep(delay)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert await kv.revision() == before
    got = await get_many(kv, list(values)[:300])
    assert len(got) == 300


async def test_a_leaders_read_whose_fence_is_gone_says_so(kv: MetaKV) -> None:
    """Through a leader's fenced view the reads carry its fence, as every txn of that view does: once another
    leader's key replaced it, the read raises ``NotLeader`` rather than answering nothing."""
    values = await _fill(kv, 300, 50)
    fenced = kv.fenced(await leader_fence(kv))
    assert await get_many(fenced, list(values)) == values
    await kv.remove(LEADER_KEY)
    await kv.save(LEADER_KEY, "another")  # re-created: a later create revision
    with pytest.raises(NotLeader):
        await get_many(fenced, list(values))
