"""Consensus checkpoints persisted in etcd: the part of a stream's progress that survives a leader change.

Layout under the root path::

    stream/checkpoints/<stream_id>   StreamCheckpoint (protobuf bytes): the committed consensus
    idalloc/stream-checkpoint        the id allocator of checkpoint rounds (``IdAllocator``)

Round ids come from one etcd-backed allocator, shared by every stream and every
leader: an allocator reserves its block in etcd before handing out an id, so a
new leader's rounds are numbered above every round an earlier leader started,
committed or not. A stream's checkpoint ids therefore never go backwards.

Commits are plain puts through the kv given: the coordinator passes its
``FencedKV``, so a deposed leader's commit fails whole (``NotLeader``) and a
checkpoint is only ever written by the leader that saw every task hold it.
Several streams' commits share one txn (up to ``COMMIT_CHUNK`` puts).
A dropped stream's record is removed by the drop (``StreamStore.drop_stream``)
and, should one be left, by ``prune``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from meta.idalloc import IdAllocator
from meta.kv import MAX_TXN_OPS, MetaKV
from meta.txn import delete, put
from proto import stream_pb2

CHECKPOINTS_PREFIX = "stream/checkpoints/"
CHECKPOINT_ID_KEY = "idalloc/stream-checkpoint"
# Puts per commit txn: leaves room for the fence compare.
COMMIT_CHUNK = MAX_TXN_OPS - 8
ID_BLOCK = 1000


def checkpoint_key(stream_id: int) -> str:
    return f"{CHECKPOINTS_PREFIX}{stream_id}"


class CheckpointStore:
    """Read, commit and prune consensus checkpoints; allocate round ids (module docstring)."""

    def __init__(self, kv: MetaKV):
        self.kv = kv
        self.ids = IdAllocator(kv, CHECKPOINT_ID_KEY, block_size=ID_BLOCK)

    async def load(self) -> dict[int, stream_pb2.StreamCheckpoint]:
        """Every committed checkpoint, by stream id."""
        snap = await self.kv.load_prefix(CHECKPOINTS_PREFIX)
        out: dict[int, stream_pb2.StreamCheckpoint] = {}
        for _, value in snap.items():
            cp = stream_pb2.StreamCheckpoint.FromString(value)
            out[cp.stream_id] = cp
        return out

    async def get(self, stream_id: int) -> stream_pb2.StreamCheckpoint | None:
        raw = await self.kv.get(checkpoint_key(stream_id))
        return None if raw is None else stream_pb2.StreamCheckpoint.FromString(raw)

    async def commit(self, checkpoints: Mapping[int, stream_pb2.StreamCheckpoint]) -> int:
        """Write these consensus checkpoints (``COMMIT_CHUNK`` per txn); returns the txns used.

        The caller only passes ids above what it committed before (it holds
        the committed ids of this leadership, loaded at its start).
        """
        items = sorted(checkpoints.items())
        txns = 0
        for i in range(0, len(items), COMMIT_CHUNK):
            chunk = items[i:i + COMMIT_CHUNK]
            ops = [put(checkpoint_key(sid), cp.SerializeToString()) for sid, cp in chunk]
            await self.kv.txn([], ops, operation=f"commit {len(chunk)} stream checkpoints")
            txns += 1
        return txns

    async def prune(self, live_stream_ids: Collection[int]) -> int:
        """Remove records of streams that no longer exist; returns how many."""
        live = set(live_stream_ids)
        stale = [sid for sid in await self.load() if sid not in live]
        for i in range(0, len(stale), COMMIT_CHUNK):
            ops = [delete(checkpoint_key(sid)) for sid in stale[i:i + COMMIT_CHUNK]]
            await self.kv.txn([], ops, operation=f"remove {len(ops)} checkpoints of dropped streams")
        return len(stale)
