"""Who may read a coordinator's pages over HTTP (the status page, ``/status.json``) when security is on, and the
HTTPS that ``--tls-http`` serves.

The pages show what gRPC keeps for the ``reader`` role (collection names,
node addresses, task history), so with security on (any TLS or
authentication setting) they are guarded as gRPC is:

* **Host.** A request whose ``Host`` is not one of this process's names is
  421 (Misdirected Request): that is what a DNS-rebinding page sends (a name
  its author controls, resolved to this address), and it never reaches the
  page. Allowed are IP literals (a browser that dialled an address itself
  sends it: nothing was rebound), ``localhost``, this machine's host name, the
  hosts of the coordinator's gRPC and HTTP addresses, and the names of
  ``--http-allowed-hosts`` (a Service's DNS name, an ingress host).
* **Credential.** With a principals file (``--auth-tokens-file``), the caller
  must be a principal whose role may read (``reader``, ``admin``,
  ``coordinator``: ``querycoord.security.auth.READ``), known by the same table the gRPC
  server uses: ``Authorization: Bearer <token>``, or ``Basic`` with the token
  as password (what a browser sends once it asked for a user and password: the
  page's polls of ``status.json`` then carry it too), or, over HTTPS, a client
  certificate whose common name or DNS name the table maps (never an IP
  address). None or an unknown one is 401 with the challenges; a principal
  that may not read is 403.

``/healthz``, ``/readyz`` and ``/metrics`` are not guarded: probes and
Prometheus need no credential (the README says what ``/metrics`` shows).
Refusals are counted (``querycoord_http_refused_total``) and logged at most
once per reason every few seconds, never with a credential.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
import ssl
import time
from collections.abc import Iterable, Mapping
from http import HTTPStatus
from typing import Any

import grpc
from loguru import logger
from prometheus_client import Counter

from querycoord.net.http_server import Page, Request
from querycoord.security.auth import READ, Authenticator, Refused
from querycoord.security.grpc_channels import GrpcSecurity, SecurityConfigError

REFUSED = Counter("querycoord_http_refused_total", "Requests for a coordinator's pages refused, by reason (host: "
                  "not one of its names; unauthenticated: no or an unknown credential; forbidden: a principal "
                  "whose role may not read)", ["reason"])
CHALLENGES = (("WWW-Authenticate", 'Basic realm="querycoord status", charset="UTF-8"'),
              ("WWW-Authenticate", 'Bearer realm="querycoord status"'))
_LOG_EVERY = 5.0


def host_of(value: str) -> str | None:
    """The host of a ``Host`` header or ``host[:port]`` name: lower case, without port, brackets or a final dot;
    None when it is not of that form."""
    value = value.strip()
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
        if not port.isdigit():
            return None
    else:  # a name, or an IPv6 address without brackets (no port can follow it)
        host = value
    host = host.lower().rstrip(".")
    if not host or any(c.isspace() or c in "/\\@?#" for c in host):
        return None
    return host


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


class PageAccess:
    """The ``Guard`` of a coordinator's pages with security on (see module docstring): ``hosts`` are the names
    allowed besides IP literals; ``authenticator`` None checks the Host only (TLS without a principals file)."""

    def __init__(self, hosts: Iterable[str], authenticator: Authenticator | None):
        self.hosts = frozenset(h for h in (host_of(n) for n in hosts) if h)
        self.authenticator = authenticator
        self._logged: dict[str, float] = {}

    def __call__(self, request: Request) -> Page | None:
        values = request.values("host")
        host = host_of(values[0]) if len(values) == 1 else None
        if host is None or not (is_ip(host) or host in self.hosts):
            shown = (values[0][:80] if len(values) == 1 else f"{len(values)} Host headers")
            return self._refuse("host", HTTPStatus.MISDIRECTED_REQUEST,
                                f"this server does not answer for host {shown!r}: its pages answer to IP addresses, "
                                f"localhost, its own names and those of --http-allowed-hosts")
        if self.authenticator is None:
            return None
        try:
            metadata = _authorization(request)
            principal = self.authenticator.identify(metadata, lambda: _peer_context(request.peer_certificate))
        except Refused as refused:
            return self._refuse("unauthenticated", HTTPStatus.UNAUTHORIZED,
                                f"unauthenticated: {refused}; the status page needs the reader role: send "
                                f"'Authorization: Bearer <token>' (or Basic with the token as password) or, over "
                                f"HTTPS, a client certificate", CHALLENGES)
        if principal.role not in READ:
            return self._refuse("forbidden", HTTPStatus.FORBIDDEN,
                                f"{principal.name} (role {principal.role}) may not read the status page: it needs "
                                f"{' or '.join(sorted(r.value for r in READ))}")
        return None

    def _refuse(self, reason: str, status: HTTPStatus, message: str,
                headers: tuple[tuple[str, str], ...] = ()) -> Page:
        REFUSED.labels(reason).inc()
        now = time.monotonic()
        if now - self._logged.get(reason, -_LOG_EVERY) >= _LOG_EVERY:
            self._logged[reason] = now
            logger.warning("HTTP {} refused a page ({}): {}", int(status), reason, message.split(";")[0])
        return Page(status, "text/plain; charset=utf-8", f"{message}\n".encode(), headers)


def _authorization(request: Request) -> list[tuple[str, str]]:
    """The ``authorization`` metadata ``Authenticator.identify`` reads: a Bearer header as it is, Basic as the
    Bearer of its password."""
    values = request.values("authorization")
    if len(values) > 1:
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "more than one Authorization header")
    if not values:
        return []
    scheme, _, rest = values[0].strip().partition(" ")
    if scheme.lower() != "basic":
        return [("authorization", values[0])]
    try:
        decoded = base64.b64decode(rest.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise Refused(grpc.StatusCode.UNAUTHENTICATED, "the Basic credential is not base64 of 'user:token'") from None
    _, _, token = decoded.partition(":")
    return [("authorization", f"Bearer {token}")]


def _peer_context(cert: Mapping[str, Any] | None) -> dict[str, list[bytes]]:
    """A client certificate's names in the form of a gRPC auth context: DNS names only as alternative names."""
    if not cert:
        return {}
    common = [value for rdn in cert.get("subject", ()) for key, value in rdn if key == "commonName"]
    dns = [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]
    return {"x509_common_name": [n.encode() for n in common],
            "x509_subject_alternative_name": [n.encode() for n in dns]}


def page_hosts(addresses: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """The names a coordinator's pages answer to besides IP literals: localhost, this machine's host name, the
    hosts of ``addresses`` (its gRPC and HTTP addresses) and ``allowed`` (``--http-allowed-hosts``)."""
    names = ["localhost", socket.gethostname()]
    for address in addresses:
        host = host_of(address)
        if host and host not in ("0.0.0.0", "::"):
            names.append(host)
    names.extend(allowed)
    return names


def page_access(security: GrpcSecurity, hosts: Iterable[str]) -> PageAccess | None:
    """The guard of the pages under ``security`` (None in development mode: as open as gRPC is then)."""
    if security.development:
        return None
    authenticator = security.authenticator()
    if authenticator is not None and not security.http_tls:
        logger.warning("the status page on --http-listen takes credentials over plaintext HTTP: set --tls-http "
                       "([tls] http) to serve it over HTTPS")
    return PageAccess(hosts, authenticator)


def tls_context(security: GrpcSecurity) -> ssl.SSLContext | None:
    """The HTTPS of ``--tls-http``: this process's certificate, client certificates optional (probes and
    Prometheus present none) but checked against the CA when sent. None without ``--tls-http``."""
    if not security.http_tls:
        return None
    assert security.cert_file is not None and security.key_file is not None and security.ca_file is not None
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(security.cert_file, security.key_file)
        context.load_verify_locations(security.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise SecurityConfigError(f"--tls-http: cannot serve HTTPS with --tls-cert {security.cert_file}, --tls-key "
                                  f"and --tls-ca {security.ca_file}: {exc}") from None
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


__all__ = ["REFUSED", "PageAccess", "host_of", "is_ip", "page_access", "page_hosts",
           "tls_context"]
