"""The restart drill's seeded plan: how each whole-cluster restart stops and starts the processes.

Each round stops every process (etcd, the coordinators, the query nodes) with one signal, in one order, and
starts them again on their data dirs. Signals alternate, so any two rounds in a row have a clean stop (SIGTERM:
sessions revoked, the leader resigns) and a crash (SIGKILL: every lease left to run out after etcd is back);
the seed picks which comes first and the orders. etcd always starts first: a coordinator or node that finds no
etcd exits rather than waits. What starts next matters: coordinators first meet no node (their resumed trees
wait for nodes to register), nodes first register before any leader watches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SIGTERM, SIGKILL = "SIGTERM", "SIGKILL"
ETCD, COORDINATORS, NODES = "etcd", "coordinators", "nodes"
START_ORDERS = ("coordinators first", "nodes first", "together")


@dataclass(frozen=True)
class Round:
    """One restart: ``signal`` for every process, stopped group by group in ``stop_order``, then started again
    (etcd, then ``start_order``)."""

    n: int
    signal: str
    stop_order: tuple[str, ...]
    start_order: str

    def describe(self) -> str:
        return f"{self.signal} {', '.join(self.stop_order)}; start etcd, then {self.start_order}"


def plan_rounds(seed: int, restarts: int) -> list[Round]:
    """``restarts`` rounds drawn from ``seed`` (the same seed, the same plan)."""
    rng = random.Random(f"restart-{seed}")
    first = rng.choice((SIGTERM, SIGKILL))
    other = SIGKILL if first == SIGTERM else SIGTERM
    rounds = []
    for i in range(restarts):
        order = [ETCD, COORDINATORS, NODES]
        rng.shuffle(order)
        rounds.append(Round(i + 1, first if i % 2 == 0 else other, tuple(order), rng.choice(START_ORDERS)))
    return rounds


__all__ = ["COORDINATORS", "ETCD", "NODES", "SIGKILL", "SIGTERM", "START_ORDERS", "Round", "plan_rounds"]
