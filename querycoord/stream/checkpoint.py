"""Checkpoint rounds: the leader asks every task of a stream to take checkpoint N, and commits N once all hold it.

Model: TDengine's mnode checkpoint (the checkpoint trigger rides on stream
heartbeat replies, tasks report the checkpoint id they hold).

* A round starts per running stream (every task RUNNING, none pending) every
  ``checkpoint_interval`` (0: never), and on a stop (``final_round``). Its id
  comes from the etcd allocator of ``checkpoint_store``: above every id any
  leader handed out before, so ids never go backwards, across leaders too.
* While a round is in flight, every reply to a heartbeat that reports a task
  of the stream holding less carries a ``CheckpointOrder`` (level-triggered:
  a lost reply only delays it).
* When EVERY task of the stream as deployed now reports holding the round's
  id or more, the id is queued for commit; ``flush`` writes the queue to etcd
  (fenced, batched) and only then is it the stream's consensus checkpoint,
  never lowered. Deploys carry it as ``resume_checkpoint_id``.
* A round not committed within ``checkpoint_timeout``, or whose stream was
  redeployed, stopped or dropped meanwhile, is abandoned; the next one starts
  at once, with a higher id.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from loguru import logger

from proto import stream_pb2
from querycoord.stream.checkpoint_store import CheckpointStore
from querycoord.stream.runtime import CheckpointRound, ManagerState, Runtime, StreamRuntime, TaskRuntime

# How often a stop's final round is looked at while it waits.
FINAL_POLL_S = 0.05


def task_keys(rt: StreamRuntime) -> frozenset[tuple[int, int]]:
    return frozenset((t.task.task_id, t.task.sid) for t in rt.tasks.values())


def running(rt: StreamRuntime) -> bool:
    """Whether a round may run: deployed, not stopped, every task handed out and RUNNING."""
    if rt.sdef.user_stopped or rt.error_stopped or not rt.tasks or rt.pending:
        return False
    return all(t.status == stream_pb2.TASK_RUNNING for t in rt.tasks.values())


class Checkpoints:
    """Start, order, settle, abandon and commit checkpoint rounds (module docstring)."""

    def __init__(self, shared: Runtime):
        self.shared = shared
        self.store = CheckpointStore(shared.store.kv)
        # Complete rounds not yet written to etcd: stream id -> (checkpoint id, unix ms).
        self.to_commit: dict[int, tuple[int, int]] = {}
        self.flush_lock = asyncio.Lock()
        # Counters for tests, drills and benchmarks.
        self.started = 0
        self.committed = 0
        self.abandoned = 0

    async def load(self) -> None:
        """The committed consensus of every known stream (on every leadership, before any heartbeat); the records
        of streams that no longer exist (a drop that raced an earlier leader's commit) are removed."""
        records = await self.store.load()
        for stream_id, cp in records.items():
            rt = self.shared.streams.get(stream_id)
            if rt is not None:
                rt.checkpoint_id, rt.checkpoint_ms = cp.checkpoint_id, cp.checkpoint_ms
        if any(stream_id not in self.shared.streams for stream_id in records):
            removed = await self.store.prune(self.shared.streams)
            logger.info("checkpoints: removed {} records of dropped streams", removed)

    # ----- the periodic part -----------------------------------------------------------------------------------------
    async def tick(self, now: float) -> None:
        """Abandon stale rounds, start due ones, write complete ones (skipped while watching)."""
        if self.shared.state is ManagerState.WATCH:
            return
        interval = self.shared.config.checkpoint_interval
        due: list[StreamRuntime] = []
        for rt in self.shared.streams.values():
            self.check_round(rt, now)
            if interval > 0 and rt.round is None and running(rt) and rt.sdef.id not in self.to_commit:
                if rt.last_round is None or now - rt.last_round >= interval:
                    due.append(rt)
        if due:
            await self.start_rounds(due, now)
        await self.flush()

    def check_round(self, rt: StreamRuntime, now: float) -> None:
        """Abandon the stream's round if it timed out or its tasks are no longer the ones it covers."""
        rnd = rt.round
        if rnd is None:
            return
        why = ""
        if now - rnd.started >= self.shared.config.checkpoint_timeout:
            missing = sorted(t.task.task_id for t in rt.tasks.values() if t.checkpoint_id < rnd.id)
            why = f"not every task took it within {self.shared.config.checkpoint_timeout:g}s (missing: tasks " \
                  f"{missing[:8]})"
        elif not running(rt) or task_keys(rt) != rnd.tasks:
            why = "its tasks were redeployed or stopped meanwhile"
        if why:
            rt.round = None
            rt.last_round = None  # the next round starts at once
            self.abandoned += 1
            logger.info("stream {}: checkpoint round {} abandoned: {}", rt.sdef.name, rnd.id, why)

    async def start_rounds(self, streams: list[StreamRuntime], now: float, *, final: bool = False) -> None:
        """Start one round on each stream (ids from the etcd allocator, one block for all)."""
        ids = await self.store.ids.allocate(len(streams))
        for rt, cid in zip(streams, ids, strict=True):
            if rt.round is not None or not running(rt):
                continue  # changed while the ids were being reserved
            rt.round = CheckpointRound(id=cid, started=now, tasks=task_keys(rt), final=final)
            rt.last_round = now
            self.started += 1

    # ----- heartbeat intake ------------------------------------------------------------------------------------------
    @staticmethod
    def on_report(rt: StreamRuntime, t: TaskRuntime, rep: stream_pb2.TaskStatusReport, orders: dict[int, int]) -> None:
        """Record what the (current) instance holds; order the round's checkpoint when it holds less."""
        if rep.checkpoint_id > t.checkpoint_id:
            t.checkpoint_id = rep.checkpoint_id
        if rt.round is not None and t.checkpoint_id < rt.round.id:
            orders[rt.sdef.id] = rt.round.id

    def settle(self, stream_ids: Iterable[int]) -> None:
        """Queue for commit the rounds every task of their stream now holds."""
        for stream_id in stream_ids:
            rt = self.shared.streams.get(stream_id)
            if rt is None or rt.round is None:
                continue
            rnd = rt.round
            if rt.pending or task_keys(rt) != rnd.tasks:
                continue  # the tick abandons it
            if all(t.checkpoint_id >= rnd.id for t in rt.tasks.values()):
                rt.round = None
                rt.settled_id = max(rt.settled_id, rnd.id)
                held = self.to_commit.get(stream_id, (0, 0))[0]
                if rnd.id > max(held, rt.checkpoint_id):
                    self.to_commit[stream_id] = (rnd.id, int(time.time() * 1000))

    @staticmethod
    def orders(orders: dict[int, int], skip: set[int]) -> list[stream_pb2.CheckpointOrder]:
        return [stream_pb2.CheckpointOrder(stream_id=s, checkpoint_id=c) for s, c in sorted(orders.items())
                if s not in skip]

    # ----- commit ----------------------------------------------------------------------------------------------------
    async def flush(self) -> int:
        """Write the complete rounds to etcd (fenced); only then are they the streams' consensus. Returns how many.

        A failed write keeps them queued for the next flush; ``NotLeader``
        goes up (this leadership is over).
        """
        async with self.flush_lock:
            if not self.to_commit:
                return 0
            for sid in [s for s in self.to_commit if s not in self.shared.streams]:
                del self.to_commit[sid]  # dropped meanwhile: its record went with it
            if not self.to_commit:
                return 0
            batch = dict(self.to_commit)
            records = {
                sid: stream_pb2.StreamCheckpoint(stream_id=sid, checkpoint_id=cid, checkpoint_ms=ms)
                for sid, (cid, ms) in batch.items()
            }
            await self.store.commit(records)
            now = self.shared.clock()
            for sid, (cid, ms) in batch.items():
                if self.to_commit.get(sid) == (cid, ms):
                    del self.to_commit[sid]
                rt = self.shared.streams.get(sid)
                if rt is not None and cid > rt.checkpoint_id:
                    rt.checkpoint_id, rt.checkpoint_ms, rt.checkpoint_at = cid, ms, now
            self.committed += len(batch)
            return len(batch)

    # ----- stop ------------------------------------------------------------------------------------------------------
    async def final_round(self, stream_id: int, timeout: float) -> tuple[int, str]:
        """A stop's final checkpoint: start a round (or take the one in flight) and wait for its commit.

        Returns the stream's consensus checkpoint after the wait and "" when
        the final round committed, else why the stream stops without it.
        """
        rt = self.shared.streams.get(stream_id)
        if rt is None or self.shared.state is ManagerState.WATCH:
            return (rt.checkpoint_id if rt else 0), "the leader does not run the stream's tasks yet (WATCH)"
        if not running(rt):
            return rt.checkpoint_id, "the stream is not running (no final checkpoint taken)"
        if rt.round is None:
            await self.start_rounds([rt], self.shared.clock(), final=True)
        rnd = rt.round
        if rnd is None:
            return rt.checkpoint_id, "the stream stopped running before its final checkpoint began"
        target = rnd.id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.shared.streams.get(stream_id) is not rt:
                return rt.checkpoint_id, "the stream was dropped meanwhile"
            await self.flush()
            if rt.checkpoint_id >= target:
                return rt.checkpoint_id, ""
            await asyncio.sleep(FINAL_POLL_S)
        return rt.checkpoint_id, (f"its final checkpoint {target} was not held by every task within {timeout:g}s; "
                                  f"stopped anyway at consensus checkpoint {rt.checkpoint_id}")
