from proto import common_pb2 as _common_pb2
from proto import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChannelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANNEL_KIND_UNSPECIFIED: _ClassVar[ChannelKind]
    CHANNEL_KIND_DM: _ClassVar[ChannelKind]
    CHANNEL_KIND_DELTA: _ClassVar[ChannelKind]
    CHANNEL_KIND_QUERY: _ClassVar[ChannelKind]
CHANNEL_KIND_UNSPECIFIED: ChannelKind
CHANNEL_KIND_DM: ChannelKind
CHANNEL_KIND_DELTA: ChannelKind
CHANNEL_KIND_QUERY: ChannelKind

class CoordFence(_message.Message):
    __slots__ = ("leader_revision", "coordinator_id")
    LEADER_REVISION_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    leader_revision: int
    coordinator_id: int
    def __init__(self, leader_revision: _Optional[int] = ..., coordinator_id: _Optional[int] = ...) -> None: ...

class LoadSegmentsRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "infos", "source_node_id", "load_type", "replica_id", "binlogs", "planned")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    BINLOGS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    infos: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentLoadInfo]
    source_node_id: int
    load_type: _data_pb2.LoadType
    replica_id: int
    binlogs: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentBinlogs]
    planned: SegmentRefs
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., infos: _Optional[_Iterable[_Union[_data_pb2.SegmentLoadInfo, _Mapping]]] = ..., source_node_id: _Optional[int] = ..., load_type: _Optional[_Union[_data_pb2.LoadType, str]] = ..., replica_id: _Optional[int] = ..., binlogs: _Optional[_Iterable[_Union[_data_pb2.SegmentBinlogs, _Mapping]]] = ..., planned: _Optional[_Union[SegmentRefs, _Mapping]] = ...) -> None: ...

class SegmentRefs(_message.Message):
    __slots__ = ("segment_ids", "partition_ids")
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, segment_ids: _Optional[_Iterable[int]] = ..., partition_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LoadSegmentsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class ReleaseSegmentsRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "partition_ids", "segment_ids")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ..., segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseSegmentsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class WatchDmChannelsRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "partition_ids", "infos", "load_type", "replica_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    LOAD_TYPE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    infos: _containers.RepeatedCompositeFieldContainer[_data_pb2.VChannelInfo]
    load_type: _data_pb2.LoadType
    replica_id: int
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ..., infos: _Optional[_Iterable[_Union[_data_pb2.VChannelInfo, _Mapping]]] = ..., load_type: _Optional[_Union[_data_pb2.LoadType, str]] = ..., replica_id: _Optional[int] = ...) -> None: ...

class WatchDmChannelsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class ReleaseDmChannelsRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "channel_names")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_NAMES_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    channel_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., channel_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseDmChannelsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class WatchDeltaChannelsRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "infos")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    infos: _containers.RepeatedCompositeFieldContainer[_data_pb2.VChannelInfo]
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., infos: _Optional[_Iterable[_Union[_data_pb2.VChannelInfo, _Mapping]]] = ...) -> None: ...

class WatchDeltaChannelsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class AddQueryChannelRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "query_channel", "query_result_channel", "seek_position")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    QUERY_RESULT_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    SEEK_POSITION_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    query_channel: str
    query_result_channel: str
    seek_position: _data_pb2.MsgPosition
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., query_channel: _Optional[str] = ..., query_result_channel: _Optional[str] = ..., seek_position: _Optional[_Union[_data_pb2.MsgPosition, _Mapping]] = ...) -> None: ...

class AddQueryChannelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class ReleaseCollectionRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ...) -> None: ...

class ReleaseCollectionResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class ReleasePartitionsRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "collection_id", "partition_ids")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    collection_id: int
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., collection_id: _Optional[int] = ..., partition_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleasePartitionsResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class GetSegmentInfoRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "segment_ids", "collection_id")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    collection_id: int
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., segment_ids: _Optional[_Iterable[int]] = ..., collection_id: _Optional[int] = ...) -> None: ...

class GetSegmentInfoResponse(_message.Message):
    __slots__ = ("status", "infos")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    infos: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., infos: _Optional[_Iterable[_Union[_data_pb2.SegmentInfo, _Mapping]]] = ...) -> None: ...

class GetDataDistributionRequest(_message.Message):
    __slots__ = ("fence", "node_id", "task_id", "segment_ids_only", "incarnation", "known", "skip_collection_ids")
    FENCE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_ONLY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    SKIP_COLLECTION_IDS_FIELD_NUMBER: _ClassVar[int]
    fence: CoordFence
    node_id: int
    task_id: int
    segment_ids_only: bool
    incarnation: int
    known: _containers.RepeatedCompositeFieldContainer[CollectionVersion]
    skip_collection_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, fence: _Optional[_Union[CoordFence, _Mapping]] = ..., node_id: _Optional[int] = ..., task_id: _Optional[int] = ..., segment_ids_only: _Optional[bool] = ..., incarnation: _Optional[int] = ..., known: _Optional[_Iterable[_Union[CollectionVersion, _Mapping]]] = ..., skip_collection_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CollectionVersion(_message.Message):
    __slots__ = ("collection_id", "version")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    version: int
    def __init__(self, collection_id: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class SegmentIdGroup(_message.Message):
    __slots__ = ("collection_id", "partition_id", "segment_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    partition_id: int
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchedChannel(_message.Message):
    __slots__ = ("collection_id", "channel_name", "kind", "partition_ids")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARTITION_IDS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    channel_name: str
    kind: ChannelKind
    partition_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, collection_id: _Optional[int] = ..., channel_name: _Optional[str] = ..., kind: _Optional[_Union[ChannelKind, str]] = ..., partition_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetDataDistributionResponse(_message.Message):
    __slots__ = ("status", "node_id", "segments", "channels", "memory_used", "memory_capacity", "highest_fence", "segment_groups", "incarnation", "versions")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_FENCE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_GROUPS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    node_id: int
    segments: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentInfo]
    channels: _containers.RepeatedCompositeFieldContainer[WatchedChannel]
    memory_used: int
    memory_capacity: int
    highest_fence: CoordFence
    segment_groups: _containers.RepeatedCompositeFieldContainer[SegmentIdGroup]
    incarnation: int
    versions: _containers.RepeatedCompositeFieldContainer[CollectionVersion]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., node_id: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[_data_pb2.SegmentInfo, _Mapping]]] = ..., channels: _Optional[_Iterable[_Union[WatchedChannel, _Mapping]]] = ..., memory_used: _Optional[int] = ..., memory_capacity: _Optional[int] = ..., highest_fence: _Optional[_Union[CoordFence, _Mapping]] = ..., segment_groups: _Optional[_Iterable[_Union[SegmentIdGroup, _Mapping]]] = ..., incarnation: _Optional[int] = ..., versions: _Optional[_Iterable[_Union[CollectionVersion, _Mapping]]] = ...) -> None: ...

class GetComponentStatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
