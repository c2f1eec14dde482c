"""What a standby answers reads (ShowCollections, GetReplicas, ListTasks, GetTask) from: never one rebuild per call.

Why: a reload of the whole query meta from etcd per call costs hundreds of
MiB at 100k segments, so a few dozen concurrent readers would exhaust a
standby's memory, and then nobody would take over when the leader died.

The query meta comes from the warm standby's copy (``querymeta.mirror``,
followed by a watch) once it has caught up with etcd's current revision, so
an answer is as current as a reload would have been; the catch-up is shared
by the callers that ask together. Without a usable copy (``warm_standby =
0``, the copy being read again after a broken watch, etcd slow) callers
share one reload (``shared_run.SharedRun``): the memory is one copy however
many call. The task records a standby shows are read the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loguru import logger

from meta.errors import MetaError
from querycoord.common.shared_run import SharedRun
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.mirror import CATCH_UP_TIMEOUT
from querycoord.task.store import TaskStore

if TYPE_CHECKING:
    from querycoord.leader.view import CoordinatorView


class StandbyReads:
    """A standby's reads of the query meta and the task records (see module docstring)."""

    def __init__(self, coord: CoordinatorView):
        self._coord = coord
        self._catch_up = SharedRun(self._caught_up, "standby-catch-up")
        self._reload = SharedRun(self._reloaded, "standby-reload")
        self._tasks = SharedRun(self._task_records, "standby-task-records")

    @property
    def reloads(self) -> int:
        """Full reloads of the query meta so far (the fallback; tests and benchmarks count them)."""
        return self._reload.runs

    async def meta(self) -> QueryMeta:
        """The query meta as current as etcd was when this call began; read it before the next await (a copy
        from the warm standby changes in place as the watch goes on)."""
        mirror = self._coord.mirror
        if mirror is not None:
            try:
                await self._catch_up()
            except (TimeoutError, MetaError) as exc:
                logger.debug("standby read: the warm copy is not usable ({}); a shared reload answers",
                             exc or "it did not catch up in time")
            else:
                index = mirror.index
                if index is not None and self._coord.mirror is mirror and self._coord.kv is not None:
                    return QueryMeta.reading(self._coord.kv, index)
        return await self._reload()

    async def task_records(self) -> list:
        """The persisted task records (what a standby knows of running trees), read once for concurrent callers."""
        return await self._tasks()

    async def _caught_up(self) -> int:
        mirror = self._coord.mirror
        if mirror is None:
            raise TimeoutError("the warm standby's copy is gone (this coordinator took over or stopped)")
        return await mirror.catch_up(CATCH_UP_TIMEOUT)

    async def _reloaded(self) -> QueryMeta:
        assert self._coord.kv is not None
        meta = QueryMeta(self._coord.kv)
        await meta.reload()
        return meta

    async def _task_records(self) -> list:
        assert self._coord.kv is not None
        return await TaskStore(self._coord.kv).load_all()


__all__ = ["StandbyReads"]
