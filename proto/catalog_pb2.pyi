from proto import common_pb2 as _common_pb2
from proto import data_pb2 as _data_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_TYPE_NONE: _ClassVar[DataType]
    DATA_TYPE_BOOL: _ClassVar[DataType]
    DATA_TYPE_INT8: _ClassVar[DataType]
    DATA_TYPE_INT16: _ClassVar[DataType]
    DATA_TYPE_INT32: _ClassVar[DataType]
    DATA_TYPE_INT64: _ClassVar[DataType]
    DATA_TYPE_FLOAT: _ClassVar[DataType]
    DATA_TYPE_DOUBLE: _ClassVar[DataType]
    DATA_TYPE_STRING: _ClassVar[DataType]
    DATA_TYPE_VARCHAR: _ClassVar[DataType]
    DATA_TYPE_BINARY_VECTOR: _ClassVar[DataType]
    DATA_TYPE_FLOAT_VECTOR: _ClassVar[DataType]
DATA_TYPE_NONE: DataType
DATA_TYPE_BOOL: DataType
DATA_TYPE_INT8: DataType
DATA_TYPE_INT16: DataType
DATA_TYPE_INT32: DataType
DATA_TYPE_INT64: DataType
DATA_TYPE_FLOAT: DataType
DATA_TYPE_DOUBLE: DataType
DATA_TYPE_STRING: DataType
DATA_TYPE_VARCHAR: DataType
DATA_TYPE_BINARY_VECTOR: DataType
DATA_TYPE_FLOAT_VECTOR: DataType

class FieldSchema(_message.Message):
    __slots__ = ("field_id", "name", "data_type", "is_primary_key", "dim", "description")
    FIELD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    IS_PRIMARY_KEY_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    field_id: int
    name: str
    data_type: DataType
    is_primary_key: bool
    dim: int
    description: str
    def __init__(self, field_id: _Optional[int] = ..., name: _Optional[str] = ..., data_type: _Optional[_Union[DataType, str]] = ..., is_primary_key: _Optional[bool] = ..., dim: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CollectionSchema(_message.Message):
    __slots__ = ("name", "description", "fields")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    fields: _containers.RepeatedCompositeFieldContainer[FieldSchema]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[FieldSchema, _Mapping]]] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("partition_id", "name", "created_ms")
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    partition_id: int
    name: str
    created_ms: int
    def __init__(self, partition_id: _Optional[int] = ..., name: _Optional[str] = ..., created_ms: _Optional[int] = ...) -> None: ...

class CollectionDescription(_message.Message):
    __slots__ = ("collection_id", "name", "schema", "partitions", "dm_channels", "created_ms")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    name: str
    schema: CollectionSchema
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    dm_channels: _containers.RepeatedScalarFieldContainer[str]
    created_ms: int
    def __init__(self, collection_id: _Optional[int] = ..., name: _Optional[str] = ..., schema: _Optional[_Union[CollectionSchema, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ..., dm_channels: _Optional[_Iterable[str]] = ..., created_ms: _Optional[int] = ...) -> None: ...

class CreateCollectionRequest(_message.Message):
    __slots__ = ("collection_name", "schema", "partition_names", "num_partitions", "num_dm_channels")
    COLLECTION_NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    PARTITION_NAMES_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_DM_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    collection_name: str
    schema: CollectionSchema
    partition_names: _containers.RepeatedScalarFieldContainer[str]
    num_partitions: int
    num_dm_channels: int
    def __init__(self, collection_name: _Optional[str] = ..., schema: _Optional[_Union[CollectionSchema, _Mapping]] = ..., partition_names: _Optional[_Iterable[str]] = ..., num_partitions: _Optional[int] = ..., num_dm_channels: _Optional[int] = ...) -> None: ...

class CreateCollectionResponse(_message.Message):
    __slots__ = ("status", "collection")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    collection: CollectionDescription
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., collection: _Optional[_Union[CollectionDescription, _Mapping]] = ...) -> None: ...

class DropCollectionRequest(_message.Message):
    __slots__ = ("collection_id", "collection_name")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_NAME_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    collection_name: str
    def __init__(self, collection_id: _Optional[int] = ..., collection_name: _Optional[str] = ...) -> None: ...

class DropCollectionResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class DescribeCollectionRequest(_message.Message):
    __slots__ = ("collection_id", "collection_name")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_NAME_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    collection_name: str
    def __init__(self, collection_id: _Optional[int] = ..., collection_name: _Optional[str] = ...) -> None: ...

class DescribeCollectionResponse(_message.Message):
    __slots__ = ("status", "collection")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    collection: CollectionDescription
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., collection: _Optional[_Union[CollectionDescription, _Mapping]] = ...) -> None: ...

class ShowCollectionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectionSummary(_message.Message):
    __slots__ = ("collection_id", "name", "num_partitions", "num_segments", "num_rows", "created_ms")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    name: str
    num_partitions: int
    num_segments: int
    num_rows: int
    created_ms: int
    def __init__(self, collection_id: _Optional[int] = ..., name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., num_segments: _Optional[int] = ..., num_rows: _Optional[int] = ..., created_ms: _Optional[int] = ...) -> None: ...

class ShowCollectionsResponse(_message.Message):
    __slots__ = ("status", "collections")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIONS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    collections: _containers.RepeatedCompositeFieldContainer[CollectionSummary]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., collections: _Optional[_Iterable[_Union[CollectionSummary, _Mapping]]] = ...) -> None: ...

class ShowPartitionsRequest(_message.Message):
    __slots__ = ("collection_id",)
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    def __init__(self, collection_id: _Optional[int] = ...) -> None: ...

class ShowPartitionsResponse(_message.Message):
    __slots__ = ("status", "partitions")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ...) -> None: ...

class AddSegmentsRequest(_message.Message):
    __slots__ = ("collection_id", "segments")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    segments: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentBinlogs]
    def __init__(self, collection_id: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[_data_pb2.SegmentBinlogs, _Mapping]]] = ...) -> None: ...

class AddSegmentsResponse(_message.Message):
    __slots__ = ("status", "segment_ids")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., segment_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetRecoveryInfoRequest(_message.Message):
    __slots__ = ("collection_id", "partition_id", "segment_ids", "after_segment_id", "page_size")
    COLLECTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    collection_id: int
    partition_id: int
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    after_segment_id: int
    page_size: int
    def __init__(self, collection_id: _Optional[int] = ..., partition_id: _Optional[int] = ..., segment_ids: _Optional[_Iterable[int]] = ..., after_segment_id: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class GetRecoveryInfoResponse(_message.Message):
    __slots__ = ("status", "channels", "binlogs", "next_after_segment_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    BINLOGS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    channels: _containers.RepeatedCompositeFieldContainer[_data_pb2.VChannelInfo]
    binlogs: _containers.RepeatedCompositeFieldContainer[_data_pb2.SegmentBinlogs]
    next_after_segment_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., channels: _Optional[_Iterable[_Union[_data_pb2.VChannelInfo, _Mapping]]] = ..., binlogs: _Optional[_Iterable[_Union[_data_pb2.SegmentBinlogs, _Mapping]]] = ..., next_after_segment_id: _Optional[int] = ...) -> None: ...
