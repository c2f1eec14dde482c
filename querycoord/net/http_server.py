"""The HTTP side of every process: ``/metrics`` (Prometheus), ``/healthz`` (liveness), ``/readyz`` (readiness), and
the pages a process adds (a coordinator's status page, ``querycoord.console.status_page``).

The coordinator, the query node and the stream node all serve these on
``--http-listen HOST:PORT`` beside their gRPC port. The server runs on the
process's event loop, one small coroutine per connection (no thread per
connection: a few hundred idle half-requests would exhaust a thread pool), with h11 parsing
HTTP/1.1 (no hand-written parser). What any caller costs is bounded
(``HttpLimits``):

* a connection must deliver its request line and headers (and the TLS
  handshake) within ``head_timeout`` of its start, or of the previous answer on
  a kept-alive connection, however slowly it trickles bytes (slowloris); a
  head over ``max_head_bytes`` is 431, a request body 413, a method other than
  GET or HEAD 405;
* at most ``max_connections`` are open (fewer when the process's file limit is
  low); at the cap, or when ``accept`` finds no file descriptor left, the
  oldest connection still waiting for its request is closed, so a new probe
  always gets in;
* at most ``max_answers`` answers other than ``/healthz`` (scrapes, readiness,
  pages) are computed and written at once, each bounded by ``timeout`` to be
  computed and by ``write_timeout`` to be read by its client; ``/healthz`` is
  answered beside them.

A loop that stops turning answers nothing at all, so the liveness probe times
out and fails, instead of being reported alive by a thread that still runs.

Pages beyond the probes and ``/metrics`` pass a ``Guard`` first (a
coordinator with security on: ``querycoord.net.http_access``), which sees the
request's headers and the client certificate of an HTTPS connection.

What each process reports is an ``Endpoints``: the metric families read at
scrape time (added to the process-wide ``prometheus_client.REGISTRY``, where
the counters and histograms are), its two probes, and its other read-only
pages (``page``: None where it has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import math
import resource
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import h11
from loguru import logger
from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from meta.address import split_address
from querycoord.net.transport_cycle import UntyingProtocol

DEFAULT_TIMEOUT = 5.0
# File descriptors left to the rest of the process (etcd, gRPC, logs) when the connection cap follows a low limit.
FD_RESERVE = 256
READ_BYTES = 4096
PROBES = ("/healthz", "/readyz", "/metrics")

OPEN_CONNECTIONS = Gauge("querycoord_http_connections", "HTTP connections open on --http-listen")
CLOSED_CONNECTIONS = Counter(
    "querycoord_http_connections_shed_total", "HTTP connections the server closed before an answer, by reason "
    "(head_timeout: no complete request head in time; evicted: the oldest waiting one, to let a new one in; "
    "refused: the cap was reached and none was waiting; bad_request: malformed, too large or with a body; "
    "write_timeout: the client did not read its answer; tls: a failed TLS handshake)", ["reason"])


@dataclass(frozen=True)
class HttpLimits:
    """What one caller may cost the HTTP side (see module docstring); every value finite and positive."""

    max_connections: int = 1024
    head_timeout: float = 5.0
    write_timeout: float = 10.0
    max_head_bytes: int = 16 * 1024
    max_answers: int = 16

    def __post_init__(self) -> None:
        for name in ("max_connections", "head_timeout", "write_timeout", "max_head_bytes", "max_answers"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"HTTP limit {name} must be a finite number above 0, got {value!r}")


@dataclass
class Probe:
    """A probe's answer: ``ok`` gives 200 (else 503); ``detail`` is the JSON body (role, reason, ...)."""

    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Page:
    """An answer of ``Endpoints.page`` (or a ``Guard``'s refusal): its status, content type, body and extra headers
    (never cached by the browser: it is live state)."""

    status: HTTPStatus
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Request:
    """What a ``Guard`` sees of a request: ``headers`` with lower-case names, in the order sent (a repeated header
    appears once per line); ``peer_certificate`` is the verified client certificate of an HTTPS connection, as
    ``ssl.SSLSocket.getpeercert`` gives it (None: plain HTTP or no certificate)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: tuple[tuple[str, str], ...]
    peer_certificate: Mapping[str, Any] | None = None

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name]


# A page's gatekeeper: None admits the request, a Page refuses it with that answer.
Guard = Callable[[Request], Page | None]


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
    try:
        host, port = split_address(listen, any_host=True)
    except ValueError:
        raise ValueError(f"{flag} {listen!r} is not HOST:PORT with a port in 0..65535 "
                         "(port 0: any free port)") from None
    return host.strip("[]"), port


def connection_cap(limits: HttpLimits) -> int:
    """``max_connections``, lowered so that the connections leave ``FD_RESERVE`` of the process's file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(16, min(limits.max_connections, soft - FD_RESERVE))


class _Snapshot:
    """The registry plus families already read: what ``generate_latest`` encodes."""

    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()
        yield from self.families


class _Refused(Exception):
    """A request answered with ``page`` and then the connection closed (a body, a bad head)."""

    def __init__(self, page: Page, reason: str):
        super().__init__(reason)
        self.page = page
        self.reason = reason


def _text(status: HTTPStatus, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Page:
    return Page(status, "text/plain; charset=utf-8", f"{message}\n".encode(), headers)


@dataclass(eq=False)
class _Connection:
    task: asyncio.Task[None] | None = None
    started: bool = False  # its coroutine runs (a task cancelled before that would never close its socket)
    waiting: bool = True  # for its request head: the connections the cap may close


class HttpServer:
    """``/metrics``, ``/healthz``, ``/readyz`` and the pages of ``endpoints`` (see module docstring).

    The port is bound here (an ``OSError`` names a busy or bad address at
    once, as the gRPC port does); ``start`` serves it on the running loop.
    ``tls`` serves HTTPS; ``guard`` admits or refuses the pages.
    """

    def __init__(self, listen: str, endpoints: Endpoints, *, timeout: float = DEFAULT_TIMEOUT,
                 limits: HttpLimits | None = None, guard: Guard | None = None, tls: ssl.SSLContext | None = None):
        host, port = split_listen(listen)
        self.endpoints = endpoints
        self.timeout = timeout
        self.limits = limits or HttpLimits()
        self.guard = guard
        self.tls = tls
        self.cap = connection_cap(self.limits)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._sock = socket.create_server((host or "0.0.0.0", port), family=family,
                                              backlog=min(self.cap, socket.SOMAXCONN))
        except OSError as exc:
            raise OSError(f"cannot serve HTTP on {listen}: {exc.strerror or exc}") from exc
        self._sock.setblocking(False)
        bound_host, self.port = self._sock.getsockname()[:2]
        shown = "127.0.0.1" if bound_host in ("0.0.0.0", "") else "::1" if bound_host == "::" else str(bound_host)
        # Where a local client reaches it (a wildcard bind as loopback, as the gRPC address is reported).
        self.address = f"[{shown}]:{self.port}" if ":" in shown else f"{shown}:{self.port}"
        self.scheme = "https" if tls is not None else "http"
        self._connections: dict[_Connection, None] = {}  # in the order they came
        self._answers = asyncio.Semaphore(self.limits.max_answers)
        self._accepting: asyncio.Task[None] | None = None
        self._last_shed_log = -math.inf

    def start(self) -> HttpServer:
        """Serve from now on, on the running event loop (connections that came before wait in the backlog)."""
        self._accepting = asyncio.get_running_loop().create_task(self._accept(), name=f"http-{self.port}")
        logger.info("serving /metrics, /healthz and /readyz on {}://{}", self.scheme, self.address)
        return self

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
            self._accepting = None
        tasks = [c.task for c in self._connections if c.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sock.close()

    # ----- connections ------------------------------------------------------------------------------------------
    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # No descriptor left: free one that only waits, so the next probe gets in.
                    self._shed(f"accept found no file descriptor ({exc.strerror})")
                    await asyncio.sleep(0.05)
                else:  # ECONNABORTED and the like: that client is gone already
                    await asyncio.sleep(0.01)
                continue
            if len(self._connections) >= self.cap and not self._shed(f"{self.cap} connections open (the cap)"):
                CLOSED_CONNECTIONS.labels("refused").inc()
                sock.close()
                continue
            conn = _Connection()
            conn.task = loop.create_task(self._serve(conn, sock))
            self._connections[conn] = None
            await asyncio.sleep(0)  # let it start (and become evictable) even within a burst of accepts

    def _shed(self, why: str) -> bool:
        """Close the oldest connection still waiting for its request; False when every one is being answered."""
        oldest = next((c for c in self._connections if c.waiting and c.started), None)
        if oldest is None:
            return False
        del self._connections[oldest]
        assert oldest.task is not None
        oldest.task.cancel()
        CLOSED_CONNECTIONS.labels("evicted").inc()
        now = time.monotonic()
        if now - self._last_shed_log >= 10.0:
            self._last_shed_log = now
            logger.warning("HTTP on {}: {}; closing the oldest connections that are still waiting for their "
                           "request (logged at most every 10 s)", self.address, why)
        return True

    async def _serve(self, conn: _Connection, sock: socket.socket) -> None:
        conn.started = True
        OPEN_CONNECTIONS.inc()
        loop = asyncio.get_running_loop()
        writer: asyncio.StreamWriter | None = None
        reason = ""
        try:
            deadline = loop.time() + self.limits.head_timeout
            try:
                async with asyncio.timeout_at(deadline):
                    reader, writer = await self._streams(sock)
            except (OSError, ssl.SSLError, TimeoutError):
                reason = "tls" if self.tls is not None else "head_timeout"
                return
            peer = writer.get_extra_info("peercert") if self.tls is not None else None
            h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
            while True:
                conn.waiting = True
                try:
                    async with asyncio.timeout_at(deadline):
                        request = await _next_request(h, reader)
                except TimeoutError:
                    reason = "head_timeout"
                    return
                except _Refused as refused:
                    reason = "bad_request"
                    await self._send(h, writer, refused.page, head=False, close=True)
                    return
                if request is None:
                    return  # the client closed
                conn.waiting = False
                keep = await self._answer(h, writer, request, peer)
                if not keep or h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                    return
                h.start_next_cycle()
                deadline = loop.time() + self.limits.head_timeout
        except TimeoutError:
            reason = "write_timeout"
        except (OSError, h11.ProtocolError):
            pass  # the client went away, or broke the protocol after its request: nothing to answer
        finally:
            if reason:
                CLOSED_CONNECTIONS.labels(reason).inc()
            self._connections.pop(conn, None)
            # A cancelled task keeps its CancelledError, whose traceback holds this frame and so ``conn``: without
            # this, task and connection (its reader, transport, buffers) would wait for a cyclic GC pass.
            conn.task = None
            OPEN_CONNECTIONS.dec()
            if writer is None:
                sock.close()
            elif reason == "write_timeout" or writer.transport.is_closing():
                writer.transport.abort()
            else:
                writer.close()

    async def _streams(self, sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Streams over the accepted ``sock``; with TLS, after the handshake (server side)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.limits.max_head_bytes, loop=loop)
        protocol = UntyingProtocol(reader, loop=loop)  # freed when closed, not by a rare GC pass
        if self.tls is None:
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
        else:
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock, ssl=self.tls,
                                                              ssl_handshake_timeout=self.limits.head_timeout)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)

    # ----- answers ----------------------------------------------------------------------------------------------
    async def _answer(self, h: h11.Connection, writer: asyncio.StreamWriter, event: h11.Request,
                      peer: Mapping[str, Any] | None) -> bool:
        """Answer one request; False when the connection is to be closed after it."""
        method = event.method.decode("ascii", errors="replace")
        url = urlsplit(event.target.decode("latin-1"))
        head = method == "HEAD"
        if method not in ("GET", "HEAD"):
            page = _text(HTTPStatus.METHOD_NOT_ALLOWED, f"method {method} not allowed: only GET and HEAD",
                         (("Allow", "GET, HEAD"),))
            await self._send(h, writer, page, head=False, close=True)
            return False
        query = parse_qs(url.query)
        if url.path == "/healthz":  # beside everything else: the liveness probe waits for no slot
            await self._send(h, writer, await self._probe(self.endpoints.live(), "liveness"), head=head)
            return True
        if url.path not in PROBES and self.guard is not None:
            request = Request(method, url.path, query,
                              tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers),
                              peer or None)
            refusal = self.guard(request)
            if refusal is not None:
                await self._send(h, writer, refusal, head=head)
                return True
        async with self._slot() as ok:
            if not ok:
                page = _text(HTTPStatus.SERVICE_UNAVAILABLE, f"busy: {self.limits.max_answers} answers are being "
                             f"computed or sent; try again")
            elif url.path == "/metrics":
                page = await self._metrics(event)
            elif url.path == "/readyz":
                roles = query.get("role", [])
                page = await self._probe(self.endpoints.ready(roles[0] if roles else None), "readiness")
            else:
                page = await self._page(url.path, query)
            # Sent while the slot is held: what waits in write buffers is bounded too.
            await self._send(h, writer, page, head=head)
        return True

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[bool]:
        try:
            async with asyncio.timeout(self.timeout):
                await self._answers.acquire()
        except TimeoutError:
            yield False
            return
        try:
            yield True
        finally:
            self._answers.release()

    async def _metrics(self, event: h11.Request) -> Page:
        try:
            async with asyncio.timeout(self.timeout):
                families = await self.endpoints.metric_families()
        except Exception as exc:
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"metrics unavailable: {exc!r}")
        accept = ", ".join(v.decode("latin-1") for k, v in event.headers if k == b"accept")
        encoder, content_type = choose_encoder(accept)
        return Page(HTTPStatus.OK, content_type, encoder(_Snapshot(families)))

    async def _probe(self, check: Any, what: str) -> Page:
        try:
            async with asyncio.timeout(self.timeout):
                probe: Probe = await check
        except TimeoutError:
            probe = Probe(False, {"reason": f"the {what} probe did not finish within {self.timeout:g}s"})
        except Exception as exc:
            probe = Probe(False, {"reason": f"{what} probe failed: {exc!r}"})
        body = {"status": "ok" if probe.ok else "unavailable", **probe.detail}
        status = HTTPStatus.OK if probe.ok else HTTPStatus.SERVICE_UNAVAILABLE
        return Page(status, "application/json", (json.dumps(body) + "\n").encode())

    async def _page(self, path: str, query: dict[str, list[str]]) -> Page:
        try:
            async with asyncio.timeout(self.timeout):
                page = await self.endpoints.page(path, query)
        except TimeoutError:
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"{path} was not ready within {self.timeout:g}s")
        except Exception as exc:
            return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"{path} unavailable: {exc}")
        if page is None:
            return _text(HTTPStatus.NOT_FOUND, "not found: try /metrics, /healthz or /readyz")
        return page

    async def _send(self, h: h11.Connection, writer: asyncio.StreamWriter, page: Page, *, head: bool,
                    close: bool = False) -> None:
        headers = [("Content-Type", page.content_type), ("Content-Length", str(len(page.body))),
                   ("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"), *page.headers]
        if close:
            headers.append(("Connection", "close"))
        try:
            data = h.send(h11.Response(status_code=int(page.status), headers=headers,
                                       reason=page.status.phrase.encode()))
            if not head and page.body:
                data += h.send(h11.Data(data=page.body)) or b""
            data += h.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            return  # h11 will not let this connection answer (it already broke the protocol): just close it
        writer.write(data or b"")
        async with asyncio.timeout(self.limits.write_timeout):
            await writer.drain()


async def _next_request(h: h11.Connection, reader: asyncio.StreamReader) -> h11.Request | None:
    """The next complete request (head and its end: a GET has no body); None when the client closed first.
    ``_Refused`` for a malformed or oversized head and for a body."""
    request: h11.Request | None = None
    while True:
        try:
            event = h.next_event()
        except h11.RemoteProtocolError as exc:
            # h11 raises it from a method of the exception itself (exception -> traceback -> frame -> exception):
            # untied, the frames (this connection's parser and reader) are freed now, not by a cyclic GC pass.
            exc.__traceback__ = None
            status = HTTPStatus(exc.error_status_hint)
            raise _Refused(_text(status, f"bad request: {exc}"), "bad_request") from None
        if event is h11.NEED_DATA:
            h.receive_data(await reader.read(READ_BYTES))  # b"": the client closed its side
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            raise _Refused(_text(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "a request body is not accepted here"),
                           "bad_request")
        elif isinstance(event, h11.EndOfMessage):
            return request
        else:  # ConnectionClosed (or PAUSED, which cannot come between cycles)
            return None


__all__ = ["Endpoints", "Guard", "HttpLimits", "HttpServer", "Page", "Probe", "Request", "connection_cap",
           "split_listen"]
