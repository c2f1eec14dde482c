"""``CatalogAccess.read_many`` reads runs of keys as ranges: the same answer as one point read per key, at one revision.

The keys are the catalog's shape (``<collection>/<partition>/<019d id>``) on the real etcd of the session. What
read_many answers is compared with point reads at the revision it read at, for random sets of keys: stored ones,
absent ones, keys of several parents, dense runs and sparse ones; and with writes landing after that revision
(values changed, keys deleted, keys created), which it must not see.
"""

from __future__ import annotations

import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.client import EtcdClient
from meta.etcd_pb import RangeRequest
from meta.kv import MetaKV
from querycoord.catalog.access import MIN_RANGE_KEYS, CatalogAccess, key_runs

PARENTS = ("s/1/10", "s/1/11", "s/2/10")
IDS = st.integers(0, 600)


def key(parent: str, segment_id: int) -> str:
    return f"{parent}/{segment_id:019d}"


class WritesAfterRevision(MetaKV):
    """A real MetaKV whose ``revision()`` is followed, before it answers, by the writes in ``later``: read_many
    reads everything at the revision it was given, so none of them may show."""

    def __init__(self, client: EtcdClient, root: str):
        super().__init__(client, root)
        self.later: list[tuple[str, bytes | None]] = []
        self.read_at = 0
        self.ranges = 0

    async def revision(self) -> int:
        rev = await super().revision()
        self.read_at = rev
        for k, value in self.later:
            if value is None:
                await self.remove(k)
            else:
                await self.save(k, value)
        self.later = []
        return rev

    async def _range(self, request: RangeRequest, operation: str) -> object:
        self.ranges += 1
        return await super()._range(request, operation)


async def _store(kv: MetaKV, keys: list[str]) -> None:
    saves = [(k, f"v1 {k}".encode()) for k in keys]
    for start in range(0, len(saves), 100):
        await kv.multi_save(saves[start:start + 100])


async def _point_reads(kv: MetaKV, keys: list[str], revision: int) -> dict[str, tuple[bytes, int]]:
    out = {}
    for k in keys:
        item = await kv.get_kv(k, revision=revision)
        if item is not None:
            out[k] = (item.value, item.create_revision)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stored=st.lists(st.sets(IDS, max_size=400), min_size=len(PARENTS), max_size=len(PARENTS)),
       asked=st.lists(st.tuples(st.sampled_from(PARENTS), IDS), max_size=500),
       changed=st.lists(st.tuples(st.sampled_from(PARENTS), IDS, st.booleans()), max_size=40))
async def test_read_many_answers_what_point_reads_at_its_revision_answer(
        client: EtcdClient, stored: list[set[int]], asked: list[tuple[str, int]],
        changed: list[tuple[str, int, bool]]) -> None:
    kv = WritesAfterRevision(client, f"test/read_many-{uuid.uuid4().hex[:8]}")
    try:
        await _store(kv, [key(p, i) for p, ids in zip(PARENTS, stored, strict=True) for i in sorted(ids)])
        wanted = [key(p, i) for p, i in asked]
        # After the revision is read: values changed, keys deleted (stored ones), keys created (absent ones).
        kv.later = [(key(p, i), None if delete else f"v2 {p} {i}".encode()) for p, i, delete in changed]
        got = await CatalogAccess(kv).read_many(wanted)
        assert got == await _point_reads(kv, wanted, kv.read_at)
    finally:
        await kv.remove_prefix("")


async def test_a_dense_run_is_read_as_one_range_and_a_sparse_one_key_by_key(client: EtcdClient,
                                                                            root_path: str) -> None:
    """An eighth of a partition's 4,000 segments (what a repair of one of eight nodes reads): a few Range calls,
    not one per key. A handful of keys far apart in it: one per key (a range would carry the whole partition)."""
    kv = WritesAfterRevision(client, root_path)
    await _store(kv, [key("s/1/10", i) for i in range(4000)])
    dense = [key("s/1/10", i) for i in range(0, 4000, 8)]
    got = await CatalogAccess(kv).read_many(dense)
    calls = kv.ranges
    assert got == await _point_reads(kv, dense, kv.read_at)
    assert len(got) == 500
    assert calls <= 4, f"{calls} Range calls for one dense run"

    kv.ranges = 0
    sparse = [key("s/1/10", i) for i in range(0, 4000, 400)]
    assert len(sparse) >= MIN_RANGE_KEYS
    got = await CatalogAccess(kv).read_many(sparse)
    calls = kv.ranges
    assert got == await _point_reads(kv, sparse, kv.read_at)
    assert calls == 2 + len(sparse), "the revision, the count of the run's range, then each key"


def test_runs_split_by_parent_and_size_in_key_order() -> None:
    keys = [key("s/1/10", i) for i in (5, 3, 3, 9)] + [key("s/1/1", 7), "loose"] + [key("s/2/10", i)
                                                                                     for i in range(5000)]
    runs = key_runs(keys)
    assert runs[:4] == [["loose"], [key("s/1/1", 7)], [key("s/1/10", i) for i in (3, 5, 9)],
                        [key("s/2/10", i) for i in range(4096)]]
    assert runs[4:] == [[key("s/2/10", i) for i in range(4096, 5000)]]
