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

The nodes a leadership finds online when it takes over are **unheard** until they answer it
(``hear_inherited`` at takeover, then every answer to the checker): what an
earlier leader recorded on them counts (``serving_ids``) only from then on.
Why: etcd renews every lease it recovers when it restarts, so after a whole
cluster restart the session of a node that died with it lives on for a TTL
with nobody behind it, and a new leader elected meanwhile would show that
node's copies as served (the restart drill saw 100 % for replicas whose nodes
were dead). A node that registers during the leadership is a new incarnation:
it is heard once ``on_node_up`` has taken it in (forgotten what the records
still place on its id, an earlier process's, and recorded it).

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

from meta.address import split_address
from meta.kv import MetaKV
from meta.loops import follow_forever
from meta.session import SessionEvent, SessionInfo, SessionSnapshot, watch_sessions
from meta.watch import EventType
from proto import common_pb2, querynode_pb2
from querycoord.cluster.client import NodeError, QueryNodeClient
from querycoord.common.protocol import QUERYNODE_ROLE

DEFAULT_CAPACITY = 1 << 30


def valid_address(address: str) -> bool:
    """``host:port`` with a port in 1..65535: what a query node's session must advertise to be called."""
    try:
        return split_address(address)[1] > 0
    except ValueError:
        return False


def session_capacity(info: SessionInfo) -> int | None:
    """The memory a node offers, from its session; None when the value is not a positive integer.

    A capacity of 0 would divide the allocator by zero inside a trigger.
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
        refuse: Callable[[int], bool] | None = None,
    ):
        """``refuse``: whether a node id is fenced (``meta.session_guard``): its sessions are not taken online."""
        self.kv = kv
        self.fence = fence
        self.rpc_timeout = rpc_timeout
        self.on_node_down = on_node_down
        self.on_node_up = on_node_up  # a node joined (or came back) after the first snapshot was taken
        self.refuse = refuse
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
        # Online at takeover and not heard from since, and joined since but not yet taken in by ``on_node_up``
        # (see module docstring): neither counts.
        self.unheard: set[int] = set()
        self.joining: set[int] = set()
        # Nodes whose lifecycle is not ACTIVE, with its name (``cluster.lifecycle`` keeps it): given nothing new.
        self.cordoned: dict[int, str] = {}

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
        if self.refuse is not None and self.refuse(info.server_id):
            self.rejected += 1  # the guard logged the fencing; its sessions end as soon as they appear
            return
        if info.server_id in self.nodes:
            if not self.nodes[info.server_id].online:
                # A fixed-id node restarted while its old incarnation is handled as down: it joins, as a new
                # node, once ``remove`` has forgotten that one (its NodeDown balance is done).
                self._returning[info.server_id] = info
                self.changed.set()  # a node left with its re-replication delayed is taken back at the next pass
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
        if self.ready.is_set():
            self.joining.add(info.server_id)  # until ``on_node_up`` has taken it in (``_joined``)
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
        await follow_forever("query node sessions", self._follow, pause=0.5, client=self.kv.client,
                             on_error=self._watch_failed)

    def _watch_failed(self) -> None:
        self.watch_errors += 1

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
                else:
                    self.unheard = self.online_ids()
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
            self._taken_in(node_id)
            return
        try:
            await self.on_node_up(node)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("query node {} joined, but recording it failed: {}; the checker tries again", node_id, exc)
            self.unheard.add(node_id)  # counts once it answers the checker, whose repair handles stale records
        self._taken_in(node_id)

    def _taken_in(self, node_id: int) -> None:
        if node_id in self.joining:
            self.joining.discard(node_id)
            self.version += 1

    def online(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.online]

    def online_ids(self) -> set[int]:
        return {n.node_id for n in self.nodes.values() if n.online}

    def eligible_ids(self) -> set[int]:
        """Online nodes that may be given new work: heard by this leader, and not cordoned, draining or drained."""
        return self.online_ids() - self.ineligible_ids()

    def ineligible_ids(self) -> set[int]:
        """Nodes no new work goes to even while online: the cordoned, draining or drained ones, and those that have
        not answered this leader (``unheard``). Why the unheard: a session that outlived its process (etcd renewed
        it on restart) names a node nobody runs; work placed there fails once that session lapses, and a replica
        left with no other node could not take it back (the restart drill failed a repair so). A live node leaves
        the set at its first answer to the checker."""
        return self.cordoned.keys() | self.unheard

    def serving_ids(self) -> set[int]:
        """The online nodes whose recorded copies count as served: not those unheard or joining."""
        return self.online_ids() - self.unheard - self.joining

    def heard(self, node_id: int) -> None:
        """``node_id`` answered this leader: what the records place on it counts from now on."""
        if node_id in self.unheard:
            self.unheard.discard(node_id)
            self.version += 1
            logger.debug("query node {} answered: what it holds counts", node_id)

    async def hear_inherited(self, timeout: float) -> set[int]:
        """At takeover: ask every unheard node whether it runs (GetComponentStates, bounded by ``timeout``: a
        dead one refuses the connection at once); returns those still unheard, which count once they answer
        the checker or are forgotten once their session ends."""

        async def ask(node: Node) -> None:
            try:
                resp = await node.client.call("GetComponentStates", querynode_pb2.GetComponentStatesRequest(),
                                              timeout=timeout)
            except NodeError as exc:
                logger.info("query node {} did not answer at takeover: {}", node.node_id, exc)
                return
            if resp.state.state_code == common_pb2.HEALTHY:
                self.heard(node.node_id)
            else:
                logger.info("query node {} is not healthy at takeover ({})", node.node_id,
                            common_pb2.StateCode.Name(resp.state.state_code))

        await asyncio.gather(*(ask(n) for n in self.online() if n.node_id in self.unheard))
        return self.unheard & self.online_ids()

    def returning(self, node_id: int) -> bool:
        """Whether a new session of offline ``node_id`` waits for ``remove`` to take it in."""
        return node_id in self._returning

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
        """Forget an offline node once nothing refers to it any more.

        A node online under that id is left alone: it came back (a new session under its fixed id) while the
        forgetting of its old self awaited, and two forgets of one lost node may run at once (the node-down hook
        and the checker's pass): the later one must not take the new incarnation offline for good."""
        if self.is_online(node_id):
            return
        node = self.nodes.pop(node_id, None)
        self.unheard.discard(node_id)
        self.joining.discard(node_id)
        if node is not None:
            self.version += 1
            await node.client.close()
        back = self._returning.pop(node_id, None)
        if back is not None:
            logger.info("query node {} is back under its id (a new session): taken as a new node", node_id)
            self._try_add(back)
            await self._joined(back.server_id)
