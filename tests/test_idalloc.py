"""IdAllocator against a real etcd: uniqueness, monotonicity across restarts and processes, contention, edges."""

from __future__ import annotations

import asyncio
import random
import sys

import pytest

from meta.client import EtcdClient, connect
from meta.errors import MetaError, NotLeader
from meta.fence import Fence
from meta.idalloc import IdAllocator
from meta.kv import MetaKV, Value
from meta.ops.etcd_server import EtcdCluster

KEY = "idalloc/task"


def assert_strictly_increasing(ids: list[int], who: str) -> None:
    bad = next((i for i in range(1, len(ids)) if ids[i] <= ids[i - 1]), None)
    assert bad is None, f"{who}: id {ids[bad]} after {ids[bad - 1]} (position {bad})"


async def stored(kv: MetaKV) -> int | None:
    raw = await kv.get(KEY)
    return None if raw is None else int(raw)


async def draw(alloc: IdAllocator, total: int, rng: random.Random, big: int) -> list[int]:
    """``total`` ids: mostly allocate(1), every 400th call a multi-id allocate (some larger than the block)."""
    out: list[int] = []
    calls = 0
    while len(out) < total:
        calls += 1
        if calls % 400 == 0:
            k = min(rng.choice([2, 17, 250, big]), total - len(out))
        else:
            k = 1
        ids = await alloc.allocate(k)
        assert len(ids) == k
        out.extend(ids)
        if calls % 50 == 0:
            await asyncio.sleep(0)  # let the other allocators in between blocks too
    return out


async def test_four_concurrent_allocators_40k_unique_and_increasing(etcd: EtcdCluster, root_path: str) -> None:
    """4 allocators (own connections, different block sizes) x 10,000 ids: no duplicate, each strictly increasing."""
    clients = [await connect(etcd.config()) for _ in range(4)]
    try:
        block_sizes = [1000, 250, 64, 16]
        allocs = [
            IdAllocator(MetaKV(c, root_path), KEY, block_size=b) for c, b in zip(clients, block_sizes, strict=True)
        ]
        results = await asyncio.gather(
            *(draw(a, 10_000, random.Random(i), big=a.block_size * 3 + 5) for i, a in enumerate(allocs))
        )
        for i, ids in enumerate(results):
            assert len(ids) == 10_000
            assert_strictly_increasing(ids, f"allocator {i} (block {block_sizes[i]})")
        everything = [i for ids in results for i in ids]
        assert len(set(everything)) == 40_000, "duplicate ids across allocators"
        assert min(everything) >= 1
        # Every id handed out lies below the persisted next-free id (reserve before use).
        assert max(everything) < await stored(MetaKV(clients[0], root_path))  # type: ignore[operator]
    finally:
        for c in clients:
            await c.close()


async def test_concurrent_calls_on_one_instance_reserve_once_per_need(kv: MetaKV) -> None:
    """200 simultaneous allocate(1) on one instance: one block reserved, not one per waiting caller."""
    alloc = IdAllocator(kv, KEY, block_size=1000)
    ranges = await asyncio.gather(*(alloc.allocate() for _ in range(200)))
    assert sorted(i for r in ranges for i in r) == list(range(1, 201))
    assert await stored(kv) == 1001
    # Same with small blocks: 100 callers, block 10 -> exactly 10 reservations, no id wasted.
    alloc2 = IdAllocator(kv, "idalloc/other", block_size=10)
    ranges = await asyncio.gather(*(alloc2.allocate() for _ in range(100)))
    assert sorted(i for r in ranges for i in r) == list(range(1, 101))
    assert await kv.get("idalloc/other") == b"101"


async def test_restarted_allocator_never_goes_back(kv: MetaKV) -> None:
    """A new instance on the same key starts above everything the old one returned, even mid-block."""
    old = IdAllocator(kv, KEY, block_size=100)
    seen = [i for _ in range(30) for i in await old.allocate()]
    assert seen == list(range(1, 31))
    high = max(seen)
    for generation in range(5):
        new = IdAllocator(kv, KEY, block_size=100)  # the "restarted" process: no memory of the old block
        first = (await new.allocate())[0]
        assert first > high, f"generation {generation}: restarted allocator returned {first} <= {high}"
        assert first == await stored(kv) - 100  # type: ignore[operator]  # a fresh block, the old rest skipped
        more = [i for k in (1, 5, 250, 1) for i in await new.allocate(k)]
        seen += [first, *more]
        high = max(seen)
    # The first instance, still alive, keeps serving its own block: still no duplicate.
    seen += list(await old.allocate(3))
    assert len(seen) == len(set(seen))


async def test_n_larger_than_block_and_block_extension(kv: MetaKV) -> None:
    a = IdAllocator(kv, KEY, block_size=10)
    assert await a.allocate(25) == range(1, 26)  # one CAS of max(n, block_size)
    assert await stored(kv) == 26
    assert await a.allocate(1) == range(26, 27)
    assert await stored(kv) == 36
    assert await a.allocate(3) == range(27, 30)
    # 6 left in hand, 20 wanted, nobody reserved since: the block is extended and its rest kept.
    assert await a.allocate(20) == range(30, 50)
    assert await stored(kv) == 50
    assert await a.allocate(2) == range(50, 52)
    # Another allocator takes the next block: a's rest (52..59) cannot be extended any more, so a
    # skips it and reserves after b's block; a's ids stay increasing and disjoint from b's.
    b = IdAllocator(kv, KEY, block_size=10)
    assert await b.allocate() == range(60, 61)
    assert await a.allocate(9) == range(70, 79)
    assert await stored(kv) == 80
    assert await b.allocate(9) == range(61, 70)


async def test_invalid_arguments_are_refused(kv: MetaKV) -> None:
    alloc = IdAllocator(kv, KEY)
    for n in (0, -1):
        with pytest.raises(ValueError, match="n >= 1"):
            await alloc.allocate(n)
    for n in (1.5, True, "3"):
        with pytest.raises(TypeError, match="int count"):
            await alloc.allocate(n)  # type: ignore[arg-type]
    assert await kv.get(KEY) is None, "a refused call must not reserve anything"
    for bad in (0, -5, 2.0):
        with pytest.raises(ValueError, match="block_size"):
            IdAllocator(kv, KEY, block_size=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_rounds"):
        IdAllocator(kv, KEY, max_rounds=0)
    with pytest.raises(ValueError, match="key"):
        IdAllocator(kv, "")


async def test_contention_with_block_size_one(client: EtcdClient, root_path: str) -> None:
    """6 allocators with block_size=1 fight for every single id: all unique, nothing wasted."""
    allocs = [IdAllocator(MetaKV(client, root_path), KEY, block_size=1) for _ in range(6)]

    async def run(a: IdAllocator) -> list[int]:
        return [i for _ in range(60) for i in await a.allocate()]

    results = await asyncio.gather(*(run(a) for a in allocs))
    for i, ids in enumerate(results):
        assert_strictly_increasing(ids, f"allocator {i}")
    everything = sorted(i for ids in results for i in ids)
    assert everything == list(range(1, 361))
    assert await stored(MetaKV(client, root_path)) == 361


class _AlwaysOvertaken(MetaKV):
    """A MetaKV where another allocator always wins the block just before our CAS (real etcd writes)."""

    def __init__(self, base: MetaKV):
        super().__init__(base.client, base.root)
        self.cas_calls = 0

    async def compare_and_swap(self, key: str, expected: Value | None, value: Value) -> bool:
        self.cas_calls += 1
        current = await self.get(key)
        await self.save(key, str(int(current or b"1") + 7))
        return await super().compare_and_swap(key, expected, value)


async def test_lost_cas_rounds_are_bounded(kv: MetaKV) -> None:
    racing = _AlwaysOvertaken(kv)
    alloc = IdAllocator(racing, KEY, block_size=10, max_rounds=5)
    with pytest.raises(MetaError, match="lost the compare-and-swap to other allocators 5 times") as e:
        await alloc.allocate()
    assert KEY in str(e.value) and "block_size" in str(e.value)
    assert racing.cas_calls == 5
    assert alloc.remaining == 0
    # With a normal kv the same key works again, above everything the racer reserved.
    assert (await IdAllocator(kv, KEY).allocate())[0] == 1 + 5 * 7


async def test_corrupt_or_lowered_key_is_refused(kv: MetaKV) -> None:
    await kv.save(KEY, "not-a-number")
    with pytest.raises(MetaError, match="not a decimal next id"):
        await IdAllocator(kv, KEY).allocate()
    await kv.save(KEY, "0")
    with pytest.raises(MetaError, match="not a decimal next id"):
        await IdAllocator(kv, KEY).allocate()
    # Somebody deletes the key under a running allocator: it refuses rather than repeat ids.
    await kv.remove(KEY)
    alloc = IdAllocator(kv, KEY, block_size=5)
    assert await alloc.allocate(5) == range(1, 6)
    await kv.remove(KEY)
    with pytest.raises(MetaError, match="deleted or rewritten"):
        await alloc.allocate()


async def test_fenced_allocation(kv: MetaKV) -> None:
    """Through a FencedKV: works while the fence holds; a deposed leader cannot reserve (NotLeader)."""
    await kv.save("election/leader", "me")
    fence = Fence(kv.abs_key("election/leader").decode(), (await kv.get_kv("election/leader")).create_revision)
    alloc = IdAllocator(kv.fenced(fence), KEY, block_size=4)
    assert await alloc.allocate(3) == range(1, 4)
    await kv.remove("election/leader")
    await kv.save("election/leader", "other")
    # The id already reserved is still unique and may be handed out; a new reservation is refused.
    assert await alloc.allocate() == range(4, 5)
    with pytest.raises(NotLeader):
        await alloc.allocate()
    assert await stored(kv) == 5


# ----- real processes -----------------------------------------------------------------------------

_WORKER = r"""
import asyncio, random, sys
from meta.client import connect
from meta.config import EtcdConfig
from meta.idalloc import IdAllocator
from meta.kv import MetaKV

async def main(endpoints, root, key, block, count, seed):
    client = await connect(EtcdConfig.from_endpoints(endpoints))
    alloc = IdAllocator(MetaKV(client, root), key, block_size=block)
    rng = random.Random(seed)
    done = 0
    while count == 0 or done < count:  # count 0: until killed
        k = 1 if rng.random() < 0.95 else rng.randint(2, 3 * block)
        if count:
            k = min(k, count - done)
        ids = await alloc.allocate(k)
        sys.stdout.write("".join(f"{i}\n" for i in ids))  # one write per call, after allocate returned
        sys.stdout.flush()
        done += k
    await client.close()

a = sys.argv[1:]
asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5])))
"""


async def _spawn(env: dict[str, str], etcd: EtcdCluster, root: str, block: int, count: int, seed: int):
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WORKER, ",".join(etcd.endpoints), root, KEY, str(block), str(count), str(seed),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip


async def _finish(proc: asyncio.subprocess.Process, who: str) -> list[int]:
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, f"{who} failed ({proc.returncode}): {err.decode()[-2000:]}"
    return [int(line) for line in out.decode().splitlines()]


async def test_processes_unique_and_killed_one_never_goes_back(
    etcd: EtcdCluster, kv: MetaKV, subprocess_env: dict[str, str]
) -> None:
    """3 processes allocate concurrently on one key; one is SIGKILLed mid-block and restarted.

    All ids printed by all processes are unique, each process's ids strictly
    increase, and the restarted process starts at or above the stored value
    seen after the kill, so above everything the killed one returned.
    """
    block, count = 10, 5000
    procs: list[asyncio.subprocess.Process] = []
    try:
        await _check_processes(etcd, kv, subprocess_env, block, count, procs)
    finally:
        for p in procs:  # only on failure are any left running
            if p.returncode is None:
                p.kill()
                await p.wait()


async def _check_processes(
    etcd: EtcdCluster,
    kv: MetaKV,
    env: dict[str, str],
    block: int,
    count: int,
    procs: list[asyncio.subprocess.Process],
) -> None:
    steady = [await _spawn(env, etcd, kv.root, block, count, seed) for seed in (1, 2)]
    victim = await _spawn(env, etcd, kv.root, block, 0, 3)
    procs += [*steady, victim]
    assert victim.stdout is not None
    killed_ids: list[int] = []
    try:
        async with asyncio.timeout(30):
            while len(killed_ids) < 2000:
                line = await victim.stdout.readline()
                if not line:
                    err = await victim.stderr.read()  # type: ignore[union-attr]
                    pytest.fail(f"victim exited early ({await victim.wait()}): {err.decode()[-2000:]}")
                killed_ids.append(int(line))
    finally:
        victim.kill()  # SIGKILL: no clean-up, its reserved block is lost
    await victim.wait()
    assert victim.returncode == -9
    rest = await victim.stdout.read()
    # Complete lines written before the kill are ids it returned too; a cut last line is dropped.
    killed_ids += [int(x) for x in rest.decode().split("\n")[:-1]]
    after_kill = await stored(kv)
    assert after_kill is not None and after_kill > max(killed_ids)

    restarted = await _spawn(env, etcd, kv.root, block, 1000, 4)
    procs.append(restarted)
    results = [await _finish(p, f"worker {i}") for i, p in enumerate(steady)]
    restarted_ids = await _finish(restarted, "restarted worker")

    assert [len(r) for r in results] == [count, count]
    assert len(restarted_ids) == 1000
    for who, ids in (("worker 0", results[0]), ("worker 1", results[1]), ("killed", killed_ids),
                     ("restarted", restarted_ids)):  # fmt: skip
        assert_strictly_increasing(ids, who)
    assert min(restarted_ids) >= after_kill > max(killed_ids), "the restarted process went back"
    everything = results[0] + results[1] + killed_ids + restarted_ids
    assert len(everything) == len(set(everything)), "duplicate ids across processes"
    assert max(everything) < await stored(kv)  # type: ignore[operator]
