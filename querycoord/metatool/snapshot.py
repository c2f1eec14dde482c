"""One read of everything under a root, at one etcd revision.

``MetaKV.load_prefix`` pages at the revision of its first page, so the keys
of every store are seen as they were at one moment: a check never mistakes a
tree written between two reads for a broken one. Fixes compare against the
mod revisions read here, so a key that changed since is left alone.

``take(kv, skip_under=...)`` leaves out what is under some prefixes (every
piece still read at the one revision): ``verify`` skips the catalog's
segment records and their id index, a million keys each at scale that no
check reads and that are the catalog's by their prefix. Only a key equal to
such a prefix itself, which nobody owns, is still read.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from etcd3aio.kv import prefix_range_end

from meta.election import ELECTION_PREFIX
from meta.errors import MetaAuthError
from meta.kv import KeyValue, MetaKV


@dataclass(frozen=True)
class Snapshot:
    """Every key under the root (relative keys) and the revision they were read at."""

    root: str
    revision: int
    items: dict[str, KeyValue]
    # The keys in order, sorted once: ``under`` finds a prefix's keys by bisection, never by sorting them all.
    keys: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", sorted(self.items))

    def __repr__(self) -> str:  # a million keys: never printed whole (a traceback, a log line)
        return f"Snapshot(root={self.root!r}, revision={self.revision}, keys={len(self.items)})"

    def under(self, prefix: str) -> list[KeyValue]:
        """The keys under ``prefix``, in key order."""
        return list(self._under(prefix))

    def _under(self, prefix: str) -> Iterator[KeyValue]:
        keys = self.keys
        for i in range(bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                return
            yield self.items[keys[i]]

    def get(self, key: str) -> KeyValue | None:
        return self.items.get(key)


def _end(prefix: str) -> str:
    return prefix_range_end(prefix.encode()).decode()


def pieces(skipped: Iterable[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """The ranges ``[start, until)`` (until None: the end of the root) that cover the root without the
    ``skipped`` ranges (``(start, end)``, relative keys)."""
    out: list[tuple[str, str | None]] = []
    at = ""
    for start, end in sorted(skipped):
        if start > at:
            out.append((at, start))
        at = max(at, end)
    out.append((at, None))
    return out


async def take(kv: MetaKV, *, skip_under: Iterable[str] = (), skip_whole: Iterable[str] = ()) -> Snapshot:
    """Read every key under ``kv``'s root, paged, at one revision; but not the keys under ``skip_under`` (a key
    equal to one of these prefixes is read), nor those of ``skip_whole`` (the key equal to the prefix too: a
    caller that reads that range itself, at the snapshot's revision).

    A credential that may read all but the election (the reader: ``meta.ops.etcd_roles``) reads around it, every
    part at one revision; the snapshot then has no election keys."""
    skipped = [(p + "\x00", _end(p)) for p in skip_under] + [(p, _end(p)) for p in skip_whole]
    try:
        return await _read(kv, pieces(skipped))
    except MetaAuthError:
        return await _read(kv, pieces([*skipped, (ELECTION_PREFIX, _end(ELECTION_PREFIX))]))


async def _read(kv: MetaKV, ranges: list[tuple[str, str | None]]) -> Snapshot:
    items: dict[str, KeyValue] = {}
    revision = 0
    for start, until in ranges:
        if until is None:
            got = await kv.load_prefix(start, through="", revision=revision)
        else:
            got = await kv.load_prefix(start, until=until, revision=revision)
        revision = revision or got.revision
        items.update((item.key, item) for item in got.kvs)
    return Snapshot(kv.root, revision, items)


__all__ = ["Snapshot", "pieces", "take"]
