"""A coordinator's memory does not grow with the number of HTTP connections it has served and closed (the fuzz's
exhaustion phase: 111,000 connections in a minute grew the leader by 260 MiB, about 2.4 KiB each).

Each closed connection left reference cycles (its asyncio transport referring to itself on Python 3.11; an evicted
connection's task and its CancelledError holding each other and the connection's reader, parser and buffers), and
a coordinator's cyclic GC, its thresholds raised, practically never frees what lived through a young collection
(``querycoord.net.transport_cycle``). Here a real coordinator process serves what the fuzz sends: more idle clients
than its connection cap, each reopened as soon as the server closes it (mostly evicted by the cap, to let a new
one in). After a warm-up round its resident memory must stay flat over many more connections: the bound is
generous (allocator slack, a young GC generation), yet far below what keeping each connection's objects costs.

In-process, for each way a connection ends, nothing of it is left for the cyclic GC at all."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from meta.ops.etcd_server import EtcdCluster
from querycoord.net.http_server import HttpLimits, HttpServer
from querycoord.tooling.harness import coord_argv
from tests.exhaustion import rss_mib
from tests.spawn import Spawned, spawn_ready
from tests.test_http_bounds import _Process, fd_room, get, shed  # noqa: F401  (fd_room: a fixture)

CLIENTS = HttpLimits().max_connections + 276  # beyond the cap: each new connection evicts the oldest waiting one
WARM_UP = 4_000
CONNECTIONS = 12_000
# Kept, 12,000 connections cost about 22 MiB (20,000: 37 MiB); freed, they added under 1 MiB.
BOUND_MIB = 8.0


async def churn(address: str, total: int) -> int:
    """``CLIENTS`` connections open at once that never send a request, each reopened as soon as the server closes
    it, until ``total`` were opened (then the clients close theirs); how many were."""
    host, port = address.rsplit(":", 1)
    opened = 0

    async def client() -> None:
        nonlocal opened
        while True:
            try:
                async with asyncio.timeout(60):
                    reader, writer = await asyncio.open_connection(host, int(port))
            except (OSError, TimeoutError):
                await asyncio.sleep(0.1)
                continue
            opened += 1
            try:
                # Until the server closes it: evicted, or after its head timeout. A connect lost in a full accept
                # queue (open on the client's side only) is given up after a while.
                with contextlib.suppress(OSError, TimeoutError):
                    async with asyncio.timeout(30):
                        await reader.read()
            finally:
                writer.close()

    clients = [asyncio.create_task(client()) for _ in range(CLIENTS)]
    deadline = time.monotonic() + 600
    try:
        while opened < total:
            assert time.monotonic() < deadline, f"only {opened} of {total} connections were opened"
            await asyncio.sleep(0.1)
    finally:
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    return opened


async def test_closed_http_connections_leave_nothing_behind(etcd: EtcdCluster, root_path: str, tmp_path: Path,
                                                            fd_room: None) -> None:  # noqa: F811
    argv = coord_argv(etcd.endpoints, root_path, "127.0.0.1:0", 2, "--http-listen", "127.0.0.1:0",
                      log_level="WARNING")
    coord: Spawned = await spawn_ready("coord", argv, tmp_path)
    try:
        await coord.next_event("leader", timeout=60)
        address = coord.ready["http_address"]
        await churn(address, WARM_UP)  # the server's steady state: its buffers, pools and allocator arenas
        before = rss_mib(coord.pid)
        opened = await churn(address, CONNECTIONS)
        after = rss_mib(coord.pid)
        assert before is not None and after is not None
        reasons = shed((await get(address, "/metrics"))[1])
        # The connections ended as the fuzz's did: most evicted by the cap.
        assert reasons.get("evicted", 0) >= (WARM_UP + CONNECTIONS) // 2, f"the cap was rarely reached: {reasons}"
        grown = after - before
        each = grown * 2**20 / opened
        assert grown < BOUND_MIB, (f"{opened} connections grew the coordinator by {grown:.1f} MiB ({each:.0f} bytes "
                                   f"each; bound {BOUND_MIB:g} MiB): what closed connections held is kept\n"
                                   f"{coord.tail()}")
        assert (await get(address, "/healthz"))[0] == 200
    finally:
        await coord.kill()


# ----- in-process: what a closed connection leaves to the cyclic GC --------------------------------------------------
ENDINGS = ("answered", "client closed", "evicted", "bad request", "head timeout")
CAP = 16


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[Counter[str]]:
    """The types of what becomes cyclic garbage within the block (collected at its end): the GC is off meanwhile."""
    found: Counter[str] = Counter()
    gc.collect()
    gc.disable()
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.update(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def raw_connection(port: int, data: bytes = b"") -> socket.socket:
    """A client without an asyncio transport (its own would be cyclic garbage too, on Python 3.11)."""
    sock = socket.socket()
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    if data:
        await loop.sock_sendall(sock, data)
    return sock


async def until_closed(sock: socket.socket) -> None:
    """Read until the server closes ``sock`` (within 30 s)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(30):
        with contextlib.suppress(ConnectionResetError):
            while await loop.sock_recv(sock, 4096):
                pass
    sock.close()


async def end_one(server: HttpServer, ending: str) -> None:
    if ending == "answered":
        await until_closed(await raw_connection(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                                                             b"Connection: close\r\n\r\n"))
    elif ending == "client closed":
        (await raw_connection(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")).close()
    elif ending == "evicted":
        first = await raw_connection(server.port)
        await until(lambda: server.open_connections == 1)
        rest = [await raw_connection(server.port) for _ in range(CAP)]  # the last one evicts the first
        await until_closed(first)
        for sock in rest:
            sock.close()
    elif ending == "bad request":
        await until_closed(await raw_connection(server.port, b"NOT HTTP AT ALL\r\n\r\n"))
    else:
        await until_closed(await raw_connection(server.port, b"GET /healthz HTTP/1.1\r\n"))


async def until(check: object) -> None:
    async with asyncio.timeout(30):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("ending", ENDINGS)
async def test_a_closed_connection_leaves_no_cycle(ending: str) -> None:
    server = HttpServer("127.0.0.1:0", _Process(), limits=HttpLimits(max_connections=CAP, head_timeout=0.5)).start()
    try:
        await end_one(server, "answered")  # the server's first connection builds what it keeps (not garbage)
        await until(lambda: server.open_connections == 0)
        with cyclic_garbage() as garbage:
            for _ in range(3):
                await end_one(server, ending)
            await until(lambda: server.open_connections == 0)
            for _ in range(10):  # the transports' connection_lost callbacks
                await asyncio.sleep(0.01)
        kept = {name: n for name, n in garbage.items()
                if name in ("_SelectorSocketTransport", "socket", "StreamReader", "StreamReaderProtocol",
                            "UntyingProtocol", "Task", "_Connection", "Connection", "frame", "CancelledError")}
        assert kept == {}, f"{ending}: connections left cycles for the GC: {dict(garbage.most_common(12))}"
    finally:
        await server.stop()
