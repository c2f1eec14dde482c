"""The StreamMgmt gRPC service: stream and snode DDL, ShowStreams and the stream nodes' heartbeats.

Writes (create, drop, stop, start, snode add and drop) go through the
leader's ``StreamStore`` on its FENCED kv, so a deposed leader changes
nothing; the manager is told only AFTER the store's txn committed (a deploy
must never go out for a write that may not have happened). A standby answers
gRPC UNAVAILABLE naming the leader ("the leader is at X"), which is what the
stream nodes' heartbeat client and the query clients follow; a fenced write
refused (this leader was deposed) answers NOT_LEADER naming the new one. Both
come from ``querycoord.serving.gate``, shared with the QueryCoord service.

ShowStreams on a standby is answered from etcd: the persisted definitions and
snodes only (a standby has no task table, so running streams show
STREAM_STATE_UNSPECIFIED and the status reason says where the leader is).

Every response carries a Status; no exception reaches gRPC except the
deliberate UNAVAILABLE abort.

Every request, heartbeats included, is checked against the configured
``Limits`` first (``check_*`` below, ``querycoord.common.validate``): ids positive,
lists and counts bounded (a stream's whole task set is counted before it is
planned), names and texts bounded and well-formed, enums known. A refusal is
ILLEGAL_ARGUMENT naming the field, its value and the limit; nothing is
written and a refused heartbeat changes nothing in the manager. Duplicates:
repeated source vgroups are refused; repeated vgroups in a heartbeat and
repeated refs in ShowStreams are harmless (sets) and kept.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from loguru import logger

from proto import common_pb2, stream_pb2, stream_pb2_grpc
from querycoord.common.limits import Limits
from querycoord.common.validate import (
    InvalidField,
    check_count,
    check_enum,
    check_id,
    check_ids,
    check_name,
    check_range,
    check_text,
    text_ok,
)
from querycoord.leader.view import CoordinatorView
from querycoord.security.auth import require_node
from querycoord.serving.gate import LeaderGate, answered
from querycoord.stream.guards import check_stream_node, refuse_snode_drop, stream_vgroups, waiting_for_vgroups
from querycoord.stream.manager import StreamManager
from querycoord.stream.recalc import MAX_DONE_PER_REPORT
from querycoord.stream.store import (
    MAX_CALC_SCAN_PLANS,
    MAX_CALC_SUBPLANS,
    MAX_RUNNER_DEPLOYS,
    STATUS_SOURCE,
    StreamNotFound,
    StreamStore,
)

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)
T = TypeVar("T")


def live_snode_ids(manager: StreamManager) -> set[int]:
    """Snodes the manager considers live (heard recently, not declared lost)."""
    return set(manager.live_snode_ids())


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_TASK_KINDS = frozenset(stream_pb2.TaskKind.values())
_TASK_STATUSES = frozenset(stream_pb2.TaskStatus.values())


def check_create_stream(req: stream_pb2.CreateStreamRequest, limits: Limits) -> None:
    """Names and counts bounded; then the stream's whole task set counted before anything plans it (calc
    readers are scan plans x vgroups: 256 x 4096 of them once passed every per-field bound)."""
    check_name("name", req.name, limits.max_name_length)
    check_name("source_db", req.source_db, limits.max_name_length, required=False)
    vgroups = check_ids("source_vgroup_ids", req.source_vgroup_ids, limits.max_vgroups_per_stream)
    check_id("trigger_vgroup_id", req.trigger_vgroup_id, optional=True)
    check_range("num_calc_scan_plans", req.num_calc_scan_plans, 0, MAX_CALC_SCAN_PLANS)
    check_range("num_calc_subplans", req.num_calc_subplans, 0, MAX_CALC_SUBPLANS)
    check_range("runner_deploys", req.runner_deploys, 0, MAX_RUNNER_DEPLOYS)
    trigger_readers = 1 if req.trigger_vgroup_id else len(vgroups)
    deploys = req.runner_deploys or MAX_RUNNER_DEPLOYS  # the default is below the maximum: count the worst
    tasks = trigger_readers + req.num_calc_scan_plans * len(vgroups) + deploys * req.num_calc_subplans + 1
    if tasks > limits.max_tasks_per_stream:
        raise InvalidField("tasks of the stream", tasks, "(trigger readers + calc readers + runners + trigger) "
                           "are too many", limits.max_tasks_per_stream)


def check_ref(field: str, ref: stream_pb2.StreamRef, limits: Limits) -> None:
    """A stream named by a positive id, or by a bounded name when the id is 0."""
    check_id(f"{field}.stream_id", ref.stream_id, optional=True)
    if not ref.stream_id:
        check_name(f"{field}.name", ref.name, limits.max_name_length, required=False)


def _check_task_id(field: str, task: stream_pb2.TaskId | stream_pb2.TaskStatusReport) -> None:
    """The identity fields shared by ``TaskId`` and ``TaskStatusReport``: ids >= 0, a known kind."""
    check_id(f"{field}.stream_id", task.stream_id)
    check_id(f"{field}.task_id", task.task_id)
    for name in ("sid", "node_id", "vgroup_id", "snode_id"):
        check_range(f"{field}.{name}", getattr(task, name), 0, INT64_MAX)
    for name in ("deploy_id", "task_idx"):
        check_range(f"{field}.{name}", getattr(task, name), 0, INT32_MAX)
    check_enum(f"{field}.kind", task.kind, stream_pb2.TaskKind)


def check_heartbeat(req: stream_pb2.HeartbeatRequest, limits: Limits) -> None:
    """A stream node's report is input like any request: bounded lists, ids >= 0, known enums, short texts."""
    check_id("node_id", req.node_id)
    check_id("snode_id", req.snode_id, optional=True)
    check_ids("vgroup_ids", req.vgroup_ids, limits.max_vgroups_per_stream, duplicates="drop")  # a set: repeats ok
    check_range("num_stream_groups", req.num_stream_groups, 0, limits.max_stream_groups)
    check_range("stream_group", req.stream_group, 0, max(req.num_stream_groups - 1, 0) if req.num_stream_groups
                else INT32_MAX)
    check_range("runner_threads", req.runner_threads, 0, INT32_MAX)
    check_range("seen_leader_revision", req.seen_leader_revision, 0, INT64_MAX)
    check_count("tasks", req.tasks, limits.max_tasks_per_heartbeat)
    kinds, statuses, text = _TASK_KINDS, _TASK_STATUSES, limits.max_text_length
    for rep in req.tasks:
        # The usual report in one expression; any doubt: the named checks below.
        if (rep.stream_id > 0 and rep.task_id > 0 and rep.sid >= 0 and rep.node_id >= 0 and rep.vgroup_id >= 0
                and rep.snode_id >= 0 and rep.deploy_id >= 0 and rep.task_idx >= 0 and rep.kind in kinds
                and rep.status in statuses and not rep.top_runners and text_ok(rep.error_message, text)
                and (not rep.HasField("scan_plan_idx") or 0 <= rep.scan_plan_idx <= MAX_CALC_SCAN_PLANS)):
            continue
        _check_report(rep, limits)
    for rep in req.tasks:
        if rep.recalcs_done:
            check_ids("tasks.recalcs_done", rep.recalcs_done, MAX_DONE_PER_REPORT, duplicates="drop")


def _check_report(rep: stream_pb2.TaskStatusReport, limits: Limits) -> None:
    """One task report of a heartbeat, field by field: refuses naming the first field out of bounds."""
    _check_task_id("tasks", rep)
    check_enum("tasks.status", rep.status, stream_pb2.TaskStatus)
    check_text("tasks.error_message", rep.error_message, limits.max_text_length)
    if rep.HasField("scan_plan_idx"):
        check_range("tasks.scan_plan_idx", rep.scan_plan_idx, 0, MAX_CALC_SCAN_PLANS)
    check_count("tasks.top_runners", rep.top_runners, MAX_RUNNER_DEPLOYS)
    for top in rep.top_runners:
        check_id("tasks.top_runners.stream_id", top.stream_id)
        check_id("tasks.top_runners.task_id", top.task_id)
        check_range("tasks.top_runners.sid", top.sid, 0, INT64_MAX)


class StreamMgmtServicer(stream_pb2_grpc.StreamMgmtServicer):
    def __init__(self, coord: CoordinatorView):
        self.coord = coord
        self.gate = LeaderGate(coord, source=STATUS_SOURCE)
        self.limits: Limits = coord.config.limits

    # ----- plumbing ---------------------------------------------------------------------------------------------------
    async def _lead(self, context) -> tuple[StreamManager, StreamStore]:
        """The leader's stream manager and fenced store, or (on a standby) UNAVAILABLE naming the leader."""
        lead = await self.gate.lead(context)
        return lead.streams, lead.stream_store

    async def _resolve(self, store: StreamStore, ref: stream_pb2.StreamRef) -> int:
        if ref.stream_id:
            return ref.stream_id
        if not ref.name:
            raise StreamNotFound("name the stream: give its id or its name")
        return await store.stream_id_of(ref.name)

    # ----- streams ----------------------------------------------------------------------------------------------------
    @answered(stream_pb2.CreateStreamResponse)
    async def CreateStream(self, request, context):
        check_create_stream(request, self.limits)
        streams, store = await self._lead(context)
        sdef, existed = await store.create_or_get_stream(request, live_snode_ids(streams))
        if existed:  # if_not_exists: nothing was written, the stream is left as it is
            return stream_pb2.CreateStreamResponse(
                status=common_pb2.Status(error_code=common_pb2.SUCCESS,
                                         reason=f"stream {sdef.name} (id {sdef.id}) exists, left as it is"),
                stream=sdef, already_exists=True)
        # Committed: only now may the manager plan and hand out its deploy.
        streams.put_stream(sdef)
        unled = streams.unled_vgroups(stream_vgroups(sdef))
        # Accepted either way (a vgroup without a leader is a passing state): the reason says what it waits for.
        status = common_pb2.Status(error_code=common_pb2.SUCCESS, reason=waiting_for_vgroups(unled)) if unled else OK
        return stream_pb2.CreateStreamResponse(status=status, stream=sdef)

    @answered(stream_pb2.StreamResponse)
    async def DropStream(self, request, context):
        check_ref("stream", request.stream, self.limits)
        streams, store = await self._lead(context)
        try:
            stream_id = await self._resolve(store, request.stream)
            sdef = await store.drop_stream(stream_id)
        except StreamNotFound:
            if request.if_exists:
                return stream_pb2.StreamResponse(status=OK)
            raise
        streams.remove_stream(sdef.id)
        await streams.drop_recalcs(sdef.id)  # after the drop's commit; a crash here: the next leader removes them
        return stream_pb2.StreamResponse(status=OK, stream=sdef)

    async def _update(
        self, request, context, change: Callable[[StreamStore, int], Awaitable[stream_pb2.StreamDef]]
    ) -> stream_pb2.StreamResponse:
        """Stop or start a stream in the store (``change``), then tell the manager (after the commit)."""
        check_ref("stream", request.stream, self.limits)
        streams, store = await self._lead(context)
        sdef = await change(store, await self._resolve(store, request.stream))
        streams.put_stream(sdef)
        return stream_pb2.StreamResponse(status=OK, stream=sdef)

    @answered(stream_pb2.StreamResponse)
    async def StopStream(self, request, context):
        """A final checkpoint round first (waited for up to checkpoint_timeout), then the stop; a stop without it
        says why in the status reason (still SUCCESS: the stream is stopped at its last consensus)."""
        check_ref("stream", request.stream, self.limits)
        streams, store = await self._lead(context)
        sdef = await store.get_stream(await self._resolve(store, request.stream))
        note = ""
        if not sdef.user_stopped:
            _, note = await streams.final_checkpoint(sdef.id)
        resp = await self._update(request, context, StreamStore.stop_stream)
        if note:
            resp.status.reason = f"stopped without a final checkpoint: {note}"
        return resp

    @answered(stream_pb2.StreamResponse)
    async def StartStream(self, request, context):
        ignore = request.ignore_untreated
        return await self._update(request, context, lambda store, sid: store.start_stream(sid, ignore))

    @answered(stream_pb2.ShowStreamsResponse)
    async def ShowStreams(self, request, context):
        check_count("streams", request.streams, self.limits.max_streams_per_request)
        for ref in request.streams:
            check_ref("streams", ref, self.limits)
        lead = self.gate.leadership()
        if lead is None:
            return await self._standby_show(request)
        resp = lead.streams.show_streams(request)
        resp.snodes.extend(await lead.stream_store.list_snodes())
        return resp

    async def _standby_show(self, request: stream_pb2.ShowStreamsRequest) -> stream_pb2.ShowStreamsResponse:
        """Persisted definitions and snodes from etcd; no task table (only the leader has one)."""
        assert self.coord.kv is not None
        store = StreamStore(self.coord.kv)  # reads only: a standby never writes
        ids = {r.stream_id for r in request.streams if r.stream_id}
        names = {r.name for r in request.streams if not r.stream_id}
        resp = stream_pb2.ShowStreamsResponse()
        for sdef in sorted(await store.list_streams(), key=lambda s: s.id):
            if request.streams and sdef.id not in ids and sdef.name not in names:
                continue
            state = stream_pb2.STREAM_STOPPED_BY_USER if sdef.user_stopped else stream_pb2.STREAM_STATE_UNSPECIFIED
            resp.streams.append(stream_pb2.StreamStatusInfo(stream=sdef, state=state))
        resp.snodes.extend(await store.list_snodes())
        note = await self.coord.not_leader_message()
        # "; " after the note: ``protocol.parse_leader`` ends the leader's address at ";,)", so a client can follow.
        resp.status.CopyFrom(common_pb2.Status(
            error_code=common_pb2.SUCCESS, reason=f"{note}; persisted streams only, without states or tasks"))
        return resp

    @answered(stream_pb2.RecalculateStreamResponse)
    async def RecalculateStream(self, request, context):
        check_ref("stream", request.stream, self.limits)
        check_range("from_ms", request.from_ms, 0, INT64_MAX)
        check_range("to_ms", request.to_ms, 0, INT64_MAX)
        streams, store = await self._lead(context)
        info = await streams.recalculate(await self._resolve(store, request.stream), request.from_ms, request.to_ms)
        return stream_pb2.RecalculateStreamResponse(status=OK, recalc=info)

    # ----- snodes -----------------------------------------------------------------------------------------------------
    async def _change_snodes(self, context, change: Callable[[StreamStore], Awaitable[T]]) -> T:
        """An snode write, then the manager's refresh: the new replica ring and any streams moved (committed)."""
        streams, store = await self._lead(context)
        result = await change(store)
        await streams.refresh()
        return result

    @answered(stream_pb2.CreateSnodeResponse)
    async def CreateSnode(self, request, context):
        check_id("node_id", request.node_id)

        async def create(store: StreamStore) -> stream_pb2.SnodeInfo:
            # Two creates at once may both pass this count: the limit bounds the ring, give or take a few.
            existing = len(await store.list_snodes())
            if existing >= self.limits.max_snodes:
                raise InvalidField("snodes", existing, "already exist: no more can be created", self.limits.max_snodes)
            # Only on a live stream node: nothing is written (no id, no ring change) for any other id.
            await check_stream_node(store.kv, request.node_id)
            return await store.create_snode(request.node_id)

        info = await self._change_snodes(context, create)
        return stream_pb2.CreateSnodeResponse(status=OK, snode=info)

    @answered(stream_pb2.DropSnodeResponse)
    async def DropSnode(self, request, context):
        check_id("snode_id", request.snode_id)
        streams, store = await self._lead(context)
        deps = streams.snode_dependents(await store.list_streams(), request.snode_id)
        if deps and not request.force:
            raise refuse_snode_drop(request.snode_id, deps)  # CONFLICT naming the streams; nothing written
        drop = await store.drop_snode(request.snode_id)
        # Committed: the leader forgets the snode (no claim of it counts) and moves what ran there, then re-reads.
        streams.snode_dropped(request.snode_id, forced=bool(deps))
        await streams.refresh()
        return stream_pb2.DropSnodeResponse(status=OK, moved_streams=drop.moved_streams,
                                            moved_to_snode_id=drop.moved_to)

    # ----- heartbeat --------------------------------------------------------------------------------------------------
    @answered(stream_pb2.HeartbeatReply)
    async def StreamHeartbeat(self, request, context):
        check_heartbeat(request, self.limits)  # before the manager sees any of it
        lead = await self.gate.lead(context)
        # With authentication on, a node speaks only for itself and its own snode (PERMISSION_DENIED otherwise).
        await require_node(context, request.node_id, snode_id=request.snode_id, snode_owner=lead.streams.snode_owner)
        began = time.monotonic()
        reply = await lead.streams.handle_heartbeat(request)
        if not reply.HasField("status"):  # a refused heartbeat (no live session) keeps its NOT_FOUND
            reply.status.CopyFrom(OK)
        if time.monotonic() - began > 1.0:
            logger.warning("stream heartbeat of node {} took {:.1f}s", request.node_id, time.monotonic() - began)
        return reply


def add_stream_service(server: grpc.aio.Server, coord: CoordinatorView) -> StreamMgmtServicer:
    servicer = StreamMgmtServicer(coord)
    stream_pb2_grpc.add_StreamMgmtServicer_to_server(servicer, server)
    return servicer


__all__ = ["StreamMgmtServicer", "add_stream_service", "check_create_stream", "check_heartbeat", "check_ref",
           "live_snode_ids"]
