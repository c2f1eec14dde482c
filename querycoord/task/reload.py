"""Rebuilding the queue from etcd when a leader takes over (see the commit points in ``task.store``).

Reload never blocks start-up: records are read page by page and queued in memory with no capacity limit
(Milvus problem 1). Children of an uncommitted plan or reschedule, and trees of unknown or ended kinds, are
garbage and removed.
"""

from __future__ import annotations

from collections.abc import Callable

from loguru import logger

from proto import task_pb2
from querycoord.task import repair, resize  # noqa: F401  (their kinds register in Task.KINDS, which reload reads)
from querycoord.task.model import CANCELLED, DONE, EXPIRED, FAILED, Task, TaskEnv
from querycoord.task.triggers import TriggerTask


def _committed_children(records: list[task_pb2.TaskRecord], garbage: list[task_pb2.TaskRecord]
                        ) -> dict[int, list[task_pb2.TaskRecord]]:
    """Children by parent id, for parents whose plan is committed; the others go to ``garbage``."""
    by_id = {r.id: r for r in records}
    children: dict[int, list[task_pb2.TaskRecord]] = {}
    for r in records:
        if r.parent_id == 0:
            continue
        parent = by_id.get(r.parent_id)
        if parent is None or parent.state != DONE or (r.replaces_task_id and r.replaces_task_id in by_id):
            garbage.append(r)  # uncommitted plan or uncommitted reschedule
        else:
            children.setdefault(r.parent_id, []).append(r)
    return children


def _attach_children(env: TaskEnv, t: TriggerTask, records: list[task_pb2.TaskRecord],
                     garbage: list[task_pb2.TaskRecord]) -> None:
    for cr in sorted(records, key=lambda c: c.id):
        ccls = Task.KINDS.get(cr.WhichOneof("request") or "")
        if ccls is None or ccls.IS_TRIGGER:
            garbage.append(cr)
            continue
        child = ccls(env, cr)
        child.parent = t
        t.children.append(child)


async def reload_trees(env: TaskEnv, push: Callable[[TriggerTask], None]) -> int:
    """Read every persisted tree, ``push`` each trigger to resume (oldest first), remove the garbage; returns
    how many triggers were queued."""
    records = await env.store.load_all()
    cancels = await env.store.load_cancels({r.id for r in records if r.parent_id == 0})
    garbage: list[task_pb2.TaskRecord] = []
    children = _committed_children(records, garbage)
    queued = 0
    for r in sorted((r for r in records if r.parent_id == 0), key=lambda r: r.id):
        cls = Task.KINDS.get(r.WhichOneof("request") or "")
        if cls is None or not issubclass(cls, TriggerTask) or r.state in (EXPIRED, FAILED, CANCELLED):
            garbage.append(r)
            garbage.extend(children.pop(r.id, []))
            continue
        t = cls(env, r)
        t.resumed = True
        t.cancel_why = cancels.get(r.id, "")
        if r.state == DONE:
            _attach_children(env, t, children.pop(r.id, []), garbage)
        else:
            garbage.extend(children.pop(r.id, []))
        push(t)
        queued += 1
    if garbage:
        await env.store.remove(garbage)
    if env.store.orphan_request_keys:
        await env.store.remove_keys(env.store.orphan_request_keys)
    if env.store.orphan_cancel_keys:
        await env.store.remove_keys(env.store.orphan_cancel_keys)
    logger.info("scheduler reload: {} triggers queued, {} garbage records removed", queued, len(garbage))
    return queued
