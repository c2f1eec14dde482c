"""Turn on etcd's user/password authentication the way etcd requires it.

etcd refuses ``AuthEnable`` until a user named ``root`` exists and holds the
built-in ``root`` role (which need not be created). ``enable_auth`` sets that
up and then enables auth; it is idempotent, so tests, the ops CLI and a
re-run after a failure can all call it.

The user it sets up gets the ``root`` role: the coordinator needs reads,
writes, txns, leases and watches on its keys, and the ops CLI that calls this
needs to manage users later. A narrower role (read/write on one prefix) is an
``etcdctl role grant-permission`` away for those who want it.

When ``user`` is not ``root``, a ``root`` user is still required by etcd; it
is created *without a password* (only a TLS client certificate with CN
``root`` can act as it), so no second secret is invented here, and ``user``,
holding the root role, can administer auth.
"""

from __future__ import annotations

import grpc
from loguru import logger

from meta.client import EtcdClient
from meta.errors import MetaAuthError

ROOT = "root"


def _already_exists(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and "already exists" in (exc.details() or "")


async def _auth_enabled(client: EtcdClient) -> bool:
    """Whether auth is on; an unauthenticated client learns it from etcd's refusal."""
    auth = client.raw.auth
    assert auth is not None, "connect the client first"
    try:
        resp = await client.call("Auth.Status", lambda t: auth.auth_status(timeout=t))
    except MetaAuthError as exc:
        # With auth on, etcd answers even AuthStatus with "user name is empty" to a client without a token.
        if "user name is empty" in exc.details:
            return True
        raise
    return bool(resp.enabled)


async def _check_login(client: EtcdClient, user: str, password: str) -> None:
    """Raise ``MetaAuthError`` unless ``user``/``password`` can log in (auth is already on)."""
    auth = client.raw.auth
    assert auth is not None
    await client.call("Auth.Authenticate", lambda t: auth.authenticate(user, password, timeout=t), reauth=False)


async def _add_user(client: EtcdClient, name: str, password: str | None) -> bool:
    """Create ``name``; ``password=None`` makes a user that cannot log in by password. False if it existed."""
    auth = client.raw.auth
    assert auth is not None
    try:
        await client.call(
            f"Auth.UserAdd {name}",
            lambda t: auth.user_add(name, password or "", no_password=password is None, timeout=t),
        )
    except Exception as exc:
        if _already_exists(exc):
            return False
        raise
    return True


async def enable_auth(client: EtcdClient, user: str, password: str) -> None:
    """Create ``user`` (with etcd's root role) and the ``root`` user etcd requires, then enable auth.

    Idempotent: an existing ``user`` gets ``password`` set (so the password
    given is the one that works afterwards), grants are repeated harmlessly,
    and if auth is already enabled nothing is changed: the call only checks
    that ``user``/``password`` can log in, and raises ``MetaAuthError`` if not.
    ``client`` may carry credentials or not; with auth off it needs none.
    """
    if not user or not password:
        raise ValueError("enable_auth needs a user name and a non-empty password")
    auth = client.raw.auth
    assert auth is not None, "connect the client first"
    if await _auth_enabled(client):
        await _check_login(client, user, password)
        logger.info("etcd auth already enabled; user {} can log in", user)
        return

    if not await _add_user(client, user, password):
        await client.call(
            f"Auth.UserChangePassword {user}", lambda t: auth.user_change_password(user, password, timeout=t)
        )
    if user != ROOT:
        await _add_user(client, ROOT, None)
        await client.call("Auth.UserGrantRole root", lambda t: auth.user_grant_role(ROOT, ROOT, timeout=t))
    await client.call(f"Auth.UserGrantRole {user}", lambda t: auth.user_grant_role(user, ROOT, timeout=t))
    try:
        await client.call("Auth.Enable", lambda t: auth.auth_enable(timeout=t))
    except MetaAuthError as exc:
        # Someone enabled auth between our status check and now: fine if our user can log in.
        if "user name is empty" not in exc.details:
            raise
        await _check_login(client, user, password)
    logger.info("etcd auth enabled at {}; user {} has the root role", client.endpoints, user)
