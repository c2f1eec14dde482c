"""Durable task history: what finished trees did, kept in etcd so every coordinator can answer for them.

When a tree finishes, the scheduler writes its summary (a ``qc.TaskTree``:
the trigger with its outcome, error and timings, the counts of its children
by state, and at most ``history_children`` children with node, retries and
outcome) under ``queryCoord-taskHistory/<zero-padded trigger id>``, in the
very txn that removes the trigger's keys (``TaskStore.remove_tree``): the
history record appears exactly when the tree is gone, never twice, never for
a tree a new leader will resume. A record is kept well below etcd's value
limit (``MAX_RECORD_BYTES``), dropping listed children if need be.

Retention: the leader keeps the ``history_keep`` records that finished last
and drops those finished more than ``history_max_age`` ago, in batched deletes
(``prune``). Both go by the record's finish time, not its id: a trigger with a
low id can finish last. The leader reads each record's finish time once and
keeps it (records never change), so a sweep costs a keys-only read plus the
records written since the last one. Readers (a standby, a new leader) use
``TaskHistory`` with a plain, unfenced view.

Keys are zero-padded so that etcd's key order is id order: a page of history
is one range read.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from loguru import logger

from meta.kv import MetaKV
from meta.txn import Delete, Put, Unit
from proto import querycoord_pb2 as qc

HISTORY_PREFIX = "queryCoord-taskHistory/"
_ID_WIDTH = 20  # int64 ids have at most 19 digits
#: A record stays far below etcd's 1.5 MiB value limit; children past it are left out (their counts remain).
MAX_RECORD_BYTES = 64 * 1024
#: A listed child's error is cut to this many characters (the trigger keeps its whole error, at most 2000).
CHILD_ERROR_CHARS = 300
#: Bytes a listed child adds to its record besides its own: a field tag and a length of at most 3 bytes.
_CHILD_FRAMING = 4
#: Records read per range request.
_READ_CHUNK = 64
#: Keys deleted per txn while pruning (etcd allows 128 ops; one is the fence's).
_PRUNE_BATCH = 100

_SUCCESS = (qc.TASK_STATE_DONE, qc.TASK_STATE_EXPIRED)
_COUNT_NAMES = {qc.TASK_STATE_UNDO: "undo", qc.TASK_STATE_DOING: "doing", qc.TASK_STATE_DONE: "done",
                qc.TASK_STATE_EXPIRED: "expired", qc.TASK_STATE_FAILED: "failed", qc.TASK_STATE_CANCELLED: "failed"}


def history_key(task_id: int) -> str:
    return f"{HISTORY_PREFIX}{task_id:0{_ID_WIDTH}d}"


def key_id(key: str) -> int:
    """The trigger id of a history key; -1 for a key that is not one (an operator's hand)."""
    tail = key.removeprefix(HISTORY_PREFIX)
    return int(tail) if tail.isdigit() else -1


def summarize(trigger: qc.TaskInfo, children: Sequence[qc.TaskInfo], *, started_ms: int, finished_ms: int,
              max_children: int) -> qc.TaskTree:
    """The history record of a finished tree.

    Children are counted by state in full; at most ``max_children`` are listed, those that did not succeed
    first (they explain a failure), then in id order, and fewer if the record would pass ``MAX_RECORD_BYTES``.
    """
    counts = qc.ChildStateCounts(total=len(children))
    for c in children:
        name = _COUNT_NAMES.get(c.state)
        if name:
            setattr(counts, name, getattr(counts, name) + 1)
    top = qc.TaskInfo()
    top.CopyFrom(trigger)
    top.started_ms, top.finished_ms = started_ms, finished_ms
    budget = MAX_RECORD_BYTES - qc.TaskTree(trigger=top, child_counts=counts).ByteSize()
    listed: list[qc.TaskInfo] = []
    for c in sorted(children, key=lambda c: (c.state in _SUCCESS, c.task_id))[:max_children]:
        kept = qc.TaskInfo()
        kept.CopyFrom(c)
        if len(kept.error) > CHILD_ERROR_CHARS:
            kept.error = kept.error[: CHILD_ERROR_CHARS - 1] + "…"
        cost = kept.ByteSize() + _CHILD_FRAMING
        if cost > budget:
            break
        budget -= cost
        listed.append(kept)
    listed.sort(key=_task_id)
    return qc.TaskTree(trigger=top, children=listed, child_counts=counts)


def _task_id(info: qc.TaskInfo) -> int:
    return info.task_id


def history_unit(tree: qc.TaskTree) -> Unit:
    return Unit([Put(history_key(tree.trigger.task_id), tree.SerializeToString())])


def _chunks(ids: Sequence[int], n: int) -> Iterator[list[int]]:
    it = iter(ids)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


class TaskHistory:
    """Reads the history (any coordinator) and prunes it (the leader, through its fenced view)."""

    def __init__(self, kv: MetaKV):
        self.kv = kv
        self._finish_ms: dict[int, int] = {}  # finish times read so far (``finish_times``)

    async def ids(self) -> list[int]:
        """Every trigger id in the history, ascending (a keys-only read)."""
        snap = await self.kv.load_prefix(HISTORY_PREFIX, keys_only=True)
        return sorted(i for i in (key_id(kv.key) for kv in snap.kvs) if i >= 0)

    async def count(self) -> int:
        return await self.kv.count_prefix(HISTORY_PREFIX)

    async def get(self, task_id: int) -> qc.TaskTree | None:
        """The record of trigger ``task_id``, if the history has it."""
        raw = await self.kv.get(history_key(task_id))
        return None if raw is None else _decode(history_key(task_id), raw)

    async def _span_raw(self, lo: int, hi: int) -> dict[int, bytes]:
        """Stored values of ids ``lo..hi``, read in pages from ``lo``'s key until past ``hi``'s."""
        out: dict[int, bytes] = {}
        start = history_key(lo)
        while True:
            kvs, more = await self.kv.range_page(HISTORY_PREFIX, start=start, limit=_READ_CHUNK)
            for kv in kvs:
                i = key_id(kv.key)
                if i > hi:
                    return out
                if i >= 0:
                    out[i] = kv.value
            if not more or not kvs:
                return out
            start = kvs[-1].key + "\x00"

    async def _span(self, lo: int, hi: int) -> dict[int, qc.TaskTree]:
        """Records of ids ``lo..hi`` (values that are not task trees left out)."""
        out: dict[int, qc.TaskTree] = {}
        for i, raw in (await self._span_raw(lo, hi)).items():
            tree = _decode(history_key(i), raw)
            if tree is not None:
                out[i] = tree
        return out

    async def page(self, *, after: int = 0, newest_first: bool = False, want: int,
                   keep: Callable[[qc.TaskTree], bool] = lambda _t: True) -> list[qc.TaskTree]:
        """Up to ``want`` records that ``keep`` accepts, in id order (``newest_first``: descending), past
        ``after`` (ascending: ids above it; descending: ids below it, 0 meaning from the newest)."""
        ids = await self.ids()
        if newest_first:
            ids = [i for i in reversed(ids) if not after or i < after]
        else:
            ids = [i for i in ids if i > after]
        out: list[qc.TaskTree] = []
        for chunk in _chunks(ids, _READ_CHUNK):
            got = await self._span(min(chunk), max(chunk))
            for i in chunk:
                tree = got.get(i)
                if tree is not None and keep(tree):
                    out.append(tree)
                    if len(out) >= want:
                        return out
        return out

    async def find(self, task_id: int) -> qc.TaskTree | None:
        """The record of a trigger id, or of the trigger that lists child ``task_id`` (children have larger ids
        than their trigger, so older records are searched, newest first)."""
        tree = await self.get(task_id)
        if tree is not None:
            return tree
        older = [i for i in reversed(await self.ids()) if i < task_id]
        for chunk in _chunks(older, _READ_CHUNK):
            got = await self._span(min(chunk), max(chunk))
            for i in chunk:
                t = got.get(i)
                if t is not None and any(c.task_id == task_id for c in t.children):
                    return t
        return None

    async def finish_times(self) -> dict[int, int]:
        """The finish time (ms) of every record, by trigger id: a keys-only read, then the values of records
        not seen before (a record never changes once written, so a time read once holds for this object's life;
        the leader's pruner reads each record once, not at every sweep). A value that is not a task tree counts
        as finished at 0: the oldest, first to go."""
        ids = await self.ids()
        present = set(ids)
        for gone in [i for i in self._finish_ms if i not in present]:
            del self._finish_ms[gone]
        missing = [i for i in ids if i not in self._finish_ms]
        for run in _runs(ids, set(missing)):
            for chunk in _chunks(run, _READ_CHUNK):
                got = await self._span_raw(min(chunk), max(chunk))
                for i in chunk:
                    raw = got.get(i)
                    if raw is None:
                        continue  # deleted since the keys were read
                    tree = _decode(history_key(i), raw)
                    self._finish_ms[i] = tree.trigger.finished_ms if tree is not None else 0
        return {i: self._finish_ms[i] for i in ids if i in self._finish_ms}

    async def prune(self, *, keep: int, max_age_s: float, now_ms: int) -> int:
        """Delete the records past the ``keep`` newest by finish time, and those finished more than
        ``max_age_s`` ago (0: no age limit), in txns of ``_PRUNE_BATCH`` deletes. Returns how many were deleted.

        By finish time, not id: a trigger with a low id can finish last (a long load), and it is the newest
        record, the one an operator asks about. Ties go by id."""
        finished = await self.finish_times()
        oldest_first = sorted(finished, key=lambda i: (finished[i], i))
        doomed = set(oldest_first[: max(0, len(oldest_first) - keep)])
        if max_age_s > 0:
            cutoff = now_ms - int(max_age_s * 1000)
            doomed.update(i for i, ms in finished.items() if ms and ms < cutoff)
        if not doomed:
            return 0
        for chunk in _chunks(sorted(doomed), _PRUNE_BATCH):
            batches = self.kv.pack([Unit([Delete(history_key(i)) for i in chunk])])
            await self.kv.write_packed(batches, operation="task history prune")
            for i in chunk:
                self._finish_ms.pop(i, None)
        logger.info("task history: pruned {} records (keep {}, max age {:g}s)", len(doomed), keep, max_age_s)
        return len(doomed)


def _runs(ids: Sequence[int], wanted: set[int]) -> Iterator[list[int]]:
    """The maximal runs of consecutive ``ids`` (in key order) that are all ``wanted``: each is one range read
    that fetches nothing else."""
    run: list[int] = []
    for i in ids:
        if i in wanted:
            run.append(i)
        elif run:
            yield run
            run = []
    if run:
        yield run


def _decode(key: str, raw: bytes) -> qc.TaskTree | None:
    try:
        return qc.TaskTree.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError: a value written by another hand
        logger.warning("task history: {} does not hold a task tree ({}); skipped", key, exc)
        return None


__all__ = ["HISTORY_PREFIX", "MAX_RECORD_BYTES", "TaskHistory", "history_key", "history_unit", "key_id",
           "summarize"]
