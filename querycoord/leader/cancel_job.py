"""CancelTask on the leader: validate, cancel the queued or running trigger (``task.cancel``), else say why not
from the task history (finished: CONFLICT; unknown: NOT_FOUND)."""

from __future__ import annotations

from meta.kv import MetaKV
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.errors import Conflict, NotFound
from querycoord.common.validate import InvalidField, check_id
from querycoord.task.cancel import cancel_trigger
from querycoord.task.history import TaskHistory
from querycoord.task.scheduler import Scheduler

# The longest reason kept (it goes into the trigger's record and its history record).
MAX_REASON_CHARS = 500


def check_cancel(request: qc.CancelTaskRequest) -> None:
    """A positive task id, a reason of at most ``MAX_REASON_CHARS`` characters."""
    check_id("task_id", request.task_id)
    if len(request.reason) > MAX_REASON_CHARS:
        raise InvalidField("reason", request.reason, "is too long", f"{MAX_REASON_CHARS} characters")


def outcome(t: qc.TaskInfo) -> str:
    """How a finished trigger ended: DONE, FAILED or CANCELLED."""
    if t.state == qc.TASK_STATE_EXPIRED:
        return "DONE"
    if t.state == qc.TASK_STATE_CANCELLED or t.error_code == common_pb2.CANCELLED:
        return "CANCELLED"
    return "FAILED"


async def cancel_task(scheduler: Scheduler, kv: MetaKV, request: qc.CancelTaskRequest, who: str) -> qc.TaskInfo:
    """Cancel trigger ``request.task_id`` for its reason, noting ``who`` asked; the trigger's info."""
    tid = request.task_id
    why = f"{request.reason.strip() or 'no reason given'} (by {who})"
    info = await cancel_trigger(scheduler.queue, scheduler.env.store, tid, why)
    if info is not None:
        return info
    tree = await TaskHistory(kv).find(tid)
    if tree is None:
        raise NotFound(f"task {tid} is unknown (neither running nor in the task history)")
    trig = tree.trigger
    if trig.task_id != tid:
        raise Conflict(f"task {tid} is a child of trigger {trig.task_id}, which already finished: {outcome(trig)}")
    raise Conflict(f"task {tid} already finished: {outcome(trig)}")


__all__ = ["MAX_REASON_CHARS", "cancel_task", "check_cancel", "outcome"]
