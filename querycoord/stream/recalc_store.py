"""Stream recalculations persisted in etcd, so a new leader resumes them where the last one stopped.

Layout under the root path::

    stream/recalcs/<stream id>/<recalc id>   RecalcRecord (protobuf bytes): the info and the runner slots done
    idalloc/stream-recalc                    the id allocator of recalculations

A record is written by fenced txns only (the leader's ``FencedKV``):

* created with a compare on the stream's create revision, so a recalculation
  never outlives a stream dropped meanwhile (the drop removes the stream's
  records after its own txn; a create that read the stream before the drop
  fails its compare);
* updated (a slot done, the state moved on) under a compare on its own mod
  revision: two writers never overwrite each other;
* trimmed in the txn that creates a new one: a stream keeps its last
  ``HISTORY_PER_STREAM`` finished records.

A stream's records are removed after its drop (``delete_stream``); one left
by a crash between the two txns is removed by the next leader's ``load``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from meta.idalloc import IdAllocator
from meta.kv import MetaKV
from meta.txn import Op, created_at, delete, delete_prefix, modified_at, put
from proto import stream_pb2
from querycoord.stream.store import STREAM_PREFIX, StreamNotFound, stream_key

RECALCS_PREFIX = f"{STREAM_PREFIX}recalcs/"
RECALC_ID_KEY = "idalloc/stream-recalc"
# Finished recalculations kept per stream (the oldest beyond this go with the next create).
HISTORY_PER_STREAM = 16
FINISHED = frozenset({stream_pb2.RECALC_DONE, stream_pb2.RECALC_FAILED, stream_pb2.RECALC_CANCELLED})


def recalc_key(stream_id: int, recalc_id: int) -> str:
    return f"{RECALCS_PREFIX}{stream_id}/{recalc_id}"


def stream_recalcs_prefix(stream_id: int) -> str:
    return f"{RECALCS_PREFIX}{stream_id}/"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Stored:
    """One record as the leader holds it, with the mod revision its next update compares."""

    record: stream_pb2.RecalcRecord
    revision: int

    @property
    def info(self) -> stream_pb2.RecalcInfo:
        return self.record.info

    def done_slots(self) -> set[tuple[int, int]]:
        return {(s.deploy_id, s.task_idx) for s in self.record.done}


class RecalcStore:
    """The records under ``stream/recalcs/`` (module docstring). Every write is one txn through ``kv``."""

    def __init__(self, kv: MetaKV, *, history: int = HISTORY_PER_STREAM):
        self.kv = kv
        self.history = history
        self.ids = IdAllocator(kv, RECALC_ID_KEY, block_size=10)

    async def load(self, stream_ids: set[int]) -> dict[int, dict[int, Stored]]:
        """Every record of the streams given, by stream and id; records of other (dropped) streams are removed."""
        snap = await self.kv.load_prefix(RECALCS_PREFIX)
        out: dict[int, dict[int, Stored]] = {}
        orphans: set[int] = set()
        for item in snap.kvs:
            rec = stream_pb2.RecalcRecord.FromString(item.value)
            sid = rec.info.stream_id
            if sid not in stream_ids or item.key != recalc_key(sid, rec.info.recalc_id):
                orphans.add(sid)
                continue
            out.setdefault(sid, {})[rec.info.recalc_id] = Stored(rec, item.mod_revision)
        for sid in sorted(orphans):
            if sid not in stream_ids:
                await self.delete_stream(sid)
        return out

    async def create(
        self, stream_id: int, from_ms: int, to_ms: int, tasks_total: int, finished: list[Stored]
    ) -> Stored:
        """Persist a new PENDING recalculation of ``stream_id`` (which must still exist), dropping the oldest
        of ``finished`` beyond the history bound in the same txn."""
        item = await self.kv.get_kv(stream_key(stream_id))
        if item is None:
            raise StreamNotFound(f"unknown stream id {stream_id}: it was dropped "
                                 "(`querycoord stream show` lists the streams)")
        recalc_id = (await self.ids.allocate(1))[0]
        info = stream_pb2.RecalcInfo(recalc_id=recalc_id, stream_id=stream_id, from_ms=from_ms, to_ms=to_ms,
                                     state=stream_pb2.RECALC_PENDING, tasks_total=tasks_total, created_ms=now_ms())
        rec = stream_pb2.RecalcRecord(info=info)
        old = sorted(finished, key=lambda s: s.info.recalc_id)
        trim = old[: max(0, len(old) + 1 - self.history)]
        ops: list[Op] = [put(recalc_key(stream_id, recalc_id), rec.SerializeToString())]
        ops += [delete(recalc_key(stream_id, s.info.recalc_id)) for s in trim]
        res = await self.kv.txn([created_at(item.key, item.create_revision)], ops,
                                operation=f"recalculate stream {stream_id}")
        if not res.succeeded:
            raise StreamNotFound(f"unknown stream id {stream_id}: it was dropped while the recalculation was "
                                 f"being recorded")
        return Stored(rec, res.revision)

    async def save(self, stored: Stored) -> bool:
        """Write ``stored.record`` over the revision it was read at; False when another write came first."""
        info = stored.info
        res = await self.kv.txn([modified_at(recalc_key(info.stream_id, info.recalc_id), stored.revision)],
                                [put(recalc_key(info.stream_id, info.recalc_id), stored.record.SerializeToString())],
                                operation=f"update recalculation {info.recalc_id} of stream {info.stream_id}")
        if res.succeeded:
            stored.revision = res.revision
        return res.succeeded

    async def reread(self, stream_id: int, recalc_id: int) -> Stored | None:
        item = await self.kv.get_kv(recalc_key(stream_id, recalc_id))
        if item is None:
            return None
        return Stored(stream_pb2.RecalcRecord.FromString(item.value), item.mod_revision)

    async def delete_stream(self, stream_id: int) -> None:
        """Remove every record of a dropped stream."""
        await self.kv.txn([], [delete_prefix(stream_recalcs_prefix(stream_id))],
                          operation=f"remove recalculations of dropped stream {stream_id}")


__all__ = ["FINISHED", "HISTORY_PER_STREAM", "RECALCS_PREFIX", "RECALC_ID_KEY", "RecalcStore", "Stored",
           "recalc_key", "stream_recalcs_prefix"]
