"""Which query nodes exist and which are online, from meta sessions.

A node is ONLINE while its session key exists. When the key is deleted
(lease expired, node stopped) the node goes OFFLINE at once (so nothing it
held counts from then on: ``querycoord.served``) and the ``on_node_down``
callback forgets it: its copies leave query meta, it leaves its replicas,
and ``remove`` drops it here. A node that comes back registers a new session,
hence a new ServerID: it is a new node. One with a fixed id (``--node-id``)
is taken as a new node as soon as its old incarnation is forgotten, which
the callback does at once; ``Node.created`` (its session key's create
revision) tells the incarnations apart.

Session values are input: ``meta.session`` drops values that are not
sessions, and a session whose capacity or address a query node cannot have
is logged once and ignored here. Nothing a session says stops the watch.
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
from proto import common_pb2, querynode_pb2
from querycoord.cluster.client import NodeError, QueryNodeClient
from querycoord.protocol import QUERYNODE_ROLE

DEFAULT_CAPACITY = 1 << 30


def valid_address(address: str) -> bool:
    """``host:port`` with a port in 1..65535: what a query node's session must advertise to be called."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536)


def session_capacity(info: SessionInfo) -> int | None:
    """The memory a node offers, from its session; None when the value is not a positive integer.

    A capacity of 0 once divided the allocator by zero inside a trigger.
    """
    raw = info.extra.get("capacity_bytes", DEFAULT_CAPACITY)
    if isinstance(raw, bool):
        return None
    try:
        cap = int(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return cap if 0 < cap < 1 << 62 else None


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
    created: int = 0  # the create revision of its session key: which incarnation (``cluster.incarnations``)

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
        on_node_up: Callable[[Node], Awaitable[None]] | None = None,
    ):
        self.kv = kv
        self.fence = fence
        self.rpc_timeout = rpc_timeout
        self.on_node_down = on_node_down
        self.on_node_up = on_node_up  # a node joined (or came back) after the first snapshot was taken
        self.nodes: dict[int, Node] = {}
        # Bumped whenever a node comes online, goes offline or is forgotten: readers that derive something from
        # the online nodes (``querycoord.served``) recompute only when it moved.
        self.version = 0
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.rejected = 0  # malformed sessions ignored
        self.watch_errors = 0
        # Nodes with a fixed id (--node-id) back under it while their previous incarnation is still offline.
        self._returning: dict[int, SessionInfo] = {}

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
            if not self.nodes[info.server_id].online:
                # A fixed-id node restarted while its old incarnation is handled as down: it joins, as a new
                # node, once ``remove`` has forgotten that one (its NodeDown balance is done).
                self._returning[info.server_id] = info
            return
        cap = session_capacity(info)
        if cap is None:
            self.rejected += 1
            logger.warning("query node session {} ignored: capacity_bytes {!r} is not a positive integer",
                           info.server_id, info.extra.get("capacity_bytes"))
            return
        if info.server_id <= 0 or not valid_address(info.address):
            self.rejected += 1
            logger.warning("query node session ignored: server id {} / address {!r} invalid", info.server_id,
                           info.address[:100])
            return
        client = QueryNodeClient(info.server_id, info.address, timeout=self.rpc_timeout)
        client.fence = self.fence
        self.nodes[info.server_id] = Node(info.server_id, info.address, cap, NodeState.ONLINE, client, info.created)
        self.version += 1
        logger.info("query node {} online at {} (capacity {} MiB)", info.server_id, info.address, cap >> 20)
        self.changed.set()

    async def _down(self, node_id: int) -> None:
        node = self.nodes.get(node_id)
        if node is None or not node.online:
            return
        node.state = NodeState.OFFLINE
        self.version += 1
        logger.warning("query node {} offline (session gone)", node_id)
        self.changed.set()
        if self.on_node_down is not None:
            try:
                await self.on_node_down(node_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the checker forgets offline nodes at its next pass: the watch goes on
                logger.warning("query node {} went offline, but forgetting it failed: {}; the checker tries again",
                               node_id, exc)

    async def _watch(self) -> None:
        """Follow node sessions forever: a failure (etcd trouble, a bug) is logged and the watch restarts
        from a fresh snapshot, so new nodes are always seen and ``ready`` is always reached."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.watch_errors += 1
                logger.exception("query node session watch failed; restarting it")
            await asyncio.sleep(0.5)

    def _try_add(self, info: SessionInfo) -> None:
        """``_add``, and a session it cannot take (a bug or a value no check foresaw) logged in one line and
        ignored: the watch goes on, so nodes added later are still seen."""
        try:
            self._add(info)
        except Exception as exc:
            self.rejected += 1
            logger.warning("query node session {} ignored: {}: {}", info.server_id, type(exc).__name__,
                           str(exc)[:120])

    async def _follow(self) -> None:
        async for item in watch_sessions(self.kv, QUERYNODE_ROLE, reconnect_deadline=None):
            if isinstance(item, SessionSnapshot):
                joined = [i.server_id for i in item.sessions.values() if i.server_id not in self.nodes]
                for info in item.sessions.values():
                    self._try_add(info)
                self._returning = {n: i for n, i in self._returning.items() if n in item.sessions}
                for nid in [n for n, node in self.nodes.items() if node.online and n not in item.sessions]:
                    await self._down(nid)
                if self.ready.is_set():  # a re-read after a compaction or a restarted watch: who joined meanwhile
                    for nid in joined:
                        await self._joined(nid)
                self.ready.set()
            elif isinstance(item, SessionEvent):
                if item.type is EventType.PUT:
                    known = item.info.server_id in self.nodes
                    self._try_add(item.info)
                    if not known:
                        await self._joined(item.info.server_id)
                else:
                    self._returning.pop(item.info.server_id, None)
                    await self._down(item.info.server_id)

    async def _joined(self, node_id: int) -> None:
        """Tell ``on_node_up`` of a node that just came online (not of those the first snapshot found: the
        takeover handles them); its failure is logged, never the watch's end."""
        node = self.nodes.get(node_id)
        if node is None or not node.online or self.on_node_up is None:
            return
        try:
            await self.on_node_up(node)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("query node {} joined, but recording it failed: {}; the checker tries again", node_id, exc)

    def online(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.online]

    def online_ids(self) -> set[int]:
        return {n.node_id for n in self.nodes.values() if n.online}

    def is_online(self, node_id: int) -> bool:
        n = self.nodes.get(node_id)
        return n is not None and n.online

    def get(self, node_id: int) -> Node | None:
        return self.nodes.get(node_id)

    def client(self, node_id: int) -> QueryNodeClient:
        """The node's client; a node that vanished since planning is a ``NodeError`` like any failed call."""
        node = self.nodes.get(node_id)
        if node is None:
            raise NodeError(node_id, "connect", common_pb2.NOT_FOUND, f"query node {node_id} is unknown or gone",
                            transport=True)
        return node.client

    async def remove(self, node_id: int) -> None:
        """Forget an offline node once nothing refers to it any more; an online one (a new incarnation that took
        the id meanwhile) stays."""
        if self.is_online(node_id):
            return
        node = self.nodes.pop(node_id, None)
        if node is not None:
            self.version += 1
            await node.client.close()
        back = self._returning.pop(node_id, None)
        if back is not None:
            logger.info("query node {} is back under its id (a new session): taken as a new node", node_id)
            self._try_add(back)
            await self._joined(back.server_id)
