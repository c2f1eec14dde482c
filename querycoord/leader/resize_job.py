"""Resizing a loaded collection's replicas: UpdateLoadConfig, and LoadCollection asking a loaded collection for
another number (Milvus 2.4 resizes in place too).

A resize is checked whole before anything is queued: every collection named is loaded (NOT_FOUND), a grow has
spare nodes and memory for its new replicas (NO_AVAILABLE_NODE, RESOURCE_EXHAUSTED; ``task.resize_plan``, the
collections of one request weighed together), and a collection already at the number asked is SUCCESS with
nothing queued. A resize asked while another trigger of the collection (a load, a resize, a repair) is queued or
running queues behind it; the number it is compared with is then the one the pending load or resize leaves, and
the fit is checked when it runs. The same resize asked again joins the pending one.
"""

from __future__ import annotations

from typing import Any, TypeVar

from proto import data_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.errors import Conflict, NotFound
from querycoord.common.limits import Limits
from querycoord.common.replica_number import asked_replicas, check_resize, loaded_replicas, replica_number
from querycoord.common.validate import check_ids
from querycoord.leader.jobs import GRPC, RELEASE_KINDS, Job, LoadCollectionJob, Until
from querycoord.task.resize import UpdateLoadConfigTask, resize_request
from querycoord.task.resize_plan import plan_resize
from querycoord.task.triggers import TriggerTask
from querycoord.task.units import usage_of

RESIZE = qc.TASK_KIND_UPDATE_LOAD_CONFIG
_LOADS = (qc.TASK_KIND_LOAD_COLLECTION, qc.TASK_KIND_LOAD_PARTITION)
R = TypeVar("R")


class _Resizing:
    """What a resize job reads of the leader's state: the number a collection has or will have."""

    def __init__(self, job: Job[Any]):
        self.job = job
        self.scheduler = job.scheduler
        self.meta = job.meta

    def pending_resize(self, cid: int) -> TriggerTask | None:
        """The newest resize of the collection queued or running (not being cancelled)."""
        pending = self.scheduler.pending(cid, (RESIZE,), cancelled=False)
        return pending[-1] if pending else None

    def current(self, cid: int) -> tuple[int, bool]:
        """The number the collection has once its pending loads and resizes are done, and whether one is
        pending (0: not loaded nor being loaded, or being released)."""
        if self.scheduler.pending(cid, RELEASE_KINDS):
            return 0, False
        resize = self.pending_resize(cid)
        if resize is not None:
            return resize.request.replica_number, True
        loads = self.scheduler.pending(cid, _LOADS, cancelled=False)
        info = self.meta.get_collection(cid)
        if info is not None:
            return loaded_replicas(info), bool(loads)
        if loads:
            return replica_number(loads[0].request, None), True
        return 0, False


class ResizeJob(Job[R]):
    """A job that may resize: ``resize`` checks and queues (see module docstring)."""

    async def resize(self, collection_ids: list[int], number: int) -> list[int]:
        """Check the resize of every collection to ``number`` replicas, then queue one trigger per collection that
        changes and wait for each plan; their ids in order (0: already at that number)."""
        state = _Resizing(self)
        usage = usage_of(self.env)  # shared: two collections' new replicas do not count the same free memory twice
        todo: list[tuple[int, int, TriggerTask | None]] = []
        for cid in collection_ids:
            current, pending = state.current(cid)
            if not current:
                raise NotFound(f"collection {cid} is not loaded: load it with --replicas {number} instead")
            if current == number:
                todo.append((cid, current, state.pending_resize(cid)))  # joins a pending resize, else nothing to do
                continue
            info = self.meta.get_collection(cid)
            if info is not None and not info.replicas:
                raise Conflict(f"collection {cid} was loaded before replicas existed: release it and load it again "
                               "to change its replica number")
            if info is not None and not pending:
                plan_resize(self.env, info, number, usage)  # refuses a grow that cannot fit, before anything is queued
            todo.append((cid, current, None))
        ids: list[int] = []
        for cid, current, joined in todo:
            if joined is not None:
                ids.append(await self._wait(joined, Until.PLANNED))
            elif current == number:
                ids.append(0)
            else:
                task = UpdateLoadConfigTask.new(self.env, resize_request(cid, number, current),
                                                trigger_condition=GRPC, collection_id=cid)
                ids.append(await self._submit(task, Until.PLANNED))
        return ids


class UpdateLoadConfigJob(ResizeJob[qc.UpdateLoadConfigRequest]):
    """UpdateLoadConfig: resize every collection named (see module docstring)."""

    @staticmethod
    def check(request: qc.UpdateLoadConfigRequest, limits: Limits) -> None:
        check_ids("collection_ids", request.collection_ids, limits.max_ids_per_request, required=True)
        check_resize(request, limits)

    async def run(self) -> int:
        ids = await self.run_all()
        return ids[0] if ids else 0

    async def run_all(self) -> list[int]:
        """The trigger id of each collection, in the request's order (0: nothing to do)."""
        return await self.resize(list(self.request.collection_ids), self.request.replica_number)


class LoadOrResizeJob(LoadCollectionJob, ResizeJob[qc.LoadCollectionRequest]):
    """LoadCollection: a collection loaded (or being loaded) as a whole with another number than the one asked is
    resized in place; anything else is a load (``LoadCollectionJob``)."""

    async def run(self) -> int:
        cid = self.request.collection_id
        asked = asked_replicas(self.request)
        if asked is not None and self._whole(cid):
            state = _Resizing(self)
            current, _pending = state.current(cid)
            if current and (current != asked or state.pending_resize(cid) is not None):
                await self.env.broker.describe_collection(cid)  # NOT_FOUND if the catalog lost it
                return (await self.resize([cid], asked))[0]
        return await super().run()

    def _whole(self, cid: int) -> bool:
        """Loaded, or being loaded, as a whole collection (a partitions load is refused by ``LoadCollectionJob``)."""
        return (self.meta.get_load_type(cid) == data_pb2.LOAD_TYPE_COLLECTION
                or bool(self.scheduler.pending(cid, (qc.TASK_KIND_LOAD_COLLECTION,), cancelled=False)))


__all__ = ["LoadOrResizeJob", "ResizeJob", "UpdateLoadConfigJob"]
