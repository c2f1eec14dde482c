"""Clients of the coordinators that follow the leader: one implementation for every service and caller.

Given any coordinator addresses, a client calls the one it believes leads. A
standby says where the leader is (``protocol.leader_is_at``) in a
``NOT_LEADER`` status or a gRPC UNAVAILABLE; a dead coordinator names
nothing and a paused or partitioned one answers nothing at all
(DEADLINE_EXCEEDED): the client moves to the named leader, or else to the
next address, and tries again. Statuses other than NOT_LEADER are the answer
and are returned as they are; other gRPC errors are raised.

How long it keeps trying is the caller's choice: a user-facing call retries
until its ``deadline`` (retrying is safe: every QueryCoord mutation is
idempotent, a repeated load or release is success), while a stream node's
heartbeat gives up after one round over the known addresses, since its next
tick reports again anyway. No single attempt outlives the deadline: a
coordinator that cannot reach etcd may take long to answer, and the caller
asked for an answer within it.

When no leader answers, ``CoordinatorUnavailable`` says what each address
did (``problems``): nothing listens there, it stands by and no leader is
elected yet, it cannot reach etcd, it did not answer in time, or it is not a
querycoord coordinator at all (UNIMPLEMENTED: some other gRPC server, such
as a query node). An address of the last kind is skipped, and the call
gives up at once when every address is of that kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from proto import catalog_pb2_grpc, common_pb2, querycoord_pb2_grpc, stream_pb2_grpc
from querycoord.common.protocol import parse_leader
from querycoord.security.grpc_channels import GrpcSecurity, make_channel

# gRPC codes after which another coordinator may answer: a standby's redirect, a dead or unreachable one, and a
# server that is no coordinator (UNIMPLEMENTED).
FOLLOWED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED)

# What an address did, as ``CoordinatorUnavailable.problems`` says it.
NOTHING_LISTENS = "nothing listens there"
NO_LEADER = "it stands by and no leader is elected yet"
NO_ETCD = "it cannot reach etcd, so it cannot lead or name the leader"
NOT_A_COORDINATOR = "that address is not a querycoord coordinator"
WENT_AWAY = "it went away while the request was in flight (the connection dropped)"
HTTP_SERVER = ("that is an HTTP server (the coordinator's --http-listen?), not its gRPC port (--listen; "
               "`querycoord up` prints it)")
# Phrases of a connection lost after it was made (the server died or closed it mid-call).
_DROPPED = ("socket closed", "connection reset", "broken pipe", "goaway", "end of stream", "stream removed")
# Phrases of an HTTP/1 server answering gRPC's HTTP/2 preface (gRPC reports the bytes it could not parse).
_HTTP1 = ("failed parsing http/2", "expected settings frame", "http/1.", "trying to connect an http1.x server",
          "bad_http_status", "malformed_frame_header", "frame_size_error", "invalid http2")
# Answers that will not change: such an address is skipped, and a call whose addresses all answer so gives up.
_FINAL = (NOT_A_COORDINATOR, HTTP_SERVER)
# Phrases of gRPC's connection failures and of a standby's answer (coordinator.not_leader_message).
_REFUSED = ("connection refused", "failed to connect", "connections to all backends failing", "name resolution",
            "dns resolution failed")
_NO_LEADER = ("no leader is elected yet", "is taking over leadership")
_NO_ETCD = "cannot reach etcd"

Discover = Callable[[], Awaitable[Sequence[str]]]


class CoordinatorUnavailable(Exception):
    """No coordinator answered as leader before the deadline (or within one round).

    ``problems``: address -> what it did, in the words the user reads (``describe``).
    """

    def __init__(self, message: str, problems: dict[str, str] | None = None, in_flight: str = "",
                 method: str = ""):
        super().__init__(message)
        self.method = method  # the call that got no answer (``LoadCollection``)
        self.problems = dict(problems or {})
        # The address that had the request when its connection dropped or its answer did not come in time: the
        # request may have been taken (and a mutation queued) there before it went away.
        self.in_flight = in_flight

    @property
    def nothing_listens(self) -> bool:
        return any(p.startswith(NOTHING_LISTENS) for p in self.problems.values())

    def summary(self) -> str:
        """``ADDR: problem; ADDR: problem`` (or the message when nothing was tried)."""
        return "; ".join(f"{a}: {p}" for a, p in self.problems.items()) or str(self)


def describe(code: grpc.StatusCode | None, details: str, method: str = "") -> str:
    """What an address's answer means to a user (the ``problems`` of ``CoordinatorUnavailable``)."""
    low = details.lower()
    leader = parse_leader(details)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"{NOT_A_COORDINATOR} (it does not serve {method or 'the QueryCoord service'})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "it did not answer in time (a coordinator that cannot reach etcd answers late)"
    if any(p in low for p in _HTTP1):
        return HTTP_SERVER
    if _NO_ETCD in low:
        return NO_ETCD
    if any(p in low for p in _NO_LEADER):
        return NO_LEADER
    if leader:
        return f"it stands by; the leader is at {leader}"
    if "handshake failed" in low or "certificate_verify_failed" in low:
        return ("the TLS handshake failed: its certificate is not signed by --tls-ca, or it does not serve TLS "
                f"({_tls_reason(details)})")
    if "socket closed" in low:
        return ("it closed the connection at once: it may require TLS (--tls-ca) or a client certificate "
                "(--tls-cert, --tls-key)")
    if any(p in low for p in _REFUSED):
        return NOTHING_LISTENS
    return f"{code.name if code is not None else 'NOT_LEADER'}: {' '.join(details.split())}"


def _tls_reason(details: str) -> str:
    """The OpenSSL reason of a failed handshake (``CERTIFICATE_VERIFY_FAILED: unable to get local issuer ...``)."""
    tail = details.rsplit("OPENSSL_internal:", 1)[-1] if "OPENSSL_internal:" in details else details
    return " ".join(tail.removesuffix(": OK").split())[:160]


def split_addresses(addresses: Sequence[str] | str) -> list[str]:
    """A list of addresses, from a list or a comma-separated string."""
    if isinstance(addresses, str):
        return [a.strip() for a in addresses.split(",") if a.strip()]
    return list(addresses)


class LeaderFollowingClient:
    """Calls ``method`` of any stub class on the leading coordinator (see module docstring).

    ``deadline``: seconds to keep trying; None: one round (each known address
    once, plus a leader named on the way). ``pause``: seconds between tries.
    ``discover``: where to find coordinator addresses when none is known or
    none answered (e.g. the live coordinator sessions). ``security``: TLS and
    the token presented (default: this process's, ``grpc_channels.current``).
    """

    def __init__(self, addresses: Sequence[str] | str = (), *, call_timeout: float = 30.0,
                 deadline: float | None = 60.0, pause: float = 0.1, discover: Discover | None = None,
                 security: GrpcSecurity | None = None):
        self.security = security
        self.addresses = split_addresses(addresses)
        self.call_timeout = call_timeout
        self.deadline = deadline
        self.pause = pause
        self.discover = discover
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._current = self.addresses[0] if self.addresses else ""
        self.leader_changes = 0
        self.last_error = ""
        self._answered: set[str] = set()  # addresses that answered a call of this client (a connection was made)

    @property
    def current(self) -> str:
        """The address the next call goes to first (the leader, as far as this client knows)."""
        return self._current

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = make_channel(address, self.security)
        return ch

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def __aenter__(self) -> LeaderFollowingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, stub_cls: type, method: str, request: Any) -> Any:
        """The leader's response; ``CoordinatorUnavailable`` when no coordinator answered as leader in time."""
        if not self.addresses and self.discover is not None:
            await self._rediscover()
        started = time.monotonic()
        attempts = 0
        tried: list[str] = []
        problems: dict[str, str] = {}  # address -> what it did (``describe``); per call: calls may overlap
        in_flight = ""  # where the request may have been taken before the connection was lost
        full_name = f"{getattr(stub_cls, '__name__', '').removesuffix('Stub')}/{method}"
        while self._may_try(started, attempts) and self._current:
            attempts += 1
            address = self._current
            try:
                resp = await getattr(stub_cls(self._channel(address)), method)(
                    request, timeout=self._attempt_timeout(started))
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in FOLLOWED:
                    raise
                details = exc.details() or ""
                self.last_error = f"{address}: {exc.code().name} {details}"
                problem = describe(exc.code(), details, full_name)
                if self._dropped(address, exc.code(), details):
                    in_flight = in_flight or address
                    if problem.startswith(("it closed the connection", "UNAVAILABLE")):
                        problem = WENT_AWAY
                if not (problem == NOTHING_LISTENS and problems.get(address) == WENT_AWAY):
                    problems[address] = problem  # "went away" is kept over the "nothing listens" of later tries
                self._follow(address, parse_leader(details), problems)
            else:
                self._answered.add(address)
                status = getattr(resp, "status", None)
                if status is None or status.error_code != common_pb2.NOT_LEADER:
                    return resp
                self.last_error = f"{address}: {status.reason}"
                problems[address] = describe(None, status.reason, full_name)
                self._follow(address, parse_leader(status.reason), problems)
            tried.append(address)
            if self.addresses and all(problems.get(a, "").startswith(_FINAL) for a in self.addresses):
                break  # none of them will ever answer
            if self.pause > 0:
                await asyncio.sleep(self.pause)
        if self.discover is not None:
            await self._rediscover()
        within = f"within {self.deadline:g}s" if self.deadline is not None else "in one round"
        raise CoordinatorUnavailable(f"no leader answered {method} {within} "
                                     f"(tried {sorted(set(tried))}; last: {self.last_error})", problems, in_flight,
                                     method)

    def _dropped(self, address: str, code: grpc.StatusCode, details: str) -> bool:
        """Whether ``address`` may have taken the request: its answer did not come in time, or the connection
        broke after it was made (this client's calls were answered there before, or gRPC says it was reset)."""
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return True
        low = details.lower()
        if code != grpc.StatusCode.UNAVAILABLE or any(p in low for p in (*_REFUSED, *_HTTP1)):
            return False
        return (address in self._answered and any(p in low for p in _DROPPED)) or "connection reset" in low

    def _attempt_timeout(self, started: float) -> float:
        """``call_timeout``, cut to what is left of the deadline."""
        if self.deadline is None:
            return self.call_timeout
        return max(0.05, min(self.call_timeout, self.deadline - (time.monotonic() - started)))

    def _may_try(self, started: float, attempts: int) -> bool:
        if self.deadline is not None:
            return time.monotonic() - started < self.deadline
        return attempts < len(self.addresses) + 1  # the list may grow by a named leader

    def prefer(self, leader: str) -> None:
        """Send the next calls to ``leader`` (learnt elsewhere, e.g. from a coordinator's own events): a
        standby answers some reads itself, so a client left on one would not notice a new leader.

        Already on ``leader``: it stays (moving on, as a call that failed does, sent every other poll of a
        caller that prefers the leader each time to the standby: ``make fuzz`` judged its answers).
        """
        if leader and leader == self._current:
            return
        self._follow(self._current, leader)

    def _follow(self, address: str, leader: str | None, problems: dict[str, str] | None = None) -> None:
        """Move to the named leader (remembering its address), else to the address after ``address`` (skipping
        those ``problems`` call no coordinator)."""
        if leader and leader != address:
            nxt = leader
            if nxt not in self.addresses:
                self.addresses.append(nxt)
        elif self.addresses:
            i = self.addresses.index(address) if address in self.addresses else -1
            # Skip addresses known not to be coordinators (the loop in ``call`` ends when all are).
            for step in range(1, len(self.addresses) + 1):
                nxt = self.addresses[(i + step) % len(self.addresses)]
                if not (problems or {}).get(nxt, "").startswith(_FINAL):
                    break
        else:
            return
        if nxt != self._current:
            self.leader_changes += 1
        self._current = nxt

    async def _rediscover(self) -> None:
        assert self.discover is not None
        with contextlib.suppress(Exception):  # keep what is known; the next call asks again
            found = list(await self.discover())
            if found:
                self.addresses = found
                if self._current not in found:
                    self._current = found[0]


class QueryCoordClient(LeaderFollowingClient):
    """The client of users and tools: QueryCoord, Catalog and StreamMgmt calls, retried until ``deadline``."""

    def __init__(self, addresses: Sequence[str] | str, *, deadline: float = 60.0, call_timeout: float = 30.0,
                 security: GrpcSecurity | None = None):
        super().__init__(addresses, call_timeout=call_timeout, deadline=deadline, security=security)
        if not self.addresses:
            raise ValueError("at least one coordinator address is required")

    async def __aenter__(self) -> QueryCoordClient:
        return self

    async def query(self, method: str, request: Any) -> Any:
        return await self.call(querycoord_pb2_grpc.QueryCoordStub, method, request)

    async def catalog(self, method: str, request: Any) -> Any:
        return await self.call(catalog_pb2_grpc.CatalogStub, method, request)

    async def stream(self, method: str, request: Any) -> Any:
        return await self.call(stream_pb2_grpc.StreamMgmtStub, method, request)


__all__ = ["FOLLOWED", "HTTP_SERVER", "WENT_AWAY", "CoordinatorUnavailable", "LeaderFollowingClient",
           "QueryCoordClient", "describe", "split_addresses"]
