"""What ``verify`` reports: a problem, the keys it is about, and the txn that fixes it.

A fix is guarded by compares on what the check saw (the mod revision of every
key it rewrites or deletes, the absence of the key whose absence is the
problem), so ``repair`` never undoes a change made after the snapshot: such a
fix fails its compares and is reported as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meta.kv import KeyValue
from meta.txn import Compare, Op, delete, modified_at

# The kinds, in the order verify reports them, with what each means.
KINDS: dict[str, str] = {
    "corrupt-task-record": "a task record that does not decode or does not match its key",
    "record-without-request": "a task record whose request key is missing",
    "request-without-record": "a task request key without its record",
    "child-without-trigger": "a child task whose trigger does not exist",
    "committed-trigger-without-children": "a committed (DONE) trigger none of whose children exist",
    "cancel-without-trigger": "a task cancel request whose trigger record does not exist",
    "corrupt-query-meta": "a query meta record that does not decode or does not match its key",
    "query-meta-of-dropped-collection": "query meta of a collection the catalog no longer has",
    "query-meta-of-dropped-partition": "query meta of a partition the catalog no longer has",
    "query-meta-of-unloaded": "segment or channel records of a collection or partition that is not loaded",
    "segment-on-dead-node": "a segment recorded on a query node that has no session",
    "channel-on-dead-node": "a DM channel recorded as watched by a query node that has no session",
    "corrupt-catalog-record": "a catalog record that does not decode (left alone: the catalog is user data)",
    "corrupt-stream-record": "a stream or snode record that does not decode (left alone)",
    "stream-on-dropped-snode": "a stream whose main snode does not exist",
    "stream-name-without-stream": "a stream name key whose stream does not exist",
    "stream-record-without-stream": "a stream's checkpoint or recalculation record whose stream does not exist",
    "unknown-key": "a key under the root that no module owns",
}


@dataclass(frozen=True)
class Fix:
    """One txn: ``ops`` if every compare holds."""

    summary: str
    ops: tuple[Op, ...]
    compares: tuple[Compare, ...] = ()


@dataclass(frozen=True)
class Problem:
    kind: str
    keys: tuple[str, ...]
    detail: str
    fix: Fix | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "keys": list(self.keys), "detail": self.detail,
                "fix": self.fix.summary if self.fix else None}


@dataclass
class Found:
    """Problems found so far, and the keys they already cover (a key gets one fix, from the first check)."""

    problems: list[Problem] = field(default_factory=list)
    claimed: set[str] = field(default_factory=set)

    def add(self, problem: Problem) -> None:
        self.problems.append(problem)
        self.claimed.update(problem.keys)


def delete_fix(summary: str, kvs: list[KeyValue], extra: tuple[Compare, ...] = ()) -> Fix:
    """Delete ``kvs``, each only if unchanged since the snapshot."""
    return Fix(summary, tuple(delete(k.key) for k in kvs), (*extra, *(modified_at(k.key, k.mod_revision) for k in kvs)))


__all__ = ["KINDS", "Fix", "Found", "Problem", "delete_fix"]
