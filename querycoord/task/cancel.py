"""CancelTask on the leader's queue: which triggers may be cancelled, and recording the cancel before acting.

Cancellable: loads (their rollback releases what they added, on every online node, after the children in
flight answered), balances (the moves done stay done, a move in flight finishes; nothing is moved back) and the
checker's repairs and handoffs (the checker plans what is still missing again at its next pass). Not
cancellable: releases. A release has started dropping copies on its nodes when it runs; "undoing" it would
load them again, a load nobody asked for, and stopping it half-way would leave a collection that is neither
loaded nor released: let it finish and load what is needed.

The cancel is stored first, under a key of its own (``TaskStore.mark_cancel``: fenced, only while the trigger's
record exists, never rewritten by the tree's plan or state writes), then the runner sees it at its next step
(``executor.TreeRunner._execute_tree``): a new leader that reloads the tree reads it back and finishes the tree
as cancelled instead of resuming it.
"""

from __future__ import annotations

import asyncio
from weakref import WeakKeyDictionary

from proto import querycoord_pb2 as qc
from querycoord.common.errors import Conflict, IllegalArgument
from querycoord.task.model import UNDO
from querycoord.task.queue import TriggerQueue
from querycoord.task.store import TaskStore

RELEASE_KINDS = (qc.TASK_KIND_RELEASE_COLLECTION, qc.TASK_KIND_RELEASE_PARTITION)
# How an ended tree's trigger state reads in an answer (the words CancelTask gives for one in the task history).
_ENDED = {qc.TASK_STATE_EXPIRED: "DONE", qc.TASK_STATE_CANCELLED: "CANCELLED"}


# One cancel at a time per queue: two asked at once must not store one reason and keep the other in memory.
_LOCKS: WeakKeyDictionary[TriggerQueue, asyncio.Lock] = WeakKeyDictionary()


async def cancel_trigger(queue: TriggerQueue, store: TaskStore, task_id: int, why: str) -> qc.TaskInfo | None:
    """Cancel the queued or running trigger ``task_id`` for ``why`` (the reason and who asked); its info as it
    stands. None when this queue does not hold it (finished, or unknown: the caller looks in the history).
    ``IllegalArgument`` for a child's id or a release, ``Conflict`` for a trigger failing on its own already."""
    async with _LOCKS.setdefault(queue, asyncio.Lock()):
        return await _cancel(queue, store, task_id, why)


async def _cancel(queue: TriggerQueue, store: TaskStore, task_id: int, why: str) -> qc.TaskInfo | None:
    t = queue.triggers.get(task_id)
    if t is None:
        owner = queue.find(task_id)
        if owner is not None:
            raise IllegalArgument(f"task {task_id} is a child of trigger {owner.id}; cancel {owner.id}")
        return None
    if t.KIND in RELEASE_KINDS:
        raise IllegalArgument(f"task {task_id} is a release, which cannot be cancelled: its nodes may have "
                              "dropped part of what it releases; let it finish, then load what is needed")
    if t.cancel_why:  # asked again (a retry): the same answer
        return t.info()
    if t.id in queue.failing:
        raise Conflict(f"task {task_id} failed already and is rolling back: {t.rec.error}")
    if t.id in queue.cancel_reason:
        raise Conflict(f"task {task_id} is being cancelled already: {queue.cancel_reason[t.id]}")
    if t.id in queue.finishing:  # its tree ended: the keys being removed, a cancel key would name nothing to stop
        raise Conflict(f"task {task_id} already finished: {_ENDED.get(t.state, 'FAILED')}")
    if not await store.mark_cancel(t.id, why):
        return None  # finished between the look and the write
    t.cancel_why = why
    if t.state == UNDO and not queue.is_running(t.id):  # still queued: nothing to undo, finished now
        assert queue.finish_cancelled is not None
        queue.running[t.id] = asyncio.create_task(queue.finish_cancelled(t))
    return t.info()


__all__ = ["RELEASE_KINDS", "cancel_trigger"]
