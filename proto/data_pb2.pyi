from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAD_TYPE_UNSPECIFIED: _ClassVar[LoadType]
    LOAD_TYPE_PARTITION: _ClassVar[LoadType]
    LOAD_TYPE_COLLECTION: _ClassVar[LoadType]

class PartitionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTITION_STATE_NOT_EXIST: _ClassVar[PartitionState]
    PARTITION_STATE_NOT_PRESENT: _ClassVar[PartitionState]
    PARTITION_STATE_ON_DISK: _ClassVar[PartitionState]
    PARTITION_STATE_PARTIAL_IN_MEMORY: _ClassVar[PartitionState]
    PARTITION_STATE_IN_MEMORY: _ClassVar[PartitionState]
    PARTITION_STATE_PARTIAL_IN_GPU: _ClassVar[PartitionState]
    PARTITION_STATE_IN_GPU: _ClassVar[PartitionState]

class SegmentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEGMENT_STATE_NONE: _ClassVar[SegmentState]
    SEGMENT_STATE_NOT_EXIST: _ClassVar[SegmentState]
    SEGMENT_STATE_GROWING: _ClassVar[SegmentState]
    SEGMENT_STATE_SEALED: _ClassVar[SegmentState]
    SEGMENT_STATE_FLUSHED: _ClassVar[SegmentState]
    SEGMENT_STATE_FLUSHING: _ClassVar[SegmentState]
    SEGMENT_STATE_DROPPED: _ClassVar[SegmentState]
LOAD_TYPE_UNSPECIFIED: LoadType
LOAD_TYPE_PARTITION: LoadType
LOAD_TYPE_COLLECTION: LoadType
PARTITION_STATE_NOT_EXIST: PartitionState
PARTITION_STATE_NOT_PRESENT: PartitionState
PARTITION_STATE_ON_DISK: PartitionState
PARTITION_STATE_PARTIAL_IN_MEMORY: PartitionState
PARTITION_STATE_IN_MEMORY: PartitionState
PARTITION_STATE_PARTIAL_IN_GPU: PartitionState
PARTITION_STATE_IN_GPU: PartitionState
SEGMENT_STATE_NONE: SegmentState
SEGMENT_STATE_NOT_EXIST: SegmentState
SEGMENT_STATE_GROWING: SegmentState
SEGMENT_STATE_SEALED: SegmentState
SEGMENT_STATE_FLUSHED: SegmentState
SEGMENT_STATE_FLUSHING: SegmentState
SEGMENT_STATE_DROPPED: SegmentState

class MsgPosition(_message.Message):
    __slots__ = ("channel_name", "msg_id", "msg_group", "timestamp")
    CHANNEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    MSG_GROUP_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    channel_name: str
    msg_id: bytes
    msg_group: str
    timestamp: int
    def __init__(self, channel_name: _Optional[str] = ..., msg_id: _Optional[bytes] = ..., msg_group: _Optional[str] = ..., timestamp: _Optional[int] = ...) -> None: ...

class IndexInfo(_message.Message):
    __slots__ = ("field_id", "index_id", "index_name", "index_file_paths", "index_size")
    FIELD_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FILE_PATHS_FIELD_NUMBER: _ClassVar[int]
    INDEX_SIZE_FIELD_NUMBER: _ClassVar[int]
    field_id: int
    index_id: int
    index_name: str
    index_file_paths: _containers.RepeatedScalarFieldContainer[str]
    index_size: int
    def __init__(self, field_id: _Optional[int] = ..., index_id: _Optional[int] = ..., index_name: _Optional[str] = ..., index_file_paths: _Optional[_Iterable[str]] = ..., index_size: _Optional[int] = ...) -> None: ...

class VChannelInfo(_message.Message):
    __slots__ = ("collection_id", "channel_name", "seek_position", "unflushed_segment_ids", "flushed_segment_ids", "dropped_segment_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_NAME_FIELD_NUMBER: _ClassVar[int]
    SEEK_POSITION_FIELD_NUMBER: _ClassVar[int]
    UNFLUSHED_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    channel_name: str
    seek_position: MsgPosition
    unflushed_segment_ids: _containers.RepeatedScalarFieldContainer[int]
    flushed_segment_ids: _containers.RepeatedScalarFieldContainer[int]
    dropped_segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., channel_name: _Optional[str] = ..., seek_position: _Optional[_Union[MsgPosition, _Mapping]] = ..., unflushed_segment_ids: _Optional[_Iterable[int]] = ..., flushed_segment_ids: _Optional[_Iterable[int]] = ..., dropped_segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SegmentBinlogs(_message.Message):
    __slots__ = ("segment_id", "collection_id", "partition_id", "num_rows", "mem_size", "binlog_paths", "insert_channel", "compaction_from", "index_infos")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    MEM_SIZE_FIELD_NUMBER: _ClassVar[int]
    BINLOG_PATHS_FIELD_NUMBER: _ClassVar[int]
    INSERT_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FROM_FIELD_NUMBER: _ClassVar[int]
    INDEX_INFOS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    collection_id: int
    partition_id: int
    num_rows: int
    mem_size: int
    binlog_paths: _containers.RepeatedScalarFieldContainer[str]
    insert_channel: str
    compaction_from: _containers.RepeatedScalarFieldContainer[int]
    index_infos: _containers.RepeatedCompositeFieldContainer[IndexInfo]
    def __init__(self, segment_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., num_rows: _Optional[int] = ..., mem_size: _Optional[int] = ..., binlog_paths: _Optional[_Iterable[str]] = ..., insert_channel: _Optional[str] = ..., compaction_from: _Optional[_Iterable[int]] = ..., index_infos: _Optional[_Iterable[_Union[IndexInfo, _Mapping]]] = ...) -> None: ...

class SegmentLoadInfo(_message.Message):
    __slots__ = ("segment_id", "partition_id", "collection_id", "num_rows", "mem_size", "binlog_paths", "compaction_from", "insert_channel", "index_infos")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    MEM_SIZE_FIELD_NUMBER: _ClassVar[int]
    BINLOG_PATHS_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FROM_FIELD_NUMBER: _ClassVar[int]
    INSERT_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    INDEX_INFOS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    partition_id: int
    collection_id: int
    num_rows: int
    mem_size: int
    binlog_paths: _containers.RepeatedScalarFieldContainer[str]
    compaction_from: _containers.RepeatedScalarFieldContainer[int]
    insert_channel: str
    index_infos: _containers.RepeatedCompositeFieldContainer[IndexInfo]
    def __init__(self, segment_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., num_rows: _Optional[int] = ..., mem_size: _Optional[int] = ..., binlog_paths: _Optional[_Iterable[str]] = ..., compaction_from: _Optional[_Iterable[int]] = ..., insert_channel: _Optional[str] = ..., index_infos: _Optional[_Iterable[_Union[IndexInfo, _Mapping]]] = ...) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("segment_id", "collection_id", "partition_id", "node_id", "mem_size", "num_rows", "index_infos", "state", "compaction_from", "dm_channel", "replica_id", "node_ids", "replica_ids")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MEM_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    INDEX_INFOS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FROM_FIELD_NUMBER: _ClassVar[int]
    DM_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    collection_id: int
    partition_id: int
    node_id: int
    mem_size: int
    num_rows: int
    index_infos: _containers.RepeatedCompositeFieldContainer[IndexInfo]
    state: SegmentState
    compaction_from: _containers.RepeatedScalarFieldContainer[int]
    dm_channel: str
    replica_id: int
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    replica_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, segment_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., node_id: _Optional[int] = ..., mem_size: _Optional[int] = ..., num_rows: _Optional[int] = ..., index_infos: _Optional[_Iterable[_Union[IndexInfo, _Mapping]]] = ..., state: _Optional[_Union[SegmentState, str]] = ..., compaction_from: _Optional[_Iterable[int]] = ..., dm_channel: _Optional[str] = ..., replica_id: _Optional[int] = ..., node_ids: _Optional[_Iterable[int]] = ..., replica_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionLoadInfo(_message.Message):
    __slots__ = ("partition_id", "state", "in_memory_percentage")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    IN_MEMORY_PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    partition_id: int
    state: PartitionState
    in_memory_percentage: int
    def __init__(self, partition_id: _Optional[int] = ..., state: _Optional[_Union[PartitionState, str]] = ..., in_memory_percentage: _Optional[int] = ...) -> None: ...

class CollectionLoadInfo(_message.Message):
    __slots__ = ("collection_id", "load_type", "in_memory_percentage", "replica_number", "partitions", "released_partition_ids", "replicas")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    IN_MEMORY_PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NUMBER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    load_type: LoadType
    in_memory_percentage: int
    replica_number: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionLoadInfo]
    released_partition_ids: _containers.RepeatedScalarFieldContainer[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    def __init__(self, collection_id: _Optional[int] = ..., load_type: _Optional[_Union[LoadType, str]] = ..., in_memory_percentage: _Optional[int] = ..., replica_number: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionLoadInfo, _Mapping]]] = ..., released_partition_ids: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "collection_id", "node_ids", "in_memory_percentage", "segment_count", "dm_channels", "dm_channel_nodes")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    IN_MEMORY_PERCENTAGE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    DM_CHANNEL_NODES_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    collection_id: int
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    in_memory_percentage: int
    segment_count: int
    dm_channels: _containers.RepeatedScalarFieldContainer[str]
    dm_channel_nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., node_ids: _Optional[_Iterable[int]] = ..., in_memory_percentage: _Optional[int] = ..., segment_count: _Optional[int] = ..., dm_channels: _Optional[_Iterable[str]] = ..., dm_channel_nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class DmChannelWatchInfo(_message.Message):
    __slots__ = ("collection_id", "dm_channel", "node_id", "partition_ids", "replica_id", "node_ids", "replica_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    DM_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    dm_channel: str
    node_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    replica_id: int
    node_ids: _containers.RepeatedScalarFieldContainer[int]
    replica_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., dm_channel: _Optional[str] = ..., node_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ..., replica_id: _Optional[int] = ..., node_ids: _Optional[_Iterable[int]] = ..., replica_ids: _Optional[_Iterable[int]] = ...) -> None: ...
