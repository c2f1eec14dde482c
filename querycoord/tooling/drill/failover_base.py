"""The failover drill's state, shared by its parts (``replica_watch``, ``failover_faults``, ``failover_checks``)."""

from __future__ import annotations

import asyncio
from typing import Any

from meta.kv import MetaKV
from meta.ops.child import ChildProcess
from querycoord.net.client import QueryCoordClient
from querycoord.tooling.drill.base import ProcessDrill
from querycoord.tooling.drill.failover_records import DrillResult, ReplicaObservation
from querycoord.tooling.drill.invariants import Expected
from querycoord.tooling.drill.options import DrillOptions
from querycoord.tooling.drill.schedule import make_schedule
from querycoord.tooling.harness import Member


def direct_address(node: Member) -> str:
    """Where the drill itself reaches a query node: its bound address, never a proxy it advertises instead."""
    return str(node.ready.get("listen_address") or node.address)


class FailoverBase(ProcessDrill[DrillOptions, DrillResult]):
    """What every part of the failover drill reads and writes; the hooks its parts call and ``FailoverDrill``
    (or the chaos drill) implements."""

    def __init__(self, opts: DrillOptions, out: Any = None):
        opts.validate()
        super().__init__(opts, out, "querycoord-drill-")
        self.schedule = make_schedule(opts.seed, opts)
        self.result = DrillResult(opts, self.schedule)
        self.root = f"drill-{opts.seed}"
        self.result.work_dir = self.work
        self.kv: MetaKV | None = None
        self.client: QueryCoordClient | None = None
        self.nodes: list[Member] = []  # the query nodes the drill keeps running, by slot
        self.leader_log: list[tuple[Member, ChildProcess, dict[str, Any]]] = []
        self.coll_ids: list[int] = []
        self.part_ids: dict[int, list[int]] = {}
        self.expected: dict[int, Expected] = {}
        self._seq = 0
        self._kill_task: asyncio.Task[None] | None = None
        self._etcd_task: asyncio.Task[None] | None = None
        self._extra_violations: list[str] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._replacing: set[int] = set()
        self._etcd_down: set[int] = set()  # members the drill killed (or is restarting) on purpose
        # Replicas over time: observed around leader kills and at every quiescent check (``_judge_replicas``).
        self._replica_obs: list[ReplicaObservation] = []
        self._replica_suspects: dict[int, tuple[str, ReplicaObservation]] = {}  # node -> (what, since when)
        self._replica_history: list[str] = []
        self._replica_comparisons = 0  # collections compared at two observations

    @property
    def coords(self) -> list[Member]:
        """By index, not by start order: seeded faults pick a coordinator by its position."""
        return sorted(self.cluster.coordinators, key=lambda m: m.index)

    async def _start_node(self, index: int, member: Member | None = None) -> Member:
        """Query node ``index``; with ``member`` its replacement (``FailoverDrill._start_node``)."""
        raise NotImplementedError

    async def _restart_coordinator(self, member: Member) -> None:
        """Start a killed coordinator again as a standby (``FailoverDrill._restart_coordinator``)."""
        raise NotImplementedError
