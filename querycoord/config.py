"""Configuration of a coordinator process: one dataclass, every duration in seconds."""

from __future__ import annotations

from dataclasses import dataclass, field

from meta.config import EtcdConfig
from querycoord.stream.manager import StreamConfig
from querycoord.task.model import SchedulerConfig


@dataclass
class CoordConfig:
    """Defaults are production values; tests, drills and the demo scale durations down."""

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
    # Address of an external Catalog service; None runs the catalog inside the coordinator.
    catalog_address: str | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    # Stream management: the manager's durations, how often the leader ticks it and re-reads the store.
    stream: StreamConfig = field(default_factory=StreamConfig)
    stream_tick: float = 1.0
    stream_refresh: float = 30.0
