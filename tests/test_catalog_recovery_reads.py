"""How a filtered recovery read reads a large partition: a lost node's eighth of it by txns of gets (exactly the
records wanted), most of it as the partition's range; the same answer either way, the one every read gives."""

from __future__ import annotations

from typing import Any

from meta.client import EtcdClient
from meta.kv import MetaKV
from meta.prefix_snapshot import PrefixSnapshot
from querycoord.catalog.store import CatalogStore


class CountingKV(MetaKV):
    """A real MetaKV that counts its prefix loads."""

    prefix_loads = 0

    async def load_prefix(self, prefix: str, **kwargs: Any) -> PrefixSnapshot:
        self.prefix_loads += 1
        return await super().load_prefix(prefix, **kwargs)


async def test_an_eighth_of_a_large_partition_is_read_key_by_key_and_most_of_it_as_a_range(
        client: EtcdClient, root_path: str) -> None:
    kv = CountingKV(client, root_path)
    store = CatalogStore(kv)
    desc, _ = await store.create_bulk_collection("recovery_reads", num_partitions=1, num_segments=9000)
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    _, every = await store.get_recovery_info(cid, pid)
    assert len(every) == 9000
    by_id = {b.segment_id: b for b in every}
    ids = sorted(by_id)

    kv.prefix_loads = 0
    eighth = [*ids[::8], 999_999_999]  # 1,125 ids (over the point-read bound) and one the partition lacks
    _, picked = await store.get_recovery_info(cid, pid, eighth)
    assert kv.prefix_loads == 0, "an eighth of the partition was read as its whole range"
    assert [b.segment_id for b in picked] == ids[::8]
    assert all(b == by_id[b.segment_id] for b in picked)

    most = ids[: 2 * len(ids) // 3]
    _, picked = await store.get_recovery_info(cid, pid, most)
    assert kv.prefix_loads == 1, "two thirds of the partition are one range read"
    assert [b.segment_id for b in picked] == most and all(b == by_id[b.segment_id] for b in picked)


async def test_an_eighth_of_a_smaller_partition_and_a_few_ids_are_read_without_a_range(
        client: EtcdClient, root_path: str) -> None:
    """Below a thousand ids too: the range over a lost node's eighth read and parsed eight records for each one
    wanted, and was most of a repair's plan at 100,000 segments (781 ids of each 6,250-segment partition)."""
    kv = CountingKV(client, root_path)
    store = CatalogStore(kv)
    desc, _ = await store.create_bulk_collection("recovery_reads_small", num_partitions=1, num_segments=1600)
    cid, pid = desc.collection_id, desc.partitions[0].partition_id
    _, every = await store.get_recovery_info(cid, pid)
    by_id = {b.segment_id: b for b in every}
    ids = sorted(by_id)

    for wanted in (ids[::8], ids[3:8], [ids[0], 999_999_999]):  # 200 ids; five; one and one the partition lacks
        kv.prefix_loads = 0
        _, picked = await store.get_recovery_info(cid, pid, wanted)
        assert kv.prefix_loads == 0, f"{len(wanted)} ids of a partition of {len(ids)} were read as its range"
        expected = [s for s in wanted if s in by_id]
        assert [b.segment_id for b in picked] == expected
        assert all(b == by_id[b.segment_id] for b in picked)
