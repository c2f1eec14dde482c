"""What the tables of the failover and chaos drills share: the faults injected and the client calls answered."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


@dataclass
class FaultRecord:
    t: float
    what: str
    note: str = ""


class Call(Protocol):
    """What the table reads of a client call (``CallRecord``, the chaos drill's ``ChaosCall``)."""

    method: str
    outcome: str
    code: str
    reason: str

    @property
    def elapsed(self) -> float: ...


C = TypeVar("C", bound=Call)


def render_activity(faults: list[FaultRecord], calls: Sequence[C], *, row: Callable[[C], str], width: int,
                    example: Callable[[C], str], slow: Callable[[C], str]) -> list[str]:
    """The faults and the client calls of a drill's table: the answers per ``row`` (``width`` wide), one
    ``example`` of each failure, the three slowest calls."""
    lines: list[str] = []
    if faults:
        lines += ["", "faults"]
        lines += [f"  {f.t:>7.1f}  {f.what}{'; ' + f.note if f.note else ''}" for f in faults]
    by: dict[str, Counter[str]] = {}
    for c in calls:
        by.setdefault(row(c), Counter())[c.code if c.outcome in ("success", "error") else c.outcome.upper()] += 1
    lines += ["", f"client calls: {len(calls)}"]
    for name, counts in sorted(by.items()):
        lines.append(f"  {name:<{width}} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    reasons: dict[str, str] = {}
    for c in calls:
        if c.outcome != "success":
            reasons.setdefault(f"{c.method} {c.code or c.outcome.upper()}", f"{example(c)}: {c.reason[:150]}")
    for what, text in sorted(reasons.items()):
        lines.append(f"    e.g. {what}: {text}")
    slowest = sorted(calls, key=lambda c: -c.elapsed)[:3]
    if slowest:
        lines.append("  slowest: " + "; ".join(f"{slow(c)} {c.elapsed:.1f}s" for c in slowest))
    return lines
