from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUCCESS: _ClassVar[ErrorCode]
    UNEXPECTED_ERROR: _ClassVar[ErrorCode]
    ILLEGAL_ARGUMENT: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    CONFLICT: _ClassVar[ErrorCode]
    NOT_LEADER: _ClassVar[ErrorCode]
    META_UNAVAILABLE: _ClassVar[ErrorCode]
    REQUEST_TOO_LARGE: _ClassVar[ErrorCode]
    NOT_READY: _ClassVar[ErrorCode]
    CANCELLED: _ClassVar[ErrorCode]
    NO_AVAILABLE_NODE: _ClassVar[ErrorCode]
    STALE_LEADER: _ClassVar[ErrorCode]
    TIMEOUT: _ClassVar[ErrorCode]
    RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
    ALREADY_EXISTS: _ClassVar[ErrorCode]

class StateCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INITIALIZING: _ClassVar[StateCode]
    HEALTHY: _ClassVar[StateCode]
    ABNORMAL: _ClassVar[StateCode]
    STANDBY: _ClassVar[StateCode]
SUCCESS: ErrorCode
UNEXPECTED_ERROR: ErrorCode
ILLEGAL_ARGUMENT: ErrorCode
NOT_FOUND: ErrorCode
CONFLICT: ErrorCode
NOT_LEADER: ErrorCode
META_UNAVAILABLE: ErrorCode
REQUEST_TOO_LARGE: ErrorCode
NOT_READY: ErrorCode
CANCELLED: ErrorCode
NO_AVAILABLE_NODE: ErrorCode
STALE_LEADER: ErrorCode
TIMEOUT: ErrorCode
RESOURCE_EXHAUSTED: ErrorCode
ALREADY_EXISTS: ErrorCode
INITIALIZING: StateCode
HEALTHY: StateCode
ABNORMAL: StateCode
STANDBY: StateCode

class Status(_message.Message):
    __slots__ = ("error_code", "reason")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    reason: str
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ComponentInfo(_message.Message):
    __slots__ = ("node_id", "role", "state_code")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_CODE_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    state_code: StateCode
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., state_code: _Optional[_Union[StateCode, str]] = ...) -> None: ...

class ComponentStates(_message.Message):
    __slots__ = ("state", "status")
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    state: ComponentInfo
    status: Status
    def __init__(self, state: _Optional[_Union[ComponentInfo, _Mapping]] = ..., status: _Optional[_Union[Status, _Mapping]] = ...) -> None: ...
