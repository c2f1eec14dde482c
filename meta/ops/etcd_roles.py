"""etcd least privilege: one user and role per process kind, each allowed only the keys it needs.

A deployment under root path ``R`` gets these roles, each with a user of the
same name (``name_prefix`` is put before every name when several
deployments share one etcd):

=================  ===========================================================
``coordinator``    readwrite on ``R/`` (every key of the deployment)
``reader``         read on ``R/`` except ``R/election/`` (status commands,
                   dashboards): two ranges, since etcd cannot subtract
``querynode-<n>``  readwrite on exactly the key ``R/session/querynode-<n>``
                   (no range: ``querynode-1`` cannot read ``querynode-12``);
                   read on the prefixes ``node_reads`` names for the role
``streamnode-<n>`` the same for ``R/session/streamnode-<n>``
=================  ===========================================================

A node's role cannot write the shared server-id counter, so such a node runs
with a fixed id (``Session(server_id=n)``); it cannot write a task, a
collection, another node's session or anything outside ``R/``. Leases need
no key permission; etcd lets a user revoke a lease only if it may write
every key attached to it, which for a node is its own session key.

``apply_roles`` makes etcd match the plan and is idempotent: an existing
role keeps its name and gets exactly the plan's permissions (extra ones
are revoked, so a re-run also removes any permission the plan no longer
holds), an existing user whose password already works is left alone,
and a re-run changes nothing. ``enable_auth`` then turns authentication on
(etcd requires a ``root`` user holding its built-in ``root`` role first).
Passwords never travel on a command line: ``password_files`` reads each
user's from ``<dir>/<user>`` and creates missing ones (mode 0600).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from etcd3aio.auth import AuthService, PermissionType
from etcd3aio.kv import prefix_range_end
from loguru import logger

from meta.client import EtcdClient
from meta.election import ELECTION_PREFIX
from meta.errors import InvalidKey, MetaAuthError

ROOT = "root"
COORDINATOR = "coordinator"
READER = "reader"
NODE_ROLES = ("querynode", "streamnode")
SESSION_PREFIX = "session/"
# What the reader may not read: the election (meta.election), whose keys carry the candidates' private leases.
READER_HIDDEN = (ELECTION_PREFIX,)
_NAME = re.compile(r"^[A-Za-z0-9_.-]*$")

Say = Callable[[str], None]


@dataclass(frozen=True)
class Grant:
    """One permission: ``write`` adds write to read; ``prefix`` covers every key starting with ``key``; ``end``
    (instead) covers the keys from ``key`` up to, not including, ``end``."""

    key: str
    prefix: bool
    write: bool
    end: str = ""

    @property
    def perm_type(self) -> PermissionType:
        return PermissionType.READWRITE if self.write else PermissionType.READ

    @property
    def range_end(self) -> bytes:
        if self.end:
            return self.end.encode()
        return prefix_range_end(self.key.encode()) if self.prefix else b""

    def describe(self) -> str:
        what = f"range [{self.key}, {self.end})" if self.end else \
            f"{'prefix' if self.prefix else 'key'} {self.key}"
        return f"{'readwrite' if self.write else 'read'} {what}"


def read_all_but(top: str, hidden: Sequence[str]) -> tuple[Grant, ...]:
    """Read grants covering every key under ``top`` except those under each of ``hidden`` (etcd grants cannot
    subtract: the complement of the hidden prefixes, as ranges)."""
    cuts = sorted(top + h for h in hidden)
    grants, start = [], top
    for cut in cuts:
        if cut > start:
            grants.append(Grant(start, prefix=False, write=False, end=cut))
        start = max(start, prefix_range_end(cut.encode()).decode())
    grants.append(Grant(start, prefix=False, write=False, end=prefix_range_end(top.encode()).decode()))
    return tuple(grants)


@dataclass(frozen=True)
class RoleSpec:
    """A role and the user of the same name that holds it."""

    name: str
    grants: tuple[Grant, ...]


@dataclass(frozen=True)
class RolePlan:
    root: str
    roles: tuple[RoleSpec, ...]

    @property
    def users(self) -> list[str]:
        return [r.name for r in self.roles]

    def describe(self) -> list[str]:
        """One line per role and grant: what ``apply_roles`` makes etcd hold."""
        lines = []
        for role in self.roles:
            lines.append(f"role {role.name} (user {role.name}):")
            lines.extend(f"  {g.describe()}" for g in role.grants)
        return lines


def _check_name(name_prefix: str) -> str:
    if not _NAME.match(name_prefix):
        raise ValueError(f"name prefix {name_prefix!r} may only hold letters, digits, '_', '.' and '-'")
    return name_prefix


def node_ids(ids: Iterable[int], what: str) -> list[int]:
    """Sorted distinct positive ids; ``ValueError`` names a bad one."""
    out = set()
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= 2**63 - 1:
            raise ValueError(f"{what} id must be a positive 64-bit integer, got {i!r}")
        out.add(i)
    return sorted(out)


def plan_roles(
    root: str,
    *,
    querynodes: Iterable[int] = (),
    streamnodes: Iterable[int] = (),
    node_reads: Mapping[str, Sequence[str]] | None = None,
    name_prefix: str = "",
) -> RolePlan:
    """The roles of a deployment under ``root`` (see module docstring).

    ``node_reads``: by node role, the prefixes (relative to the root) a node of that role reads besides its own
    session key, e.g. ``{"streamnode": ["session/querycoord-", "stream/snodes/"]}``; the application knows them.
    """
    base = root.strip("/")
    if not base:
        raise InvalidKey("the root path must not be empty")
    top = base + "/"
    pre = _check_name(name_prefix)
    reads = dict(node_reads or {})
    unknown = set(reads) - set(NODE_ROLES)
    if unknown:
        raise ValueError(f"node_reads names unknown node roles {sorted(unknown)}; known: {list(NODE_ROLES)}")
    roles = [
        RoleSpec(pre + COORDINATOR, (Grant(top, prefix=True, write=True),)),
        # Not the election: its keys carry the candidates' leases, which whoever learns one can renew.
        RoleSpec(pre + READER, read_all_but(top, READER_HIDDEN)),
    ]
    for role, ids in (("querynode", querynodes), ("streamnode", streamnodes)):
        for n in node_ids(ids, role):
            own = f"{top}{SESSION_PREFIX}{role}-{n}"
            grants = [Grant(own, prefix=False, write=True)]
            grants += [Grant(top + p, prefix=True, write=False) for p in reads.get(role, ())]
            roles.append(RoleSpec(f"{pre}{role}-{n}", tuple(dict.fromkeys(grants))))
    return RolePlan(base, tuple(roles))


# ----- passwords ----------------------------------------------------------------------------
def password_files(directory: Path, users: Sequence[str], *, create: bool) -> dict[str, str]:
    """Each user's password from ``directory/<user>``; a missing file gets a new random password (mode 0600)
    when ``create``, else ``ValueError`` names it. Every process is then given its own file."""
    passwords: dict[str, str] = {}
    missing = []
    for user in users:
        path = directory / user
        try:
            text = path.read_text().rstrip("\n")
        except FileNotFoundError:
            missing.append(user)
            continue
        except OSError as exc:
            raise ValueError(f"password file {path}: {exc.strerror or exc}") from None
        if not text:
            raise ValueError(f"password file {path} is empty")
        passwords[user] = text
    if missing and not create:
        raise ValueError(f"no password files for {', '.join(missing)} in {directory}")
    if missing:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for user in missing:
        password = secrets.token_urlsafe(24)
        fd = os.open(directory / user, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        passwords[user] = password
    return passwords


# ----- applying ----------------------------------------------------------------------------
def _already_exists(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and "already exists" in (exc.details() or "")


def _auth(client: EtcdClient) -> AuthService:
    auth = client.raw.auth
    assert auth is not None, "connect the client first"
    return auth


async def _add_once(client: EtcdClient, operation: str, fn: Callable[[float], Awaitable[object]]) -> bool:
    """Run an etcd ``Auth.*Add`` call; False (not an error) when the name already exists, so applying is idempotent."""
    try:
        await client.call(operation, fn)
    except Exception as exc:
        if _already_exists(exc):
            return False
        raise
    return True


async def _add_role(client: EtcdClient, name: str) -> bool:
    auth = _auth(client)
    return await _add_once(client, f"Auth.RoleAdd {name}", lambda t: auth.role_add(name, timeout=t))


async def _sync_grants(client: EtcdClient, role: RoleSpec, say: Say) -> None:
    """Grant what the plan has and the role lacks; revoke what the role has and the plan does not."""
    auth = _auth(client)
    resp = await client.call(f"Auth.RoleGet {role.name}", lambda t: auth.role_get(role.name, timeout=t))
    have = {(bytes(p.key), bytes(p.range_end), int(p.permType)) for p in resp.perm}
    want = {(g.key.encode(), g.range_end, int(g.perm_type)): g for g in role.grants}
    for (key, end, perm), grant in want.items():
        if (key, end, perm) in have:
            continue
        await client.call(
            f"Auth.RoleGrantPermission {role.name}",
            lambda t, g=grant: auth.role_grant_permission(  # type: ignore[misc]
                role.name, g.key, g.range_end or None, perm_type=g.perm_type, timeout=t),
        )
        say(f"role {role.name}: granted {grant.describe()}")
    # etcd keys a permission by (key, range_end): granting one replaced any other type on the same range.
    wanted_ranges = {(k, e) for k, e, _ in want}
    for key, end, perm in sorted(have):
        if (key, end) in wanted_ranges:
            continue
        await client.call(
            f"Auth.RoleRevokePermission {role.name}",
            lambda t, k=key, e=end: auth.role_revoke_permission(role.name, k, e or None, timeout=t),  # type: ignore[misc]
        )
        say(f"role {role.name}: revoked {PermissionType(perm).name.lower()} {key.decode(errors='replace')}"
            + (f" .. {end.decode(errors='replace')}" if end else ""))


async def _password_works(client: EtcdClient, user: str, password: str) -> bool:
    """Whether ``user`` logs in with ``password`` (False too while auth is off: etcd cannot tell then)."""
    auth = _auth(client)
    try:
        await client.call(f"Auth.Authenticate {user}", lambda t: auth.authenticate(user, password, timeout=t),
                          reauth=False, deadline=client.config.call_timeout)
    except Exception:
        return False
    return True


async def _sync_user(client: EtcdClient, name: str, password: str, say: Say) -> None:
    auth = _auth(client)
    try:
        await client.call(f"Auth.UserAdd {name}", lambda t: auth.user_add(name, password, timeout=t))
        say(f"user {name}: created")
    except Exception as exc:
        if not _already_exists(exc):
            raise
        if not await _password_works(client, name, password):
            await client.call(f"Auth.UserChangePassword {name}",
                              lambda t: auth.user_change_password(name, password, timeout=t))
            say(f"user {name}: password set from its file")
    resp = await client.call(f"Auth.UserGet {name}", lambda t: auth.user_get(name, timeout=t))
    if name not in list(resp.roles):
        await client.call(f"Auth.UserGrantRole {name}", lambda t: auth.user_grant_role(name, name, timeout=t))
        say(f"user {name}: granted role {name}")


async def apply_roles(client: EtcdClient, plan: RolePlan, passwords: Mapping[str, str],
                      say: Say = lambda _line: None) -> None:
    """Make etcd hold ``plan``'s roles and users (idempotent; see module docstring). ``client`` needs the root
    role once auth is on. ``say`` hears one line per change; a re-run hears none."""
    missing = [u for u in plan.users if not passwords.get(u)]
    if missing:
        raise ValueError(f"no password for users {missing}")
    for role in plan.roles:
        if role.name == ROOT:
            raise ValueError("the name 'root' is etcd's administrator and cannot be a planned role")
        if await _add_role(client, role.name):
            say(f"role {role.name}: created")
        await _sync_grants(client, role, say)
        await _sync_user(client, role.name, passwords[role.name], say)
    logger.info("etcd roles of root {}: {} roles in place", plan.root, len(plan.roles))


# ----- enabling auth -------------------------------------------------------------------------
async def auth_enabled(client: EtcdClient) -> bool:
    """Whether auth is on; an unauthenticated client learns it from etcd's refusal."""
    auth = _auth(client)
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
    auth = _auth(client)
    await client.call("Auth.Authenticate", lambda t: auth.authenticate(user, password, timeout=t), reauth=False)


async def _add_user(client: EtcdClient, name: str, password: str | None) -> bool:
    """Create ``name``; ``password=None`` makes a user that cannot log in by password. False if it existed."""
    auth = _auth(client)
    return await _add_once(client, f"Auth.UserAdd {name}",
                           lambda t: auth.user_add(name, password or "", no_password=password is None, timeout=t))


async def enable_auth(client: EtcdClient, user: str, password: str) -> bool:
    """Create ``user`` (with etcd's root role) and the ``root`` user etcd requires, then enable auth.

    Returns whether this call enabled it. Idempotent: an existing ``user``
    gets ``password`` set (so the password given is the one that works
    afterwards), grants are repeated harmlessly, and if auth is already
    enabled nothing is changed: the call only checks that ``user``/``password``
    can log in, and raises ``MetaAuthError`` if not. ``client`` may carry
    credentials or not; with auth off it needs none. When ``user`` is not
    ``root``, the ``root`` user is created *without a password* (only a TLS
    client certificate with CN ``root`` can act as it), so no second secret is
    invented, and ``user``, holding the root role, administers auth.
    """
    if not user or not password:
        raise ValueError("enable_auth needs a user name and a non-empty password")
    auth = _auth(client)
    if await auth_enabled(client):
        await _check_login(client, user, password)
        logger.info("etcd auth already enabled; user {} can log in", user)
        return False

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
        return False
    logger.info("etcd auth enabled at {}; user {} has the root role", client.endpoints, user)
    return True


__all__ = ["COORDINATOR", "NODE_ROLES", "READER", "ROOT", "Grant", "RolePlan", "RoleSpec", "apply_roles",
           "auth_enabled", "enable_auth", "node_ids", "password_files", "plan_roles"]
