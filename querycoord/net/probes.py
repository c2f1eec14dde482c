"""What a node answers on ``/healthz`` and ``/readyz``, and the HTTP server every process binds for its probes.

Liveness asks "is this process worth keeping": a node's event loop answered
the probe (``http_server`` runs every probe on it). A node that loses its
session exits by itself, to come back under a new id, so liveness needs no
more. Readiness asks "can it serve its role now": a node is ready once its
session is registered (the coordinator can see it), until it loses that
session or stops. A node serves no pages.

The coordinator's endpoints live in ``querycoord.serving.health``; this module
imports nothing of the coordinator's side, so a node process loads none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client.metrics_core import Metric

from meta.session import Session
from querycoord.common.metrics import install
from querycoord.net.http_access import page_access, page_hosts, tls_context
from querycoord.net.http_server import Endpoints, HttpServer, Page, Probe
from querycoord.security.grpc_channels import current as current_security


class SessionNode(Protocol):
    """What the probes read of a node: its kind ("query node") and its session (RuntimeError before start)."""

    kind: str

    @property
    def session(self) -> Session: ...


class NodeEndpoints:
    """``/metrics``, ``/healthz`` and ``/readyz`` of a query node or a stream node (see module docstring);
    ``families`` reads the node's metrics (``nodes.node_metrics.querynode_families`` or ``streamnode_families``)."""

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
    coordinator's status page) guarded (``querycoord.net.http_access``: Host among ``addresses``' hosts,
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


__all__ = ["NodeEndpoints", "SessionNode", "bind_http"]
