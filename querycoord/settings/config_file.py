"""One configuration for every command: a TOML file, ``QUERYCOORD_*`` variables and flags, in that order of strength.

Precedence is flag > environment > file > default. The settings are not
declared here: they are read from the option tables (``coord_options.OPTIONS``
for ``[coord]``, ``etcd_options.OPTIONS`` for ``[etcd]``, the log options for
``[log]``), so an option added to a table is at once a flag, a file key
(the flag's name within its section, dashes or underscores) and a variable
(``QUERYCOORD_<SECTION>_<KEY>``, e.g. ``QUERYCOORD_COORD_TTL``,
``QUERYCOORD_ETCD_ENDPOINTS``, ``QUERYCOORD_LOG_FORMAT``).

The file is given by ``--config`` or ``$QUERYCOORD_CONFIG``. Every key in it
is checked (type, spelling) whichever command reads it, so a typo is an
error rather than a silently ignored setting. The etcd password is never a
key or a flag: it comes from ``password_file`` or ``$QUERYCOORD_ETCD_PASSWORD``,
so it is never on a command line (``ps``) nor in a file that is also shared
for its other settings.

``apply_layers`` fills the options a command was not given on its command
line (argparse leaves them None) from the environment, then the file, and
records where each value came from for ``querycoord config show``.
"""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from querycoord.settings import coord_options, etcd_options, security_options
from querycoord.settings.logs import FORMATS, LEVELS

CONFIG_ENV = "QUERYCOORD_CONFIG"
PASSWORD_ENV = etcd_options.ENV_PREFIX + "PASSWORD"
# Variables read after a setting's own and before the file: etcdctl's for the endpoints, the readers' for the root.
ENV_ALIASES: dict[str, tuple[str, ...]] = {"etcd.endpoints": etcd_options.ENDPOINTS_ENV_ALIASES,
                                           "coord.root": ("QUERYCOORD_ROOT",)}


class Source(enum.StrEnum):
    DEFAULT = "default"
    FILE = "file"
    ENV = "env"
    FLAG = "flag"


class ConfigError(ValueError):
    """A configuration file or variable that cannot be used; the message names the file or variable and the key."""


@dataclass(frozen=True)
class Setting:
    """One configurable value: ``[section] key`` in the file, ``env`` in the environment, ``flag`` on the line."""

    section: str
    key: str
    flag: str
    dest: str
    kind: type
    # The values allowed (compared without case); empty: any value of ``kind``.
    choices: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def env(self) -> str:
        return f"QUERYCOORD_{self.section.upper()}_{self.key.upper()}"

    @property
    def envs(self) -> tuple[str, ...]:
        """Every variable of the setting, strongest first: ``env``, then the names other tools use."""
        return (self.env, *ENV_ALIASES.get(self.name, ()))


def _from_flag(section: str, flag: str, kind: type, dest: str | None = None, choices: tuple[str, ...] = ()) -> Setting:
    name = flag.removeprefix("--").removeprefix(f"{section}-").replace("-", "_")
    return Setting(section, name, flag, dest or flag.removeprefix("--").replace("-", "_"), kind, choices)


SETTINGS: tuple[Setting, ...] = (
    *(_from_flag("coord", o.flag, o.kind) for o in coord_options.OPTIONS),
    *(_from_flag("coord", flag, kind) for flag, kind in coord_options.PRESET_OPTIONS),
    *(_from_flag("etcd", flag, str, dest) for flag, dest, _help in etcd_options.OPTIONS),
    _from_flag("log", "--log-level", str, choices=LEVELS),
    _from_flag("log", "--log-format", str, choices=FORMATS),
    *(_from_flag(o.section, o.flag, o.kind, o.dest) for o in security_options.OPTIONS),
)
_BY_KEY = {(s.section, s.key): s for s in SETTINGS}
# Sections every command that has the options reads; ``[coord]`` only the commands that declare it (their
# ``--listen`` or ``--ttl`` is a coordinator's, unlike the query node's options of the same names).
_SHARED_SECTIONS = ("etcd", "log", "tls", "auth", "grpc")


def add_config_option(p: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """``--config FILE``; ``suppress`` on a sub-command, so a value given before it is kept."""
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS if suppress else None,
                   help=f"TOML configuration file (${CONFIG_ENV}); flags and QUERYCOORD_* variables override it")


def load_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The file's settings as ``{section: {key: value}}``, keys normalised; ``ConfigError`` for anything unknown."""
    import tomllib  # only when a file is read: most commands run without one

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"configuration file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    sections = sorted({s.section for s in SETTINGS})
    out: dict[str, dict[str, Any]] = {}
    for section, table in data.items():
        if section not in sections or not isinstance(table, dict):
            raise ConfigError(f"configuration file {path}: unknown section [{section}] (known: "
                              f"{', '.join(f'[{s}]' for s in sections)})")
        for raw_key, value in table.items():
            key = raw_key.replace("-", "_")
            setting = _BY_KEY.get((section, key))
            if setting is None:
                if (section, key) == ("etcd", "password"):
                    hint = f": set password_file, or ${PASSWORD_ENV}, instead of the password itself"
                elif (section, key) == ("auth", "token"):
                    hint = f": set token_file, or ${security_options.TOKEN_ENV}, instead of the token itself"
                else:
                    known = ", ".join(s.key for s in SETTINGS if s.section == section)
                    hint = f" (known: {known})"
                raise ConfigError(f"configuration file {path}: unknown key {raw_key!r} in [{section}]{hint}")
            out.setdefault(section, {})[key] = _typed(setting, value, f"configuration file {path}: [{section}] "
                                                                      f"{raw_key}")
    return out


def _typed(s: Setting, value: Any, where: str) -> Any:
    """``value`` (from TOML) as the setting's type; a list of endpoints is joined as the flag takes it."""
    if s.kind is str and isinstance(value, list) and s.key == "endpoints" and all(isinstance(v, str) for v in value):
        return ",".join(value)
    ok = {
        str: isinstance(value, str),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        bool: isinstance(value, bool),
    }[s.kind]
    if not ok:
        expected = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}[s.kind]
        raise ConfigError(f"{where}: expected {expected}, got {value!r}")
    return _checked(s, s.kind(value), where)


def _checked(s: Setting, value: Any, where: str) -> Any:
    if s.choices and str(value).upper() not in {c.upper() for c in s.choices}:
        raise ConfigError(f"{where}: expected one of {', '.join(s.choices)}, got {value!r}")
    return value


def _from_env(s: Setting, text: str, name: str | None = None) -> Any:
    """A variable's text (of the variable ``name``, default ``s.env``) as the setting's type. Set but empty is a
    value like any other (a string setting's rule refuses it where one is expected), never "not set": unset the
    variable for that."""
    name = name or s.env
    if s.kind is bool:
        lowered = text.strip().lower()
        if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ConfigError(f"${name}: expected true or false, got {text!r}")
        return lowered in ("1", "true", "yes", "on")
    if s.kind is str:
        return _checked(s, text, f"${name}")
    try:
        value = s.kind(text)
    except ValueError:
        expected = {int: "an integer", float: "a number"}.get(s.kind, s.kind.__name__)
        raise ConfigError(f"${name}: expected {expected}, got {text!r}") from None
    return _checked(s, value, f"${name}")


def applicable(args: argparse.Namespace) -> Iterator[Setting]:
    """The settings the command in ``args`` has options for: the shared sections, its own section
    (``config_section``), and single settings of another section it names in ``config_settings`` (a reader of
    etcd takes ``[coord] root`` as the coordinator does, and none of the coordinator's other options)."""
    own = getattr(args, "config_section", None)
    picked = getattr(args, "config_settings", ())
    for s in SETTINGS:
        if (s.section in _SHARED_SECTIONS or s.section == own or s.name in picked) and hasattr(args, s.dest):
            yield s


def _given(value: Any) -> bool:
    return value is not None and value is not False


def apply_layers(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Fill the options not given as flags from the environment, else the file; record each source.

    Sets ``args.config_file`` (the file read, or None),
    ``args.config_sources`` (setting name -> ``Source``) and
    ``args.config_origins`` (namespace attribute -> how an error names the
    value's source: ``--ttl``, ``$QUERYCOORD_COORD_TTL``, ``configuration file
    F: [coord] ttl``; ``setting_rules`` reads it). A value left at its default
    stays None in ``args``: the command applies its own default, as without a
    configuration. A variable set to an empty value is taken as given (and
    refused by the setting's rule where a value is expected), so that an empty
    value never turns a setting off. ``ConfigError`` names a bad file, key or
    variable.
    """
    env = os.environ if environ is None else environ
    if CONFIG_ENV in env and not env[CONFIG_ENV] and getattr(args, "config", None) is None:
        raise ConfigError(f"${CONFIG_ENV} is empty: name the configuration file or unset the variable")
    path = getattr(args, "config", None)
    if path == "":
        raise ConfigError("--config is empty: name the configuration file or leave the option out")
    path = path or env.get(CONFIG_ENV) or None
    file = load_file(path) if path else {}
    sources: dict[str, Source] = {}
    origins: dict[str, str] = {}
    for s in applicable(args):
        if _given(getattr(args, s.dest)):
            sources[s.name] = Source.FLAG
            origins[s.dest] = s.flag
        elif (name := next((n for n in s.envs if n in env), None)) is not None:
            setattr(args, s.dest, _from_env(s, env[name], name))
            sources[s.name] = Source.ENV
            origins[s.dest] = f"${name}"
        elif s.key in file.get(s.section, {}):
            setattr(args, s.dest, file[s.section][s.key])
            sources[s.name] = Source.FILE
            origins[s.dest] = f"configuration file {path}: [{s.section}] {s.key}"
        else:
            sources[s.name] = Source.DEFAULT
    if "etcd.password_file" in sources:
        _layer_password(args, env, sources)
    args.config_file = path
    args.config_sources = sources
    args.config_origins = origins
    return args


def _layer_password(args: argparse.Namespace, env: Mapping[str, str], sources: dict[str, Source]) -> None:
    """The password is one setting in two forms: a password file named by a flag or variable beats
    ``$QUERYCOORD_ETCD_PASSWORD``, which beats a password file named in the configuration file."""
    from_file = sources["etcd.password_file"]
    if env.get(PASSWORD_ENV) and from_file in (Source.FILE, Source.DEFAULT):
        args.etcd_password_file = None
        sources["etcd.password_file"] = Source.DEFAULT
        sources["etcd.password"] = Source.ENV
    elif from_file is not Source.DEFAULT:
        sources["etcd.password"] = from_file
    else:
        sources["etcd.password"] = Source.DEFAULT


__all__ = ["CONFIG_ENV", "ENV_ALIASES", "PASSWORD_ENV", "SETTINGS", "ConfigError", "Setting", "Source",
           "add_config_option", "applicable", "apply_layers", "load_file"]
