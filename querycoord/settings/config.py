"""Configuration of a coordinator process: plain dataclasses, every duration in seconds.

This module sits at the bottom of the package: it imports nothing of the
runtime, so the scheduler, the stream manager, the command line and the
tooling can all take their defaults from here. The defaults are production
values; ``scaled_config`` is the one preset that tests, drills and the demo
use, so a crash is noticed in seconds rather than tens of seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from meta.config import EtcdConfig
from querycoord.common.limits import Limits


@dataclass
class SchedulerConfig:
    """Every knob of the scheduler; tests and drills scale the durations down."""

    retry_budget: int = 5  # attempts per child on one node (Milvus MaxRetryNum)
    retry_backoff: float = 0.2  # first back-off between attempts, doubling
    retry_backoff_max: float = 2.0
    max_concurrent_triggers: int = 8
    max_concurrent_children: int = 64
    trigger_timeout: float = 600.0  # a trigger's whole life, including waits for capacity
    max_request_bytes: int = 200_000  # merged LoadSegments request on the wire (Milvus MaxSendSizeToEtcd)
    # A checker repair's persisted request at most (``checkers.repair_size``): etcd refuses a write over 1.5 MiB,
    # so a bigger repair is done in parts, one after the other.
    max_repair_bytes: int = 512 * 1024
    # LoadSegments calls in flight to one node at a time (TaskEnv.load_gate): a node loads its requests one by one
    # (as Milvus's query node does), so more at once only queue there, each spending its call timeout waiting.
    node_load_concurrency: int = 1
    # Budgets of segment moves in flight (``task.throttle``), counted in LoadSegments calls of move triggers, on the
    # destination and on the source node: RECOVERY (the checker's repairs: a lost or missing copy) and BALANCE (auto
    # balance, a user's LoadBalance) each have their own, so balance never takes recovery's slots. A plain load is
    # not a move and is never throttled.
    max_recoveries_per_node: int = 4
    max_cluster_recoveries: int = 16
    max_balance_moves_per_node: int = 2
    max_cluster_balance_moves: int = 8
    memory_limit: float = 0.9
    wait_interval: float = 1.0  # how often a resumed tree waiting for query nodes to register looks again
    # A tree resumed by a new leader whose children find no online node waits this long after the takeover for
    # query nodes to register (a whole cluster restarting) before it fails.
    resume_node_wait: float = 30.0
    finished_history: int = 200  # finished trees kept in memory for ListTasks
    rollback_timeout: float = 120.0  # a failed trigger's rollback; past it the checker repairs the rest
    # Task history in etcd (querycoord/task/history.py): a finished tree's summary, written in the txn that
    # removes its keys. The leader prunes it to the newest ``history_keep`` records (0: no history is written)
    # and drops records older than ``history_max_age`` seconds (0: no age limit), every ``history_sweep_interval``.
    history_keep: int = 1000
    history_max_age: float = 7 * 24 * 3600.0
    history_sweep_interval: float = 60.0
    history_children: int = 100  # children listed per history record at most (the counts cover them all)


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Every duration of the manager, in seconds (TDengine's values by default; tests scale them down)."""

    def scaled(self, factor: float) -> StreamConfig:
        """The same configuration with every duration multiplied by ``factor`` (drills, demos: 0.1)."""
        if factor <= 0:
            raise ValueError(f"the stream time scale must be positive, got {factor}")
        return dataclasses.replace(self, **{
            f.name: getattr(self, f.name) * factor for f in dataclasses.fields(self) if f.type in ("float", float)
        })

    # WATCH after a leader change ends at the latest this long after start() (TDengine's short isolation).
    watch_timeout: float = 10.0
    # A deployed task not heard of for this long is lost; an snode not heard of for this long is not live.
    task_silence: float = 30.0
    # A trigger is started no sooner than this after the stream's last deploy (its tasks need time to come up).
    min_start_delay: float = 3.0
    # Error-stop back-off: retry after error_retry_delay, after max_retry_delay once more than
    # fast_retries failures happened in a row; the count resets once the trigger ran reset_after.
    error_retry_delay: float = 30.0
    max_retry_delay: float = 600.0
    fast_retries: int = 10
    reset_after: float = 60.0
    # Health check: run by tick() at most every health_interval; each snode and vgroup is checked once every
    # health_slots runs (those whose id % health_slots is the current slot).
    health_interval: float = 3.0
    health_slots: int = 10
    # An snode or vgroup not reported for this long is lost (also the damping of node_lost()).
    isolation: float = 30.0
    # Streams with a task on a vgroup lost this long are stopped (VGROUP_LOST).
    vgroup_lost_stop: float = 150.0
    # The stream checker (tick()) compares each task with its node's last report at most this often.
    check_interval: float = 3.0
    # A checkpoint round starts per running stream this often (0: no rounds). TDengine's default is 300 s; 60 s
    # bounds what a redeployed task replays from its consensus checkpoint to about a minute, and a round costs
    # the leader one batched etcd write per stream (``stream.checkpoint``).
    checkpoint_interval: float = 60.0
    # A round not committed within this long is abandoned; the next one starts with a higher id. A stop waits
    # this long for its final round before stopping anyway.
    checkpoint_timeout: float = 30.0


@dataclass
class CoordConfig:
    """Defaults are production values; ``scaled_config`` scales the durations down for tests, drills and the demo."""

    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    root: str = "querycoord"
    listen: str = "127.0.0.1:19531"
    session_ttl: float = 10.0
    rpc_timeout: float = 10.0
    # 0 disables auto balance.
    auto_balance_interval: float = 60.0
    balance_spread: float = 0.30
    # How often the checker compares what should be held with what nodes hold (it is also kicked by events).
    checker_interval: float = 5.0
    # A query node whose session is gone is forgotten (its copies re-replicated elsewhere) only this many seconds
    # later, while every collection it served keeps a whole replica on online nodes (``checkers.left``); a node back
    # under its id within the delay keeps its place in its replicas. 0: at once.
    node_left_delay: float = 60.0
    # Address of an external Catalog service; None runs the catalog inside the coordinator.
    catalog_address: str | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Stream management: the manager's durations, how often the leader ticks it and re-reads the store.
    stream: StreamConfig = field(default_factory=StreamConfig)
    stream_tick: float = 1.0
    stream_refresh: float = 30.0
    # Where /metrics, /healthz and /readyz are served over HTTP (host:port, port 0: any free port); "" serves none.
    http_listen: str = ""
    # With security on, the status page answers only requests whose Host is an IP address, localhost, this
    # machine's name, the host of listen or http_listen, or one of these names (comma-separated).
    http_allowed_hosts: str = ""
    # Bounds on what one request may ask for (common/limits.py): checked before anything is queued or written.
    limits: Limits = field(default_factory=Limits)
    # A standby keeps the query meta in memory, followed by a watch, so that taking over needs no reload
    # (querycoord/querymeta/mirror.py); 0 reads everything from etcd when it takes over (less memory).
    warm_standby: int = 1
    # The leader fences a node whose session value is larger than this many bytes or that rewrites its session
    # more than ``node_session_max_writes`` times a minute (meta/session_guard.py): a node credential cannot fill etcd.
    node_session_max_bytes: int = 64 * 1024
    node_session_max_writes: int = 30


# The scaled preset: the same behaviour as production with short durations. A session TTL of 2 s notices a crash
# in about 2 s; back-offs of tens of milliseconds keep retries quick; no auto balance, so tests and drills decide
# when segments move; stream management (TDengine's durations are tens of seconds) runs about ten times faster.
SCALED_SCHEDULER = SchedulerConfig(retry_backoff=0.05, retry_backoff_max=0.2, wait_interval=0.2,
                                   trigger_timeout=60.0, resume_node_wait=10.0)
SCALED_STREAM = StreamConfig(watch_timeout=2.0, task_silence=5.0, min_start_delay=0.2, error_retry_delay=0.5,
                             max_retry_delay=2.0, reset_after=5.0, health_interval=0.3, health_slots=2, isolation=3.0,
                             vgroup_lost_stop=30.0, checkpoint_interval=6.0, checkpoint_timeout=3.0)


def scaled_config(**changes: Any) -> CoordConfig:
    """A fresh ``CoordConfig`` of the scaled preset (see above) with ``changes`` applied to its top-level fields."""
    base = CoordConfig(listen="127.0.0.1:0", session_ttl=2.0, rpc_timeout=5.0, auto_balance_interval=0,
                       node_left_delay=0.0,
                       scheduler=dataclasses.replace(SCALED_SCHEDULER), stream=SCALED_STREAM,
                       stream_tick=0.1, stream_refresh=5.0)
    return dataclasses.replace(base, **changes)


__all__ = ["SCALED_SCHEDULER", "SCALED_STREAM", "CoordConfig", "EtcdConfig", "Limits", "SchedulerConfig",
           "StreamConfig", "scaled_config"]
