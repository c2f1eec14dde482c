"""Persistence of task trees under etcd prefixes, with explicit commit points.

Each task has two keys, created and removed in the same txn:
``queryCoord-triggerTask/<id>`` (a trigger) or ``queryCoord-activeTask/<id>``
(a child) holds the request; ``queryCoord-taskInfo/<id>`` holds the
``TaskRecord`` without its request (kind, parent, state, retries, trigger
condition, excluded nodes...). Milvus kept a decimal state there that could
drift from the request; here a request that changes is written with its
info, and only a state change of a request that never changes (a child
done: ``save_state``) writes the info alone.

Commit points (DESIGN.md rule 2), which reload relies on:

* children of a trigger are written first, in as many txns as etcd's limits
  need; the trigger's flip to DONE is in the last txn. A trigger that is not
  DONE on reload has no committed children: they are garbage.
* a rescheduled child's replacements are written first; the failed child's
  removal is in the last txn. A replacement whose predecessor still exists
  on reload is garbage.
* a finished tree is removed children first, trigger last; its history
  record (``task.history``) is written in the txn that removes the trigger.

CancelTask's request for a trigger is a key of its own,
``queryCoord-taskCancel/<trigger id>`` (the reason and who asked), written
only while the trigger's record exists (``mark_cancel``) and removed in the
txn that removes the trigger's keys. No plan or state write touches it, so a
record rewritten while the cancel is being stored (the plan's commit) cannot
lose it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from meta.kv import Batch, MetaKV, TxnResult
from meta.txn import Delete, Op, Put, Unit, absent
from proto import querycoord_pb2 as qc
from proto import task_pb2
from querycoord.task.history import history_unit

TRIGGER_PREFIX = "queryCoord-triggerTask/"
ACTIVE_PREFIX = "queryCoord-activeTask/"
INFO_PREFIX = "queryCoord-taskInfo/"
CANCEL_PREFIX = "queryCoord-taskCancel/"
TASK_PREFIXES = (TRIGGER_PREFIX, ACTIVE_PREFIX, INFO_PREFIX, CANCEL_PREFIX)


def request_key(rec: task_pb2.TaskRecord) -> str:
    return f"{TRIGGER_PREFIX if rec.parent_id == 0 else ACTIVE_PREFIX}{rec.id}"


def info_key(task_id: int) -> str:
    return f"{INFO_PREFIX}{task_id}"


def cancel_key(trigger_id: int) -> str:
    """Where CancelTask's request for trigger ``trigger_id`` is kept (see module docstring)."""
    return f"{CANCEL_PREFIX}{trigger_id}"


def split_record(rec: task_pb2.TaskRecord) -> tuple[bytes, bytes]:
    """(request bytes, info bytes): the info is the record with its request cleared."""
    case = rec.WhichOneof("request")
    return (getattr(rec, case).SerializeToString() if case else b""), info_only(rec)


def info_only(rec: task_pb2.TaskRecord) -> bytes:
    """The info key's value of ``rec``: the record with its request cleared (``split_record``'s second half)."""
    case = rec.WhichOneof("request")
    info = task_pb2.TaskRecord()
    info.CopyFrom(rec)
    if case:
        info.ClearField(case)
    # The request's case name is kept so that reload knows how to decode it.
    return _with_case(info, case).SerializeToString()


def _with_case(info: task_pb2.TaskRecord, case: str | None) -> task_pb2.TaskRecord:
    # Record which oneof the request belongs to by setting an empty message of that case:
    # an empty sub-message still marks the case and costs two bytes.
    if case:
        getattr(info, case).SetInParent()
    return info


def join_record(info_bytes: bytes, request_bytes: bytes | None) -> task_pb2.TaskRecord:
    rec = task_pb2.TaskRecord.FromString(info_bytes)
    case = rec.WhichOneof("request")
    if case and request_bytes is not None:
        getattr(rec, case).MergeFromString(request_bytes)
    return rec


@dataclass
class TaskKeys:
    """Keys that must change in the same txn (one task's two keys)."""

    saves: dict[str, bytes] = field(default_factory=dict)
    removals: list[str] = field(default_factory=list)

    def unit(self) -> Unit:
        """The txn unit ``pack`` keeps whole: the saves, then the removals."""
        ops: list[Op] = [Put(k, v) for k, v in self.saves.items()]
        ops.extend(Delete(k) for k in self.removals)
        return Unit(ops)


def save_unit(rec: task_pb2.TaskRecord) -> TaskKeys:
    request, info = split_record(rec)
    return TaskKeys(saves={request_key(rec): request, info_key(rec.id): info})


def remove_unit(rec: task_pb2.TaskRecord) -> TaskKeys:
    """A task's keys to remove together; a trigger's cancel request (if any) goes with them."""
    removals = [request_key(rec), info_key(rec.id)]
    if rec.parent_id == 0:
        removals.append(cancel_key(rec.id))
    return TaskKeys(removals=removals)


class TaskStore:
    """Reads and writes task records; the coordinator gives it its fenced KV."""

    def __init__(self, kv: MetaKV):
        self.kv = kv
        self.txns = 0  # etcd write txns made, for benchmarks and tests
        self.orphan_request_keys: list[str] = []
        self.orphan_cancel_keys: list[str] = []

    async def _write(self, units: Sequence[TaskKeys], last: TaskKeys | None = None, *,
                     with_last: Sequence[Op] = ()) -> None:
        """``units`` then ``last`` (the commit point) in as few txns as etcd allows, the commit point's last;
        ``with_last``: ops that must share the commit point's txn."""
        if last is None:
            if not units:
                return
            units, last = units[:-1], units[-1]
        commit = last.unit()
        commit.ops = [*commit.ops, *with_last]
        batches = self.kv.pack([u.unit() for u in units], commit)
        await self.kv.write_packed(batches, operation="task store", on_sent=self._sent)

    def _sent(self, _batch: Batch, _result: TxnResult) -> None:
        self.txns += 1

    async def add_trigger(self, rec: task_pb2.TaskRecord) -> None:
        """Persist a new trigger (state UNDO) in one txn."""
        await self._write([], save_unit(rec))

    async def save(self, *recs: task_pb2.TaskRecord) -> None:
        """Rewrite records whose state or retries changed (the request is rewritten with them)."""
        await self._write([save_unit(r) for r in recs])

    async def save_state(self, rec: task_pb2.TaskRecord) -> None:
        """Rewrite the info key alone: for a task whose request is the one already stored (a child's never
        changes once planned), a state change (DONE) leaves the request key as it is, so both still agree.

        Why: a load child's request holds its segments (a few hundred KB for a big load); rewriting it at DONE
        wrote every load's requests to etcd twice, beside the segment records etcd was busy writing.
        """
        await self._write([TaskKeys(saves={info_key(rec.id): info_only(rec)})])

    async def mark_cancel(self, trigger_id: int, why: str) -> bool:
        """Store CancelTask's request ``why`` for trigger ``trigger_id`` (its cancel key), in one txn and only
        while the trigger's record exists: a tree that finished meanwhile leaves no cancel key behind. True when
        written."""
        result = await self.kv.txn([absent(info_key(trigger_id))], [],
                                   on_failure_ops=[Put(cancel_key(trigger_id), why.encode())],
                                   operation="task cancel")
        return not result.succeeded

    async def commit_children(self, trigger: task_pb2.TaskRecord, children: Sequence[task_pb2.TaskRecord]) -> None:
        """Children first; the trigger's record (now DONE) in the last txn: the commit point."""
        await self._write([save_unit(c) for c in children], save_unit(trigger))

    async def replace_child(self, old: task_pb2.TaskRecord, new: Sequence[task_pb2.TaskRecord]) -> None:
        """Replacements first; the failed child's removal in the last txn."""
        await self._write([save_unit(c) for c in new], remove_unit(old))

    async def remove_tree(self, trigger: task_pb2.TaskRecord, children: Sequence[task_pb2.TaskRecord],
                          history: qc.TaskTree | None = None) -> None:
        """Children first, trigger last: a crash in between leaves a smaller, still valid tree. ``history``
        (the tree's summary, ``task.history``) is written in the txn that removes the trigger, so it exists
        exactly when the tree is gone. Writing it again (a retried removal) writes the same key and value."""
        extra = history_unit(history).ops if history is not None else ()
        await self._write([remove_unit(c) for c in children], remove_unit(trigger), with_last=extra)

    async def remove(self, recs: Sequence[task_pb2.TaskRecord]) -> None:
        await self._write([remove_unit(r) for r in recs])

    async def load_all(self) -> list[task_pb2.TaskRecord]:
        """Every persisted task, joined from its two keys. Keys with no partner are dropped later as garbage."""
        infos = (await self.kv.load_prefix(INFO_PREFIX)).kvs
        requests = {kv.key: kv.value for kv in (await self.kv.load_prefix(TRIGGER_PREFIX)).kvs}
        requests.update({kv.key: kv.value for kv in (await self.kv.load_prefix(ACTIVE_PREFIX)).kvs})
        out = []
        for item in infos:
            rec = task_pb2.TaskRecord.FromString(item.value)
            req = requests.pop(request_key(rec), None)
            out.append(join_record(item.value, req))
        # A request key with no record (a crash cannot make one: both keys change in one txn,
        # but an operator's hand can) is garbage that reload removes.
        self.orphan_request_keys = list(requests)
        return out

    async def load_cancels(self, trigger_ids: set[int]) -> dict[int, str]:
        """CancelTask's requests by trigger id, for the triggers in ``trigger_ids`` (the records ``load_all``
        read); a cancel key of no such trigger (only a hand from outside makes one) is kept in
        ``orphan_cancel_keys`` for reload to remove."""
        out: dict[int, str] = {}
        self.orphan_cancel_keys = []
        for item in (await self.kv.load_prefix(CANCEL_PREFIX)).kvs:
            tail = item.key[len(CANCEL_PREFIX):]
            if tail.isdigit() and int(tail) in trigger_ids:
                out[int(tail)] = item.value.decode(errors="replace")
            else:
                self.orphan_cancel_keys.append(item.key)
        return out

    async def remove_keys(self, keys: Sequence[str]) -> None:
        await self._write([TaskKeys(removals=[k]) for k in keys])

    async def count_keys(self) -> dict[str, int]:
        return {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}

