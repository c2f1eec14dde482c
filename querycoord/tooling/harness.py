"""One cluster harness: start, restart, kill and stop coordinators and nodes as real processes.

``querycoord up``, the demo, the failover, chaos and stream drills and the
tests all start their processes here, so there is one answer to "how is a
coordinator started" (always ``querycoord coord`` with its flags), "what does
a failed start say" (the error names the process and quotes its log), and
"which coordinator leads" (the latest leader/standby event by its time).

A ``Member`` is a slot of the cluster (coordinator 0, query node 2...): it
survives restarts, each of which gives it a new ``ChildProcess`` and bumps its
``generation``. Events of a process that was since replaced are ignored, and
events that arrive before the member exists (a fast first leader) are
replayed into it, so an ``on_event`` hook sees each event of the current
process exactly once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meta.address import on_port
from meta.ops.child import ChildProcess, child_env, log_tail

COORDINATOR = "coordinator"
QUERY_NODE = "query node"
STREAM_NODE = "stream node"

# The sub-command and the log-file prefix of each role.
_COMMAND = {COORDINATOR: "coord", QUERY_NODE: "querynode", STREAM_NODE: "streamnode"}
_PREFIX = {COORDINATOR: "coord", QUERY_NODE: "node", STREAM_NODE: "streamnode"}


class StartError(Exception):
    """A process did not get to its ready event; the message names it and quotes its log."""


@dataclass(eq=False)
class Member:
    """One slot of the cluster and its current process (see module docstring).

    ``state`` of a coordinator: "starting", then "leader" / "standby" as its
    events say; "dead" once the harness killed it. ``ready`` is the current
    process's ready event (address, node_id, pid...).
    """

    role: str
    index: int
    child: ChildProcess
    ready: dict[str, Any] = field(default_factory=dict)
    generation: int = 0
    state: str = "starting"
    state_t: float = 0.0

    @property
    def address(self) -> str:
        return str(self.ready.get("address", ""))

    @property
    def node_id(self) -> int:
        return int(self.ready.get("node_id", 0))

    @property
    def label(self) -> str:
        """``c0.1 127.0.0.1:4242`` (coordinator 0, second process) / ``n2.0`` (query or stream node 2)."""
        tag = f"{'c' if self.role == COORDINATOR else 'n'}{self.index}.{self.generation}"
        return f"{tag} {self.address}" if self.role == COORDINATOR and self.address else tag

    @property
    def running(self) -> bool:
        return self.child.running


EventHook = Callable[[Member, dict[str, Any]], None]


def coord_argv(etcd_endpoints: str | Sequence[str], root: str, listen: str, ttl: float, *flags: str,
               log_level: str | None = None) -> list[str]:
    """``python <argv>`` runs ``querycoord coord`` with these options (``flags`` appended)."""
    return _role_argv(COORDINATOR, etcd_endpoints, root, "--listen", listen, "--ttl", f"{ttl:g}", *flags,
                      log_level=log_level)


def node_argv(role: str, etcd_endpoints: str | Sequence[str], root: str, *flags: str,
              log_level: str | None = None) -> list[str]:
    """``python <argv>`` runs ``querycoord querynode`` / ``streamnode`` (``role``) with ``flags``.

    A query node gets ``--graceful-stop-timeout 0`` before ``flags`` (which may set it again): the tooling stops
    whole clusters with SIGTERM, and a node asking to be drained while every other one stops too would only
    wait out its timeout."""
    if role == QUERY_NODE:
        flags = ("--graceful-stop-timeout", "0", *flags)
    return _role_argv(role, etcd_endpoints, root, *flags, log_level=log_level)


def _role_argv(role: str, etcd_endpoints: str | Sequence[str], root: str, *flags: str,
               log_level: str | None) -> list[str]:
    endpoints = etcd_endpoints if isinstance(etcd_endpoints, str) else ",".join(etcd_endpoints)
    return ["-m", "querycoord.cli", *(["--log-level", log_level] if log_level else []), _COMMAND[role],
            "--etcd-endpoints", endpoints, "--root", root, *flags]


class Harness:
    """The processes of one cluster whose etcd is at ``etcd_endpoints`` under meta root ``root``.

    Logs go to ``work/<coord|node|streamnode>-<index>.<generation>.log``.
    ``on_event(member, event)`` sees every event of every member's current
    process (after the harness updated ``member.state``).
    """

    def __init__(self, etcd_endpoints: Sequence[str], root: str, work: Path, *, ttl: float = 10.0,
                 env: Mapping[str, str] | None = None, log_level: str | None = "INFO", start_timeout: float = 60.0,
                 on_event: EventHook | None = None):
        self.etcd_endpoints = list(etcd_endpoints)
        self.root = root
        self.work = Path(work)
        self.ttl = ttl
        self.env = child_env(env)
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.on_event = on_event
        self.members: list[Member] = []
        self.changed = asyncio.Event()  # set on every event; waiters clear it

    # ----- who is there ---------------------------------------------------------------------------------------------
    def of(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    @property
    def coordinators(self) -> list[Member]:
        return self.of(COORDINATOR)

    @property
    def leader(self) -> Member | None:
        """The running coordinator whose latest role event says it leads (the most recent such, by event time)."""
        leading = [m for m in self.coordinators if m.state == "leader" and m.running]
        return max(leading, key=lambda m: m.state_t) if leading else None

    def exited(self) -> list[Member]:
        """Members whose process is no longer running and was not killed or stopped by the harness."""
        return [m for m in self.members if not m.running and m.state != "dead"]

    # ----- start ----------------------------------------------------------------------------------------------------
    async def start(self, role: str, index: int, argv: Sequence[str], *, member: Member | None = None,
                    stdin: bool = False, name: str | None = None, log_path: Path | None = None) -> Member:
        """Run ``python <argv>`` as ``role`` ``index`` and wait for its ready event.

        With ``member`` the new process replaces that member's (dead) one. A
        process that does not get ready within ``start_timeout`` is stopped and
        ``StartError`` quotes its log. ``log_path``: where it logs instead of
        the harness's name for it (appended to, so a restart can keep one file).
        """
        generation = 0 if member is None else member.generation + 1
        log = log_path or self.work / f"{_PREFIX[role]}-{index}.{generation}.log"
        holder: list[Member] = []
        child = await ChildProcess.spawn(name or f"{role} {'c' if role == COORDINATOR else 'n'}{index}.{generation}",
                                         argv, log_path=log, env=self.env, stdin=stdin,
                                         sink=lambda ch, ev: self._event(holder[0], ch, ev) if holder else None)
        try:
            ready = await child.wait_event("ready", timeout=self.start_timeout)
        except (EOFError, TimeoutError) as exc:
            await child.stop()
            raise StartError(f"{child.name} did not start: {exc or 'timeout'}; its log {log}:\n"
                             f"{log_tail(log)}") from exc
        except asyncio.CancelledError:  # not a member yet, so ``stop`` would not find it
            await child.stop()
            raise
        if member is None:
            member = Member(role, index, child, ready)
            self.members.append(member)
        else:
            member.child, member.ready, member.generation = child, ready, generation
            member.state, member.state_t = "starting", 0.0
        holder.append(member)
        for ev in list(child.events):  # what arrived before the member existed
            self._event(member, child, ev)
        return member

    async def start_coordinator(self, index: int, listen: str, *flags: str, member: Member | None = None,
                                etcd: str | Sequence[str] | None = None, log_path: Path | None = None) -> Member:
        """``querycoord coord`` on ``listen`` with ``flags`` (``etcd``: other endpoints, e.g. a proxy)."""
        argv = coord_argv(self.etcd_endpoints if etcd is None else etcd, self.root, listen, self.ttl, *flags,
                          log_level=self.log_level)
        return await self.start(COORDINATOR, index, argv, member=member, log_path=log_path)

    async def start_node(self, role: str, index: int, *flags: str, member: Member | None = None,
                         etcd: str | Sequence[str] | None = None, log_path: Path | None = None) -> Member:
        """``querycoord querynode`` / ``streamnode`` with the harness's TTL and ``flags``; a stream node gets its
        stdin control channel (``Member.command``)."""
        argv = node_argv(role, self.etcd_endpoints if etcd is None else etcd, self.root, "--ttl", f"{self.ttl:g}",
                         *flags, log_level=self.log_level)
        return await self.start(role, index, argv, member=member, stdin=role == STREAM_NODE, log_path=log_path)

    async def restart_coordinator(self, member: Member, *flags: str, attempts: int = 6,
                                  etcd: str | Sequence[str] | None = None,
                                  say: Callable[[str], None] | None = None, log_path: Path | None = None) -> Member:
        """Start a killed coordinator again, on its old address while that is free.

        A coordinator cannot start while etcd is unreachable (it exits), so
        this retries with a growing pause; the second half of the attempts
        takes a fresh port in case the old one was taken.
        """
        old = member.address
        for attempt in range(1, attempts + 1):
            listen = old if attempt <= attempts // 2 and old else on_port(old, 0)
            try:
                return await self.start_coordinator(member.index, listen, *flags, member=member, etcd=etcd,
                                                    log_path=log_path)
            except StartError as exc:
                if attempt == attempts:
                    raise
                if say is not None:
                    say(f"c{member.index} did not restart on {listen} ({str(exc).splitlines()[0]}); retrying")
                await asyncio.sleep(2.0 * attempt)
        raise AssertionError("unreachable")

    # ----- events ---------------------------------------------------------------------------------------------------
    def _event(self, member: Member, child: ChildProcess, event: dict[str, Any]) -> None:
        if member.child is not child:
            return  # a process this member has since replaced
        kind = event.get("event")
        if kind in ("leader", "standby"):
            member.state, member.state_t = str(kind), float(event.get("t", time.time()))
        if self.on_event is not None:
            self.on_event(member, event)
        self.changed.set()

    async def wait_leader(self, timeout: float, after: float = 0.0) -> Member:
        """The leader, once one leads that said so after ``after`` (event time); TimeoutError after ``timeout``;
        EOFError if every coordinator exited."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader
            if leader is not None and leader.state_t > after:
                return leader
            coords = self.coordinators
            if coords and not any(m.running for m in coords):
                raise EOFError("every coordinator exited: " + ", ".join(
                    f"{m.child.name} with code {m.child.proc.returncode}" for m in coords))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no coordinator became leader within {timeout:.0f}s")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 0.1))
            except TimeoutError:
                pass

    # ----- kill and stop --------------------------------------------------------------------------------------------
    async def kill(self, member: Member, sig: int = signal.SIGKILL) -> int:
        """A real crash (SIGKILL, after SIGCONT) or another signal; returns the exit code (SIGKILL) or 0."""
        member.state = "dead"
        if sig == signal.SIGKILL:
            return await member.child.kill()
        member.child.signal(sig)
        return 0

    async def stop(self, timeout: float = 5.0) -> None:
        """Standby coordinators, then the leader (so it resigns rather than balancing departing nodes), then nodes;
        each gets SIGTERM, then SIGKILL after ``timeout``."""
        leader = self.leader
        for m in self.members:
            m.state = "dead"
        coords = self.coordinators
        await asyncio.gather(*(m.child.stop(timeout) for m in coords if m is not leader), return_exceptions=True)
        if leader is not None:
            await asyncio.gather(leader.child.stop(timeout), return_exceptions=True)
        await asyncio.gather(*(m.child.stop(timeout) for m in self.members if m.role != COORDINATOR),
                             return_exceptions=True)


__all__ = ["COORDINATOR", "QUERY_NODE", "STREAM_NODE", "EventHook", "Harness", "Member", "StartError", "coord_argv",
           "node_argv"]
