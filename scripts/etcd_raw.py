"""etcd as the benchmarks measure it: what a span of revisions wrote (a watch replay), and the raw cost of
writing the same records again with the plain etcd3aio client in 128-op txns, the floor a coordinator's own
writes are compared with (``bench_load.py``, ``bench_scale_ops.py``).

Imported by the scripts as a sibling module (see ``benchlib``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from benchlib import BenchError
from etcd3aio.kv import KVService

from meta.client import EtcdClient
from meta.etcd_pb import WatchCreateRequest, WatchRequest
from meta.kv import MAX_TXN_BYTES, MAX_TXN_OPS, MetaKV

# Key prefixes (relative to the root) -> the category a txn touching them counts under, most specific first.
CATEGORIES = (
    ("queryCoord-segmentMeta/", "segment meta"),
    ("queryCoord-triggerTask/", "task records"),
    ("queryCoord-activeTask/", "task records"),
    ("queryCoord-taskInfo/", "task records"),
    ("queryCoord-taskHistory/", "task history"),  # the finished tree's record, in the txn that removes it
    ("queryCoord-collectionMeta/", "collection meta"),
    ("queryCoord-dmChannelWatchInfo/", "channel meta"),
    ("queryCoord-deltaChannel/", "channel meta"),
    ("idalloc/", "id allocator"),
)


def category(rel_key: str) -> str:
    for prefix, name in CATEGORIES:
        if rel_key.startswith(prefix):
            return name
    return "other: " + rel_key.split("/", 1)[0]


@dataclass
class Replay:
    """What the load wrote, from the watch replay of its revisions."""

    revisions: set[int] = field(default_factory=set)
    txns_by_category: Counter[str] = field(default_factory=Counter)
    puts_by_category: Counter[str] = field(default_factory=Counter)
    deletes: int = 0
    last_value: dict[str, bytes] = field(default_factory=dict)  # rel key -> last value put, first-put order

    def records(self) -> list[tuple[str, bytes]]:
        return list(self.last_value.items())



async def quiet_revision(kv: MetaKV, settle: float = 0.3, timeout: float = 30.0) -> int:
    """etcd's revision once it has not moved for ``settle`` seconds (nothing else is writing)."""
    deadline = time.monotonic() + timeout
    rev = await kv.revision()
    while True:
        await asyncio.sleep(settle)
        now = await kv.revision()
        if now == rev:
            return rev
        if time.monotonic() > deadline:
            raise BenchError(f"etcd's revision keeps moving ({rev} -> {now}): something else writes to this etcd")
        rev = now


async def replay(client: EtcdClient, kv: MetaKV, first: int, last: int, timeout: float) -> Replay:
    """Every event of revisions ``first..last`` on the whole key space, through one watch."""
    out = Replay()
    root = kv.root.encode() + b"/"
    stop = asyncio.Event()
    create = WatchCreateRequest(key=b"\0", range_end=b"\0", start_revision=first, fragment=True)

    async def requests():  # type: ignore[no-untyped-def]
        yield WatchRequest(create_request=create)
        await stop.wait()

    call = client.watch.Watch(requests(), metadata=client.metadata)
    cats_of_rev: dict[int, set[str]] = {}
    seen = first - 1
    try:
        async with asyncio.timeout(timeout):
            async for resp in call:
                if resp.canceled or resp.compact_revision:
                    raise BenchError(f"replaying revisions {first}..{last} failed: {resp.cancel_reason or 'compacted'}")
                for e in resp.events:
                    rev = seen = e.kv.mod_revision
                    if rev > last:
                        break
                    key = e.kv.key
                    rel = key[len(root):].decode() if key.startswith(root) else "(outside the root) " + key.decode()
                    cat = category(rel)
                    cats_of_rev.setdefault(rev, set()).add(cat)
                    if e.type == 0:  # PUT
                        out.puts_by_category[cat] += 1
                        out.last_value[rel] = e.kv.value
                    else:
                        out.deletes += 1
                if seen >= last:
                    break
    finally:
        stop.set()
        call.cancel()
    out.revisions = set(cats_of_rev)
    for cats in cats_of_rev.values():
        out.txns_by_category[" + ".join(sorted(cats))] += 1
    return out


async def raw_write(client: EtcdClient, root: str, records: list[tuple[str, bytes]], writers: int = 1) -> float:
    """Write ``records`` (relative keys) under ``root`` with the raw etcd3aio client, 128-op txns; seconds."""
    raw = client.raw.kv
    assert raw is not None
    put, timeout = KVService.txn_op_put, client.config.call_timeout
    prefix = root.rstrip("/") + "/"
    batches: list[list[tuple[str, bytes]]] = []
    cur: list[tuple[str, bytes]] = []
    size = 0
    for k, v in records:
        s = len(prefix) + len(k) + len(v) + 16
        if cur and (len(cur) >= MAX_TXN_OPS or size + s > MAX_TXN_BYTES - 16 * 1024):
            batches.append(cur)
            cur, size = [], 0
        cur.append((k, v))
        size += s
    if cur:
        batches.append(cur)
    queue = list(reversed(batches))

    async def writer() -> None:
        # Building the requests is timed too (as in bench_meta): it is part of what any writer pays.
        while queue:
            await raw.txn([], [put(prefix + k, v) for k, v in queue.pop()], timeout=timeout)

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - start
