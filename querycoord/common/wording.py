"""How counts and sizes read in what users see: ``1 segment`` / ``2 segments``, ``10 KiB`` / ``1.5 MiB``.

One place for both, so every message of the command line, the status view
and the coordinator's refusals reads alike: a count takes the singular noun
when it is one, and a size keeps its significant digits whatever its scale
(a 0.01 MiB segment is ``10 KiB``, never ``0.0 MiB``).
"""

from __future__ import annotations

import math

KIB = 1 << 10
MIB = 1 << 20

# Nouns whose plural is not the noun plus "s" or "ies" (the ones messages count).
_IRREGULAR = {"copy": "copies", "child": "children", "entry": "entries", "its": "their"}


def plural_of(noun: str) -> str:
    """The plural of ``noun`` (its last word: ``DM channel`` -> ``DM channels``, ``copy`` -> ``copies``)."""
    head, _, last = noun.rpartition(" ")
    if last in _IRREGULAR:
        word = _IRREGULAR[last]
    elif last.endswith("y") and last[-2:-1] not in ("a", "e", "i", "o", "u"):
        word = last[:-1] + "ies"
    elif last.endswith(("s", "x", "ch", "sh")):
        word = last + "es"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and ``noun`` as one reads them: ``1 segment``, ``0 segments``, ``1,234 segments`` (``many``: the
    plural when ``plural_of`` would not know it)."""
    return f"{n:,} {noun if n == 1 else (many or plural_of(noun))}"


def mib(n: int, whole_from: float = 10.0) -> str:
    """Bytes as a size: MiB from 1 MiB (one decimal under ``whole_from`` MiB, whole MiB above), KiB under it
    (one decimal under 10 KiB), bytes under 1 KiB; 0 is ``0 MiB``."""
    if n == 0:
        return "0 MiB"
    if abs(n) < KIB:
        return f"{n} B"
    if abs(n) < MIB:
        v = n / KIB
        return f"{v:.1f} KiB" if abs(v) < 10 else f"{v:,.0f} KiB"
    v = n / MIB
    return f"{v:,.1f} MiB" if abs(v) < whole_from else f"{v:,.0f} MiB"


def mib_exact(n: int) -> str:
    """``mib`` with one decimal at every size in MiB (``1,024.0 MiB``): the coordinator's placement messages,
    whose sums and differences are compared by eye."""
    return mib(n, whole_from=math.inf)


__all__ = ["KIB", "MIB", "mib", "mib_exact", "plural", "plural_of"]
