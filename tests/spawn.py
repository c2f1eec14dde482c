"""One way for the tests to start each kind of process: a ``meta.ops.child.ChildProcess`` whose ready event has arrived.

Processes start as the cluster harness starts them (``querycoord.tooling.harness``): coordinators as ``querycoord
coord`` with its flags (``coord_argv``), nodes as ``querycoord querynode`` / ``streamnode`` (``node_argv``).
Everything is awaited on the test's event loop (never a blocking read: the in-process coordinators and nodes of a
test would stop sending keepalives while a child imports, and their 2 s sessions lapse on a loaded machine), and
each child dies with the test (``pdeathsig``).

Each child writes its stderr to ``<log_dir>/<name>.log``, whose tail a failed start quotes; with no ``log_dir``
its stderr is ours (pytest captures it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meta.ops.child import ChildProcess, child_env
from meta.ops.etcd_server import EtcdCluster
from querycoord.tooling.harness import QUERY_NODE, STREAM_NODE, coord_argv, node_argv

# Small merged requests, two children at a time and short back-offs: a load of a few hundred segments is still
# running when a test kills or pauses its coordinator; no auto balance moves anything behind the test's back.
MID_LOAD_FLAGS = ("--auto-balance-interval", "0", "--retry-backoff", "0.05", "--wait-interval", "0.2",
                  "--max-request-bytes", "3000", "--max-concurrent-children", "2")


class Spawned(ChildProcess):
    """A child started by this module: ``ready`` is its ready event (address, node_id, pid...)."""

    ready: dict[str, Any]

    @property
    def address(self) -> str:
        return str(self.ready["address"])

    @property
    def node_id(self) -> int:
        return int(self.ready["node_id"])

    def tail(self, lines: int = 40) -> str:
        """The end of its log under its name, for assertion messages."""
        return f"--- {self.name}\n{self.log_tail(lines)}"


async def spawn_ready(name: str, argv: list[str], log_dir: Path | None, *, env: Mapping[str, str] | None = None,
                      stdin: bool = False, timeout: float = 60.0) -> Spawned:
    """Start ``python <argv>`` and wait for its ready event; a child that does not get there is killed."""
    log_path = log_dir / f"{name}.log" if log_dir is not None else None
    child = await Spawned.spawn(name, argv, log_path=log_path, env=child_env() if env is None else env, stdin=stdin)
    try:
        child.ready = await child.wait_event("ready", timeout)
    except (EOFError, TimeoutError) as exc:
        await child.kill()
        raise AssertionError(f"{name} did not start: {exc!r}\n{child.tail()}") from None
    return child


async def spawn_coordinator(etcd: EtcdCluster, root: str, log_dir: Path | None, *flags: str, name: str = "coord",
                            log_level: str = "WARNING", env: Mapping[str, str] | None = None,
                            timeout: float = 60.0) -> Spawned:
    """``querycoord coord`` on a free port with a 2 s session and ``flags``; events: ready, leader, standby."""
    argv = coord_argv(etcd.endpoints, root, "127.0.0.1:0", 2, *flags, log_level=log_level)
    return await spawn_ready(name, argv, log_dir, env=env, timeout=timeout)


async def spawn_query_node(etcd: EtcdCluster, root: str, log_dir: Path | None, *flags: str, name: str = "querynode",
                           env: Mapping[str, str] | None = None, timeout: float = 60.0) -> Spawned:
    """``querycoord querynode`` with ``flags``."""
    argv = node_argv(QUERY_NODE, etcd.endpoints, root, *flags)
    return await spawn_ready(name, argv, log_dir, env=env, timeout=timeout)


async def spawn_stream_node(etcd: EtcdCluster, root: str, log_dir: Path | None, *flags: str,
                            name: str = "streamnode", env: Mapping[str, str] | None = None,
                            timeout: float = 60.0) -> Spawned:
    """``querycoord streamnode`` with ``flags`` and its stdin control channel (``command``)."""
    argv = node_argv(STREAM_NODE, etcd.endpoints, root, *flags)
    return await spawn_ready(name, argv, log_dir, env=env, stdin=True, timeout=timeout)


async def spawn_snode_host(etcd: EtcdCluster, root: str, log_dir: Path | None, vgroups: str,
                           name: str) -> Spawned:
    """A stream node that finds its coordinator through etcd, leads ``vgroups`` and can host an snode, with fast
    heartbeats and task start-up (the end-to-end stream tests' node)."""
    return await spawn_stream_node(etcd, root, log_dir, "--vgroups", vgroups, "--snode", "--heartbeat-ms", "100",
                                   "--groups", "2", "--init-delay-ms", "100", "--ttl", "10", name=name)


class Processes:
    """The processes one test starts, all killed when it ends: ``async with Processes(etcd, root, log_dir) as p``,
    then ``await p.coordinator(name="a")``, ``p.query_node(...)``, ``p.stream_node(...)`` (same flags as above)."""

    def __init__(self, etcd: EtcdCluster, root: str, log_dir: Path | None):
        self.etcd, self.root, self.log_dir = etcd, root, log_dir
        self.started: list[Spawned] = []

    def keep(self, child: Spawned) -> Spawned:
        self.started.append(child)
        return child

    async def coordinator(self, *flags: str, name: str = "coord") -> Spawned:
        return self.keep(await spawn_coordinator(self.etcd, self.root, self.log_dir, *flags, name=name))

    async def query_node(self, *flags: str, name: str = "querynode") -> Spawned:
        return self.keep(await spawn_query_node(self.etcd, self.root, self.log_dir, *flags, name=name))

    async def stream_node(self, *flags: str, name: str = "streamnode") -> Spawned:
        return self.keep(await spawn_stream_node(self.etcd, self.root, self.log_dir, *flags, name=name))

    async def __aenter__(self) -> Processes:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for child in self.started:
            await child.kill()


__all__ = ["MID_LOAD_FLAGS", "Processes", "Spawned", "spawn_coordinator", "spawn_query_node", "spawn_ready",
           "spawn_snode_host", "spawn_stream_node"]
