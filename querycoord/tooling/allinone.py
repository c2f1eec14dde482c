"""The all-in-one cluster as processes: embedded etcd, coordinators (one leads), N reference query nodes.

Used by ``querycoord up`` and by the demo, so both start and stop the cluster
the same way. Every part is a real process (``python -m querycoord.cli coord``
/ ``querynode`` / ``streamnode``), as in a deployment: killing one with a
signal is a real crash, not a simulation. Once etcd is up, the processes are
started, followed and stopped by one ``querycoord.tooling.harness.Harness``
(as the drills' are); its ``Member``s are this cluster's ``coordinators``,
``nodes`` and ``stream_nodes``.

No process is left behind, whatever happens to us:

* every child is a ``meta.ops.child.ChildProcess``: started through
  ``setpriv --pdeathsig KILL`` (as the etcd launcher does), so the kernel SIGKILLs it when we die, even by SIGKILL;
  the signal is tied to the thread that forked, and ``asyncio`` forks on the
  event-loop thread, which lives as long as we run;
* every child runs in its own session, so a terminal's Ctrl-C reaches only
  us and we stop the children in order: the coordinators first (the
  standbys, then the leader, so no standby takes over from a resigning
  leader; the leader resigns, so it does not start moving the nodes'
  segments around as they leave), then the nodes (they revoke their
  sessions), then etcd; each gets SIGTERM, then SIGKILL after
  ``stop_timeout``.

With several coordinators (``coordinators=2``, as the demo runs) one leads
and the others stand by; which one leads is the harness's answer (the latest
``leader``/``standby`` event). ``kill_leader`` SIGKILLs the leader and
``wait_new_leader`` waits for a standby's ``leader`` event (emitted once it
has reloaded and resumed the persisted tasks; the checker then compares with the nodes).

Optional reference stream nodes (``stream_nodes=N``, default none; the demo
runs three) heartbeat to the coordinators' StreamMgmt service; each is started
with ``--snode``, so it hosts the snode that ``CreateSnode`` creates for it.
By default stream node ``i`` leads vgroup ``i + 1``; ``stream_vgroups`` chooses.
They stop with the query nodes, after the coordinators.

Children log to files in the data dir named as ``up`` names the processes:
``coordinator-<n>.log`` (``n`` from 1), ``querynode-<id>.log`` and
``streamnode-<id>.log`` by node id (a node logs to ``querynode-new-<i>.log``
until it has its id; a node restarted under its id appends to its file), and
``etcd.log`` (a link to etcd's own log while it runs; the log itself once a
temporary data dir is removed). The terminal shows only what the caller
prints; a child that fails to start is reported with the tail of its log.

``etcd_port``: etcd's client port (0: the port a kept data dir used before,
else any free one). ``http_listen``: the first coordinator's HTTP address
(metrics, probes, status page). ``child_args``: options every child gets
(log format, gRPC security, the configuration file), after its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from meta.address import on_port
from meta.ops.child import log_tail
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.tooling.harness import COORDINATOR, QUERY_NODE, STREAM_NODE, Harness, Member, StartError
from querycoord.tooling.up_checks import data_dir_problem, listen_problem

DEFAULT_LISTEN = "127.0.0.1:19531"
DEFAULT_ROOT = "querycoord"


def member_label(member: Member) -> str:
    """How ``up`` names a process: ``query node 3`` (by the id it printed), ``coordinator 127.0.0.1:19531``."""
    if member.role == COORDINATOR:
        return f"coordinator {member.address}".rstrip()
    return f"{member.role} {member.node_id}" if member.node_id else member.child.name


async def _all_started(starts: Sequence[Awaitable[Member]]) -> list[Member]:
    """Run the starts concurrently; raise the first failure only once every start is over.

    A start that fails stops its own process, and one that succeeds is a
    harness member, so ``stop`` finds every process however the others ended.
    """
    members: list[Member] = []
    for result in await asyncio.gather(*starts, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result
        members.append(result)
    return members


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target`` (relative, so a moved data dir keeps it), replacing an older link or file."""
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    with contextlib.suppress(OSError):
        link.symlink_to(os.path.relpath(target, link.parent))


class AllInOne:
    """etcd + ``coordinators`` coordinators + ``nodes`` query nodes, each a process (see module docstring).

    The first coordinator listens on ``listen``; the others on any free port
    of the same host.

    ``data_dir`` None: a temporary directory, removed by ``stop`` (with
    ``keep_logs``, all but the logs: a user who was shown where a process
    logs finds the log there once the cluster is stopped); a given directory
    is kept (etcd data survives restarts). ``ttl`` is the session
    TTL of the coordinator and the nodes: how fast a crash is noticed.
    ``coord_args`` / ``node_args`` are extra command-line options (scheduler
    knobs, fault injection).

    ``stream_nodes`` reference stream nodes (``querycoord streamnode --snode``)
    start after the query nodes; ``stream_vgroups[i]`` lists the vgroups node
    ``i`` leads (default ``[i + 1]``); ``stream_node_args`` are extra options
    (``--heartbeat-ms`` ...).

    A failed start raises ``harness.StartError`` (``ClusterStartError``).
    """

    def __init__(
        self,
        *,
        nodes: int = 3,
        coordinators: int = 1,
        listen: str = DEFAULT_LISTEN,
        data_dir: str | Path | None = None,
        ttl: float = 10.0,
        root: str = DEFAULT_ROOT,
        node_capacity_mb: float = 1024,
        coord_args: Sequence[str] = (),
        node_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_level: str | None = None,
        stop_timeout: float = 10.0,
        start_timeout: float = 60.0,
        temp_prefix: str = "querycoord-up-",
        keep_logs: bool = False,
        stream_nodes: int = 0,
        stream_vgroups: Sequence[Sequence[int]] | None = None,
        stream_node_args: Sequence[str] = (),
        etcd_port: int = 0,
        http_listen: str = "",
        child_args: Sequence[str] = (),
    ):
        if nodes < 0:
            raise ValueError(f"the number of query nodes must be >= 0, got {nodes}")
        if stream_nodes < 0:
            raise ValueError(f"the number of stream nodes must be >= 0, got {stream_nodes}")
        if stream_vgroups is not None and len(stream_vgroups) != stream_nodes:
            raise ValueError(f"stream_vgroups lists {len(stream_vgroups)} nodes, not {stream_nodes}")
        if coordinators < 1:
            raise ValueError(f"the number of coordinators must be >= 1, got {coordinators}")
        if ttl < 2:
            raise ValueError(f"--ttl must be at least 2 seconds, got {ttl}")
        self.num_nodes = nodes
        self.num_coordinators = coordinators
        self.listen = listen
        self._temp = data_dir is None
        self.keep_logs = keep_logs
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix=temp_prefix))
        self.ttl = ttl
        self.root = root
        self.node_capacity_mb = node_capacity_mb
        self.coord_args = list(coord_args)
        self.node_args = list(node_args)
        self.env = env
        self.log_level = log_level
        self.stop_timeout = stop_timeout
        self.start_timeout = start_timeout
        self.etcd: EtcdCluster | None = None
        self.harness: Harness | None = None  # once etcd is up
        self._next_index: Counter[str] = Counter()  # per role: indices are handed out before the starts end
        self.killed_leader: Member | None = None
        self.killed_at = 0.0
        self.num_stream_nodes = stream_nodes
        self.stream_vgroups = [list(v) for v in stream_vgroups] if stream_vgroups is not None else None
        self.stream_node_args = list(stream_node_args)
        self.etcd_port = etcd_port
        self.http_listen = http_listen
        self.child_args = list(child_args)
        self._stopped = False

    @property
    def keeps_data(self) -> bool:
        """Whether ``data_dir`` outlives ``stop`` (it was given, not a temporary one)."""
        return not self._temp

    # ----- members and addresses ------------------------------------------------------------------------------------
    def _members(self, role: str) -> list[Member]:
        """In start order (the harness lists members in the order they got ready)."""
        return sorted(self.harness.of(role), key=lambda m: m.index) if self.harness is not None else []

    @property
    def coordinators(self) -> list[Member]:
        return self._members(COORDINATOR)

    @property
    def nodes(self) -> list[Member]:
        return self._members(QUERY_NODE)

    @property
    def stream_nodes(self) -> list[Member]:
        return self._members(STREAM_NODE)

    @property
    def etcd_endpoints(self) -> list[str]:
        return self.etcd.endpoints if self.etcd is not None else []

    @property
    def coordinator(self) -> Member | None:
        """The running leader, else the first coordinator (with one coordinator: that one, even once it died)."""
        leader = self.harness.leader if self.harness is not None else None
        coords = self.coordinators
        return leader or (coords[0] if coords else None)

    @property
    def coordinator_address(self) -> str:
        """The address of ``coordinator`` ("" before it is ready)."""
        coord = self.coordinator
        return coord.address if coord is not None else ""

    @property
    def coordinator_addresses(self) -> list[str]:
        """Every coordinator's address, the leader's first."""
        lead = self.coordinator_address
        return [*([lead] if lead else []), *(c.address for c in self.coordinators if c.address and c.address != lead)]

    def client(self, **kwargs: Any) -> QueryCoordClient:
        """A client of this cluster's coordinators, following the leader (the caller closes it)."""
        return QueryCoordClient(self.coordinator_addresses, **kwargs)

    def _harness(self) -> Harness:
        if self.harness is None:
            raise RuntimeError("the cluster is not started (etcd is not up)")
        return self.harness

    def _indices(self, role: str, n: int) -> range:
        first = self._next_index[role]
        self._next_index[role] += n
        return range(first, first + n)

    # ----- start ------------------------------------------------------------------------------------------------
    async def start(self) -> AllInOne:
        """Start etcd, the coordinator (until it leads), the nodes (until the leader sees them online).

        On failure everything started so far is stopped and ``StartError`` says what failed.
        """
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        return self

    def _check_listen(self) -> None:
        problem = listen_problem(self.listen)
        if problem:
            raise StartError(problem)

    async def _start(self) -> None:
        self._check_listen()
        problem = data_dir_problem(self.data_dir)
        if problem:
            raise StartError(problem)
        etcd = EtcdCluster(self.data_dir / "etcd", size=1, client_ports=(self.etcd_port,) if self.etcd_port else ())
        self.etcd = etcd
        try:
            await asyncio.to_thread(etcd.start)
        except Exception as exc:
            raise StartError(f"embedded etcd did not start: {exc}") from exc
        _link(self.etcd_log, etcd.members[0].log_path)
        self.harness = Harness(etcd.endpoints, self.root, self.data_dir, ttl=self.ttl, env=self.env,
                               log_level=self.log_level, start_timeout=self.start_timeout)
        await self.add_coordinators(self.num_coordinators)
        try:
            await self.wait_new_leader(after=0.0, timeout=self.start_timeout)
        except (EOFError, TimeoutError) as exc:
            what = str(exc) or f"no leader within {self.start_timeout:.0f}s"
            coord = self.coordinators[0]
            raise StartError(f"no coordinator became leader: {what}; the log of the first one "
                             f"{coord.child.log_path}:\n{log_tail(coord.child.log_path)}") from exc
        await self.add_nodes(self.num_nodes)
        if self.num_stream_nodes:
            vgroups = self.stream_vgroups or [[i + 1] for i in range(self.num_stream_nodes)]
            await self.add_stream_nodes(vgroups)

    @property
    def etcd_log(self) -> Path:
        return self.data_dir / "etcd.log"

    def coord_log(self, index: int) -> Path:
        return self.data_dir / f"coordinator-{index + 1}.log"

    def node_log(self, role: str, node_id: int | str) -> Path:
        return self.data_dir / f"{'streamnode' if role == STREAM_NODE else 'querynode'}-{node_id}.log"

    def coord_flags(self, index: int, http: str | None = None) -> list[str]:
        """The options of coordinator ``index`` after its listen address; ``http``: its HTTP address instead of
        ``http_listen`` (a restart keeps the port it had)."""
        http = http or (self.http_listen if index == 0 else "")
        return [*self.coord_args, *(["--http-listen", http] if http else []), *self.child_args]

    def _named(self, member: Member) -> Member:
        """Move a node's log to the name of its id, which it has once ready (the process keeps writing to it)."""
        target = self.node_log(member.role, member.node_id)
        path = member.child.log_path
        if path is not None and path != target and member.node_id:
            os.replace(path, target)
            member.child.log_path = target
        return member

    async def add_coordinators(self, n: int) -> list[Member]:
        """Start ``n`` more coordinators and wait until each is ready (listens); they campaign on their own."""
        harness = self._harness()
        # The first takes ``listen``; the others any free port of that host.
        return await _all_started([
            harness.start_coordinator(i, self.listen if i == 0 else on_port(self.listen, 0), *self.coord_flags(i),
                                      log_path=self.coord_log(i))
            for i in self._indices(COORDINATOR, n)])

    async def add_nodes(self, n: int) -> list[Member]:
        """Start ``n`` more query nodes and wait until the leader lists them online (so loads can use them)."""
        harness = self._harness()
        new = await _all_started([
            harness.start_node(QUERY_NODE, i, "--capacity-mb", f"{self.node_capacity_mb:g}", *self.node_args,
                               *self.child_args, log_path=self.node_log(QUERY_NODE, f"new-{i}"))
            for i in self._indices(QUERY_NODE, n)])
        await self.wait_nodes_online([self._named(x).node_id for x in new])
        return new

    async def restart_coordinator(self, member: Member) -> Member:
        """Start an exited coordinator again: same address (while free), HTTP address and log; it campaigns, and
        leads once the dead one's lease lapsed (``wait_new_leader``)."""
        http = str(member.ready.get("http_address", "")) or None
        return await self._harness().restart_coordinator(member, *self.coord_flags(member.index, http),
                                                         log_path=self.coord_log(member.index))

    async def restart_node(self, member: Member) -> Member:
        """Start an exited query node again under its id, on its old address while free (the new process waits
        for the old session to lapse, then registers a new incarnation holding nothing); until the leader lists
        it online."""
        harness = self._harness()
        node_id = member.node_id
        flags = ["--capacity-mb", f"{self.node_capacity_mb:g}", "--node-id", str(node_id), *self.node_args,
                 *self.child_args]
        listen = str(member.ready.get("listen_address", "")) or "127.0.0.1:0"
        log = self.node_log(QUERY_NODE, node_id)
        try:
            await harness.start_node(QUERY_NODE, member.index, *flags, "--listen", listen, member=member, log_path=log)
        except StartError:
            if listen.endswith(":0"):
                raise
            await harness.start_node(QUERY_NODE, member.index, *flags, "--listen", on_port(listen, 0), member=member,
                                     log_path=log)
        await self.wait_nodes_online([node_id])
        return member

    async def add_stream_nodes(self, vgroups: Sequence[Sequence[int]]) -> list[Member]:
        """Start one stream node per entry of ``vgroups`` (the vgroups it leads); wait until each registered.

        A stream node's ready event lists its vgroups (``member.ready["vgroups"]``).
        """
        harness = self._harness()
        new = await _all_started([
            harness.start_node(STREAM_NODE, i, "--snode", "--vgroups", ",".join(map(str, v)), *self.stream_node_args,
                               *self.child_args, log_path=self.node_log(STREAM_NODE, f"new-{i}"))
            for i, v in zip(self._indices(STREAM_NODE, len(vgroups)), vgroups, strict=True)])
        return [self._named(x) for x in new]

    async def wait_nodes_online(self, node_ids: Sequence[int], timeout: float | None = None) -> None:
        """Until ShowNodes on the leader lists every id in ``node_ids`` as online."""
        want = set(node_ids)
        if not want:
            return
        deadline = time.monotonic() + (timeout or self.start_timeout)
        async with self.client(deadline=5.0) as c:
            while True:
                try:
                    resp = await c.query("ShowNodes", qc.ShowNodesRequest())
                    online = {n.node_id for n in resp.nodes if n.state == "online"}
                    if resp.status.error_code == common_pb2.SUCCESS and want <= online:
                        return
                except CoordinatorUnavailable:
                    pass
                if time.monotonic() > deadline:
                    coord = self.coordinator
                    raise StartError(f"query nodes {sorted(want)} registered but the coordinator does not "
                                     f"list them online; see {coord.child.log_path if coord else self.data_dir}")
                await asyncio.sleep(0.1)

    # ----- while running ----------------------------------------------------------------------------------------
    def exited(self) -> list[Member]:
        """Members whose process is no longer running (and was not killed or stopped by us)."""
        return self.harness.exited() if self.harness is not None else []

    async def kill_leader(self) -> float:
        """SIGKILL the leading coordinator (a real crash; kept in ``killed_leader``); returns the time of the kill.

        A standby takes over once the dead leader's lease lapses (within the TTL); see ``wait_new_leader``.
        """
        harness = self._harness()
        leader = harness.leader
        if leader is None:
            raise RuntimeError("no running leading coordinator to kill")
        self.killed_leader = leader
        self.killed_at = at = time.time()
        await harness.kill(leader)
        return at

    async def wait_new_leader(self, after: float | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """The "leader" event of the coordinator that leads, once it said so later than ``after`` (default: the
        last kill).

        The event carries ``address``, ``server_id`` and ``t`` (when it started serving: after reloading and
        resuming the persisted tasks). TimeoutError if none within ``timeout``; EOFError if every
        coordinator is gone.
        """
        leader = await self._harness().wait_leader(timeout, self.killed_at if after is None else after)
        return next(ev for ev in reversed(leader.child.events) if ev.get("event") == "leader")

    def etcd_running(self) -> bool:
        return self.etcd is not None and all(m.running for m in self.etcd.members)

    async def kill_node(self, node: Member) -> int:
        """SIGKILL a query node: a real crash; its session lapses after the TTL."""
        return await self._harness().kill(node)

    async def kill_stream_node(self, node: Member) -> int:
        """SIGKILL a stream node: a real crash; its session lapses after the TTL (the leader then calls it lost)."""
        return await self._harness().kill(node)

    # ----- stop ---------------------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Coordinators (standbys, then the leader), then query and stream nodes, then etcd.

        Each gets SIGTERM, then SIGKILL after ``stop_timeout``.

        Safe to call twice.
        """
        if self._stopped:
            return
        self._stopped = True
        if self.harness is not None:
            await self.harness.stop(self.stop_timeout)
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop)
        if self._temp:
            if self.keep_logs and self.etcd is not None and self.etcd.members:
                with contextlib.suppress(OSError):  # the link would point into the removed etcd dir
                    os.replace(self.etcd.members[0].log_path, self.etcd_log)
            shutil.rmtree(self.data_dir / "etcd" if self.keep_logs else self.data_dir, ignore_errors=True)

    async def __aenter__(self) -> AllInOne:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# The name ``querycoord up`` and the demo knew; a failed start is the harness's error.
ClusterStartError = StartError

__all__ = ["DEFAULT_LISTEN", "DEFAULT_ROOT", "AllInOne", "ClusterStartError", "data_dir_problem",
           "listen_problem", "member_label"]
