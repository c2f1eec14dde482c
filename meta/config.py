"""How to reach etcd: endpoints, TLS, auth and the time budgets of a call."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from meta.address import split_address


@dataclass(frozen=True)
class EtcdConfig:
    """Connection settings for an etcd cluster.

    ``call_timeout`` bounds one attempt; ``deadline`` bounds an operation with
    all its retries, after which ``MetaUnavailable`` is raised. Nothing retries
    past ``deadline``.
    """

    endpoints: tuple[str, ...] = ("127.0.0.1:2379",)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # Name checked against the server certificate when it differs from the
    # endpoint host (needed with several TLS endpoints).
    tls_server_name: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    call_timeout: float = 5.0
    deadline: float = 15.0
    # A one-shot command: when every endpoint refuses TCP (nothing listens), ``connect`` fails at once
    # (``MetaRefused``) instead of retrying until ``deadline``; endpoints that accept and do not answer are still
    # waited for. Servers leave it off: they wait for an etcd that is starting.
    refused_is_final: bool = False

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("at least one etcd endpoint is required")
        for ep in self.endpoints:
            try:
                split_address(ep)
            except ValueError:
                raise ValueError(f"etcd endpoint {ep!r} is not host:port") from None
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS client cert_file and key_file must be given together")
        if self.cert_file is not None and self.ca_file is None:
            raise ValueError("TLS client certificates need ca_file too")
        if (self.user is None) != (self.password is None):
            raise ValueError("etcd user and password must be given together")
        if self.call_timeout <= 0 or self.deadline < self.call_timeout:
            raise ValueError("need 0 < call_timeout <= deadline")

    @classmethod
    def from_endpoints(cls, endpoints: str | list[str] | tuple[str, ...], **kwargs: object) -> EtcdConfig:
        """Accept a comma-separated string (as given on a command line) or a list."""
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        for prefix in ("http://", "https://"):
            endpoints = [e.removeprefix(prefix) for e in endpoints]
        return cls(endpoints=tuple(endpoints), **kwargs)  # type: ignore[arg-type]
