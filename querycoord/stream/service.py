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

import grpc
from loguru import logger

from proto import common_pb2, stream_pb2, stream_pb2_grpc
from querycoord.coordinator import Coordinator, Leadership
from querycoord.gate import LeaderGate
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import STATUS_SOURCE, StreamNotFound, StreamStore

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)


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
    async def _resolve(self, store: StreamStore, ref: stream_pb2.StreamRef) -> int:
        if ref.stream_id:
            return ref.stream_id
        if not ref.name:
            raise StreamNotFound("name the stream: give its id or its name")
        return await store.stream_id_of(ref.name)

    # ----- streams ----------------------------------------------------------------------------------------------------
    async def CreateStream(self, request, context):
        async def run():
            lead = await self.gate.lead(context)
            assert lead.streams is not None and lead.stream_store is not None
            sdef = await lead.stream_store.create_stream(request, live_snode_ids(lead.streams))
            # Committed: only now may the manager plan and hand out its deploy (seed bug 6).
            lead.streams.put_stream(sdef)
            return stream_pb2.CreateStreamResponse(status=OK, stream=sdef)

        return await self.gate.answer(stream_pb2.CreateStreamResponse, run)

    async def DropStream(self, request, context):
        async def run():
            lead = await self.gate.lead(context)
            assert lead.streams is not None and lead.stream_store is not None
            try:
                stream_id = await self._resolve(lead.stream_store, request.stream)
                sdef = await lead.stream_store.drop_stream(stream_id)
            except StreamNotFound:
                if request.if_exists:
                    return stream_pb2.StreamResponse(status=OK)
                raise
            lead.streams.remove_stream(sdef.id)
            return stream_pb2.StreamResponse(status=OK, stream=sdef)

        return await self.gate.answer(stream_pb2.StreamResponse, run)

    async def _update(self, request, context, op: str):
        async def run():
            lead = await self.gate.lead(context)
            assert lead.streams is not None and lead.stream_store is not None
            stream_id = await self._resolve(lead.stream_store, request.stream)
            if op == "stop":
                sdef = await lead.stream_store.stop_stream(stream_id)
            else:
                sdef = await lead.stream_store.start_stream(stream_id)
            lead.streams.put_stream(sdef)
            return stream_pb2.StreamResponse(status=OK, stream=sdef)

        return await self.gate.answer(stream_pb2.StreamResponse, run)

    async def StopStream(self, request, context):
        return await self._update(request, context, "stop")

    async def StartStream(self, request, context):
        return await self._update(request, context, "start")

    async def ShowStreams(self, request, context):
        async def run():
            lead = self.gate.leadership()
            if lead is not None:
                assert lead.streams is not None and lead.stream_store is not None
                resp = lead.streams.show_streams(request)
                resp.snodes.extend(await lead.stream_store.list_snodes())
                return resp
            return await self._standby_show(request)

        return await self.gate.answer(stream_pb2.ShowStreamsResponse, run)

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
    async def CreateSnode(self, request, context):
        async def run():
            lead = await self.gate.lead(context)
            assert lead.streams is not None and lead.stream_store is not None
            info = await lead.stream_store.create_snode(request.node_id)
            await lead.streams.refresh()  # the new replica ring (committed)
            return stream_pb2.CreateSnodeResponse(status=OK, snode=info)

        return await self.gate.answer(stream_pb2.CreateSnodeResponse, run)

    async def DropSnode(self, request, context):
        async def run():
            lead = await self.gate.lead(context)
            assert lead.streams is not None and lead.stream_store is not None
            drop = await lead.stream_store.drop_snode(request.snode_id)
            await lead.streams.refresh()  # moved streams and the new ring (committed)
            return stream_pb2.DropSnodeResponse(status=OK, moved_streams=drop.moved_streams,
                                                moved_to_snode_id=drop.moved_to)

        return await self.gate.answer(stream_pb2.DropSnodeResponse, run)

    # ----- heartbeat --------------------------------------------------------------------------------------------------
    async def StreamHeartbeat(self, request, context):
        async def run():
            lead = await self.gate.lead(context)
            assert lead.streams is not None
            began = time.monotonic()
            reply = await lead.streams.handle_heartbeat(request)
            if not reply.HasField("status"):  # a refused heartbeat (no live session) keeps its NOT_FOUND
                reply.status.CopyFrom(OK)
            if time.monotonic() - began > 1.0:
                logger.warning("stream heartbeat of node {} took {:.1f}s", request.node_id,
                               time.monotonic() - began)
            return reply

        return await self.gate.answer(stream_pb2.HeartbeatReply, run)


def add_stream_service(server: grpc.aio.Server, coord: Coordinator) -> StreamMgmtServicer:
    servicer = StreamMgmtServicer(coord)
    stream_pb2_grpc.add_StreamMgmtServicer_to_server(servicer, server)
    return servicer


__all__ = ["StreamMgmtServicer", "add_stream_service", "live_snode_ids"]
