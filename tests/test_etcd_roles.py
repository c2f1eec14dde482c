"""etcd least privilege against a real etcd with auth on: what each role may and may not write.

The roles are created by the real command (``querycoord etcd roles``, run as
a process) on an etcd of this module's own, which it leaves with auth on, so
the session-wide ``etcd`` stays open. Then, with each user's own password
file: a query node's user cannot write a task key (or another node's session,
or anything outside the root) and can register its own session; a real query
node process under that user registers with ``--node-id 7`` and a coordinator
running as ``coordinator`` lists it and loads a collection onto it; a second
node with the same id exits with one ``error:`` line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from etcd3aio.auth import PermissionType
from etcd3aio.kv import prefix_range_end

from meta.client import EtcdClient, connect
from meta.election import read_leader_record
from meta.errors import MetaAuthError
from meta.etcd_pb import LeaseKeepAliveRequest, RangeRequest
from meta.kv import MetaKV
from meta.ops.child import child_env
from meta.ops.etcd_roles import enable_auth, plan_roles
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session, SessionIdTaken, list_sessions
from meta.session_guard import SessionGuard
from querycoord.cli.etcd_admin import NODE_READS
from querycoord.common.protocol import QUERYCOORD_ELECTION
from tests.cluster import wait_until
from tests.spawn import Spawned, spawn_coordinator, spawn_query_node, spawn_ready

ROOT = "prod"
ADMIN = "root"
ADMIN_PASSWORD = "admin-pw-for-roles-test"
QUERYNODES = (7, 8)
STREAMNODES = (10,)


@dataclass(frozen=True)
class Secured:
    cluster: EtcdCluster
    passwords: Path  # one file per user, made by the command
    admin_file: Path
    first_run: str  # what the first `etcd roles` printed

    def password(self, user: str) -> str:
        return (self.passwords / user).read_text().rstrip("\n")

    def env(self, user: str) -> dict[str, str]:
        """A child's environment that reaches etcd as ``user`` (the password from its file, never argv)."""
        env = child_env()
        env.update({"QUERYCOORD_ETCD_USER": user, "QUERYCOORD_ETCD_PASSWORD_FILE": str(self.passwords / user)})
        env.pop("QUERYCOORD_ETCD_PASSWORD", None)
        return env


def roles_command(cluster: EtcdCluster, admin_file: Path, passwords: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "querycoord.cli", "etcd", "roles", "--etcd-endpoints", ",".join(cluster.endpoints),
            "--etcd-user", ADMIN, "--etcd-password-file", str(admin_file), "--root", ROOT,
            "--querynodes", ",".join(map(str, QUERYNODES)), "--streamnodes", ",".join(map(str, STREAMNODES)),
            "--password-dir", str(passwords), *extra]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("etcd-roles")
    admin_file = base / "admin-password"
    admin_file.write_text(ADMIN_PASSWORD + "\n")
    with EtcdCluster(base / "etcd") as cluster:
        r = subprocess.run(roles_command(cluster, admin_file, base / "passwords"), capture_output=True, text=True,
                           env=child_env(), timeout=120)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
        yield Secured(cluster, base / "passwords", admin_file, r.stdout)


@pytest.fixture
async def admin(secured: Secured) -> AsyncIterator[EtcdClient]:
    client = await connect(secured.cluster.config(user=ADMIN, password=ADMIN_PASSWORD))
    yield client
    await client.close()


async def as_user(secured: Secured, user: str) -> EtcdClient:
    return await connect(secured.cluster.config(user=user, password=secured.password(user)))


async def refused(coro: object, user: str) -> MetaAuthError:
    with pytest.raises(MetaAuthError) as e:
        await coro  # type: ignore[misc]
    assert "permission denied" in str(e.value) and repr(user) in str(e.value), str(e.value)
    return e.value


# ----- the command ----------------------------------------------------------------------
def test_the_command_created_every_role_user_and_password_file_and_enabled_auth(secured: Secured) -> None:
    out = secured.first_run
    for user in ("coordinator", "reader", "querynode-7", "querynode-8", "streamnode-10"):
        assert f"role {user}: created" in out and f"user {user}: created" in out, out
        f = secured.passwords / user
        assert f.stat().st_mode & 0o777 == 0o600 and len(secured.password(user)) >= 20
        assert secured.password(user) not in out
    assert "auth enabled; administrator root" in out, out


def test_a_rerun_changes_nothing(secured: Secured) -> None:
    r = subprocess.run(roles_command(secured.cluster, secured.admin_file, secured.passwords), capture_output=True,
                       text=True, env=child_env(), timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.startswith("etcd roles in place for root prod"), r.stdout  # no created/granted/revoked line


async def test_the_roles_hold_exactly_the_plan(secured: Secured, admin: EtcdClient) -> None:
    """What etcd holds, read back: a node's only write permission is its own session key."""
    auth = admin.raw.auth
    assert auth is not None
    plan = plan_roles(ROOT, querynodes=QUERYNODES, streamnodes=STREAMNODES, node_reads=NODE_READS)
    for role in plan.roles:
        resp = await auth.role_get(role.name)
        held = {(p.key.decode(), bytes(p.range_end), p.permType) for p in resp.perm}
        assert held == {(g.key, g.range_end, int(g.perm_type)) for g in role.grants}, role.name
    node = next(r for r in plan.roles if r.name == "querynode-7")
    assert [g.key for g in node.grants if g.write] == ["prod/session/querynode-7"]
    assert all(not g.prefix for g in node.grants if g.write)


def test_dry_run_prints_the_plan_without_touching_etcd(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "querycoord.cli", "etcd", "roles", "--root", "x", "--querynodes", "3",
                        "--password-dir", str(tmp_path / "pw"), "--dry-run"],
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "readwrite key x/session/querynode-3" in r.stdout and "readwrite prefix x/" in r.stdout, r.stdout
    assert not (tmp_path / "pw").exists()


@pytest.mark.parametrize(("args", "fragment"), [
    (["--querynodes", "1,x"], "--querynodes"),
    (["--querynodes", "0"], "positive"),
    (["--name-prefix", "a b"], "name prefix"),
    ([], "--password-dir is required"),
])
def test_bad_options_are_one_error_line(args: list[str], fragment: str) -> None:
    r = subprocess.run([sys.executable, "-m", "querycoord.cli", "etcd", "roles", "--etcd-endpoints", "127.0.0.1:1",
                        "--root", "x", *args], capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and fragment in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# ----- what each user may do ---------------------------------------------------------------
async def test_a_node_credential_cannot_write_a_task_key(secured: Secured, admin: EtcdClient) -> None:
    client = await as_user(secured, "querynode-7")
    try:
        kv = MetaKV(client, ROOT)
        err = await refused(kv.save("task/1001", b"forged task"), "querynode-7")
        assert "lacks permission" in str(err)
        await refused(kv.save("session/querynode-8", b"{}"), "querynode-7")  # another node's session
        await refused(kv.save("session/querynode-70", b"{}"), "querynode-7")  # inside its read prefix: still no
        await refused(kv.multi_save({"session/querynode-7": b"x", "collection/1": b"x"}), "querynode-7")
        await refused(MetaKV(client, "other-root").save("session/querynode-7", b"x"), "querynode-7")
        await refused(kv.load_prefix("task/"), "querynode-7")  # nothing to read outside its session
        # Its own session key it may write (and delete).
        await kv.save("session/querynode-7", b"{}")
        await kv.remove("session/querynode-7")
    finally:
        await client.close()
    assert await MetaKV(admin, ROOT).get("task/1001") is None


async def test_a_node_reads_only_its_own_session_key_not_those_it_prefixes(secured: Secured,
                                                                             admin: EtcdClient) -> None:
    """querynode-7's grant is its key alone: querynode-70 (whose key it prefixes) stays unreadable to it."""
    await MetaKV(admin, ROOT).save("session/querynode-70", b'{"secret": "node 70"}')
    client = await as_user(secured, "querynode-7")
    try:
        kv = MetaKV(client, ROOT)
        await refused(kv.get("session/querynode-70"), "querynode-7")
        await refused(kv.load_prefix("session/querynode-7"), "querynode-7")
        await refused(kv.load_prefix("session/querynode-"), "querynode-7")
        await kv.save("session/querynode-7", b"{}")
        assert await kv.get("session/querynode-7") == b"{}"
        await kv.remove("session/querynode-7")
    finally:
        await client.close()
        await MetaKV(admin, ROOT).remove("session/querynode-70")


async def test_a_rerun_migrates_an_old_prefix_grant_away(secured: Secured, admin: EtcdClient) -> None:
    """Roles made by an older version also read their key as a prefix: re-running the command revokes that."""
    auth = admin.raw.auth
    assert auth is not None
    old = "prod/session/querynode-8"
    await auth.role_grant_permission("querynode-8", old, prefix_range_end(old.encode()), perm_type=PermissionType.READ)
    r = await asyncio.to_thread(subprocess.run, roles_command(secured.cluster, secured.admin_file, secured.passwords),
                                capture_output=True, text=True, env=child_env(), timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"role querynode-8: revoked read {old} .. " in r.stdout, r.stdout
    held = {(p.key.decode(), p.range_end) for p in (await auth.role_get("querynode-8")).perm}
    assert (old, b"") in held and all(k != old or not end for k, end in held), held


async def test_a_node_registers_its_session_under_its_fixed_id_only(secured: Secured) -> None:
    client = await as_user(secured, "querynode-7")
    try:
        kv = MetaKV(client, ROOT)
        async with Session(kv, "querynode", "127.0.0.1:1", ttl=2, server_id=7) as session:
            assert session.server_id == 7
            assert b'"ServerID": 7' in (await kv.get("session/querynode-7") or b"")
            await asyncio.sleep(1.5)  # keepalives pass too
            assert not session.lost.is_set(), session.lost_reason
        with pytest.raises(MetaAuthError):  # an allocated id would need the shared counter
            await Session(kv, "querynode", "127.0.0.1:1", ttl=2).start()
        with pytest.raises(MetaAuthError):
            await Session(kv, "querynode", "127.0.0.1:1", ttl=2, server_id=8).start()
    finally:
        await client.close()


async def test_a_node_filling_its_session_key_is_fenced_by_the_coordinator_user(secured: Secured) -> None:
    """What querynode-8's credential may write (its own key, under its own lease) cannot grow without bound: the
    guard, running as the coordinator, revokes the lease; the coordinator keeps writing."""
    coord = await as_user(secured, "coordinator")
    node = await as_user(secured, "querynode-8")
    try:
        coord_kv, node_kv = MetaKV(coord, ROOT), MetaKV(node, ROOT)
        async with SessionGuard(coord_kv, ["querynode", "streamnode"]) as guard:
            async with Session(node_kv, "querynode", "127.0.0.1:1", ttl=2, server_id=8) as session:
                await asyncio.sleep(0.3)  # the guard has read what is there; the next write comes as an event
                await node_kv.save("session/querynode-8", b"x" * 1_000_000, lease=session.lease_id)
                await asyncio.wait_for(session.lost.wait(), 30)
            # The node's session sees its key go when etcd revokes the lease, which can be before the guard has
            # the answer to its revoke call and counts it: wait for the count, then check it is exactly one.
            await wait_until(lambda: guard.revoked >= 1, "the guard counted the lease it revoked", timeout=30)
            assert guard.fenced == {"value_size": 1, "write_rate": 0} and guard.revoked == 1
            assert await coord_kv.get("session/querynode-8") is None
            await coord_kv.save("collection/6", b"still writing")
    finally:
        await node.close()
        await coord.close()


async def test_stream_node_reads_what_it_needs_and_writes_only_its_session(secured: Secured,
                                                                           admin: EtcdClient) -> None:
    await MetaKV(admin, ROOT).save("stream/snodes/1", b"")
    client = await as_user(secured, "streamnode-10")
    try:
        kv = MetaKV(client, ROOT)
        assert await list_sessions(kv, "querycoord") is not None
        assert len(await kv.load_prefix("stream/snodes/")) == 1
        await refused(kv.save("stream/snodes/2", b""), "streamnode-10")
        await refused(kv.save("session/querycoord-1", b"{}"), "streamnode-10")
        async with Session(kv, "streamnode", "-", ttl=2, server_id=10):
            pass
    finally:
        await client.close()


async def test_reader_reads_and_cannot_write_and_coordinator_stays_under_its_root(secured: Secured) -> None:
    reader = await as_user(secured, "reader")
    coord = await as_user(secured, "coordinator")
    try:
        await MetaKV(coord, ROOT).save("collection/5", b"c")
        assert await MetaKV(reader, ROOT).get("collection/5") == b"c"
        await refused(MetaKV(reader, ROOT).save("collection/5", b"x"), "reader")
        await refused(MetaKV(coord, "other-root").save("collection/5", b"x"), "coordinator")
    finally:
        await reader.close()
        await coord.close()


async def test_enable_auth_twice_is_a_no_op(secured: Secured, admin: EtcdClient) -> None:
    assert await enable_auth(admin, ADMIN, ADMIN_PASSWORD) is False


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


# ----- real processes -----------------------------------------------------------------------
async def querycoord(address: str, *args: str, timeout: float = 90.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", "--address", address,
                                                "--timeout", "20", *args, env=child_env(),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_query_node_process_with_its_own_credential_is_listed_loaded_and_restarted(secured: Secured,
                                                                                tmp_path: Path) -> None:
    root = ROOT  # the roles are for this root
    started: list[Spawned] = []
    try:
        coord = await spawn_coordinator(secured.cluster, root, tmp_path, env=secured.env("coordinator"))
        started.append(coord)
        await coord.wait_event("leader", 60)
        node = await spawn_query_node(secured.cluster, root, tmp_path, "--node-id", "7", "--ttl", "2",
                                      "--listen", "127.0.0.1:0", env=secured.env("querynode-7"))
        started.append(node)
        assert node.node_id == 7
        started.append(await spawn_query_node(secured.cluster, root, tmp_path, "--node-id", "8", "--ttl", "2",
                                              "--listen", "127.0.0.1:0", env=secured.env("querynode-8"),
                                              name="querynode-8"))
        deadline = time.monotonic() + 60
        while True:
            code, out, err = await querycoord(coord.address, "nodes")
            if code == 0 and any(line.split()[:1] == ["7"] for line in out.splitlines()):
                break
            assert time.monotonic() < deadline, f"the leader never listed node 7: {out}{err}\n{coord.tail()}"
            await asyncio.sleep(0.3)
        code, out, err = await querycoord(coord.address, "collection", "create", "c1", "--partitions", "2",
                                          "--segments", "20", "--segment-mb", "0.5")
        assert code == 0, (out, err)
        code, out, err = await querycoord(coord.address, "collection", "load", "c1")
        assert code == 0 and "100%" in out, (out, err, coord.tail(), node.tail())

        # A second node with the same id: one clear error line, exit 1, and node 7 keeps its session.
        log = tmp_path / "querynode-dup.log"
        argv = ["-m", "querycoord.cli", "querynode", "--etcd-endpoints", ",".join(secured.cluster.endpoints),
                "--root", root, "--node-id", "7", "--listen", "127.0.0.1:0", "--log-level", "ERROR"]
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv, env=secured.env("querynode-7"),
                                                    stdout=asyncio.subprocess.PIPE, stderr=log.open("w"))
        out_b, _ = await asyncio.wait_for(proc.communicate(), 60)
        err = log.read_text()
        assert proc.returncode == 1, (out_b, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: query node could not start: server id 7 is taken"), err
        assert node.proc.returncode is None
        for p in started:
            assert secured.password("querynode-7") not in cmdline(p.pid)

        # Node 7 dies and comes back under the same id (all a fixed-id node can do) while the leader still
        # handles the old one as down: once that is done (its segments moved to node 8), node 7 is online again.
        await node.kill()
        node = await spawn_query_node(secured.cluster, root, tmp_path, "--node-id", "7", "--ttl", "2",
                                      "--listen", "127.0.0.1:0", env=secured.env("querynode-7"), name="querynode-2")
        started.append(node)
        deadline = time.monotonic() + 90
        while True:
            code, out, err = await querycoord(coord.address, "collection", "show")
            row = next((line.split() for line in out.splitlines() if " c1 " in line), [])
            _, nodes, _ = await querycoord(coord.address, "nodes")
            back = [line.split() for line in nodes.splitlines() if node.address in line]
            if code == 0 and "100%" in row and back and back[0][:3] == ["7", node.address, "online"]:
                break
            assert time.monotonic() < deadline, f"node 7 never came back: {out}{err}{nodes}\n{coord.tail(80)}"
            await asyncio.sleep(0.5)
    finally:
        for p in started:
            await p.stop()
    for name in ("coord", "querynode", "querynode-2", "querynode-8"):
        text = (tmp_path / f"{name}.log").read_text()
        assert "permission denied" not in text.lower(), f"{name} was refused something:\n{text[-3000:]}"
        assert "Traceback" not in text, text[-3000:]


async def test_two_stream_nodes_with_one_id_the_second_exits_clearly(secured: Secured, tmp_path: Path) -> None:
    first = await spawn_ready("streamnode-a", ["-m", "querycoord.cli", "streamnode", "--etcd-endpoints",
                                               ",".join(secured.cluster.endpoints), "--root", ROOT, "--node-id", "10",
                                               "--ttl", "2"], tmp_path, env=secured.env("streamnode-10"), stdin=True)
    try:
        assert first.node_id == 10
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "querycoord.cli", "streamnode", "--etcd-endpoints",
            ",".join(secured.cluster.endpoints), "--root", ROOT, "--node-id", "10", "--log-level", "ERROR",
            env=secured.env("streamnode-10"), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err_b = await asyncio.wait_for(proc.communicate(), 60)
        err = err_b.decode()
        assert proc.returncode == 1, err
        assert err.strip().splitlines() == [err.strip()] and "server id 10 is taken" in err, err
    finally:
        await first.stop()


# ----- fixed ids without auth -----------------------------------------------------------------
async def test_a_fixed_id_held_by_a_live_session_is_refused_and_free_again_after_it_ends(kv: MetaKV) -> None:
    async with Session(kv, "querynode", "127.0.0.1:5", ttl=2, server_id=42):
        with pytest.raises(SessionIdTaken) as e:
            await Session(kv, "querynode", "127.0.0.1:6", ttl=2, server_id=42).start()
        assert "server id 42 is taken" in str(e.value) and "127.0.0.1:5" in str(e.value), str(e.value)
        assert [i.address for i in (await list_sessions(kv, "querynode")).sessions.values()] == ["127.0.0.1:5"]
    async with Session(kv, "querynode", "127.0.0.1:6", ttl=2, server_id=42) as again:
        assert again.server_id == 42


@pytest.mark.parametrize("bad", [0, -1, 2**63, True])
async def test_a_fixed_id_must_be_a_positive_int64(kv: MetaKV, bad: int) -> None:
    with pytest.raises(ValueError, match="positive 64-bit"):
        Session(kv, "querynode", "x", server_id=bad)


# ----- the leader's lease is no node's to renew ---------------------------------------------------------------------
async def _renew(client: EtcdClient, lease_id: int) -> None:
    """One keepalive of ``lease_id``: etcd checks no permission for it, only that the lease exists."""
    async def requests() -> AsyncIterator[LeaseKeepAliveRequest]:
        yield LeaseKeepAliveRequest(ID=lease_id)

    call = client.lease.LeaseKeepAlive(requests(), metadata=client.metadata, timeout=2)
    try:
        async for _ in call:
            return
    finally:
        call.cancel()


async def _readable(client: EtcdClient, user: str) -> list[Any]:
    """Every key ``user`` may read, as etcd returns them (with their lease field): each range its role grants."""
    role = next(r for r in _PLAN.roles if r.name == user)
    out: list[Any] = []
    for grant in role.grants:
        req = RangeRequest(key=grant.key.encode(), range_end=grant.range_end)
        resp = await client.call("read", lambda t, r=req: client.kv.Range(r, metadata=client.metadata, timeout=t))
        out.extend(resp.kvs)
    return out


async def _renew_every_lease_it_can_learn(client: EtcdClient, user: str, stop: asyncio.Event) -> set[int]:
    """What a hostile node or reader does: read every key it may (and the election, should it be let) and renew
    each lease it sees, in a key's lease field or named by a key."""
    kv = MetaKV(client, ROOT)
    learned: set[int] = set()
    while not stop.is_set():
        items: list[Any] = []
        with contextlib.suppress(MetaAuthError):
            items += [(x.key.encode(), x.lease) for x in (await kv.load_prefix("election/querycoord/")).kvs]
        with contextlib.suppress(MetaAuthError):
            items += [(x.key, x.lease) for x in await _readable(client, user)]
        for key, lease in items:
            learned |= {lease} - {0}
            with contextlib.suppress(ValueError):
                learned.add(int(key.rsplit(b"/", 1)[-1], 16))
        for lease in learned:
            with contextlib.suppress(Exception):
                await _renew(client, lease)
        await asyncio.sleep(0.3)
    return learned


_PLAN = plan_roles(ROOT, querynodes=QUERYNODES, streamnodes=STREAMNODES, node_reads=NODE_READS)


async def _leader_and_standby(secured: Secured, tmp_path: Path, started: list[Spawned]) -> tuple[Spawned, Spawned]:
    first = await spawn_coordinator(secured.cluster, ROOT, tmp_path, env=secured.env("coordinator"), name="c1")
    started.append(first)
    await first.wait_event("leader", 60)
    second = await spawn_coordinator(secured.cluster, ROOT, tmp_path, env=secured.env("coordinator"), name="c2")
    started.append(second)
    coord = await as_user(secured, "coordinator")
    try:
        deadline = time.monotonic() + 60
        while await MetaKV(coord, ROOT).count_prefix("election/querycoord/") < 2:  # the standby queued
            assert time.monotonic() < deadline, second.tail()
            await asyncio.sleep(0.2)
    finally:
        await coord.close()
    return first, second


@pytest.mark.parametrize("user", ["querynode-7", "reader", "streamnode-10"])
async def test_no_other_credential_can_keep_a_dead_leader_leading(secured: Secured, tmp_path: Path,
                                                                  user: str) -> None:
    """Whatever it may read (a node the leader record, a stream node the coordinators' sessions, the reader all
    but the election), renewing every lease it learns keeps no dead leader leading: the standby takes over."""
    started: list[Spawned] = []
    attacker = await as_user(secured, user)
    stop = asyncio.Event()
    try:
        first, second = await _leader_and_standby(secured, tmp_path, started)
        kv = MetaKV(attacker, ROOT)
        await refused(kv.load_prefix("election/"), user)  # the election's keys carry the leases
        record = await read_leader_record(kv, QUERYCOORD_ELECTION) if user != "streamnode-10" else None
        assert user == "streamnode-10" or (record is not None and record.value == first.address)
        hostile = asyncio.create_task(_renew_every_lease_it_can_learn(attacker, user, stop))
        await asyncio.sleep(1.0)
        await first.kill()
        await second.wait_event("leader", 45)  # TTL 2 s: well within, unless someone renews the dead lease
        if record is not None:
            newer = await read_leader_record(kv, QUERYCOORD_ELECTION)
            assert newer is not None and newer.value == second.address and newer.revision > record.revision
        stop.set()
        learned = await hostile
        # The reader and a stream node read the coordinators' sessions, and so learn (and renew) their leases.
        assert learned or user == "querynode-7", "the attacker learned no lease at all: the test proves nothing"
    finally:
        stop.set()
        for p in started:
            await p.stop()
        await attacker.close()


async def test_no_key_another_credential_reads_carries_or_names_an_election_lease(secured: Secured,
                                                                                   tmp_path: Path) -> None:
    """The audit: with a leader, a standby and a query node running, every key each non-coordinator role may read
    is read, and no election lease is in its lease field, its name or its value."""
    started: list[Spawned] = []
    coord = await as_user(secured, "coordinator")
    try:
        first, second = await _leader_and_standby(secured, tmp_path, started)
        node = await spawn_query_node(secured.cluster, ROOT, tmp_path, "--node-id", "7", "--ttl", "2",
                                      "--listen", "127.0.0.1:0", env=secured.env("querynode-7"))
        started.append(node)
        election = (await MetaKV(coord, ROOT).load_prefix("election/querycoord/")).kvs
        leases = {x.lease for x in election}
        assert len(leases) == 2 and 0 not in leases
        spelled = {f"{lease:x}".encode() for lease in leases} | {str(lease).encode() for lease in leases}
        coord_sessions = (await MetaKV(coord, ROOT).load_prefix("session/querycoord-")).kvs
        # A coordinator killed by the test before may keep its session until its TTL lapses: count ours only.
        ours = [x for x in coord_sessions if json.loads(x.value)["Address"] in {first.address, second.address}]
        assert len(ours) == 2 and not {x.lease for x in coord_sessions} & leases
        for role in _PLAN.roles:
            if role.name == "coordinator":
                continue
            client = await as_user(secured, role.name)
            try:
                seen = await _readable(client, role.name)
            finally:
                await client.close()
            for item in seen:
                assert item.lease not in leases, (role.name, item.key)
                assert not any(s in item.key or s in item.value for s in spelled), (role.name, item.key)
            if role.name == "reader":  # it reads the rest: the sessions, the leader record
                keys = {bytes(x.key) for x in seen}
                assert {b"prod/session/querynode-7", b"prod/leader-record/querycoord"} <= keys, keys
                assert not any(k.startswith(b"prod/election/") for k in keys)
        assert first.proc.returncode is None
    finally:
        for p in started:
            await p.stop()
        await coord.close()


async def etcd_command(secured: Secured, user: str, *args: str, timeout: float = 90.0) -> tuple[int, str, str]:
    """``querycoord ARGS`` reaching etcd as ``user`` (its password from the file the roles command wrote)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "querycoord.cli", *args, "--etcd-endpoints", ",".join(secured.cluster.endpoints),
        "--root", ROOT, env=secured.env(user), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_reader_credential_runs_every_read_command_and_no_repair(secured: Secured, tmp_path: Path) -> None:
    """The reader's etcd role may not read the election prefix (it would learn the leader's lease), yet an
    operator with it sees the cluster: status names the leader, meta show and verify read every kind; an
    applied repair is refused in one line and writes nothing."""
    coord = await spawn_coordinator(secured.cluster, ROOT, tmp_path, env=secured.env("coordinator"))
    try:
        await coord.wait_event("leader", 60)
        code, out, err = await querycoord(coord.address, "collection", "create", "readme", "--partitions", "1",
                                          "--segments", "4")
        assert code == 0, (out, err)
        code, out, err = await etcd_command(secured, "reader", "status", "-o", "json")
        assert code == 0, (out, err)
        status = json.loads(out)
        assert status["leader"] == coord.address, status
        for kind in ("collections", "partitions", "segments", "channels", "tasks", "sessions", "streams", "snodes"):
            code, out, err = await etcd_command(secured, "reader", "meta", "show", kind, "-o", "json")
            assert code == 0 and "Traceback" not in err, (kind, out, err)
        # Other tests of this module left odd keys under the root: verify lists them (exit 1), read as the reader.
        code, out, err = await etcd_command(secured, "reader", "meta", "verify")
        assert code in (0, 1) and f"root {ROOT} at revision" in out and "Traceback" not in err, (out, err)
        before = await secured_revision(secured)
        code, out, err = await etcd_command(secured, "reader", "meta", "repair", "--apply")
        said, *errors = err.strip().splitlines()  # the deployment it reads, then the one error line
        assert code != 0 and "Traceback" not in err and said.startswith(f'reading root "{ROOT}"'), (out, err)
        assert len(errors) == 1 and errors[0].startswith("error: "), (out, err)
        assert await secured_revision(secured) == before, "a refused repair wrote something"
    finally:
        await coord.stop()


async def secured_revision(secured: Secured) -> int:
    client = await connect(secured.cluster.config(user=ADMIN, password=ADMIN_PASSWORD))
    try:
        return await MetaKV(client, ROOT).revision()
    finally:
        await client.close()
