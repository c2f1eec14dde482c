"""Stream recalculation: a time range of a stream recomputed by its runners (model: TDengine 3.3's
``RECALCULATE STREAM``, the "user recalc" of the mnode's heartbeat replies).

Who runs it: every runner of the stream. The runners are the tasks that
compute results; each runner deploy is a full copy of the calc DAG with its
own state, and the trigger may hand a window to any deploy, so every copy
recomputes the range. Readers only read and the trigger only drives windows:
they get no order. Progress is counted per runner SLOT (deploy, index in the
DAG), not per task id: a slot outlives its task ids (a stream redeployed whole
gets new ids) and its instances (a runner redeployed alone gets a new SID).

The protocol, level-triggered like every stream action:

* RecalculateStream validates (``validate``), persists a PENDING record
  (``recalc_store``) and answers; nothing is sent then.
* A heartbeat reporting a RUNNING runner (the leader's current instance of
  it) whose slot has not finished an active recalculation of its stream gets
  a ``RecalcOrder`` naming it; the order goes out again with every such
  report until the runner reports the recalculation in ``recalcs_done``. The
  first order moves the record to RUNNING.
* A runner's ``recalcs_done`` marks its slot done (persisted before the reply
  is built). A report for a slot already done, for a finished or unknown
  recalculation, or from a stale instance changes nothing, so every slot
  counts once. When every slot is done the record is DONE. The node stops
  reporting a recalculation once a reply to the heartbeat that reported it
  orders it no more for that task.
* A stream stopped by the user or by an error keeps its active
  recalculations, parked with their progress; its runners get the orders
  again once they run. A new request on a stream stopped by the user is
  refused (CONFLICT: start it first); one on an error-stopped stream waits
  for the redeploy.
* A new leader loads the records and sends orders to every slot not done:
  a runner that had finished but whose report was lost answers at once
  (the reference node never runs one recalculation twice on one instance).
"""

from __future__ import annotations

import asyncio

from loguru import logger

from proto import stream_pb2
from querycoord.common.errors import CoordError
from querycoord.stream.plan import RUNNER
from querycoord.stream.recalc_store import FINISHED, RecalcStore, Stored, now_ms
from querycoord.stream.runtime import Runtime, StreamRuntime
from querycoord.stream.store import InvalidStream, StreamNotFound, StreamStateConflict

# The longest range one request may recompute (one year), and the active recalculations a stream may have.
MAX_RANGE_MS = 366 * 24 * 3600 * 1000
MAX_ACTIVE_PER_STREAM = 8
# Recalculation ids one task report may list as done (a heartbeat check).
MAX_DONE_PER_REPORT = 64


class TooManyRecalcs(StreamStateConflict):
    """The stream has ``MAX_ACTIVE_PER_STREAM`` recalculations not finished yet."""


def validate(sdef: stream_pb2.StreamDef, from_ms: int, to_ms: int) -> int:
    """Check a request against the stream; returns its runner slots (tasks_total)."""
    if from_ms < 0 or to_ms < 0:
        raise InvalidStream(f"recalculate {sdef.name}: from and to must be >= 0 (unix ms), got {from_ms}..{to_ms}")
    if from_ms >= to_ms:
        raise InvalidStream(f"recalculate {sdef.name}: from ({from_ms}) must be before to ({to_ms})")
    if to_ms - from_ms > MAX_RANGE_MS:
        raise InvalidStream(f"recalculate {sdef.name}: the range is {(to_ms - from_ms) / 86_400_000:.1f} days, at "
                            f"most {MAX_RANGE_MS // 86_400_000} days per request; split it")
    if sdef.user_stopped:
        raise StreamStateConflict(f"stream {sdef.name} (id {sdef.id}) is stopped by a user: start it first, then "
                                  f"recalculate")
    total = sdef.runner_deploys * sdef.num_calc_subplans
    if total <= 0:
        raise InvalidStream(f"stream {sdef.name} has no runner (num_calc_subplans 0): nothing to recalculate")
    return total


class Recalcs:
    """The leader's recalculations: loaded at the start, changed by requests and runner reports."""

    def __init__(self, shared: Runtime, store: RecalcStore):
        self.shared = shared
        self.store = store
        self.by_stream: dict[int, dict[int, Stored]] = {}
        # One write at a time: two heartbeats reporting slots of one record must not race each other's compare.
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        self.by_stream = await self.store.load(set(self.shared.streams))
        active = sum(1 for recs in self.by_stream.values() for s in recs.values() if s.info.state not in FINISHED)
        if active:
            logger.info("stream recalculations: {} active, resumed by this leader", active)

    # ----- requests -------------------------------------------------------------------------------------------------
    async def request(self, stream_id: int, from_ms: int, to_ms: int) -> stream_pb2.RecalcInfo:
        """Persist a new recalculation; its runners get it with their next heartbeats."""
        rt = self.shared.streams.get(stream_id)
        if rt is None:
            raise StreamNotFound(f"unknown stream id {stream_id} (`querycoord stream show` lists the streams)")
        total = validate(rt.sdef, from_ms, to_ms)
        async with self.lock:
            recs = self.by_stream.setdefault(stream_id, {})
            active = [s for s in recs.values() if s.info.state not in FINISHED]
            if len(active) >= MAX_ACTIVE_PER_STREAM:
                raise TooManyRecalcs(f"stream {rt.sdef.name} has {len(active)} recalculations not finished, at most "
                                     f"{MAX_ACTIVE_PER_STREAM}; wait for them (stream show)")
            finished = sorted((s for s in recs.values() if s.info.state in FINISHED), key=lambda s: s.info.recalc_id)
            stored = await self.store.create(stream_id, from_ms, to_ms, total, finished)
            for s in finished[: max(0, len(finished) + 1 - self.store.history)]:  # what the create's txn removed
                recs.pop(s.info.recalc_id, None)
            if stream_id not in self.shared.streams:  # dropped while the txn ran: the drop removes the record
                raise StreamNotFound(f"stream {rt.sdef.name} was dropped meanwhile")
            recs[stored.info.recalc_id] = stored
        logger.info("stream {}: recalculation {} of {}..{} on {} runner slots", rt.sdef.name,
                    stored.info.recalc_id, from_ms, to_ms, total)
        return _copy(stored.info)

    async def drop_stream(self, stream_id: int) -> None:
        """A committed drop: forget and remove the stream's recalculations."""
        self.by_stream.pop(stream_id, None)
        await self.store.delete_stream(stream_id)

    def infos(self, stream_id: int) -> list[stream_pb2.RecalcInfo]:
        recs = self.by_stream.get(stream_id, {})
        return [_copy(recs[r].info) for r in sorted(recs)]

    # ----- heartbeats -----------------------------------------------------------------------------------------------
    async def on_heartbeat(self, node_id: int, req: stream_pb2.HeartbeatRequest, reply: stream_pb2.HeartbeatReply,
                           skip: set[int]) -> None:
        """Record the runners' ``recalcs_done`` (persisted), then put the orders still due in ``reply``.

        ``skip``: streams this reply undeploys (no order for them).
        """
        if not self.by_stream:
            return
        orders: dict[tuple[int, int], stream_pb2.RecalcOrder] = {}
        done: list[tuple[Stored, tuple[int, int]]] = []
        for rep in req.tasks:
            recs = self.by_stream.get(rep.stream_id)
            if rep.kind != RUNNER or not recs:
                continue
            rt = self.shared.streams.get(rep.stream_id)
            if rt is None or not _current(rt, rep, node_id):
                continue
            task = rt.tasks[rep.task_id].task
            slot = (task.deploy_id, task.task_idx)
            reported = set(rep.recalcs_done)
            runnable = (rep.status == stream_pb2.TASK_RUNNING and rep.stream_id not in skip
                        and not rt.sdef.user_stopped and not rt.error_stopped)
            for rid in sorted(recs):
                stored = recs[rid]
                if stored.info.state in FINISHED or slot in stored.done_slots():
                    continue
                if rid in reported:
                    done.append((stored, slot))
                elif runnable:
                    order = orders.get((rep.stream_id, rid))
                    if order is None:
                        info = stored.info
                        order = orders[(rep.stream_id, rid)] = stream_pb2.RecalcOrder(
                            stream_id=rep.stream_id, recalc_id=rid, from_ms=info.from_ms, to_ms=info.to_ms)
                    order.task_ids.append(rep.task_id)
        if done or orders:
            await self._record(done, [o.recalc_id for o in orders.values()], orders)
        reply.recalcs.extend(orders[k] for k in sorted(orders))

    async def _record(self, done: list[tuple[Stored, tuple[int, int]]], ordered: list[int],
                      orders: dict[tuple[int, int], stream_pb2.RecalcOrder]) -> None:
        """Persist the slots done and the first orders (PENDING -> RUNNING), one write per record."""
        async with self.lock:
            changed: dict[int, Stored] = {}
            for stored, slot in done:
                if slot in stored.done_slots() or stored.info.state in FINISHED:
                    continue
                stored.record.done.append(stream_pb2.RecalcSlot(deploy_id=slot[0], task_idx=slot[1]))
                changed[stored.info.recalc_id] = stored
            for key in list(orders):
                held = self.by_stream.get(key[0], {}).get(key[1])
                if held is None or held.info.state in FINISHED:
                    orders.pop(key)  # finished by a report of this same heartbeat
                elif held.info.state == stream_pb2.RECALC_PENDING:
                    changed[held.info.recalc_id] = held
            for stored in changed.values():
                info = stored.info
                info.tasks_done = len(stored.record.done)
                if info.tasks_done >= info.tasks_total:
                    info.state, info.finished_ms = stream_pb2.RECALC_DONE, now_ms()
                    logger.info("stream {}: recalculation {} DONE on {} runner slots", info.stream_id,
                                info.recalc_id, info.tasks_total)
                elif info.state == stream_pb2.RECALC_PENDING and (info.tasks_done or info.recalc_id in ordered):
                    info.state = stream_pb2.RECALC_RUNNING
                await self._save(stored)

    async def _save(self, stored: Stored) -> None:
        if await self.store.save(stored):
            return
        # Only a leader writes here (fenced); a lost compare means this memory is behind: take etcd's record.
        fresh = await self.store.reread(stored.info.stream_id, stored.info.recalc_id)
        recs = self.by_stream.get(stored.info.stream_id, {})
        if fresh is None:
            recs.pop(stored.info.recalc_id, None)
        else:
            recs[stored.info.recalc_id] = fresh
        raise CoordError(f"recalculation {stored.info.recalc_id} changed in etcd meanwhile; re-read, the next "
                         f"heartbeat applies the report again")


def _current(rt: StreamRuntime, rep: stream_pb2.TaskStatusReport, node_id: int) -> bool:
    """Whether a report is of the leader's current instance of the task (same SID, same node, handed out)."""
    t = rt.tasks.get(rep.task_id)
    return t is not None and t.task.sid == rep.sid and t.node_id == node_id and rep.task_id not in rt.pending


def _copy(info: stream_pb2.RecalcInfo) -> stream_pb2.RecalcInfo:
    out = stream_pb2.RecalcInfo()
    out.CopyFrom(info)
    return out


__all__ = ["MAX_ACTIVE_PER_STREAM", "MAX_DONE_PER_REPORT", "MAX_RANGE_MS", "Recalcs", "TooManyRecalcs", "validate"]
