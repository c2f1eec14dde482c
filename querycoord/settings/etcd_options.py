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
# flag -> (namespace attribute, help); the variable is ENV_PREFIX + the flag's rest, the file key [etcd] that rest.
OPTIONS = (
    ("--etcd-endpoints", "etcd_endpoints", "comma-separated host:port list of etcd members"),
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


def add_etcd_options(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add the etcd options to ``p`` (group "etcd").

    ``required``: the command cannot run without endpoints; they may come
    from a flag, a variable or the file, so ``etcd_config_from_args`` checks
    it rather than argparse.
    """
    g = p.add_argument_group("etcd")
    for flag, dest, help_ in OPTIONS:
        must = " (required)" if required and flag == "--etcd-endpoints" else ""
        key = flag.removeprefix("--etcd-").replace("-", "_")
        g.add_argument(flag, dest=dest, default=None,
                       help=f"{help_}{must} (${env_name(flag)}, [etcd] {key})")


def _value(args: argparse.Namespace, flag: str, dest: str) -> str | None:
    """The option's value, checked by its rule: given (an empty string too), else its variable when set (when
    ``config_file.apply_layers`` did not run), else None."""
    given = getattr(args, dest, None)
    if given is not None:
        return str(check(origin(args, dest, flag), given, RULES[dest]))
    name = env_name(flag)
    if name in os.environ:
        return str(check(f"${name}", os.environ[name], RULES[dest]))
    return None


def etcd_config_from_args(args: argparse.Namespace, **kwargs: object) -> EtcdConfig:
    """The ``EtcdConfig`` the options describe; ``ValueError`` names the option that is wrong, and where it was
    set."""
    values = {dest: _value(args, flag, dest) for flag, dest, _ in OPTIONS}
    if not values["etcd_endpoints"]:
        raise ValueError(f"no etcd endpoints: give --etcd-endpoints, ${ENV_PREFIX}ENDPOINTS or [etcd] endpoints in "
                         "the configuration file")
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

    return EtcdConfig.from_endpoints(values["etcd_endpoints"], ca_file=path("etcd_cacert"),
                                     cert_file=path("etcd_cert"), key_file=path("etcd_key"),
                                     tls_server_name=values["etcd_server_name"], user=user,
                                     password=password if user else None, **kwargs)


__all__ = ["ENV_PREFIX", "OPTIONS", "RULES", "add_etcd_options", "env_name", "etcd_config_from_args"]
