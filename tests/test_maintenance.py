"""etcd's space on the embedded etcd: its quota and auto compaction flags, port reuse, `status`, `maintain`.

Real etcd members (the session one, or members of a test's own with a tiny quota); the CLI runs as processes.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from meta.client import EtcdClient, connect
from meta.errors import MetaError, MetaNoSpace
from meta.etcd_pb import RangeRequest
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster, free_port
from meta.ops.maintenance import MIB, backend_quota, cluster_status, maintain
from tests import procs

QUOTA = 16 * MIB
VALUE = b"x" * 100_000


def querycoord(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querycoord.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def cmdline(pid: int | None) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


async def fill_history(kv: MetaKV, key: str = "junk") -> int:
    """Overwrite one key with 100 KB values until etcd refuses for NOSPACE; returns how many puts it took."""
    for i in range(1, 1000):
        try:
            await kv.save(key, VALUE)
        except MetaNoSpace:
            return i
    raise AssertionError("etcd never ran out of space")


async def readable_at(client: EtcdClient, revision: int) -> bool:
    req = RangeRequest(key=b"\0", limit=1, revision=revision, keys_only=True)
    try:
        await client.kv.Range(req, metadata=client.metadata, timeout=5)
    except grpc.aio.AioRpcError as exc:
        assert "compacted" in (exc.details() or ""), exc
        return False
    return True


@pytest.fixture
def tiny(tmp_path: Path):
    """One member with a 16 MiB quota (NOSPACE after about 160 puts of 100 KB)."""
    with EtcdCluster(tmp_path / "tiny", quota_backend_bytes=QUOTA) as cluster:
        yield cluster


# ----- the embedded etcd's flags and ports ------------------------------------------------------------------------
async def test_embedded_etcd_sets_a_quota_and_revision_auto_compaction(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "e", quota_backend_bytes=64 * MIB, auto_compaction_retention=500) as cluster:
        member = cluster.members[0]
        args = cmdline(member.pid)
        assert b"--quota-backend-bytes=67108864" in args
        assert b"--auto-compaction-mode=revision" in args and b"--auto-compaction-retention=500" in args
        assert await backend_quota(cluster.config(), member.endpoint) == 64 * MIB
        st = await cluster_status(cluster.config())
        assert st.members[0].db_size_quota == 64 * MIB
    with EtcdCluster(tmp_path / "off", auto_compaction_retention=0) as cluster:
        args = cmdline(cluster.members[0].pid)
        assert not [a for a in args if a.startswith(b"--auto-compaction")]
        assert [a for a in args if a.startswith(b"--quota-backend-bytes=")]


def test_a_restart_on_the_same_data_dir_keeps_the_ports(tmp_path: Path) -> None:
    first = EtcdCluster(tmp_path / "e").start()
    ports = [(m.client_port, m.peer_port, m.metrics_port) for m in first.members]
    first.stop()
    second = EtcdCluster(tmp_path / "e").start()
    try:
        assert [(m.client_port, m.peer_port, m.metrics_port) for m in second.members] == ports
    finally:
        second.stop()


def test_a_three_member_cluster_restarts_on_its_ports(tmp_path: Path) -> None:
    """Peer URLs are part of a multi-member cluster's membership: a restart must keep them."""
    first = EtcdCluster(tmp_path / "e", size=3).start()
    endpoints = first.endpoints
    first.stop()
    with EtcdCluster(tmp_path / "e", size=3) as second:
        assert second.endpoints == endpoints
        assert all(m.healthy() for m in second.members)


def test_explicit_client_ports_are_used(tmp_path: Path) -> None:
    port = free_port()
    with EtcdCluster(tmp_path / "e", client_ports=(port,)) as cluster:
        assert cluster.endpoints == [f"127.0.0.1:{port}"]


def test_etcd_command_reuses_its_ports_on_restart(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    """`querycoord etcd --data-dir D` twice: the second run announces the endpoints of the first."""
    seen = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-m", "querycoord.cli", "etcd", "--data-dir", str(tmp_path / "d")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env)
        try:
            assert proc.stdout is not None
            m = re.search(r"--etcd-endpoints (\S+)", proc.stdout.readline())
            assert m, proc.stderr.read() if proc.stderr else ""
            seen.append(m.group(1))
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            proc.kill()
            proc.wait()
    assert seen[0] == seen[1]
    assert not procs.etcd_pids_under(tmp_path)


def test_sigterm_ends_the_wait_wherever_it_lands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop flag of the foreground commands: SIGTERM handled in the middle of a wait ends it, and a wait with
    no signal times out. Its handler only assigns a flag: ``querycoord etcd`` once set a ``threading.Event`` from
    the handler, which hangs for ever when the signal lands while the main thread holds the event's lock inside
    ``Event.wait`` (seen once in a full run: the command ignored SIGTERM for 30 s)."""
    from querycoord.cli import servers

    previous = signal.getsignal(signal.SIGTERM)
    try:
        flag = servers.TermFlag.install()
        assert not flag.wait(0.01)
        sleep = time.sleep
        monkeypatch.setattr(servers.time, "sleep", lambda s: (signal.raise_signal(signal.SIGTERM), sleep(0)))
        assert flag.wait(60), "the signal came inside the wait"
        assert flag.wait(0), "and stays seen"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_etcd_command_takes_a_port_and_refuses_bad_space_options(tmp_path: Path,
                                                                 subprocess_env: dict[str, str]) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "querycoord.cli", "etcd", "--data-dir", str(tmp_path / "d"),
                             "--port", str(port), "--quota-mb", "64", "--keep-revisions", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env)
    try:
        assert proc.stdout is not None
        assert f"--etcd-endpoints 127.0.0.1:{port} " in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    for flag, value in (("--quota-mb", "0"), ("--keep-revisions", "-1"), ("--port", "70000")):
        out = querycoord(["etcd", "--data-dir", str(tmp_path / "x"), flag, value], subprocess_env)
        assert out.returncode == 2, out
        line, *rest = out.stderr.splitlines()
        assert line.startswith("error: ") and flag in line and not rest, out.stderr  # one line naming the flag


# ----- status -------------------------------------------------------------------------------------------------------
async def test_status_reports_each_member(etcd: EtcdCluster) -> None:
    st = await cluster_status(etcd.config())
    [m] = st.members
    assert not m.error and m.version.startswith("3.")
    assert m.db_size > 0 and 0 < m.db_size_in_use <= m.db_size
    assert m.revision > 0 and 1 <= m.compacted_revision <= m.revision
    assert m.is_leader and m.leader == m.member_id
    assert st.alarms == [] and not st.nospace


async def test_status_of_a_three_member_cluster_with_one_down(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "e", size=3) as cluster:
        st = await cluster_status(cluster.config())
        assert len(st.members) == 3 and sum(m.is_leader for m in st.members) == 1
        assert len({m.leader for m in st.members}) == 1
        lines: list[str] = []
        await maintain(cluster.config(), keep=0, say=lines.append)
        done = [line.split()[1] for line in lines if line.startswith("defragment:") and line.endswith("done")]
        assert done == cluster.endpoints, lines  # one member after the other
        down = next(i for i in range(3) if i != cluster.leader_index())
        cluster.kill_member(down)
        st = await cluster_status(cluster.config(call_timeout=1.0, deadline=2.0))
        assert [bool(m.error) for m in st.members] == [i == down for i in range(3)]
        with pytest.raises(MetaError, match=f"member {cluster.members[down].endpoint} is not answering"):
            await maintain(cluster.config(call_timeout=1.0, deadline=2.0), say=lambda _: None)


def test_status_command_table_and_json(etcd: EtcdCluster, subprocess_env: dict[str, str]) -> None:
    endpoints = ",".join(etcd.endpoints)
    out = querycoord(["etcd", "status", "--etcd-endpoints", endpoints], subprocess_env)
    assert out.returncode == 0, out.stderr
    header, _, row = out.stdout.splitlines()[:3]
    assert header.split()[:3] == ["ENDPOINT", "MEMBER", "VERSION"] and row.startswith(etcd.endpoints[0])
    out = querycoord(["etcd", "status", "-o", "json", "--etcd-endpoints", endpoints], subprocess_env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    [m] = data["members"]
    assert m["endpoint"] == etcd.endpoints[0] and m["is_leader"] and m["db_size"] > 0
    assert data["alarms"] == [] and data["revision"] >= m["compacted_revision"] >= 1


def test_status_command_without_etcd_is_one_error_line(subprocess_env: dict[str, str]) -> None:
    out = querycoord(["etcd", "status", "--etcd-endpoints", f"127.0.0.1:{free_port()}"], subprocess_env)
    assert out.returncode == 1
    assert "unreachable: connection refused" in out.stdout and "Traceback" not in out.stderr


# ----- maintain -----------------------------------------------------------------------------------------------------
async def test_maintain_compacts_keeping_revisions_and_defragments(tiny: EtcdCluster) -> None:
    async with await connect(tiny.config()) as client:
        kv = MetaKV(client, "m")
        for _ in range(60):
            await kv.save("k", VALUE)
        # etcd's backend commits its writes in batches (every 100 ms) and reports the file's size as of the last
        # commit: read the size once the 6 MB written are in the file (once it read 20 KB, taken before a commit).
        deadline = time.monotonic() + 30
        while (before := (await cluster_status(tiny.config())).members[0]).db_size < 30 * len(VALUE):
            assert time.monotonic() < deadline, before
            await asyncio.sleep(0.1)
        lines: list[str] = []
        after = await maintain(tiny.config(), keep=10, say=lines.append)
        m = after.members[0]
        assert m.compacted_revision == before.revision - 10
        assert await readable_at(client, before.revision - 10)
        assert not await readable_at(client, before.revision - 11)
        assert m.db_size < before.db_size  # defragmented: the freed pages left the file
        assert any(line.startswith(f"defragment: {tiny.endpoints[0]} done") for line in lines), lines
        assert await kv.get("k") == VALUE


async def test_maintain_dry_run_changes_nothing(tiny: EtcdCluster) -> None:
    async with await connect(tiny.config()) as client:
        kv = MetaKV(client, "m")
        for _ in range(20):
            await kv.save("k", VALUE)
        before = (await cluster_status(tiny.config())).members[0]
        lines: list[str] = []
        await maintain(tiny.config(), keep=5, dry_run=True, say=lines.append)
        after = (await cluster_status(tiny.config())).members[0]
        assert after.compacted_revision == before.compacted_revision == 1
        assert after.db_size >= before.db_size  # not defragmented (etcd may still be committing the writes)
        assert f"compact: would compact to revision {before.revision - 5}" in lines[0]
        assert all("would" in line for line in lines), lines


async def test_maintain_disarms_nospace_once_there_is_room(tiny: EtcdCluster, subprocess_env) -> None:
    async with await connect(tiny.config()) as client:
        kv = MetaKV(client, "m")
        await fill_history(kv)
        st = await cluster_status(tiny.config())
        assert st.nospace and st.alarms == [(st.members[0].member_id, "NOSPACE")]
        assert await kv.get("junk") == VALUE  # reads still work
        out = querycoord(["etcd", "maintain", "--dry-run", "--etcd-endpoints", tiny.endpoints[0]], subprocess_env)
        assert out.returncode == 0 and "alarm: would disarm NOSPACE" in out.stdout, out
        assert (await cluster_status(tiny.config())).nospace
        out = querycoord(["etcd", "maintain", "--keep", "10", "--etcd-endpoints", tiny.endpoints[0]], subprocess_env)
        assert out.returncode == 0, out
        assert "alarm: NOSPACE disarmed" in out.stdout
        assert not (await cluster_status(tiny.config())).nospace
        await kv.save("after", "ok")


async def test_maintain_leaves_nospace_raised_when_nothing_can_be_freed(tiny: EtcdCluster, subprocess_env) -> None:
    """Live data over the quota: disarming would only raise the alarm again at the next write."""
    async with await connect(tiny.config()) as client:
        kv = MetaKV(client, "m")
        for i in range(1000):
            try:
                await kv.save(f"live/{i}", VALUE)
            except MetaNoSpace:
                break
        out = querycoord(["etcd", "maintain", "--keep", "0", "--etcd-endpoints", tiny.endpoints[0]], subprocess_env)
        assert out.returncode == 1, out
        assert "NOSPACE left raised" in out.stdout and "--quota-backend-bytes" in out.stdout
        assert out.stderr.startswith("error: ") and "Traceback" not in out.stderr
        assert (await cluster_status(tiny.config())).nospace
