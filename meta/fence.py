"""The proof of leadership that guards every write of a leader."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fence:
    """A leader key (absolute etcd key) and the revision at which it was created.

    While the key exists with this create revision the holder is the leader.
    Once the lease behind it expires, or the holder resigns, the key is gone
    (or re-created with another revision) and every write guarded by this
    fence is refused by etcd itself, whatever the holder believes.
    """

    leader_key: str
    revision: int

    def __str__(self) -> str:
        return f"{self.leader_key}@{self.revision}"
