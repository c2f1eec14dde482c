"""How every command reaches etcd: endpoints, TLS and user/password, as flags, ``QUERYCOORD_ETCD_*`` variables or
``[etcd]`` keys of the configuration file.

``coord``, ``querynode``, ``streamnode``, ``etcd status|maintain`` and the
client commands that read etcd take the same options, so a secured cluster
is reached the same way by all of them. Secrets never have to be on the
command line (where ``ps`` shows them): the password comes from a file
(``--etcd-password-file``) or from ``QUERYCOORD_ETCD_PASSWORD``.

The options default to None ("not given") so that ``config_file.apply_layers``
can fill them from the environment, then the file; without it (a command
built outside ``querycoord.cli``), ``etcd_config_from_args`` still falls back
to the variables.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from meta.config import EtcdConfig
from querycoord.settings.setting_rules import CERTIFICATE_FILE, FILE, KEY_FILE, TEXT, Rule, check, origin

ENV_PREFIX = "QUERYCOORD_ETCD_"
# As etcdctl: endpoints also from its variable (after ours, before the file), and this one when none is given.
ENDPOINTS_ENV_ALIASES = ("ETCDCTL_ENDPOINTS",)
DEFAULT_ENDPOINTS = "127.0.0.1:2379"
# Other spellings of a flag: etcdctl's ``--endpoints``.
FLAG_ALIASES = {"--etcd-endpoints": ("--endpoints",)}
# flag -> (namespace attribute, help); the variable is ENV_PREFIX + the flag's rest, the file key [etcd] that rest.
OPTIONS = (
    ("--etcd-endpoints", "etcd_endpoints", f"comma-separated host:port list of etcd members (default "
                                           f"{DEFAULT_ENDPOINTS}, as etcdctl)"),
    ("--etcd-cacert", "etcd_cacert", "CA bundle that signed etcd's server certificates (enables TLS)"),
    ("--etcd-cert", "etcd_cert", "client certificate for etcd (mutual TLS; with --etcd-key)"),
    ("--etcd-key", "etcd_key", "private key of --etcd-cert"),
    ("--etcd-server-name", "etcd_server_name", "name to check etcd's certificate against (default: the endpoint's "
                                               "host)"),
    ("--etcd-user", "etcd_user", f"etcd user (with the password from --etcd-password-file or ${ENV_PREFIX}PASSWORD)"),
    ("--etcd-password-file", "etcd_password_file", "file holding the etcd user's password"),
)


# What each value must be (``setting_rules``): files readable now (certificates and keys holding their PEM block),
# names not empty; an empty ``cacert`` must not quietly mean plaintext, nor an empty ``user`` no authentication.
RULES: dict[str, Rule] = {
    "etcd_endpoints": TEXT, "etcd_cacert": CERTIFICATE_FILE, "etcd_cert": CERTIFICATE_FILE, "etcd_key": KEY_FILE,
    "etcd_server_name": TEXT,
    "etcd_user": TEXT, "etcd_password_file": FILE,
}


def env_name(flag: str) -> str:
    """``--etcd-password-file`` -> ``QUERYCOORD_ETCD_PASSWORD_FILE``."""
    return ENV_PREFIX + flag.removeprefix("--etcd-").replace("-", "_").upper()


def env_names(flag: str) -> tuple[str, ...]:
    """The variables of ``flag``, strongest first: ours, then the aliases (``$ETCDCTL_ENDPOINTS``)."""
    return (env_name(flag), *(ENDPOINTS_ENV_ALIASES if flag == "--etcd-endpoints" else ()))


def add_etcd_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add the etcd options to ``p`` (group "etcd").

    Endpoints given nowhere (flag, variable, file) are etcdctl's default,
    ``DEFAULT_ENDPOINTS``; ``required`` is kept for callers and changes nothing.
    """
    del required
    g = p.add_argument_group("etcd")
    for flag, dest, help_ in OPTIONS:
        key = flag.removeprefix("--etcd-").replace("-", "_")
        names = ", ".join(f"${n}" for n in env_names(flag))
        g.add_argument(flag, *FLAG_ALIASES.get(flag, ()), dest=dest, default=None,
                       help=f"{help_} ({names}, [etcd] {key})")


def _value(args: argparse.Namespace, flag: str, dest: str) -> str | None:
    """The option's value, checked by its rule: given (an empty string too), else its variable when set (when
    ``config_file.apply_layers`` did not run), else None."""
    given = getattr(args, dest, None)
    if given is not None:
        return str(check(origin(args, dest, flag), given, RULES[dest]))
    for name in env_names(flag):
        if name in os.environ:
            return str(check(f"${name}", os.environ[name], RULES[dest]))
    return None


def etcd_config_from_args(args: argparse.Namespace, **kwargs: object) -> EtcdConfig:
    """The ``EtcdConfig`` the options describe; ``ValueError`` names the option that is wrong, and where it was
    set."""
    values = {dest: _value(args, flag, dest) for flag, dest, _ in OPTIONS}
    endpoints = values["etcd_endpoints"] or DEFAULT_ENDPOINTS  # nowhere given (an empty one is refused above)
    if not endpoints.replace(",", "").strip():
        raise ValueError(f"{origin(args, 'etcd_endpoints', '--etcd-endpoints')}: no etcd endpoint in "
                         f"{endpoints!r} (give host:port, comma-separated)")
    password = os.environ.get(ENV_PREFIX + "PASSWORD")
    password_file = values["etcd_password_file"]
    if password_file:
        try:
            password = Path(password_file).read_text().rstrip("\n")
        except OSError as exc:
            raise ValueError(f"--etcd-password-file {password_file}: {exc.strerror or exc}") from None
    user = values["etcd_user"]
    if user and password is None:
        raise ValueError(f"--etcd-user needs a password: --etcd-password-file or ${ENV_PREFIX}PASSWORD")

    def path(name: str) -> Path | None:
        value = values[name]
        return Path(value) if value else None

    return EtcdConfig.from_endpoints(endpoints, ca_file=path("etcd_cacert"),
                                     cert_file=path("etcd_cert"), key_file=path("etcd_key"),
                                     tls_server_name=values["etcd_server_name"], user=user,
                                     password=password if user else None, **kwargs)


__all__ = ["DEFAULT_ENDPOINTS", "ENDPOINTS_ENV_ALIASES", "ENV_PREFIX", "FLAG_ALIASES", "OPTIONS", "RULES",
           "add_etcd_options", "env_name", "env_names", "etcd_config_from_args"]
