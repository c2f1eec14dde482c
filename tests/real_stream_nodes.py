"""The reference stream node's state machine under real sessions, driven round by round: the stream tests' harness.

Each ``RealNode`` is a ``StreamNodeState`` (deploy, start, runner update and undeploy rules, per-group reports)
under a real stream-node session in the real etcd of tests/conftest.py; the live session set is read from etcd as
the coordinator's session watch does. The test is the transport, so it can lose a reply; time is a fake clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from meta.kv import MetaKV
from meta.session import Session, list_sessions
from proto import common_pb2, stream_pb2
from querycoord.nodes.streamnode_state import StreamNodeState
from querycoord.settings.config import StreamConfig
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import StreamStore, status_of
from tests import streams
from tests.streams import HEALTH_CONFIG, Clock, new_manager

sp = stream_pb2
INIT, RUNNING = sp.TASK_INIT, sp.TASK_RUNNING
READERS = (sp.TRIGGER_READER, sp.CALC_READER)
CONFIG = dataclasses.replace(
    HEALTH_CONFIG,
    task_silence=30.0,  # far beyond every test: nothing here may be "repaired" by silence
    error_retry_delay=100.0,
    max_retry_delay=100.0,
    vgroup_lost_stop=100.0,
    check_interval=0.3,
)
# Streams over the vgroups the layouts here lead (1-3), with two runner deploys.
REQUEST_DEFAULTS: dict[str, Any] = dict(source_db="db", source_vgroup_ids=[1, 2, 3], num_calc_scan_plans=3,
                                        num_calc_subplans=2, runner_deploys=2)
# Two nodes, each with an snode: one leads vgroups 1 and 2, the other vgroup 3.
TWO_NODES = [([1, 2], True), ([3], True)]
# Snodes on three nodes, the vgroups led by two others: losing an snode never loses a vgroup.
SNODES_APART = [([], True), ([], True), ([], True), ([1, 2], False), ([3], False)]
MANAGER_LOG = "querycoord.stream.manager"


# ----- harness ----------------------------------------------------------------------------------------------------
class RealNode:
    """A reference stream node's state machine under a real stream-node session (see module docstring)."""

    def __init__(self, session: Session, state: StreamNodeState):
        self.session, self.state = session, state

    @classmethod
    async def start(cls, kv: MetaKV, vgroups: Iterable[int] = (), groups: int = 1) -> RealNode:
        session = Session(kv, "streamnode", "stream-node", ttl=30)
        await session.start()
        return cls(session, StreamNodeState(session.server_id, vgroups=vgroups, groups=groups, init_delay_s=0.2))

    @property
    def node_id(self) -> int:
        return self.state.node_id

    async def beat(
        self,
        mgr: StreamManager,
        clock: Clock,
        lose: Callable[[sp.HeartbeatReply], bool] = lambda _: False,
        edit: Callable[[sp.HeartbeatRequest], None] | None = None,
    ) -> sp.HeartbeatReply:
        """One tick of the node: tasks advance, one group is reported, the reply is applied unless ``lose``s it."""
        self.state.tick(clock())
        req = self.state.build_heartbeat()
        if edit is not None:
            edit(req)
        reply = await deliver(mgr, req)
        if not lose(reply):
            self.state.apply_reply(reply, clock())
        return reply

    def held(self) -> set[tuple[int, int, int]]:
        """(stream, task, SID) of every held instance."""
        return {(k[0], k[1], t.info.sid) for k, t in self.state.tasks.items()}


async def deliver(mgr: StreamManager, req: sp.HeartbeatRequest) -> sp.HeartbeatReply:
    """What StreamMgmtServicer.StreamHeartbeat does: an exception becomes an error reply (the actions are lost)."""
    try:
        reply = await mgr.handle_heartbeat(req)
    except Exception as exc:
        return sp.HeartbeatReply(status=status_of(exc))
    if not reply.HasField("status"):
        reply.status.CopyFrom(common_pb2.Status(error_code=common_pb2.SUCCESS))
    return reply


async def feed_sessions(mgr: StreamManager, kv: MetaKV) -> None:
    """The live stream-node sessions, as the coordinator's session watch feeds them."""
    mgr.set_live_nodes((await list_sessions(kv, "streamnode")).sessions)



@contextlib.asynccontextmanager
async def real_nodes(
    kv: MetaKV, layout: list[tuple[list[int], bool]], groups: int = 1
) -> AsyncIterator[list[RealNode]]:
    """Nodes with the given (vgroups, hosts an snode) and real sessions; the snodes are created in the store."""
    store = StreamStore(kv)
    nodes = [await RealNode.start(kv, vgroups, groups) for vgroups, _ in layout]
    try:
        for node, (_, snode) in zip(nodes, layout, strict=True):
            if snode:
                node.state.snode_id = (await store.create_snode(node.node_id)).id
        yield nodes
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                await node.session.close()


def create_req(name: str, **kw: Any) -> sp.CreateStreamRequest:
    return streams.create_req(name, **{**REQUEST_DEFAULTS, **kw})


async def create_streams(store: StreamStore, nodes: list[RealNode], n: int, **kw: Any) -> list[sp.StreamDef]:
    snodes = [x.state.snode_id for x in nodes if x.state.snode_id]
    return [await store.create_stream(create_req(f"s{i}", **kw), snodes) for i in range(n)]


async def manager(
    store: StreamStore, kv: MetaKV, clock: Clock, revision: int = 100, config: StreamConfig = CONFIG
) -> StreamManager:
    """A leader's manager under ``config`` that knows the live stream-node sessions."""
    mgr = await new_manager(store, clock, revision=revision, config=config)
    await feed_sessions(mgr, kv)
    return mgr


@contextlib.asynccontextmanager
async def running_streams(
    store: StreamStore, kv: MetaKV, clock: Clock, n: int, layout: list[tuple[list[int], bool]] = TWO_NODES,
    config: StreamConfig = CONFIG, **kw: Any
) -> AsyncIterator[tuple[list[RealNode], list[sp.StreamDef], StreamManager]]:
    """``n`` streams (``kw`` for their requests) running on nodes of ``layout`` under a leader's manager
    (``config``)."""
    async with real_nodes(kv, layout) as nodes:
        sdefs = await create_streams(store, nodes, n, **kw)
        mgr = await manager(store, kv, clock, config=config)
        await run_until(mgr, nodes, clock, lambda: running(mgr))
        yield nodes, sdefs, mgr


async def round_(mgr: StreamManager, nodes: list[RealNode], clock: Clock,
                 lose: Callable[[RealNode, sp.HeartbeatReply], bool] = lambda *_: False) -> list[sp.HeartbeatReply]:
    """Every node beats once (then the manager ticks and the clock moves 0.1 s)."""
    replies = [await n.beat(mgr, clock, lambda r, n=n: lose(n, r)) for n in nodes]
    mgr.tick()
    clock.advance(0.1)
    return replies


def running(mgr: StreamManager, ids: Iterable[int] | None = None) -> bool:
    wanted = set(ids) if ids is not None else None
    states = {s.state for s in mgr.show_streams().streams if wanted is None or s.stream.id in wanted}
    return states == {sp.STREAM_RUNNING}


async def run_until(mgr: StreamManager, nodes: list[RealNode], clock: Clock, done: Callable[[], bool],
                    rounds: int = 40, what: str = "streams running") -> None:
    for _ in range(rounds):
        await round_(mgr, nodes, clock)
        if done():
            return
    raise AssertionError(f"{what}: not after {rounds} rounds; {summary(mgr)}")


def summary(mgr: StreamManager) -> dict[str, Any]:
    return {s.stream.name: (sp.StreamState.Name(s.state), s.stop_reason,
                            sorted((sp.TaskKind.Name(t.task.kind), sp.TaskStatus.Name(t.status)) for t in s.tasks))
            for s in mgr.show_streams().streams}


def tasks_of(mgr: StreamManager) -> dict[tuple[int, int], tuple[Any, int]]:
    """(stream, task) -> (the planned task, every field, and its node)."""
    return {(sid, t.task.task_id): (t.task, t.node_id) for sid, rt in mgr.streams.items() for t in rt.tasks.values()}


def node_by_id(nodes: list[RealNode], node_id: int) -> RealNode:
    return next(n for n in nodes if n.node_id == node_id)


async def lose_runner_snode(
    mgr: StreamManager, kv: MetaKV, nodes: list[RealNode]
) -> tuple[RealNode, int, list[RealNode]]:
    """A node hosting runners of a stream whose trigger runs elsewhere dies: its session goes, the manager is fed
    the live sessions. Returns that node, that stream and the nodes left alive."""
    lost_node, stream_id = next(
        (n, sid) for n in nodes if n.state.snode_id for sid, rt in sorted(mgr.streams.items())
        if (trig := rt.trigger()) is not None and trig.node_id != n.node_id
        and any(t.task.kind == sp.RUNNER and t.node_id == n.node_id for t in rt.tasks.values())
    )
    await lost_node.session.close()
    await feed_sessions(mgr, kv)
    return lost_node, stream_id, [n for n in nodes if n is not lost_node]
