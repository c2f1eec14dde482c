from proto import common_pb2 as _common_pb2
from proto import data_pb2 as _data_pb2
from proto import querycoord_pb2 as _querycoord_pb2
from proto import querynode_pb2 as _querynode_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HandoffSegmentsRequest(_message.Message):
    __slots__ = ("segment_infos",)
    SEGMENT_INFOS_FIELD_NUMBER: _ClassVar[int]
    segment_infos: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentInfo]
    def __init__(self, segment_infos: _Optional[_Iterable[_Union[_data_pb2.SegmentInfo, _Mapping]]] = ...) -> None: ...

class RepairRequest(_message.Message):
    __slots__ = ("missing_segments", "release_segments", "rewatch", "release_collection_on_nodes", "adopt", "forget_segment_ids", "reason", "release_dm_channels", "adopt_dm_channels")
    MISSING_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REWATCH_FIELD_NUMBER: _ClassVar[int]
    RELEASE_COLLECTION_ON_NODES_FIELD_NUMBER: _ClassVar[int]
    ADOPT_FIELD_NUMBER: _ClassVar[int]
    FORGET_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RELEASE_DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    ADOPT_DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    missing_segments: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentInfo]
    release_segments: _containers.RepeatedCompositeFieldContainer[NodeSegments]
    rewatch: _containers.RepeatedCompositeFieldContainer[_data_pb2.DmChannelWatchInfo]
    release_collection_on_nodes: _containers.RepeatedScalarFieldContainer[int]
    adopt: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentInfo]
    forget_segment_ids: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    release_dm_channels: _containers.RepeatedCompositeFieldContainer[NodeChannels]
    adopt_dm_channels: _containers.RepeatedCompositeFieldContainer[_data_pb2.DmChannelWatchInfo]
    def __init__(self, missing_segments: _Optional[_Iterable[_Union[_data_pb2.SegmentInfo, _Mapping]]] = ..., release_segments: _Optional[_Iterable[_Union[NodeSegments, _Mapping]]] = ..., rewatch: _Optional[_Iterable[_Union[_data_pb2.DmChannelWatchInfo, _Mapping]]] = ..., release_collection_on_nodes: _Optional[_Iterable[int]] = ..., adopt: _Optional[_Iterable[_Union[_data_pb2.SegmentInfo, _Mapping]]] = ..., forget_segment_ids: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., release_dm_channels: _Optional[_Iterable[_Union[NodeChannels, _Mapping]]] = ..., adopt_dm_channels: _Optional[_Iterable[_Union[_data_pb2.DmChannelWatchInfo, _Mapping]]] = ...) -> None: ...

class NodeSegments(_message.Message):
    __slots__ = ("node_id", "segment_ids")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[int] = ..., segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class NodeChannels(_message.Message):
    __slots__ = ("node_id", "channel_names")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[int] = ..., channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskRecord(_message.Message):
    __slots__ = ("id", "kind", "parent_id", "state", "retry_count", "trigger_condition", "excluded_node_ids", "node_id", "error", "error_code", "collection_id", "created_ms", "updated_ms", "replaces_task_id", "load_collection", "release_collection", "load_partitions", "release_partitions", "load_segments", "release_segments", "watch_dm_channels", "watch_delta_channels", "add_query_channel", "handoff", "load_balance", "release_collection_on_node", "release_partitions_on_node", "repair", "release_dm_channels", "update_load_config", "rehome_node")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_CONDITION_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    REPLACES_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_COLLECTION_FIELD_NUMBER: _ClassVar[int]
    RELEASE_COLLECTION_FIELD_NUMBER: _ClassVar[int]
    LOAD_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LOAD_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    WATCH_DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    WATCH_DELTA_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    ADD_QUERY_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_FIELD_NUMBER: _ClassVar[int]
    LOAD_BALANCE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_COLLECTION_ON_NODE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_PARTITIONS_ON_NODE_FIELD_NUMBER: _ClassVar[int]
    REPAIR_FIELD_NUMBER: _ClassVar[int]
    RELEASE_DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_LOAD_CONFIG_FIELD_NUMBER: _ClassVar[int]
    REHOME_NODE_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: _querycoord_pb2.TaskKind
    parent_id: int
    state: _querycoord_pb2.TaskState
    retry_count: int
    trigger_condition: _querycoord_pb2.TriggerCondition
    excluded_node_ids: _containers.RepeatedScalarFieldContainer[int]
    node_id: int
    error: str
    error_code: _common_pb2.ErrorCode
    collection_id: int
    created_ms: int
    updated_ms: int
    replaces_task_id: int
    load_collection: _querycoord_pb2.LoadCollectionRequest
    release_collection: _querycoord_pb2.ReleaseCollectionRequest
    load_partitions: _querycoord_pb2.LoadPartitionsRequest
    release_partitions: _querycoord_pb2.ReleasePartitionsRequest
    load_segments: _querynode_pb2.LoadSegmentsRequest
    release_segments: _querynode_pb2.ReleaseSegmentsRequest
    watch_dm_channels: _querynode_pb2.WatchDmChannelsRequest
    watch_delta_channels: _querynode_pb2.WatchDeltaChannelsRequest
    add_query_channel: _querynode_pb2.AddQueryChannelRequest
    handoff: HandoffSegmentsRequest
    load_balance: _querycoord_pb2.LoadBalanceRequest
    release_collection_on_node: _querynode_pb2.ReleaseCollectionRequest
    release_partitions_on_node: _querynode_pb2.ReleasePartitionsRequest
    repair: RepairRequest
    release_dm_channels: _querynode_pb2.ReleaseDmChannelsRequest
    update_load_config: ResizeReplicasRequest
    rehome_node: RehomeNodeRequest
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[_Union[_querycoord_pb2.TaskKind, str]] = ..., parent_id: _Optional[int] = ..., state: _Optional[_Union[_querycoord_pb2.TaskState, str]] = ..., retry_count: _Optional[int] = ..., trigger_condition: _Optional[_Union[_querycoord_pb2.TriggerCondition, str]] = ..., excluded_node_ids: _Optional[_Iterable[int]] = ..., node_id: _Optional[int] = ..., error: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., collection_id: _Optional[int] = ..., created_ms: _Optional[int] = ..., updated_ms: _Optional[int] = ..., replaces_task_id: _Optional[int] = ..., load_collection: _Optional[_Union[_querycoord_pb2.LoadCollectionRequest, _Mapping]] = ..., release_collection: _Optional[_Union[_querycoord_pb2.ReleaseCollectionRequest, _Mapping]] = ..., load_partitions: _Optional[_Union[_querycoord_pb2.LoadPartitionsRequest, _Mapping]] = ..., release_partitions: _Optional[_Union[_querycoord_pb2.ReleasePartitionsRequest, _Mapping]] = ..., load_segments: _Optional[_Union[_querynode_pb2.LoadSegmentsRequest, _Mapping]] = ..., release_segments: _Optional[_Union[_querynode_pb2.ReleaseSegmentsRequest, _Mapping]] = ..., watch_dm_channels: _Optional[_Union[_querynode_pb2.WatchDmChannelsRequest, _Mapping]] = ..., watch_delta_channels: _Optional[_Union[_querynode_pb2.WatchDeltaChannelsRequest, _Mapping]] = ..., add_query_channel: _Optional[_Union[_querynode_pb2.AddQueryChannelRequest, _Mapping]] = ..., handoff: _Optional[_Union[HandoffSegmentsRequest, _Mapping]] = ..., load_balance: _Optional[_Union[_querycoord_pb2.LoadBalanceRequest, _Mapping]] = ..., release_collection_on_node: _Optional[_Union[_querynode_pb2.ReleaseCollectionRequest, _Mapping]] = ..., release_partitions_on_node: _Optional[_Union[_querynode_pb2.ReleasePartitionsRequest, _Mapping]] = ..., repair: _Optional[_Union[RepairRequest, _Mapping]] = ..., release_dm_channels: _Optional[_Union[_querynode_pb2.ReleaseDmChannelsRequest, _Mapping]] = ..., update_load_config: _Optional[_Union[ResizeReplicasRequest, _Mapping]] = ..., rehome_node: _Optional[_Union[RehomeNodeRequest, _Mapping]] = ...) -> None: ...

class ResizeReplicasRequest(_message.Message):
    __slots__ = ("collection_id", "replica_number", "from_replica_number", "dropped_replica_ids", "dropped_node_ids", "rehomes")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    DROPPED_REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    REHOMES_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    replica_number: int
    from_replica_number: int
    dropped_replica_ids: _containers.RepeatedScalarFieldContainer[int]
    dropped_node_ids: _containers.RepeatedScalarFieldContainer[int]
    rehomes: _containers.RepeatedCompositeFieldContainer[RehomeNode]
    def __init__(self, collection_id: _Optional[int] = ..., replica_number: _Optional[int] = ..., from_replica_number: _Optional[int] = ..., dropped_replica_ids: _Optional[_Iterable[int]] = ..., dropped_node_ids: _Optional[_Iterable[int]] = ..., rehomes: _Optional[_Iterable[_Union[RehomeNode, _Mapping]]] = ...) -> None: ...

class RehomeNode(_message.Message):
    __slots__ = ("node_id", "from_replica_id", "to_replica_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TO_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    from_replica_id: int
    to_replica_id: int
    def __init__(self, node_id: _Optional[int] = ..., from_replica_id: _Optional[int] = ..., to_replica_id: _Optional[int] = ...) -> None: ...

class RehomeNodeRequest(_message.Message):
    __slots__ = ("collection_id", "move", "reason")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    MOVE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    move: RehomeNode
    reason: str
    def __init__(self, collection_id: _Optional[int] = ..., move: _Optional[_Union[RehomeNode, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...
