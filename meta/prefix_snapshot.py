"""What a paged prefix load returns: the keys under a prefix as of one etcd revision, kept as etcd's own entries
until a caller asks for them in another form (``meta.kv.MetaKV.load_prefix`` builds it)."""

from __future__ import annotations

from collections.abc import Collection, Iterator

from meta.txn import KeyValue


class PrefixSnapshot:
    """All keys under a prefix as of one etcd revision.

    Built lazily from the raw pages: turning 100,000 protobuf entries into
    ``KeyValue`` objects costs a quarter of a paged load, so it is done only
    for callers that ask for ``kvs``; ``items()`` and ``as_dict()`` skip it.
    """

    __slots__ = ("_kvs", "_raw", "_strip", "revision")

    def __init__(self, raw: list[object], revision: int, strip: int = 0):
        self._raw = raw
        self._strip = strip
        self._kvs: list[KeyValue] | None = None
        self.revision = revision

    @property
    def kvs(self) -> list[KeyValue]:
        if self._kvs is None:
            n = self._strip
            self._kvs = [
                KeyValue(r.key[n:].decode(), r.value, r.create_revision, r.mod_revision, r.version, r.lease)  # type: ignore[attr-defined]
                for r in self._raw
            ]
        return self._kvs

    def __len__(self) -> int:
        return len(self._raw)

    def items(self) -> list[tuple[str, bytes]]:
        n = self._strip
        return [(r.key[n:].decode(), r.value) for r in self._raw]  # type: ignore[attr-defined]

    def iter_items(self) -> Iterator[tuple[str, bytes]]:
        """``items()`` one at a time: a reader that gives the event loop turns as it goes (a follower's full
        read) builds no list of a million pairs in one stretch first."""
        n = self._strip
        for r in self._raw:
            yield r.key[n:].decode(), r.value  # type: ignore[attr-defined]

    def values(self) -> list[bytes]:
        """The values in key order, no key decoded (a reader that needs only the records)."""
        return [r.value for r in self._raw]  # type: ignore[attr-defined]

    def as_dict(self) -> dict[str, bytes]:
        n = self._strip
        return {r.key[n:].decode(): r.value for r in self._raw}  # type: ignore[attr-defined]

    def select(self, keys: Collection[str]) -> dict[str, tuple[bytes, int]]:
        """``key -> (value, create_revision)`` of those of ``keys`` the snapshot holds (a range read for a few
        of its keys: the others are skipped without building anything for them)."""
        n = self._strip
        wanted = {k.encode() for k in keys}
        return {r.key[n:].decode(): (r.value, r.create_revision)  # type: ignore[attr-defined]
                for r in self._raw if r.key[n:] in wanted}  # type: ignore[attr-defined]


__all__ = ["PrefixSnapshot"]
