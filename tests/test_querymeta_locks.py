"""``querymeta.locks``: shared and exclusive holders of a collection in one FIFO, and claims on segment ids.

Pure asyncio (no etcd): the orders asserted are facts of the locks, reached by events, not by timing.
tests/test_querymeta.py drives the same locks through real saves against etcd.
"""

from __future__ import annotations

import asyncio

import pytest

from querycoord.querymeta.locks import CollectionLock, RecordClaims


async def test_shared_holders_overlap_and_an_exclusive_one_waits_for_all_of_them() -> None:
    lock, log = CollectionLock(), []
    inside, release = asyncio.Event(), asyncio.Event()

    async def shared(name: str) -> None:
        async with lock.shared():
            log.append(f"{name} in")
            if lock.shared_holders == 2:
                inside.set()
            await release.wait()
            log.append(f"{name} out")

    async def exclusive() -> None:
        async with lock.exclusive():
            log.append("x in")

    tasks = [asyncio.create_task(shared("a")), asyncio.create_task(shared("b"))]
    await inside.wait()  # both shared holders are in at once
    x = asyncio.create_task(exclusive())
    await asyncio.sleep(0)
    assert "x in" not in log
    release.set()
    await asyncio.gather(*tasks, x)
    assert log[-1] == "x in" and log.index("x in") > max(log.index("a out"), log.index("b out"))


async def test_a_shared_holder_that_comes_after_a_waiting_exclusive_one_waits_behind_it() -> None:
    lock, log = CollectionLock(), []
    first_in, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with lock.shared():
            first_in.set()
            await release.wait()
        log.append("first out")

    async def exclusive() -> None:
        async with lock.exclusive():
            log.append("x")

    async def late() -> None:
        async with lock.shared():
            log.append("late")

    a = asyncio.create_task(first())
    await first_in.wait()
    x = asyncio.create_task(exclusive())
    await asyncio.sleep(0)  # x holds the FIFO and waits for the shared holder
    b = asyncio.create_task(late())
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == []  # the late shared holder did not overtake the waiting exclusive one
    release.set()
    await asyncio.gather(a, x, b)
    assert log == ["first out", "x", "late"]


async def test_a_claim_waits_for_overlapping_ids_only() -> None:
    claims = RecordClaims()
    held, release, log = asyncio.Event(), asyncio.Event(), []

    async def holder() -> None:
        async with claims.claim({1, 2, 3}):
            held.set()
            await release.wait()
            log.append("holder out")

    async def other(ids: set[int], name: str) -> None:
        async with claims.claim(ids):
            log.append(name)

    h = asyncio.create_task(holder())
    await held.wait()
    await other({4, 5}, "disjoint")  # goes through while {1, 2, 3} is held
    overlapping = asyncio.create_task(other({3, 9}, "overlapping"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["disjoint"]
    release.set()
    await asyncio.gather(h, overlapping)
    assert log == ["disjoint", "holder out", "overlapping"]
    assert len(claims) == 0


async def test_a_cancelled_claim_leaves_nothing_claimed_or_waiting() -> None:
    claims = RecordClaims()
    held, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with claims.claim({1}):
            held.set()
            await release.wait()

    h = asyncio.create_task(holder())
    await held.wait()

    async def waiter() -> None:
        async with claims.claim({1, 2}):
            raise AssertionError("never claimed: cancelled while waiting")

    w = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
    assert claims.waiting == 0
    release.set()
    await h
    assert len(claims) == 0
    async with claims.claim({1, 2}):  # free again
        assert len(claims) == 2
