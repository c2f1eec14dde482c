from proto import common_pb2 as _common_pb2
from proto import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_UNSPECIFIED: _ClassVar[TaskKind]
    TASK_KIND_LOAD_COLLECTION: _ClassVar[TaskKind]
    TASK_KIND_RELEASE_COLLECTION: _ClassVar[TaskKind]
    TASK_KIND_LOAD_PARTITION: _ClassVar[TaskKind]
    TASK_KIND_RELEASE_PARTITION: _ClassVar[TaskKind]
    TASK_KIND_LOAD_SEGMENT: _ClassVar[TaskKind]
    TASK_KIND_RELEASE_SEGMENT: _ClassVar[TaskKind]
    TASK_KIND_WATCH_DM_CHANNEL: _ClassVar[TaskKind]
    TASK_KIND_WATCH_DELTA_CHANNEL: _ClassVar[TaskKind]
    TASK_KIND_WATCH_QUERY_CHANNEL: _ClassVar[TaskKind]
    TASK_KIND_HANDOFF: _ClassVar[TaskKind]
    TASK_KIND_LOAD_BALANCE: _ClassVar[TaskKind]
    TASK_KIND_REPAIR: _ClassVar[TaskKind]
    TASK_KIND_RELEASE_DM_CHANNEL: _ClassVar[TaskKind]
    TASK_KIND_UPDATE_LOAD_CONFIG: _ClassVar[TaskKind]
    TASK_KIND_REHOME_NODE: _ClassVar[TaskKind]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNDO: _ClassVar[TaskState]
    TASK_STATE_DOING: _ClassVar[TaskState]
    TASK_STATE_DONE: _ClassVar[TaskState]
    TASK_STATE_EXPIRED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_CANCELLED: _ClassVar[TaskState]

class TriggerCondition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRIGGER_CONDITION_UNSPECIFIED: _ClassVar[TriggerCondition]
    TRIGGER_CONDITION_HANDOFF: _ClassVar[TriggerCondition]
    TRIGGER_CONDITION_LOAD_BALANCE: _ClassVar[TriggerCondition]
    TRIGGER_CONDITION_GRPC_REQUEST: _ClassVar[TriggerCondition]
    TRIGGER_CONDITION_NODE_DOWN: _ClassVar[TriggerCondition]
    TRIGGER_CONDITION_CHECKER: _ClassVar[TriggerCondition]

class BalanceReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BALANCE_REASON_UNSPECIFIED: _ClassVar[BalanceReason]
    BALANCE_REASON_USER: _ClassVar[BalanceReason]
    BALANCE_REASON_NODE_DOWN: _ClassVar[BalanceReason]
    BALANCE_REASON_AUTO: _ClassVar[BalanceReason]
    BALANCE_REASON_DRAIN: _ClassVar[BalanceReason]

class WaitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_KIND_UNSPECIFIED: _ClassVar[WaitKind]
    WAIT_KIND_COLLECTION: _ClassVar[WaitKind]
    WAIT_KIND_SLOT: _ClassVar[WaitKind]
    WAIT_KIND_PLANNING: _ClassVar[WaitKind]
    WAIT_KIND_CHILD: _ClassVar[WaitKind]
    WAIT_KIND_RETRY: _ClassVar[WaitKind]
    WAIT_KIND_NODES: _ClassVar[WaitKind]
    WAIT_KIND_SPACE: _ClassVar[WaitKind]
    WAIT_KIND_THROTTLED: _ClassVar[WaitKind]

class HealthState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_STATE_UNSPECIFIED: _ClassVar[HealthState]
    HEALTH_STATE_GREEN: _ClassVar[HealthState]
    HEALTH_STATE_YELLOW: _ClassVar[HealthState]
    HEALTH_STATE_RED: _ClassVar[HealthState]

class ExplainReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPLAIN_REASON_UNSPECIFIED: _ClassVar[ExplainReason]
    EXPLAIN_REASON_TRIGGER: _ClassVar[ExplainReason]
    EXPLAIN_REASON_RETRYING: _ClassVar[ExplainReason]
    EXPLAIN_REASON_NO_NODE: _ClassVar[ExplainReason]
    EXPLAIN_REASON_NO_ROOM: _ClassVar[ExplainReason]
    EXPLAIN_REASON_WAITING_FOR_NODE: _ClassVar[ExplainReason]
    EXPLAIN_REASON_CHECKER: _ClassVar[ExplainReason]

class NodeLifecycle(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_LIFECYCLE_ACTIVE: _ClassVar[NodeLifecycle]
    NODE_LIFECYCLE_CORDONED: _ClassVar[NodeLifecycle]
    NODE_LIFECYCLE_DRAINING: _ClassVar[NodeLifecycle]
    NODE_LIFECYCLE_DRAINED: _ClassVar[NodeLifecycle]
TASK_KIND_UNSPECIFIED: TaskKind
TASK_KIND_LOAD_COLLECTION: TaskKind
TASK_KIND_RELEASE_COLLECTION: TaskKind
TASK_KIND_LOAD_PARTITION: TaskKind
TASK_KIND_RELEASE_PARTITION: TaskKind
TASK_KIND_LOAD_SEGMENT: TaskKind
TASK_KIND_RELEASE_SEGMENT: TaskKind
TASK_KIND_WATCH_DM_CHANNEL: TaskKind
TASK_KIND_WATCH_DELTA_CHANNEL: TaskKind
TASK_KIND_WATCH_QUERY_CHANNEL: TaskKind
TASK_KIND_HANDOFF: TaskKind
TASK_KIND_LOAD_BALANCE: TaskKind
TASK_KIND_REPAIR: TaskKind
TASK_KIND_RELEASE_DM_CHANNEL: TaskKind
TASK_KIND_UPDATE_LOAD_CONFIG: TaskKind
TASK_KIND_REHOME_NODE: TaskKind
TASK_STATE_UNDO: TaskState
TASK_STATE_DOING: TaskState
TASK_STATE_DONE: TaskState
TASK_STATE_EXPIRED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_CANCELLED: TaskState
TRIGGER_CONDITION_UNSPECIFIED: TriggerCondition
TRIGGER_CONDITION_HANDOFF: TriggerCondition
TRIGGER_CONDITION_LOAD_BALANCE: TriggerCondition
TRIGGER_CONDITION_GRPC_REQUEST: TriggerCondition
TRIGGER_CONDITION_NODE_DOWN: TriggerCondition
TRIGGER_CONDITION_CHECKER: TriggerCondition
BALANCE_REASON_UNSPECIFIED: BalanceReason
BALANCE_REASON_USER: BalanceReason
BALANCE_REASON_NODE_DOWN: BalanceReason
BALANCE_REASON_AUTO: BalanceReason
BALANCE_REASON_DRAIN: BalanceReason
WAIT_KIND_UNSPECIFIED: WaitKind
WAIT_KIND_COLLECTION: WaitKind
WAIT_KIND_SLOT: WaitKind
WAIT_KIND_PLANNING: WaitKind
WAIT_KIND_CHILD: WaitKind
WAIT_KIND_RETRY: WaitKind
WAIT_KIND_NODES: WaitKind
WAIT_KIND_SPACE: WaitKind
WAIT_KIND_THROTTLED: WaitKind
HEALTH_STATE_UNSPECIFIED: HealthState
HEALTH_STATE_GREEN: HealthState
HEALTH_STATE_YELLOW: HealthState
HEALTH_STATE_RED: HealthState
EXPLAIN_REASON_UNSPECIFIED: ExplainReason
EXPLAIN_REASON_TRIGGER: ExplainReason
EXPLAIN_REASON_RETRYING: ExplainReason
EXPLAIN_REASON_NO_NODE: ExplainReason
EXPLAIN_REASON_NO_ROOM: ExplainReason
EXPLAIN_REASON_WAITING_FOR_NODE: ExplainReason
EXPLAIN_REASON_CHECKER: ExplainReason
NODE_LIFECYCLE_ACTIVE: NodeLifecycle
NODE_LIFECYCLE_CORDONED: NodeLifecycle
NODE_LIFECYCLE_DRAINING: NodeLifecycle
NODE_LIFECYCLE_DRAINED: NodeLifecycle

class TaskInfo(_message.Message):
    __slots__ = ("task_id", "kind", "state", "trigger_condition", "node_id", "retry_count", "error", "error_code", "collection_id", "parent_id", "created_ms", "updated_ms", "excluded_node_ids", "summary", "replaces_task_id", "started_ms", "finished_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_CONDITION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_MS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    REPLACES_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    kind: TaskKind
    state: TaskState
    trigger_condition: TriggerCondition
    node_id: int
    retry_count: int
    error: str
    error_code: _common_pb2.ErrorCode
    collection_id: int
    parent_id: int
    created_ms: int
    updated_ms: int
    excluded_node_ids: _containers.RepeatedScalarFieldContainer[int]
    summary: str
    replaces_task_id: int
    started_ms: int
    finished_ms: int
    def __init__(self, task_id: _Optional[int] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., state: _Optional[_Union[TaskState, str]] = ..., trigger_condition: _Optional[_Union[TriggerCondition, str]] = ..., node_id: _Optional[int] = ..., retry_count: _Optional[int] = ..., error: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., collection_id: _Optional[int] = ..., parent_id: _Optional[int] = ..., created_ms: _Optional[int] = ..., updated_ms: _Optional[int] = ..., excluded_node_ids: _Optional[_Iterable[int]] = ..., summary: _Optional[str] = ..., replaces_task_id: _Optional[int] = ..., started_ms: _Optional[int] = ..., finished_ms: _Optional[int] = ...) -> None: ...

class TaskWait(_message.Message):
    __slots__ = ("kind", "text", "since_ms", "until_ms", "child_task_id", "node_id", "attempt", "error", "blocking_task_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    CHILD_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    kind: WaitKind
    text: str
    since_ms: int
    until_ms: int
    child_task_id: int
    node_id: int
    attempt: int
    error: str
    blocking_task_id: int
    def __init__(self, kind: _Optional[_Union[WaitKind, str]] = ..., text: _Optional[str] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., child_task_id: _Optional[int] = ..., node_id: _Optional[int] = ..., attempt: _Optional[int] = ..., error: _Optional[str] = ..., blocking_task_id: _Optional[int] = ...) -> None: ...

class ChildStateCounts(_message.Message):
    __slots__ = ("total", "undo", "doing", "done", "expired", "failed")
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    UNDO_FIELD_NUMBER: _ClassVar[int]
    DOING_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    total: int
    undo: int
    doing: int
    done: int
    expired: int
    failed: int
    def __init__(self, total: _Optional[int] = ..., undo: _Optional[int] = ..., doing: _Optional[int] = ..., done: _Optional[int] = ..., expired: _Optional[int] = ..., failed: _Optional[int] = ...) -> None: ...

class TaskTree(_message.Message):
    __slots__ = ("trigger", "children", "child_counts", "waits")
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    CHILD_COUNTS_FIELD_NUMBER: _ClassVar[int]
    WAITS_FIELD_NUMBER: _ClassVar[int]
    trigger: TaskInfo
    children: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    child_counts: ChildStateCounts
    waits: _containers.RepeatedCompositeFieldContainer[TaskWait]
    def __init__(self, trigger: _Optional[_Union[TaskInfo, _Mapping]] = ..., children: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., child_counts: _Optional[_Union[ChildStateCounts, _Mapping]] = ..., waits: _Optional[_Iterable[_Union[TaskWait, _Mapping]]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("collection_id", "states", "include_children", "include_finished", "limit", "after_task_id", "children_limit", "newest_first")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CHILDREN_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    states: _containers.RepeatedScalarFieldContainer[TaskState]
    include_children: bool
    include_finished: bool
    limit: int
    after_task_id: int
    children_limit: int
    newest_first: bool
    def __init__(self, collection_id: _Optional[int] = ..., states: _Optional[_Iterable[_Union[TaskState, str]]] = ..., include_children: _Optional[bool] = ..., include_finished: _Optional[bool] = ..., limit: _Optional[int] = ..., after_task_id: _Optional[int] = ..., children_limit: _Optional[int] = ..., newest_first: _Optional[bool] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("status", "trees", "next_after_task_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TREES_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    trees: _containers.RepeatedCompositeFieldContainer[TaskTree]
    next_after_task_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., trees: _Optional[_Iterable[_Union[TaskTree, _Mapping]]] = ..., next_after_task_id: _Optional[int] = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("task_id", "children_limit")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    children_limit: int
    def __init__(self, task_id: _Optional[int] = ..., children_limit: _Optional[int] = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("status", "tree")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    tree: TaskTree
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., tree: _Optional[_Union[TaskTree, _Mapping]] = ...) -> None: ...

class ShowCollectionsRequest(_message.Message):
    __slots__ = ("collection_ids",)
    COLLECTION_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ShowCollectionsResponse(_message.Message):
    __slots__ = ("status", "collections")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    collections: _containers.RepeatedCompositeFieldContainer[_data_pb2.CollectionLoadInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., collections: _Optional[_Iterable[_Union[_data_pb2.CollectionLoadInfo, _Mapping]]] = ...) -> None: ...

class LoadCollectionRequest(_message.Message):
    __slots__ = ("collection_id", "replica_number")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    replica_number: int
    def __init__(self, collection_id: _Optional[int] = ..., replica_number: _Optional[int] = ...) -> None: ...

class LoadCollectionResponse(_message.Message):
    __slots__ = ("status", "task_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task_id: _Optional[int] = ...) -> None: ...

class ReleaseCollectionRequest(_message.Message):
    __slots__ = ("collection_id",)
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    def __init__(self, collection_id: _Optional[int] = ...) -> None: ...

class ReleaseCollectionResponse(_message.Message):
    __slots__ = ("status", "task_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task_id: _Optional[int] = ...) -> None: ...

class ShowPartitionsRequest(_message.Message):
    __slots__ = ("collection_id", "partition_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ShowPartitionsResponse(_message.Message):
    __slots__ = ("status", "partitions")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    partitions: _containers.RepeatedCompositeFieldContainer[_data_pb2.PartitionLoadInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[_data_pb2.PartitionLoadInfo, _Mapping]]] = ...) -> None: ...

class LoadPartitionsRequest(_message.Message):
    __slots__ = ("collection_id", "partition_ids", "replica_number")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    replica_number: int
    def __init__(self, collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ..., replica_number: _Optional[int] = ...) -> None: ...

class LoadPartitionsResponse(_message.Message):
    __slots__ = ("status", "task_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task_id: _Optional[int] = ...) -> None: ...

class ReleasePartitionsRequest(_message.Message):
    __slots__ = ("collection_id", "partition_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleasePartitionsResponse(_message.Message):
    __slots__ = ("status", "task_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task_id: _Optional[int] = ...) -> None: ...

class GetPartitionStatesRequest(_message.Message):
    __slots__ = ("collection_id", "partition_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetPartitionStatesResponse(_message.Message):
    __slots__ = ("status", "partition_descriptions")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_DESCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    partition_descriptions: _containers.RepeatedCompositeFieldContainer[_data_pb2.PartitionLoadInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., partition_descriptions: _Optional[_Iterable[_Union[_data_pb2.PartitionLoadInfo, _Mapping]]] = ...) -> None: ...

class GetSegmentInfoRequest(_message.Message):
    __slots__ = ("segment_ids", "collection_id")
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    collection_id: int
    def __init__(self, segment_ids: _Optional[_Iterable[int]] = ..., collection_id: _Optional[int] = ...) -> None: ...

class GetSegmentInfoResponse(_message.Message):
    __slots__ = ("status", "infos")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    infos: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., infos: _Optional[_Iterable[_Union[_data_pb2.SegmentInfo, _Mapping]]] = ...) -> None: ...

class GetReplicasRequest(_message.Message):
    __slots__ = ("collection_id",)
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    def __init__(self, collection_id: _Optional[int] = ...) -> None: ...

class GetReplicasResponse(_message.Message):
    __slots__ = ("status", "replicas")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    replicas: _containers.RepeatedCompositeFieldContainer[_data_pb2.ReplicaInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[_data_pb2.ReplicaInfo, _Mapping]]] = ...) -> None: ...

class LoadBalanceRequest(_message.Message):
    __slots__ = ("source_node_ids", "dst_node_ids", "sealed_segment_ids", "reason", "collection_id")
    SOURCE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    DST_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    SEALED_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    source_node_ids: _containers.RepeatedScalarFieldContainer[int]
    dst_node_ids: _containers.RepeatedScalarFieldContainer[int]
    sealed_segment_ids: _containers.RepeatedScalarFieldContainer[int]
    reason: BalanceReason
    collection_id: int
    def __init__(self, source_node_ids: _Optional[_Iterable[int]] = ..., dst_node_ids: _Optional[_Iterable[int]] = ..., sealed_segment_ids: _Optional[_Iterable[int]] = ..., reason: _Optional[_Union[BalanceReason, str]] = ..., collection_id: _Optional[int] = ...) -> None: ...

class LoadBalanceResponse(_message.Message):
    __slots__ = ("status", "task_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task_id: _Optional[int] = ...) -> None: ...

class GetComponentStatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShowNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node_id", "address", "state", "memory_capacity", "memory_used", "segment_count", "dm_channel_count", "lifecycle", "drain", "rereplicate_at_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    DM_CHANNEL_COUNT_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    REREPLICATE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    address: str
    state: str
    memory_capacity: int
    memory_used: int
    segment_count: int
    dm_channel_count: int
    lifecycle: NodeLifecycle
    drain: DrainProgress
    rereplicate_at_ms: int
    def __init__(self, node_id: _Optional[int] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., memory_capacity: _Optional[int] = ..., memory_used: _Optional[int] = ..., segment_count: _Optional[int] = ..., dm_channel_count: _Optional[int] = ..., lifecycle: _Optional[_Union[NodeLifecycle, str]] = ..., drain: _Optional[_Union[DrainProgress, _Mapping]] = ..., rereplicate_at_ms: _Optional[int] = ...) -> None: ...

class ShowNodesResponse(_message.Message):
    __slots__ = ("status", "nodes")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class SwitchoverRequest(_message.Message):
    __slots__ = ("target",)
    TARGET_FIELD_NUMBER: _ClassVar[int]
    target: str
    def __init__(self, target: _Optional[str] = ...) -> None: ...

class SwitchoverResponse(_message.Message):
    __slots__ = ("status", "previous_leader", "leader", "stepped_back", "handover_seconds")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    STEPPED_BACK_FIELD_NUMBER: _ClassVar[int]
    HANDOVER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    previous_leader: str
    leader: str
    stepped_back: _containers.RepeatedScalarFieldContainer[str]
    handover_seconds: float
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., previous_leader: _Optional[str] = ..., leader: _Optional[str] = ..., stepped_back: _Optional[_Iterable[str]] = ..., handover_seconds: _Optional[float] = ...) -> None: ...

class StepBackRequest(_message.Message):
    __slots__ = ("requested_by",)
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    requested_by: str
    def __init__(self, requested_by: _Optional[str] = ...) -> None: ...

class StepBackResponse(_message.Message):
    __slots__ = ("status", "election_revision")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_REVISION_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    election_revision: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., election_revision: _Optional[int] = ...) -> None: ...

class GetCoordinatorStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckHealthRequest(_message.Message):
    __slots__ = ("collection_ids",)
    COLLECTION_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplicaHealth(_message.Message):
    __slots__ = ("replica_id", "percentage", "whole", "segments", "missing_segments", "channels", "missing_channels", "online_node_ids", "offline_node_ids")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MISSING_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MISSING_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    ONLINE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    percentage: int
    whole: bool
    segments: int
    missing_segments: int
    channels: int
    missing_channels: _containers.RepeatedScalarFieldContainer[str]
    online_node_ids: _containers.RepeatedScalarFieldContainer[int]
    offline_node_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[int] = ..., percentage: _Optional[int] = ..., whole: _Optional[bool] = ..., segments: _Optional[int] = ..., missing_segments: _Optional[int] = ..., channels: _Optional[int] = ..., missing_channels: _Optional[_Iterable[str]] = ..., online_node_ids: _Optional[_Iterable[int]] = ..., offline_node_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectionHealth(_message.Message):
    __slots__ = ("collection_id", "name", "state", "percentage", "replicas", "unserved_segments", "unserved_channels", "missing")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    UNSERVED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    UNSERVED_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    name: str
    state: HealthState
    percentage: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaHealth]
    unserved_segments: int
    unserved_channels: int
    missing: str
    def __init__(self, collection_id: _Optional[int] = ..., name: _Optional[str] = ..., state: _Optional[_Union[HealthState, str]] = ..., percentage: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaHealth, _Mapping]]] = ..., unserved_segments: _Optional[int] = ..., unserved_channels: _Optional[int] = ..., missing: _Optional[str] = ...) -> None: ...

class CheckHealthResponse(_message.Message):
    __slots__ = ("status", "collections", "state")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    collections: _containers.RepeatedCompositeFieldContainer[CollectionHealth]
    state: HealthState
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., collections: _Optional[_Iterable[_Union[CollectionHealth, _Mapping]]] = ..., state: _Optional[_Union[HealthState, str]] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("collection_id", "collection_name", "segment_limit")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_NAME_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    collection_name: str
    segment_limit: int
    def __init__(self, collection_id: _Optional[int] = ..., collection_name: _Optional[str] = ..., segment_limit: _Optional[int] = ...) -> None: ...

class ExplainUnit(_message.Message):
    __slots__ = ("replica_id", "segment_ids", "missing_segments", "missing_channels", "reason", "reason_text", "next", "since_ms", "task_id", "child_task_id", "node_id", "error", "retry_count", "short_bytes", "room_bytes", "online_node_ids", "offline_node_ids")
    class RoomBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    MISSING_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MISSING_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_TEXT_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHILD_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RETRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    SHORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROOM_BYTES_FIELD_NUMBER: _ClassVar[int]
    ONLINE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    missing_segments: int
    missing_channels: _containers.RepeatedScalarFieldContainer[str]
    reason: ExplainReason
    reason_text: str
    next: str
    since_ms: int
    task_id: int
    child_task_id: int
    node_id: int
    error: str
    retry_count: int
    short_bytes: int
    room_bytes: _containers.ScalarMap[int, int]
    online_node_ids: _containers.RepeatedScalarFieldContainer[int]
    offline_node_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[int] = ..., segment_ids: _Optional[_Iterable[int]] = ..., missing_segments: _Optional[int] = ..., missing_channels: _Optional[_Iterable[str]] = ..., reason: _Optional[_Union[ExplainReason, str]] = ..., reason_text: _Optional[str] = ..., next: _Optional[str] = ..., since_ms: _Optional[int] = ..., task_id: _Optional[int] = ..., child_task_id: _Optional[int] = ..., node_id: _Optional[int] = ..., error: _Optional[str] = ..., retry_count: _Optional[int] = ..., short_bytes: _Optional[int] = ..., room_bytes: _Optional[_Mapping[int, int]] = ..., online_node_ids: _Optional[_Iterable[int]] = ..., offline_node_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ExplainResponse(_message.Message):
    __slots__ = ("status", "collection_id", "name", "state", "units")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    collection_id: int
    name: str
    state: HealthState
    units: _containers.RepeatedCompositeFieldContainer[ExplainUnit]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., collection_id: _Optional[int] = ..., name: _Optional[str] = ..., state: _Optional[_Union[HealthState, str]] = ..., units: _Optional[_Iterable[_Union[ExplainUnit, _Mapping]]] = ...) -> None: ...

class GetCoordinatorStateResponse(_message.Message):
    __slots__ = ("status", "address", "server_id", "leader", "since_ms", "election_revision")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_REVISION_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    address: str
    server_id: int
    leader: bool
    since_ms: int
    election_revision: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., address: _Optional[str] = ..., server_id: _Optional[int] = ..., leader: _Optional[bool] = ..., since_ms: _Optional[int] = ..., election_revision: _Optional[int] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("task_id", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    reason: str
    def __init__(self, task_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("status", "task")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task: TaskInfo
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task: _Optional[_Union[TaskInfo, _Mapping]] = ...) -> None: ...

class SuspendBalanceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeBalanceRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckBalanceStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BalanceStatusResponse(_message.Message):
    __slots__ = ("status", "paused", "since_ms", "by")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    paused: bool
    since_ms: int
    by: str
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., paused: _Optional[bool] = ..., since_ms: _Optional[int] = ..., by: _Optional[str] = ...) -> None: ...

class ListCheckersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckerInfo(_message.Message):
    __slots__ = ("name", "active", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    active: bool
    description: str
    def __init__(self, name: _Optional[str] = ..., active: _Optional[bool] = ..., description: _Optional[str] = ...) -> None: ...

class ListCheckersResponse(_message.Message):
    __slots__ = ("status", "checkers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKERS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    checkers: _containers.RepeatedCompositeFieldContainer[CheckerInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., checkers: _Optional[_Iterable[_Union[CheckerInfo, _Mapping]]] = ...) -> None: ...

class CheckerRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CheckerResponse(_message.Message):
    __slots__ = ("status", "checker")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHECKER_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    checker: CheckerInfo
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., checker: _Optional[_Union[CheckerInfo, _Mapping]] = ...) -> None: ...

class DrainProgress(_message.Message):
    __slots__ = ("copies_total", "copies_left", "started_ms", "eta_ms", "waiting")
    COPIES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COPIES_LEFT_FIELD_NUMBER: _ClassVar[int]
    STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    ETA_MS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    copies_total: int
    copies_left: int
    started_ms: int
    eta_ms: int
    waiting: str
    def __init__(self, copies_total: _Optional[int] = ..., copies_left: _Optional[int] = ..., started_ms: _Optional[int] = ..., eta_ms: _Optional[int] = ..., waiting: _Optional[str] = ...) -> None: ...

class NodeLifecycleRequest(_message.Message):
    __slots__ = ("node_id", "graceful_stop")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    GRACEFUL_STOP_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    graceful_stop: bool
    def __init__(self, node_id: _Optional[int] = ..., graceful_stop: _Optional[bool] = ...) -> None: ...

class NodeLifecycleResponse(_message.Message):
    __slots__ = ("status", "node")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    node: NodeInfo
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., node: _Optional[_Union[NodeInfo, _Mapping]] = ...) -> None: ...

class UpdateLoadConfigRequest(_message.Message):
    __slots__ = ("collection_ids", "replica_number")
    COLLECTION_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    collection_ids: _containers.RepeatedScalarFieldContainer[int]
    replica_number: int
    def __init__(self, collection_ids: _Optional[_Iterable[int]] = ..., replica_number: _Optional[int] = ...) -> None: ...

class UpdateLoadConfigResponse(_message.Message):
    __slots__ = ("status", "task_id", "task_ids")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    task_id: int
    task_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., task_id: _Optional[int] = ..., task_ids: _Optional[_Iterable[int]] = ...) -> None: ...
