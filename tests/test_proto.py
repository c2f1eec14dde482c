"""The protocols: generated modules, persisted task records, services.

No etcd needed: these tests check the wire contracts every other part relies on
(the task store, the servicers, the reference node) and one real gRPC call on
loopback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# etcd3aio registers etcd's own protos (rpc.proto, kv.proto, auth.proto) in
# protobuf's default descriptor pool; importing it first proves ours do not clash.
import etcd3aio  # noqa: F401  (imported for its descriptor registrations)
import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.message import Message

from proto import (
    catalog_pb2,
    catalog_pb2_grpc,
    common_pb2,
    data_pb2,
    querycoord_pb2,
    querycoord_pb2_grpc,
    querynode_pb2,
    querynode_pb2_grpc,
    stream_pb2,  # noqa: F401  (registers proto/stream.proto, whatever else this run imported)
    task_pb2,
)
from querycoord.common.protocol import MUTATING_METHODS

PROTO_FILES = ["common", "data", "querycoord", "querynode", "catalog", "task", "stream"]

# service name -> (message module, grpc module, methods the issue asks for)
SERVICES = {
    "QueryCoord": (
        querycoord_pb2,
        querycoord_pb2_grpc,
        {
            "ShowCollections",
            "LoadCollection",
            "ReleaseCollection",
            "ShowPartitions",
            "LoadPartitions",
            "ReleasePartitions",
            "GetPartitionStates",
            "GetSegmentInfo",
            "GetReplicas",
            "LoadBalance",
            "GetComponentStates",
            "ListTasks",
            "GetTask",
            "ShowNodes",
            "Switchover",
            "StepBack",
            "GetCoordinatorState",
            "CheckHealth",
            "Explain",
            "CancelTask",
            "SuspendBalance",
            "ResumeBalance",
            "CheckBalanceStatus",
            "ListCheckers",
            "ActivateChecker",
            "DeactivateChecker",
            "CordonNode",
            "UncordonNode",
            "DrainNode",
            "UpdateLoadConfig",
        },
    ),
    "QueryNode": (
        querynode_pb2,
        querynode_pb2_grpc,
        # The calls that change what a node holds (stated once, in querycoord.common.protocol), and three reads.
        MUTATING_METHODS | {"GetSegmentInfo", "GetDataDistribution", "GetComponentStates"},
    ),
    "Catalog": (
        catalog_pb2,
        catalog_pb2_grpc,
        {
            "CreateCollection",
            "DropCollection",
            "DescribeCollection",
            "ShowCollections",
            "ShowPartitions",
            "AddSegments",
            "GetRecoveryInfo",
        },
    ),
}

K = querycoord_pb2.TaskKind


def _segment(seg: int, part: int = 11) -> data_pb2.SegmentLoadInfo:
    return data_pb2.SegmentLoadInfo(
        segment_id=seg,
        partition_id=part,
        collection_id=7,
        num_rows=1000 + seg,
        mem_size=1 << 20,
        binlog_paths=[f"files/7/{part}/{seg}/field_{f}/log_0" for f in range(4)],
        compaction_from=[seg - 1000, seg - 2000],
        insert_channel="dml-7-0",
        index_infos=[data_pb2.IndexInfo(field_id=101, index_id=5, index_name="ivf", index_file_paths=["i/1"])],
    )


def _channel(name: str) -> data_pb2.VChannelInfo:
    return data_pb2.VChannelInfo(
        collection_id=7,
        channel_name=name,
        seek_position=data_pb2.MsgPosition(channel_name=name, msg_id=b"\x01\x02", timestamp=42),
        unflushed_segment_ids=[900],
        flushed_segment_ids=[1, 2, 3],
    )


def _fenced() -> dict[str, object]:
    return {"fence": querynode_pb2.CoordFence(leader_revision=1234, coordinator_id=1), "node_id": 3, "task_id": 99}


# (kind, oneof field, a fully populated request): every kind, and both forms of
# the release kinds (trigger and per-node child).
RECORD_CASES: list[tuple[int, str, Message]] = [
    (K.TASK_KIND_LOAD_COLLECTION, "load_collection", querycoord_pb2.LoadCollectionRequest(collection_id=7)),
    (
        K.TASK_KIND_LOAD_COLLECTION,
        "load_collection",
        querycoord_pb2.LoadCollectionRequest(collection_id=7, replica_number=2),
    ),
    (K.TASK_KIND_RELEASE_COLLECTION, "release_collection", querycoord_pb2.ReleaseCollectionRequest(collection_id=7)),
    (
        K.TASK_KIND_RELEASE_COLLECTION,
        "release_collection_on_node",
        querynode_pb2.ReleaseCollectionRequest(collection_id=7, **_fenced()),
    ),
    (
        K.TASK_KIND_LOAD_PARTITION,
        "load_partitions",
        querycoord_pb2.LoadPartitionsRequest(collection_id=7, partition_ids=[11, 12]),
    ),
    (
        K.TASK_KIND_RELEASE_PARTITION,
        "release_partitions",
        querycoord_pb2.ReleasePartitionsRequest(collection_id=7, partition_ids=[11]),
    ),
    (
        K.TASK_KIND_RELEASE_PARTITION,
        "release_partitions_on_node",
        querynode_pb2.ReleasePartitionsRequest(collection_id=7, partition_ids=[11], **_fenced()),
    ),
    (
        K.TASK_KIND_LOAD_SEGMENT,
        "load_segments",
        querynode_pb2.LoadSegmentsRequest(
            collection_id=7,
            infos=[_segment(5001), _segment(5002, part=12)],
            source_node_id=2,
            load_type=data_pb2.LOAD_TYPE_COLLECTION,
            **_fenced(),
        ),
    ),
    (
        K.TASK_KIND_RELEASE_SEGMENT,
        "release_segments",
        querynode_pb2.ReleaseSegmentsRequest(collection_id=7, partition_ids=[11], segment_ids=[1, 2], **_fenced()),
    ),
    (
        K.TASK_KIND_WATCH_DM_CHANNEL,
        "watch_dm_channels",
        querynode_pb2.WatchDmChannelsRequest(
            collection_id=7,
            partition_ids=[11],
            infos=[_channel("dml-7-0")],
            load_type=data_pb2.LOAD_TYPE_PARTITION,
            **_fenced(),
        ),
    ),
    (
        K.TASK_KIND_WATCH_DELTA_CHANNEL,
        "watch_delta_channels",
        querynode_pb2.WatchDeltaChannelsRequest(collection_id=7, infos=[_channel("delta-7-0")], **_fenced()),
    ),
    (
        K.TASK_KIND_WATCH_QUERY_CHANNEL,
        "add_query_channel",
        querynode_pb2.AddQueryChannelRequest(
            collection_id=7,
            query_channel="query-7",
            query_result_channel="query-result-7",
            seek_position=data_pb2.MsgPosition(channel_name="query-7", timestamp=9),
            **_fenced(),
        ),
    ),
    (
        K.TASK_KIND_HANDOFF,
        "handoff",
        task_pb2.HandoffSegmentsRequest(
            segment_infos=[
                data_pb2.SegmentInfo(
                    segment_id=6000,
                    collection_id=7,
                    partition_id=11,
                    num_rows=10,
                    mem_size=100,
                    state=data_pb2.SEGMENT_STATE_SEALED,
                    compaction_from=[5001, 5002],
                )
            ]
        ),
    ),
    (
        K.TASK_KIND_LOAD_BALANCE,
        "load_balance",
        querycoord_pb2.LoadBalanceRequest(
            source_node_ids=[3],
            dst_node_ids=[4, 5],
            sealed_segment_ids=[5001],
            reason=querycoord_pb2.BALANCE_REASON_NODE_DOWN,
        ),
    ),
    (
        K.TASK_KIND_REPAIR,
        "repair",
        task_pb2.RepairRequest(
            missing_segments=[data_pb2.SegmentInfo(segment_id=5001, collection_id=7, partition_id=11, node_id=3)],
            release_segments=[task_pb2.NodeSegments(node_id=4, segment_ids=[5002])],
            release_dm_channels=[task_pb2.NodeChannels(node_id=5, channel_names=["dml-7-0"])],
            adopt_dm_channels=[data_pb2.DmChannelWatchInfo(collection_id=7, dm_channel="dml-7-1", node_id=4,
                                                           replica_id=2)],
            reason="1 segments held by no node",
        ),
    ),
    (
        K.TASK_KIND_RELEASE_DM_CHANNEL,
        "release_dm_channels",
        querynode_pb2.ReleaseDmChannelsRequest(collection_id=7, channel_names=["dml-7-0"], **_fenced()),
    ),
    (
        K.TASK_KIND_UPDATE_LOAD_CONFIG,
        "update_load_config",
        task_pb2.ResizeReplicasRequest(collection_id=7, replica_number=1, from_replica_number=3,
                                       dropped_replica_ids=[21, 22], dropped_node_ids=[4, 5],
                                       rehomes=[task_pb2.RehomeNode(node_id=4, from_replica_id=21)]),
    ),
    (
        K.TASK_KIND_REHOME_NODE,
        "rehome_node",
        task_pb2.RehomeNodeRequest(collection_id=7, move=task_pb2.RehomeNode(node_id=4, from_replica_id=21,
                                                                            to_replica_id=22),
                                   reason="drain of node 5"),
    ),
]


# Oneof cases that hold a trigger's request (parent_id 0); the others are children.
TRIGGER_FIELDS = {
    "load_collection",
    "release_collection",
    "load_partitions",
    "release_partitions",
    "handoff",
    "load_balance",
    "repair",
    "update_load_config",
    "rehome_node",
}


def test_generated_modules_import_with_etcd3aio_in_either_order(project_root: Path) -> None:
    """Importing ours before or after etcd3aio must not raise a descriptor-pool clash."""
    ours = "; ".join(f"import proto.{name}_pb2, proto.{name}_pb2_grpc" for name in PROTO_FILES)
    for code in (f"import etcd3aio; {ours}", f"{ours}; import etcd3aio"):
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=project_root, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr


def test_files_are_registered_under_proto_names() -> None:
    pool = descriptor_pool.Default()
    for name in PROTO_FILES:
        fd = pool.FindFileByName(f"proto/{name}.proto")
        assert fd.package.startswith("querycoord.")
        assert not fd.name.endswith(("/rpc.proto", "/kv.proto", "/auth.proto"))
    assert sorted(p.stem for p in Path(__file__).resolve().parent.parent.joinpath("proto").glob("*.proto")) == sorted(
        PROTO_FILES
    )


def test_record_cases_cover_every_kind_and_request() -> None:
    kinds = {v.number for v in querycoord_pb2.TaskKind.DESCRIPTOR.values} - {K.TASK_KIND_UNSPECIFIED}
    assert kinds == {kind for kind, _, _ in RECORD_CASES}
    assert len(kinds) == 15
    oneof = task_pb2.TaskRecord.DESCRIPTOR.oneofs_by_name["request"]
    assert {f.name for f in oneof.fields} == {field for _, field, _ in RECORD_CASES}
    # each case's request is of the type its oneof field declares
    for _, field, request in RECORD_CASES:
        assert oneof.containing_type.fields_by_name[field].message_type is request.DESCRIPTOR


@pytest.mark.parametrize(
    ("kind", "field", "request_msg"), RECORD_CASES, ids=[f"{K.Name(k)}-{f}" for k, f, _ in RECORD_CASES]
)
def test_task_record_round_trip(kind: int, field: str, request_msg: Message) -> None:
    is_trigger = field in TRIGGER_FIELDS
    record = task_pb2.TaskRecord(
        id=1_000_123,
        kind=kind,
        parent_id=0 if is_trigger else 1_000_001,
        state=querycoord_pb2.TASK_STATE_DOING,
        retry_count=2,
        trigger_condition=querycoord_pb2.TRIGGER_CONDITION_NODE_DOWN,
        excluded_node_ids=[1, 2],
        node_id=0 if is_trigger else 3,
        error="node 2: connection refused",
        error_code=common_pb2.NO_AVAILABLE_NODE,
        collection_id=7,
        created_ms=1_700_000_000_000,
        updated_ms=1_700_000_000_500,
        replaces_task_id=0 if is_trigger else 1_000_100,
        **{field: request_msg},
    )
    blob = record.SerializeToString()
    back = task_pb2.TaskRecord.FromString(blob)
    assert back == record
    assert back.kind == kind
    assert back.WhichOneof("request") == field
    assert getattr(back, field) == request_msg
    assert back.SerializeToString() == blob


def test_task_state_and_trigger_numbers_are_milvus_numbers() -> None:
    assert querycoord_pb2.TaskState.items() == [
        ("TASK_STATE_UNDO", 0),
        ("TASK_STATE_DOING", 1),
        ("TASK_STATE_DONE", 3),
        ("TASK_STATE_EXPIRED", 4),
        ("TASK_STATE_FAILED", 5),
        ("TASK_STATE_CANCELLED", 6),  # ours: a trigger CancelTask cancelled
    ]
    # priority order is numeric order
    t = querycoord_pb2.TriggerCondition
    assert (
        t.Value("TRIGGER_CONDITION_NODE_DOWN")
        > t.Value("TRIGGER_CONDITION_GRPC_REQUEST")
        > t.Value("TRIGGER_CONDITION_LOAD_BALANCE")
        > t.Value("TRIGGER_CONDITION_HANDOFF")
        > 0
    )


def test_stripped_load_record_stays_small() -> None:
    """The fields marked [stripped] carry the bulk; without them a child costs tens of bytes a segment."""
    full = querynode_pb2.LoadSegmentsRequest(
        collection_id=7, infos=[_segment(10_000 + i) for i in range(1000)], **_fenced()
    )
    stripped = task_pb2.TaskRecord(id=1, kind=K.TASK_KIND_LOAD_SEGMENT, parent_id=2, node_id=3)
    stripped.load_segments.CopyFrom(full)
    stripped.load_segments.ClearField("fence")
    for info in stripped.load_segments.infos:
        info.ClearField("binlog_paths")
        for index in info.index_infos:
            index.ClearField("index_file_paths")
    assert stripped.ByteSize() < 64 * 1000
    assert full.ByteSize() > 3 * stripped.ByteSize()
    channel = _channel("dml-7-0")
    channel.ClearField("flushed_segment_ids")
    channel.ClearField("dropped_segment_ids")
    assert channel.seek_position.timestamp == 42


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_service_has_servicer_stub_and_methods(service: str) -> None:
    pb2, pb2_grpc, methods = SERVICES[service]
    assert isinstance(getattr(pb2_grpc, f"{service}Servicer"), type)
    assert isinstance(getattr(pb2_grpc, f"{service}Stub"), type)
    assert callable(getattr(pb2_grpc, f"add_{service}Servicer_to_server"))
    desc = pb2.DESCRIPTOR.services_by_name[service]
    assert {m.name for m in desc.methods} == methods
    for name in methods:
        assert hasattr(getattr(pb2_grpc, f"{service}Servicer"), name)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_response_carries_status(service: str) -> None:
    pb2, _, _ = SERVICES[service]
    for method in pb2.DESCRIPTOR.services_by_name[service].methods:
        status = method.output_type.fields_by_name.get("status")
        assert status is not None, f"{method.full_name} answers without status"
        assert status.message_type is common_pb2.Status.DESCRIPTOR


def test_node_requests_carry_fence_node_and_task_id() -> None:
    for method in querynode_pb2.DESCRIPTOR.services_by_name["QueryNode"].methods:
        if method.name == "GetComponentStates":
            continue
        fields = method.input_type.fields_by_name
        assert fields["fence"].number == 1, method.name
        assert fields["fence"].message_type is querynode_pb2.CoordFence.DESCRIPTOR
        assert (fields["node_id"].number, fields["task_id"].number) == (2, 3), method.name


class _HealthyCoord(querycoord_pb2_grpc.QueryCoordServicer):
    async def GetComponentStates(
        self, request: querycoord_pb2.GetComponentStatesRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ComponentStates:
        return common_pb2.ComponentStates(
            state=common_pb2.ComponentInfo(node_id=7, role="querycoord", state_code=common_pb2.HEALTHY),
            status=common_pb2.Status(error_code=common_pb2.SUCCESS),
        )


async def test_query_coord_get_component_states_over_loopback() -> None:
    server = grpc.aio.server()
    querycoord_pb2_grpc.add_QueryCoordServicer_to_server(_HealthyCoord(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_http_proxy", 0)]) as channel:
            stub = querycoord_pb2_grpc.QueryCoordStub(channel)
            reply = await stub.GetComponentStates(querycoord_pb2.GetComponentStatesRequest(), timeout=10)
            assert reply.status.error_code == common_pb2.SUCCESS
            assert (reply.state.node_id, reply.state.role, reply.state.state_code) == (
                7,
                "querycoord",
                common_pb2.HEALTHY,
            )
            # A method the servicer does not implement is a transport error, not a hang.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetTask(querycoord_pb2.GetTaskRequest(task_id=1), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(None)
