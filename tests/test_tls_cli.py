"""``querycoord coord`` and ``querycoord querynode`` as processes against an etcd with TLS and user/password auth.

Everything they need comes from a configuration file, the environment and
flags, never from Python: the endpoints, the CA and the client certificate
from ``[etcd]``, the user from ``$QUERYCOORD_ETCD_USER`` for the node, and
the password from a file; the password is on no command line. The
coordinator must lead and list the node; a wrong password must be one clear
error line and an exit, not a retry loop. ``status`` and ``etcd status``,
which read etcd themselves, reach it with the same file.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from meta.client import EtcdClient
from meta.ops.child import child_env
from meta.ops.etcd_server import EtcdCluster
from tests.certs import CertFiles, server_tls
from tests.etcd_auth import enable_auth
from tests.spawn import Spawned, spawn_ready

USER = "querycoord"
PASSWORD = "tls-auth-pw-5521"


@pytest.fixture(scope="module")
def secured_etcd(tmp_path_factory: pytest.TempPathFactory, certs: CertFiles) -> Iterator[EtcdCluster]:
    """One member serving TLS only, requiring client certificates of our CA, with user/password auth on."""
    tls = server_tls(certs)
    with EtcdCluster(tmp_path_factory.mktemp("etcd-secured"), tls=tls) as cluster:

        async def enable() -> None:
            async with EtcdClient(cluster.config(cert_file=certs.client_cert, key_file=certs.client_key)) as c:
                await enable_auth(c, USER, PASSWORD)

        asyncio.run(enable())
        yield cluster


def write_config(tmp_path: Path, etcd: EtcdCluster, certs: CertFiles, password: str, *, user: bool = True) -> Path:
    pw = tmp_path / "etcd-password"
    pw.write_text(password + "\n")
    pw.chmod(0o600)
    config = tmp_path / "querycoord.toml"
    config.write_text(f"""
[etcd]
endpoints = {[*etcd.endpoints]!r}
cacert = "{certs.ca_file}"
cert = "{certs.client_cert}"
key = "{certs.client_key}"
{f'user = "{USER}"' if user else ""}
password_file = "{pw}"

[coord]
listen = "127.0.0.1:0"
ttl = 2

[log]
format = "json"
""".replace("'", '"'))
    return config


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


async def querycoord(*args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", *args, env=child_env(),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_coord_and_querynode_on_tls_and_auth_from_config_env_and_flags(
        secured_etcd: EtcdCluster, certs: CertFiles, tmp_path: Path) -> None:
    config = write_config(tmp_path, secured_etcd, certs, PASSWORD)
    root = "tls-cli"
    coord: Spawned | None = None
    node: Spawned | None = None
    try:
        # The coordinator: --config and --root as flags, everything else from the file.
        coord = await spawn_ready("coord", ["-m", "querycoord.cli", "coord", "--config", str(config), "--root", root],
                                  tmp_path)
        await coord.wait_event("leader", 60)
        # The node: the file named by $QUERYCOORD_CONFIG, the user from the environment (not in that file).
        (tmp_path / "node").mkdir()
        node_config = write_config(tmp_path / "node", secured_etcd, certs, PASSWORD, user=False)
        env = child_env()
        env.update({"QUERYCOORD_CONFIG": str(node_config), "QUERYCOORD_ETCD_USER": USER})
        node = await spawn_ready("querynode", ["-m", "querycoord.cli", "querynode", "--root", root,
                                               "--listen", "127.0.0.1:0", "--ttl", "2"], tmp_path, env=env)
        for p in (coord, node):
            assert PASSWORD not in cmdline(p.pid)
        deadline = time.monotonic() + 60
        while True:
            code, out, err = await querycoord("nodes", "--address", coord.address, "--timeout", "30")
            if code == 0 and any(line.split()[:1] == [str(node.node_id)] for line in out.splitlines()):
                break
            assert time.monotonic() < deadline, f"the leader never listed node {node.node_id}: {out}{err}"
            await asyncio.sleep(0.2)
        # The commands that read etcd themselves take the same file.
        code, out, err = await querycoord("status", "--config", str(config), "--root", root, "-o", "json")
        assert code == 0 and coord.address in out, (out, err)
        code, out, err = await querycoord("etcd", "status", "--config", str(config), "-o", "json")
        assert code == 0 and secured_etcd.endpoints[0] in out, (out, err)
    finally:
        for p in (node, coord):
            if p is not None:
                await p.stop()
    log = (tmp_path / "coord.log").read_text()
    assert PASSWORD not in log and '"fence_revision"' in log


async def test_a_wrong_password_is_one_clear_error(secured_etcd: EtcdCluster, certs: CertFiles,
                                                  tmp_path: Path) -> None:
    config = write_config(tmp_path, secured_etcd, certs, "not-the-password-77")
    code, out, err = await querycoord("coord", "--config", str(config), "--root", "tls-cli-wrong")
    assert code == 1, (out, err)
    assert "authentication failed" in err, err
    assert "not-the-password-77" not in out + err and PASSWORD not in out + err
    assert "Traceback" not in err
