"""The stream manager tests' harness: a fake clock, a leader's store in the real etcd, and simulated stream nodes.

The simulated nodes (``Node``) are in-process stand-ins that obey the manager's replies: the manager's rules are
under test, not the transport (tests/real_stream_nodes.py drives the reference node's real state machine instead).
Time is a fake monotonic clock, so durations are exact and nothing sleeps.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from typing import Any

from meta.kv import MetaKV
from proto import stream_pb2
from querycoord.common.messages import copy_fields
from querycoord.settings.config import StreamConfig
from querycoord.stream.manager import StreamManager
from querycoord.stream.runtime import ManagerState
from querycoord.stream.store import StreamStore
from tests.leader import leader_fence

# TDengine's durations for deploys, starts and error back-offs scaled to a tenth; health check, isolation and
# checker keep TDengine's (the tests that exercise those pass their own configuration).
CONFIG = StreamConfig(
    watch_timeout=1.0,
    task_silence=3.0,
    min_start_delay=0.3,
    error_retry_delay=3.0,
    max_retry_delay=60.0,
    fast_retries=10,
    reset_after=6.0,
)
# The health check at a tenth of TDengine's durations too: a check every 0.3 s over 10 slots (each snode and vgroup
# checked every 3 s), isolation 3 s.
HEALTH_CONFIG = dataclasses.replace(CONFIG, health_interval=0.3, health_slots=10, isolation=3.0)
INIT, RUNNING = stream_pb2.TASK_INIT, stream_pb2.TASK_RUNNING
# A CreateStream request's fields unless a test says otherwise: a stream on vgroups 2-4 of db1, small plans.
REQUEST_DEFAULTS: dict[str, Any] = {
    "source_db": "db1",
    "source_vgroup_ids": [2, 3, 4],
    "num_calc_scan_plans": 2,
    "num_calc_subplans": 2,
}


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


def create_req(name: str, **fields: Any) -> stream_pb2.CreateStreamRequest:
    """A CreateStream request: ``REQUEST_DEFAULTS`` with ``fields`` over them."""
    return stream_pb2.CreateStreamRequest(name=name, **{**REQUEST_DEFAULTS, **fields})


async def fenced_store(kv: MetaKV, seed: int = 3) -> StreamStore:
    """The leader's store: every write fenced, as the coordinator uses it; seeded, so placements repeat."""
    return StreamStore(kv.fenced(await leader_fence(kv)), rng=random.Random(seed))


async def new_manager(store: StreamStore, clock: Clock, revision: int = 100,
                      config: StreamConfig = CONFIG) -> StreamManager:
    mgr = StreamManager(store, leader_revision=revision, config=config, clock=clock, rng=random.Random(5))
    await mgr.start()
    return mgr


class Node:
    """A stream node: keeps the tasks it was given, reports them, obeys undeploys, starts and runner updates.

    Readers and runners go INIT -> RUNNING on their own after their first
    report; the trigger stays INIT until the leader starts it. It reports the
    stream group ``group`` of ``groups`` (default: one group, every task).
    """

    def __init__(self, node_id: int, vgroups: Iterable[int] = (), snode_id: int = 0):
        self.node_id = node_id
        self.vgroups = list(vgroups)
        self.snode_id = snode_id
        self.tasks: dict[tuple[int, int], stream_pb2.TaskStatusReport] = {}
        self.deploys: list[stream_pb2.TaskId] = []
        self.undeploys: list[stream_pb2.StreamUndeploy] = []
        self.starts: list[stream_pb2.StreamStart] = []
        self.seen_revision = 0
        self.groups, self.group = 1, 0

    def request(self) -> stream_pb2.HeartbeatRequest:
        reported = [r for k, r in self.tasks.items() if k[0] % self.groups == self.group]
        req = stream_pb2.HeartbeatRequest(
            node_id=self.node_id,
            snode_id=self.snode_id,
            vgroup_ids=self.vgroups,
            stream_group=self.group,
            num_stream_groups=self.groups,
            tasks=reported,
            seen_leader_revision=self.seen_revision,
        )
        for rep in reported:
            if rep.status == INIT and rep.kind != stream_pb2.TRIGGER:
                rep.status = RUNNING
        return req

    def apply(self, reply: stream_pb2.HeartbeatReply) -> None:
        if reply.leader_revision < self.seen_revision:
            return
        self.seen_revision = reply.leader_revision
        undeployed = set()
        for u in reply.undeploys:
            self.undeploys.append(u)
            undeployed.add(u.stream_id)
            if u.undeploy_all:
                self.tasks = {k: v for k, v in self.tasks.items() if k[0] != u.stream_id}
            for t in u.tasks:
                rep = self.tasks.get((t.stream_id, t.task_id))
                if rep is not None and rep.sid == t.sid:
                    del self.tasks[(t.stream_id, t.task_id)]
        for d in reply.deploys:
            assert d.stream_id not in undeployed, "an undeploy overrides every other action of the stream"
            msgs = [r.task for r in d.readers] + [r.task for r in d.runners]
            if d.HasField("trigger"):
                msgs.append(d.trigger.task)
            for t in msgs:
                assert t.node_id == self.node_id
                self.deploys.append(t)
                # Its reports repeat the task's whole identity as deployed: every field of its TaskId.
                self.tasks[(t.stream_id, t.task_id)] = copy_fields(t, stream_pb2.TaskStatusReport, status=INIT)
            if d.HasField("trigger"):
                self._set_tops(d.stream_id, d.trigger.task, d.trigger.top_runners)
        for s in reply.starts:
            self.starts.append(s)
            self.tasks[(s.stream_id, s.trigger.task_id)].status = RUNNING
        for ru in reply.runner_updates:
            self._set_tops(ru.stream_id, ru.trigger, ru.top_runners)

    def _set_tops(self, stream_id: int, trigger: stream_pb2.TaskId, tops: Iterable[stream_pb2.TaskId]) -> None:
        rep = self.tasks.get((stream_id, trigger.task_id))
        if rep is not None and rep.sid == trigger.sid:
            del rep.top_runners[:]
            rep.top_runners.extend(stream_pb2.TaskId(stream_id=t.stream_id, task_id=t.task_id, sid=t.sid) for t in tops)


async def round_(mgr: StreamManager, nodes: list[Node]) -> list[stream_pb2.HeartbeatReply]:
    replies = []
    for n in nodes:
        reply = await mgr.handle_heartbeat(n.request())
        assert reply.leader_revision == mgr.leader_revision
        n.apply(reply)
        replies.append(reply)
    return replies


async def normal_manager(store: StreamStore, clock: Clock, nodes: list[Node],
                         config: StreamConfig = CONFIG) -> StreamManager:
    """A manager past WATCH (nothing was running, so everything is deployed afresh)."""
    mgr = await new_manager(store, clock, config=config)
    mgr.set_live_nodes([n.node_id for n in nodes])
    await round_(mgr, nodes)
    assert mgr.state is ManagerState.NORMAL
    mgr.tick()  # the streams nobody reported are redeployed at once
    return mgr


async def running_manager(store: StreamStore, clock: Clock, nodes: list[Node],
                          config: StreamConfig = CONFIG) -> StreamManager:
    """A manager past WATCH whose streams all run."""
    mgr = await normal_manager(store, clock, nodes, config)
    await run_until_running(mgr, nodes, clock)
    return mgr


async def run_until_running(mgr: StreamManager, nodes: list[Node], clock: Clock, ids: set[int] | None = None,
                            rounds: int = 30) -> None:
    """Rounds of heartbeats and ticks, 0.1 s apart, until every stream (of ``ids``) runs."""
    for _ in range(rounds):
        await round_(mgr, nodes)
        mgr.tick()
        states = {s.state for s in mgr.show_streams().streams if ids is None or s.stream.id in ids}
        if states == {stream_pb2.STREAM_RUNNING}:
            return
        clock.advance(0.1)
    raise AssertionError(f"streams not running: {mgr.show_streams()}")


def snapshot(nodes: list[Node]) -> set[tuple[int, int, int, int, int, int]]:
    """Every running instance: (stream, task id, SID, deploy, index, node)."""
    return {
        (r.stream_id, r.task_id, r.sid, r.deploy_id, r.task_idx, r.node_id) for n in nodes for r in n.tasks.values()
    }
