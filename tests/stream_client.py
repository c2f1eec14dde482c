"""A test's side of a coordinator's stream service over gRPC: a stub on its address, and waiting for a state."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from meta.kv import MetaKV
from proto import stream_pb2_grpc
from querycoord.stream.checkpoint_store import CHECKPOINTS_PREFIX


@contextlib.asynccontextmanager
async def stub_for(address: str) -> AsyncIterator[stream_pb2_grpc.StreamMgmtStub]:
    channel = grpc.aio.insecure_channel(address)
    try:
        yield stream_pb2_grpc.StreamMgmtStub(channel)
    finally:
        await channel.close()


async def wait_for(predicate: Callable[[], Awaitable[tuple[bool, Any]]], what: str, timeout: float = 30.0,
                   interval: float = 0.1) -> Any:
    """Poll ``predicate`` (done, what it saw) until done; returns what it saw then. A timeout quotes the last."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        ok, last = await predicate()
        if ok:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last}")


async def stream_keys(kv: MetaKV) -> dict[str, bytes]:
    """What the stream store holds (what a refused request must leave as it was), but the consensus checkpoints
    the leader commits on its own meanwhile."""
    return {k: v for k, v in (await kv.load_prefix("stream/")).items() if not k.startswith(CHECKPOINTS_PREFIX)}
