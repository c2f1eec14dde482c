"""The StreamMgmt gRPC service: stream and snode DDL, ShowStreams and the stream nodes' heartbeats.

Writes (create, drop, stop, start, snode add and drop) go through the
leader's ``StreamStore`` on its FENCED kv, so a deposed leader changes
nothing; the manager is told only AFTER the store's txn committed (seed bug 6:
never post a deploy for a write that may not have happened). A standby answers
gRPC UNAVAILABLE naming the leader ("the leader is at X"), which is what the
stream nodes' heartbeat client and the query clients follow; a fenced write
refused (this leader was deposed) answers NOT_LEADER naming the new one. Both
come from ``querycoord.gate``, shared with the QueryCoord service.

ShowStreams on a standby is answered from etcd: the persisted definitions and
snodes only (a standby has no task table, so running streams show
STREAM_STATE_UNSPECIFIED and the status reason says where the leader is).

Every response carries a Status; no exception reaches gRPC except the
deliberate UNAVAILABLE abort.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from loguru import logger

from proto import common_pb2, stream_pb2, stream_pb2_grpc
from querycoord.coordinator import Coordinator, Leadership
from querycoord.gate import LeaderGate, answered
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import STATUS_SOURCE, StreamNotFound, StreamStore

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)
T = TypeVar("T")


def live_snode_ids(manager: StreamManager) -> set[int]:
    """Snodes the manager considers live (heard recently, not declared lost)."""
    return set(manager.live_snode_ids())


def _serves_streams(lead: Leadership) -> bool:
    return lead.streams is not None and lead.stream_store is not None


class StreamMgmtServicer(stream_pb2_grpc.StreamMgmtServicer):
    def __init__(self, coord: Coordinator):
        self.coord = coord
        self.gate = LeaderGate(coord, serves=_serves_streams, source=STATUS_SOURCE)

    # ----- plumbing ---------------------------------------------------------------------------------------------------
    async def _lead(self, context) -> tuple[StreamManager, StreamStore]:
        """The leader's stream manager and fenced store, or (on a standby) UNAVAILABLE naming the leader."""
        lead = await self.gate.lead(context)
        assert lead.streams is not None and lead.stream_store is not None
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
        streams, store = await self._lead(context)
        sdef = await store.create_stream(request, live_snode_ids(streams))
        # Committed: only now may the manager plan and hand out its deploy (seed bug 6).
        streams.put_stream(sdef)
        return stream_pb2.CreateStreamResponse(status=OK, stream=sdef)

    @answered(stream_pb2.StreamResponse)
    async def DropStream(self, request, context):
        streams, store = await self._lead(context)
        try:
            stream_id = await self._resolve(store, request.stream)
            sdef = await store.drop_stream(stream_id)
        except StreamNotFound:
            if request.if_exists:
                return stream_pb2.StreamResponse(status=OK)
            raise
        streams.remove_stream(sdef.id)
        return stream_pb2.StreamResponse(status=OK, stream=sdef)

    async def _update(
        self, request, context, change: Callable[[StreamStore, int], Awaitable[stream_pb2.StreamDef]]
    ) -> stream_pb2.StreamResponse:
        """Stop or start a stream in the store (``change``), then tell the manager (after the commit)."""
        streams, store = await self._lead(context)
        sdef = await change(store, await self._resolve(store, request.stream))
        streams.put_stream(sdef)
        return stream_pb2.StreamResponse(status=OK, stream=sdef)

    @answered(stream_pb2.StreamResponse)
    async def StopStream(self, request, context):
        return await self._update(request, context, StreamStore.stop_stream)

    @answered(stream_pb2.StreamResponse)
    async def StartStream(self, request, context):
        return await self._update(request, context, StreamStore.start_stream)

    @answered(stream_pb2.ShowStreamsResponse)
    async def ShowStreams(self, request, context):
        lead = self.gate.leadership()
        if lead is None:
            return await self._standby_show(request)
        assert lead.streams is not None and lead.stream_store is not None
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
        resp.status.CopyFrom(common_pb2.Status(
            error_code=common_pb2.SUCCESS, reason=f"{note}: persisted streams only, without states or tasks"))
        return resp

    # ----- snodes -----------------------------------------------------------------------------------------------------
    async def _change_snodes(self, context, change: Callable[[StreamStore], Awaitable[T]]) -> T:
        """An snode write, then the manager's refresh: the new replica ring and any streams moved (committed)."""
        streams, store = await self._lead(context)
        result = await change(store)
        await streams.refresh()
        return result

    @answered(stream_pb2.CreateSnodeResponse)
    async def CreateSnode(self, request, context):
        info = await self._change_snodes(context, lambda store: store.create_snode(request.node_id))
        return stream_pb2.CreateSnodeResponse(status=OK, snode=info)

    @answered(stream_pb2.DropSnodeResponse)
    async def DropSnode(self, request, context):
        drop = await self._change_snodes(context, lambda store: store.drop_snode(request.snode_id))
        return stream_pb2.DropSnodeResponse(status=OK, moved_streams=drop.moved_streams,
                                            moved_to_snode_id=drop.moved_to)

    # ----- heartbeat --------------------------------------------------------------------------------------------------
    @answered(stream_pb2.HeartbeatReply)
    async def StreamHeartbeat(self, request, context):
        lead = await self.gate.lead(context)
        assert lead.streams is not None
        began = time.monotonic()
        reply = await lead.streams.handle_heartbeat(request)
        if not reply.HasField("status"):  # a refused heartbeat (no live session) keeps its NOT_FOUND
            reply.status.CopyFrom(OK)
        if time.monotonic() - began > 1.0:
            logger.warning("stream heartbeat of node {} took {:.1f}s", request.node_id, time.monotonic() - began)
        return reply


def add_stream_service(server: grpc.aio.Server, coord: Coordinator) -> StreamMgmtServicer:
    servicer = StreamMgmtServicer(coord)
    stream_pb2_grpc.add_StreamMgmtServicer_to_server(servicer, server)
    return servicer


__all__ = ["StreamMgmtServicer", "add_stream_service", "live_snode_ids"]
