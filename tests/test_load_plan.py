"""The per-segment steps of planning a load: each builds what the generic (slower) form built."""

from __future__ import annotations

import asyncio

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from meta.kv import MetaKV
from proto import data_pb2
from querycoord.common.messages import copy_fields
from querycoord.querymeta.records import loaded_record
from querycoord.task.assign import add_refs, fill_load_info, merge_by_size, segment_load_info


def populated(message: Message, seed: int = 1) -> Message:
    """Every field of ``message`` set to something other than its default (repeated ones with two values)."""
    for i, f in enumerate(message.DESCRIPTOR.fields, start=seed):
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == FieldDescriptor.LABEL_REPEATED
        if f.message_type is not None:
            cls = GetMessageClass(f.message_type)
            items = [populated(cls(), i), populated(cls(), i + 9)]
            if repeated:
                getattr(message, f.name).extend(items)
            else:
                getattr(message, f.name).CopyFrom(items[0])
            continue
        if f.type == FieldDescriptor.TYPE_STRING:
            values: list[object] = [f"{f.name}-{i}", f"{f.name}-{i}-b"]
        elif f.enum_type is not None:
            values = [f.enum_type.values[-1].number] * 2
        elif f.type == FieldDescriptor.TYPE_BOOL:
            values = [True, True]
        else:
            values = [1000 + i, 2000 + i]
        if repeated:
            getattr(message, f.name).extend(values)
        else:
            setattr(message, f.name, values[0])
    return message


def binlogs() -> data_pb2.SegmentBinlogs:
    b = populated(data_pb2.SegmentBinlogs())
    assert isinstance(b, data_pb2.SegmentBinlogs)
    return b


def test_a_load_info_carries_every_field_the_binlogs_share_with_it() -> None:
    b = binlogs()
    assert segment_load_info(b) == copy_fields(b, data_pb2.SegmentLoadInfo)
    assert fill_load_info(data_pb2.SegmentLoadInfo(), b) == copy_fields(b, data_pb2.SegmentLoadInfo)
    bare = data_pb2.SegmentBinlogs(segment_id=3, mem_size=10)
    assert segment_load_info(bare) == copy_fields(bare, data_pb2.SegmentLoadInfo)


def test_binlogs_and_their_load_info_have_one_wire_size() -> None:
    b = binlogs()
    assert b.ByteSize() == segment_load_info(b).ByteSize()
    many = [populated(data_pb2.SegmentBinlogs(), seed) for seed in range(1, 40)]
    sizes = [len(g) for g in merge_by_size(many, 1000)]
    assert sizes == [len(g) for g in merge_by_size([segment_load_info(x) for x in many], 1000)]  # type: ignore[arg-type]
    assert len(sizes) > 1


def test_the_loaded_record_is_the_keyword_built_one() -> None:
    for info in (segment_load_info(binlogs()), data_pb2.SegmentLoadInfo(segment_id=5, collection_id=1)):
        assert loaded_record(info, 7, 3) == data_pb2.SegmentInfo(
            segment_id=info.segment_id, collection_id=info.collection_id, partition_id=info.partition_id,
            node_id=7, replica_id=3, mem_size=info.mem_size, num_rows=info.num_rows,
            state=data_pb2.SEGMENT_STATE_SEALED, compaction_from=list(info.compaction_from),
            dm_channel=info.insert_channel)


async def test_a_child_loads_only_partitions_still_loaded_and_fills_paths_from_the_plan() -> None:
    from types import SimpleNamespace
    from typing import Any

    from proto import querycoord_pb2 as qc
    from proto import querynode_pb2
    from querycoord.task.children import LoadSegmentsTask

    saved: list[data_pb2.SegmentInfo] = []
    sent: list[querynode_pb2.LoadSegmentsRequest] = []

    class Meta:
        def has_partition(self, cid: int, pid: int) -> bool:
            return (cid, pid) == (1, 10)  # partition 11 was released after the plan

        async def save_loaded(self, infos: list[data_pb2.SegmentLoadInfo], node_id: int, replica_id: int) -> None:
            saved.extend(loaded_record(i, node_id, replica_id) for i in infos)

    planned = [data_pb2.SegmentBinlogs(segment_id=s, collection_id=1, partition_id=p, mem_size=5,
                                       binlog_paths=[f"log/{s}"], insert_channel="dml_0")
               for s, p in ((1, 10), (2, 11), (3, 10))]
    gate = asyncio.Semaphore(1)
    env: Any = SimpleNamespace(meta=Meta(), nodes=SimpleNamespace(is_online=lambda n: True), load_gate=lambda n: gate)
    req = querynode_pb2.LoadSegmentsRequest(collection_id=1, replica_id=4)
    add_refs(req.planned, planned)
    child = LoadSegmentsTask.new(env, req, trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=1,
                                 node_id=7)
    child.full_infos = list(planned)

    async def call(request: querynode_pb2.LoadSegmentsRequest) -> None:
        sent.append(request)

    child.call = call  # type: ignore[method-assign]
    await child.execute()
    # A plan of catalog binlogs sends them as planned (``sent_request``), the released partition's left out.
    assert not sent[0].infos
    assert [(b.segment_id, list(b.binlog_paths)) for b in sent[0].binlogs] == [(1, ["log/1"]), (3, ["log/3"])]
    assert [(s.segment_id, s.node_id, s.replica_id) for s in saved] == [(1, 7, 4), (3, 7, 4)]
    assert child.full_infos is None
    assert not child.request.infos and list(child.request.planned.segment_ids) == [1, 2, 3], \
        "the record keeps its references only"
    assert not sent[0].HasField("planned")


async def test_a_reloaded_child_sends_the_catalogs_records_of_its_references(kv: MetaKV) -> None:
    """After a reload a child has its record only: the referenced segments are read from the catalog again and
    sent as its binlogs, in the record's order; one that left the catalog (compacted away) is skipped. A record
    written before references existed (stripped infos) is reloaded the same way, its infos not sent."""
    from types import SimpleNamespace
    from typing import Any

    from proto import querycoord_pb2 as qc
    from proto import querynode_pb2
    from querycoord.catalog.broker import LocalBroker
    from querycoord.catalog.store import CatalogStore
    from querycoord.task.children import LoadSegmentsTask

    catalog = CatalogStore(kv)
    desc, seg_ids = await catalog.create_bulk_collection("reloaded", num_partitions=2, num_segments=6)
    cid = desc.collection_id
    by_id = {}
    for p in desc.partitions:
        _, found = await catalog.get_recovery_info(cid, p.partition_id)
        by_id.update({b.segment_id: b for b in found})
    order = [seg_ids[4], seg_ids[1], seg_ids[2]]  # not the catalog's order: the record's is kept
    gone = max(seg_ids) + 1000
    stripped_era = querynode_pb2.LoadSegmentsRequest(collection_id=cid, replica_id=4)
    for sid in order:
        stripped_era.infos.add(segment_id=sid, partition_id=by_id[sid].partition_id, collection_id=cid)
    stripped_era.infos.add(segment_id=gone, partition_id=by_id[order[0]].partition_id, collection_id=cid)
    with_refs = querynode_pb2.LoadSegmentsRequest(collection_id=cid, replica_id=4)
    add_refs(with_refs.planned, [*(by_id[s] for s in order),
                                 data_pb2.SegmentBinlogs(segment_id=gone, partition_id=by_id[order[0]].partition_id)])

    saved: list[int] = []

    class Meta:
        def has_partition(self, c: int, p: int) -> bool:
            return c == cid

        async def save_loaded(self, infos: list[Any], node_id: int, replica_id: int) -> None:
            saved.extend(i.segment_id for i in infos)

    gate = asyncio.Semaphore(1)
    env: Any = SimpleNamespace(meta=Meta(), broker=LocalBroker(catalog),
                               nodes=SimpleNamespace(is_online=lambda n: True), load_gate=lambda n: gate)
    for rec in (with_refs, stripped_era):
        sent: list[querynode_pb2.LoadSegmentsRequest] = []
        saved.clear()
        child = LoadSegmentsTask.new(env, rec, trigger_condition=qc.TRIGGER_CONDITION_GRPC_REQUEST, collection_id=cid,
                                     node_id=7)
        assert child.full_infos is None and child.segment_count() == 4

        async def call(request: querynode_pb2.LoadSegmentsRequest, sent: list[Any] = sent) -> None:
            sent.append(request)

        child.call = call  # type: ignore[method-assign]
        await child.execute()
        assert list(sent[0].binlogs) == [by_id[s] for s in order], "the catalog's records, paths included"
        assert not sent[0].infos and not sent[0].HasField("planned")
        assert saved == order
