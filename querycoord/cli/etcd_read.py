"""Which deployment a command reads straight from etcd: the root and the endpoints, layered as ``coord`` takes
them, and said on stderr before anything is read.

The root comes from ``--root``, else ``$QUERYCOORD_COORD_ROOT`` or
``$QUERYCOORD_ROOT``, else ``[coord] root`` of the ``--config`` file, else
``querycoord``; the endpoints from ``--etcd-endpoints`` (or ``--endpoints``),
else ``$QUERYCOORD_ETCD_ENDPOINTS`` or ``$ETCDCTL_ENDPOINTS``, else
``[etcd] endpoints``, else ``127.0.0.1:2379`` (``config_file.apply_layers``
does the layering; nothing here reads a variable or the file). The line
``reading root "R" (from WHERE) at etcd E (from WHERE)`` goes to stderr, so
``-o json`` keeps stdout one JSON document, and a user who meant another
deployment sees it before reading the answer.

A one-shot reader fails at once when every endpoint refuses the connection
(``EtcdConfig.refused_is_final``): the kernel's answer, not 15 seconds of
retries.
"""

from __future__ import annotations

import argparse
import sys

from meta.config import EtcdConfig
from meta.errors import MetaRefused
from querycoord.settings.config import CoordConfig
from querycoord.settings.config_file import Source
from querycoord.settings.etcd_options import DEFAULT_ENDPOINTS, etcd_config_from_args
from querycoord.settings.setting_rules import TEXT, check, origin

ROOT_SETTING = "coord.root"


def add_root_option(p: argparse.ArgumentParser, help_: str = "meta root path in etcd") -> None:
    """``--root``, layered as ``coord``'s (see the module docstring)."""
    p.add_argument("--root", default=None,
                   help=f"{help_} (default $QUERYCOORD_ROOT, [coord] root of --config, else {CoordConfig.root})")
    p.set_defaults(config_settings=(ROOT_SETTING,))  # config_file.apply_layers reads [coord] root for it


def read_root(args: argparse.Namespace) -> str:
    """The root the options name (checked: not empty); the default when none does."""
    if args.root is None:
        return CoordConfig.root
    return str(check(origin(args, "root", "--root"), args.root, TEXT))


def _source(args: argparse.Namespace, setting: str, dest: str, flag: str) -> str:
    """Where the value of ``dest`` came from, as a user would change it: ``from --root``, ``from $VAR``,
    ``from FILE [section] key``, or ``default``."""
    sources: dict[str, Source] = getattr(args, "config_sources", None) or {}
    source = sources.get(setting)
    if source is Source.FILE:
        section, _, key = setting.partition(".")
        return f"from {args.config_file} [{section}] {key}"
    if source is Source.ENV:
        return f"from {origin(args, dest, flag)}"
    if source is Source.FLAG or (source is None and getattr(args, dest, None) is not None):
        return f"from {flag}"
    return "default"


def endpoints_defaulted(args: argparse.Namespace) -> bool:
    """No endpoints were given anywhere: the command tries etcdctl's default."""
    return _source(args, "etcd.endpoints", "etcd_endpoints", "--etcd-endpoints") == "default"


def reader_config(args: argparse.Namespace, timeout: float | None = None) -> EtcdConfig:
    """The ``EtcdConfig`` of a one-shot reader: a refused connection is final; ``timeout`` bounds the whole read
    (each attempt at most 2 s of it). ``ValueError`` names a bad option."""
    if timeout is None:
        return etcd_config_from_args(args, refused_is_final=True)
    return etcd_config_from_args(args, call_timeout=min(2.0, timeout), deadline=timeout, refused_is_final=True)


def describe_root(args: argparse.Namespace, root: str) -> str:
    """``root "R" (from WHERE)``."""
    return f'root "{root}" ({_source(args, ROOT_SETTING, "root", "--root")})'


def say_target(args: argparse.Namespace, root: str, config: EtcdConfig, verb: str = "reading") -> None:
    """The one stderr line naming the deployment: root and endpoints, each with where it came from."""
    etcd_from = _source(args, "etcd.endpoints", "etcd_endpoints", "--etcd-endpoints")
    print(f'{verb} {describe_root(args, root)} at etcd {",".join(config.endpoints)} ({etcd_from})',
          file=sys.stderr, flush=True)


def refused_message(args: argparse.Namespace, exc: MetaRefused) -> str:
    """The error line for a refused etcd; when the endpoints were the default, how to name others."""
    if endpoints_defaulted(args):
        return (f"{exc}; {DEFAULT_ENDPOINTS} is the default: give --endpoints (or $ETCDCTL_ENDPOINTS), or start "
                "etcd there (`querycoord up`)")
    return str(exc)


__all__ = ["ROOT_SETTING", "add_root_option", "describe_root", "endpoints_defaulted", "read_root", "reader_config",
           "refused_message", "say_target"]
