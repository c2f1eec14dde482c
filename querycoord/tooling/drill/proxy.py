"""A small asyncio TCP proxy that the chaos drill puts on every link it wants to partition.

Why a proxy and not iptables: the drill runs unprivileged on loopback, and a
per-link proxy lets it partition one process from one peer (a coordinator
from etcd, the coordinators from one query node) while everything else keeps
talking. A process is pointed at the proxy instead of its peer (an etcd
endpoint, or the address a query node advertises in its session), so every
byte of that link goes through here and the drill decides its fate:

* ``cut()``: existing connections are reset (RST, so both ends notice at
  once, as after a crash of a middlebox) and new ones are reset on accept
  (the client sees "connection reset", i.e. refused) or, with
  ``blackhole=True``, accepted and held silently until ``heal()``;
* ``stall()``: no byte moves in either direction, nothing is closed: what a
  partition looks like to TCP (peers see only silence until their own
  deadlines fire); new connections are accepted and held;
* ``heal()``: bytes flow again; held connections are forwarded (a stalled
  stream resumes exactly where it stopped), connections reset by a cut stay
  gone and their clients reconnect.

The target may be set after the listener exists (``set_target``): the drill
needs the proxy's address to start a query node (``--advertise``) before it
knows the node's own port; connections arriving meanwhile wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["open", "cut", "stall"]
_CHUNK = 64 * 1024


def _reset(writer: asyncio.StreamWriter | None) -> None:
    """Close with RST (SO_LINGER 0): the peer gets ECONNRESET at once instead of a FIN it might ignore."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(Exception):
        writer.transport.abort()


@dataclass(eq=False)
class _Conn:
    """One client connection and, once connected, its upstream."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    dropped: asyncio.Event = field(default_factory=asyncio.Event)

    def drop(self) -> None:
        self.dropped.set()
        _reset(self.client)
        _reset(self.upstream)


@dataclass
class ProxyStats:
    """What went through (tests and the drill's report)."""

    accepted: int = 0
    refused: int = 0  # reset on accept while cut
    dropped: int = 0  # reset by a cut while open or stalled
    bytes_up: int = 0  # client -> target
    bytes_down: int = 0  # target -> client
    upstream_failures: int = 0  # the target refused or was unreachable


class TcpProxy:
    """A listener on ``listen_host:0`` forwarding to ``target`` (see module docstring)."""

    def __init__(self, target: str | None = None, *, name: str = "", listen_host: str = "127.0.0.1"):
        self.name = name
        self.listen_host = listen_host
        self.mode: Mode = "open"
        self.blackhole = False
        self.stats = ProxyStats()
        self._target: tuple[str, int] | None = None
        self._target_set = asyncio.Event()
        self._flowing = asyncio.Event()  # set while bytes may move (mode "open")
        self._flowing.set()
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        if target is not None:
            self.set_target(target)

    # ----- life cycle ---------------------------------------------------------------------------------------
    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        """Where clients connect: give this to the process instead of the target."""
        if not self.port:
            raise RuntimeError("proxy not started")
        return f"{self.listen_host}:{self.port}"

    @property
    def target(self) -> str | None:
        return f"{self._target[0]}:{self._target[1]}" if self._target else None

    def set_target(self, target: str) -> None:
        host, sep, port = target.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"proxy target {target!r} is not host:port")
        self._target = (host, int(port))
        self._target_set.set()

    async def close(self) -> None:
        """Stop listening and reset every connection (the drill's end, or the end of a dead node's links)."""
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.drop()
        for t in list(self._handlers):
            t.cancel()
        for t in list(self._handlers):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ----- faults -------------------------------------------------------------------------------------------
    def cut(self, *, blackhole: bool = False) -> None:
        """Reset every connection; reset new ones on accept, or hold them silently with ``blackhole``."""
        self.mode, self.blackhole = "cut", blackhole
        self._flowing.clear()
        for c in list(self._conns):
            if not c.dropped.is_set():
                self.stats.dropped += 1
            c.drop()

    def stall(self) -> None:
        """Stop moving bytes without closing anything (new connections are held)."""
        self.mode, self.blackhole = "stall", False
        self._flowing.clear()

    def heal(self) -> None:
        """Bytes flow again; held connections are forwarded."""
        self.mode, self.blackhole = "open", False
        self._flowing.set()

    # ----- forwarding ---------------------------------------------------------------------------------------
    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        if self.mode == "cut" and not self.blackhole:
            self.stats.refused += 1
            _reset(writer)
            return
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            # Held (stall, blackhole) until healed; a cut meanwhile resets it.
            if not await self._wait_or_drop(conn, self._flowing.wait()):
                return
            if not await self._wait_or_drop(conn, self._target_set.wait()):
                return
            assert self._target is not None
            try:
                up_reader, conn.upstream = await asyncio.open_connection(*self._target)
            except OSError:
                self.stats.upstream_failures += 1
                _reset(writer)
                return
            if conn.dropped.is_set():  # cut while connecting
                conn.drop()
                return
            pumps = [asyncio.create_task(self._pump(conn, reader, conn.upstream, up=True)),
                     asyncio.create_task(self._pump(conn, up_reader, writer, up=False))]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for p in pumps:
                    p.cancel()
                for p in pumps:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await p
        finally:
            self._conns.discard(conn)
            for w in (conn.client, conn.upstream):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()

    @staticmethod
    async def _wait_or_drop(conn: _Conn, waiting: Awaitable[object]) -> bool:
        """Await ``waiting`` unless the connection is dropped first; True if it may go on."""
        wait = asyncio.ensure_future(waiting)
        drop = asyncio.ensure_future(conn.dropped.wait())
        try:
            await asyncio.wait({wait, drop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wait.cancel()
            drop.cancel()
        return not conn.dropped.is_set()

    async def _pump(self, conn: _Conn, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, up: bool) -> None:
        """Copy ``src`` to ``dst`` chunk by chunk, each chunk waiting for the link to flow."""
        try:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    return
                if not self._flowing.is_set() and not await self._wait_or_drop(conn, self._flowing.wait()):
                    return
                dst.write(data)
                await dst.drain()
                if up:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
        except (ConnectionError, OSError):
            return

    def __repr__(self) -> str:
        return f"TcpProxy({self.name or '?'} {self.address if self.port else '-'} -> {self.target}, {self.mode})"


__all__ = ["Mode", "ProxyStats", "TcpProxy"]
