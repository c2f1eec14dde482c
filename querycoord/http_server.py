"""The HTTP side of every process: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness), and
the pages a process adds (a coordinator's status page, ``querycoord.status_page``).

The coordinator, the query node and the stream node all serve these on
``--http-listen HOST:PORT`` beside their gRPC port. The server is the
standard library's threaded HTTP server (no hand-written HTTP): requests are
parsed in its threads, and every answer is computed on the process's event
loop (``run_coroutine_threadsafe``). So the probes and the scrape never read
the loop's state from another thread, and a loop that stops turning fails
``/healthz`` (its answer does not come within ``timeout``) instead of being
reported alive by a thread that still runs.

What each process reports is an ``Endpoints``: the metric families read at
scrape time (added to the process-wide ``prometheus_client.REGISTRY``, where
the counters and histograms are), its two probes, and its other read-only
pages (``page``: None where it has none).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from loguru import logger
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

DEFAULT_TIMEOUT = 5.0


@dataclass
class Probe:
    """A probe's answer: ``ok`` gives 200 (else 503); ``detail`` is the JSON body (role, reason, ...)."""

    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Page:
    """An answer of ``Endpoints.page``: its status, content type and body (never cached by the browser: it is
    live state)."""

    status: HTTPStatus
    content_type: str
    body: bytes


class Endpoints(Protocol):
    """What one process serves; each coroutine runs on the process's event loop."""

    async def metric_families(self) -> list[Metric]:
        """The metrics read from live state at scrape time (the registry's counters come on top)."""
        ...

    async def live(self) -> Probe: ...

    async def ready(self, role: str | None) -> Probe:
        """Ready to serve its role; ``role`` (from ``?role=``) asks for one role only (a coordinator: leader)."""
        ...

    async def page(self, path: str, query: dict[str, list[str]]) -> Page | None:
        """The answer at ``path`` (with its query parameters) beyond the three above; None: nothing there."""
        ...


def split_listen(listen: str, flag: str = "--http-listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:9090`` for IPv6, empty host: every interface) as (host, port); a ``ValueError``
    names ``flag``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{flag} {listen!r} is not HOST:PORT with a port in 0..65535 (port 0: any free port)")
    return host.strip("[]"), int(port)


class _Snapshot:
    """The registry plus families already read: what ``generate_latest`` encodes."""

    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self.families


class _Server(ThreadingHTTPServer):
    # A request waiting for the event loop must not hold up a shutdown that runs on that loop.
    block_on_close = False
    owner: HttpServer


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        owner = self.server.owner
        if url.path == "/metrics":
            self._metrics(owner)
        elif url.path == "/healthz":
            self._probe(owner, owner.endpoints.live(), "liveness")
        elif url.path == "/readyz":
            roles = parse_qs(url.query).get("role", [])
            self._probe(owner, owner.endpoints.ready(roles[0] if roles else None), "readiness")
        else:
            self._page(owner, url.path, parse_qs(url.query))

    def _metrics(self, owner: HttpServer) -> None:
        try:
            families = owner.on_loop(owner.endpoints.metric_families())
        except Exception as exc:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, f"metrics unavailable: {exc}\n".encode(), "text/plain")
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._send(HTTPStatus.OK, encoder(_Snapshot(families)), content_type)

    def _probe(self, owner: HttpServer, check: Any, what: str) -> None:
        try:
            probe: Probe = owner.on_loop(check)
        except FutureTimeout:
            probe = Probe(False, {"reason": f"the event loop did not answer the {what} probe within "
                                            f"{owner.timeout:g}s"})
        except Exception as exc:
            probe = Probe(False, {"reason": f"{what} probe failed: {exc!r}"})
        body = {"status": "ok" if probe.ok else "unavailable", **probe.detail}
        status = HTTPStatus.OK if probe.ok else HTTPStatus.SERVICE_UNAVAILABLE
        self._send(status, (json.dumps(body) + "\n").encode(), "application/json")

    def _page(self, owner: HttpServer, path: str, query: dict[str, list[str]]) -> None:
        try:
            page: Page | None = owner.on_loop(owner.endpoints.page(path, query))
        except FutureTimeout:
            page = Page(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                        f"the event loop did not answer {path} within {owner.timeout:g}s\n".encode())
        except Exception as exc:
            page = Page(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8",
                        f"{path} unavailable: {exc}\n".encode())
        if page is None:
            page = Page(HTTPStatus.NOT_FOUND, "text/plain", b"not found: try /metrics, /healthz or /readyz\n")
        self._send(page.status, page.body, page.content_type,
                   {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})

    def _send(self, status: HTTPStatus, body: bytes, content_type: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Every probe and scrape would otherwise print a line on stderr.
        logger.debug("http {}: {}", self.address_string(), format % args)


class HttpServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` for ``endpoints`` (see module docstring).

    The port is bound here (an ``OSError`` names a busy or bad address at
    once, as the gRPC port does); ``start`` serves from a daemon thread.
    """

    def __init__(self, listen: str, endpoints: Endpoints, *, timeout: float = DEFAULT_TIMEOUT):
        host, port = split_listen(listen)
        self.endpoints = endpoints
        self.timeout = timeout
        cls = _V6Server if ":" in host else _Server
        try:
            self._server = cls((host or "0.0.0.0", port), _Handler)
        except OSError as exc:
            raise OSError(f"cannot serve HTTP on {listen}: {exc.strerror or exc}") from exc
        self._server.owner = self
        bound_host, self.port = self._server.server_address[:2]
        shown = "127.0.0.1" if bound_host in ("0.0.0.0", "") else "::1" if bound_host == "::" else str(bound_host)
        # Where a local client reaches it (a wildcard bind as loopback, as the gRPC address is reported).
        self.address = f"[{shown}]:{self.port}" if ":" in shown else f"{shown}:{self.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HttpServer:
        """Serve from now on; answers are computed on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"http-{self.port}", daemon=True)
        self._thread.start()
        logger.info("serving /metrics, /healthz and /readyz on http://{}", self.address)
        return self

    def on_loop(self, coro: Any) -> Any:
        """Run ``coro`` on the process's loop from a request thread; ``TimeoutError`` past ``timeout``."""
        if self._loop is None or self._loop.is_closed():
            coro.close()
            raise RuntimeError("the process's event loop is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.timeout)
        except FutureTimeout:
            future.cancel()
            raise

    async def stop(self) -> None:
        if self._thread is not None:
            await asyncio.to_thread(self._server.shutdown)
            self._thread = None
        self._server.server_close()


__all__ = ["Endpoints", "HttpServer", "Page", "Probe", "split_listen"]
