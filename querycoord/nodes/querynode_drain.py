"""A query node's graceful stop: before it lets go of its session, it asks the leader to drain it.

On SIGTERM the node calls DrainNode for itself (``graceful_stop``: the leader uncordons it when it registers
again, so a rolling restart leaves it ACTIVE) on whichever coordinator leads (the coordinator sessions in etcd
name them; the client follows the leader), then asks again every ``POLL_S`` (DrainNode is idempotent and
answers the node as the leader sees it) until the leader reports it DRAINED: every copy it held is then held by
another node of its replica. It gives up after ``timeout`` seconds, leader or not, and the node stops as
before; a second signal stops it at once (``node_process.run_node``). DrainNode rather than ShowNodes: a node's
credential may call the first, for itself only, and not the second.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from loguru import logger

from meta.errors import MetaError
from meta.kv import MetaKV
from meta.session import list_sessions
from proto import common_pb2, querycoord_pb2, querycoord_pb2_grpc
from querycoord.common.protocol import QUERYCOORD_ROLE
from querycoord.net.client import CoordinatorUnavailable, LeaderFollowingClient

DEFAULT_TIMEOUT_S = 30.0
POLL_S = 0.5


async def _coordinators(kv: MetaKV) -> list[str]:
    snap = await list_sessions(kv, QUERYCOORD_ROLE)
    return [snap.sessions[i].address for i in sorted(snap.sessions)]


async def drain_before_stop(kv: MetaKV, node_id: int, timeout: float) -> bool:
    """Ask the leader to drain ``node_id`` and wait until it is DRAINED, at most ``timeout`` seconds; True when
    drained. Never raises: a stop goes on whatever happens here."""
    deadline = time.monotonic() + timeout
    logger.info("query node {} stopping: asking the leader to drain it first (at most {:g}s)", node_id, timeout)

    async def discover() -> list[str]:
        try:
            return await _coordinators(kv)
        except MetaError:
            return []

    client = LeaderFollowingClient(call_timeout=max(0.5, min(5.0, timeout)), deadline=None, pause=0.2,
                                   discover=discover)
    request = querycoord_pb2.NodeLifecycleRequest(node_id=node_id, graceful_stop=True)
    last = ""
    try:
        while time.monotonic() < deadline:
            try:
                resp = await asyncio.wait_for(
                    client.call(querycoord_pb2_grpc.QueryCoordStub, "DrainNode", request),
                    max(0.1, deadline - time.monotonic()))
            except (CoordinatorUnavailable, grpc.aio.AioRpcError, TimeoutError) as exc:
                text = f"no leader answered: {exc}"
            else:
                if resp.status.error_code != common_pb2.SUCCESS:
                    text = f"the leader refused: {resp.status.reason}"
                elif resp.node.lifecycle == querycoord_pb2.NODE_LIFECYCLE_DRAINED:
                    logger.info("query node {} drained: every copy it held is served elsewhere", node_id)
                    return True
                else:
                    d = resp.node.drain
                    text = f"draining: {d.copies_left}/{d.copies_total} copies left" + (
                        f", waiting: {d.waiting}" if d.waiting else "")
            if text != last:
                logger.info("query node {} stopping: {}", node_id, text)
                last = text
            await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        logger.warning("query node {} stops before it is drained: {:g}s passed ({})", node_id, timeout, last)
        return False
    finally:
        await client.close()
