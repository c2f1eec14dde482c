"""The leader's two stream observers: which stream nodes are live, and the manager's periodic part.

Both run for the whole leadership and never die on one error: a failed
session watch is logged and restarted a second later (until then the manager
keeps the live set it had), a failed tick is logged and the next one runs.
Session values are input: ``meta.session`` drops (and logs once) values that
are not sessions, so a garbage key under the stream node prefix is skipped
and the nodes registered after it are still seen.
"""

from __future__ import annotations

import asyncio

from meta.kv import MetaKV
from meta.loops import loop_failed
from meta.session import SessionEvent, SessionSnapshot, watch_sessions
from meta.watch import EventType
from querycoord.common.protocol import STREAMNODE_ROLE
from querycoord.stream.manager import StreamManager


async def follow_stream_nodes(kv: MetaKV, streams: StreamManager) -> None:
    """Feed the stream manager the stream nodes with a live meta session (WATCH ends early on them); a deleted
    session is a lost node at once (the manager damps it)."""
    live: set[int] = set()
    while True:
        try:
            async for item in watch_sessions(kv, STREAMNODE_ROLE, reconnect_deadline=None):
                if isinstance(item, SessionSnapshot):
                    live = set(item.sessions)
                elif isinstance(item, SessionEvent):
                    if item.type is EventType.PUT:
                        live.add(item.info.server_id)  # a positive int64: meta.session refuses anything else
                    else:
                        live.discard(item.info.server_id)
                        streams.node_lost(item.info.server_id)
                streams.set_live_nodes(live)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if loop_failed("stream node sessions", exc, kv.client):
                return
        await asyncio.sleep(1)


async def tick_streams(streams: StreamManager, tick: float, refresh: float) -> None:
    """``streams.tick()`` and its checkpoint part every ``tick`` seconds, and a re-read of the store every
    ``refresh`` seconds (in case a change notification was missed)."""
    loop = asyncio.get_running_loop()
    last_refresh = loop.time()
    while True:
        await asyncio.sleep(tick)
        try:
            streams.tick()
            await streams.checkpoint_tick()
            if loop.time() - last_refresh >= refresh:
                last_refresh = loop.time()
                await streams.refresh()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if loop_failed("stream tick", exc, streams.store.kv.client):
                return
