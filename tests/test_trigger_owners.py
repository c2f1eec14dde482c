"""The queue's index of which collections its triggers own (``task.owners``) answers what asking every trigger
answers, through any sequence of triggers queued and leaving, balances among them whose collections change while
they wait; and a checker pass no longer asks every queued trigger (``test_query_recovery``'s 5,000 reloaded
triggers, whose drain it made quadratic, count the asks)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proto import querycoord_pb2 as qc
from proto import task_pb2
from querycoord.settings.config import SchedulerConfig
from querycoord.task.owners import CollectionOwners
from querycoord.task.throttle import BALANCE, move_kind
from querycoord.task.triggers import (
    HandoffTask,
    LoadBalanceTask,
    LoadCollectionTask,
    ReleaseCollectionTask,
    TriggerTask,
)

FIXED = (LoadCollectionTask, ReleaseCollectionTask, HandoffTask)
REASONS = (qc.BALANCE_REASON_USER, qc.BALANCE_REASON_AUTO, qc.BALANCE_REASON_NODE_DOWN, qc.BALANCE_REASON_DRAIN)
CONDITIONS = (qc.TRIGGER_CONDITION_GRPC_REQUEST, qc.TRIGGER_CONDITION_LOAD_BALANCE, qc.TRIGGER_CONDITION_CHECKER)


class _Balance(LoadBalanceTask):
    """A balance whose collections are what the test sets (in the product they follow its source nodes' copies)."""

    now: set[int]

    def collections(self) -> set[int]:
        return set(self.now)


def _trigger(cls: type[TriggerTask], task_id: int, collection: int, condition: int, reason: int = 0) -> TriggerTask:
    rec = task_pb2.TaskRecord(id=task_id, kind=cls.KIND, collection_id=collection, trigger_condition=condition)
    if cls is _Balance:
        rec.load_balance.reason = reason
    return cls(SimpleNamespace(config=SchedulerConfig()), rec)  # type: ignore[arg-type]


def _asked_busy(triggers: list[TriggerTask]) -> set[int]:
    """What the scheduler answered before the index: every trigger asked."""
    out: set[int] = set()
    for t in triggers:
        out |= t.collections() | ({t.collection_id} if t.collection_id else set())
    return out


def _asked_balance_only(triggers: list[TriggerTask]) -> dict[int, list[int]]:
    balances: dict[int, list[int]] = {}
    others: set[int] = set()
    for t in triggers:
        owned = t.collections() | ({t.collection_id} if t.collection_id else set())
        if move_kind(t) == BALANCE:
            for c in owned:
                balances.setdefault(c, []).append(t.id)
        else:
            others |= owned
    return {c: ids for c, ids in balances.items() if c not in others}


collections = st.integers(0, 6)  # 0: no collection (a trigger of no collection owns none)
steps = st.lists(st.one_of(
    st.tuples(st.just("fixed"), st.sampled_from(range(len(FIXED))), collections, st.sampled_from(CONDITIONS)),
    st.tuples(st.just("balance"), st.sampled_from(REASONS), collections, st.frozensets(st.integers(1, 6))),
    st.tuples(st.just("change"), st.integers(0, 30), st.frozensets(st.integers(1, 6))),
    st.tuples(st.just("leave"), st.integers(0, 30)),
    st.tuples(st.just("again"), st.integers(0, 30)),  # queued again under its id (a reload pushes what it finds)
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_the_kept_index_answers_what_asking_every_trigger_answers(ops: list[tuple[Any, ...]]) -> None:
    asyncio.run(_replay(ops))


async def _replay(ops: list[tuple[Any, ...]]) -> None:
    owners = CollectionOwners()
    queued: dict[int, TriggerTask] = {}
    next_id = 1
    for op in ops:
        alive = list(queued.values())
        if op[0] == "fixed":
            t = _trigger(FIXED[op[1]], next_id, op[2], op[3])
        elif op[0] == "balance":
            t = _trigger(_Balance, next_id, op[2], qc.TRIGGER_CONDITION_LOAD_BALANCE, op[1])
            assert isinstance(t, _Balance)
            t.now = set(op[3])
        elif not alive:
            continue
        elif op[0] == "change":
            balances = [b for b in alive if isinstance(b, _Balance)]
            if balances:
                balances[op[1] % len(balances)].now = set(op[2])
            t = None
        elif op[0] == "leave":
            gone = alive[op[1] % len(alive)]
            del queued[gone.id]
            owners.remove(gone)
            t = None
        else:
            t = alive[op[1] % len(alive)]
        if t is not None:
            if t.id == next_id:
                next_id += 1
            queued[t.id] = t
            owners.add(t)
        order = sorted(queued.values(), key=lambda t: t.id)
        assert owners.busy() == _asked_busy(order)
        assert {c: [t.id for t in ts] for c, ts in owners.balance_only().items()} == _asked_balance_only(order)
