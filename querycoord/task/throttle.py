"""Budgets of segment moves in flight, so that re-creating or moving copies never floods a node or the cluster.

Modelled on Elasticsearch's ``node_concurrent_recoveries`` and ``cluster_concurrent_rebalance``. A **move** is a
LoadSegments call of a trigger that re-creates or moves copies; two kinds, each with its own budgets
(``SchedulerConfig``), per node and cluster-wide:

* **recovery**: a lost or missing copy (the checker's repairs, a node-down trigger of an older version);
* **balance**: an optional move (auto balance, a user's LoadBalance).

A plain LoadCollection, LoadPartitions or handoff is not a move and never waits here: throttling must not slow
the load of a whole collection. The budgets count calls, not segments: one call carries up to
``max_request_bytes`` of segments, which its node loads one request after another (``TaskEnv.load_gate``), and
splitting calls to count segments would multiply the calls and the records written for the same work. A call
counts on its destination and, for a balance move, on its source (which releases the copy once it is loaded), so
one node is never the end of more moves than its budget. Kinds never share slots: recovery cannot be starved by
balance. A move over its budget waits for a slot (its child says so: ``WAIT_KIND_THROTTLED``); nothing fails for
want of one. Slots live in the leader's memory only: a new leader starts with none taken, and the calls of the
deposed one are cut with its fence.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord.settings.config import SchedulerConfig

RECOVERY = "recovery"
BALANCE = "balance"
KINDS = (RECOVERY, BALANCE)
_PLURAL = {RECOVERY: "recoveries", BALANCE: "balance moves"}


def move_kind(trigger: Any) -> str | None:
    """The move kind of ``trigger``'s segment loads, or None when they are not moves.

    ``trigger`` is a ``TriggerTask`` (typed loosely: the task model imports this module). A trigger class may say
    so itself with a ``MOVE_KIND`` attribute (a drain moving a node's copies away is a
    recovery); otherwise the checker's repairs and node-down triggers recover, a balance (not of a dead node)
    balances, anything else loads.
    """
    if trigger is None:
        return None
    declared = getattr(trigger, "MOVE_KIND", None)
    if declared is not None:
        return str(declared) or None
    cond = trigger.rec.trigger_condition
    if cond in (qc.TRIGGER_CONDITION_CHECKER, qc.TRIGGER_CONDITION_NODE_DOWN):
        return RECOVERY
    if trigger.KIND == qc.TASK_KIND_LOAD_BALANCE:
        recovers = trigger.request.reason in (qc.BALANCE_REASON_NODE_DOWN, qc.BALANCE_REASON_DRAIN)
        return RECOVERY if recovers else BALANCE
    return None


@dataclass(frozen=True)
class Budget:
    per_node: int
    cluster: int


def budgets_of(cfg: SchedulerConfig) -> dict[str, Budget]:
    return {RECOVERY: Budget(cfg.max_recoveries_per_node, cfg.max_cluster_recoveries),
            BALANCE: Budget(cfg.max_balance_moves_per_node, cfg.max_cluster_balance_moves)}


class MoveThrottle:
    """The slots taken per kind, per node and in all (see module docstring)."""

    def __init__(self, budgets: dict[str, Budget]):
        self.budgets = budgets
        self.on_node: dict[str, Counter[int]] = {k: Counter() for k in KINDS}
        self.running: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self._freed = asyncio.Event()

    def blocker(self, kind: str, nodes: Iterable[int]) -> str | None:
        """Why a move of ``kind`` touching ``nodes`` cannot start now (its budget is full), or None."""
        budget = self.budgets[kind]
        for n in sorted(set(nodes)):
            if self.on_node[kind][n] >= budget.per_node:
                return f"{self.on_node[kind][n]} {_PLURAL[kind]} running on node {n} (budget {budget.per_node})"
        if self.running[kind] >= budget.cluster:
            return f"{self.running[kind]} {_PLURAL[kind]} running in the cluster (budget {budget.cluster})"
        return None

    @contextlib.asynccontextmanager
    async def slot(self, kind: str, nodes: Iterable[int],
                   on_wait: Callable[[str], None] | None = None) -> AsyncIterator[None]:
        """Hold one slot of ``kind`` on each of ``nodes`` and one cluster-wide while the block runs; wait (saying
        why through ``on_wait``) while the budget is full."""
        touched = sorted(set(nodes))
        why = self.blocker(kind, touched)
        if why is not None:
            self.waiting[kind] += 1
            try:
                while why is not None:
                    if on_wait is not None:
                        on_wait(why)
                    freed = self._freed
                    await freed.wait()
                    why = self.blocker(kind, touched)
            finally:
                self.waiting[kind] -= 1
        for n in touched:
            self.on_node[kind][n] += 1
        self.running[kind] += 1
        try:
            yield
        finally:
            for n in touched:
                self.on_node[kind][n] -= 1
                if not self.on_node[kind][n]:
                    del self.on_node[kind][n]
            self.running[kind] -= 1
            freed, self._freed = self._freed, asyncio.Event()
            freed.set()  # every waiter looks again; those that still do not fit wait on the new event
