"""TLS and user/password auth against a real etcd started with TLS or with auth enabled.

Certificates are made at test time (``tests/certs.py``). Each security mode
gets its own etcd (module-scoped, or per test where the test changes the
cluster's state), so the session-wide ``etcd`` fixture never has auth on.
Failures must be clear errors raised within the deadline, never hangs: the
upper bounds on elapsed time below only prove termination.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from meta.client import EtcdClient, connect
from meta.config import EtcdConfig
from meta.errors import MetaAuthError, MetaUnavailable
from meta.etcd_pb import RangeRequest
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from tests.certs import CertFiles, server_tls
from tests.etcd_auth import enable_auth

USER = "root"
PASSWORD = "s3cret-for-tests"
# Short budgets so refused connections fail fast; GENEROUS only proves that they terminate.
FAST = {"call_timeout": 0.5, "deadline": 2.0}
GENEROUS = 30.0


# ----- fixtures -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory, certs: CertFiles) -> Iterator[EtcdCluster]:
    """One member serving TLS and requiring client certificates signed by our CA."""
    tls = server_tls(certs)
    with EtcdCluster(tmp_path_factory.mktemp("etcd-tls"), tls=tls) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One plain member on which the first test to use it enables auth (see ``auth_enabled``)."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd-auth")) as cluster:
        yield cluster


@pytest.fixture
async def auth_enabled(auth_etcd: EtcdCluster) -> EtcdCluster:
    """``auth_etcd`` with auth on, enabled through an unauthenticated client (idempotent per test)."""
    async with EtcdClient(auth_etcd.config()) as client:
        await enable_auth(client, USER, PASSWORD)
    return auth_etcd


@pytest.fixture
async def user_client(auth_enabled: EtcdCluster) -> AsyncIterator[EtcdClient]:
    client = await connect(auth_enabled.config(user=USER, password=PASSWORD))
    yield client
    await client.close()


def tls_config(cluster: EtcdCluster, **kwargs: object) -> EtcdConfig:
    return EtcdConfig(endpoints=tuple(cluster.endpoints), **kwargs)  # type: ignore[arg-type]


# ----- TLS ------------------------------------------------------------------------------
async def test_tls_client_with_certificate_saves_and_loads(tls_etcd: EtcdCluster, certs: CertFiles) -> None:
    """The launcher started etcd with TLS (its health check used the plain-http metrics URL)."""
    assert tls_etcd.scheme == "https"
    assert tls_etcd.members[0].healthy()
    config = tls_etcd.config(cert_file=certs.client_cert, key_file=certs.client_key)
    assert config.ca_file == certs.ca_file
    async with await connect(config) as client:
        kv = MetaKV(client, "tls-test")
        await kv.save("a", "1")
        await kv.multi_save({"b": b"2", "c": "3"})
        assert await kv.get("a") == b"1"
        assert (await kv.load_prefix("")).as_dict() == {"a": b"1", "b": b"2", "c": b"3"}
        assert await kv.compare_and_swap("a", "1", "one")
        assert await kv.get("a") == b"one"


@pytest.mark.parametrize(
    ("case", "expected_hint"),
    [
        ("no client certificate", "refused the TLS client certificate"),
        ("client certificate from another CA", "refused the TLS client certificate"),
        ("server certificate not trusted", "server certificate was not accepted"),
        ("no TLS at all", "set ca_file"),
    ],
)
async def test_tls_misconfigured_client_fails_clearly_within_deadline(
    tls_etcd: EtcdCluster, certs: CertFiles, case: str, expected_hint: str
) -> None:
    """gRPC reports handshake failures as UNAVAILABLE; the error must still say what to fix."""
    configs = {
        "no client certificate": tls_config(tls_etcd, ca_file=certs.ca_file, **FAST),
        "client certificate from another CA": tls_config(
            tls_etcd, ca_file=certs.ca_file, cert_file=certs.rogue_cert, key_file=certs.rogue_key, **FAST
        ),
        "server certificate not trusted": tls_config(
            tls_etcd, ca_file=certs.other_ca_file, cert_file=certs.client_cert, key_file=certs.client_key, **FAST
        ),
        "no TLS at all": tls_config(tls_etcd, **FAST),
    }
    started = time.monotonic()
    with pytest.raises(MetaUnavailable) as e:
        await connect(configs[case])
    elapsed = time.monotonic() - started
    message = str(e.value)
    assert tls_etcd.endpoints[0] in message
    assert expected_hint in message, message
    assert elapsed < GENEROUS, f"{case}: took {elapsed:.1f}s with a {FAST['deadline']}s deadline"


async def test_tls_three_member_cluster(tmp_path: Path, certs: CertFiles) -> None:
    """Several TLS endpoints are verified against one name (``localhost`` in the server SAN)."""
    tls = server_tls(certs)
    with EtcdCluster(tmp_path / "etcd", size=3, tls=tls) as cluster:
        config = cluster.config(cert_file=certs.client_cert, key_file=certs.client_key)
        assert len(config.endpoints) == 3
        async with await connect(config) as client:
            kv = MetaKV(client, "tls3")
            for i in range(9):  # round-robin: every member answers some of these
                await kv.save(f"k{i}", str(i))
            assert await kv.count_prefix("k") == 9


# ----- user/password auth -----------------------------------------------------------------
async def test_user_with_password_can_save_load_and_txn(user_client: EtcdClient) -> None:
    kv = MetaKV(user_client, "auth-test")
    await kv.save("a", "1")
    await kv.multi_save_and_remove({"b": "2", "c": "3"}, ["a"])
    assert await kv.get("a") is None
    assert (await kv.load_prefix("")).as_dict() == {"b": b"2", "c": b"3"}
    assert await kv.compare_and_swap("b", "2", "two")
    assert not await kv.compare_and_swap("b", "2", "again")
    assert await kv.get("b") == b"two"


async def test_wrong_password_is_refused_at_once(auth_enabled: EtcdCluster) -> None:
    """Not retried until the deadline: the same password would be refused again."""
    config = auth_enabled.config(user=USER, password="bad-pw-123", call_timeout=5.0, deadline=GENEROUS)
    with pytest.raises(MetaAuthError) as e:
        await connect(config)
    message = str(e.value)
    assert "authentication failed" in message
    assert "password is wrong" in message and repr(USER) in message
    assert auth_enabled.endpoints[0] in message
    assert "bad-pw-123" not in message and PASSWORD not in message


async def test_unknown_user_is_refused(auth_enabled: EtcdCluster) -> None:
    with pytest.raises(MetaAuthError, match="does not exist or the password is wrong"):
        await connect(auth_enabled.config(user="nobody", password=PASSWORD, **FAST))


async def test_client_without_credentials_is_refused(auth_enabled: EtcdCluster) -> None:
    """etcd answers status probes without a token, so the refusal comes with the first key access."""
    async with await connect(auth_enabled.config(**FAST)) as client:
        kv = MetaKV(client, "auth-test")
        for op in (kv.save("x", "1"), kv.get("x"), kv.load_prefix("")):
            with pytest.raises(MetaAuthError) as e:
                await op
            assert "authentication enabled: configure the etcd user and password" in str(e.value)
    async with await connect(auth_enabled.config(user=USER, password=PASSWORD)) as client:
        assert await MetaKV(client, "auth-test").get("x") is None


async def test_enable_auth_is_idempotent(auth_enabled: EtcdCluster, user_client: EtcdClient) -> None:
    """Repeating it changes nothing, with or without a token; wrong credentials are reported."""
    await enable_auth(user_client, USER, PASSWORD)
    async with EtcdClient(auth_enabled.config()) as anonymous:
        await enable_auth(anonymous, USER, PASSWORD)
        with pytest.raises(MetaAuthError, match="authentication failed"):
            await enable_auth(anonymous, USER, "not-the-password")
    status = await user_client.call("status", lambda t: user_client.raw.auth.auth_status(timeout=t))  # type: ignore[union-attr]
    assert status.enabled
    await MetaKV(user_client, "auth-test").save("still", "works")


async def test_credentials_on_etcd_without_auth_are_accepted(etcd: EtcdCluster) -> None:
    """As with etcd's own client: configured credentials do not break an etcd that has auth off."""
    async with await connect(etcd.config(user="someone", password="pw")) as client:
        assert client.metadata is None
        kv = MetaKV(client, "creds-no-auth")
        await kv.save("k", "v")
        assert await kv.get("k") == b"v"


async def test_non_root_user_and_token_expiry(tmp_path: Path) -> None:
    """A non-root user gets the root role; an expired token is renewed by one new login.

    The client connects with credentials *before* auth is on (no token), keeps
    working after ``enable_auth`` (etcd's "user name is empty" makes it log
    in), and again after its token expires (``--auth-token-ttl=1``).
    """
    with EtcdCluster(tmp_path / "etcd", extra_args=("--auth-token-ttl=1",)) as cluster:
        config = cluster.config(user="coord", password="pw-coord")
        async with await connect(config) as client:
            kv = MetaKV(client, "ttl")
            await kv.save("before", "1")
            await enable_auth(client, "coord", "pw-coord")
            await kv.save("after", "2")
            token = client.metadata
            assert token is not None
            # Simple tokens expire after ttl seconds unused (each use resets the clock),
            # so wait in steps longer than the ttl until the old token is refused.
            for _ in range(10):
                await asyncio.sleep(3)
                try:
                    await client.kv.Range(RangeRequest(key=b"ttl/after"), metadata=token, timeout=5)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
                    assert "invalid auth token" in (exc.details() or "")
                    break
            else:
                pytest.fail("the auth token never expired")
            assert await kv.get("after") == b"2"
            assert client.metadata is not None and client.metadata != token
            assert (await kv.load_prefix("")).as_dict() == {"before": b"1", "after": b"2"}
        # root exists (etcd requires it) but cannot log in by password.
        with pytest.raises(MetaAuthError):
            await connect(cluster.config(user="root", password="", **FAST))
