"""Which query nodes exist and which are online, from meta sessions.

A node is ONLINE while its session key exists. When the key is deleted
(lease expired, node stopped) the node goes OFFLINE at once and the
``on_node_down`` callback queues a NodeDown balance; it is forgotten once
that balance has moved everything off it (``remove``). A node that comes
back registers a new session, hence a new ServerID: it is a new node.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from loguru import logger

from meta.kv import MetaKV
from meta.session import SessionEvent, SessionInfo, SessionSnapshot, watch_sessions
from meta.watch import EventType
from proto import querynode_pb2
from querycoord.cluster.client import QueryNodeClient

QUERYNODE_ROLE = "querynode"
DEFAULT_CAPACITY = 1 << 30


class NodeState(enum.Enum):
    ONLINE = "online"
    OFFLINE = "offline"


@dataclass
class Node:
    node_id: int
    address: str
    capacity: int
    state: NodeState
    client: QueryNodeClient = field(repr=False)

    @property
    def online(self) -> bool:
        return self.state is NodeState.ONLINE


class NodeManager:
    """Tracks query nodes (see module docstring); ``fence`` is stamped on every client."""

    def __init__(
        self,
        kv: MetaKV,
        *,
        fence: querynode_pb2.CoordFence | None = None,
        rpc_timeout: float = 10.0,
        on_node_down: Callable[[int], Awaitable[None]] | None = None,
    ):
        self.kv = kv
        self.fence = fence
        self.rpc_timeout = rpc_timeout
        self.on_node_down = on_node_down
        self.nodes: dict[int, Node] = {}
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="querynode-sessions")
        await self.ready.wait()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for n in self.nodes.values():
            await n.client.close()

    def _add(self, info: SessionInfo) -> None:
        if info.server_id in self.nodes:
            return
        client = QueryNodeClient(info.server_id, info.address, timeout=self.rpc_timeout)
        client.fence = self.fence
        cap = int(info.extra.get("capacity_bytes", DEFAULT_CAPACITY))
        self.nodes[info.server_id] = Node(info.server_id, info.address, cap, NodeState.ONLINE, client)
        logger.info("query node {} online at {} (capacity {} MiB)", info.server_id, info.address, cap >> 20)
        self.changed.set()

    async def _down(self, node_id: int) -> None:
        node = self.nodes.get(node_id)
        if node is None or not node.online:
            return
        node.state = NodeState.OFFLINE
        logger.warning("query node {} offline (session gone)", node_id)
        self.changed.set()
        if self.on_node_down is not None:
            await self.on_node_down(node_id)

    async def _watch(self) -> None:
        async for item in watch_sessions(self.kv, QUERYNODE_ROLE, reconnect_deadline=None):
            if isinstance(item, SessionSnapshot):
                for info in item.sessions.values():
                    self._add(info)
                for nid in [n for n, node in self.nodes.items() if node.online and n not in item.sessions]:
                    await self._down(nid)
                self.ready.set()
            elif isinstance(item, SessionEvent):
                if item.type is EventType.PUT:
                    self._add(item.info)
                else:
                    await self._down(item.info.server_id)

    def online(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.online]

    def is_online(self, node_id: int) -> bool:
        n = self.nodes.get(node_id)
        return n is not None and n.online

    def get(self, node_id: int) -> Node | None:
        return self.nodes.get(node_id)

    def client(self, node_id: int) -> QueryNodeClient:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(f"query node {node_id} is unknown")
        return node.client

    async def remove(self, node_id: int) -> None:
        """Forget an offline node once nothing refers to it any more."""
        node = self.nodes.pop(node_id, None)
        if node is not None:
            await node.client.close()
