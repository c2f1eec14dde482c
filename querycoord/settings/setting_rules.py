"""One rule for every configured value: numbers finite and within bounds, strings not empty, files readable now.

Why one rule rather than a check per option: values come from three layers
(flag, ``QUERYCOORD_*`` variable, TOML file) and several tables of options
(``coord_options``, ``etcd_options``, ``security_options``, the nodes'
flags), and a check written per option is the one someone forgets. A
forgotten check does harm: TOML and ``float()`` both accept ``nan`` and
``inf``, and ``ttl = nan`` passes every ``ttl < 2`` test, so the coordinator
would never lead; ``[auth] tokens_file = ""`` read as "not set" would turn
authentication off without a word. So every option table
declares a ``Rule`` per option (or gets its kind's default), and the same
``Rule.problem`` judges every value whatever its source: a number must be
finite and within bounds, a string must not be empty (an empty value never
switches a setting off: the setting is left out instead), a path must name a
file this process can read now, an address must be HOST:PORT.

The error is one line naming the key and where the value came from: the flag
(``--ttl``), the variable (``$QUERYCOORD_COORD_TTL``) or the file and key
(``configuration file q.toml: [coord] ttl``), as ``config_file.apply_layers``
recorded it in ``args.config_origins``.

This module imports nothing of the runtime: every option table may use it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from meta.address import address_problem

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
DAY = 24 * 3600.0
YEAR = 365 * DAY


class SettingError(ValueError):
    """A configured value that cannot be used; the message is one line naming the key and its source."""


@dataclass(frozen=True)
class Rule:
    """What a value of one option must be. ``low``/``high`` bound a number (``above``: strictly more than
    ``low``); a string must not be empty unless ``empty_ok``; ``file``: it names a file readable now;
    ``address``: it is HOST:PORT with a port in 0..65535; ``pem``: the file holds a PEM block of that kind
    (``CERTIFICATE``, ``PRIVATE KEY``), so a wrong file is named at once, not by gRPC's own log lines later."""

    low: float | None = None
    high: float | None = None
    above: bool = False
    empty_ok: bool = False
    file: bool = False
    address: bool = False
    pem: str = ""

    def problem(self, value: object) -> str | None:
        """Why ``value`` breaks the rule, as a phrase that follows the key (``must be at least 2, got nan``);
        None when it is fine or unset (None)."""
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return self._number_problem(value)
        if isinstance(value, str):
            return self._text_problem(value)
        return None

    def _number_problem(self, value: float) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number{self._range()}, got {value!r}"
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return f"must be {'more than' if self.above else 'at least'} {_num(self.low)}, got {_num(value)}"
        if self.high is not None and value > self.high:
            return f"must be at most {_num(self.high)}, got {_num(value)}"
        return None

    def _range(self) -> str:
        if self.low is None and self.high is None:
            return ""
        parts = []
        if self.low is not None:
            parts.append(f"{'more than' if self.above else 'at least'} {_num(self.low)}")
        if self.high is not None:
            parts.append(f"at most {_num(self.high)}")
        return " " + " and ".join(parts)

    def _text_problem(self, value: str) -> str | None:
        if not value:
            if self.empty_ok:
                return None
            return ("is empty: give a value or leave the setting out (an empty value never turns a setting "
                    "off)")
        if self.file:
            try:
                with open(value, "rb") as f:
                    head = f.read(_PEM_SCAN_BYTES)
            except OSError as exc:
                return f"cannot be read ({value}: {exc.strerror or exc})"
            if self.pem and not _has_pem(head, self.pem):
                return f"{value} is not a PEM {self.pem.lower()} (no -----BEGIN ...{self.pem}----- block)"
        if self.address:
            if address_problem(value, any_host=True):
                return f"{value!r} is not HOST:PORT with a port in 0..65535 (port 0: any free port)"
        return None


# A certificate bundle or key file is read this far for its PEM block (a chain of certificates is a few KiB).
_PEM_SCAN_BYTES = 1 << 20


def _has_pem(data: bytes, kind: str) -> bool:
    """Whether ``data`` holds a ``-----BEGIN <...kind>-----`` line (``PRIVATE KEY`` matches ``EC PRIVATE KEY``)."""
    for line in data.splitlines():
        text = line.strip()
        if text.startswith(b"-----BEGIN ") and text.endswith(kind.encode() + b"-----"):
            return True
    return False


def _num(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


# The rules most options take.
TEXT = Rule()
OPTIONAL_TEXT = Rule(empty_ok=True)
FILE = Rule(file=True)
CERTIFICATE_FILE = Rule(file=True, pem="CERTIFICATE")
KEY_FILE = Rule(file=True, pem="PRIVATE KEY")
ADDRESS = Rule(address=True)
COUNT = Rule(0, INT32_MAX)
POSITIVE_COUNT = Rule(1, INT32_MAX)
SECONDS = Rule(0, YEAR)


def seconds(low: float = 0.0, high: float = DAY, *, above: bool = False) -> Rule:
    """A duration in seconds, from ``low`` (excluded when ``above``) to ``high``."""
    return Rule(low, high, above=above)


def default_rule(kind: type) -> Rule:
    """The rule of an option that declares none: a duration (float), a count (int), a non-empty string."""
    return {float: SECONDS, int: COUNT, bool: Rule()}.get(kind, TEXT)


def check(where: str, value: object, rule: Rule) -> Any:
    """``value`` if ``rule`` accepts it; else ``SettingError`` ``<where> <problem>``."""
    problem = rule.problem(value)
    if problem is not None:
        raise SettingError(f"{where} {problem}")
    return value


def origin(args: argparse.Namespace, dest: str, flag: str) -> str:
    """Where the value of ``dest`` came from, as an error names it (``config_file.apply_layers`` records it;
    without it, the flag)."""
    origins: dict[str, str] = getattr(args, "config_origins", None) or {}
    return origins.get(dest, flag)


def check_args(args: argparse.Namespace, options: Iterable[tuple[str, str, Rule]]) -> None:
    """Check the value of each ``(dest, flag, rule)`` in ``args``; the first problem is a ``SettingError``."""
    for dest, flag, rule in options:
        check(origin(args, dest, flag), getattr(args, dest, None), rule)


def flag_type(kind: Callable[[str], Any], rule: Rule) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses ``kind`` and applies ``rule``: argparse names the flag in its error."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            expected = {int: "an integer", float: "a number"}.get(kind, "a value")  # type: ignore[call-overload]
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        problem = rule.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse's "invalid <name> value" fallback
    return parse


__all__ = ["ADDRESS", "COUNT", "DAY", "FILE", "INT32_MAX", "INT64_MAX", "OPTIONAL_TEXT", "POSITIVE_COUNT", "SECONDS",
           "TEXT", "YEAR", "Rule", "SettingError", "check", "check_args", "default_rule", "flag_type", "origin",
           "seconds"]
