"""What a coordinator answers on ``/healthz`` and ``/readyz``, which metrics it adds to a scrape, and its pages.

Nodes answer their probes from ``querycoord.net.probes``, which also binds the
HTTP server; this module is the coordinator's side only, so a node process
never loads the status page, the switchover or the client-side actions.

Liveness (``/healthz``) asks only "is this process worth keeping": its event
loop answers (``http_server`` runs every probe on it) and its
campaign-and-lead loop has not ended. A standby is live, and so is a
process still waiting for etcd. A failed liveness probe means restart it.

Readiness (``/readyz``) asks "can it serve its role now":

* a coordinator that leads is ready once it has taken over (query meta,
  nodes and task trees reloaded, its loops started): the same moment its gRPC
  health turns SERVING;
* a standby is ready as a standby once its session is registered and it
  reads etcd: it answers reads and tells callers where the leader is, so it
  belongs behind a Service that clients use (they follow the leader). While
  it takes over (its election key leads, the takeover is not done) it is not
  ready. ``/readyz?role=leader`` is ready on the leader only, for a Service
  that must reach the leader alone;
A coordinator also serves its status page (``querycoord.console.status_page``: ``/``,
``/status`` and ``/status.json``).

While etcd's NOSPACE alarm is raised a coordinator's answers carry
``"etcd": "etcd is out of space (...)"``, but its probes do not fail: it
still serves reads and answers writes with RESOURCE_EXHAUSTED, and
restarting it would not give etcd any room.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric

from meta.errors import MetaError
from querycoord.console.status_page import answer as status_page
from querycoord.console.status_view import StatusSource
from querycoord.net.http_server import Page, Probe
from querycoord.serving.coordinator_metrics import coordinator_families

if TYPE_CHECKING:
    from querycoord.leader.view import CoordinatorView

LEADER = "leader"
# How long a standby's readiness waits for etcd to name the leader.
LEADER_LOOKUP_TIMEOUT = 2.0


class CoordinatorEndpoints:
    """``/metrics``, ``/healthz``, ``/readyz`` and the status page of a coordinator (see module docstring)."""

    def __init__(self, coord: CoordinatorView):
        self.coord = coord
        self.status = StatusSource(coord)

    async def page(self, path: str, query: dict[str, list[str]]) -> Page | None:
        return await status_page(self.status, path, query)

    async def metric_families(self) -> list[Metric]:
        return await coordinator_families(self.coord)

    def _role(self) -> str:
        return LEADER if self.coord.is_leader else "standby"

    def _detail(self) -> dict[str, object]:
        detail: dict[str, object] = {"role": self._role(), "address": self.coord.address}
        space = self.coord.space
        if space is not None and space.nospace:
            detail["etcd"] = space.reason()
        return detail

    async def live(self) -> Probe:
        detail = self._detail()
        if self.coord.loop_ended:
            return Probe(False, {**detail, "reason": "the coordinator's campaign-and-lead loop has ended"})
        return Probe(True, detail)

    async def ready(self, role: str | None) -> Probe:
        coord = self.coord
        if role not in (None, LEADER):
            return Probe(False, {"reason": f"unknown role {role!r}: /readyz or /readyz?role=leader"})
        detail = self._detail()
        if coord.is_leader:
            leadership = coord.leadership
            if leadership is not None:
                detail["fence_revision"] = leadership.fence.revision
            return Probe(True, detail)
        if role == LEADER:
            return Probe(False, {**detail, "reason": "not the leader"})
        session = coord.session
        if session is None or session.info is None or session.lost.is_set():
            return Probe(False, {**detail, "reason": "no live session in etcd yet"})
        try:
            leader = await asyncio.wait_for(coord.leader_address(), LEADER_LOOKUP_TIMEOUT)
        except (MetaError, TimeoutError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else f"no answer within {LEADER_LOOKUP_TIMEOUT:g}s"
            return Probe(False, {**detail, "reason": f"etcd does not answer: {why}"})
        detail["leader"] = leader
        if leader == coord.address:
            return Probe(False, {**detail, "reason": "taking over leadership"})
        return Probe(True, detail)


__all__ = ["CoordinatorEndpoints"]
