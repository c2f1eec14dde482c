"""The all-in-one cluster as processes: embedded etcd, coordinators (one leads), N reference query nodes.

Used by ``querycoord up`` and by the demo, so both start and stop the cluster
the same way. Every part is a real process (``python -m querycoord.cli coord``
/ ``querynode``), as in a deployment: killing one with a signal is a real
crash, not a simulation.

No process is left behind, whatever happens to us:

* every child is a ``meta.child.ChildProcess``: started through
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
and the others stand by; which one leads is followed from their
``leader``/``standby`` events. ``kill_leader`` SIGKILLs the leader and
``wait_new_leader`` waits for a standby's ``leader`` event (emitted once it
has reloaded and resumed the persisted tasks; the checker then compares with the nodes).

Optional reference stream nodes (``stream_nodes=N``, default none; the demo
runs three) heartbeat to the coordinators' StreamMgmt service; each is started
with ``--snode``, so it hosts the snode that ``CreateSnode`` creates for it.
By default stream node ``i`` leads vgroup ``i``; ``stream_vgroups`` chooses.
They stop with the query nodes, after the coordinators.

Children log to files in the data dir (``coordinator.log``,
``coordinator-<i>.log`` for the second and later ones, ``node-<i>.log``,
``streamnode-<i>.log``)
so the terminal shows only what the caller prints; a child that fails to
start is reported with the tail of its log.
"""

from __future__ import annotations

import asyncio
import errno
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meta.child import ChildProcess, child_env, log_tail
from meta.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.client import CoordinatorUnavailable, QueryCoordClient

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LISTEN = "127.0.0.1:19531"
DEFAULT_ROOT = "querycoord"


class ClusterStartError(Exception):
    """A part of the cluster did not come up; the message names it and quotes its log."""


def listen_problem(listen: str) -> str | None:
    """Why a coordinator cannot take ``listen`` (malformed, or someone listens there now), or None.

    gRPC binds with SO_REUSEPORT, so a second coordinator on a busy port
    would start "successfully" and share the port with the first one:
    clients would be spread over two unrelated clusters. A plain bind
    (SO_REUSEADDR, not SO_REUSEPORT) fails only if someone listens there now.
    """
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or not host:
        return f"listen address {listen!r} is not host:port (e.g. 127.0.0.1:19531, or port 0 for any free port)"
    if int(port) == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a recently closed port (TIME_WAIT) is free
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                why += " (another `querycoord up` or coordinator?); stop it or choose another --listen"
            return f"cannot listen on {listen}: {why}"
    return None


class CoordinatorProcess(ChildProcess):
    """A coordinator child; ``address`` comes from its ready event."""

    address: str = ""


class NodeProcess(ChildProcess):
    """A query node child; ``node_id`` and ``address`` come from its ready event."""

    node_id: int = 0
    address: str = ""


class StreamNodeProcess(ChildProcess):
    """A stream node child; ``node_id`` and ``vgroups`` come from its ready event."""

    node_id: int = 0
    vgroups: tuple[int, ...] = ()


class AllInOne:
    """etcd + ``coordinators`` coordinators + ``nodes`` query nodes, each a process (see module docstring).

    The first coordinator listens on ``listen``; the others on any free port
    of the same host.

    ``data_dir`` None: a temporary directory, removed by ``stop``; a given
    directory is kept (etcd data survives restarts). ``ttl`` is the session
    TTL of the coordinator and the nodes: how fast a crash is noticed.
    ``coord_args`` / ``node_args`` are extra command-line options (scheduler
    knobs, fault injection).

    ``stream_nodes`` reference stream nodes (``querycoord streamnode --snode``)
    start after the query nodes; ``stream_vgroups[i]`` lists the vgroups node
    ``i`` leads (default ``[i + 1]``); ``stream_node_args`` are extra options
    (``--heartbeat-ms`` ...).
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
        stream_nodes: int = 0,
        stream_vgroups: Sequence[Sequence[int]] | None = None,
        stream_node_args: Sequence[str] = (),
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
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix=temp_prefix))
        self.ttl = ttl
        self.root = root
        self.node_capacity_mb = node_capacity_mb
        self.coord_args = list(coord_args)
        self.node_args = list(node_args)
        self.log_level = log_level
        self.stop_timeout = stop_timeout
        self.start_timeout = start_timeout
        self.env = child_env(env, PROJECT_ROOT)
        self.etcd: EtcdCluster | None = None
        self.coordinators: list[CoordinatorProcess] = []
        self._leader: CoordinatorProcess | None = None  # the last one whose role event said "leader"
        self._seen: dict[int, int] = {}  # pid -> how many of its events were looked at for role changes
        self.killed_leader: CoordinatorProcess | None = None
        self.killed_at = 0.0
        self.nodes: list[NodeProcess] = []
        self._node_seq = 0
        self.num_stream_nodes = stream_nodes
        self.stream_vgroups = [list(v) for v in stream_vgroups] if stream_vgroups is not None else None
        self.stream_node_args = list(stream_node_args)
        self.stream_nodes: list[StreamNodeProcess] = []
        self._stopped = False

    @property
    def keeps_data(self) -> bool:
        """Whether ``data_dir`` outlives ``stop`` (it was given, not a temporary one)."""
        return not self._temp

    # ----- addresses ------------------------------------------------------------------------------------------------
    @property
    def etcd_endpoints(self) -> list[str]:
        return self.etcd.endpoints if self.etcd is not None else []

    @property
    def coordinator(self) -> CoordinatorProcess | None:
        """The leading coordinator (the last one that said so, even if it died since), else the first one."""
        self._track_roles()
        return self._leader or (self.coordinators[0] if self.coordinators else None)

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

    def _track_roles(self) -> None:
        """Fold the coordinators' new leader/standby events into ``_leader`` (in event time order)."""
        new: list[tuple[float, CoordinatorProcess, str]] = []
        for coord in self.coordinators:
            seen = self._seen.get(coord.pid, 0)
            for ev in coord.events[seen:]:
                if ev.get("event") in ("leader", "standby"):
                    new.append((float(ev.get("t", 0.0)), coord, ev["event"]))
            self._seen[coord.pid] = len(coord.events)
        for _, coord, kind in sorted(new, key=lambda x: x[0]):
            if kind == "leader":
                self._leader = coord
            elif self._leader is coord:
                self._leader = None

    def _cli_prefix(self) -> list[str]:
        return ["--log-level", self.log_level] if self.log_level else []

    # ----- start ------------------------------------------------------------------------------------------------
    async def start(self) -> AllInOne:
        """Start etcd, the coordinator (until it leads), the nodes (until the leader sees them online).

        On failure everything started so far is stopped and ``ClusterStartError`` says what failed.
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
            raise ClusterStartError(problem)

    async def _start(self) -> None:
        self._check_listen()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        etcd = EtcdCluster(self.data_dir / "etcd", size=1)
        self.etcd = etcd
        try:
            await asyncio.to_thread(etcd.start)
        except Exception as exc:
            raise ClusterStartError(f"embedded etcd did not start: {exc}") from exc
        await self.add_coordinators(self.num_coordinators)
        try:
            await self.wait_new_leader(after=0.0, timeout=self.start_timeout)
        except (EOFError, TimeoutError) as exc:
            what = str(exc) or f"no leader within {self.start_timeout:.0f}s"
            coord = self.coordinators[0]
            raise ClusterStartError(f"no coordinator became leader: {what}; the log of the first one "
                                    f"{coord.log_path}:\n{log_tail(coord.log_path)}") from exc
        await self.add_nodes(self.num_nodes)
        if self.num_stream_nodes:
            vgroups = self.stream_vgroups or [[i + 1] for i in range(self.num_stream_nodes)]
            await self.add_stream_nodes(vgroups)

    async def add_coordinators(self, n: int) -> list[CoordinatorProcess]:
        """Start ``n`` more coordinators and wait until each is ready (listens); they campaign on their own."""
        new = [await self._spawn_coordinator() for _ in range(n)]
        for coord in new:
            try:
                ready = await coord.next_event("ready", timeout=self.start_timeout)
            except (EOFError, TimeoutError) as exc:
                raise ClusterStartError(f"{coord.name} did not start: {exc or 'timeout'}; its log "
                                        f"{coord.log_path}:\n{log_tail(coord.log_path)}") from exc
            coord.address = ready["address"]
        return new

    async def _spawn_coordinator(self) -> CoordinatorProcess:
        i = len(self.coordinators) + 1
        listen = self.listen
        if i > 1:  # the first takes ``listen``; the others any free port of that host
            listen = listen.rpartition(":")[0] + ":0"
        args = [*self._cli_prefix(), "coord", "--etcd-endpoints", ",".join(self.etcd_endpoints), "--root", self.root,
                "--listen", listen, "--ttl", f"{self.ttl:g}", *self.coord_args]
        name = "coordinator" if self.num_coordinators == 1 and i == 1 else f"coordinator #{i}"
        log = self.data_dir / ("coordinator.log" if i == 1 else f"coordinator-{i}.log")
        coord = await CoordinatorProcess.spawn(name, ["-m", "querycoord.cli", *args], log_path=log, env=self.env)
        self.coordinators.append(coord)
        return coord

    async def add_nodes(self, n: int) -> list[NodeProcess]:
        """Start ``n`` more query nodes and wait until the leader lists them online (so loads can use them)."""
        new = await asyncio.gather(*(self._spawn_node() for _ in range(n)))
        try:
            for node in new:
                ev = await node.next_event("ready", timeout=self.start_timeout)
                node.node_id, node.address = int(ev["node_id"]), ev["address"]
        except (EOFError, TimeoutError) as exc:
            bad = next((x for x in new if not x.node_id), new[0])
            raise ClusterStartError(f"{bad.name} did not start: {exc or 'timeout'}; its log {bad.log_path}:\n"
                                    f"{log_tail(bad.log_path)}") from exc
        await self.wait_nodes_online([x.node_id for x in new])
        return list(new)

    async def _spawn_node(self) -> NodeProcess:
        self._node_seq += 1
        i = self._node_seq
        args = [*self._cli_prefix(), "querynode", "--etcd-endpoints", ",".join(self.etcd_endpoints),
                "--root", self.root, "--ttl", f"{self.ttl:g}", "--capacity-mb", f"{self.node_capacity_mb:g}",
                *self.node_args]
        node = await NodeProcess.spawn(f"query node #{i}", ["-m", "querycoord.cli", *args],
                                      log_path=self.data_dir / f"node-{i}.log", env=self.env)
        self.nodes.append(node)
        return node

    async def add_stream_nodes(self, vgroups: Sequence[Sequence[int]]) -> list[StreamNodeProcess]:
        """Start one stream node per entry of ``vgroups`` (the vgroups it leads); wait until each registered."""
        new = [await self._spawn_stream_node(v) for v in vgroups]
        for node in new:
            try:
                ev = await node.next_event("ready", timeout=self.start_timeout)
            except (EOFError, TimeoutError) as exc:
                raise ClusterStartError(f"{node.name} did not start: {exc or 'timeout'}; its log {node.log_path}:\n"
                                        f"{log_tail(node.log_path)}") from exc
            node.node_id, node.vgroups = int(ev["node_id"]), tuple(int(v) for v in ev.get("vgroups", []))
        return new

    async def _spawn_stream_node(self, vgroups: Sequence[int]) -> StreamNodeProcess:
        i = len(self.stream_nodes) + 1
        args = [*self._cli_prefix(), "streamnode", "--etcd-endpoints", ",".join(self.etcd_endpoints),
                "--root", self.root, "--ttl", f"{self.ttl:g}", "--snode", "--vgroups", ",".join(map(str, vgroups)),
                *self.stream_node_args]
        node = await StreamNodeProcess.spawn(f"stream node #{i}", ["-m", "querycoord.cli", *args],
                                             log_path=self.data_dir / f"streamnode-{i}.log", env=self.env)
        self.stream_nodes.append(node)
        return node

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
                    raise ClusterStartError(f"query nodes {sorted(want)} registered but the coordinator does not "
                                            f"list them online; see {self.data_dir}/coordinator.log")
                await asyncio.sleep(0.1)

    # ----- while running ----------------------------------------------------------------------------------------
    def exited(self) -> list[ChildProcess]:
        """Children that are no longer running (and were not stopped by us)."""
        kids: list[ChildProcess] = [*self.coordinators, *self.nodes, *self.stream_nodes]
        return [k for k in kids if not k.running]

    async def kill_leader(self) -> float:
        """SIGKILL the leading coordinator (a real crash; kept in ``killed_leader``); returns the time of the kill.

        A standby takes over once the dead leader's lease lapses (within the TTL); see ``wait_new_leader``.
        """
        leader = self.coordinator
        if leader is None or not leader.running:
            raise RuntimeError("no running leading coordinator to kill")
        self.killed_leader = leader
        self.killed_at = at = time.time()
        await leader.kill()
        return at

    async def wait_new_leader(self, after: float | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """The first "leader" event of a running coordinator later than ``after`` (default: the last kill).

        The event carries ``address``, ``server_id`` and ``t`` (when it started serving: after reloading and
        resuming the persisted tasks). TimeoutError if none within ``timeout``; EOFError if every
        coordinator is gone.
        """
        if after is None:
            after = self.killed_at
        deadline = time.monotonic() + timeout
        while True:
            self._track_roles()
            found = [(float(ev.get("t", 0.0)), ev, coord) for coord in self.coordinators if coord.running
                     for ev in coord.events if ev.get("event") == "leader" and float(ev.get("t", 0.0)) > after]
            if found:
                _, ev, coord = max(found, key=lambda x: x[0])
                if coord is self.coordinator:
                    return ev
            if not any(c.running for c in self.coordinators):
                raise EOFError("every coordinator exited: " + ", ".join(
                    f"{c.name} with code {c.proc.returncode}" for c in self.coordinators))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no coordinator became leader within {timeout:.0f}s")
            await asyncio.sleep(0.02)

    def etcd_running(self) -> bool:
        return self.etcd is not None and all(m.running for m in self.etcd.members)

    async def kill_node(self, node: NodeProcess) -> int:
        """SIGKILL a query node: a real crash; its session lapses after the TTL."""
        return await node.kill()

    async def kill_stream_node(self, node: StreamNodeProcess) -> int:
        """SIGKILL a stream node: a real crash; its session lapses after the TTL (the leader then calls it lost)."""
        return await node.kill()

    # ----- stop ---------------------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Coordinators (standbys, then the leader), then query and stream nodes, then etcd.

        Each gets SIGTERM, then SIGKILL after ``stop_timeout``.

        Safe to call twice.
        """
        if self._stopped:
            return
        self._stopped = True
        leader = self.coordinator if self.coordinators else None
        await asyncio.gather(*(c.stop(self.stop_timeout) for c in self.coordinators if c is not leader))
        if leader is not None:
            await leader.stop(self.stop_timeout)
        await asyncio.gather(*(n.stop(self.stop_timeout) for n in [*self.nodes, *self.stream_nodes]))
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop)
        if self._temp:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    async def __aenter__(self) -> AllInOne:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


__all__ = ["DEFAULT_LISTEN", "DEFAULT_ROOT", "AllInOne", "ClusterStartError", "CoordinatorProcess", "NodeProcess",
           "StreamNodeProcess"]
