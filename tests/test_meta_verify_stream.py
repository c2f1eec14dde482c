"""``meta verify`` streams query meta's segment records (``verify.take_streamed``, ``metatool.segment_stream``): on
random roots written to a real etcd it finds exactly what the whole-root snapshot finds, whatever the page size.

The roots mix valid segment records with corrupt ones (bytes that do not parse, a record under another key, a
segment id stored twice, the key equal to the prefix itself), records on live and dead query nodes, load records
of some collections and partitions, catalog collections with some partitions, and keys beside the prefix. Pages of
one to three keys (fixed, or growing as they do over a large prefix) put broken records on every side of a
page boundary. Both reads are taken at one revision each
with nothing written between them.
"""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.client import connect
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from meta.session import SessionInfo, session_key
from proto import catalog_pb2, data_pb2
from querycoord.catalog.store import collection_key as catalog_key
from querycoord.common.protocol import QUERYNODE_ROLE
from querycoord.metatool import snapshot
from querycoord.metatool.check_query import live_nodes
from querycoord.metatool.segment_stream import read_segments
from querycoord.metatool.verify import NOT_READ, take_streamed, verify
from querycoord.querymeta import keys as qkeys

_SEGMENTS = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.integers(0, 3),
                               st.sampled_from(["ok", "ok", "ok", "garbage", "other-key"])), max_size=10)
_ODD_KEYS = st.lists(st.sampled_from([qkeys.SEGMENT_PREFIX, qkeys.SEGMENT_PREFIX + "x", qkeys.SEGMENT_PREFIX + "1/",
                                      qkeys.SEGMENT_PREFIX[:-1], qkeys.SEGMENT_PREFIX + "2/1/", "zz/unknown"]),
                     max_size=3, unique=True)
_IDS = st.sets(st.integers(1, 3), max_size=3)


def _segment(cid: int, pid: int, sid: int, node: int) -> bytes:
    info = data_pb2.SegmentInfo(segment_id=sid, collection_id=cid, partition_id=pid,
                                node_ids=[node] if node else [], replica_ids=[1] if node else [])
    return info.SerializeToString()


def _root(segments: list[tuple[int, int, int, int, str]], odd: list[str], catalog: set[int], loaded: set[int],
          live: set[int]) -> dict[str, bytes]:
    saves: dict[str, bytes] = {k: b"\xff not a record" for k in odd}
    for c, p, s, n, shape in segments:
        key = qkeys.segment_key(c, p, s)
        saves[key] = b"\xff\xff" if shape == "garbage" else _segment(c, p + (shape == "other-key"), s, n)
    for cid in catalog:  # partitions 1 and 2: records of partition 3 are of a dropped partition
        desc = catalog_pb2.CollectionDescription(collection_id=cid, name=f"c{cid}",
                                                 partitions=[catalog_pb2.PartitionInfo(partition_id=p) for p in (1, 2)])
        saves[catalog_key(cid)] = desc.SerializeToString()
    for cid in loaded:  # partition 1 loaded: records of partition 2 are of an unloaded one
        info = data_pb2.CollectionLoadInfo(collection_id=cid, replica_number=1,
                                           partitions=[data_pb2.PartitionLoadInfo(partition_id=1)])
        saves[qkeys.collection_key(cid)] = info.SerializeToString()
    for node in live:
        saves[session_key(QUERYNODE_ROLE, node)] = SessionInfo(node, QUERYNODE_ROLE, f"127.0.0.1:{node}").to_json()
    return saves


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=_SEGMENTS, odd=_ODD_KEYS, catalog=_IDS, loaded=_IDS, live=_IDS, page=st.integers(1, 3),
       grow=st.sampled_from([1, 4]))
def test_streamed_verify_finds_what_the_whole_snapshot_finds(etcd: EtcdCluster, segments: list[tuple[int, int, int,
                                                             int, str]], odd: list[str], catalog: set[int],
                                                             loaded: set[int], live: set[int], page: int,
                                                             grow: int) -> None:
    async def run() -> None:
        client = await connect(etcd.config())
        kv = MetaKV(client, f"test/stream-{uuid.uuid4().hex[:8]}")
        try:
            saves = _root(segments, odd, catalog, loaded, live)
            if saves:
                await kv.multi_save(saves)
            # Two reads at one revision: the etcd is shared (another root's write, a lapsed lease's delete can move
            # the revision between them), so they are taken again until nothing moved in between.
            for _ in range(20):
                whole = await snapshot.take(kv)
                lean = await snapshot.take(kv, skip_under=NOT_READ, skip_whole=(qkeys.SEGMENT_PREFIX,))
                if lean.revision == whole.revision:
                    break
            assert lean.revision == whole.revision
            assert not any(k.startswith(qkeys.SEGMENT_PREFIX) for k in lean.items)
            streamed = await read_segments(kv, lean.revision, live_nodes(lean), page_size=page,
                                           max_page_size=page * grow)
            expected = [p.as_dict() for p in verify(whole)]
            assert [p.as_dict() for p in verify(lean, streamed)] == expected
            # The fixes too: repair applies them as verify found them.
            assert [p.fix for p in verify(lean, streamed)] == [p.fix for p in verify(whole)]
            read = await take_streamed(kv)
            assert [p.as_dict() for p in verify(read.snap, read.segments)] == expected
        finally:
            await kv.remove_prefix("")
            await client.close()

    asyncio.run(run())


def test_a_page_boundary_between_a_segment_and_its_twin_still_finds_the_twin(etcd: EtcdCluster) -> None:
    """Segment 7 stored under two keys that land on two pages: the second key is the corrupt one, as a reload
    decides, whichever page it is on."""
    async def run() -> None:
        client = await connect(etcd.config())
        kv = MetaKV(client, f"test/twin-{uuid.uuid4().hex[:8]}")
        try:
            first, second = qkeys.segment_key(1, 1, 7), qkeys.segment_key(1, 2, 7)
            await kv.multi_save({first: _segment(1, 1, 7, 0), second: _segment(1, 2, 7, 0)})
            lean = await snapshot.take(kv, skip_under=NOT_READ, skip_whole=(qkeys.SEGMENT_PREFIX,))
            streamed = await read_segments(kv, lean.revision, set(), page_size=1, max_page_size=1)
            assert [(p.kind, p.keys) for p in streamed.corrupt] == [("corrupt-query-meta", (second,))]
            assert "already stored under" in streamed.corrupt[0].detail
            assert streamed.collection_keys(1) == [first]
        finally:
            await kv.remove_prefix("")
            await client.close()

    asyncio.run(run())
