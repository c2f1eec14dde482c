"""The task model: a trigger (a user's or the system's request) and the tree of child tasks it plans.

Every task has the life cycle of Milvus's ``task.go``: ``pre_execute`` /
``execute`` / ``post_execute``; children can be ``reschedule``d to other
nodes; triggers can ``roll_back``. The persistent part of a task is its
``TaskRecord`` (``self.rec``); everything else is rebuilt from it on reload.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Self

from meta.idalloc import IdAllocator
from proto import common_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.errors import CoordError
from querycoord.common.messages import copy_fields
from querycoord.settings.config import SchedulerConfig
from querycoord.task.parking import ParkedUnits
from querycoord.task.prefetch import CatalogPrefetch
from querycoord.task.throttle import MoveThrottle, budgets_of

if TYPE_CHECKING:
    from querycoord.catalog.broker import Broker
    from querycoord.catalog.targets import CatalogTargets
    from querycoord.cluster.nodes import NodeManager
    from querycoord.querymeta import QueryMeta
    from querycoord.task.store import TaskStore

UNDO, DOING, DONE = qc.TASK_STATE_UNDO, qc.TASK_STATE_DOING, qc.TASK_STATE_DONE
EXPIRED, FAILED = qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED
CANCELLED = qc.TASK_STATE_CANCELLED


def now_ms() -> int:
    return int(time.time() * 1000)


def mark_retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback for a future nobody awaits any more: its exception counts as read, so asyncio does not log
    it as "never retrieved" (what it was no longer matters to anyone)."""
    if not future.cancelled():
        future.exception()


class TaskError(CoordError):
    """A task failed; ``code`` (UNEXPECTED_ERROR unless given) is the ErrorCode its caller sees."""


class TaskCancelled(TaskError):
    """A load cancelled by a release (or otherwise given up): its callers see CANCELLED."""

    code = common_pb2.CANCELLED


def cancel_requested(task: Task) -> str:
    """Why CancelTask cancels ``task``'s tree, with who asked ("" when it does not): its trigger's
    ``cancel_why``, set once the cancel key is stored (``TaskStore.mark_cancel``) or read back by reload."""
    trigger = task if task.IS_TRIGGER else task.parent
    return trigger.cancel_why if trigger is not None else ""


def check_cancelled(task: Task) -> None:
    """Raise ``TaskCancelled`` when CancelTask cancels ``task``'s tree: the work stops before its next step."""
    why = cancel_requested(task)
    if why:
        raise TaskCancelled(f"cancelled: {why}")


@dataclass
class TaskEnv:
    """What tasks work with. Built per leadership: ``meta`` and ``store`` write through the fence."""

    meta: QueryMeta
    nodes: NodeManager
    broker: Broker
    store: TaskStore
    ids: IdAllocator
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Repair units that cannot be placed now, with their reasons (``task.parking``): the checker weighs them
    # again at each pass instead of queueing repairs that would fail.
    parked: ParkedUnits = field(default_factory=ParkedUnits)
    # The local catalog's segments followed in memory (None with a remote catalog): load admission reads the
    # segment sizes there instead of the whole catalog (``task.admission``).
    targets: CatalogTargets | None = None
    # Catalog records of a repair's next part, read while the part before it runs (``task.prefetch``).
    prefetch: CatalogPrefetch = field(default_factory=CatalogPrefetch)
    _load_gates: dict[int, asyncio.Semaphore] = field(default_factory=dict, init=False, repr=False)
    _throttle: MoveThrottle | None = field(default=None, init=False, repr=False)

    @property
    def throttle(self) -> MoveThrottle:
        """The budgets of segment moves in flight (``task.throttle``), shared by every trigger of the leadership."""
        if self._throttle is None:
            self._throttle = MoveThrottle(budgets_of(self.config))
        return self._throttle

    def load_gate(self, node_id: int) -> asyncio.Semaphore:
        """The slots of LoadSegments calls to ``node_id`` (``config.node_load_concurrency``), shared by every task.

        Why: a node loads its requests one after another, so the calls of a big load (several per node) sent at
        once only queued on the node, each spending its timeout there, and all of them answered near the end. One
        at a time, the first answers early and its records are saved while the node loads the next. One small
        semaphore per node ever seen: a leadership's nodes are few.
        """
        gate = self._load_gates.get(node_id)
        if gate is None:
            gate = self._load_gates[node_id] = asyncio.Semaphore(self.config.node_load_concurrency)
        return gate


class Task:
    """Base of every task kind (see module docstring).

    A concrete kind names its ``TaskKind`` and its field of ``TaskRecord.request`` in its class line
    (``class LoadSegmentsTask(ChildTask, kind=..., request="load_segments")``); that registers it in
    ``KINDS``, which is how a new leader rebuilds the tasks it reloads. No list of kinds to keep in step.
    """

    KIND: ClassVar[qc.TaskKind]
    REQUEST_FIELD: ClassVar[str]
    # Every concrete kind by its request field.
    KINDS: ClassVar[dict[str, type[Task]]] = {}
    IS_TRIGGER: ClassVar[bool] = False
    # Keep retrying while the node is online, past the retry budget (bounded by the
    # trigger's deadline): a release is done once the node holds nothing or is gone.
    RETRY_WHILE_NODE_ONLINE: ClassVar[bool] = False

    def __init_subclass__(cls, kind: qc.TaskKind | None = None, request: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if (kind is None) != (request is None):
            raise TypeError(f"{cls.__name__}: a task kind names both its kind and its request field")
        if kind is not None and request is not None:
            cls.KIND, cls.REQUEST_FIELD = kind, request
            Task.KINDS[request] = cls

    def __init__(self, env: TaskEnv, rec: task_pb2.TaskRecord):
        self.env = env
        self.rec = rec
        self.parent: Task | None = None
        self.children: list[Task] = []
        # A trigger's CancelTask request (the reason and who asked), "" when none: kept in etcd under its own
        # key (``store.cancel_key``), not on the record, which plan and state writes rewrite.
        self.cancel_why = ""

    # ----- construction ---------------------------------------------------------------------------------
    @classmethod
    def new(
        cls,
        env: TaskEnv,
        request: Any,
        *,
        trigger_condition: qc.TriggerCondition,
        collection_id: int = 0,
        node_id: int = 0,
        parent: Task | None = None,
        excluded: list[int] | None = None,
    ) -> Self:
        rec = task_pb2.TaskRecord(
            kind=cls.KIND,
            state=UNDO,
            trigger_condition=trigger_condition,
            collection_id=collection_id,
            node_id=node_id,
            parent_id=parent.id if parent else 0,
            excluded_node_ids=excluded or [],
            created_ms=now_ms(),
            updated_ms=now_ms(),
        )
        getattr(rec, cls.REQUEST_FIELD).CopyFrom(request)
        task = cls(env, rec)
        task.parent = parent
        return task

    # ----- record accessors ------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self.rec.id

    @property
    def state(self) -> qc.TaskState:
        return self.rec.state

    def set_state(self, state: qc.TaskState) -> None:
        self.rec.state = state
        self.rec.updated_ms = now_ms()

    @property
    def request(self) -> Any:
        return getattr(self.rec, self.REQUEST_FIELD)

    @property
    def node_id(self) -> int:
        return self.rec.node_id

    @property
    def collection_id(self) -> int:
        return self.rec.collection_id

    def set_error(self, err: BaseException) -> None:
        code = err.code if isinstance(err, CoordError) else common_pb2.UNEXPECTED_ERROR
        self.rec.error = str(err)[:2000]
        self.rec.error_code = code if code in common_pb2.ErrorCode.values() else common_pb2.UNEXPECTED_ERROR

    # ----- life cycle (overridden by kinds) ----------------------------------------------------------------
    def collections(self) -> set[int]:
        """Collections this trigger touches; triggers of one collection run one at a time."""
        return {self.collection_id} if self.collection_id else set()

    async def pre_execute(self) -> None:
        """Validate against current state; raising fails the task before it changes anything."""

    async def execute(self) -> None:
        """Do the work (a child) or plan the children (a trigger)."""
        raise NotImplementedError

    async def post_execute(self) -> None:
        """Record the result (query meta) once the task and its children succeeded."""

    async def on_reload(self) -> None:
        """A DONE trigger was reloaded by a new leader: rebuild what only lived in memory."""

    def is_valid(self) -> bool:
        """False when the task cannot run as planned (its node went offline)."""
        return True

    def retryable_on_node(self) -> bool:
        return self.is_valid()

    async def reschedule(self) -> list[Task]:
        """Replacement children on other nodes; raising means nobody can take the work."""
        raise TaskError(f"{self.describe()} cannot be rescheduled")

    def roll_back(self) -> list[Task]:
        """Children that undo what a failed trigger may have done on the nodes."""
        return []

    def on_child_done(self, child: Task) -> None:
        """Progress hook (Milvus updateTaskProcess)."""

    def summary(self) -> str:
        return kind_summary(self.KIND)

    def describe(self) -> str:
        node = f" on node {self.node_id}" if self.node_id else ""
        return f"task {self.id} ({self.summary()}{node})"

    def info(self) -> qc.TaskInfo:
        info = record_info(self.rec)
        info.summary = self.summary()
        return info


def record_info(r: task_pb2.TaskRecord) -> qc.TaskInfo:
    """A task as clients see it, from its record alone (a standby has no live task objects)."""
    return copy_fields(r, qc.TaskInfo, task_id=r.id, summary=kind_summary(r.kind))


def kind_summary(kind: qc.TaskKind) -> str:
    """What a task of ``kind`` does when nothing more is known: TASK_KIND_LOAD_SEGMENT is "load segment"."""
    return qc.TaskKind.Name(kind).removeprefix("TASK_KIND_").lower().replace("_", " ")
