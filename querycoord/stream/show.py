"""ShowStreams: each stream's state as the leader sees it and, on request, its task table.

Durations are kept on the manager's monotonic clock; they are converted to
unix milliseconds here, for display only.
"""

from __future__ import annotations

import time

from proto import common_pb2, stream_pb2
from querycoord.stream.guards import unled_vgroups, waiting_for_vgroups
from querycoord.stream.progress import stream_progress, task_lag_ms
from querycoord.stream.runtime import READER_KINDS, ManagerState, Runtime, StreamRuntime


def state_of(rt: StreamRuntime) -> int:
    """A stream's ``StreamState``: stopped (by a user, by an error), undeployed, running or deploying."""
    if rt.sdef.user_stopped:
        return stream_pb2.STREAM_STOPPED_BY_USER
    if rt.error_stopped:
        return stream_pb2.STREAM_STOPPED_BY_ERROR
    if not rt.tasks:
        return stream_pb2.STREAM_UNDEPLOYED
    if not rt.pending and all(t.status == stream_pb2.TASK_RUNNING for t in rt.tasks.values()):
        return stream_pb2.STREAM_RUNNING
    return stream_pb2.STREAM_DEPLOYING


def wait_reason(shared: Runtime, rt: StreamRuntime, queued: bool) -> str:
    """What a stream waits for: its plan's reason while queued; once planned, a leader for the vgroups of its
    readers that wait for one (pending, or on a vgroup declared lost); '' when it waits for nothing."""
    if queued:
        return rt.waiting
    if rt.sdef.user_stopped or rt.error_stopped or not rt.tasks:
        return ""
    readers = {t.task.vgroup_id for t in rt.tasks.values() if t.task.kind in READER_KINDS
               and (t.task.task_id in rt.pending or t.task.vgroup_id in shared.lost_vgroups)}
    unled = unled_vgroups(shared, readers) if readers else []
    return waiting_for_vgroups(unled) if unled else ""


def show_streams(shared: Runtime, req: stream_pb2.ShowStreamsRequest) -> stream_pb2.ShowStreamsResponse:
    """Every stream (or those named) with its state and, on request, its task table."""
    now, wall = shared.clock(), time.time()

    def unix_ms(t: float | None) -> int:
        return 0 if t is None else int((wall - (now - t)) * 1000)

    wanted_ids = {r.stream_id for r in req.streams if r.stream_id}
    wanted_names = {r.name for r in req.streams if not r.stream_id}
    watching = shared.state is ManagerState.WATCH
    resp = stream_pb2.ShowStreamsResponse(
        watching=watching,
        watch_until_ms=unix_ms(shared.state_since + shared.config.watch_timeout) if watching else 0,
        live_snode_ids=sorted(shared.live_snodes(now)),
    )
    for stream_id in sorted(shared.streams):
        rt = shared.streams[stream_id]
        if req.streams and stream_id not in wanted_ids and rt.sdef.name not in wanted_names:
            continue
        info = stream_pb2.StreamStatusInfo(
            stream=rt.sdef,
            state=state_of(rt),  # type: ignore[arg-type]
            stop_error_code=rt.stop_code,
            stop_reason=rt.stop_reason,
            next_retry_ms=unix_ms(rt.next_retry),
            deploy_times=rt.deploy_times,
            retries=rt.retries,
            plan_queued=stream_id in shared.to_plan,
            wait_reason=wait_reason(shared, rt, stream_id in shared.to_plan),
            checkpoint_id=rt.checkpoint_id,
            checkpoint_ms=rt.checkpoint_ms,
            checkpoint_round_id=rt.round.id if rt.round else 0,
            checkpoint_round_started_ms=unix_ms(rt.round.started) if rt.round else 0,
        )
        info.processed_ms, info.lag_ms = stream_progress(rt.tasks.values())
        if req.with_tasks:
            for t in sorted(rt.tasks.values(), key=lambda t: t.task.task_id):
                info.tasks.append(
                    stream_pb2.TaskRow(
                        task=t.task.to_proto(stream_id, t.node_id),
                        status=t.status,  # type: ignore[arg-type]
                        last_heard_ms=unix_ms(t.last_heard),
                        error_code=t.error_code,
                        error_message=t.error_message,
                        pending=t.task.task_id in rt.pending,
                        processed_ms=t.processed_ms,
                        lag_ms=task_lag_ms(t),
                        checkpoint_id=t.checkpoint_id,
                    )
                )
        resp.streams.append(info)
    resp.status.CopyFrom(common_pb2.Status(error_code=common_pb2.SUCCESS))
    return resp
