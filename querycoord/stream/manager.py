"""The stream manager: the leader's stream runtime behind one object (model: TDengine's ``mndStreamMgmt.c``).

A new ``StreamManager`` is built on every leadership from the persisted
definitions; nothing of a deposed leader's memory carries over. It has two
states:

* WATCH (after winning leadership, when streams exist): replies carry no
  actions and reported tasks are recorded, then adopted as they run or
  redeployed (``adoption``).
* NORMAL: heartbeats hand out pending deploys, undeploy stale instances,
  record statuses, start triggers and handle failures (``heartbeat``);
  ``tick()`` does the periodic part: the slotted health check and task
  silence (``liveness``), the stream checker (``checker``), error-stop
  retries (``deploy``).

The parts share one ``runtime.Runtime``; this facade builds them, wires them
together and keeps the public surface the service, the loops, the metrics and
the tests use. Every part of ``tick()`` runs on its own: an error is logged
and counted (``errors``) and the other parts still run.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable

from loguru import logger

from proto import stream_pb2
from querycoord.settings.config import StreamConfig
from querycoord.stream import guards
from querycoord.stream.adoption import Adoption
from querycoord.stream.checker import Checker
from querycoord.stream.checkpoint import Checkpoints
from querycoord.stream.claims import Claims
from querycoord.stream.definitions import Definitions
from querycoord.stream.deploy import Deploy
from querycoord.stream.heartbeat import Heartbeats
from querycoord.stream.liveness import Liveness
from querycoord.stream.recalc import Recalcs
from querycoord.stream.recalc_store import RecalcStore
from querycoord.stream.runtime import Heard, ManagerState, Runtime, StreamRuntime
from querycoord.stream.show import show_streams
from querycoord.stream.store import StreamStore

# A StopStream waits at most this long for its final checkpoint (clients' calls time out after 30 s by default).
STOP_CHECKPOINT_WAIT_MAX = 20.0


class StreamManager:
    """The leader's stream runtime: heartbeat handling, WATCH adoption, failure handling (module docstring).

    Not thread-safe; all calls come from the coordinator's event loop. The
    caller feeds ``set_live_nodes`` (from meta sessions), calls ``tick()``
    periodically, and notifies ``put_stream``/``remove_stream`` after each
    committed store txn.
    """

    def __init__(
        self,
        store: StreamStore,
        *,
        leader_revision: int,
        config: StreamConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ):
        self.shared = Runtime(
            store, leader_revision=leader_revision, config=config or StreamConfig(), clock=clock,
            rng=rng or random.Random(),
        )
        self.claims = Claims(self.shared)
        self.adoption = Adoption(self.shared, self.claims)
        self.definitions = Definitions(self.shared, self.adoption)
        self.checker = Checker(self.shared)
        self.liveness = Liveness(self.shared)
        self.deploy = Deploy(self.shared)
        self.checkpoints = Checkpoints(self.shared)
        self.heartbeats = Heartbeats(
            self.shared, claims=self.claims, adoption=self.adoption, checker=self.checker, liveness=self.liveness,
            deploy=self.deploy, checkpoints=self.checkpoints,
        )
        self.recalcs = Recalcs(self.shared, RecalcStore(store.kv))

    # ----- the caller's surface --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the persisted streams and snodes; WATCH when any stream exists (running tasks may be out there)."""
        await self.definitions.start()
        await self.recalcs.start()
        await self.checkpoints.load()

    def set_live_nodes(self, node_ids: Iterable[int]) -> None:
        """The nodes with a live meta session: only they are heard, and WATCH ends early once all of them
        reported every stream group."""
        live = self.shared.live_nodes = set(node_ids)
        self.checker.forget_dead_nodes(live)

    def put_stream(self, sdef: stream_pb2.StreamDef) -> None:
        """A committed create, stop or start (called after the store's txn, never before)."""
        self.definitions.put(sdef)

    def remove_stream(self, stream_id: int) -> None:
        """A committed drop: forget the stream; its tasks are undeployed with cleanup when they report."""
        self.definitions.remove(stream_id)

    async def refresh(self) -> None:
        """The stream loop and the checker's definition part: re-read the store and reconcile."""
        await self.definitions.refresh()

    async def handle_heartbeat(self, req: stream_pb2.HeartbeatRequest) -> stream_pb2.HeartbeatReply:
        """One node's heartbeat for one stream group: the reply carries this leader's revision and its actions.

        Refused (NOT_FOUND status, no action) unless the node has a live
        session; of an accepted one, only the verified snode and vgroup claims
        count (``claims``).
        """
        reply = await self.heartbeats.handle(req)
        if not reply.HasField("status") and not reply.watching:  # accepted, and acted on (not WATCH)
            await self.recalcs.on_heartbeat(req.node_id, req, reply, {u.stream_id for u in reply.undeploys})
        return reply

    async def recalculate(self, stream_id: int, from_ms: int, to_ms: int) -> stream_pb2.RecalcInfo:
        """Persist a recalculation of a stream's range; its runners get it with their heartbeats (``recalc``)."""
        return await self.recalcs.request(stream_id, from_ms, to_ms)

    async def drop_recalcs(self, stream_id: int) -> None:
        """A committed drop: the stream's recalculations go with it."""
        await self.recalcs.drop_stream(stream_id)

    def tick(self) -> None:
        """The periodic part: the WATCH timer, the slotted health check, the checker, retries, task silence.

        Each part runs on its own: one that raises is logged and counted
        (``errors``) and the others still run, on this tick and the next.
        """
        now = self.shared.clock()
        if self.shared.state is ManagerState.WATCH:
            if self.adoption.done():
                self.adoption.end()
            return
        for what, part in (
            ("health check", self.liveness.health_tick),
            ("stream checker", self.checker.tick),
            ("error-stop retries", self.deploy.retry_tick),
            ("task silence", self.liveness.silence_tick),
        ):
            try:
                part(now)
            except Exception:
                self.shared.errors += 1
                logger.exception("stream manager: {} failed ({} errors so far); going on", what, self.shared.errors)

    async def checkpoint_tick(self) -> None:
        """The checkpoint part of the periodic work: abandon stale rounds, start due ones, commit complete ones
        (``checkpoint``). Async: round ids and commits go to etcd."""
        await self.checkpoints.tick(self.shared.clock())

    async def final_checkpoint(self, stream_id: int) -> tuple[int, str]:
        """A stop's final checkpoint round, waited for up to ``checkpoint_timeout`` (at most
        ``STOP_CHECKPOINT_WAIT_MAX``, inside a client's call timeout): (consensus, "" or why not)."""
        wait = min(self.shared.config.checkpoint_timeout, STOP_CHECKPOINT_WAIT_MAX)
        return await self.checkpoints.final_round(stream_id, wait)

    def check_tasks(self, now: float | None = None) -> int:
        """The checker's task part (``checker``); returns how many streams it repaired."""
        return self.checker.check_tasks(self.shared.clock() if now is None else now)

    def node_lost(self, node_id: int) -> bool:
        """A node's meta session was deleted: handle its snode and vgroups as lost now (``liveness``)."""
        return self.liveness.node_lost(node_id)

    def snode_dependents(self, persisted: Iterable[stream_pb2.StreamDef], snode_id: int) -> list[stream_pb2.StreamDef]:
        """The streams that depend on ``snode_id`` (main snode, or tasks placed there: ``guards``)."""
        return guards.snode_dependents(self.shared, persisted, snode_id)

    def snode_dropped(self, snode_id: int, forced: bool = False) -> int:
        """A committed snode drop: forget the snode, redeploy what ran there (``guards``); returns the streams."""
        return guards.snode_dropped(self.shared, self.liveness, snode_id, forced)

    def unled_vgroups(self, vgroup_ids: Iterable[int]) -> list[int]:
        """Of ``vgroup_ids``, those no live node leads now."""
        return guards.unled_vgroups(self.shared, vgroup_ids)

    def live_snode_ids(self) -> set[int]:
        """Snodes heard within task_silence and not declared lost (where new tasks may be placed now)."""
        return self.shared.live_snodes(self.shared.clock())

    def show_streams(self, req: stream_pb2.ShowStreamsRequest | None = None) -> stream_pb2.ShowStreamsResponse:
        """Every stream (or those named) with its state and, on request, its task table."""
        resp = show_streams(self.shared, req or stream_pb2.ShowStreamsRequest(with_tasks=True))
        for info in resp.streams:
            info.recalcs.extend(self.recalcs.infos(info.stream.id))
        return resp

    # ----- what the service, metrics and tests read -------------------------------------------------------------------
    @property
    def store(self) -> StreamStore:
        return self.shared.store

    @store.setter
    def store(self, store: StreamStore) -> None:
        self.shared.store = store

    @property
    def leader_revision(self) -> int:
        return self.shared.leader_revision

    @property
    def config(self) -> StreamConfig:
        return self.shared.config

    @property
    def state(self) -> ManagerState:
        return self.shared.state

    @property
    def streams(self) -> dict[int, StreamRuntime]:
        return self.shared.streams

    @property
    def snodes(self) -> dict[int, Heard]:
        return self.shared.snodes

    @property
    def vgroups(self) -> dict[int, Heard]:
        return self.shared.vgroups

    @property
    def snode_owner(self) -> dict[int, int]:
        return self.shared.snode_owner

    @property
    def live_nodes(self) -> set[int] | None:
        return self.shared.live_nodes

    @property
    def lost_snodes(self) -> dict[int, float]:
        return self.shared.lost_snodes

    @property
    def lost_vgroups(self) -> dict[int, float]:
        return self.shared.lost_vgroups

    @property
    def health_slot(self) -> int:
        return self.liveness.health_slot

    @property
    def adopted(self) -> int:
        return self.shared.adopted

    @property
    def redeploys(self) -> int:
        return self.shared.redeploys

    @property
    def checker_repairs(self) -> int:
        return self.shared.checker_repairs

    @property
    def rejected_heartbeats(self) -> int:
        return self.shared.rejected_heartbeats

    @property
    def rejected_claims(self) -> int:
        return self.shared.rejected_claims

    @property
    def resent_actions(self) -> int:
        return self.shared.resent_actions

    @property
    def errors(self) -> int:
        return self.shared.errors
