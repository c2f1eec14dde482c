"""While ``up`` runs: a process of the cluster that exits is said and started again, within a restart budget.

A coordinator that exits (a crash, a lost session, a SIGKILL) is restarted on
its address, with its HTTP address, root and log: it takes over from etcd
(reloads the query meta, resumes the persisted tasks) once the dead one's
lease lapsed, and the nodes, which keep their own sessions, stay registered.
A query node that exits is restarted under its id (the new process waits for
the old session to lapse). Each is said in one line on stderr.

Restarts are bounded: a process that exits more than ``limit`` times within
``window`` seconds is not restarted again. For the coordinator that ends the
cluster (``failed`` says why); a query node is left down, said once.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from collections.abc import Callable

from querycoord.tooling.allinone import AllInOne
from querycoord.tooling.harness import COORDINATOR, QUERY_NODE, Member, StartError

RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0


def exit_text(code: int | None) -> str:
    """``code 1``, ``code -9 (SIGKILL)``."""
    if code is not None and code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


class RestartBudget:
    """At most ``limit`` restarts within any ``window`` seconds."""

    def __init__(self, limit: int = RESTART_LIMIT, window: float = RESTART_WINDOW_S):
        self.limit = limit
        self.window = window
        self.times: deque[float] = deque()

    def spend(self, now: float) -> bool:
        """Count an exit at ``now``; False when it is one more than the budget allows."""
        while self.times and now - self.times[0] > self.window:
            self.times.popleft()
        self.times.append(now)
        return len(self.times) <= self.limit


class UpWatch:
    """Follows ``cluster`` (see module docstring); ``say`` prints one line (stderr), ``tell`` one on stdout."""

    def __init__(self, cluster: AllInOne, say: Callable[[str], None], tell: Callable[[str], None], *,
                 limit: int = RESTART_LIMIT, window: float = RESTART_WINDOW_S):
        self.cluster = cluster
        self.say = say
        self.tell = tell
        self.limit = limit
        self.window = window
        self.failed: str | None = None  # why the cluster must stop
        self._budgets: dict[int, RestartBudget] = {}
        self._restarts: dict[int, int] = {}
        self._restarting: dict[int, asyncio.Task[None]] = {}
        self._given_up: set[int] = set()

    def poll(self) -> None:
        """Look once: say and restart what exited; set ``failed`` when the cluster cannot go on."""
        for member in self.cluster.exited():
            key = id(member)
            if key in self._restarting or key in self._given_up:
                continue
            self._exited(member, key)
        if not self.cluster.etcd_running() and self.failed is None:
            self.failed = f"etcd exited; see {self.cluster.etcd_log}"

    def _exited(self, member: Member, key: int) -> None:
        child = member.child
        what = "coordinator" if member.role == COORDINATOR else f"{member.role} {member.node_id}"
        where = f"{member.address}, " if member.role != COORDINATOR and member.address else ""
        gone = f"{what} ({where}pid {child.pid}) exited with {exit_text(child.proc.returncode)}"
        budget = self._budgets.setdefault(key, RestartBudget(self.limit, self.window))
        if member.role not in (COORDINATOR, QUERY_NODE):
            self._given_up.add(key)
            self.say(f"warning: {gone}; see {child.log_path}")
            return
        if not budget.spend(time.monotonic()):
            self._given_up.add(key)
            times = f"{self.limit + 1} times within {self.window:g}s"
            if member.role == COORDINATOR:
                self.failed = f"{gone}, {times}; not restarting it again; see {child.log_path}"
            else:
                self.say(f"warning: {gone}, {times}; not restarting it again; see {child.log_path}")
            return
        n = self._restarts[key] = self._restarts.get(key, 0) + 1
        how = "" if member.role == COORDINATOR else " under its id"
        self.say(f"warning: {gone}; restarting it{how} (restart {n}); see {child.log_path}")
        self._restarting[key] = asyncio.create_task(self._restart(member, key, what))

    async def _restart(self, member: Member, key: int, what: str) -> None:
        try:
            if member.role == COORDINATOR:
                await self.cluster.restart_coordinator(member)
                self.tell(f"restarted: coordinator {member.address} (pid {member.child.pid}); it leads once the "
                          f"old one's session lapsed")
            else:
                await self.cluster.restart_node(member)
                self.tell(f"restarted: {what} {member.address} (pid {member.child.pid})")
        except StartError as exc:
            self._given_up.add(key)
            why = str(exc).splitlines()[0]
            if member.role == COORDINATOR:
                self.failed = f"the coordinator could not be restarted: {why}"
            else:
                self.say(f"warning: {what} could not be restarted: {why}")
        finally:
            self._restarting.pop(key, None)

    async def close(self) -> None:
        """Cancel the restarts in progress (each stops the process it started)."""
        tasks = list(self._restarting.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["RESTART_LIMIT", "RESTART_WINDOW_S", "RestartBudget", "UpWatch", "exit_text"]
