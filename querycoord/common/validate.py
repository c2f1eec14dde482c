"""Small checks of request fields, all raising one error that names the field, the value and the limit.

Every RPC handler checks its request with these before anything is queued or
written (``querycoord.common.limits`` says why). A refusal is an ``InvalidField``,
an ``IllegalArgument``: callers see ILLEGAL_ARGUMENT (the services' answer to
a malformed request) with a reason such as ``invalid num_partitions:
2147483647 is out of range (limit 1..4096, or 0 for the default)``.

Each check costs time linear in what it is given and looks at a list's
length before its items, so a refusal of a huge request is as cheap as
accepting a small one. Shown values are cut short: a reason never echoes a
megabyte string back.

Duplicates in id lists: each caller decides per field and says so where it
checks. The rule used throughout: a list that a mutation acts on (load,
release, balance, add) refuses duplicates (an ambiguous request is better
refused than guessed); a list that only filters a read (show, get) drops
them silently.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any, Literal

from querycoord.common.errors import IllegalArgument
from querycoord.common.limits import INT64_MAX

_SHOWN_CHARS = 40


class InvalidField(IllegalArgument):
    """One field of a request is out of its bounds or ill-formed: ``field``, its ``value`` and the ``limit``."""

    def __init__(self, field: str, value: Any, problem: str, limit: Any = None):
        self.field = field
        self.value = value
        self.limit = limit
        text = f"invalid {field}: {shown(value)} {problem}"
        if limit is not None:
            text += f" (limit {limit})"
        super().__init__(text)


def shown(value: Any) -> str:
    """``value`` as a reason shows it: short strings quoted, long ones cut, lists by their length."""
    if isinstance(value, str):
        text = repr(value[:_SHOWN_CHARS])
        if len(text) > 2 * _SHOWN_CHARS:  # escapes of control or exotic characters
            text = text[: 2 * _SHOWN_CHARS] + "..."
        return text if len(value) <= _SHOWN_CHARS else f"{text}... ({len(value)} characters)"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    if isinstance(value, Sized) and not isinstance(value, int):
        return f"{len(value)} items"
    return repr(value)


# A generated protobuf enum class: ``values()`` and ``Name()`` come from its metaclass (``EnumTypeWrapper``),
# which the generated stubs do not let a Protocol describe.
EnumType = Any


def check_range(field: str, value: int, low: int, high: int) -> int:
    """``low <= value <= high`` (both included); the limit shown is ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidField(field, value, "is out of range", f"{low}..{high}")
    return value


def check_number_or_default(field: str, value: int, high: int) -> int:
    """A count where 0 means "the default" (one partition, the default channels): 0 or ``1..high``, and the limit
    shown says so (a range ``0..high`` would read as if 0 of them were possible)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise InvalidField(field, value, "is out of range", f"1..{high}, or 0 for the default")
    return value


def check_id(field: str, value: int, *, optional: bool = False) -> int:
    """A positive id within int64 (0 too when ``optional``: "not given")."""
    if optional and value == 0:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= INT64_MAX:
        what = "must be a positive id" + (" or 0" if optional else "")
        raise InvalidField(field, value, what, f"1..{INT64_MAX}")
    return value


def check_count(field: str, items: Sized, limit: int, *, required: bool = False) -> int:
    """A list's length: at most ``limit``, at least 1 when ``required``; looked at before any item."""
    n = len(items)
    if n > limit:
        raise InvalidField(field, items, "are too many", f"{limit}")
    if required and n == 0:
        raise InvalidField(field, items, "must not be empty", f"1..{limit}")
    return n


def check_ids(
    field: str,
    values: Sequence[int],
    limit: int,
    *,
    required: bool = False,
    duplicates: Literal["refuse", "drop"] = "refuse",
) -> list[int]:
    """A list of positive ids: at most ``limit`` of them (at least one when ``required``), each a positive
    int64; repeated ids are refused or dropped (first occurrence kept) as ``duplicates`` says.

    The common case (all fine) runs in C (min, max, set); the offending id is looked for only to refuse.
    """
    n = check_count(field, values, limit, required=required)
    if n == 0:
        return []
    items = list(values)
    if min(items) <= 0 or max(items) > INT64_MAX:
        for value in items:
            check_id(field, value)
    unique = list(dict.fromkeys(items))
    if len(unique) != n and duplicates == "refuse":
        seen: set[int] = set()
        for value in items:
            if value in seen:
                raise InvalidField(field, value, "appears twice: each id is given once")
            seen.add(value)
    return unique


def _printable_token(value: str) -> bool:
    # isprintable() refuses every Unicode "Other" and "Separator" character except the ASCII space, and every
    # whitespace character is one of those: the space is the only one left to look for (in C, not per character).
    return value.isprintable() and " " not in value


def check_name(field: str, value: str, limit: int, *, required: bool = True) -> str:
    """A name: 1..``limit`` printable characters without whitespace (or empty when not ``required``)."""
    if not value:
        if required:
            raise InvalidField(field, value, "must not be empty", f"1..{limit} characters")
        return value
    if len(value) > limit:
        raise InvalidField(field, value, "is too long", f"{limit} characters")
    if not _printable_token(value):
        raise InvalidField(field, value, "must be printable characters without whitespace or control characters")
    return value


def name_ok(value: str, limit: int) -> bool:
    """Whether ``check_name(..., required=False)`` accepts ``value``: the fast test of bulk checks."""
    return not value or (len(value) <= limit and _printable_token(value))


def text_ok(value: str, limit: int) -> bool:
    """A fast test that ``check_text`` accepts ``value`` (False may still be accepted: ask ``check_text``)."""
    return len(value) <= limit and value.isprintable()


def check_text(field: str, value: str, limit: int) -> str:
    """Free text: at most ``limit`` characters, no control characters but tab and newline."""
    if len(value) > limit:
        raise InvalidField(field, value, "is too long", f"{limit} characters")
    if not all(c.isprintable() or c in "\t\n" for c in value):
        raise InvalidField(field, value, "contains control characters")
    return value


def check_texts(field: str, values: Sequence[str], count_limit: int, length_limit: int) -> None:
    """A list of free texts (file paths...): at most ``count_limit``, each non-empty and checked by ``check_text``."""
    check_count(field, values, count_limit)
    for value in values:
        if not value:
            raise InvalidField(field, value, "must not be empty")
        check_text(field, value, length_limit)


def check_enum(field: str, value: int, enum: EnumType, *, allow_unspecified: bool = True) -> int:
    """A known value of a protobuf enum (proto3 keeps unknown numbers: they are refused here)."""
    known = enum.values()
    if value not in known or (not allow_unspecified and value == 0):
        names = ", ".join(enum.Name(v) for v in known if allow_unspecified or v != 0)
        raise InvalidField(field, value, "is not a known value", f"one of {names}")
    return value


def check_enums(field: str, values: Sequence[int], enum: EnumType, limit: int) -> list[int]:
    """Known enum values, each once (repeats dropped: the list filters), at most ``limit`` of them."""
    check_count(field, values, limit)
    return list(dict.fromkeys(check_enum(field, v, enum) for v in values))


__all__ = [
    "InvalidField",
    "check_count",
    "check_enum",
    "check_enums",
    "check_id",
    "check_ids",
    "check_name",
    "check_number_or_default",
    "check_range",
    "check_text",
    "check_texts",
    "name_ok",
    "shown",
    "text_ok",
]
