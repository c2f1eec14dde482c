"""One read of everything under a root, at one etcd revision.

``MetaKV.load_prefix`` pages at the revision of its first page, so the keys
of every store are seen as they were at one moment: a check never mistakes a
tree written between two reads for a broken one. Fixes compare against the
mod revisions read here, so a key that changed since is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def under(self, prefix: str) -> list[KeyValue]:
        """The keys under ``prefix``, in key order."""
        return [kv for key, kv in sorted(self.items.items()) if key.startswith(prefix)]

    def get(self, key: str) -> KeyValue | None:
        return self.items.get(key)


async def take(kv: MetaKV) -> Snapshot:
    """Read every key under ``kv``'s root, paged, at one revision.

    A credential that may read all but the election (the reader: ``meta.ops.etcd_roles``) reads around it, both
    parts at one revision; the snapshot then has no election keys."""
    try:
        snap = await kv.load_prefix("")
    except MetaAuthError:
        before = await kv.load_prefix("", until=ELECTION_PREFIX)
        after = await kv.load_prefix(prefix_range_end(ELECTION_PREFIX.encode()).decode(), through="",
                                     revision=before.revision)
        return Snapshot(kv.root, before.revision, {item.key: item for item in before.kvs + after.kvs})
    return Snapshot(kv.root, snap.revision, {item.key: item for item in snap.kvs})


__all__ = ["Snapshot", "take"]
