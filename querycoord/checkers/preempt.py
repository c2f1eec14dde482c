"""A repair pre-empts a balance: recovery is never held back by an optional move of the same collection.

Triggers of one collection run one at a time, so a balance (auto balance, a user's LoadBalance), possibly
throttled behind its budget (``task.throttle``), would keep the checker from repairing a collection that lost
copies. The checker compares collections held only by balances too; when one lacks segments or DM channels a
replica must have, every balance holding it is cancelled (its callers get CANCELLED saying why). A move it had
finished stays done; one cut half-way leaves at most a copy no record names or a source not yet released, which
the checker's next pass (kicked when the balance ends) adopts or releases like any duplicate, while it loads
what is missing: no double copy is left behind.
"""

from __future__ import annotations

from loguru import logger

from querycoord.checkers.scan import Diff
from querycoord.task.scheduler import Scheduler
from querycoord.task.triggers import TriggerTask


def balances_by_collection(scheduler: Scheduler) -> dict[int, list[TriggerTask]]:
    """Collections held only by balance triggers, with those triggers (kept by the queue: ``task.owners``)."""
    return scheduler.queue.owners.balance_only()


def preempt_balances(scheduler: Scheduler, d: Diff, balanced: dict[int, list[TriggerTask]]) -> list[int]:
    """Cancel the balances of every collection in ``balanced`` the comparison ``d`` found lacking something a
    replica must hold; returns the ids of the triggers cancelled."""
    out: list[int] = []
    for cid, triggers in sorted(balanced.items()):
        req = d.repairs.get(cid)
        if req is None or not (req.missing_segments or req.rewatch):
            continue
        why = (f"pre-empted by a repair: collection {cid} lacks {len(req.missing_segments)} segments and "
               f"{len(req.rewatch)} DM channels in a replica")
        for t in triggers:
            if scheduler.triggers.get(t.id) is t:
                logger.info("checker: {} cancelled: {}", t.describe(), why)
                scheduler.queue.cancel(t, why)
                out.append(t.id)
    return out
