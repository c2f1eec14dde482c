"""The coordinator process: the composition root and the leadership life cycle.

Every coordinator registers a session and campaigns. The winner builds, on
its fenced view of the KV, everything a leader needs (query meta, nodes,
task store, scheduler) and reloads it from etcd; when it loses the session
or a fenced write is refused, it drops all of it without writing and
campaigns again with a new session. Standbys keep serving reads from etcd.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from loguru import logger

from meta.client import EtcdClient, connect
from meta.election import Election, current_leader, election_prefix, observe_leader, publish_leader_record
from meta.errors import MetaError, MetaNoSpace
from meta.fence import Fence
from meta.idalloc import IdAllocator
from meta.kv import MetaKV
from meta.loops import keep_running
from meta.session import Session, session_key
from meta.session_guard import GuardLimits, SessionGuard
from proto import data_pb2, querynode_pb2
from querycoord.catalog.broker import Broker, GrpcBroker, LocalBroker
from querycoord.catalog.store import CatalogStore
from querycoord.catalog.targets import CatalogTargets
from querycoord.checkers import Checker
from querycoord.checkers.activation import CheckerSwitches
from querycoord.checkers.left import LeftNodes
from querycoord.cluster.incarnations import Incarnations
from querycoord.cluster.lifecycle import NodeLifecycles
from querycoord.cluster.nodes import Node, NodeManager
from querycoord.common import metrics
from querycoord.common.etcd_space import SpaceMonitor
from querycoord.common.protocol import (
    QUERYCOORD_ELECTION,
    QUERYCOORD_ROLE,
    QUERYNODE_ROLE,
    STREAMNODE_ROLE,
    leader_is_at,
)
from querycoord.leader.balance import auto_balance_loop
from querycoord.leader.settle import ProgressAfterMoves
from querycoord.leader.view import Leadership
from querycoord.leader.watchers import (
    forget_node,
    forget_restarted,
    kick_on_node_changes,
    prune_incarnations,
    queue_lost_repair,
    record_joined,
    run_handoff,
)
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.mirror import MetaMirror
from querycoord.served.persist import persist_lowered
from querycoord.served.snapshot import ServedSnapshot
from querycoord.served.state import ServedView
from querycoord.served.warm import keep_counts_warm
from querycoord.settings.config import CoordConfig
from querycoord.stream.loops import follow_stream_nodes, tick_streams
from querycoord.stream.manager import StreamManager
from querycoord.stream.store import StreamStore
from querycoord.task.model import TaskEnv
from querycoord.task.scheduler import Scheduler
from querycoord.task.store import TaskStore

# How long a standby waits for etcd to name the leader before telling a caller it cannot reach etcd.
LEADER_LOOKUP_TIMEOUT = 1.0
# A campaign still waiting after this long stands by (one that wins at once never says so).
STANDBY_LINE_DELAY = 0.5
# How long a new leader waits for the nodes it finds online to say they run, before it serves (a dead node refuses
# the connection at once; a hung one costs the takeover this much, and counts once it answers the checker).
TAKEOVER_PROBE_S = 1.0
# How long a new leader's triggers wait for its first checker pass before they dispatch: the pass decides from the
# takeover's state and is not slowed by their planning (a repair of a quarter of a million copies plans for
# seconds of CPU on the same event loop); a pass that takes longer (a million segments compared) lets them start.
FIRST_PASS_BEFORE_DISPATCH_S = 2.0


class Coordinator:
    """One coordinator: its session, campaign and leadership (see module docstring). The surfaces reach it through
    the narrow views of ``querycoord.leader.view``, which it satisfies."""

    def __init__(self, config: CoordConfig, address: str):
        self.config = config
        self.address = address
        self.client: EtcdClient | None = None
        self.kv: MetaKV | None = None
        self.catalog: CatalogStore | None = None
        self.broker: Broker | None = None
        self.session: Session | None = None
        self.election: Election | None = None  # the election of the current session (set with each campaign)
        self.leadership: Leadership | None = None
        self.space: SpaceMonitor | None = None  # etcd's NOSPACE alarm and db size (health, status, metrics)
        self.became_leader = asyncio.Event()
        self._main: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._term = 0  # leaderships taken by this process; loss callbacks carry theirs
        self._stopping = False
        # What etcd accepted through the last fence held (reported when leadership is lost).
        self.last_leadership: dict[str, object] = {}
        self.role_since = time.time()  # when it took its current role, leader or standby (``querycoord status``)
        self._step_back = asyncio.Event()  # a switchover asks this standby to queue again (``request_step_back``)
        self.targets: CatalogTargets | None = None  # the local catalog's segments and channels, followed
        self.mirror: MetaMirror | None = None  # the warm standby's copy of the query meta, while campaigning
        self.last_takeover: dict[str, object] = {}  # how the last takeover got its query meta (status, tests)

    @property
    def is_leader(self) -> bool:
        return self.leadership is not None and not self.leadership.scheduler.stopped

    @property
    def loop_ended(self) -> bool:
        """The campaign-and-lead loop has ended before ``stop`` (it never should: liveness fails then)."""
        return self._main is not None and self._main.done() and not self._stopping

    @property
    def server_id(self) -> int:
        return self.session.server_id if self.session and self.session.info else 0

    async def leader_address(self) -> str | None:
        assert self.kv is not None
        leader = await current_leader(self.kv, election_prefix(QUERYCOORD_ELECTION))
        return leader.value.decode() if leader else None

    async def not_leader_message(self) -> str:
        """What a standby tells callers: who leads now (clients follow it: ``protocol.parse_leader``)."""
        leader = None
        unreachable = self.client is not None and self.client.unreachable_since is not None
        if not unreachable:
            try:
                leader = await asyncio.wait_for(self.leader_address(), LEADER_LOOKUP_TIMEOUT)
            except (MetaError, TimeoutError):
                unreachable = True
        if unreachable:
            return f"this coordinator ({self.address}) is not the leader and cannot reach etcd to learn who is"
        if leader == self.address:
            return f"this coordinator ({self.address}) is taking over leadership; retry shortly"
        return f"this coordinator ({self.address}) is not the leader; " + (
            leader_is_at(leader) if leader else "no leader is elected yet")

    async def start(self) -> None:
        self.client = await connect(self.config.etcd, wait=True)  # the client logs at once that etcd is unreachable
        self.kv = MetaKV(self.client, self.config.root)
        self.space = SpaceMonitor(self.client)
        self.space.start()
        self.catalog = CatalogStore(self.kv, limits=self.config.limits)
        self.broker = GrpcBroker(self.config.catalog_address) if self.config.catalog_address else LocalBroker(
            self.catalog)
        if not self.config.catalog_address:
            # Followed for the process's life, standing by included: the first check after a takeover reads
            # its targets from memory (querycoord/catalog/targets.py).
            self.targets = CatalogTargets(self.kv)
            self.targets.start()
        self._main = asyncio.create_task(self._lead_forever(), name="leadership")

    async def stop(self) -> None:
        """Resign (so a standby takes over at once), stop leading, close the session."""
        self._stopping = True
        if self._main:
            self._main.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._main
        await self._drop_leadership()
        await self._stop_mirror()
        if self.targets is not None:
            await self.targets.stop()
        if self.session:
            await self.session.close()
        if self.broker:
            await self.broker.close()
        if self.space:
            await self.space.stop()
        if self.client:
            await self.client.close()

    # ----- test seam: a crash -----------------------------------------------------------------------------------
    async def halt_as_crashed(self) -> None:
        """Test seam (with ``close_as_crashed``): stop as a killed process would, for tests and drills that need a
        coordinator to die inside their own event loop. The campaign-and-lead loop ends without resigning, the
        leadership is dropped in memory (its scheduler stops without another write); the session and election key
        stay in etcd until their lease lapses after the TTL. ``CoordinatorProcess.crash`` is the whole crash."""
        self._stopping = True
        election = getattr(self, "election", None)
        if election is not None:
            election.abandon()
        main = self._main
        if main is not None:
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await main

    async def close_as_crashed(self) -> None:
        """Test seam, after ``halt_as_crashed``: the connections go as a dead process's do. The session's
        keep-alive stops without a revoke (its lease lapses after the TTL); the broker and the etcd client close."""
        if self.session is not None:
            await self.session.close(revoke=False)
        with contextlib.suppress(Exception):
            if self.broker is not None:
                await self.broker.close()
        with contextlib.suppress(Exception):
            if self.client is not None:
                await self.client.close()

    async def _lead_forever(self) -> None:
        assert self.kv is not None
        while not self._stopping:
            try:
                self.session = Session(self.kv, QUERYCOORD_ROLE, self.address, ttl=self.config.session_ttl,
                                       private_lease=True)
                await self.session.start()
                election = Election(self.kv, self.session, QUERYCOORD_ELECTION)
                self.election = election
                if self.config.warm_standby:
                    self.mirror = MetaMirror(self.kv)
                    self.mirror.start()
                standby = asyncio.create_task(self._say_standby(), name="standby-line")
                # The copies of each partition counted by place while waiting, for the takeover's first counts.
                warm = asyncio.create_task(keep_counts_warm(self.kv, self.mirror, self.targets),
                                           name="warm-counts") if self.mirror and self.targets else None
                try:
                    fence = await self._campaign(election)
                finally:
                    standby.cancel()
                    if warm is not None:
                        warm.cancel()
                await self._become_leader(fence)
                lost = asyncio.create_task(self.session.lost.wait())
                deposed = asyncio.create_task(self._lost.wait())
                await asyncio.wait({lost, deposed}, return_when=asyncio.FIRST_COMPLETED)
                for t in (lost, deposed):
                    t.cancel()
                # A session closed by this process: a switchover handed the leadership over (``hand_over``).
                logger.bind(fence_revision=fence.revision).log(
                    "INFO" if self.session.lost_reason == "closed" else "WARNING",
                    "coordinator {}: leadership lost ({})", self.server_id,
                    self.session.lost_reason or "a fenced write was refused")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not self._stopping and task is not None and not task.cancelling():
                    # A CancelledError nobody asked for (a library cancelling its own call): an unexpected
                    # error like any other. Ending here would keep the session and election key alive
                    # while this coordinator neither leads nor campaigns.
                    logger.error("coordinator: an internal cancellation while campaigning or leading; starting over")
                    await self._restart_after_error()
                    continue
                with contextlib.suppress(Exception):
                    if self.leadership is not None and self.election is not None:
                        await asyncio.wait_for(self.election.resign(), 2)
                raise
            except MetaNoSpace as exc:
                # A session and a campaign need writes: wait for space once, rather than fail every second.
                logger.error("coordinator: cannot register or campaign: {}; waiting for etcd to have space again", exc)
                if self.space is not None:
                    self.space.noted(exc)
                    await self.space.wait_writable()
                await asyncio.sleep(1)
            except MetaError as exc:
                # An unreachable etcd was logged once by the etcd client (and will be once it is back).
                unreachable = self.client is not None and self.client.unreachable_since is not None
                logger.log("DEBUG" if unreachable else "ERROR", "coordinator: etcd trouble while campaigning or "
                           "leading: {}", exc)
                await asyncio.sleep(1)
            except Exception:
                # Never let this loop die: a coordinator whose session lives on while it
                # neither leads nor campaigns would hold the election key forever.
                logger.exception("coordinator: unexpected error while campaigning or leading; starting over")
                await self._restart_after_error()
            finally:
                await self._drop_leadership()
                await self._stop_mirror()
            if self.session is not None:
                await self.session.close(revoke=False)

    async def _stop_mirror(self) -> None:
        mirror, self.mirror = self.mirror, None
        if mirror is not None:
            await mirror.stop()

    async def _load_meta(self, meta: QueryMeta) -> None:
        """The query meta a new leader starts from: the warm standby's copy when it is usable, else a reload."""
        began = time.monotonic()
        mirror, self.mirror = self.mirror, None
        taken = await mirror.take() if mirror is not None else None
        if taken is not None:
            index, corrupt, revision = taken
            meta.adopt(index, corrupt)
            source, at = "warm standby copy", f" at revision {revision}"
        else:
            await meta.reload()
            source, at = "reload", ""
        took = time.monotonic() - began
        self.last_takeover = {"meta_source": source, "meta_s": round(took, 4), "steps": {}}
        logger.info("coordinator {}: query meta from the {}{} in {:.3f}s", self.server_id, source, at, took)

    async def _say_standby(self) -> None:
        """While the campaign waits: one line saying this coordinator stands by and who leads (again only when
        another coordinator takes over)."""
        assert self.kv is not None
        await asyncio.sleep(STANDBY_LINE_DELAY)
        said: str | None = None
        with contextlib.suppress(MetaError):
            async for leader in observe_leader(self.kv, election_prefix(QUERYCOORD_ELECTION)):
                address = leader.value.decode() if leader is not None else ""
                if address == self.address or address == said:
                    continue
                said = address
                logger.info("coordinator {} ({}) stands by; {}", self.server_id, self.address,
                            leader_is_at(address) if address else "no leader is elected yet")

    async def _campaign(self, election: Election) -> Fence:
        """``election.campaign``, withdrawn and started again (from the back of the queue) whenever a switchover
        asks this standby to step back (``request_step_back``)."""
        while True:
            self._step_back.clear()
            campaign = asyncio.create_task(election.campaign(self.address), name="campaign")
            back = asyncio.create_task(self._step_back.wait(), name="step-back")
            try:
                await asyncio.wait({campaign, back}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                back.cancel()
                if not campaign.done():
                    campaign.cancel()  # a cancelled campaign removes its key
                    await asyncio.wait({campaign})
            if not campaign.cancelled():
                return campaign.result()
            logger.info("coordinator {}: stepped back to the end of the election queue for a switchover",
                        self.server_id)

    def request_step_back(self) -> None:
        """Withdraw from the election and campaign again, behind every candidate queued now (a switchover to a
        standby queued behind this one); a leader ignores it."""
        self._step_back.set()

    async def hand_over(self) -> None:
        """Stop leading, for a switchover whose target is next in line: first the leader's work (the scheduler
        stops without another write; the persisted trees stay for the next leader, as on failover), then the
        election key and the session at once, so the next in line leads now rather than after a TTL. The loop
        then campaigns again with a new session, from the back of the queue."""
        session, election = self.session, self.election
        await self._drop_leadership()
        if election is not None:
            with contextlib.suppress(MetaError):
                await election.resign()
        if session is not None:
            await session.close(revoke=True)

    async def _restart_after_error(self) -> None:
        await self._drop_leadership()
        if self.session is not None:
            await self.session.close(revoke=True)  # hand the election to a standby now
        await asyncio.sleep(1)

    def _loss_callback(self, term: int) -> Callable[[BaseException], None]:
        """A leadership-loss callback bound to ``term``: a component left over from an earlier or failed
        takeover can never depose a later, valid term."""

        def lost(exc: BaseException) -> None:
            if term == self._term:
                self._lost.set()
            else:
                logger.info("coordinator: ignoring a leadership loss from term {} (current term {}): {}", term,
                            self._term, exc)

        return lost

    async def _become_leader(self, fence: Fence) -> None:
        """Build and start everything a leader runs; if any step fails, stop what was started."""
        self._term += 1
        self._lost.clear()
        started: list[Callable[[], Awaitable[None]]] = []
        began = time.monotonic()
        try:
            # Every line the leader's loops log (scheduler, checker, streams: their tasks start in here and
            # inherit the context) carries the fence it writes with.
            with logger.contextualize(fence_revision=fence.revision):
                await self._take_over(fence, self._term, started)
        except BaseException:
            for stop in reversed(started):
                with contextlib.suppress(Exception):
                    await stop()
            raise
        metrics.leader_acquired(time.monotonic() - began)

    def _step_done(self, name: str, since: float) -> float:
        """Note how long the takeover's step ``name`` took (``last_takeover["steps"]``, seconds); returns now."""
        now = time.monotonic()
        steps = self.last_takeover.setdefault("steps", {})
        assert isinstance(steps, dict)
        steps[name] = round(now - since, 4)
        return now

    async def _take_over(self, fence: Fence, term: int, started: list[Callable[[], Awaitable[None]]]) -> None:
        assert self.kv is not None and self.broker is not None
        fenced = self.kv.fenced(fence)
        self.last_takeover = {}
        # Before any node hears this fence: nodes adopt it only once the record shows it (they may not read
        # the election, whose keys name the leases).
        await publish_leader_record(fenced, QUERYCOORD_ELECTION, self.address)
        meta = QueryMeta(fenced)
        await self._load_meta(meta)
        coord_fence = querynode_pb2.CoordFence(leader_revision=fence.revision, coordinator_id=self.server_id)
        incarnations = Incarnations(fenced)

        # Nodes whose re-replication waits (``checkers.left``), with when each left as earlier leaders recorded it.
        left = LeftNodes(fenced, self.config.node_left_delay, on_due=lambda: checker.kick())
        step = time.monotonic()
        await left.load()

        # One forget at a time: a checker pass forgetting a node the session watch is forgetting waits until that
        # forget queued the node's repair, and then leaves the collection to it instead of comparing it first.
        forgetting = asyncio.Lock()

        async def on_node_down(node_id: int) -> None:
            async with forgetting:
                await forget_node(env, node_id, incarnations=incarnations, served=served, left=left,
                                  checker=checker)

        async def forget_gone(node_id: int, served_once: ServedView) -> list[data_pb2.DmChannelWatchInfo] | None:
            """A node gone while no leader watched: forgotten without its repair (queued for all of them at once)
            and without lowering the percentages again (lowered once for all of them); whether its
            re-replication may wait is judged on ``served_once`` (the figures with every gone node offline)."""
            async with forgetting:
                return await forget_node(env, node_id, incarnations=incarnations, served=served_once, left=left,
                                         lowered=True)

        async def on_node_up(node: Node) -> None:
            await record_joined(node, env=env, incarnations=incarnations, checker=checker, served=served, left=left)

        guard = SessionGuard(fenced, (QUERYNODE_ROLE, STREAMNODE_ROLE), GuardLimits(
            max_value_bytes=self.config.node_session_max_bytes, max_writes=self.config.node_session_max_writes),
            on_fence=lambda _key, reason: metrics.node_fenced(reason))
        nodes = NodeManager(self.kv, fence=coord_fence, rpc_timeout=self.config.rpc_timeout,
                            on_node_down=on_node_down, on_node_up=on_node_up,
                            refuse=lambda node_id: guard.refused(session_key(QUERYNODE_ROLE, node_id)))
        # Before the nodes are taken in and before any placement: cordoned nodes are given nothing new.
        lifecycles = NodeLifecycles(fenced, nodes)
        await lifecycles.load()
        step = self._step_done("records", step)
        store = TaskStore(fenced)
        ids = IdAllocator(fenced, "idalloc/task")
        env = TaskEnv(meta=meta, nodes=nodes, broker=self.broker, store=store, ids=ids,
                      config=self.config.scheduler, targets=self.targets)
        served = ServedView(meta, nodes, self.targets)
        scheduler = Scheduler(env, on_leadership_lost=self._loss_callback(term), space=self.space)
        # Where meta and the nodes disagree (a leader that died half-way), the checker's first run, kicked
        # below, queues the repairs; collections with resumed triggers are left to those triggers.
        # Which check kinds run (balance paused or not), as the last leader was told: before the first pass.
        switches = await CheckerSwitches.load(fenced)
        checker = Checker(scheduler, interval=self.config.checker_interval, targets=self.targets,
                          forget=on_node_down, left=left, switches=switches)
        checker.lifecycles = lifecycles
        scheduler.finish_hooks.append(checker.after_trigger)
        after_moves = ProgressAfterMoves(scheduler, served, self.targets, busy=checker.busy_collections)
        scheduler.finish_hooks.append(after_moves.after_trigger)
        scheduler.finish_hooks.append(prune_incarnations(env, incarnations, left))
        started.append(after_moves.stop)
        started.append(env.prefetch.close)
        started.append(nodes.stop)
        await nodes.start()
        step = self._step_done("nodes", step)
        # Before anything counts a copy: nodes restarted while no leader watched, and nodes gone for good.
        await forget_restarted(env, incarnations=incarnations, targets=self.targets, left=left)
        # And nodes whose session outlived them (etcd restarted and renewed it): they count once they answer.
        step = self._step_done("restarted", step)
        silent = await nodes.hear_inherited(min(TAKEOVER_PROBE_S, self.config.rpc_timeout))
        step = self._step_done("probe", step)
        if silent:
            logger.warning("query nodes {} did not answer at takeover: what they hold counts once they answer",
                           sorted(silent))
        started.append(scheduler.stop)
        queued = await scheduler.reload()
        step = self._step_done("triggers", step)
        # Nodes gone for good: after the others answered, since whether a gone node's re-replication may wait
        # (``checkers.left``) depends on what the nodes that answered serve; and after the persisted triggers are
        # in, so that each forget queues its node's repair from the records still naming it (``Checker.repair_lost``)
        # and leaves a collection a resumed trigger owns to it. The first pass then finds those collections owned by
        # the repairs: no comparison of every segment to find what the gone nodes held. Before dispatching starts:
        # nothing runs while a gone node is still a member of its replicas.
        # Streams: only definitions are persisted; the manager rebuilds its task maps (WATCH when streams exist).
        # Its reads go while the gone nodes are forgotten (nothing shared with them): not one after the other.
        stream_store = StreamStore(fenced)
        streams = StreamManager(stream_store, leader_revision=fence.revision, config=self.config.stream)
        streams_read = asyncio.create_task(streams.start(), name="streams-start")
        try:
            checker.repair_at_forget = True
            await self._forget_gone(meta, nodes, served, forget_gone, checker)
        except BaseException:
            streams_read.cancel()
            await asyncio.wait({streams_read})
            if not streams_read.cancelled():
                streams_read.exception()  # retrieved: the forget's error is the one raised
            raise
        step = self._step_done("gone", step)
        await streams_read
        self._step_done("streams", step)
        tasks: list[asyncio.Task[None]] = []

        async def cancel_tasks() -> None:
            for t in tasks:
                t.cancel()

        started.append(cancel_tasks)
        broker, kv, client, cfg = self.broker, self.kv, self.client, self.config

        def loop(name: str, body: Callable[[], Awaitable[None]]) -> None:
            """One of the leader's loops, for the leadership's life: each guards its rounds itself, and
            ``keep_running`` runs it again whatever escapes (``meta.loops``)."""
            tasks.append(asyncio.create_task(keep_running(name, body, client=client), name=name))

        loop("session-guard", guard.run)
        loop("handoff", lambda: run_handoff(broker, kv, scheduler, meta, checker))
        loop("checker", checker.run_forever)
        checker.kick()  # the first check right after takeover
        loop("dispatch", lambda: self._dispatch_after_first_pass(scheduler, checker))
        loop("checker kicks", lambda: kick_on_node_changes(nodes, checker))
        if cfg.auto_balance_interval > 0:
            loop("auto balance", lambda: auto_balance_loop(scheduler, cfg.auto_balance_interval, cfg.balance_spread,
                                                           switches))
        loop("stream node sessions", lambda: follow_stream_nodes(kv, streams))
        loop("stream tick", lambda: tick_streams(streams, cfg.stream_tick, cfg.stream_refresh))
        self.leadership = Leadership(fence=fence, kv=fenced, meta=meta, nodes=nodes, scheduler=scheduler, env=env,
                                     tasks=tasks, stream_store=stream_store, streams=streams, checker=checker,
                                     served=served, left=left,
                                     lifecycles=lifecycles)
        logger.info("coordinator {} leads with fence {} ({} persisted triggers resumed)", self.server_id, fence,
                    queued)
        self.role_since = time.time()
        self.became_leader.set()

    @staticmethod
    async def _dispatch_after_first_pass(scheduler: Scheduler, checker: Checker) -> None:
        """Start the scheduler's dispatching once the checker's first pass ended, or after
        ``FIRST_PASS_BEFORE_DISPATCH_S`` (see there); once only."""
        if scheduler.dispatching:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(checker.passed.wait(), FIRST_PASS_BEFORE_DISPATCH_S)
        if not scheduler.stopped:
            await scheduler.start(reload=False)

    @staticmethod
    async def _forget_gone(meta: QueryMeta, nodes: NodeManager, served: ServedView,
                           forget: Callable[[int, ServedView], Awaitable[list[data_pb2.DmChannelWatchInfo] | None]],
                           checker: Checker) -> None:
        """Forget the nodes query meta binds that have no session (gone while no leader watched), then queue one
        repair per collection of what they held (``Checker.repair_lost_nodes``). What online nodes serve is the
        same before each forget (the gone nodes are offline throughout), so it is counted once for all of them
        (``ServedSnapshot``), not once per node: the persisted percentages are lowered from it, and each forget's
        question whether its node's re-replication may wait reads it. The pass over every segment that count
        starts from was made by this coordinator while it stood by (``served.warm``), unless the segment records
        or the target changed since: what is left is a pass over the places."""
        gone = sorted(meta.bound_node_ids() - nodes.online_ids())
        if not gone:
            return
        once = ServedSnapshot(served)
        await persist_lowered(meta, meta.collection_ids(), once.collection)
        lost: dict[int, list[data_pb2.DmChannelWatchInfo]] = {}
        for node_id in gone:
            watches = await forget(node_id, once)
            if watches is not None:
                lost[node_id] = watches
        await queue_lost_repair(checker, lost)

    async def _drop_leadership(self) -> None:
        lead, self.leadership = self.leadership, None
        self.became_leader.clear()
        if lead is None:
            return
        metrics.leader_lost()
        self.role_since = time.time()
        fenced = lead.kv
        self.last_leadership = {
            "fence_key": lead.fence.leader_key, "fence_revision": lead.fence.revision,
            "writes": fenced.writes, "refused_writes": fenced.refused,
            "last_write_revision": fenced.last_write_revision,
        }
        for t in lead.tasks:
            t.cancel()
        await lead.scheduler.stop()
        await lead.nodes.stop()
