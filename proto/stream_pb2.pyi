from proto import common_pb2 as _common_pb2
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
    TRIGGER_READER: _ClassVar[TaskKind]
    CALC_READER: _ClassVar[TaskKind]
    TRIGGER: _ClassVar[TaskKind]
    RUNNER: _ClassVar[TaskKind]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_INIT: _ClassVar[TaskStatus]
    TASK_RUNNING: _ClassVar[TaskStatus]
    TASK_FAILED: _ClassVar[TaskStatus]
    TASK_STOPPED: _ClassVar[TaskStatus]

class StreamState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_STATE_UNSPECIFIED: _ClassVar[StreamState]
    STREAM_UNDEPLOYED: _ClassVar[StreamState]
    STREAM_DEPLOYING: _ClassVar[StreamState]
    STREAM_RUNNING: _ClassVar[StreamState]
    STREAM_STOPPED_BY_USER: _ClassVar[StreamState]
    STREAM_STOPPED_BY_ERROR: _ClassVar[StreamState]

class RecalcState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECALC_STATE_UNSPECIFIED: _ClassVar[RecalcState]
    RECALC_PENDING: _ClassVar[RecalcState]
    RECALC_RUNNING: _ClassVar[RecalcState]
    RECALC_DONE: _ClassVar[RecalcState]
    RECALC_FAILED: _ClassVar[RecalcState]
    RECALC_CANCELLED: _ClassVar[RecalcState]
TASK_KIND_UNSPECIFIED: TaskKind
TRIGGER_READER: TaskKind
CALC_READER: TaskKind
TRIGGER: TaskKind
RUNNER: TaskKind
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_INIT: TaskStatus
TASK_RUNNING: TaskStatus
TASK_FAILED: TaskStatus
TASK_STOPPED: TaskStatus
STREAM_STATE_UNSPECIFIED: StreamState
STREAM_UNDEPLOYED: StreamState
STREAM_DEPLOYING: StreamState
STREAM_RUNNING: StreamState
STREAM_STOPPED_BY_USER: StreamState
STREAM_STOPPED_BY_ERROR: StreamState
RECALC_STATE_UNSPECIFIED: RecalcState
RECALC_PENDING: RecalcState
RECALC_RUNNING: RecalcState
RECALC_DONE: RecalcState
RECALC_FAILED: RecalcState
RECALC_CANCELLED: RecalcState

class StreamDef(_message.Message):
    __slots__ = ("id", "name", "source_db", "source_vgroup_ids", "trigger_vgroup_id", "num_calc_scan_plans", "num_calc_subplans", "runner_deploys", "main_snode_id", "user_stopped", "user_dropped", "create_ms", "update_ms", "stop_ms", "start_from_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DB_FIELD_NUMBER: _ClassVar[int]
    SOURCE_VGROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_VGROUP_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_CALC_SCAN_PLANS_FIELD_NUMBER: _ClassVar[int]
    NUM_CALC_SUBPLANS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_DEPLOYS_FIELD_NUMBER: _ClassVar[int]
    MAIN_SNODE_ID_FIELD_NUMBER: _ClassVar[int]
    USER_STOPPED_FIELD_NUMBER: _ClassVar[int]
    USER_DROPPED_FIELD_NUMBER: _ClassVar[int]
    CREATE_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MS_FIELD_NUMBER: _ClassVar[int]
    STOP_MS_FIELD_NUMBER: _ClassVar[int]
    START_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    source_db: str
    source_vgroup_ids: _containers.RepeatedScalarFieldContainer[int]
    trigger_vgroup_id: int
    num_calc_scan_plans: int
    num_calc_subplans: int
    runner_deploys: int
    main_snode_id: int
    user_stopped: bool
    user_dropped: bool
    create_ms: int
    update_ms: int
    stop_ms: int
    start_from_ms: int
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., source_db: _Optional[str] = ..., source_vgroup_ids: _Optional[_Iterable[int]] = ..., trigger_vgroup_id: _Optional[int] = ..., num_calc_scan_plans: _Optional[int] = ..., num_calc_subplans: _Optional[int] = ..., runner_deploys: _Optional[int] = ..., main_snode_id: _Optional[int] = ..., user_stopped: _Optional[bool] = ..., user_dropped: _Optional[bool] = ..., create_ms: _Optional[int] = ..., update_ms: _Optional[int] = ..., stop_ms: _Optional[int] = ..., start_from_ms: _Optional[int] = ...) -> None: ...

class SnodeInfo(_message.Message):
    __slots__ = ("id", "node_id", "replica_id", "create_ms", "dropping")
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_MS_FIELD_NUMBER: _ClassVar[int]
    DROPPING_FIELD_NUMBER: _ClassVar[int]
    id: int
    node_id: int
    replica_id: int
    create_ms: int
    dropping: bool
    def __init__(self, id: _Optional[int] = ..., node_id: _Optional[int] = ..., replica_id: _Optional[int] = ..., create_ms: _Optional[int] = ..., dropping: _Optional[bool] = ...) -> None: ...

class TaskId(_message.Message):
    __slots__ = ("stream_id", "task_id", "sid", "kind", "node_id", "vgroup_id", "snode_id", "deploy_id", "task_idx", "scan_plan_idx", "top")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VGROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SNODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDX_FIELD_NUMBER: _ClassVar[int]
    SCAN_PLAN_IDX_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    task_id: int
    sid: int
    kind: TaskKind
    node_id: int
    vgroup_id: int
    snode_id: int
    deploy_id: int
    task_idx: int
    scan_plan_idx: int
    top: bool
    def __init__(self, stream_id: _Optional[int] = ..., task_id: _Optional[int] = ..., sid: _Optional[int] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., node_id: _Optional[int] = ..., vgroup_id: _Optional[int] = ..., snode_id: _Optional[int] = ..., deploy_id: _Optional[int] = ..., task_idx: _Optional[int] = ..., scan_plan_idx: _Optional[int] = ..., top: _Optional[bool] = ...) -> None: ...

class TaskStatusReport(_message.Message):
    __slots__ = ("stream_id", "task_id", "sid", "kind", "node_id", "status", "error_code", "error_message", "deploy_id", "task_idx", "vgroup_id", "snode_id", "scan_plan_idx", "top", "top_runners", "recalcs_done", "processed_ms", "source_ms", "checkpoint_id", "checkpoint_ms")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDX_FIELD_NUMBER: _ClassVar[int]
    VGROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SNODE_ID_FIELD_NUMBER: _ClassVar[int]
    SCAN_PLAN_IDX_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    TOP_RUNNERS_FIELD_NUMBER: _ClassVar[int]
    RECALCS_DONE_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_MS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    task_id: int
    sid: int
    kind: TaskKind
    node_id: int
    status: TaskStatus
    error_code: int
    error_message: str
    deploy_id: int
    task_idx: int
    vgroup_id: int
    snode_id: int
    scan_plan_idx: int
    top: bool
    top_runners: _containers.RepeatedCompositeFieldContainer[TaskId]
    recalcs_done: _containers.RepeatedScalarFieldContainer[int]
    processed_ms: int
    source_ms: int
    checkpoint_id: int
    checkpoint_ms: int
    def __init__(self, stream_id: _Optional[int] = ..., task_id: _Optional[int] = ..., sid: _Optional[int] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., node_id: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., deploy_id: _Optional[int] = ..., task_idx: _Optional[int] = ..., vgroup_id: _Optional[int] = ..., snode_id: _Optional[int] = ..., scan_plan_idx: _Optional[int] = ..., top: _Optional[bool] = ..., top_runners: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., recalcs_done: _Optional[_Iterable[int]] = ..., processed_ms: _Optional[int] = ..., source_ms: _Optional[int] = ..., checkpoint_id: _Optional[int] = ..., checkpoint_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "snode_id", "vgroup_ids", "stream_group", "num_stream_groups", "tasks", "runner_threads", "seen_leader_revision")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SNODE_ID_FIELD_NUMBER: _ClassVar[int]
    VGROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    STREAM_GROUP_FIELD_NUMBER: _ClassVar[int]
    NUM_STREAM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_THREADS_FIELD_NUMBER: _ClassVar[int]
    SEEN_LEADER_REVISION_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    snode_id: int
    vgroup_ids: _containers.RepeatedScalarFieldContainer[int]
    stream_group: int
    num_stream_groups: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStatusReport]
    runner_threads: int
    seen_leader_revision: int
    def __init__(self, node_id: _Optional[int] = ..., snode_id: _Optional[int] = ..., vgroup_ids: _Optional[_Iterable[int]] = ..., stream_group: _Optional[int] = ..., num_stream_groups: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskStatusReport, _Mapping]]] = ..., runner_threads: _Optional[int] = ..., seen_leader_revision: _Optional[int] = ...) -> None: ...

class ReaderDeploy(_message.Message):
    __slots__ = ("task", "trigger_reader")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_READER_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    trigger_reader: bool
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ..., trigger_reader: _Optional[bool] = ...) -> None: ...

class TriggerDeploy(_message.Message):
    __slots__ = ("task", "readers", "top_runners")
    TASK_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    TOP_RUNNERS_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    readers: _containers.RepeatedCompositeFieldContainer[TaskId]
    top_runners: _containers.RepeatedCompositeFieldContainer[TaskId]
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ..., readers: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., top_runners: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ...) -> None: ...

class RunnerDeploy(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ...) -> None: ...

class StreamDeploy(_message.Message):
    __slots__ = ("stream_id", "stream_name", "readers", "trigger", "runners", "resume_checkpoint_id", "start_from_ms")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_NAME_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    RUNNERS_FIELD_NUMBER: _ClassVar[int]
    RESUME_CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    START_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    stream_name: str
    readers: _containers.RepeatedCompositeFieldContainer[ReaderDeploy]
    trigger: TriggerDeploy
    runners: _containers.RepeatedCompositeFieldContainer[RunnerDeploy]
    resume_checkpoint_id: int
    start_from_ms: int
    def __init__(self, stream_id: _Optional[int] = ..., stream_name: _Optional[str] = ..., readers: _Optional[_Iterable[_Union[ReaderDeploy, _Mapping]]] = ..., trigger: _Optional[_Union[TriggerDeploy, _Mapping]] = ..., runners: _Optional[_Iterable[_Union[RunnerDeploy, _Mapping]]] = ..., resume_checkpoint_id: _Optional[int] = ..., start_from_ms: _Optional[int] = ...) -> None: ...

class StreamStart(_message.Message):
    __slots__ = ("stream_id", "trigger", "skip_until_ms")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    SKIP_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    trigger: TaskId
    skip_until_ms: int
    def __init__(self, stream_id: _Optional[int] = ..., trigger: _Optional[_Union[TaskId, _Mapping]] = ..., skip_until_ms: _Optional[int] = ...) -> None: ...

class StreamUndeploy(_message.Message):
    __slots__ = ("stream_id", "tasks", "undeploy_all", "checkpoint", "cleanup")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    UNDEPLOY_ALL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    CLEANUP_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskId]
    undeploy_all: bool
    checkpoint: bool
    cleanup: bool
    def __init__(self, stream_id: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ..., undeploy_all: _Optional[bool] = ..., checkpoint: _Optional[bool] = ..., cleanup: _Optional[bool] = ...) -> None: ...

class RunnerUpdate(_message.Message):
    __slots__ = ("stream_id", "trigger", "top_runners")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    TOP_RUNNERS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    trigger: TaskId
    top_runners: _containers.RepeatedCompositeFieldContainer[TaskId]
    def __init__(self, stream_id: _Optional[int] = ..., trigger: _Optional[_Union[TaskId, _Mapping]] = ..., top_runners: _Optional[_Iterable[_Union[TaskId, _Mapping]]] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("status", "leader_revision", "watching", "deploys", "starts", "undeploys", "runner_updates", "recalcs", "checkpoints")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEADER_REVISION_FIELD_NUMBER: _ClassVar[int]
    WATCHING_FIELD_NUMBER: _ClassVar[int]
    DEPLOYS_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    UNDEPLOYS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_UPDATES_FIELD_NUMBER: _ClassVar[int]
    RECALCS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    leader_revision: int
    watching: bool
    deploys: _containers.RepeatedCompositeFieldContainer[StreamDeploy]
    starts: _containers.RepeatedCompositeFieldContainer[StreamStart]
    undeploys: _containers.RepeatedCompositeFieldContainer[StreamUndeploy]
    runner_updates: _containers.RepeatedCompositeFieldContainer[RunnerUpdate]
    recalcs: _containers.RepeatedCompositeFieldContainer[RecalcOrder]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointOrder]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., leader_revision: _Optional[int] = ..., watching: _Optional[bool] = ..., deploys: _Optional[_Iterable[_Union[StreamDeploy, _Mapping]]] = ..., starts: _Optional[_Iterable[_Union[StreamStart, _Mapping]]] = ..., undeploys: _Optional[_Iterable[_Union[StreamUndeploy, _Mapping]]] = ..., runner_updates: _Optional[_Iterable[_Union[RunnerUpdate, _Mapping]]] = ..., recalcs: _Optional[_Iterable[_Union[RecalcOrder, _Mapping]]] = ..., checkpoints: _Optional[_Iterable[_Union[CheckpointOrder, _Mapping]]] = ...) -> None: ...

class CreateStreamRequest(_message.Message):
    __slots__ = ("name", "source_db", "source_vgroup_ids", "trigger_vgroup_id", "num_calc_scan_plans", "num_calc_subplans", "runner_deploys", "if_not_exists")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DB_FIELD_NUMBER: _ClassVar[int]
    SOURCE_VGROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_VGROUP_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_CALC_SCAN_PLANS_FIELD_NUMBER: _ClassVar[int]
    NUM_CALC_SUBPLANS_FIELD_NUMBER: _ClassVar[int]
    RUNNER_DEPLOYS_FIELD_NUMBER: _ClassVar[int]
    IF_NOT_EXISTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    source_db: str
    source_vgroup_ids: _containers.RepeatedScalarFieldContainer[int]
    trigger_vgroup_id: int
    num_calc_scan_plans: int
    num_calc_subplans: int
    runner_deploys: int
    if_not_exists: bool
    def __init__(self, name: _Optional[str] = ..., source_db: _Optional[str] = ..., source_vgroup_ids: _Optional[_Iterable[int]] = ..., trigger_vgroup_id: _Optional[int] = ..., num_calc_scan_plans: _Optional[int] = ..., num_calc_subplans: _Optional[int] = ..., runner_deploys: _Optional[int] = ..., if_not_exists: _Optional[bool] = ...) -> None: ...

class CreateStreamResponse(_message.Message):
    __slots__ = ("status", "stream", "already_exists")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    stream: StreamDef
    already_exists: bool
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., stream: _Optional[_Union[StreamDef, _Mapping]] = ..., already_exists: _Optional[bool] = ...) -> None: ...

class StreamRef(_message.Message):
    __slots__ = ("stream_id", "name")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    name: str
    def __init__(self, stream_id: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class DropStreamRequest(_message.Message):
    __slots__ = ("stream", "if_exists")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    stream: StreamRef
    if_exists: bool
    def __init__(self, stream: _Optional[_Union[StreamRef, _Mapping]] = ..., if_exists: _Optional[bool] = ...) -> None: ...

class StopStreamRequest(_message.Message):
    __slots__ = ("stream",)
    STREAM_FIELD_NUMBER: _ClassVar[int]
    stream: StreamRef
    def __init__(self, stream: _Optional[_Union[StreamRef, _Mapping]] = ...) -> None: ...

class StartStreamRequest(_message.Message):
    __slots__ = ("stream", "ignore_untreated")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    IGNORE_UNTREATED_FIELD_NUMBER: _ClassVar[int]
    stream: StreamRef
    ignore_untreated: bool
    def __init__(self, stream: _Optional[_Union[StreamRef, _Mapping]] = ..., ignore_untreated: _Optional[bool] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("status", "stream")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    stream: StreamDef
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., stream: _Optional[_Union[StreamDef, _Mapping]] = ...) -> None: ...

class ShowStreamsRequest(_message.Message):
    __slots__ = ("streams", "with_tasks")
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    WITH_TASKS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamRef]
    with_tasks: bool
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamRef, _Mapping]]] = ..., with_tasks: _Optional[bool] = ...) -> None: ...

class TaskRow(_message.Message):
    __slots__ = ("task", "status", "last_heard_ms", "error_code", "error_message", "pending", "processed_ms", "lag_ms", "checkpoint_id")
    TASK_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARD_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_MS_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    task: TaskId
    status: TaskStatus
    last_heard_ms: int
    error_code: int
    error_message: str
    pending: bool
    processed_ms: int
    lag_ms: int
    checkpoint_id: int
    def __init__(self, task: _Optional[_Union[TaskId, _Mapping]] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., last_heard_ms: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., pending: _Optional[bool] = ..., processed_ms: _Optional[int] = ..., lag_ms: _Optional[int] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class StreamStatusInfo(_message.Message):
    __slots__ = ("stream", "state", "stop_error_code", "stop_reason", "next_retry_ms", "deploy_times", "tasks", "retries", "plan_queued", "wait_reason", "recalcs", "processed_ms", "lag_ms", "checkpoint_id", "checkpoint_ms", "checkpoint_round_id", "checkpoint_round_started_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STOP_ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    NEXT_RETRY_MS_FIELD_NUMBER: _ClassVar[int]
    DEPLOY_TIMES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    PLAN_QUEUED_FIELD_NUMBER: _ClassVar[int]
    WAIT_REASON_FIELD_NUMBER: _ClassVar[int]
    RECALCS_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_MS_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ROUND_STARTED_MS_FIELD_NUMBER: _ClassVar[int]
    stream: StreamDef
    state: StreamState
    stop_error_code: int
    stop_reason: str
    next_retry_ms: int
    deploy_times: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskRow]
    retries: int
    plan_queued: bool
    wait_reason: str
    recalcs: _containers.RepeatedCompositeFieldContainer[RecalcInfo]
    processed_ms: int
    lag_ms: int
    checkpoint_id: int
    checkpoint_ms: int
    checkpoint_round_id: int
    checkpoint_round_started_ms: int
    def __init__(self, stream: _Optional[_Union[StreamDef, _Mapping]] = ..., state: _Optional[_Union[StreamState, str]] = ..., stop_error_code: _Optional[int] = ..., stop_reason: _Optional[str] = ..., next_retry_ms: _Optional[int] = ..., deploy_times: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskRow, _Mapping]]] = ..., retries: _Optional[int] = ..., plan_queued: _Optional[bool] = ..., wait_reason: _Optional[str] = ..., recalcs: _Optional[_Iterable[_Union[RecalcInfo, _Mapping]]] = ..., processed_ms: _Optional[int] = ..., lag_ms: _Optional[int] = ..., checkpoint_id: _Optional[int] = ..., checkpoint_ms: _Optional[int] = ..., checkpoint_round_id: _Optional[int] = ..., checkpoint_round_started_ms: _Optional[int] = ...) -> None: ...

class ShowStreamsResponse(_message.Message):
    __slots__ = ("status", "streams", "snodes", "watching", "watch_until_ms", "live_snode_ids")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    SNODES_FIELD_NUMBER: _ClassVar[int]
    WATCHING_FIELD_NUMBER: _ClassVar[int]
    WATCH_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SNODE_IDS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    streams: _containers.RepeatedCompositeFieldContainer[StreamStatusInfo]
    snodes: _containers.RepeatedCompositeFieldContainer[SnodeInfo]
    watching: bool
    watch_until_ms: int
    live_snode_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., streams: _Optional[_Iterable[_Union[StreamStatusInfo, _Mapping]]] = ..., snodes: _Optional[_Iterable[_Union[SnodeInfo, _Mapping]]] = ..., watching: _Optional[bool] = ..., watch_until_ms: _Optional[int] = ..., live_snode_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateSnodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    def __init__(self, node_id: _Optional[int] = ...) -> None: ...

class CreateSnodeResponse(_message.Message):
    __slots__ = ("status", "snode")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SNODE_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    snode: SnodeInfo
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., snode: _Optional[_Union[SnodeInfo, _Mapping]] = ...) -> None: ...

class DropSnodeRequest(_message.Message):
    __slots__ = ("snode_id", "force")
    SNODE_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    snode_id: int
    force: bool
    def __init__(self, snode_id: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class DropSnodeResponse(_message.Message):
    __slots__ = ("status", "moved_streams", "moved_to_snode_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MOVED_STREAMS_FIELD_NUMBER: _ClassVar[int]
    MOVED_TO_SNODE_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    moved_streams: int
    moved_to_snode_id: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., moved_streams: _Optional[int] = ..., moved_to_snode_id: _Optional[int] = ...) -> None: ...

class RecalcInfo(_message.Message):
    __slots__ = ("recalc_id", "stream_id", "from_ms", "to_ms", "state", "tasks_total", "tasks_done", "created_ms", "finished_ms", "error")
    RECALC_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    recalc_id: int
    stream_id: int
    from_ms: int
    to_ms: int
    state: RecalcState
    tasks_total: int
    tasks_done: int
    created_ms: int
    finished_ms: int
    error: str
    def __init__(self, recalc_id: _Optional[int] = ..., stream_id: _Optional[int] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., state: _Optional[_Union[RecalcState, str]] = ..., tasks_total: _Optional[int] = ..., tasks_done: _Optional[int] = ..., created_ms: _Optional[int] = ..., finished_ms: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class RecalcSlot(_message.Message):
    __slots__ = ("deploy_id", "task_idx")
    DEPLOY_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDX_FIELD_NUMBER: _ClassVar[int]
    deploy_id: int
    task_idx: int
    def __init__(self, deploy_id: _Optional[int] = ..., task_idx: _Optional[int] = ...) -> None: ...

class RecalcRecord(_message.Message):
    __slots__ = ("info", "done")
    INFO_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    info: RecalcInfo
    done: _containers.RepeatedCompositeFieldContainer[RecalcSlot]
    def __init__(self, info: _Optional[_Union[RecalcInfo, _Mapping]] = ..., done: _Optional[_Iterable[_Union[RecalcSlot, _Mapping]]] = ...) -> None: ...

class RecalcOrder(_message.Message):
    __slots__ = ("stream_id", "recalc_id", "from_ms", "to_ms", "task_ids")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    RECALC_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    recalc_id: int
    from_ms: int
    to_ms: int
    task_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, stream_id: _Optional[int] = ..., recalc_id: _Optional[int] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., task_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RecalculateStreamRequest(_message.Message):
    __slots__ = ("stream", "from_ms", "to_ms")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    stream: StreamRef
    from_ms: int
    to_ms: int
    def __init__(self, stream: _Optional[_Union[StreamRef, _Mapping]] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ...) -> None: ...

class RecalculateStreamResponse(_message.Message):
    __slots__ = ("status", "recalc")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RECALC_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    recalc: RecalcInfo
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., recalc: _Optional[_Union[RecalcInfo, _Mapping]] = ...) -> None: ...

class CheckpointOrder(_message.Message):
    __slots__ = ("stream_id", "checkpoint_id")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    checkpoint_id: int
    def __init__(self, stream_id: _Optional[int] = ..., checkpoint_id: _Optional[int] = ...) -> None: ...

class StreamCheckpoint(_message.Message):
    __slots__ = ("stream_id", "checkpoint_id", "checkpoint_ms")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_MS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    checkpoint_id: int
    checkpoint_ms: int
    def __init__(self, stream_id: _Optional[int] = ..., checkpoint_id: _Optional[int] = ..., checkpoint_ms: _Optional[int] = ...) -> None: ...
