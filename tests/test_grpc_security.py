"""TLS, authentication, roles and node identity on every gRPC surface, and INVALID_ARGUMENT for undecodable bytes.

The secured cluster is real processes (a coordinator, a query node, a stream
node) configured only by TOML files, ``QUERYCOORD_*`` variables and token
files, with throwaway certificates (``tests/certs.py``): mutual TLS
everywhere, and one principals file naming who may call what. The clients
are the ``querycoord`` command line (a user's certificate and token) and
in-process channels built by ``querycoord.security.grpc_channels`` with a chosen
identity. The standalone catalog server is tested in-process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from meta.kv import MetaKV
from meta.ops.child import child_env
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from proto import (
    catalog_pb2,
    catalog_pb2_grpc,
    common_pb2,
    querycoord_pb2,
    querynode_pb2,
    querynode_pb2_grpc,
    stream_pb2,
    stream_pb2_grpc,
)
from proto import querycoord_pb2_grpc as qc_grpc
from querycoord.catalog.service import start_catalog_server
from querycoord.catalog.store import CatalogStore
from querycoord.security.auth import RULES, SERVICES, Authenticator, PrincipalsError, Role, missing_rules
from querycoord.security.grpc_channels import GrpcSecurity, SecurityConfigError, add_port, make_channel, make_server
from tests.certs import Authority, Issued, make_authority
from tests.spawn import Spawned, spawn_coordinator, spawn_query_node, spawn_stream_node

QUERY_NODE_ID = 5
STREAM_NODE_ID = 7
OTHER_NODE_ID = 8


# ----- the rule table ------------------------------------------------------------------------------------------------
def test_every_rpc_of_every_served_service_has_an_access_rule() -> None:
    assert missing_rules() == []
    served = {f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods}
    assert set(RULES) == served
    # Mutations are admin's, a query node's mutations the coordinator's, a heartbeat a node's.
    assert RULES["/querycoord.query.QueryCoord/LoadCollection"] == {Role.ADMIN}
    assert RULES["/querycoord.node.QueryNode/LoadSegments"] == {Role.COORDINATOR}
    assert RULES["/querycoord.stream.StreamMgmt/StreamHeartbeat"] == {Role.NODE}
    assert Role.READER in RULES["/querycoord.query.QueryCoord/ShowCollections"]
    assert RULES["/querycoord.query.QueryCoord/StepBack"] == {Role.COORDINATOR}


@pytest.mark.parametrize(("body", "says"), [
    ('[[token]]\nprincipal = "x"\nrole = "root"\nsha256 = "' + "a" * 64 + '"\n', "role must be one of"),
    ('[[token]]\nprincipal = "x"\nrole = "node"\nsha256 = "' + "a" * 64 + '"\n', "names its node"),
    ('[[token]]\nprincipal = "x"\nrole = "admin"\n', "give sha256"),
    ('[[token]]\nprincipal = "x"\nrole = "admin"\ntoken = "plain"\n', "unknown keys"),
    ('[[certificate]]\nname = "a"\nrole = "admin"\nnode_id = 3\n', "only a node principal"),
    ("[users]\n", "unknown tables"),
])
def test_a_bad_principals_file_is_one_error_naming_the_entry(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "principals.toml"
    path.write_text(body)
    with pytest.raises(PrincipalsError, match=says):
        Authenticator.load(path)


def test_security_settings_that_do_not_go_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SecurityConfigError, match="--tls-key"):
        GrpcSecurity(ca_file=tmp_path / "ca.pem", cert_file=tmp_path / "c.pem")
    with pytest.raises(SecurityConfigError, match="--insecure"):
        GrpcSecurity(insecure=True, token="t")
    with pytest.raises(SecurityConfigError, match="--tls-ca"):
        GrpcSecurity(ca_file=tmp_path / "missing.pem").check()
    assert "t0ken" not in repr(GrpcSecurity(token="t0ken"))


# ----- identities ----------------------------------------------------------------------------------------------------
@dataclass
class Pki:
    """A CA and a certificate per principal; an unrelated CA and a certificate of it."""

    ca: Authority
    coordinator: Issued
    query_node: Issued
    stream_node: Issued
    other_node: Issued
    user: Issued  # names no principal: users are known by their tokens
    rogue_ca: Authority
    rogue: Issued
    tokens: dict[str, str]  # role name -> token
    principals: Path
    token_files: dict[str, Path]


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("grpc-pki")
    ca = make_authority(d / "ca")
    rogue_ca = make_authority(d / "rogue", "rogue test CA")
    tokens = {name: f"{name}-{secrets.token_urlsafe(24)}" for name in ("admin", "reader", "node8", "coord")}
    token_files = {}
    for name, token in tokens.items():
        path = d / f"{name}.token"
        path.write_text(token + "\n")
        path.chmod(0o600)
        token_files[name] = path
    principals = d / "principals.toml"
    principals.write_text(f"""
[[token]]
principal = "alice"
role = "admin"
sha256 = "{_sha(tokens['admin'])}"

[[token]]
principal = "bob"
role = "reader"
token_file = "{token_files['reader']}"

[[token]]
principal = "streamnode-8-token"
role = "node"
node_id = {OTHER_NODE_ID}
sha256 = "{_sha(tokens['node8'])}"

[[token]]
principal = "coordinator-token"
role = "coordinator"
sha256 = "{_sha(tokens['coord'])}"

[[certificate]]
name = "querycoord-coordinator"
role = "coordinator"

[[certificate]]
name = "streamnode-{{node_id}}"
role = "node"
""")
    return Pki(ca=ca, coordinator=ca.issue("querycoord-coordinator"), query_node=ca.issue(f"querynode-{QUERY_NODE_ID}"),
               stream_node=ca.issue(f"streamnode-{STREAM_NODE_ID}"), other_node=ca.issue(f"streamnode-{OTHER_NODE_ID}"),
               user=ca.issue("cli-user"), rogue_ca=rogue_ca, rogue=rogue_ca.issue("querycoord-coordinator"),
               tokens=tokens, principals=principals, token_files=token_files)


def identity(pki: Pki, cert: Issued | None, token: str | None = None, *, ca: Path | None = None) -> GrpcSecurity:
    """What an in-process client presents: a certificate (or none) and a token (or none), trusting ``ca``."""
    return GrpcSecurity(ca_file=ca or pki.ca.ca_file, cert_file=cert.cert if cert else None,
                        key_file=cert.key if cert else None, token=token)


def server_security(pki: Pki, cert: Issued) -> GrpcSecurity:
    return GrpcSecurity(ca_file=pki.ca.ca_file, cert_file=cert.cert, key_file=cert.key, client_auth=True,
                        tokens_file=pki.principals)


async def code_of(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# ----- the standalone catalog server, in-process ---------------------------------------------------------------------
@pytest.fixture
async def catalog_port(kv: MetaKV, pki: Pki) -> AsyncIterator[int]:
    server, port = await start_catalog_server(CatalogStore(kv), security=server_security(pki, pki.query_node))
    yield port
    await server.stop(None)


async def test_catalog_server_tls_roles_and_undecodable_bytes(catalog_port: int, pki: Pki, tmp_path: Path) -> None:
    from loguru import logger

    address = f"127.0.0.1:{catalog_port}"
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{level} {message}")
    try:
        channels: list[grpc.aio.Channel] = []  # kept: a channel nobody refers to is closed

        def stub(security: GrpcSecurity) -> catalog_pb2_grpc.CatalogStub:
            channels.append(make_channel(address, security))
            return catalog_pb2_grpc.CatalogStub(channels[-1])

        create = catalog_pb2.CreateCollectionRequest(collection_name="secured", num_partitions=2)
        show = catalog_pb2.ShowCollectionsRequest()
        admin = stub(identity(pki, pki.user, pki.tokens["admin"]))
        reader = stub(identity(pki, pki.user, pki.tokens["reader"]))
        # Without a credential: UNAUTHENTICATED; with the reader's: reads only.
        assert await code_of(stub(identity(pki, pki.user)).ShowCollections(show, timeout=5)) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(reader.CreateCollection(create, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        assert list((await reader.ShowCollections(show, timeout=5)).collections) == []
        assert (await admin.CreateCollection(create, timeout=5)).status.error_code == 0
        assert [c.name for c in (await reader.ShowCollections(show, timeout=5)).collections] == ["secured"]
        # A wrong token is refused even with a good certificate; a node may not read the catalog.
        assert await code_of(stub(identity(pki, pki.user, "not-a-token")).ShowCollections(show, timeout=5)) == \
            grpc.StatusCode.UNAUTHENTICATED
        assert await code_of(stub(identity(pki, pki.stream_node)).ShowCollections(show, timeout=5)) == \
            grpc.StatusCode.PERMISSION_DENIED
        # TLS: no client certificate, an unknown CA, or plaintext: no connection at all.
        for bad in (identity(pki, None, pki.tokens["admin"]), identity(pki, pki.rogue, ca=pki.rogue_ca.ca_file),
                    identity(pki, pki.rogue, pki.tokens["admin"]), GrpcSecurity(token=pki.tokens["admin"])):
            assert await code_of(stub(bad).ShowCollections(show, timeout=5)) == grpc.StatusCode.UNAVAILABLE
        # Undecodable bytes: INVALID_ARGUMENT and one short line, no traceback.
        channel = make_channel(address, identity(pki, pki.user, pki.tokens["admin"]))
        raw = channel.unary_unary("/querycoord.catalog.Catalog/CreateCollection")
        assert await code_of(raw(b"\xff\xff\xff\xff\xff\xff", timeout=5)) == grpc.StatusCode.INVALID_ARGUMENT
        await channel.close()
        for ch in channels:
            await ch.close()
    finally:
        logger.remove(sink)
    text = "\n".join(lines)
    assert "do not decode" in text and "Traceback" not in text
    assert all(token not in text for token in pki.tokens.values())


async def test_health_is_open_and_reflection_needs_a_principal(pki: Pki) -> None:
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

    security = GrpcSecurity(tokens_file=pki.principals)  # authentication without TLS: tokens alone
    server = make_server(security)
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(("grpc.health.v1.Health", reflection.SERVICE_NAME), server)
    port = add_port(server, "127.0.0.1:0", security)
    await server.start()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    try:
        async def services(token: str | None) -> list[str] | grpc.StatusCode:
            async with make_channel(f"127.0.0.1:{port}", GrpcSecurity(token=token)) as ch:
                probe = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert probe.status == health_pb2.HealthCheckResponse.SERVING  # open to all
                request = reflection_pb2.ServerReflectionRequest(list_services="")
                try:
                    async for r in reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
                            iter([request]), timeout=5):
                        return [s.name for s in r.list_services_response.service]
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
            return []

        assert await services(None) == grpc.StatusCode.UNAUTHENTICATED
        assert "grpc.health.v1.Health" in await services(pki.tokens["reader"])  # type: ignore[operator]
    finally:
        await server.stop(None)


async def test_message_size_limits_are_explicit_on_both_ends() -> None:
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    small = GrpcSecurity(max_message_bytes=1 << 20)
    server = make_server(small)
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = add_port(server, "127.0.0.1:0", small)
    await server.start()
    big = health_pb2.HealthCheckRequest(service="x" * (2 << 20))
    try:
        for client in (GrpcSecurity(), small):  # the server refuses it; a client of the same limit does not send it
            async with make_channel(f"127.0.0.1:{port}", client) as ch:
                assert await code_of(health_pb2_grpc.HealthStub(ch).Check(big, timeout=5)) == \
                    grpc.StatusCode.RESOURCE_EXHAUSTED
        assert GrpcSecurity().max_message_bytes == 16 << 20
    finally:
        await server.stop(None)


# ----- the secured cluster as processes ------------------------------------------------------------------------------
def write_config(path: Path, etcd: EtcdCluster, pki: Pki, cert: Issued, *, principals: bool = True,
                 client_auth: bool = True) -> Path:
    path.write_text(f"""
[etcd]
endpoints = {list(etcd.endpoints)!r}

[tls]
ca = "{pki.ca.ca_file}"
cert = "{cert.cert}"
key = "{cert.key}"
client_auth = {"true" if client_auth else "false"}

[auth]
{f'tokens_file = "{pki.principals}"' if principals else ""}
""".replace("'", '"'))
    return path


async def querycoord(*args: str, env: dict[str, str], timeout: float = 60.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def read_log(p: Spawned) -> str:
    return Path(str(p.log_path)).read_text()


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


async def poll(what: str, check: object, timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()  # type: ignore[operator]
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        await asyncio.sleep(0.2)


async def test_secured_cluster_mutual_tls_roles_and_node_identity(etcd: EtcdCluster, root_path: str, pki: Pki,
                                                                  tmp_path: Path) -> None:
    coord_cfg = write_config(tmp_path / "coord.toml", etcd, pki, pki.coordinator)
    node_cfg = write_config(tmp_path / "querynode.toml", etcd, pki, pki.query_node)
    stream_cfg = write_config(tmp_path / "streamnode.toml", etcd, pki, pki.stream_node, principals=False)
    user_cfg = write_config(tmp_path / "user.toml", etcd, pki, pki.user, principals=False)
    procs: list[Spawned] = []
    try:
        coord = await spawn_coordinator(etcd, root_path, tmp_path, "--config", str(coord_cfg), log_level="INFO")
        procs.append(coord)
        await coord.wait_event("leader", 60)
        node = await spawn_query_node(etcd, root_path, tmp_path, "--config", str(node_cfg), "--listen",
                                      "127.0.0.1:0", "--ttl", "2", "--node-id", str(QUERY_NODE_ID))
        procs.append(node)
        assert node.node_id == QUERY_NODE_ID

        admin_env = {**child_env(), "QUERYCOORD_CONFIG": str(user_cfg),
                     "QUERYCOORD_AUTH_TOKEN_FILE": str(pki.token_files["admin"])}
        reader_env = {**child_env(), "QUERYCOORD_CONFIG": str(user_cfg), "QUERYCOORD_AUTH_TOKEN": pki.tokens["reader"]}
        anonymous_env = {**child_env(), "QUERYCOORD_CONFIG": str(user_cfg)}
        at = ("--address", coord.address, "--timeout", "30")

        # The coordinator reaches the query node over mutual TLS as a coordinator: a load completes.
        code, out, err = await querycoord("collection", "create", "c1", "--segments", "12", *at, env=admin_env)
        assert code == 0, out + err
        code, out, err = await querycoord("collection", "load", "c1", *at, env=admin_env)
        assert code == 0, out + err + coord.tail() + node.tail()
        code, out, err = await querycoord("collection", "show", "c1", "-o", "json", *at, env=reader_env)
        assert code == 0 and json.loads(out)[0]["loaded_percentage"] == 100, out + err

        # Roles from the command line: the reader reads but may not release; nobody without a credential.
        code, out, err = await querycoord("collection", "release", "c1", *at, env=reader_env)
        assert code == 1 and "PERMISSION_DENIED" in err and "bob" in err and "Traceback" not in err, err
        code, out, err = await querycoord("nodes", *at, env=anonymous_env)
        assert code == 1 and "UNAUTHENTICATED" in err, err
        code, out, err = await querycoord("nodes", *at, env=reader_env)
        assert code == 0 and str(QUERY_NODE_ID) in out, out + err
        # A client that does not trust the servers' CA, or speaks plaintext, gets no answer at all.
        code, out, err = await querycoord("nodes", *at, "--timeout", "2", "--tls-ca", str(pki.rogue_ca.ca_file),
                                          env=reader_env)
        assert code == 1 and "TLS handshake failed" in err, err
        code, out, err = await querycoord("nodes", *at, "--timeout", "2",
                                          env={**child_env(), "QUERYCOORD_AUTH_TOKEN": pki.tokens["reader"]})
        assert code == 1 and "closed the connection" in err, out + err

        # The query node takes mutations from a coordinator only.
        async def node_call(security: GrpcSecurity) -> grpc.StatusCode:
            async with make_channel(node.address, security) as ch:
                return await code_of(querynode_pb2_grpc.QueryNodeStub(ch).LoadSegments(
                    querynode_pb2.LoadSegmentsRequest(node_id=QUERY_NODE_ID, collection_id=1), timeout=5))

        assert await node_call(identity(pki, pki.user, pki.tokens["admin"])) == grpc.StatusCode.PERMISSION_DENIED
        assert await node_call(identity(pki, pki.stream_node)) == grpc.StatusCode.PERMISSION_DENIED
        assert await node_call(identity(pki, pki.user)) == grpc.StatusCode.UNAUTHENTICATED
        assert await node_call(identity(pki, None, pki.tokens["coord"])) == grpc.StatusCode.UNAVAILABLE  # no cert
        async with make_channel(node.address, identity(pki, pki.user, pki.tokens["reader"])) as ch:
            dist = await querynode_pb2_grpc.QueryNodeStub(ch).GetDataDistribution(
                querynode_pb2.GetDataDistributionRequest(), timeout=5)
            assert len(dist.segments) == 12  # the reads a reader may make; the load above is there
            raw = ch.unary_unary("/querycoord.node.QueryNode/ReleaseSegments")
            assert await code_of(raw(b"\x0a\xff\xff\xff\xff\xff", timeout=5)) == grpc.StatusCode.PERMISSION_DENIED

        # Stream node 7 heartbeats with its certificate (CN streamnode-7); its snode (created once the node is
        # live: snodes go only on live stream nodes) is picked up from etcd.
        stream = await spawn_stream_node(etcd, root_path, tmp_path, "--config", str(stream_cfg), "--node-id",
                                         str(STREAM_NODE_ID), "--coordinator", coord.address, "--snode",
                                         "--heartbeat-ms", "100", "--ttl", "2")
        procs.append(stream)
        admin = identity(pki, pki.user, pki.tokens["admin"])
        async with make_channel(coord.address, admin) as ch:
            created = await stream_pb2_grpc.StreamMgmtStub(ch).CreateSnode(
                stream_pb2.CreateSnodeRequest(node_id=STREAM_NODE_ID), timeout=10)
            assert created.status.error_code == 0, created
        snode = created.snode.id

        async def heard() -> bool:
            answer = await stream.command("tasks")
            return bool(answer.get("leader_revision")) and answer.get("snode_id") == snode

        await poll("stream node 7's heartbeats answered by the leader", heard)

        # Node identity: node 8 (by certificate or token) may not speak for node 7 nor claim 7's snode.
        async def beat(security: GrpcSecurity, node_id: int, snode_id: int = 0) -> grpc.StatusCode:
            async with make_channel(coord.address, security) as ch:
                return await code_of(stream_pb2_grpc.StreamMgmtStub(ch).StreamHeartbeat(
                    stream_pb2.HeartbeatRequest(node_id=node_id, snode_id=snode_id, vgroup_ids=[1]), timeout=5))

        other_cert = identity(pki, pki.other_node)
        other_token = identity(pki, pki.user, pki.tokens["node8"])
        assert await beat(other_cert, STREAM_NODE_ID) == grpc.StatusCode.PERMISSION_DENIED
        assert await beat(other_token, STREAM_NODE_ID) == grpc.StatusCode.PERMISSION_DENIED
        assert await beat(other_cert, OTHER_NODE_ID, snode) == grpc.StatusCode.PERMISSION_DENIED
        assert await beat(other_token, OTHER_NODE_ID, snode) == grpc.StatusCode.PERMISSION_DENIED
        assert await beat(identity(pki, pki.user, pki.tokens["admin"]), STREAM_NODE_ID) == \
            grpc.StatusCode.PERMISSION_DENIED  # admin is no node
        assert await beat(identity(pki, pki.user), STREAM_NODE_ID) == grpc.StatusCode.UNAUTHENTICATED
        # As itself node 8 is heard (and refused by the manager only because it has no session): the check is
        # the node's identity, not its role.
        assert await beat(other_cert, OTHER_NODE_ID) == grpc.StatusCode.OK
        # DrainNode: a node may ask it for itself only (its graceful stop); cordon is an administrator's.
        async with make_channel(coord.address, other_token) as ch:
            stub = qc_grpc.QueryCoordStub(ch)
            assert await code_of(stub.DrainNode(querycoord_pb2.NodeLifecycleRequest(node_id=STREAM_NODE_ID),
                                                timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
            assert await code_of(stub.CordonNode(querycoord_pb2.NodeLifecycleRequest(node_id=OTHER_NODE_ID),
                                                 timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
            own = await stub.DrainNode(querycoord_pb2.NodeLifecycleRequest(node_id=OTHER_NODE_ID), timeout=5)
            assert own.status.error_code == common_pb2.NOT_FOUND, own.status  # admitted; no query node 8 here
        # Nothing changed: the snode is still node 7's, and node 7 still heard.
        async with make_channel(coord.address, admin) as ch:
            shown = await stream_pb2_grpc.StreamMgmtStub(ch).ShowStreams(stream_pb2.ShowStreamsRequest(), timeout=10)
            assert [(s.id, s.node_id) for s in shown.snodes] == [(snode, STREAM_NODE_ID)]
            # StepBack is between coordinators only; a node's certificate may not mutate.
            stub = qc_grpc.QueryCoordStub(ch)
            assert await code_of(stub.StepBack(querycoord_pb2.StepBackRequest(), timeout=5)) == \
                grpc.StatusCode.PERMISSION_DENIED
        async with make_channel(coord.address, identity(pki, pki.stream_node)) as ch:
            assert await code_of(qc_grpc.QueryCoordStub(ch).ReleaseCollection(
                querycoord_pb2.ReleaseCollectionRequest(collection_id=1), timeout=5)) == \
                grpc.StatusCode.PERMISSION_DENIED
        first = (await stream.command("tasks"))["leader_revision"]
        await poll("stream node 7 still heard", heard)
        assert first

        # Undecodable bytes to the coordinator and the query node: INVALID_ARGUMENT.
        for address, who in ((coord.address, admin), (node.address, identity(pki, pki.coordinator))):
            async with make_channel(address, who) as ch:
                method = ("/querycoord.query.QueryCoord/LoadCollection" if address == coord.address
                          else "/querycoord.node.QueryNode/LoadSegments")
                raw = ch.unary_unary(method)
                assert await code_of(raw(b"\xff\xff\xff\xff\xff\xff", timeout=5)) == \
                    grpc.StatusCode.INVALID_ARGUMENT

        # Secrets: never on a command line.
        for p in procs:
            line = cmdline(p.pid)
            assert all(token not in line for token in pki.tokens.values()), line
    finally:
        for p in reversed(procs):
            await p.stop()
    logs = {p.name: read_log(p) for p in procs}
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-3000:]}"
        assert all(token not in text for token in pki.tokens.values()), name
    assert "do not decode" in logs["coord"] and "do not decode" in logs["querynode"]
    assert "PERMISSION_DENIED refused" in logs["coord"]
    assert "gRPC security is off" not in "".join(logs.values())


async def test_switchover_and_status_between_secured_coordinators(etcd: EtcdCluster, root_path: str, pki: Pki,
                                                                  tmp_path: Path) -> None:
    """The leader asks the standby ahead of the target to step back and the target for its state, as a
    coordinator (its certificate); users may only ask for what their role allows."""
    coord_cfg = write_config(tmp_path / "coord.toml", etcd, pki, pki.coordinator)
    user_cfg = write_config(tmp_path / "user.toml", etcd, pki, pki.user, principals=False)
    coords: list[Spawned] = []
    try:
        for i in range(3):
            coords.append(await spawn_coordinator(etcd, root_path, tmp_path, "--config", str(coord_cfg),
                                                  name=f"coord{i}", log_level="INFO"))
        await coords[0].wait_event("leader", 60)
        admin_env = {**child_env(), "QUERYCOORD_CONFIG": str(user_cfg),
                     "QUERYCOORD_AUTH_TOKEN_FILE": str(pki.token_files["admin"])}
        reader_env = {**child_env(), "QUERYCOORD_CONFIG": str(user_cfg), "QUERYCOORD_AUTH_TOKEN": pki.tokens["reader"]}
        target = coords[2].address
        at = ("--address", coords[0].address, "--timeout", "30")
        code, out, err = await querycoord("switchover", "--to", target, *at, env=reader_env)
        assert code == 1 and "PERMISSION_DENIED" in err, out + err
        code, out, err = await querycoord("switchover", "--to", target, "-o", "json", *at, env=admin_env)
        assert code == 0, out + err + "".join(c.tail() for c in coords)
        result = json.loads(out)
        assert (result["leader"], result["stepped_back"]) == (target, [coords[1].address]), result
        code, out, err = await querycoord("status", "--root", root_path, "-o", "json", env=reader_env)
        assert code == 0, out + err
        status = json.loads(out)
        assert status["leader"] == target
        rows = {c["address"]: c for c in status["coordinators"]}
        assert rows[target]["health"] == "SERVING" and rows[target]["since"], rows
        for p in coords:
            assert all(token not in cmdline(p.pid) for token in pki.tokens.values())
    finally:
        for p in coords:
            await p.stop()
    for p in coords:
        text = read_log(p)
        assert "Traceback" not in text and all(token not in text for token in pki.tokens.values()), p.name


async def test_development_mode_is_the_default_and_warns_once(etcd: EtcdCluster, root_path: str,
                                                              tmp_path: Path) -> None:
    env = {k: v for k, v in child_env().items() if not k.startswith(("QUERYCOORD_TLS", "QUERYCOORD_AUTH"))}
    node = await spawn_query_node(etcd, root_path, tmp_path, "--listen", "127.0.0.1:0", "--ttl", "2", env=env)
    try:
        async with make_channel(node.address, GrpcSecurity()) as ch:  # plaintext, no credential: answered
            dist = await querynode_pb2_grpc.QueryNodeStub(ch).GetDataDistribution(
                querynode_pb2.GetDataDistributionRequest(), timeout=5)
            assert dist.status.error_code == 0
    finally:
        await node.stop()
    log = read_log(node)
    assert log.count("gRPC security is off") == 1, log


def test_no_secret_in_the_environment_of_this_module() -> None:
    """The tests above pass tokens by file or variable to children; nothing leaks into this process's environment."""
    assert not any(k.startswith("QUERYCOORD_AUTH") for k in os.environ)


async def test_an_ip_address_in_a_certificate_names_no_principal(kv: MetaKV, pki: Pki, tmp_path: Path) -> None:
    """A principals file naming ``127.0.0.1`` must not match every certificate whose SANs hold that IP (all of
    this CA's do): only DNS names and the common name count. The same file's DNS entry still matches."""
    principals = tmp_path / "principals.toml"
    principals.write_text('[[certificate]]\nname = "127.0.0.1"\nrole = "admin"\n\n'
                          '[[certificate]]\nname = "cli-user"\nrole = "reader"\n')
    security = GrpcSecurity(ca_file=pki.ca.ca_file, cert_file=pki.query_node.cert, key_file=pki.query_node.key,
                            client_auth=True, tokens_file=principals)
    server, port = await start_catalog_server(CatalogStore(kv), security=security)
    try:
        create = catalog_pb2.CreateCollectionRequest(collection_name="by_ip", num_partitions=1)
        show = catalog_pb2.ShowCollectionsRequest()
        for cert, expect in ((pki.stream_node, grpc.StatusCode.UNAUTHENTICATED),
                             (pki.user, grpc.StatusCode.PERMISSION_DENIED)):
            async with make_channel(f"127.0.0.1:{port}", identity(pki, cert)) as ch:
                stub = catalog_pb2_grpc.CatalogStub(ch)
                assert await code_of(stub.CreateCollection(create, timeout=5)) == expect, cert
                if cert is pki.user:  # known by its common name: a reader
                    assert await code_of(stub.ShowCollections(show, timeout=5)) == grpc.StatusCode.OK
    finally:
        await server.stop(None)


class _Recorder(grpc.GenericRpcHandler):
    """A fake query node's server: records the metadata of every call it gets, answers none (UNIMPLEMENTED)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[tuple[str, Any], ...]]] = []

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        self.calls.append((handler_call_details.method, tuple(handler_call_details.invocation_metadata)))
        return None


async def test_a_fake_node_gets_nothing_it_can_replay_as_the_coordinator(etcd: EtcdCluster, kv: MetaKV,
                                                                         root_path: str, pki: Pki,
                                                                         tmp_path: Path) -> None:
    """The coordinator holds a token of the coordinator role besides its certificate (for a remote catalog, say).
    A node registered as nodes register (its own session, its own CA certificate) gets the coordinator's calls:
    whatever credential they carry, replayed to the coordinator and to another node, is refused, and the other
    node's collection stays loaded."""
    coord_cfg = write_config(tmp_path / "coord.toml", etcd, pki, pki.coordinator)
    node_cfg = write_config(tmp_path / "querynode.toml", etcd, pki, pki.query_node)
    user_cfg = write_config(tmp_path / "user.toml", etcd, pki, pki.user, principals=False)
    fake_cert = pki.ca.issue("querynode-9")
    recorder = _Recorder()
    fake_security = GrpcSecurity(ca_file=pki.ca.ca_file, cert_file=fake_cert.cert, key_file=fake_cert.key)
    fake = make_server(fake_security)
    fake.add_generic_rpc_handlers((recorder,))
    fake_port = add_port(fake, "127.0.0.1:0", fake_security)
    await fake.start()
    procs: list[Spawned] = []
    session: Session | None = None
    try:
        coord_env = {**child_env(), "QUERYCOORD_AUTH_TOKEN_FILE": str(pki.token_files["coord"])}
        coord = await spawn_coordinator(etcd, root_path, tmp_path, "--config", str(coord_cfg), log_level="INFO",
                                        env=coord_env)
        procs.append(coord)
        await coord.wait_event("leader", 60)
        node = await spawn_query_node(etcd, root_path, tmp_path, "--config", str(node_cfg), "--listen",
                                      "127.0.0.1:0", "--ttl", "2", "--node-id", str(QUERY_NODE_ID))
        procs.append(node)
        admin_env = {**child_env(), "QUERYCOORD_CONFIG": str(user_cfg),
                     "QUERYCOORD_AUTH_TOKEN_FILE": str(pki.token_files["admin"])}
        at = ("--address", coord.address, "--timeout", "30")
        code, out, err = await querycoord("collection", "create", "c1", "--segments", "6", *at, env=admin_env)
        assert code == 0, out + err
        code, out, err = await querycoord("collection", "load", "c1", *at, env=admin_env)
        assert code == 0, out + err + coord.tail() + node.tail()

        session = Session(kv, "querynode", f"127.0.0.1:{fake_port}", ttl=2, server_id=9,
                          extra={"capacity_bytes": 1 << 30})
        await session.start()

        async def called() -> bool:
            return bool(recorder.calls)

        await poll("the coordinator calls the fake node", called, timeout=60)
        replay = tuple({k: v for _, md in recorder.calls for k, v in md
                        if k != "user-agent" and not k.startswith(("grpc-", ":"))}.items())
        as_fake = identity(pki, fake_cert)
        async with make_channel(node.address, as_fake) as ch:
            code = await code_of(querynode_pb2_grpc.QueryNodeStub(ch).ReleaseCollection(
                querynode_pb2.ReleaseCollectionRequest(node_id=QUERY_NODE_ID, collection_id=1), metadata=replay,
                timeout=5))
            assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), code
        async with make_channel(node.address, identity(pki, pki.user, pki.tokens["reader"])) as ch:
            dist = await querynode_pb2_grpc.QueryNodeStub(ch).GetDataDistribution(
                querynode_pb2.GetDataDistributionRequest(), timeout=5)
            assert len(dist.segments) == 6  # still loaded
        async with make_channel(coord.address, as_fake) as ch:
            code = await code_of(qc_grpc.QueryCoordStub(ch).StepBack(querycoord_pb2.StepBackRequest(),
                                                                    metadata=replay, timeout=5))
            assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), code
        assert not [k for _, md in recorder.calls for k, _v in md if k == "authorization"]
    finally:
        if session is not None:
            await session.close()
        for p in reversed(procs):
            await p.stop()
        await fake.stop(None)
