"""Stale writes: proving from etcd's history that a deposed leader wrote nothing.

etcd's history records every change (key, value, revision) but not who made
it, nor the compare of the txn that made it, so a write cannot be tied to a
fence after the fact. Attribution by content does not work either: the new
leader legitimately rewrites and deletes the old leader's task keys (same
ids) and query meta records (same keys).

The drill attributes by *exclusion* instead. In the SIGSTOP round the old
leader L1 is frozen past its TTL, a new leader L2 takes over and changes
state; then the drill alternates short windows:

1. SIGSTOP L2 and every other coordinator; wait until etcd's revision stops
   moving (their in-flight requests have landed): revision ``a``;
2. SIGCONT L1 and let it run for ``window`` seconds (it resumes exactly where
   it was frozen: node answers in hand, fenced writes ready to go);
3. SIGSTOP L1; wait until the revision is stable again: revision ``b``;
4. SIGCONT the others, let them run (L2 keeps its lease alive), repeat.

During (a, b] no other coordinator runs, query nodes write nothing after
registering (keepalives are not revisions) and the drill itself does not
write, so every change in (a, b] is L1's, or etcd's own deletion of a key
whose lease expired. L1 may legitimately register a new session and campaign
again (it is then a standby, not a deposed leader); those writes are under
``session/``, ``election/`` and the server-id counter. Any other change in
(a, b] (query meta, task keys, the task id allocator, the catalog) would be
a write of the deposed leader: a stale write.

The proof is conclusive only if L2 kept leading throughout (its leader key
unchanged, so L1 could not have become leader again in a window) and no node
registered meanwhile; the drill checks both. Leader SIGKILLs need no such
proof: a killed process writes nothing after its death, and a txn it sent
before dying carries a fence that was valid when sent (etcd applies it in
order, before the lease expiry that enables the takeover).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from meta.election import ELECTION_PREFIX
from meta.kv import MetaKV
from meta.session import SERVER_ID_KEY, SESSION_PREFIX
from meta.watch import Resync, WatchBatch, watch_prefix

COORDINATION_PREFIXES = (SESSION_PREFIX, ELECTION_PREFIX)


def is_coordination_key(key: str) -> bool:
    """Keys any process may write without leading: sessions, election candidates, the server-id counter."""
    return key.startswith(COORDINATION_PREFIXES) or key == SERVER_ID_KEY


@dataclass(frozen=True)
class Change:
    revision: int
    kind: str  # "put" / "delete"
    key: str


@dataclass
class Window:
    """A revision range (start, end] during which only the deposed leader ran."""

    start: int
    end: int
    changes: list[Change] = field(default_factory=list)

    @property
    def stale(self) -> list[Change]:
        return [c for c in self.changes if not is_coordination_key(c.key)]


@dataclass
class PauseReport:
    """The outcome of one SIGSTOP round."""

    old_leader: str = ""
    new_leader: str = ""
    takeover_s: float | None = None
    windows: list[Window] = field(default_factory=list)
    conclusive: bool = True
    notes: list[str] = field(default_factory=list)
    refused_in_log: int = 0  # fenced writes / node calls of the old leader refused, from its log

    @property
    def stale_writes(self) -> int:
        return sum(len(w.stale) for w in self.windows)

    @property
    def window_changes(self) -> int:
        return sum(len(w.changes) for w in self.windows)


async def stable_revision(kv: MetaKV, settle: float = 0.15, timeout: float = 5.0) -> int:
    """etcd's revision once it has not moved for ``settle`` seconds (in-flight requests have landed)."""
    deadline = time.monotonic() + timeout
    last = await kv.revision()
    since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.03)
        now = await kv.revision()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle:
            return now
    return last


async def changes_between(kv: MetaKV, start: int, end: int, timeout: float = 15.0) -> list[Change]:
    """Every change under the root path with revision in (start, end], from etcd's history."""
    if end <= start:
        return []
    out: list[Change] = []
    async with asyncio.timeout(timeout):
        async for item in watch_prefix(kv, "", start + 1, reconnect_deadline=timeout):
            if isinstance(item, Resync):
                raise RuntimeError(f"etcd compacted its history past revision {start}; cannot attribute writes")
            assert isinstance(item, WatchBatch)
            for ev in item.events:
                if ev.mod_revision <= end:
                    out.append(Change(ev.mod_revision, ev.type.value, ev.key))
            if item.revision >= end or any(ev.mod_revision >= end for ev in item.events):
                break
    return out


_REFUSAL_MARKS = ("not leader: fence", "stale coordinator", "STALE_LEADER", "leadership lost")


def count_refusals(log_text: str) -> int:
    """Lines of a coordinator's log that show it was refused as a deposed leader (evidence the fence worked)."""
    return sum(any(m in line for m in _REFUSAL_MARKS) for line in log_text.splitlines())
