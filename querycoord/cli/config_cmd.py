"""``querycoord config show``: the configuration ``coord`` would run with, and where each value comes from.

It takes ``coord``'s options, so ``querycoord config show --config F --ttl 5``
answers "what would ``querycoord coord --config F --ttl 5`` use?", and fails
(exit 2, one line) where ``coord`` would refuse to start: a number out of
its bounds, an empty or unreadable path, a principals file that does not
parse. The etcd password is never printed, only whether one is set and
from where.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from querycoord.cli.common import add_output_option, emit
from querycoord.console import draw
from querycoord.settings.config import CoordConfig, scaled_config
from querycoord.settings.config_file import PASSWORD_ENV, SETTINGS, Setting, Source, applicable
from querycoord.settings.coord_options import OPTIONS, add_coord_options, config_from_args, option_value
from querycoord.settings.etcd_options import DEFAULT_ENDPOINTS
from querycoord.settings.logs import DEFAULT_FORMAT, DEFAULT_LEVEL
from querycoord.settings.security_options import OPTIONS as SECURITY_OPTIONS
from querycoord.settings.security_options import security_from_args

HIDDEN = "(hidden)"
_PATHS = {o.flag: o.path for o in OPTIONS}
_PASSWORD_FILE = next(s for s in SETTINGS if s.name == "etcd.password_file")
_LOG_DEFAULTS = {"log.level": DEFAULT_LEVEL, "log.format": DEFAULT_FORMAT}
# Defaults of the security options that have one (switches are off, the message limit is 16 MiB).
_SECURITY_DEFAULTS = {o.flag: o.default_value() for o in SECURITY_OPTIONS if o.default_value() is not None}


def _origin(source: Source, setting: Setting) -> str:
    """The source as the user would change it: the variable or flag that set the value."""
    if source is Source.ENV:
        return f"env {setting.env}"
    if source is Source.FLAG:
        return f"flag {setting.flag}"
    return source.value


def settings(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str | None]:
    """One entry per setting (key, value, source, origin) and the error ``coord`` would stop with, if any."""
    error = None
    try:
        built: CoordConfig | None = config_from_args(args)
        security_from_args(args).check()  # TLS files readable, principals file usable: as `coord` checks them
    except ValueError as exc:
        built, error = None, str(exc)
    base = built or (scaled_config(listen=CoordConfig.listen) if args.scaled else CoordConfig())
    sources: dict[str, Source] = args.config_sources
    rows = []
    for s in applicable(args):
        value = getattr(args, s.dest)
        if s.flag in _PATHS and (built is not None or value is None):
            value = option_value(base, _PATHS[s.flag])
        elif s.name in _LOG_DEFAULTS and value is None:
            value = _LOG_DEFAULTS[s.name]
        elif s.name == "etcd.endpoints" and value is None:
            value = DEFAULT_ENDPOINTS  # etcdctl's, what `coord` reaches when no endpoint is given
        elif s.flag in _SECURITY_DEFAULTS and value in (None, False):
            value = _SECURITY_DEFAULTS[s.flag]
        source = sources[s.name]
        origin = _origin(source, s)
        if source is Source.ENV:  # the variable that set it: the setting's own, or an alias ($ETCDCTL_ENDPOINTS)
            origin = "env " + args.config_origins.get(s.dest, f"${s.env}").removeprefix("$")
        rows.append({"key": s.name, "value": value, "source": source.value, "origin": origin})
        if s is _PASSWORD_FILE:
            rows.append(_password_row(sources))
    return rows, error


def _password_row(sources: dict[str, Source]) -> dict[str, Any]:
    """Whether a password is set and from where; never its value."""
    password, by_file = sources["etcd.password"], sources["etcd.password_file"]
    if password is Source.DEFAULT:
        origin = "default"
    elif by_file is Source.DEFAULT:
        origin = f"env {PASSWORD_ENV}"
    else:
        origin = f"password_file ({_origin(by_file, _PASSWORD_FILE)})"
    return {"key": "etcd.password", "value": None if password is Source.DEFAULT else HIDDEN,
            "source": password.value, "origin": origin}


def _cell(value: Any) -> str:
    """Unset and empty look different: ``-`` is "not set", ``""`` is set to nothing (e.g. no HTTP endpoint)."""
    return "-" if value is None else '""' if value == "" else str(value)


def cmd_show(args: argparse.Namespace) -> int:
    rows, error = settings(args)

    def render() -> list[str]:
        cells = [[r["key"], _cell(r["value"]), r["origin"]] for r in rows]
        return [f"configuration file: {args.config_file or 'none (--config FILE or $QUERYCOORD_CONFIG)'}",
                *draw.table(["KEY", "VALUE", "FROM"], cells)]

    emit(args, {"config_file": args.config_file, "settings": rows, "error": error}, render)
    if error is not None:
        print(f"error: `querycoord coord` would not start with this configuration: {error}", file=sys.stderr)
        return 2
    return 0


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="the configuration: file, QUERYCOORD_* variables and flags")
    actions = p.add_subparsers(dest="config_action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show", help="print the effective configuration of `coord` and where each value comes from",
        description="Takes the options of `querycoord coord`; precedence: flag > environment > file > default.")
    add_coord_options(show)
    add_output_option(show)
    show.set_defaults(func=cmd_show)


__all__ = ["add_parsers", "cmd_show", "settings"]
