"""Task trees as the scheduler's ``reload`` expects them (``task.store``'s commit points).

Well-formed: each task is two keys written and removed in one txn (request
under ``triggerTask/`` or ``activeTask/``, record under ``taskInfo/``), so a
crash never leaves one without the other; a child exists only under an
existing trigger (children are written after their trigger and removed
before it); a trigger committed (DONE) has its children (the commit is the
txn after them, and a finished tree is removed children first, so a DONE
trigger with none left is a tree whose children someone deleted, or a removal
cut short: nothing is left to do for it). Only a hand from outside, or a
lost removal, breaks these. A plan not yet committed (children under a
trigger that is not DONE) is normal: the next leader drops it, so it is not
reported. A trigger's cancel request (``taskCancel/<id>``) exists only while
the trigger's record does (written under that condition, removed with the
trigger's keys): one without its trigger is a problem, one with it is not.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from meta.txn import absent
from proto import querycoord_pb2 as qc
from proto import task_pb2
from querycoord.task.store import (
    ACTIVE_PREFIX,
    CANCEL_PREFIX,
    INFO_PREFIX,
    TRIGGER_PREFIX,
    cancel_key,
    info_key,
    request_key,
)

from .problems import Found, Problem, delete_fix
from .snapshot import Snapshot

DONE = qc.TASK_STATE_DONE  # a trigger's commit point


def _decode(key: str, value: bytes) -> task_pb2.TaskRecord | None:
    try:
        rec = task_pb2.TaskRecord.FromString(value)
    except DecodeError:
        return None
    return rec if rec.id > 0 and key == info_key(rec.id) else None


def check_tasks(snap: Snapshot, found: Found) -> None:
    requests = {kv.key: kv for p in (TRIGGER_PREFIX, ACTIVE_PREFIX) for kv in snap.under(p)}
    good: dict[int, task_pb2.TaskRecord] = {}
    for item in snap.under(INFO_PREFIX):
        rec = _decode(item.key, item.value)
        if rec is None:
            found.add(Problem("corrupt-task-record", (item.key,), "not a TaskRecord for its key",
                              delete_fix("delete the record", [item])))
            continue
        req = requests.pop(request_key(rec), None)
        if rec.WhichOneof("request") and req is None:
            found.add(Problem("record-without-request", (item.key,),
                              f"task {rec.id}: {request_key(rec)} is missing",
                              delete_fix("delete the record", [item], (absent(request_key(rec)),))))
            continue
        good[rec.id] = rec
    for key, req in requests.items():  # no record took them
        found.add(Problem("request-without-record", (key,), f"no {INFO_PREFIX}{key.rsplit('/', 1)[-1]}",
                          delete_fix("delete the request key", [req])))
    children: dict[int, list[int]] = {}
    for rec in good.values():
        if rec.parent_id == 0:
            continue
        parent = good.get(rec.parent_id)
        if parent is None or parent.parent_id != 0:
            kvs = [kv for k in (request_key(rec), info_key(rec.id)) if (kv := snap.get(k)) is not None]
            why = "does not exist" if parent is None else "is a child, not a trigger"
            found.add(Problem("child-without-trigger", tuple(k.key for k in kvs),
                              f"child {rec.id}: its trigger {rec.parent_id} {why}",
                              delete_fix("delete the child's keys", kvs, (absent(info_key(rec.parent_id)),)
                                         if parent is None else ())))
            continue
        children.setdefault(rec.parent_id, []).append(rec.id)
    for rec in good.values():
        if rec.parent_id == 0 and rec.state == DONE and not children.get(rec.id):
            kvs = [kv for k in (request_key(rec), info_key(rec.id), cancel_key(rec.id))
                   if (kv := snap.get(k)) is not None]
            found.add(Problem("committed-trigger-without-children", tuple(k.key for k in kvs),
                              f"trigger {rec.id} (collection {rec.collection_id}) committed its plan but none of "
                              "its children exist; the checker reconciles what it was doing",
                              delete_fix("delete the trigger's keys", kvs)))
    _check_cancels(snap, found, {r.id for r in good.values() if r.parent_id == 0})


def _check_cancels(snap: Snapshot, found: Found, triggers: set[int]) -> None:
    """Cancel requests whose trigger record does not exist (a record dropped above as malformed counts as not
    existing: its fix deletes it, and the cancel would be left behind)."""
    for item in snap.under(CANCEL_PREFIX):
        tail = item.key[len(CANCEL_PREFIX):]
        if tail.isdigit() and int(tail) in triggers:
            continue
        guard = (absent(info_key(int(tail))),) if tail.isdigit() and snap.get(info_key(int(tail))) is None else ()
        found.add(Problem("cancel-without-trigger", (item.key,), f"no trigger record {INFO_PREFIX}{tail}",
                          delete_fix("delete the cancel request", [item], guard)))


__all__ = ["check_tasks"]
