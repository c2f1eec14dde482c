"""What each process answers on ``/healthz`` and ``/readyz``, and which metrics it adds to a scrape.

Liveness (``/healthz``) asks only "is this process worth keeping": its event
loop answers (``http_server`` runs every probe on it) and, on a coordinator,
its campaign-and-lead loop has not ended. A standby is live, and so is a
process still waiting for etcd. A failed liveness probe means restart it. (A
node that loses its session exits by itself, to come back under a new id.)

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
* a node is ready once its session is registered (the coordinator can see
  it), until it loses that session or stops.

A coordinator also serves its status page (``querycoord.status_page``: ``/``,
``/status`` and ``/status.json``); a node serves nothing more.

While etcd's NOSPACE alarm is raised a coordinator's answers carry
``"etcd": "etcd is out of space (...)"``, but its probes do not fail: it
still serves reads and answers writes with RESOURCE_EXHAUSTED, and
restarting it would not give etcd any room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from prometheus_client.metrics_core import Metric

from meta.errors import MetaError
from meta.session import Session
from querycoord.grpc_channels import current as current_security
from querycoord.http_access import page_access, page_hosts, tls_context
from querycoord.http_server import Endpoints, HttpServer, Page, Probe
from querycoord.metrics import coordinator_families, install
from querycoord.status_page import answer as status_page
from querycoord.status_view import StatusSource

if TYPE_CHECKING:
    from querycoord.coordinator import Coordinator

LEADER = "leader"
# How long a standby's readiness waits for etcd to name the leader.
LEADER_LOOKUP_TIMEOUT = 2.0


class CoordinatorEndpoints:
    """``/metrics``, ``/healthz``, ``/readyz`` and the status page of a coordinator (see module docstring)."""

    def __init__(self, coord: Coordinator):
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


class SessionNode(Protocol):
    """What the probes read of a node: its kind ("query node") and its session (RuntimeError before start)."""

    kind: str

    @property
    def session(self) -> Session: ...


class NodeEndpoints:
    """``/metrics``, ``/healthz`` and ``/readyz`` of a query node or a stream node (see module docstring);
    ``families`` reads the node's metrics (``querycoord.metrics.querynode_families`` or ``streamnode_families``)."""

    def __init__(self, node: SessionNode, families: Callable[[], list[Metric]]):
        self.node = node
        self.families = families

    async def metric_families(self) -> list[Metric]:
        return self.families()

    async def page(self, path: str, query: dict[str, list[str]]) -> Page | None:
        return None

    def _session_state(self) -> tuple[bool, str, dict[str, object]]:
        """(registered and alive, why not, detail)."""
        detail: dict[str, object] = {"role": self.node.kind}
        try:
            session = self.node.session
        except RuntimeError:
            return False, "not registered yet", detail
        if session.info is None:
            return False, "not registered yet", detail
        detail["node_id"] = session.server_id
        if session.lost.is_set():
            return False, f"session lost ({session.lost_reason})", detail
        return True, "", detail

    async def live(self) -> Probe:
        # A node that lost its session exits (to come back under a new id); until then, and while starting, it is
        # alive: its loop answered this probe.
        _, _, detail = self._session_state()
        return Probe(True, detail)

    async def ready(self, role: str | None) -> Probe:
        ok, why, detail = self._session_state()
        if role is not None and role != self.node.kind.replace(" ", ""):
            return Probe(False, {**detail, "reason": f"this is a {self.node.kind}, not a {role}"})
        if not ok:
            return Probe(False, {**detail, "reason": why})
        return Probe(True, detail)


def bind_http(listen: str, endpoints: Endpoints, *, pages: bool = False, addresses: Iterable[str] = (),
              allowed_hosts: Iterable[str] = ()) -> HttpServer | None:
    """The HTTP server of ``--http-listen`` (None when empty), bound but not serving yet; from now on meta's
    events are counted (no one would read them without it).

    Under the process's security settings: HTTPS with ``--tls-http``, and with security on its ``pages`` (a
    coordinator's status page) guarded (``querycoord.http_access``: Host among ``addresses``' hosts,
    ``allowed_hosts`` and the local names; the reader role with a principals file)."""
    if not listen:
        return None
    security = current_security()
    try:
        tls = tls_context(security)
        guard = page_access(security, page_hosts([listen, *addresses], allowed_hosts)) if pages else None
        server = HttpServer(listen, endpoints, guard=guard, tls=tls)
    except ValueError as exc:  # a malformed address or unusable TLS files: reported as a busy port is
        raise OSError(str(exc)) from exc
    install()
    return server


__all__ = ["CoordinatorEndpoints", "NodeEndpoints", "bind_http"]
