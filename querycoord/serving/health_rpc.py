"""CheckHealth and Explain on the leader: its served view, parked units and scheduler, read into the pure
derivations of ``served.health`` and ``querycoord.serving.explain``.

Only the leader answers (``server.py`` admits these calls through the gate): the figures are live (which nodes
are online now), the parked units and the triggers live in the leader's memory, and a standby reading etcd could
only show the persisted figures, which DESIGN rule 8 forbids presenting as health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING

from proto import querycoord_pb2 as qc
from querycoord.catalog.broker import Broker, BrokerError
from querycoord.common.errors import IllegalArgument, NotFound
from querycoord.served.health import STATES, collection_health, worst
from querycoord.served.missing import SEGMENT_LIMIT, missing_by_replica
from querycoord.served.state import CollectionServed
from querycoord.serving.explain import Facts, TriggerFacts, explain_units
from querycoord.task.model import kind_summary

if TYPE_CHECKING:
    from querycoord.catalog.targets import CatalogTargets
    from querycoord.leader.view import Leadership

_RELEASES = (qc.TASK_KIND_RELEASE_COLLECTION, qc.TASK_KIND_RELEASE_PARTITION)
# Catalog lookups of collection names in flight at once (CheckHealth of many collections, first time only).
_NAME_LOOKUPS = 16


class CollectionNames:
    """Collection id -> name, from the catalog, kept: an id never changes its name (a collection created again
    under the same name gets a new id), so each id is looked up once. Bounded by the loaded collections: ids no
    longer loaded are dropped (``keep_only``)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    async def of(self, broker: Broker, ids: Iterable[int]) -> dict[int, str]:
        """The names of ``ids``; "" for one the catalog does not answer for (dropped, or the catalog is down)."""
        wanted = [cid for cid in ids if cid not in self._names]
        gate = asyncio.Semaphore(_NAME_LOOKUPS)

        async def look(cid: int) -> None:
            async with gate:
                try:
                    self._names[cid] = (await broker.describe_collection(cid)).name
                except BrokerError:
                    pass  # asked again next time

        await asyncio.gather(*(look(cid) for cid in wanted))
        return {cid: self._names.get(cid, "") for cid in ids}

    def keep_only(self, loaded: Iterable[int]) -> None:
        keep = set(loaded)
        for cid in [c for c in self._names if c not in keep]:
            del self._names[cid]


def _targets(lead: Leadership) -> CatalogTargets | None:
    return lead.served.targets


def served_of(lead: Leadership, collection_id: int) -> CollectionServed | None:
    """The live figures of a loaded collection (the leader's cached view); None when it is not loaded."""
    return lead.served.collection(collection_id)


async def check_health(lead: Leadership, ids: list[int], names: CollectionNames) -> qc.CheckHealthResponse:
    """Every loaded collection (or ``ids``: NOT_FOUND naming those not loaded) with its health."""
    loaded = lead.meta.collection_ids()
    wanted = ids or loaded
    known = set(loaded)
    absent = [cid for cid in wanted if cid not in known]
    if absent:
        raise NotFound(f"collections {absent[:20]} have not been loaded")
    online = lead.nodes.online_ids()
    out = []
    for cid in wanted:
        served = served_of(lead, cid)
        missing = missing_by_replica(lead.meta, cid, online, _targets(lead), segments=False)
        if served is not None and missing is not None:
            out.append((served, missing))
    named = await names.of(lead.env.broker, [s.collection_id for s, _ in out])
    if not ids:
        names.keep_only(loaded)
    collections = [collection_health(s, m, named.get(s.collection_id, "")) for s, m in out]
    return qc.CheckHealthResponse(collections=collections, state=worst([c.state for c in collections]))


def trigger_facts(lead: Leadership, collection_id: int) -> list[TriggerFacts]:
    """The queued and running triggers of the collection, oldest first, with what each waits for."""
    sched = lead.scheduler
    out = []
    for t in sched.pending():
        if collection_id not in t.collections() and t.collection_id != collection_id:
            continue
        out.append(TriggerFacts(task_id=t.id, kind=kind_summary(t.KIND), running=sched.is_running(t.id),
                                since_ms=t.rec.created_ms, release=t.KIND in _RELEASES, waits=sched.waits_of(t)))
    return out


async def resolve(lead: Leadership, request: qc.ExplainRequest) -> tuple[int, str]:
    """The collection an Explain names (by id or by name, not both), with its name ("" when the catalog lacks
    it)."""
    if request.collection_id and request.collection_name:
        raise IllegalArgument("name the collection by collection_id or by collection_name, not both")
    if request.collection_name:
        try:
            desc = await lead.env.broker.describe_collection(request.collection_name)
        except BrokerError as exc:
            raise NotFound(exc.reason, exc.code) from exc
        return desc.collection_id, desc.name
    if not request.collection_id:
        raise IllegalArgument("name the collection: collection_id or collection_name is required")
    try:
        return request.collection_id, (await lead.env.broker.describe_collection(request.collection_id)).name
    except BrokerError:
        return request.collection_id, ""


async def explain(lead: Leadership, request: qc.ExplainRequest) -> qc.ExplainResponse:
    """Why each replica of the collection lacks what it lacks (``serving.explain``); the request is checked."""
    limit = request.segment_limit or SEGMENT_LIMIT
    cid, name = await resolve(lead, request)
    served = served_of(lead, cid)
    missing = missing_by_replica(lead.meta, cid, lead.nodes.online_ids(), _targets(lead), limit=limit)
    if served is None or missing is None:
        raise NotFound(f"collection {name or cid} (id {cid}) has not been loaded; `querycoord collection load "
                       f"{name or cid}` loads it")
    facts = Facts(served=served, missing=missing,
                  parked={p.replica_id: p for p in lead.env.parked.of(cid)}, triggers=trigger_facts(lead, cid),
                  checker_interval=lead.checker.interval,
                  left=lead.left.waiting() if lead.left is not None else {})
    return qc.ExplainResponse(collection_id=cid, name=name, state=STATES[served.health], units=explain_units(facts))
