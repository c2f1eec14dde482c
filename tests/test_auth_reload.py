"""The principals file and its token files are re-read when they change; a bad change keeps the old table.

A rewritten token file makes the new token work and the old one refused, without a restart. A change that does
not parse leaves the previous table in force, logs one error naming the file and line, counts it
(``querycoord_auth_reload_errors_total``) and shows the table stale (``querycoord_auth_config_stale``) until a
good version comes. Whatever a principals file holds, reading it is a ``PrincipalsError`` naming the file and line
or a table: never another exception (which once made the next call answer UNKNOWN with a traceback).

Tested on the ``Authenticator`` itself, behind a real in-process gRPC server, and on a real ``querycoord coord``
process (its calls, log and ``/metrics``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from meta.ops.child import child_env
from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2
from proto import querycoord_pb2_grpc as qc_grpc
from querycoord.security.auth import Authenticator, PrincipalsError, Refused
from querycoord.security.grpc_channels import GrpcSecurity, add_port, make_channel, make_server
from tests.spawn import spawn_coordinator


def new_token() -> str:
    return secrets.token_urlsafe(24)  # always 32 characters: a rotated token file keeps its size


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def principals_text(token_file: Path, admin: str) -> str:
    return f"""# who may call
[[token]]
principal = "admin"
role = "admin"
sha256 = "{sha(admin)}"

[[token]]
principal = "reader"
role = "reader"
token_file = "{token_file}"
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path, str, str]:
    """The principals file, the reader's token file, the reader's and the admin's tokens."""
    reader, admin = new_token(), new_token()
    token_file = tmp_path / "reader.token"
    token_file.write_text(reader + "\n")
    principals = tmp_path / "principals.toml"
    principals.write_text(principals_text(token_file, admin))
    return principals, token_file, reader, admin


def who(auth: Authenticator, token: str) -> str | None:
    """The principal ``token`` is known as, None when it is refused."""
    try:
        return auth.identify([("authorization", f"Bearer {token}")], dict).name
    except Refused:
        return None


def metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


# ----- the table ------------------------------------------------------------------------------------------------------
def test_a_rewritten_token_file_is_reloaded(files: tuple[Path, Path, str, str], log_lines: list[str]) -> None:
    principals, token_file, old, admin = files
    auth = Authenticator.load(principals)
    auth.RELOAD_INTERVAL = 0  # look at the files on every call
    assert who(auth, old) == "reader"
    new = new_token()
    token_file.write_text(new + "\n")  # same size, same second: only the contents differ
    assert (who(auth, new), who(auth, old), who(auth, admin)) == ("reader", None, "admin")
    assert not auth.stale
    assert any("re-read" in line for line in log_lines)


def test_a_bad_change_keeps_the_old_table_logs_file_and_line_and_sets_the_metrics(
        files: tuple[Path, Path, str, str], log_lines: list[str]) -> None:
    principals, token_file, reader, admin = files
    auth = Authenticator.load(principals)
    auth.RELOAD_INTERVAL = 0
    errors, stale = metric("querycoord_auth_reload_errors_total"), metric("querycoord_auth_config_stale")
    good = principals.read_text()
    principals.write_text(good + '\n[[certificate]]\nname = "n-{node_id}"\nrole = "admin"\n')  # line 12
    assert (who(auth, reader), who(auth, admin)) == ("reader", "admin")  # the previous table stays in force
    assert auth.stale and metric("querycoord_auth_config_stale") == stale + 1
    assert metric("querycoord_auth_reload_errors_total") == errors + 1
    failed = [line for line in log_lines if line.startswith("ERROR")]
    assert len(failed) == 1 and f"{principals}:12: [[certificate]] #1: only a node principal" in failed[0], failed
    assert (who(auth, reader), who(auth, admin)) == ("reader", "admin")  # the same bad file: logged once
    assert len([line for line in log_lines if line.startswith("ERROR")]) == 1
    assert metric("querycoord_auth_reload_errors_total") == errors + 1
    # A token file the bad version names, missing then written: watched too.
    missing = token_file.with_name("later.token")
    principals.write_text(principals_text(missing, admin))
    assert who(auth, reader) == "reader" and auth.stale
    assert f"{principals}:7: [[token]] #2: token_file {missing}: No such file or directory" in log_lines[-1]
    later = new_token()
    missing.write_text(later)
    assert (who(auth, later), who(auth, reader)) == ("reader", None)
    assert not auth.stale and metric("querycoord_auth_config_stale") == stale


# The files that once raised AttributeError, TypeError, re.error or UnicodeDecodeError out of the parser: at start a
# traceback, on reload an UNKNOWN answer with a traceback and the bad file silently kept.
MALFORMED = [
    ('certificate = ["streamnode-1"]\n', ":1: [[certificate]] #1: expected a table"),
    ("token = 5\n", ":1: token must be [[token]] tables, got int"),
    ('[token]\nprincipal = "x"\n', ":1: token must be [[token]] tables, got dict"),
    ('[[certificate]]\nname = "n-{node_id}-{node_id}"\nrole = "node"\n', ":1: [[certificate]] #1: name may hold"),
    ('\n[[token]]\nprincipal = "x"\nrole = "reader"\ntoken_file = 5\n',
     ":2: [[token]] #1: token_file must name a file"),
    ('[[token]]\nprincipal = "x"\nrole = "admin"\nsha256 = "' + "a" * 64 + '"\nnode_id = 5\n',
     ":1: [[token]] #1: only a node principal"),
    ('[[token]]\nprincipal = "x"\nrole = "node"\nnode_id = 99999999999999999999\nsha256 = "' + "a" * 64 + '"\n',
     ":1: [[token]] #1: node_id must be a positive integer"),
    ("[[token]\n", ":1: not valid TOML"),
]


@pytest.mark.parametrize(("body", "says"), MALFORMED)
def test_a_malformed_principals_file_is_one_error_naming_file_and_line(tmp_path: Path, body: str, says: str) -> None:
    path = tmp_path / "principals.toml"
    path.write_text(body)
    with pytest.raises(PrincipalsError) as e:
        Authenticator.load(path)
    assert f"{path}{says}" in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_principals_file_that_is_not_text_or_names_a_binary_token_file(tmp_path: Path) -> None:
    path = tmp_path / "principals.toml"
    path.write_bytes(b"\xff\xfe[[token]]\n")
    with pytest.raises(PrincipalsError, match="is not UTF-8 text"):
        Authenticator.load(path)
    binary = tmp_path / "binary.token"
    binary.write_bytes(b"\x80" * 40)
    path.write_text(f'[[token]]\nprincipal = "x"\nrole = "reader"\ntoken_file = "{binary}"\n')
    with pytest.raises(PrincipalsError, match=rf"{path}:1: \[\[token\]\] #1: token_file {binary} is not UTF-8"):
        Authenticator.load(path)


# A little TOML writer for generated documents: every key a principals file knows and a few it does not, every
# value type TOML has, tables and arrays of tables nested where they do not belong.
KEYS = st.sampled_from(["token", "certificate", "principal", "role", "node_id", "sha256", "token_file", "name", "x"])
SCALARS = st.one_of(
    st.integers(-(2**70), 2**70), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["admin", "reader", "node", "coordinator", "root", "", "{node_id}", "n-{node_id}-{node_id}",
                     "a" * 64, "/nonexistent", "/dev/null", "(", "[a-"]),
    st.text(max_size=20),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(KEYS, inner, max_size=4)), max_leaves=10)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


DOCUMENTS = st.lists(st.one_of(
    st.tuples(st.just("array"), st.sampled_from(["token", "certificate", "x"]), st.dictionaries(KEYS, VALUES,
                                                                                                   max_size=5)),
    st.tuples(st.just("key"), KEYS, VALUES),
), max_size=5)


def toml_document(parts: list[tuple[str, object, object]]) -> str:
    lines = []
    for kind, name, body in parts:
        if kind == "array":
            lines.append(f"[[{name}]]")
            assert isinstance(body, dict)
            lines.extend(f"{k} = {toml_value(v)}" for k, v in body.items())
        else:
            lines.insert(0, f"{name} = {toml_value(body)}")  # top-level keys before any table
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=DOCUMENTS)
def test_whatever_a_principals_file_holds_it_is_a_table_or_a_principals_error(tmp_path: Path,
                                                                              parts: list[tuple[str, object, object]]
                                                                              ) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_text(toml_document(parts))
    try:
        Authenticator.load(path)
    except PrincipalsError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


# ----- behind a gRPC server ------------------------------------------------------------------------------------------
async def test_a_server_answers_with_the_old_table_while_the_file_is_bad(files: tuple[Path, Path, str, str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The next call after a malformed rewrite is answered by the previous table, not UNKNOWN."""
    from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

    principals, token_file, reader, _ = files
    monkeypatch.setattr(Authenticator, "RELOAD_INTERVAL", 0.0)
    security = GrpcSecurity(tokens_file=principals)
    server = make_server(security)
    reflection.enable_server_reflection((reflection.SERVICE_NAME,), server)
    port = add_port(server, "127.0.0.1:0", security)
    await server.start()

    async def call(token: str) -> grpc.StatusCode:
        async with make_channel(f"127.0.0.1:{port}", GrpcSecurity(token=token)) as ch:
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            try:
                async for _ in reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(iter([request]),
                                                                                                 timeout=10):
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK

    try:
        assert await call(reader) == grpc.StatusCode.OK
        principals.write_text('certificate = ["streamnode-1"]\n')
        assert await call(reader) == grpc.StatusCode.OK
        rotated = new_token()
        token_file.write_text(rotated)
        principals.write_text(principals_text(token_file, new_token()))
        assert await call(rotated) == grpc.StatusCode.OK
        assert await call(reader) == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(None)


# ----- a real coordinator ---------------------------------------------------------------------------------------------
async def test_a_coordinator_takes_a_rotated_token_without_restart_and_keeps_its_table_on_a_bad_file(
        etcd: EtcdCluster, root_path: str, tmp_path: Path, files: tuple[Path, Path, str, str]) -> None:
    principals, token_file, old, admin = files
    coord = await spawn_coordinator(etcd, root_path, tmp_path, "--auth-tokens-file", str(principals),
                                    "--http-listen", "127.0.0.1:0", log_level="INFO")
    try:
        async def show(token: str) -> grpc.StatusCode:
            async with make_channel(coord.address, GrpcSecurity(token=token)) as ch:
                try:
                    await qc_grpc.QueryCoordStub(ch).ShowCollections(querycoord_pb2.ShowCollectionsRequest(),
                                                                     timeout=10)
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
            return grpc.StatusCode.OK

        async def eventually(what: str, check: object, timeout: float = 30.0) -> None:
            deadline = time.monotonic() + timeout
            while not await check():  # type: ignore[operator]
                assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s\n{coord.tail()}"
                await asyncio.sleep(0.2)

        async def metrics() -> str:
            url = f"http://{coord.ready['http_address']}/metrics"
            with await asyncio.to_thread(urllib.request.urlopen, url, timeout=10) as r:
                return r.read().decode()

        assert await show(old) == grpc.StatusCode.OK
        new = new_token()
        token_file.write_text(new + "\n")

        async def rotated() -> bool:
            return await show(new) == grpc.StatusCode.OK

        await eventually("the new token accepted", rotated)
        assert await show(old) == grpc.StatusCode.UNAUTHENTICATED

        principals.write_text(principals.read_text().replace('role = "reader"', 'role = "superuser"'))

        async def stale() -> bool:
            await show(new)  # the files are looked at when a call comes
            return "querycoord_auth_config_stale 1.0" in await metrics()

        await eventually("the bad file noticed", stale)
        assert await show(new) == grpc.StatusCode.OK and await show(admin) == grpc.StatusCode.OK
        assert "querycoord_auth_reload_errors_total 1.0" in await metrics()
        log = await asyncio.to_thread(Path(str(coord.log_path)).read_text)
        bad = [line for line in log.splitlines() if "cannot be used" in line]
        assert len(bad) == 1 and f"{principals}:7: [[token]] #2: role must be one of" in bad[0], bad
        assert "Traceback" not in log and new not in log and old not in log
    finally:
        await coord.stop()


async def test_a_coordinator_refuses_to_start_with_a_malformed_principals_file(tmp_path: Path) -> None:
    principals = tmp_path / "principals.toml"
    principals.write_text('[[certificate]]\nname = "a"\nrole = "admin"\n\n[[certificate]]\nname = 7\n')
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "querycoord.cli", "coord", "--etcd-endpoints", "127.0.0.1:1", "--auth-tokens-file",
        str(principals), env=child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert proc.returncode == 2, text
    assert text == f"error: {principals}:5: [[certificate]] #2: name (the certificate's common name or DNS name) is " \
                   "required\n", text
