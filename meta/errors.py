"""Errors of the meta layer.

Callers act on the class, users read the message: every message says what
was wrong and what to do about it (which endpoints were tried, which limit
was exceeded, who leads now).
"""

from __future__ import annotations


class MetaError(Exception):
    """Base class of every error raised by ``meta``."""


class MetaUnavailable(MetaError):
    """etcd could not be reached (or did not answer) within the deadline."""

    def __init__(
        self, endpoints: list[str], operation: str, elapsed: float, cause: BaseException | None, *, hint: str = ""
    ):
        self.endpoints = list(endpoints)
        self.operation = operation
        self.elapsed = elapsed
        self.hint = hint
        detail = f": {cause}" if cause is not None else ""
        super().__init__(
            f"etcd unavailable: {operation} failed after {elapsed:.1f}s trying endpoints "
            f"{', '.join(self.endpoints)}{detail}. Check that etcd is running and reachable "
            f"(--etcd-endpoints), and its TLS/auth settings.{hint}"
        )


class MetaRefused(MetaUnavailable):
    """Every endpoint refused the TCP connection (or named a host that does not exist): nothing listens there, so
    waiting out the deadline would only delay the same answer. ``reasons``: endpoint -> why, short."""

    def __init__(self, reasons: dict[str, str], operation: str, elapsed: float):
        self.reasons = dict(reasons)
        super().__init__(list(reasons), operation, elapsed, None)
        if set(self.reasons.values()) == {"connection refused"}:
            text = f"etcd at {', '.join(self.reasons)} refused the connection (nothing listens there?)"
        else:
            text = "etcd unreachable: " + "; ".join(f"{ep}: {why}" for ep, why in self.reasons.items())
        self.args = (text,)


class ClientClosed(MetaError):
    """The etcd client was closed (its process is stopping): nothing more can be asked through it.

    Background loops take it as a clean stop, not as etcd trouble to retry (``meta.loops``).
    """

    def __init__(self, operation: str):
        self.operation = operation
        super().__init__(f"{operation}: the etcd client is closed (this process is stopping)")


class MetaAuthError(MetaError):
    """etcd refused the credentials: wrong user or password, none given, or no permission.

    Raised at once, never retried: another attempt with the same credentials
    gets the same answer, so waiting out the deadline would only hide the cause.
    """

    def __init__(self, endpoints: list[str], operation: str, user: str | None, details: str, advice: str = ""):
        self.endpoints = list(endpoints)
        self.operation = operation
        self.user = user
        self.details = details
        super().__init__(
            f"etcd refused {operation} at {', '.join(self.endpoints)}: {details}. {advice}"
        )


class NotEtcd(MetaError):
    """The endpoint answered gRPC but has no etcd API (UNIMPLEMENTED): another gRPC server, such as a coordinator's
    port given as an etcd endpoint. Raised at once: a retry asks the same server again."""

    def __init__(self, endpoints: list[str], operation: str, details: str):
        self.endpoints = list(endpoints)
        self.operation = operation
        super().__init__(
            f"{', '.join(self.endpoints)} answered {operation} with UNIMPLEMENTED ({details}): that is a gRPC "
            "server but not etcd; give etcd's client URL (etcd's --advertise-client-urls, port 2379 by default)"
        )


class MetaNoSpace(MetaError):
    """etcd raised its NOSPACE alarm: its database reached the backend quota and every write is refused.

    Reads and deletes still work. Never retried: nothing changes until an
    operator compacts, defragments and disarms the alarm (``querycoord etcd
    maintain``), so waiting out a deadline would only hide the cause.
    """

    def __init__(self, endpoints: list[str], operation: str, details: str):
        self.endpoints = list(endpoints)
        self.operation = operation
        super().__init__(
            f"etcd is out of space ({details}; {operation} refused at {', '.join(self.endpoints)}): "
            "run `querycoord etcd maintain` (compact, defragment, disarm the alarm), or raise etcd's "
            "--quota-backend-bytes"
        )


class RequestTooLarge(MetaError):
    """A transactional write exceeds etcd's per-txn limits; nothing was sent."""

    def __init__(self, ops: int, size: int, max_ops: int, max_bytes: int):
        self.ops, self.size, self.max_ops, self.max_bytes = ops, size, max_ops, max_bytes
        super().__init__(
            f"request too large for one etcd txn: {ops} operations (limit {max_ops}) and "
            f"{size} bytes (limit {max_bytes}); nothing was written. Split the write, or use "
            f"MetaKV.chunked_save_non_atomic for data that need not be atomic."
        )


class NotLeader(MetaError):
    """A fenced write was refused: the fence's leader key is gone or was recreated."""

    def __init__(self, leader_key: str, revision: int, current_revision: int):
        self.leader_key, self.revision, self.current_revision = leader_key, revision, current_revision
        now = "deleted" if current_revision == 0 else f"created at revision {current_revision}"
        super().__init__(
            f"not leader: fence {leader_key}@{revision} no longer holds (the key is {now}); "
            f"nothing was written"
        )


class InvalidKey(MetaError, ValueError):
    """A key or prefix that cannot be stored (empty, or escaping the root path)."""
