"""How every command reaches etcd: endpoints, TLS and user/password, as flags or ``QUERYCOORD_ETCD_*`` variables.

``coord``, ``querynode``, ``streamnode``, ``etcd status|maintain`` and the
client commands that read etcd take the same options, so a secured cluster
is reached the same way by all of them. Secrets never have to be on the
command line (where ``ps`` shows them): the password comes from a file
(``--etcd-password-file``) or from ``QUERYCOORD_ETCD_PASSWORD``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from meta.config import EtcdConfig

ENV_PREFIX = "QUERYCOORD_ETCD_"
# flag -> (namespace attribute, environment variable suffix, help)
_OPTIONS = (
    ("--etcd-endpoints", "etcd_endpoints", "ENDPOINTS", "comma-separated host:port list of etcd members"),
    ("--etcd-cacert", "etcd_cacert", "CACERT", "CA bundle that signed etcd's server certificates (enables TLS)"),
    ("--etcd-cert", "etcd_cert", "CERT", "client certificate for etcd (mutual TLS; with --etcd-key)"),
    ("--etcd-key", "etcd_key", "KEY", "private key of --etcd-cert"),
    ("--etcd-server-name", "etcd_server_name", "SERVER_NAME",
     "name to check etcd's certificate against (default: the endpoint's host)"),
    ("--etcd-user", "etcd_user", "USER", "etcd user (with the password from --etcd-password-file or "
                                         f"${ENV_PREFIX}PASSWORD)"),
    ("--etcd-password-file", "etcd_password_file", "PASSWORD_FILE", "file holding the etcd user's password"),
)


def add_etcd_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add the etcd options to ``p``; each defaults to its ``QUERYCOORD_ETCD_*`` variable.

    ``required``: ``--etcd-endpoints`` must be given (flag or variable).
    """
    g = p.add_argument_group("etcd")
    for flag, dest, env, help_ in _OPTIONS:
        default = os.environ.get(ENV_PREFIX + env)
        must = required and flag == "--etcd-endpoints" and default is None
        g.add_argument(flag, dest=dest, default=default, required=must, help=f"{help_} (${ENV_PREFIX}{env})")


def etcd_config_from_args(args: argparse.Namespace, **kwargs: object) -> EtcdConfig:
    """The ``EtcdConfig`` the options describe; ``ValueError`` names the option that is wrong."""
    if not getattr(args, "etcd_endpoints", None):
        raise ValueError(f"--etcd-endpoints (or ${ENV_PREFIX}ENDPOINTS) is required")
    password = os.environ.get(ENV_PREFIX + "PASSWORD")
    if getattr(args, "etcd_password_file", None):
        try:
            password = Path(args.etcd_password_file).read_text().rstrip("\n")
        except OSError as exc:
            raise ValueError(f"--etcd-password-file {args.etcd_password_file}: {exc.strerror or exc}") from None
    if getattr(args, "etcd_user", None) and password is None:
        raise ValueError(f"--etcd-user needs a password: --etcd-password-file or ${ENV_PREFIX}PASSWORD")

    def path(name: str) -> Path | None:
        value = getattr(args, name, None)
        return Path(value) if value else None

    user = getattr(args, "etcd_user", None) or None
    return EtcdConfig.from_endpoints(args.etcd_endpoints, ca_file=path("etcd_cacert"), cert_file=path("etcd_cert"),
                                     key_file=path("etcd_key"), tls_server_name=getattr(args, "etcd_server_name", None),
                                     user=user, password=password if user else None, **kwargs)


__all__ = ["ENV_PREFIX", "add_etcd_options", "etcd_config_from_args"]
