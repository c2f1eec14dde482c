"""``meta verify`` reads its snapshot without the catalog's segment records and their id index (``verify.take``):
on random roots written to a real etcd, it finds exactly what the whole-root snapshot finds.

The roots mix what the skipped prefixes hold (segment records, id index entries, a key equal to a prefix
itself, which nobody owns), keys beside them that sort just before or after, query meta of collections the
catalog has or not, unknown keys and task records; the two snapshots are read at one revision each, with
nothing written between them.
"""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.client import connect
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import data_pb2
from querycoord.catalog.store import CatalogStore
from querycoord.metatool import snapshot
from querycoord.metatool.verify import NOT_READ, take, verify
from querycoord.querymeta import keys as qkeys

# Keys around and inside the prefixes verify does not read, and elsewhere under the root.
_NEAR = [p for prefix in NOT_READ for p in (prefix, prefix + "1/2/3", prefix + "x", prefix[:-1], prefix[:-1] + "0",
                                                prefix[:-1] + ".", prefix + "\x01")]
_ELSEWHERE = ["a", "zz/unknown", "catalog/other", "queryCoord-segmentMeta", "task/x", "idalloc/"]
_KEYS = st.lists(st.sampled_from(_NEAR + _ELSEWHERE), max_size=8, unique=True)
_SEGMENTS = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 50), st.integers(0, 3)),
                     max_size=6)


def _segment(cid: int, pid: int, sid: int, node: int) -> bytes:
    info = data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=pid,
                                node_ids=[node] if node else [], replica_ids=[1] if node else [])
    return info.SerializeToString()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=_KEYS, segments=_SEGMENTS, catalog_segments=st.integers(0, 3), bad_value=st.booleans())
def test_verify_finds_the_same_without_the_catalog_segments(etcd: EtcdCluster, keys: list[str],
                                                            segments: list[tuple[int, int, int, int]],
                                                            catalog_segments: int, bad_value: bool) -> None:
    async def run() -> None:
        client = await connect(etcd.config())
        kv = MetaKV(client, f"test/lean-{uuid.uuid4().hex[:8]}")
        try:
            if catalog_segments:
                await CatalogStore(kv).create_bulk_collection("c", num_partitions=1, num_segments=catalog_segments)
            for saves in ({k: b"\xff not a record" if bad_value else b"v" for k in keys},
                          {qkeys.segment_key(c, p, s): _segment(c, p, s, n) for c, p, s, n in segments}):
                if saves:
                    await kv.multi_save(saves)
            whole = await snapshot.take(kv)
            lean = await take(kv)
            assert whole.revision == lean.revision
            assert set(lean.items) <= set(whole.items)
            left_out = set(whole.items) - set(lean.items)
            assert all(any(k.startswith(p) and k != p for p in NOT_READ) for k in left_out), left_out
            found = [p.as_dict() for p in verify(lean)]
            assert found == [p.as_dict() for p in verify(whole)]
            for prefix in set(keys) & set(NOT_READ):  # a key equal to a skipped prefix is still read, and nobody's
                assert {"kind": "unknown-key", "keys": [prefix]}.items() <= next(
                    f for f in found if f["keys"] == [prefix]).items()
        finally:
            await kv.remove_prefix("")
            await client.close()

    asyncio.run(run())


def test_pieces_cover_the_root_without_the_skipped_ranges() -> None:
    assert snapshot.pieces([]) == [("", None)]
    assert snapshot.pieces([("b\x00", "c"), ("a\x00", "b")]) == [("", "a\x00"), ("b", "b\x00"), ("c", None)]
    assert snapshot.pieces([("", "m")]) == [("m", None)]
