"""The gRPC security options of every command: TLS files, the token a process presents, the principals a server
accepts, development mode and the message size limit; flags, ``QUERYCOORD_TLS_*`` / ``QUERYCOORD_AUTH_*`` /
``QUERYCOORD_GRPC_*`` variables and ``[tls]``, ``[auth]``, ``[grpc]`` keys of the configuration file.

``coord``, ``querynode``, ``streamnode`` and every client command (``collection``,
``tasks``, ``nodes``, ``status``, ``switchover``...) take the same options
(they are global options of ``querycoord``), so a secured cluster is
reached the same way by all of them. One process has one identity: its
certificate (``--tls-cert``/``--tls-key``, served by its server and
presented by its channels) and its token.

Secrets never have to be on the command line (where ``ps`` shows them) nor
in the shared configuration file: the token comes from a file
(``--auth-token-file``) or from ``$QUERYCOORD_AUTH_TOKEN``; private keys are
files; the principals file holds SHA-256 digests or names token files. A
token file (from any layer) beats ``$QUERYCOORD_AUTH_TOKEN``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from querycoord.security.grpc_channels import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MIB,
    GrpcSecurity,
    SecurityConfigError,
    configure,
)
from querycoord.settings.setting_rules import CERTIFICATE_FILE, FILE, KEY_FILE, TEXT, Rule, check, origin

TOKEN_ENV = "QUERYCOORD_AUTH_TOKEN"


@dataclass(frozen=True)
class SecurityOption:
    """``flag`` (namespace ``dest``) is ``[section] key`` in the file and ``QUERYCOORD_<SECTION>_<KEY>``."""

    flag: str
    dest: str
    kind: type
    section: str
    help: str
    # What a value must be (``setting_rules``): a path names a file readable now, and an empty one is an error,
    # never "off" (``[auth] tokens_file = ""`` once turned authentication off without a word).
    rule: Rule = TEXT
    # What applies when no layer sets it (None: nothing, e.g. no CA file); ``config show`` prints it.
    default: object = None

    def default_value(self) -> object:
        """The value in effect when unset: ``default``, and ``False`` for a switch."""
        return False if self.kind is bool and self.default is None else self.default


OPTIONS: tuple[SecurityOption, ...] = (
    SecurityOption("--tls-ca", "tls_ca", str, "tls",
                   "CA that signed the servers' and clients' certificates (turns TLS on for gRPC)", CERTIFICATE_FILE),
    SecurityOption("--tls-cert", "tls_cert", str, "tls",
                   "this process's certificate: served by its gRPC server, presented as client certificate",
                   CERTIFICATE_FILE),
    SecurityOption("--tls-key", "tls_key", str, "tls", "private key of --tls-cert", KEY_FILE),
    SecurityOption("--tls-server-name", "tls_server_name", str, "tls",
                   "name to check the servers' certificates against (default: the address's host)"),
    SecurityOption("--tls-client-auth", "tls_client_auth", bool, "tls",
                   "this server requires client certificates signed by --tls-ca (mutual TLS)"),
    SecurityOption("--tls-http", "tls_http", bool, "tls",
                   "serve --http-listen over HTTPS with --tls-cert (client certificates optional, checked against "
                   "--tls-ca)"),
    SecurityOption("--auth-token-file", "auth_token_file", str, "auth",
                   f"file holding the bearer token this process presents (or ${TOKEN_ENV})", FILE),
    SecurityOption("--auth-tokens-file", "auth_tokens_file", str, "auth",
                   "principals file of this server: accepted tokens and certificate names, their roles "
                   "(turns authentication on; re-read when it or a token file it names changes)", FILE),
    SecurityOption("--insecure", "insecure", bool, "grpc",
                   "development mode, said explicitly: plaintext gRPC, no authentication"),
    SecurityOption("--grpc-max-message-mb", "grpc_max_message_mb", float, "grpc",
                   f"largest gRPC message sent or received, MiB (default {DEFAULT_MAX_MESSAGE_BYTES // MIB})",
                   Rule(0.01, 2047), default=DEFAULT_MAX_MESSAGE_BYTES // MIB),
)


def env_name(option: SecurityOption) -> str:
    """``--tls-ca`` -> ``QUERYCOORD_TLS_CA``; ``--insecure`` -> ``QUERYCOORD_GRPC_INSECURE``."""
    key = option.flag.removeprefix("--").removeprefix(f"{option.section}-").replace("-", "_")
    return f"QUERYCOORD_{option.section.upper()}_{key.upper()}"


def add_security_options(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """Add the options to ``p`` (group "gRPC security"); ``suppress`` on a sub-command, so a value given before it
    is kept (as the other global options)."""
    g = p.add_argument_group("gRPC security (TLS, authentication)")
    for o in OPTIONS:
        default = argparse.SUPPRESS if suppress else None
        key = o.flag.removeprefix("--").removeprefix(f"{o.section}-").replace("-", "_")
        shown = f"{o.help} (${env_name(o)}, [{o.section}] {key})"
        if o.kind is bool:
            g.add_argument(o.flag, dest=o.dest, action="store_true", default=default, help=shown)
        else:
            g.add_argument(o.flag, dest=o.dest, type=o.kind, default=default, metavar="X" if o.kind is float
                           else "FILE" if "file" in o.dest or o.dest in ("tls_ca", "tls_cert", "tls_key") else "NAME",
                           help=shown)


def _value(args: argparse.Namespace, o: SecurityOption) -> object:
    """The option's value checked by its rule: given (an empty string too), else its variable when set (when
    ``config_file.apply_layers`` did not run), else None."""
    given = getattr(args, o.dest, None)
    if given is not None and given is not False:
        return check(origin(args, o.dest, o.flag), given, o.rule)
    name = env_name(o)
    if name not in os.environ:
        return None
    text = os.environ[name]
    if o.kind is bool:
        lowered = text.strip().lower()
        if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise SecurityConfigError(f"${name}: expected true or false, got {text!r}")
        return lowered in ("1", "true", "yes", "on")
    try:
        value = o.kind(text)
    except ValueError:
        raise SecurityConfigError(f"${name}: expected a number, got {text!r}") from None
    return check(f"${name}", value, o.rule)


def security_from_args(args: argparse.Namespace) -> GrpcSecurity:
    """The ``GrpcSecurity`` the options describe (variables as fallback when ``config_file.apply_layers`` did not
    run); a ``ValueError`` names the option that is wrong and where it was set."""
    v = {o.dest: _value(args, o) for o in OPTIONS}

    def path(dest: str) -> Path | None:
        value = v[dest]
        return Path(str(value)) if value else None

    token_file = path("auth_token_file")
    token = None
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except (OSError, ValueError) as exc:
            raise SecurityConfigError(f"--auth-token-file {token_file}: "
                                      f"{getattr(exc, 'strerror', None) or exc}") from None
        if not token:
            raise SecurityConfigError(f"--auth-token-file {token_file} is empty")
    elif TOKEN_ENV in os.environ:
        token = os.environ[TOKEN_ENV].strip()
        if not token:
            raise SecurityConfigError(f"${TOKEN_ENV} is empty: give the token or unset the variable")
    mb = v["grpc_max_message_mb"]
    max_bytes = DEFAULT_MAX_MESSAGE_BYTES if mb is None else int(float(str(mb)) * MIB)
    server_name = v["tls_server_name"]
    return GrpcSecurity(ca_file=path("tls_ca"), cert_file=path("tls_cert"), key_file=path("tls_key"),
                        server_name=str(server_name) if server_name else None,
                        client_auth=bool(v["tls_client_auth"]), token=token, tokens_file=path("auth_tokens_file"),
                        insecure=bool(v["insecure"]), max_message_bytes=max_bytes, http_tls=bool(v["tls_http"]))


def configure_from_args(args: argparse.Namespace) -> GrpcSecurity:
    """Make the options this process's gRPC security (``grpc_channels.configure``); ``ValueError`` when unusable."""
    return configure(security_from_args(args))


__all__ = ["OPTIONS", "TOKEN_ENV", "SecurityOption", "add_security_options", "configure_from_args", "env_name",
           "security_from_args"]
