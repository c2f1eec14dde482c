"""The resource-exhaustion phase of a fuzzing run (``exhaust``): what one caller may cost a running cluster.

Against the coordinators of ``tests.fuzz_cluster`` (the leader, the standby, and a third coordinator started for
the phase with a principals file, so that the reader role's token is what the reads present and its status page
is guarded), all at once for ``ExhaustionOptions.seconds``:

* slow HTTP clients (slowloris: a request head trickled a header line a second) and idle HTTP connections
  (connected, silent), reconnecting when the server closes them, on the leader's ``--http-listen``;
* oversized HTTP request heads (64 KiB of headers): a 4xx is expected;
* many gRPC Health Watch streams held open (an open method, no credential) beyond the server's bound, and
  oversized requests to the open methods (1 MiB service names): RESOURCE_EXHAUSTED is expected;
* gRPC calls with large metadata;
* concurrent heavy reads (GetReplicas, ListTasks, GetSegmentInfo, ShowCollections and ``/status.json``) with the
  reader's token on the secured coordinator and without one on the others (security off there: anyone reads);
  the guarded page refuses a call without a token (401) or with a foreign Host (421).

Sampled throughout, and what the counts (``Exhaustion.counts``, all 0 on a good run) say:

* ``healthz_misses``: a ``/healthz`` of a coordinator not answered 200 within ``PROBE_TIMEOUT``;
* ``leader_changes``: the leader's address or election fence differs from the one at the start;
* ``processes_died``: a process of the cluster exited;
* ``rss_over_bound``: a coordinator whose resident memory grew more than ``rss_bound_mib`` over its start;
* ``unclean_refusals``: an answer that is no clean one: a gRPC UNKNOWN or INTERNAL (or another code where a
  refusal was due), a status UNEXPECTED_ERROR, an HTTP 5xx other than 503 (busy), a large head or request
  that was accepted.

``rss_growth_mib`` (the largest growth seen) and ``rss_bound_mib`` are figures, not counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto import common_pb2, querycoord_pb2
from proto import querycoord_pb2_grpc as qc_grpc
from querycoord.common.protocol import QUERYCOORD_SERVICE
from querycoord.security.auth import token_digest
from querycoord.tooling.harness import Harness, Member

EC = common_pb2
PROBE_TIMEOUT = 5.0  # a /healthz answer slower than this is a miss
SAMPLE_EVERY = 0.5
MIB = 1 << 20
COUNTS = ("healthz_misses", "leader_changes", "processes_died", "rss_over_bound", "unclean_refusals")


@dataclass
class ExhaustionOptions:
    """How hard the phase pushes; ``make fuzz`` uses the defaults, CI a smaller set (``small``)."""

    seconds: float = 60.0
    slow_clients: int = 300
    idle_connections: int = 1000
    big_heads: int = 50
    streams: int = 200  # Health Watch streams held at once (the server keeps 64 for callers without credential)
    big_requests: int = 50
    big_metadata: int = 50
    readers: int = 48  # concurrent heavy-read loops
    rss_bound_mib: float = 256.0

    @classmethod
    def small(cls) -> ExhaustionOptions:
        return cls(seconds=12.0, slow_clients=60, idle_connections=200, big_heads=10, streams=80, big_requests=10,
                   big_metadata=10, readers=16)


@dataclass
class Exhaustion:
    """What the phase found (see module docstring); ``refused`` and ``sent`` are shown, not counted."""

    healthz_misses: int = 0
    leader_changes: int = 0
    processes_died: int = 0
    rss_over_bound: int = 0
    unclean_refusals: int = 0
    rss_growth_mib: float = 0.0
    rss_bound_mib: float = 0.0
    sent: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    unclean: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in COUNTS}
        return out | {"rss_growth_mib": round(self.rss_growth_mib, 1), "rss_bound_mib": self.rss_bound_mib}

    @property
    def failed(self) -> bool:
        return any(getattr(self, k) for k in COUNTS)

    def bad(self, what: str) -> None:
        self.unclean_refusals += 1
        if len(self.unclean) < 20:
            self.unclean.append(what)

    def render(self) -> str:
        out = [f"exhaustion: sent {dict(sorted(self.sent.items()))}",
               f"exhaustion: cleanly refused {dict(sorted(self.refused.items()))}",
               f"exhaustion: {self.counts()}"]
        out += [f"exhaustion: unclean: {u}" for u in self.unclean]
        out += [f"exhaustion: {p}" for p in self.problems[:20]]
        return "\n".join(out)


@dataclass
class Target:
    """One coordinator under attack: its addresses, the token its reads present (None: security off), its pid."""

    label: str
    grpc_address: str
    http_address: str
    token: str | None
    pid: int

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.http_address.rpartition(":")
        return host, int(port)


def write_principals(work: Path) -> tuple[Path, str]:
    """A principals file with one reader token (by its digest) and an admin one nobody holds; the reader's token."""
    reader = secrets.token_urlsafe(32)
    path = work / "exhaustion-principals.toml"
    path.write_text(f'[[token]]\nprincipal = "fuzz-reader"\nrole = "reader"\nsha256 = "{token_digest(reader)}"\n\n'
                    f'[[token]]\nprincipal = "fuzz-admin"\nrole = "admin"\n'
                    f'sha256 = "{token_digest(secrets.token_urlsafe(32))}"\n')
    return path, reader


def target(member: Member, label: str, token: str | None) -> Target:
    return Target(label, member.address, str(member.ready["http_address"]), token, member.child.pid)


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# ----- HTTP, by hand: a client that misbehaves on purpose ------------------------------------------------------------
async def http_get(t: Target, path: str, headers: dict[str, str] | None = None,
                   timeout: float = 30.0) -> tuple[int, bytes]:
    """One GET on a fresh connection: (status, body); status 0 when the server closed without an answer."""
    host, port = t.host_port()
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            try:
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
                await writer.drain()
            except ConnectionError:
                pass  # refused before all was sent: the answer, if any, is still readable
            try:
                data = await reader.read()
            except ConnectionError:
                return 0, b""
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
    if not data.startswith(b"HTTP/1."):
        return 0, data
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def _hold(t: Target, stop: asyncio.Event, found: Exhaustion, kind: str, trickle: bool) -> None:
    """Keep one connection that never completes its request: silent (idle) or a header line a second (slowloris);
    reconnect whenever the server closes it. An answer the server sends before closing must be a 4xx."""
    host, port = t.host_port()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.5)
            continue
        found.sent[kind] += 1
        try:
            if trickle:
                writer.write(f"GET /status.json HTTP/1.1\r\nHost: {host}\r\n".encode())
            while not stop.is_set():
                if trickle:
                    writer.write(f"X-Slow-{secrets.randbelow(10**6)}: a\r\n".encode())
                    await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        data = await reader.read(4096)
                        if data.startswith(b"HTTP/1.") and not data[9:10] == b"4":
                            found.bad(f"{kind} on {t.label}: answered {data[:40]!r}")
                        found.refused[f"{kind} closed"] += 1
                        break  # closed by the server (with a 4xx, or without an answer)
        except ConnectionError:
            found.refused[f"{kind} closed"] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def big_heads(t: Target, n: int, found: Exhaustion) -> None:
    for i in range(n):
        found.sent["http big head"] += 1
        try:
            status, body = await http_get(t, "/healthz", {f"X-Big-{k}": "b" * 8000 for k in range(8)})
        except (OSError, TimeoutError) as exc:
            found.bad(f"big head {i} on {t.label}: {exc!r}")
            continue
        if 400 <= status < 500 or status == 0:
            found.refused[f"http big head {status}"] += 1
        else:
            found.bad(f"big head on {t.label}: answered {status} {body[:80]!r}")


async def guarded_page(t: Target, found: Exhaustion) -> None:
    """The secured coordinator's page refuses a call without a token (401) and a foreign Host (421)."""
    for what, headers, want in (("no token", {}, 401),
                                ("foreign host", {"Host": "rebind.example", **_bearer(t)}, 421)):
        found.sent[f"status.json {what}"] += 1
        host, port = t.host_port()
        lines = [f"{k}: {v}" for k, v in headers.items()]
        if "Host" not in headers:
            lines.insert(0, f"Host: {host}")
        try:
            async with asyncio.timeout(30):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(("GET /status.json HTTP/1.1\r\n" + "\r\n".join(lines)
                              + "\r\nConnection: close\r\n\r\n").encode())
                data = await reader.read()
                writer.close()
        except (OSError, TimeoutError) as exc:
            found.bad(f"status.json {what} on {t.label}: {exc!r}")
            continue
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
        if status == want:
            found.refused[f"status.json {what} {status}"] += 1
        else:
            found.bad(f"status.json {what} on {t.label}: {status}, wanted {want}")


def _bearer(t: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {t.token}"} if t.token else {}


# ----- gRPC -----------------------------------------------------------------------------------------------------------
def _grpc_clean(exc: grpc.aio.AioRpcError, *, refusal_due: bool) -> bool:
    code = exc.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return True
    if refusal_due or code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return False  # a read with the reader's token (or none, security off) must be let in
    if code == grpc.StatusCode.UNAVAILABLE and "leader" in (exc.details() or ""):
        return True  # a standby's redirect
    return code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


async def watch_streams(t: Target, n: int, stop: asyncio.Event, found: Exhaustion) -> None:
    """``n`` Health Watch streams held until ``stop``; those beyond the server's bound must be RESOURCE_EXHAUSTED."""
    channels = [grpc.aio.insecure_channel(t.grpc_address) for _ in range(max(1, n // 100))]

    async def hold(call: Any) -> None:
        async for _ in call:
            await asyncio.sleep(1.0)  # read little

    async def one(i: int) -> None:
        found.sent["grpc watch stream"] += 1
        call = health_pb2_grpc.HealthStub(channels[i % len(channels)]).Watch(
            health_pb2.HealthCheckRequest(service=QUERYCOORD_SERVICE))
        # Held until ``stop``, waited for beside the stream: a Watch sends nothing while the health stays the same,
        # so a loop waiting for its next message outlived ``stop`` by the whole 60 s the phase waits for its tasks.
        holder = asyncio.ensure_future(hold(call))
        waiter = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([holder, waiter], return_when=asyncio.FIRST_COMPLETED)
            if holder.done():
                holder.result()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and stop.is_set():
                return
            if _grpc_clean(exc, refusal_due=True):
                found.refused[f"grpc watch {exc.code().name}"] += 1
            else:
                found.bad(f"Watch on {t.label}: {exc.code().name} {exc.details()}")
        finally:
            waiter.cancel()
            holder.cancel()
            call.cancel()

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for ch in channels:
            await ch.close()


async def big_requests(t: Target, n: int, found: Exhaustion) -> None:
    """Open methods with a 1 MiB service name: refused RESOURCE_EXHAUSTED, never served."""
    async with grpc.aio.insecure_channel(t.grpc_address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for i in range(n):
            found.sent["grpc big request"] += 1
            request = health_pb2.HealthCheckRequest(service="s" * MIB)
            try:
                if i % 2:
                    await stub.Check(request, timeout=30)
                else:
                    async for _ in stub.Watch(request, timeout=30):
                        break
            except grpc.aio.AioRpcError as exc:
                if _grpc_clean(exc, refusal_due=True):
                    found.refused[f"grpc big request {exc.code().name}"] += 1
                else:
                    found.bad(f"big {'Check' if i % 2 else 'Watch'} on {t.label}: {exc.code().name} {exc.details()}")
                continue
            found.bad(f"big {'Check' if i % 2 else 'Watch'} on {t.label}: served")


async def big_metadata(t: Target, n: int, found: Exhaustion) -> None:
    """Calls whose metadata is far over what the server reads: refused (any code but UNKNOWN/INTERNAL) or served."""
    async with grpc.aio.insecure_channel(t.grpc_address) as ch:
        stub = qc_grpc.QueryCoordStub(ch)
        for i in range(n):
            found.sent["grpc big metadata"] += 1
            pad = (("x-pad", "p" * (64 << 10 if i % 2 else 8 << 10)),) * 4
            try:
                await stub.ShowCollections(querycoord_pb2.ShowCollectionsRequest(), metadata=t.metadata + pad,
                                           timeout=30)
            except grpc.aio.AioRpcError as exc:
                if _grpc_clean(exc, refusal_due=False):
                    found.refused[f"grpc big metadata {exc.code().name}"] += 1
                else:
                    found.bad(f"big metadata on {t.label}: {exc.code().name} {exc.details()}")


ReadCall = Callable[[qc_grpc.QueryCoordStub, tuple[tuple[str, str], ...]], Awaitable[Any]]


def heavy_reads(collection_id: int) -> dict[str, ReadCall]:
    return {
        "GetReplicas": lambda s, md: s.GetReplicas(querycoord_pb2.GetReplicasRequest(collection_id=collection_id),
                                                   metadata=md, timeout=30),
        "ListTasks": lambda s, md: s.ListTasks(querycoord_pb2.ListTasksRequest(), metadata=md, timeout=30),
        "GetSegmentInfo": lambda s, md: s.GetSegmentInfo(
            querycoord_pb2.GetSegmentInfoRequest(collection_id=collection_id), metadata=md, timeout=30),
        "ShowCollections": lambda s, md: s.ShowCollections(querycoord_pb2.ShowCollectionsRequest(), metadata=md,
                                                           timeout=30),
    }


async def reader_loop(t: Target, collection_id: int, index: int, stop: asyncio.Event, found: Exhaustion) -> None:
    """Heavy reads back to back until ``stop``, every fourth one the status page."""
    reads = list(heavy_reads(collection_id).items())
    async with grpc.aio.insecure_channel(t.grpc_address) as ch:
        stub = qc_grpc.QueryCoordStub(ch)
        k = index
        while not stop.is_set():
            k += 1
            if k % 5 == 0:
                await _status_json(t, found)
                continue
            name, call = reads[k % len(reads)]
            found.sent[f"read {name}"] += 1
            try:
                resp = await call(stub, t.metadata)
            except grpc.aio.AioRpcError as exc:
                if _grpc_clean(exc, refusal_due=False):
                    found.refused[f"read {name} {exc.code().name}"] += 1
                else:
                    found.bad(f"{name} on {t.label}: {exc.code().name} {exc.details()}")
                continue
            code = resp.status.error_code
            if code == EC.UNEXPECTED_ERROR:
                found.bad(f"{name} on {t.label}: UNEXPECTED_ERROR {resp.status.reason}")
            elif code != EC.SUCCESS:
                found.refused[f"read {name} {EC.ErrorCode.Name(code)}"] += 1


async def _status_json(t: Target, found: Exhaustion) -> None:
    found.sent["read status.json"] += 1
    try:
        status, body = await http_get(t, "/status.json", _bearer(t))
    except (OSError, TimeoutError) as exc:
        found.bad(f"status.json on {t.label}: {exc!r}")
        return
    if status == 200:
        return
    if status == 503 or (400 <= status < 500 and status not in (401, 403, 421)):
        found.refused[f"read status.json {status}"] += 1
    else:
        found.bad(f"status.json on {t.label}: {status} {body[:80]!r}")


# ----- sampling -------------------------------------------------------------------------------------------------------
class Sampler:
    """Every ``SAMPLE_EVERY``: each target's ``/healthz``, the leader and its fence, the processes, the RSS."""

    def __init__(self, harness: Harness, targets: list[Target], leader: Target, found: Exhaustion, bound: float):
        self.harness, self.targets, self.leader, self.found, self.bound = harness, targets, leader, found, bound
        self.rss0 = {t.pid: rss_mib(t.pid) or 0.0 for t in targets}
        self.over: set[int] = set()
        self.dead: set[str] = set()
        self.fence: tuple[str, int] | None = None
        self.changes: set[tuple[str, int]] = set()

    async def fence_now(self) -> tuple[str, int] | None:
        async with grpc.aio.insecure_channel(self.leader.grpc_address) as ch:
            try:
                s = await qc_grpc.QueryCoordStub(ch).GetCoordinatorState(
                    querycoord_pb2.GetCoordinatorStateRequest(), timeout=PROBE_TIMEOUT * 2)
            except grpc.aio.AioRpcError as exc:
                self.found.problems.append(f"GetCoordinatorState on the leader: {exc.code().name}")
                return None
        return (s.address, s.election_revision) if s.leader else ("not leading", 0)

    async def healthz(self, t: Target) -> None:
        try:
            status, _ = await http_get(t, "/healthz", timeout=PROBE_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            status, reason = 0, repr(exc)
        else:
            reason = f"HTTP {status}"
        if status != 200:
            self.found.healthz_misses += 1
            self.found.problems.append(f"/healthz of {t.label} missed: {reason}")

    async def sample(self) -> None:
        await asyncio.gather(*(self.healthz(t) for t in self.targets))
        fence = await self.fence_now()
        leader = self.harness.leader
        now = (fence[0], fence[1]) if fence else None
        if leader is None or leader.address != self.leader.grpc_address:
            now = (leader.address if leader else "none", -1)
        if now is not None and now != self.fence and now not in self.changes:
            self.changes.add(now)
            self.found.leader_changes += 1
            self.found.problems.append(f"leader or fence now {now}, was {self.fence}")
        for m in self.harness.members:
            if not m.running and m.state != "dead" and m.child.name not in self.dead:
                self.dead.add(m.child.name)
                self.found.processes_died += 1
                self.found.problems.append(f"{m.child.name} exited with {m.child.proc.returncode}")
        for t in self.targets:
            rss = rss_mib(t.pid)
            if rss is None:
                continue
            growth = rss - self.rss0[t.pid]
            self.found.rss_growth_mib = max(self.found.rss_growth_mib, growth)
            if growth > self.bound and t.pid not in self.over:
                self.over.add(t.pid)
                self.found.rss_over_bound += 1
                self.found.problems.append(f"{t.label} grew {growth:.0f} MiB (bound {self.bound:g})")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            await self.sample()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, SAMPLE_EVERY - (time.monotonic() - t0))):
                    await stop.wait()
        await self.sample()  # and once when the attacks are over


async def exhaust(harness: Harness, leader: Target, others: list[Target], collection_id: int,
                  opts: ExhaustionOptions, say: Callable[[str], None] = lambda _s: None) -> Exhaustion:
    """Run every attack of the module docstring at once for ``opts.seconds`` while sampling; the findings."""
    found = Exhaustion(rss_bound_mib=opts.rss_bound_mib)
    targets = [leader, *others]
    secured = [t for t in targets if t.token]
    stop = asyncio.Event()
    sampler = Sampler(harness, targets, leader, found, opts.rss_bound_mib)
    sampler.fence = await sampler.fence_now()
    await sampler.sample()  # the baseline answers before the load
    sampling = asyncio.create_task(sampler.run(stop))
    held = [asyncio.create_task(_hold(leader, stop, found, "http idle", False))
            for _ in range(opts.idle_connections)]
    held += [asyncio.create_task(_hold(leader, stop, found, "http slow", True)) for _ in range(opts.slow_clients)]
    held.append(asyncio.create_task(watch_streams(leader, opts.streams, stop, found)))
    held += [asyncio.create_task(reader_loop(targets[i % len(targets)], collection_id, i, stop, found))
             for i in range(opts.readers)]
    say(f"exhaustion: {opts.idle_connections} idle and {opts.slow_clients} slow HTTP connections, "
        f"{opts.streams} Watch streams, {opts.readers} heavy readers for {opts.seconds:g}s")
    t0 = time.monotonic()
    try:
        once = [big_heads(leader, opts.big_heads, found), big_requests(leader, opts.big_requests, found),
                big_metadata(leader, opts.big_metadata, found), *(guarded_page(t, found) for t in secured)]
        if others:
            once.append(big_requests(others[0], max(1, opts.big_requests // 5), found))
        await asyncio.gather(*once)
        await asyncio.sleep(max(0.0, opts.seconds - (time.monotonic() - t0)))
    finally:
        stop.set()
        done, pending = await asyncio.wait(held, timeout=60)
        if pending:  # every attack ends soon after ``stop``: one that does not is a bug of this module
            found.bad(f"{len(pending)} attacks still running 60 s after the phase: "
                      f"{sorted({repr(task.get_coro())[:60] for task in pending})}")
        for task in pending:
            task.cancel()
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                found.bad(f"attack failed: {task.exception()!r}")
        await sampling
    if not secured:
        found.problems.append("no coordinator with a principals file: the reader role was not exercised")
    return found


__all__ = ["COUNTS", "Exhaustion", "ExhaustionOptions", "Target", "exhaust", "target", "write_principals"]
