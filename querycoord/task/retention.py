"""Finished trees leave etcd: their keys are removed in the txn that writes their history record, removals etcd
refused are retried, and the task history is pruned to its configured count and age."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from loguru import logger

from meta.errors import MetaError, NotLeader
from meta.loops import loop_failed
from proto import querycoord_pb2 as qc
from proto import task_pb2
from querycoord.task.history import TaskHistory, summarize
from querycoord.task.leadership import Abandon, Lifecycle
from querycoord.task.model import TaskEnv, now_ms
from querycoord.task.triggers import TriggerTask


class Retention:
    """Removal of finished trees and pruning of the history (``started_ms``: the queue's, read by trigger id)."""

    def __init__(self, env: TaskEnv, life: Lifecycle, started_ms: Mapping[int, int]):
        self.env = env
        self.cfg = env.config
        self.life = life
        self.started_ms = started_ms
        # Finished trees whose keys etcd did not take away (with their history record); retried by
        # ``sweep_unremoved``.
        self.unremoved: list[tuple[task_pb2.TaskRecord, list[task_pb2.TaskRecord], qc.TaskTree | None]] = []
        self._kick = asyncio.Event()  # enough trees finished since the last pruning of the history
        self._finished_since_prune = 0
        self._history = TaskHistory(env.store.kv)  # kept: it remembers the finish times it has read

    def finished_one(self) -> None:
        """A tree finished: prune before the history grows past its bound by more than a tenth."""
        self._finished_since_prune += 1
        if self.cfg.history_keep > 0 and self._finished_since_prune >= max(1, self.cfg.history_keep // 10):
            self._kick.set()

    def history_record(self, t: TriggerTask) -> qc.TaskTree | None:
        """The finished tree's task-history record (``task.history``); None when no history is kept.

        Started: when this coordinator began running it, or (a tree resumed by a new leader) its plan's
        time, the creation of its oldest child, if earlier.
        """
        if self.cfg.history_keep <= 0:
            return None
        children = [c.info() for c in t.children if c.id]
        finished = now_ms()
        started = min([self.started_ms.get(t.id, finished), *(c.created_ms for c in children if c.created_ms)])
        return summarize(t.info(), children, started_ms=started, finished_ms=finished,
                         max_children=self.cfg.history_children)

    async def remove_tree(self, t: TriggerTask) -> None:
        """Remove the finished tree's keys, writing its history record in the txn that removes the trigger;
        retried, since keys left behind would be resumed by a new leader."""
        recs = [c.rec for c in t.children if c.id]
        history = self.history_record(t)
        for attempt in range(1, 4):
            try:
                await self.env.store.remove_tree(t.rec, recs, history)
                return
            except NotLeader as exc:
                self.life.lost(exc)
                raise Abandon from exc
            except MetaError as exc:
                logger.error("{}: could not remove its keys (attempt {}): {}", t.describe(), attempt, exc)
                await asyncio.sleep(self.cfg.retry_backoff * attempt)
        self.unremoved.append((t.rec, recs, history))

    def remove_later(self, rec: task_pb2.TaskRecord) -> None:
        """A trigger whose persist got no answer (it may be in etcd, though nothing queued it): its keys are
        removed with the finished trees' left behind, at the next sweep; it leaves no history record, as it never
        ran. Removing keys that were never written writes nothing wrong."""
        logger.warning("task {}: persisting it got no answer from etcd; its keys, if written, are removed at the "
                       "next sweep", rec.id)
        self.unremoved.append((rec, [], None))

    async def sweep_unremoved(self) -> int:
        """Retry removing the keys of finished trees whose removal failed (etcd trouble at the time)."""
        done = 0
        while self.unremoved and not self.life.stopped:
            rec, recs, history = self.unremoved[0]
            await self.env.store.remove_tree(rec, recs, history)
            self.unremoved.pop(0)
            done += 1
        return done

    async def prune_history(self) -> int:
        """Prune the task history to its configured count and age (``TaskHistory.prune``); returns how many
        records were deleted. With ``history_keep`` 0 no history is written, and whatever an earlier
        configuration left is pruned away."""
        self._finished_since_prune = 0
        return await self._history.prune(
            keep=self.cfg.history_keep, max_age_s=self.cfg.history_max_age, now_ms=now_ms())

    async def prune_loop(self) -> None:
        """The leader's periodic sweep of the task history (also kicked when many trees finished)."""
        while not self.life.stopped:
            try:
                await self.prune_history()
            except NotLeader as exc:
                self.life.lost(exc)
                return
            except Exception as exc:  # etcd trouble or a bug: never let the sweep die
                if loop_failed("task history pruner", exc, self.env.store.kv.client):
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.cfg.history_sweep_interval)
            self._kick.clear()
