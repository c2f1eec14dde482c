"""The HTTP side (``--http-listen``) stays up beside idle and slow clients: a real coordinator
process, a thousand idle connections (half of them with half a request) and slowloris clients that trickle a header
byte a second, over loopback. ``/healthz``, ``/readyz`` and ``/metrics`` keep answering, and the server closes
every connection that does not deliver its request head in time, so its file descriptors come back. Run once with
the default limits and once under a low file limit (``ulimit -n``), where the connection cap is below the number of
clients and the oldest waiting connections are closed to let new ones in. Also, in-process: a head too large, a
request body, a method other than GET and HEAD, kept-alive connections, and a TLS handshake that never comes."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import resource
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from meta.ops.etcd_server import EtcdCluster
from querycoord.net.http_access import tls_context
from querycoord.net.http_server import HttpLimits, HttpServer, Page, Probe
from querycoord.security.grpc_channels import GrpcSecurity
from querycoord.tooling.harness import coord_argv
from tests.certs import make_authority
from tests.spawn import Spawned, spawn_ready

IDLE = 1000
SLOW = 20
HEAD_TIMEOUT = HttpLimits().head_timeout
LOW_FD_LIMIT = 640  # the coordinator's connection cap is then 640 - 256 = 384, below the clients' number
# Python that lowers its file limit, then runs the rest of its argument vector as a new Python.
LIMITED = ("-c", f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({LOW_FD_LIMIT}, "
                 f"{LOW_FD_LIMIT})); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


@pytest.fixture
def fd_room() -> Iterator[None]:
    """This process's file limit raised (soft, and hard if needed) so that it can hold every client socket."""
    need = IDLE + SLOW + 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, max(hard, need) if hard != resource.RLIM_INFINITY
                                                         else hard))
        except (ValueError, OSError) as exc:
            pytest.fail(f"this test holds {IDLE + SLOW} sockets: `ulimit -n` is {soft} (hard {hard}) and cannot be "
                        f"raised to {need}: {exc}")
    yield
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _get(address: str, path: str) -> tuple[int, str]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


async def get(address: str, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(_get, address, path)


async def connect_idle(address: str, count: int) -> list[socket.socket]:
    """``count`` connections; every other one sends half a request (no blank line ends its head)."""
    host, port = address.rsplit(":", 1)
    loop = asyncio.get_running_loop()

    async def one(i: int) -> socket.socket | None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            async with asyncio.timeout(60):
                await loop.sock_connect(sock, (host, int(port)))
                if i % 2:
                    await loop.sock_sendall(sock, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        except (OSError, TimeoutError):
            sock.close()  # under the low limit the server may already have closed it to let others in
            return None
        return sock

    return [s for s in await asyncio.gather(*(one(i) for i in range(count))) if s is not None]


async def trickle(address: str, stop: asyncio.Event) -> None:
    """A slowloris client: a request line, then one header byte a second until the server closes it."""
    host, port = address.rsplit(":", 1)
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            while not stop.is_set() and not reader.at_eof():
                writer.write(b"a")
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await reader.read(1024)  # an EOF here is the server closing it
        finally:
            writer.close()


async def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            while await loop.sock_recv(sock, 4096):  # an answer (never expected) or b"": the server closed it
                pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


async def nudged_and_closed(sock: socket.socket, timeout: float) -> bool:
    """``closed_by_server`` after sending one byte of a request head (see the caller)."""
    try:
        await asyncio.get_running_loop().sock_sendall(sock, b"G")
    except (ConnectionResetError, BrokenPipeError):
        return True
    return await closed_by_server(sock, timeout)


def shed(text: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "querycoord_http_connections_shed_total"}


async def until(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("low_fd_limit", [False, True], ids=["default-limits", f"ulimit-{LOW_FD_LIMIT}"])
async def test_probes_answer_beside_a_thousand_idle_and_slow_connections(
        etcd: EtcdCluster, root_path: str, tmp_path: Path, fd_room: None, low_fd_limit: bool) -> None:
    argv = coord_argv(etcd.endpoints, root_path, "127.0.0.1:0", 2, "--http-listen", "127.0.0.1:0",
                      log_level="WARNING")
    coord: Spawned = await spawn_ready("coord", [*LIMITED, *argv] if low_fd_limit else argv, tmp_path)
    idle: list[socket.socket] = []
    stop = asyncio.Event()
    slow: list[asyncio.Task[None]] = []
    try:
        await coord.next_event("leader", timeout=60)
        address = coord.ready["http_address"]
        assert (await get(address, "/healthz"))[0] == 200
        before = fds(coord.pid)

        idle = await connect_idle(address, IDLE)
        slow = [asyncio.create_task(trickle(address, stop)) for _ in range(SLOW)]
        assert low_fd_limit or len(idle) == IDLE, f"only {len(idle)} of {IDLE} connections were made"
        # Beside them (and, under the low limit, beyond the cap), the probes and the scrape answer, again and again.
        for _ in range(3):
            status, body = await get(address, "/healthz")
            assert status == 200 and '"role": "leader"' in body, body
            assert (await get(address, "/readyz"))[0] == 200
            assert (await get(address, "/metrics"))[0] == 200
            await asyncio.sleep(1.0)

        # Nothing came within the head timeout: the server closed them all, and its descriptors came back.
        still_open = [s for s, closed in zip(idle, await asyncio.gather(
            *(closed_by_server(s, HEAD_TIMEOUT + 60) for s in idle)), strict=True) if not closed]
        # A connect that overflowed the accept queue (a burst of 1,000 beyond the cap, on a loaded machine) is
        # established on the client's side only: the server never had it, and only the client's next segment
        # tells either side. Send one byte: the server then takes it (and closes it after the head timeout) or
        # resets it; a connection the server holds and leaves open still fails below.
        still_open = [s for s, closed in zip(still_open, await asyncio.gather(
            *(nudged_and_closed(s, HEAD_TIMEOUT + 60) for s in still_open)), strict=True) if not closed]
        assert still_open == [], f"{len(still_open)} idle connections were never closed by the server"
        stop.set()
        await asyncio.wait_for(asyncio.gather(*slow), HEAD_TIMEOUT + 60)
        await until("the coordinator's file descriptors back", lambda: fds(coord.pid) <= before + 20, 60)
        status, text = await get(address, "/metrics")
        reasons = shed(text)
        assert reasons.get("head_timeout", 0) >= 1, reasons
        if low_fd_limit:
            assert reasons.get("evicted", 0) >= 1, f"the cap was never reached: {reasons}"
        assert (await get(address, "/healthz"))[0] == 200
    finally:
        stop.set()
        for task in slow:
            task.cancel()
        for s in idle:
            s.close()
        await coord.kill()


# ----- in-process: what one request may be ---------------------------------------------------------------------------
class _Process:
    """The endpoints of a process that is always live and ready and has no pages or metrics of its own."""

    async def metric_families(self) -> list[Metric]:
        return []

    async def live(self) -> Probe:
        return Probe(True, {"role": "test"})

    async def ready(self, role: str | None) -> Probe:
        return Probe(True, {})

    async def page(self, path: str, query: dict[str, list[str]]) -> Page | None:
        return None


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    s = HttpServer("127.0.0.1:0", _Process()).start()
    yield s
    await s.stop()


async def raw(server: HttpServer, data: bytes) -> bytes:
    """What the server answers to ``data`` before it closes the connection (or within 30 s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    await writer.drain()
    try:
        async with asyncio.timeout(30):
            return await reader.read()
    finally:
        writer.close()


async def test_a_request_is_a_bounded_get(server: HttpServer) -> None:
    answer = await raw(server, b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * 64_000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    answer = await raw(server, b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello")
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower(), answer
    answer = await raw(server, b"POST /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 405 ") and b"allow: get, head" in answer.lower(), answer
    answer = await raw(server, b"NOT HTTP AT ALL\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    # Kept alive: three requests in one write (pipelined), three answers; then a HEAD has headers only.
    answer = await raw(server, b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n" * 2
                       + b"HEAD /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 200 ") == 3 and answer.count(b'"status": "ok"') == 2, answer
    await until("every connection closed", lambda: server.open_connections == 0, 30)


async def test_the_oldest_waiting_connection_makes_room_for_a_new_one() -> None:
    """With a cap of 16 connections, 100 idle ones do not keep a probe out."""
    s = HttpServer("127.0.0.1:0", _Process(), limits=HttpLimits(max_connections=16)).start()
    socks: list[socket.socket] = []
    try:
        socks = await connect_idle(s.address, 100)
        assert s.open_connections <= 16
        status, body = await get(s.address, "/healthz")
        assert status == 200, body
    finally:
        for sock in socks:
            sock.close()
        await s.stop()


async def test_a_tls_handshake_that_never_comes_is_closed_too(tmp_path: Path) -> None:
    """Over HTTPS the head timeout covers the handshake: a client that connects and sends nothing is closed, while
    a real HTTPS client is answered."""
    ca = make_authority(tmp_path / "ca")
    served = ca.issue("querycoord-coordinator")
    tls = tls_context(GrpcSecurity(ca_file=ca.ca_file, cert_file=served.cert, key_file=served.key, http_tls=True))
    s = HttpServer("127.0.0.1:0", _Process(), tls=tls, limits=HttpLimits(head_timeout=1.0)).start()
    socks: list[socket.socket] = []
    try:
        socks = await connect_idle(s.address, 10)
        assert all(await asyncio.gather(*(closed_by_server(sock, 30) for sock in socks)))
        client = ssl.create_default_context(cafile=str(ca.ca_file))
        status, body = await asyncio.to_thread(_get_tls, s.address, client)
        assert status == 200 and '"status": "ok"' in body, body
    finally:
        for sock in socks:
            sock.close()
        await s.stop()


def _get_tls(address: str, context: ssl.SSLContext) -> tuple[int, str]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()
