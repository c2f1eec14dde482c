"""Issue 8 (self-healing task engine), stream holes 5, 7 and 12: each test fails on the code before the fix.

* Hole 5: a start or runner update was marked sent when put in a reply; a lost reply (node timeout, or planning
  raising and replacing the whole reply) left the trigger INIT, or on its old top runners, forever. Now actions are
  level-triggered: re-sent until the node's report shows the effect.
* Hole 7: heartbeats were not checked against the sender. Now only nodes with a live stream-node session are heard,
  an snode only from the node recorded for it, a vgroup stays with its holder until it lets go (no flapping), and
  WATCH adopts under the session-verified node id.
* Hole 12: adopted calc readers lost their scan plan (and redeployed ones kept the wrong one). Now adoption restores
  every field of every task as deployed.

The nodes are the reference stream node's real state machine (``StreamNodeState``: deploy, start, runner update
and undeploy rules, per-group reports), each under a real stream-node session in the real etcd of
tests/conftest.py; the live session set is read from etcd as the coordinator's session watch does. The test is the
transport, so it can lose a reply; time is a fake clock. One test runs the whole path: a coordinator and in-process
stream nodes over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import pytest

from meta.etcd_server import EtcdCluster
from meta.idalloc import IdAllocator
from meta.kv import MetaKV
from meta.session import Session, list_sessions
from proto import common_pb2, stream_pb2
from querycoord.nodes.streamnode import StreamNode
from querycoord.nodes.streamnode_state import StreamNodeState
from querycoord.stream.manager import ManagerState, StreamManager
from querycoord.stream.plan import Slot, expected_counts, plan_stream, task_layout
from querycoord.stream.store import TASK_ID_KEY, StreamStore, status_of
from tests import streams
from tests.stream_client import stub_for, wait_for
from tests.streams import HEALTH_CONFIG, Clock, fenced_store, new_manager
from tests.test_stream_service import coordinator, wait_leader

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


@pytest.fixture
async def store(kv: MetaKV) -> StreamStore:
    return await fenced_store(kv)


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


async def manager(store: StreamStore, kv: MetaKV, clock: Clock, revision: int = 100) -> StreamManager:
    mgr = await new_manager(store, clock, revision=revision, config=CONFIG)
    await feed_sessions(mgr, kv)
    return mgr


@contextlib.asynccontextmanager
async def running_streams(
    store: StreamStore, kv: MetaKV, clock: Clock, n: int, layout: list[tuple[list[int], bool]] = TWO_NODES, **kw: Any
) -> AsyncIterator[tuple[list[RealNode], list[sp.StreamDef], StreamManager]]:
    """``n`` streams (``kw`` for their requests) running on nodes of ``layout`` under a leader's manager."""
    async with real_nodes(kv, layout) as nodes:
        sdefs = await create_streams(store, nodes, n, **kw)
        mgr = await manager(store, kv, clock)
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


# ----- hole 5: level-triggered actions ----------------------------------------------------------------------------
async def test_lost_start_is_sent_again_until_the_trigger_runs(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        (sdef,) = await create_streams(store, nodes, 1)
        mgr = await manager(store, kv, clock)
        lost: list[sp.HeartbeatReply] = []

        def lose_first_start(_: RealNode, reply: sp.HeartbeatReply) -> bool:
            if reply.starts and not lost:
                lost.append(reply)  # the node timed out: the reply never reached it
                return True
            return False

        for _ in range(30):
            await round_(mgr, nodes, clock, lose_first_start)
            if running(mgr):
                break
        assert lost, "the start was never sent"
        assert running(mgr), f"the trigger never started after its start was lost: {summary(mgr)}"
        trig = next(t for n in nodes for t in n.state.tasks.values() if t.is_trigger)
        assert trig.started and trig.status == RUNNING
        assert mgr.resent_actions >= 1 and mgr.show_streams().streams[0].deploy_times == 1
        assert sdef.id in mgr.streams


async def test_planning_error_does_not_lose_the_start_of_another_stream(store: StreamStore, kv: MetaKV) -> None:
    """Planning a new stream raises (its id allocator key is corrupt in etcd) on every heartbeat for a while. Before
    the fix the exception replaced the whole reply, and with it the start of a stream that was due: that stream
    then stayed DEPLOYING forever, even after planning worked again."""
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        (first,) = await create_streams(store, nodes, 1)
        # Reserve task ids exactly as needed, so planning the next stream must read the allocator key in etcd.
        store.task_ids = IdAllocator(store.kv, TASK_ID_KEY, block_size=1)
        mgr = await manager(store, kv, clock)
        rt = mgr.streams[first.id]
        await run_until(mgr, nodes, clock, lambda: bool(rt.tasks) and not rt.pending, what="first stream handed out")
        await kv.save(TASK_ID_KEY, "corrupt")
        second = await store.create_stream(create_req("second"), [n.state.snode_id for n in nodes])
        mgr.put_stream(second)
        for _ in range(15):
            replies = await round_(mgr, nodes, clock)
            assert all(r.status.error_code == common_pb2.SUCCESS for r in replies), replies
        assert running(mgr, [first.id]), f"the first stream did not start while planning failed: {summary(mgr)}"
        assert mgr.errors >= 1 and not mgr.streams[second.id].tasks
        await kv.save(TASK_ID_KEY, str(10**6))  # repaired: the second stream is planned on the next heartbeat
        await run_until(mgr, nodes, clock, lambda: running(mgr))


async def test_lost_runner_update_is_sent_again_until_the_trigger_reports_it(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with running_streams(store, kv, clock, 8, SNODES_APART, runner_deploys=3) as (nodes, _, mgr):
        lost_node, stream_id, alive = await lose_runner_snode(mgr, kv, nodes)
        assert mgr.node_lost(lost_node.node_id)
        rt = mgr.streams[stream_id]
        assert rt.runner_update
        lost: list[sp.HeartbeatReply] = []

        def lose_first_update(_: RealNode, reply: sp.HeartbeatReply) -> bool:
            if any(u.stream_id == stream_id for u in reply.runner_updates) and not lost:
                lost.append(reply)
                return True
            return False

        for _ in range(20):
            await round_(mgr, alive, clock, lose_first_update)
        assert lost, "no runner update was sent"
        trig = rt.trigger()
        assert trig is not None
        held = node_by_id(alive, trig.node_id).state.tasks[(stream_id, trig.task.task_id)]
        tops = sorted((t.task for t in rt.tasks.values() if t.task.kind == sp.RUNNER and t.task.top),
                      key=lambda task: task.deploy_id)
        want = [(task.task_id, task.sid) for task in tops]
        assert [(t.task_id, t.sid) for t in held.top_runners] == want, "the trigger feeds stale top runners"
        assert any(sid > 1 for _, sid in want)
        assert not rt.runner_update and mgr.resent_actions >= 1


async def test_runner_update_lost_before_a_leader_change_is_sent_by_the_next_leader(
    store: StreamStore, kv: MetaKV
) -> None:
    """The old leader moved runners and died before its update reached the trigger: the new leader adopts the
    stream as it runs and sees from the trigger's report that it feeds old top runners."""
    clock = Clock()
    async with running_streams(store, kv, clock, 8, SNODES_APART, runner_deploys=3) as (nodes, _, old):
        lost_node, stream_id, alive = await lose_runner_snode(old, kv, nodes)
        old.node_lost(lost_node.node_id)
        def no_update_gets_out(_: RealNode, reply: sp.HeartbeatReply) -> bool:
            del reply.runner_updates[:]  # the old leader dies before any update reaches a trigger
            return False

        for _ in range(10):  # the moved runners are handed out and run
            await round_(old, alive, clock, no_update_gets_out)
        moved = {k: t for k, t in tasks_of(old).items() if k[0] == stream_id and t[0].kind == sp.RUNNER}
        assert any(task.sid == 2 for task, _ in moved.values())
        mgr = await manager(store, kv, clock, revision=200)
        await run_until(mgr, alive, clock, lambda: mgr.state is ManagerState.NORMAL and running(mgr, [stream_id]))
        rt = mgr.streams[stream_id]
        assert mgr.adopted >= 1 and rt.deploy_times == 0, "adopted as it ran"
        for _ in range(5):
            await round_(mgr, alive, clock)
        trig = rt.trigger()
        assert trig is not None
        held = node_by_id(alive, trig.node_id).state.tasks[(stream_id, trig.task.task_id)]
        want = sorted((task.deploy_id, task.task_id, task.sid) for task, _ in moved.values() if task.top)
        assert [(t.task_id, t.sid) for t in held.top_runners] == [(tid, sid) for _, tid, sid in want]
        assert not rt.runner_update


def test_plan_fills_exactly_the_task_layout() -> None:
    """``plan_stream`` and ``task_layout`` (what adoption restores and checks against) never disagree."""
    sdefs = [
        sp.StreamDef(id=1, name="a", source_vgroup_ids=[3, 1, 2], num_calc_scan_plans=3, num_calc_subplans=2,
                     runner_deploys=2, main_snode_id=1),
        sp.StreamDef(id=2, name="b", source_vgroup_ids=[5, 4], trigger_vgroup_id=4, num_calc_scan_plans=2,
                     num_calc_subplans=1, runner_deploys=3, main_snode_id=1),
        sp.StreamDef(id=3, name="c", source_vgroup_ids=[7], runner_deploys=1, main_snode_id=1),
    ]
    for sdef in sdefs:
        ids = iter(range(1, 1000))
        plan = plan_stream(sdef, None, {1, 2}, {1: 2}, lambda n, ids=ids: [next(ids) for _ in range(n)],
                           random.Random(1))
        layout = task_layout(sdef)
        slots = {(p.kind, p.deploy_id, p.task_idx): Slot(p.vgroup_id, p.scan_plan_idx, p.top) for p in plan.tasks()}
        assert slots == layout and len(plan.tasks()) == len(layout) == expected_counts(sdef).total


# ----- hole 7: heartbeats checked against the sender --------------------------------------------------------------
async def test_heartbeat_without_a_live_session_is_refused(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        await create_streams(store, nodes, 2)
        ghost = await RealNode.start(kv)
        await ghost.session.close()  # its session is gone, the node keeps heartbeating
        never = StreamNodeState(max(n.node_id for n in nodes) + 1000)  # an id no session ever had
        mgr = await manager(store, kv, clock)
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        for impostor in (ghost.state, never):
            impostor.snode_id = nodes[0].state.snode_id  # claims a real snode and every vgroup
            impostor.vgroups = {1, 2, 3}
            for _ in range(3):
                reply = await deliver(mgr, impostor.build_heartbeat())
                assert reply.status.error_code == common_pb2.NOT_FOUND, reply
                assert "no live stream node session" in reply.status.reason
                assert not (reply.deploys or reply.starts or reply.runner_updates or reply.undeploys)
        assert mgr.rejected_heartbeats == 6
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 2, "logged once per node, not once per heartbeat"
        assert mgr.snodes == {} and mgr.vgroups == {}, "a refused heartbeat claims nothing"
        await run_until(mgr, nodes, clock, lambda: running(mgr))
        legit = {n.node_id for n in nodes}
        assert {node for _, node in tasks_of(mgr).values()} <= legit


async def test_snode_claim_must_match_the_snode_record(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    async with real_nodes(kv, [([1, 2], True), ([3], False), ([], False)]) as nodes:
        owner, thief = nodes[0], nodes[2]
        await create_streams(store, nodes, 2)
        thief.state.snode_id = owner.state.snode_id  # a live node claims another node's snode
        mgr = await manager(store, kv, clock)
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        for _ in range(3):
            reply = await thief.beat(mgr, clock)
            assert reply.status.error_code == common_pb2.SUCCESS  # the node itself is live: heard, claim ignored
            assert not reply.deploys, "snode tasks handed to a node that does not own the snode"
        assert owner.state.snode_id not in mgr.snodes
        await run_until(mgr, nodes, clock, lambda: running(mgr))
        assert not thief.state.tasks
        assert mgr.snodes[owner.state.snode_id].node_id == owner.node_id
        assert mgr.rejected_claims >= 3
        claims = [r for r in caplog.records if f"claims snode {owner.state.snode_id}" in r.getMessage()]
        assert len(claims) == 1


async def test_two_claimants_of_a_vgroup_do_not_make_readers_flap(
    store: StreamStore, kv: MetaKV, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    layout = [([], True), ([1, 2, 3], False), ([], False), ([], False)]
    async with running_streams(store, kv, clock, 2, layout) as (nodes, _, mgr):
        holder, rival, third = nodes[1], nodes[2], nodes[3]
        on_3 = {k: node for k, (task, node) in tasks_of(mgr).items() if task.vgroup_id == 3}
        assert on_3 and set(on_3.values()) == {holder.node_id}
        before = holder.held()
        caplog.set_level(logging.WARNING, MANAGER_LOG)
        rival.state.lead_vgroup(3)  # both claim vgroup 3 now
        for _ in range(10):
            await round_(mgr, [rival, holder, *nodes], clock)
        assert holder.held() == before and not rival.state.tasks, "the readers moved between the claimants"
        assert {k: node for k, (task, node) in tasks_of(mgr).items() if task.vgroup_id == 3} == on_3
        assert mgr.vgroups[3].node_id == holder.node_id and running(mgr)
        assert len([r for r in caplog.records if "claims vgroup 3" in r.getMessage()]) == 1
        # The holder lets go: the rival takes the vgroup, its readers move once (SID + 1).
        holder.state.drop_vgroup(3)
        await run_until(mgr, nodes, clock, lambda: running(mgr) and not any(
            k[1] in {t for _, t in on_3} for k in holder.state.tasks), what="readers moved to the rival")
        moved = {k: t for k, t in tasks_of(mgr).items() if k in on_3}
        assert {node for _, node in moved.values()} == {rival.node_id}
        assert {task.sid for task, _ in moved.values()} == {2}
        # A third claimant waits while the rival holds it, and takes over once the rival's session goes.
        third.state.lead_vgroup(3)
        for _ in range(5):
            await round_(mgr, nodes, clock)
        assert mgr.vgroups[3].node_id == rival.node_id
        await rival.session.close()
        await feed_sessions(mgr, kv)
        mgr.node_lost(rival.node_id)
        alive = [n for n in nodes if n is not rival]
        await run_until(mgr, alive, clock, lambda: mgr.vgroups[3].node_id == third.node_id and running(mgr))
        assert {node for k, (_, node) in tasks_of(mgr).items() if k in on_3} == {third.node_id}


async def test_watch_adopts_under_the_session_verified_node_id(store: StreamStore, kv: MetaKV) -> None:
    """A node whose reports name another node (a bug, or a lie): the new leader adopts the tasks where they run.

    Before the fix WATCH trusted the report's node id: the tasks were adopted on the other node, then found
    "stale" on their real node, undeployed and redeployed."""
    clock = Clock()
    async with running_streams(store, kv, clock, 3) as (nodes, _, old):
        deployed = tasks_of(old)
        held = {n.node_id: n.held() for n in nodes}
        liar, other = nodes
        mgr = await manager(store, kv, clock, revision=200)
        assert mgr.state is ManagerState.WATCH

        def forge(req: sp.HeartbeatRequest) -> None:
            for rep in req.tasks:
                rep.node_id = other.node_id

        await liar.beat(mgr, clock, edit=forge)
        await other.beat(mgr, clock)
        assert mgr.state is ManagerState.NORMAL and mgr.adopted == 3
        assert tasks_of(mgr) == deployed
        for _ in range(10):
            await liar.beat(mgr, clock, edit=forge)
            await other.beat(mgr, clock)
            mgr.tick()
            clock.advance(0.1)
        assert {n.node_id: n.held() for n in nodes} == held and mgr.redeploys == 0 and running(mgr)


async def test_forged_heartbeat_over_grpc_is_refused_while_real_nodes_run(
    etcd: EtcdCluster, kv: MetaKV, root_path: str
) -> None:
    """The whole path: a coordinator (feeding the manager from its session watch) and in-process stream nodes."""
    async with coordinator(etcd, root_path) as proc, stub_for(proc.address) as stub:
        await wait_leader(proc)
        nodes = [StreamNode(kv, coordinators=[proc.address], vgroups=[v], discover_snode=True, heartbeat_ms=50,
                            groups=2, init_delay_s=0.05, ttl=10) for v in (1, 2)]
        try:
            for node in nodes:
                await node.start()
                created = await stub.CreateSnode(sp.CreateSnodeRequest(node_id=node.node_id))
                assert created.status.error_code == common_pb2.SUCCESS, created
            snode = created.snode
            forged = sp.HeartbeatRequest(node_id=nodes[-1].node_id + 1000, snode_id=snode.id, vgroup_ids=[1, 2],
                                         num_stream_groups=1)

            async def create() -> tuple[bool, Any]:
                resp = await stub.CreateStream(create_req("s1", source_vgroup_ids=[1, 2], num_calc_scan_plans=1))
                return resp.status.error_code == common_pb2.SUCCESS, resp.status

            await wait_for(create, "a live snode", timeout=20)
            reply = await stub.StreamHeartbeat(forged)  # right after the create: its deploys are pending
            assert reply.status.error_code == common_pb2.NOT_FOUND, reply
            assert not reply.deploys

            async def runs() -> tuple[bool, Any]:
                show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
                info = show.streams[0]
                ok = info.state == sp.STREAM_RUNNING and all(t.status == RUNNING for t in info.tasks)
                return ok, summary_of(show)

            await wait_for(runs, "the stream RUNNING on the real nodes", timeout=30)
            show = await stub.ShowStreams(sp.ShowStreamsRequest(with_tasks=True))
            assert {t.task.node_id for t in show.streams[0].tasks} == {n.node_id for n in nodes}
            lead = proc.coord.leadership
            assert lead is not None and lead.streams is not None and lead.streams.rejected_heartbeats >= 1
        finally:
            for node in nodes:
                await node.stop()
            await asyncio.sleep(0)


def summary_of(show: sp.ShowStreamsResponse) -> list[tuple[str, str]]:
    return [(s.stream.name, sp.StreamState.Name(s.state)) for s in show.streams]


# ----- hole 12: adoption restores every field ---------------------------------------------------------------------
async def adopt_after_leader_change(
    store: StreamStore, kv: MetaKV, clock: Clock, nodes: list[RealNode],
    edit: Callable[[sp.HeartbeatRequest], None] | None = None,
) -> tuple[StreamManager, dict[tuple[int, int], tuple[Any, int]]]:
    """Streams deployed by one leader, then adopted by the next; returns the new manager and the deployed tasks."""
    old = await manager(store, kv, clock)
    await run_until(old, nodes, clock, lambda: running(old))
    deployed = tasks_of(old)
    mgr = await manager(store, kv, clock, revision=200)
    for _ in range(max(n.state.groups for n in nodes)):  # WATCH ends once every node reported every group
        for n in nodes:
            await n.beat(mgr, clock, edit=edit)
    assert mgr.state is ManagerState.NORMAL
    return mgr, deployed


def assert_same_tasks(mgr: StreamManager, deployed: dict[tuple[int, int], tuple[Any, int]],
                      nodes: list[RealNode]) -> None:
    adopted = tasks_of(mgr)
    assert adopted.keys() == deployed.keys()
    for key, (task, node) in deployed.items():
        assert adopted[key] == (task, node), f"task {key}: adopted {adopted[key]}, deployed {(task, node)}"
        # And what the node holds: every TaskId field of the deploy message.
        info = node_by_id(nodes, node).state.tasks[key].info
        assert task.to_proto(key[0], node) == info


async def test_adoption_restores_every_field_of_every_task(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with real_nodes(kv, [([1, 2], True), ([3, 4], True)], groups=2) as nodes:
        snodes = [n.state.snode_id for n in nodes]
        await create_streams(store, nodes, 3, source_vgroup_ids=[1, 2, 3, 4], num_calc_scan_plans=3,
                             num_calc_subplans=3)
        await store.create_stream(create_req("by-table", trigger_vgroup_id=3), snodes)
        await store.create_stream(create_req("no-calc", num_calc_scan_plans=0, num_calc_subplans=0), snodes)
        mgr, deployed = await adopt_after_leader_change(store, kv, clock, nodes)
        assert mgr.adopted == 5
        assert {task.scan_plan_idx for task, _ in deployed.values()} == {0, 1, 2}
        assert_same_tasks(mgr, deployed, nodes)
        assert mgr.redeploys == 0


async def test_reports_without_identity_fields_are_restored_from_the_definition(
    store: StreamStore, kv: MetaKV
) -> None:
    """An older node reports no scan plan and no top flag: the leader recomputes them from the persisted stream."""
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        await create_streams(store, nodes, 2)

        def older_node(req: sp.HeartbeatRequest) -> None:
            for rep in req.tasks:
                rep.ClearField("scan_plan_idx")
                rep.ClearField("top")

        mgr, deployed = await adopt_after_leader_change(store, kv, clock, nodes, edit=older_node)
        assert_same_tasks(mgr, deployed, nodes)


@pytest.mark.parametrize("misfit", ["vgroup", "scan_plan"])
async def test_report_that_does_not_fit_the_definition_is_not_adopted(
    store: StreamStore, kv: MetaKV, misfit: str
) -> None:
    """A calc reader reported on another vgroup, or with another scan plan, than its slot in the persisted
    definition is not the task that was planned: its stream is stopped and redeployed instead of adopted."""
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        sdefs = await create_streams(store, nodes, 2)
        bad = sdefs[0].id

        def wrong(req: sp.HeartbeatRequest) -> None:
            for rep in req.tasks:
                if rep.stream_id == bad and rep.kind == sp.CALC_READER and rep.task_idx == 0:
                    if misfit == "vgroup":
                        rep.vgroup_id = 3  # slot 0 reads vgroup 1
                    else:
                        rep.scan_plan_idx = 1  # slot 0 is scan plan 0

        mgr, _ = await adopt_after_leader_change(store, kv, clock, nodes, edit=wrong)
        assert mgr.adopted == 1 and mgr.streams[bad].error_stopped  # stopped, then redeployed afresh
        await run_until(mgr, nodes, clock, lambda: running(mgr))


async def test_reader_redeployed_after_adoption_keeps_its_scan_plan(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        await create_streams(store, nodes, 1)
        mgr, deployed = await adopt_after_leader_change(store, kv, clock, nodes)
        (key, (task, node_id)) = next((k, v) for k, v in sorted(deployed.items())
                                      if v[0].kind == sp.CALC_READER and v[0].scan_plan_idx == 2)
        node = node_by_id(nodes, node_id)
        node.state.fail_task(key[1], "scan failed")
        await run_until(mgr, nodes, clock, lambda: running(mgr) and node.state.tasks[key].info.sid == task.sid + 1,
                        what="the failed reader redeployed")
        info = node.state.tasks[key].info
        assert (info.scan_plan_idx, info.vgroup_id, info.task_idx) == (2, task.vgroup_id, task.task_idx)
        assert mgr.streams[key[0]].tasks[key[1]].task.scan_plan_idx == 2
