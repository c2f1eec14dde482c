"""MetaKV against a real etcd: limits, paging, atomicity, fencing."""

from __future__ import annotations

import asyncio

import pytest

from meta.client import EtcdClient, connect
from meta.config import EtcdConfig
from meta.errors import InvalidKey, MetaUnavailable, NotLeader, RequestTooLarge
from meta.fence import Fence
from meta.kv import MAX_TXN_OPS, MetaKV
from meta.ops.etcd_server import free_port


async def test_basic_ops_stay_under_root(kv: MetaKV, client: EtcdClient) -> None:
    await kv.save("a/1", "one")
    await kv.multi_save({"a/2": b"two", "b/1": "three"})
    assert await kv.get("a/1") == b"one"
    assert await kv.get("missing") is None
    snap = await kv.load_prefix("a/")
    assert snap.items() == [("a/1", b"one"), ("a/2", b"two")]
    assert snap.values() == [b"one", b"two"]
    assert snap.revision > 0
    await kv.multi_save_and_remove({"c/1": "x"}, ["a/1"])
    assert (await kv.load_prefix("")).as_dict() == {"a/2": b"two", "b/1": b"three", "c/1": b"x"}
    await kv.remove_prefix("a/")
    await kv.remove("b/1")
    assert (await kv.load_prefix("")).as_dict() == {"c/1": b"x"}
    # Nothing outside the root was touched: the raw key carries the root path.
    raw = await client.kv.Range(__import__("meta.etcd_pb", fromlist=["RangeRequest"]).RangeRequest(
        key=kv.abs_key("c/1")))
    assert raw.kvs[0].key == f"{kv.root}/c/1".encode()


async def test_invalid_keys_are_refused(kv: MetaKV, client: EtcdClient) -> None:
    with pytest.raises(InvalidKey):
        await kv.save("", "x")
    with pytest.raises(InvalidKey):
        MetaKV(client, "/")


async def test_compare_and_swap(kv: MetaKV) -> None:
    assert await kv.compare_and_swap("cas", None, "1")
    assert not await kv.compare_and_swap("cas", None, "2")
    assert not await kv.compare_and_swap("cas", "0", "2")
    assert await kv.compare_and_swap("cas", "1", "2")
    assert await kv.get("cas") == b"2"


async def test_txn_limits_refused_before_sending(kv: MetaKV) -> None:
    ok = {f"k/{i:03d}": "v" for i in range(MAX_TXN_OPS)}
    await kv.multi_save(ok)
    too_many = {f"n/{i:03d}": "v" for i in range(MAX_TXN_OPS + 1)}
    with pytest.raises(RequestTooLarge) as e:
        await kv.multi_save(too_many)
    assert "129 operations" in str(e.value) and "limit 128" in str(e.value)
    big = {f"b/{i}": b"x" * 400_000 for i in range(4)}
    with pytest.raises(RequestTooLarge) as e:
        await kv.multi_save_and_remove(big, ["k/000"])
    assert "bytes (limit 1572864)" in str(e.value)
    # Nothing half-written: neither the oversized saves nor the removal happened.
    assert await kv.count_prefix("n/") == 0
    assert await kv.count_prefix("b/") == 0
    assert await kv.get("k/000") == b"v"


async def test_chunked_writer_is_not_one_txn(kv: MetaKV) -> None:
    n = await kv.chunked_save_non_atomic({f"c/{i:05d}": "v" for i in range(1000)})
    assert n == 8  # ceil(1000 / 128)
    assert await kv.count_prefix("c/") == 1000
    big = {f"d/{i}": b"x" * 400_000 for i in range(8)}
    assert await kv.chunked_save_non_atomic(big) == 3
    assert await kv.count_prefix("d/") == 8


async def test_paged_load_of_100k_keys_of_1k(kv: MetaKV, client: EtcdClient) -> None:
    """A single range would exceed gRPC's 4 MiB receive limit; the paged load does not."""
    value = b"v" * 1024
    await kv.chunked_save_non_atomic({f"big/{i:06d}": value for i in range(100_000)})
    import grpc
    from etcd3aio.kv import prefix_range_end

    from meta.etcd_pb import RangeRequest

    start = kv.abs_prefix("big/")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await client.kv.Range(RangeRequest(key=start, range_end=prefix_range_end(start)), timeout=30)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    snap = await kv.load_prefix("big/")
    assert len(snap.kvs) == 100_000
    assert snap.kvs[0].key == "big/000000" and snap.kvs[-1].key == "big/099999"
    assert all(k.value == value for k in snap.kvs[::997])


async def test_paged_load_is_one_revision(kv: MetaKV) -> None:
    """Writes landing between pages are not seen: the snapshot is consistent."""
    await kv.multi_save({f"p/{i:04d}": "old" for i in range(120)})
    for _ in range(5):
        loader = asyncio.create_task(kv.load_prefix("p/", page_size=10))  # 12 pages
        await asyncio.sleep(0)
        # One atomic txn: any consistent snapshot sees all old or all new values.
        await kv.multi_save({f"p/{i:04d}": "new" for i in range(120)})
        snap = await loader
        values = {k.value for k in snap.kvs}
        assert len(values) == 1, f"a paged load mixed two revisions: {values}"
        assert len(snap.kvs) == 120
        await kv.multi_save({f"p/{i:04d}": "old" for i in range(120)})


async def test_fenced_view_refuses_writes_after_the_fence_is_gone(kv: MetaKV) -> None:
    leader_key = kv.abs_key("election/leader").decode()
    rev = await kv.save("election/leader", "me")
    fence = Fence(leader_key, (await kv.get_kv("election/leader")).create_revision)
    assert fence.revision == rev
    fenced = kv.fenced(fence)
    await fenced.save("state", "1")
    await fenced.multi_save_and_remove({"state": "2"}, [])
    assert await fenced.compare_and_swap("state", "2", "3")
    assert not await fenced.compare_and_swap("state", "2", "4")
    await fenced.check()
    # The key is re-created by someone else: same name, another create revision.
    await kv.remove("election/leader")
    await kv.save("election/leader", "other")
    for write in (
        fenced.save("state", "x"),
        fenced.multi_save({"state": "x", "more": "y"}),
        fenced.remove("state"),
        fenced.remove_prefix(""),
        fenced.compare_and_swap("state", "3", "x"),
        fenced.check(),
    ):
        with pytest.raises(NotLeader) as e:
            await write
        assert e.value.current_revision > fence.revision
    assert await kv.get("state") == b"3"
    assert await kv.get("more") is None


async def test_unreachable_etcd_raises_meta_unavailable_within_deadline() -> None:
    port = free_port()
    config = EtcdConfig(endpoints=(f"127.0.0.1:{port}",), call_timeout=0.5, deadline=2.0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(MetaUnavailable) as e:
        await connect(config)
    elapsed = loop.time() - started
    assert f"127.0.0.1:{port}" in str(e.value)
    assert elapsed < 30, f"MetaUnavailable took {elapsed:.1f}s with a 2s deadline: the deadline is not honoured"


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="host:port"):
        EtcdConfig(endpoints=("nohost",))
    with pytest.raises(ValueError, match="together"):
        EtcdConfig(user="root")
    assert EtcdConfig.from_endpoints("http://a:1, b:2").endpoints == ("a:1", "b:2")
