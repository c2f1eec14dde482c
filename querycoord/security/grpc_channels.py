"""The one place that builds gRPC servers and channels: TLS from the configuration, explicit message size limits,
authentication, and decoding that refuses garbage with INVALID_ARGUMENT.

Every server (coordinator, query node, standalone catalog) is made by
``make_server`` and bound by ``add_port``; every channel (the CLI and the
leader-following clients, the stream nodes' heartbeats, the coordinator's
channels to query nodes, to the catalog and to other coordinators) by
``make_channel``. So a setting applies everywhere at once:

* **Message sizes**: ``grpc.max_send_message_length`` and
  ``grpc.max_receive_message_length`` are set on both ends
  (``GrpcSecurity.max_message_bytes``, default 16 MiB), never gRPC's implicit
  4 MiB receive / unlimited send.
* **Bounds**: calls at once, streams per connection, and a small message
  limit and stream count for the methods open to anyone (``grpc_bounds``).
* **TLS**: with a CA (``--tls-ca``) clients verify servers against it and
  present ``--tls-cert``/``--tls-key`` when given; servers serve that
  certificate and, with ``--tls-client-auth``, require client certificates
  signed by the CA (mutual TLS between the coordinator and the nodes).
* **Credentials**: a process presents its bearer token (``--auth-token-file``
  or ``$QUERYCOORD_AUTH_TOKEN``) as ``authorization: Bearer ...`` metadata on
  every call; a server with a principals file (``--auth-tokens-file``) admits
  a call only as ``querycoord.security.auth`` says (``SecurityInterceptor``).

One process has one identity: its settings are configured once at start-up
(``configure``, from the command line's options; ``security_options``) and
every server and channel made without an explicit ``security`` uses them.
Without any setting a process runs in development mode: plaintext, no
authentication, one warning line when its server starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from meta.log import logger

# The server side (``auth``: the principals, their metrics; ``grpc_bounds``) is imported by the functions that
# serve: a client (every CLI command) makes channels only, and its start-up should not pay for a server's parts.
if TYPE_CHECKING:
    from querycoord.security.auth import Authenticator

MIB = 1 << 20
DEFAULT_MAX_MESSAGE_BYTES = 16 * MIB

ChannelOptions = Iterable[tuple[str, Any]]


class SecurityConfigError(ValueError):
    """A TLS or authentication setting that cannot be used; the message names the option."""


@dataclass(frozen=True)
class GrpcSecurity:
    """How this process's gRPC servers and channels are secured (see module docstring).

    ``token`` is the secret this process presents; it is never printed
    (``repr`` leaves it out) and never logged. ``tokens_file`` is the table of
    credentials a server accepts (``querycoord.security.auth``); without it a server
    authenticates nobody and refuses nothing.
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    client_auth: bool = False
    token: str | None = field(default=None, repr=False)
    tokens_file: Path | None = None
    insecure: bool = False
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # --tls-http: the HTTP side (--http-listen) serves HTTPS with this process's certificate.
    http_tls: bool = False

    def __post_init__(self) -> None:
        if self.max_message_bytes <= 0:
            raise SecurityConfigError(f"the gRPC message size limit must be positive, got {self.max_message_bytes}")
        if (self.cert_file is None) != (self.key_file is None):
            raise SecurityConfigError("--tls-cert and --tls-key go together (a certificate and its private key)")
        if self.cert_file is not None and self.ca_file is None:
            raise SecurityConfigError("--tls-cert needs --tls-ca: the CA that signed the peers' certificates")
        if self.client_auth and self.ca_file is None:
            raise SecurityConfigError("--tls-client-auth needs --tls-ca (client certificates are checked against it)")
        if self.http_tls and self.cert_file is None:
            raise SecurityConfigError("--tls-http needs --tls-ca, --tls-cert and --tls-key: HTTPS serves this "
                                      "process's certificate")
        if self.server_name is not None and self.ca_file is None:
            raise SecurityConfigError("--tls-server-name needs --tls-ca (it names the certificate TLS expects)")
        if self.insecure and (self.ca_file or self.token or self.tokens_file):
            raise SecurityConfigError("--insecure (development mode) cannot be combined with TLS or authentication "
                                      "settings; drop one or the other")
        if self.token is not None and (not self.token or any(c.isspace() for c in self.token)):
            raise SecurityConfigError("the auth token is empty or contains white space")

    @property
    def tls(self) -> bool:
        """Whether channels use TLS (and servers serve it: they need the certificate too)."""
        return self.ca_file is not None

    @property
    def authenticates(self) -> bool:
        """Whether servers check who calls (a principals file is configured)."""
        return self.tokens_file is not None

    @property
    def development(self) -> bool:
        """Neither TLS nor authentication: the default of tests, ``querycoord up`` and the demo."""
        return not (self.tls or self.authenticates or self.token)

    def describe(self) -> str:
        """One line for the logs: what is on, never a secret."""
        if self.development:
            return "development mode: plaintext gRPC, no authentication"
        parts = [("TLS" + (" with client certificates required" if self.client_auth else "")) if self.tls
                 else "plaintext gRPC"]
        parts.append(f"principals from {self.tokens_file}" if self.authenticates else "no authentication of callers")
        if self.token:
            parts.append("presents a bearer token")
        return ", ".join(parts)

    def check(self) -> GrpcSecurity:
        """Read every file once now, so a missing or unreadable one is an error at start-up naming its option."""
        for option, path in (("--tls-ca", self.ca_file), ("--tls-cert", self.cert_file),
                             ("--tls-key", self.key_file)):
            if path is not None:
                _read(path, option)
        if self.tokens_file is not None:
            from querycoord.security.auth import Authenticator

            Authenticator.load(self.tokens_file)
        return self

    def authenticator(self) -> Authenticator | None:
        """The server side's table of accepted credentials (None: authentication off)."""
        from querycoord.security.auth import Authenticator

        return Authenticator.load(self.tokens_file) if self.tokens_file is not None else None


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{option} {path}: {exc.strerror or exc}") from None


# ----- the process's identity -----------------------------------------------------------------------------------------
_current = GrpcSecurity()
_warned = False


def configure(security: GrpcSecurity) -> GrpcSecurity:
    """Make ``security`` this process's settings (checked first: ``SecurityConfigError`` names a bad file)."""
    global _current
    _current = security.check()
    if security.token and not security.tls:
        logger.warning("the bearer token is sent in plaintext (no --tls-ca): anyone on the path can read it")
    return _current


def current() -> GrpcSecurity:
    """This process's settings (development mode until ``configure`` was called)."""
    return _current


def _message_options(security: GrpcSecurity) -> list[tuple[str, Any]]:
    return [("grpc.max_send_message_length", security.max_message_bytes),
            ("grpc.max_receive_message_length", security.max_message_bytes)]


# ----- servers --------------------------------------------------------------------------------------------------------
def make_server(security: GrpcSecurity | None = None, *, options: ChannelOptions = ()) -> grpc.aio.Server:
    """A grpc.aio server with the message size limits and the security interceptor (authentication, roles,
    INVALID_ARGUMENT for undecodable requests); bind it with ``add_port``."""
    from querycoord.security.auth import SecurityInterceptor
    from querycoord.security.grpc_bounds import MAX_CONCURRENT_RPCS, OpenCallBounds, server_options

    security = security or _current
    interceptor = SecurityInterceptor(security.authenticator())
    # OpenCallBounds first: it sees the raw bytes of open methods before the security interceptor decodes them.
    return grpc.aio.server(options=[*_message_options(security), *server_options(), *options],
                           interceptors=[OpenCallBounds(), interceptor], maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)


def add_port(server: grpc.aio.Server, address: str, security: GrpcSecurity | None = None) -> int:
    """Bind ``address`` (TLS when configured); the bound port, 0 when gRPC could not bind it."""
    global _warned
    security = security or _current
    if security.development:
        if not _warned:
            _warned = True
            logger.warning("gRPC security is off (development mode): plaintext, every caller may call anything; "
                           "set --tls-ca/--tls-cert/--tls-key and --auth-tokens-file in production")
    elif security.authenticates and not security.tls:
        logger.warning("gRPC server on {}: {}; without TLS the callers' tokens travel in plaintext", address,
                       security.describe())
    else:
        logger.info("gRPC server on {}: {}", address, security.describe())
    if not security.tls:
        return server.add_insecure_port(address)
    if security.cert_file is None or security.key_file is None:
        raise SecurityConfigError("a server with TLS (--tls-ca) needs its certificate: --tls-cert and --tls-key")
    assert security.ca_file is not None
    credentials = grpc.ssl_server_credentials(
        [(_read(security.key_file, "--tls-key"), _read(security.cert_file, "--tls-cert"))],
        root_certificates=_read(security.ca_file, "--tls-ca") if security.client_auth else None,
        require_client_auth=security.client_auth)
    return server.add_secure_port(address, credentials)


# ----- channels -------------------------------------------------------------------------------------------------------
class _BearerToken:
    """Adds ``authorization: Bearer <token>`` to a call's metadata; one subclass per call kind (a grpc.aio channel
    files each interceptor under the first kind it is an instance of)."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(*self._header)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(hidden)"

    async def intercept(self, continuation: Any, details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        """Every call kind alike: the call goes on with the token added (``request``: one or an iterator)."""
        return await continuation(self._details(details), request)


class _UnaryUnaryToken(_BearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _BearerToken.intercept


class _UnaryStreamToken(_BearerToken, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _BearerToken.intercept


class _StreamUnaryToken(_BearerToken, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _BearerToken.intercept


class _StreamStreamToken(_BearerToken, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _BearerToken.intercept


_TOKEN_INTERCEPTORS = (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)


def make_channel(address: str, security: GrpcSecurity | None = None, *,
                 options: ChannelOptions = (), bearer: bool = True) -> grpc.aio.Channel:
    """A grpc.aio channel to ``address``: TLS when configured (verifying the server against the CA, presenting
    this process's certificate), this process's bearer token on every call (unless ``bearer`` is False),
    explicit message size limits.

    ``bearer=False`` is for peers that are not trusted with the token: a query node found in etcd could replay
    it to the coordinators and to other nodes as this process. Such a peer authenticates this process by its
    client certificate, which a TLS handshake proves without handing over anything replayable."""
    security = security or _current
    opts: list[tuple[str, Any]] = [*_message_options(security), *options]
    interceptors: Sequence[Any] = (
        [kind(security.token) for kind in _TOKEN_INTERCEPTORS] if security.token and bearer else ())
    if not security.tls:
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)
    assert security.ca_file is not None
    if security.server_name:
        opts.append(("grpc.ssl_target_name_override", security.server_name))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(security.ca_file, "--tls-ca"),
        private_key=_read(security.key_file, "--tls-key") if security.key_file else None,
        certificate_chain=_read(security.cert_file, "--tls-cert") if security.cert_file else None)
    return grpc.aio.secure_channel(address, credentials, options=opts, interceptors=interceptors)


__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "GrpcSecurity", "SecurityConfigError", "add_port", "configure", "current",
           "make_channel", "make_server"]
