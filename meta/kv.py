"""Key-value access to etcd under a root path, with etcd's limits enforced before sending.

Every key given to ``MetaKV`` is relative to its root path; ``MetaKV`` never
reads or writes outside it. Multi-key writes are single transactions, and a
transaction that etcd would refuse (more than ``MAX_TXN_OPS`` operations or
more than ``MAX_TXN_BYTES`` bytes) is refused here first with
``RequestTooLarge``, so nothing is half-written. Prefix loads are paged at one
revision so that no response exceeds gRPC's 4 MiB receive limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import grpc
from etcd3aio._protobuf import Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest
from etcd3aio.kv import prefix_range_end

from meta.client import EtcdClient
from meta.errors import InvalidKey, NotLeader, RequestTooLarge
from meta.fence import Fence

MAX_TXN_OPS = 128
MAX_TXN_BYTES = 1536 * 1024  # etcd's default --max-request-bytes (1.5 MiB)
DEFAULT_PAGE_SIZE = 1000

Value = bytes | str
Saves = Mapping[str, Value] | Iterable[tuple[str, Value]]


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as stored: ``key`` is relative to the root path."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


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

    def as_dict(self) -> dict[str, bytes]:
        n = self._strip
        return {r.key[n:].decode(): r.value for r in self._raw}  # type: ignore[attr-defined]


def _to_bytes(v: Value) -> bytes:
    return v.encode() if isinstance(v, str) else v


def _pairs(saves: Saves) -> list[tuple[str, bytes]]:
    items = saves.items() if isinstance(saves, Mapping) else saves
    return [(k, _to_bytes(v)) for k, v in items]


class MetaKV:
    """etcd key-value access under ``root`` (see module docstring)."""

    def __init__(self, client: EtcdClient, root: str):
        root = root.strip("/")
        if not root:
            raise InvalidKey("the root path must not be empty (several deployments may share one etcd)")
        self.client = client
        self.root = root
        self._root_prefix = root + "/"

    # ----- key mapping -------------------------------------------------------
    def abs_key(self, key: str) -> bytes:
        """The etcd key of ``key``; refuses empty keys so nothing lands on the root itself."""
        if not key:
            raise InvalidKey("empty key")
        return (self._root_prefix + key).encode()

    def abs_prefix(self, prefix: str) -> bytes:
        return (self._root_prefix + prefix).encode()

    def rel_key(self, abs_key: bytes) -> str:
        return abs_key.decode()[len(self._root_prefix) :]

    def _kv(self, raw: object) -> KeyValue:
        return KeyValue(
            key=self.rel_key(raw.key),  # type: ignore[attr-defined]
            value=raw.value,  # type: ignore[attr-defined]
            create_revision=raw.create_revision,  # type: ignore[attr-defined]
            mod_revision=raw.mod_revision,  # type: ignore[attr-defined]
            version=raw.version,  # type: ignore[attr-defined]
            lease=raw.lease,  # type: ignore[attr-defined]
        )

    def fenced(self, fence: Fence) -> FencedKV:
        """A view whose every write succeeds only while ``fence`` holds (see ``FencedKV``)."""
        return FencedKV(self, fence)

    # ----- reads --------------------------------------------------------------
    async def _range(self, request: RangeRequest, operation: str) -> object:
        return await self.client.call(
            operation, lambda t: self.client.kv.Range(request, metadata=self.client.metadata, timeout=t)
        )

    async def get_kv(self, key: str) -> KeyValue | None:
        resp = await self._range(RangeRequest(key=self.abs_key(key)), f"get {key}")
        return self._kv(resp.kvs[0]) if resp.kvs else None  # type: ignore[attr-defined]

    async def get(self, key: str) -> bytes | None:
        kv = await self.get_kv(key)
        return kv.value if kv is not None else None

    async def revision(self) -> int:
        """The cluster's current revision (a cheap count-only read)."""
        req = RangeRequest(key=self.abs_key("\x00"), count_only=True)
        resp = await self._range(req, "revision")
        return resp.header.revision  # type: ignore[attr-defined]

    async def count_prefix(self, prefix: str) -> int:
        start = self.abs_prefix(prefix)
        req = RangeRequest(key=start, range_end=prefix_range_end(start), count_only=True)
        resp = await self._range(req, f"count {prefix}")
        return resp.count  # type: ignore[attr-defined]

    async def load_prefix(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE, keys_only: bool = False
    ) -> PrefixSnapshot:
        """Every key under ``prefix``, read page by page at one revision.

        The first page fixes the revision; later pages read at it, so the
        result is a consistent snapshot however many keys there are. A page
        whose answer exceeds the gRPC receive limit is halved and retried.
        If the revision is compacted mid-way the load starts over.
        """
        start = self.abs_prefix(prefix)
        end = prefix_range_end(start)
        while True:
            try:
                return await self._load_pages(start, end, page_size, keys_only)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (exc.details() or ""):
                    continue
                raise

    async def _load_pages(self, start: bytes, end: bytes, page_size: int, keys_only: bool) -> PrefixSnapshot:
        kvs: list[object] = []
        revision = 0
        key = start
        limit = page_size
        while True:
            req = RangeRequest(key=key, range_end=end, limit=limit, revision=revision, keys_only=keys_only)
            try:
                resp = await self._range(req, f"load_prefix {self.rel_key(start)}")
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                    limit = max(1, limit // 2)
                    continue
                raise
            if revision == 0:
                revision = resp.header.revision  # type: ignore[attr-defined]
            kvs.extend(resp.kvs)  # type: ignore[attr-defined]
            if not resp.more or not resp.kvs:  # type: ignore[attr-defined]
                return PrefixSnapshot(kvs, revision, len(self._root_prefix.encode()))
            key = resp.kvs[-1].key + b"\x00"  # type: ignore[attr-defined]

    # ----- writes -------------------------------------------------------------
    def _put_op(self, key: str, value: Value, lease: int = 0) -> RequestOp:
        return RequestOp(request_put=PutRequest(key=self.abs_key(key), value=_to_bytes(value), lease=lease))

    def _delete_op(self, key: str) -> RequestOp:
        return RequestOp(request_delete_range=DeleteRangeRequest(key=self.abs_key(key)))

    def _delete_prefix_op(self, prefix: str) -> RequestOp:
        start = self.abs_prefix(prefix)
        return RequestOp(request_delete_range=DeleteRangeRequest(key=start, range_end=prefix_range_end(start)))

    def _build_ops(self, saves: Saves, removals: Iterable[str]) -> list[RequestOp]:
        ops = [self._put_op(k, v) for k, v in _pairs(saves)]
        ops.extend(self._delete_op(k) for k in removals)
        return ops

    async def _txn(
        self,
        operation: str,
        compare: Sequence[Compare],
        success: Sequence[RequestOp],
        failure: Sequence[RequestOp] = (),
    ) -> object:
        """Send one txn after checking it against etcd's limits."""
        return await self._send(
            operation, TxnRequest(compare=list(compare), success=list(success), failure=list(failure))
        )

    async def _send(self, operation: str, request: TxnRequest) -> object:
        n_ops = max(len(request.success), len(request.failure), len(request.compare))
        size = request.ByteSize()
        if n_ops > MAX_TXN_OPS or size > MAX_TXN_BYTES:
            raise RequestTooLarge(n_ops, size, MAX_TXN_OPS, MAX_TXN_BYTES)
        return await self.client.call(
            operation, lambda t: self.client.kv.Txn(request, metadata=self.client.metadata, timeout=t)
        )

    def _request(self) -> TxnRequest:
        """An empty write txn; the fenced view adds its guard."""
        return TxnRequest()

    async def _commit(self, operation: str, request: TxnRequest) -> int:
        """Send a write txn; returns the revision it committed at. Overridden by the fenced view."""
        if not request.success:
            return 0
        resp = await self._send(operation, request)
        return resp.header.revision  # type: ignore[attr-defined]

    async def _write(self, operation: str, ops: Sequence[RequestOp]) -> int:
        """Write prebuilt ops in one txn (fenced in the fenced view)."""
        request = self._request()
        request.success.extend(ops)
        return await self._commit(operation, request)

    def _fill(self, request: TxnRequest, saves: Saves, removals: Iterable[str]) -> TxnRequest:
        """Add puts and deletes to ``request`` in place: building each op and copying it in cost a
        tenth of a 128-op txn's client time (scripts/bench_meta.py)."""
        items = saves.items() if isinstance(saves, Mapping) else saves
        for key, value in items:
            put = request.success.add().request_put
            put.key = self.abs_key(key)
            put.value = value.encode() if isinstance(value, str) else value
        for key in removals:
            request.success.add().request_delete_range.key = self.abs_key(key)
        return request

    async def save(self, key: str, value: Value, *, lease: int = 0) -> int:
        return await self._write(f"save {key}", [self._put_op(key, value, lease)])

    async def multi_save(self, saves: Saves) -> int:
        """All keys in one txn, or ``RequestTooLarge`` and nothing written."""
        return await self._commit("multi_save", self._fill(self._request(), saves, ()))

    async def multi_save_and_remove(self, saves: Saves, removals: Iterable[str]) -> int:
        """Saves and removals in one txn (removals applied after the saves)."""
        return await self._commit("multi_save_and_remove", self._fill(self._request(), saves, removals))

    async def remove(self, key: str) -> int:
        return await self._write(f"remove {key}", [self._delete_op(key)])

    async def multi_remove(self, keys: Iterable[str]) -> int:
        return await self._commit("multi_remove", self._fill(self._request(), (), keys))

    async def remove_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` (one range delete, atomic)."""
        return await self._write(f"remove_prefix {prefix}", [self._delete_prefix_op(prefix)])

    async def compare_and_swap(self, key: str, expected: Value | None, value: Value) -> bool:
        """Write ``value`` only if ``key`` holds ``expected`` (``None``: only if absent).

        Returns whether the swap happened.
        """
        ok, _ = await self._cas(key, expected, [self._put_op(key, value)])
        return ok

    def _cas_compare(self, key: str, expected: Value | None) -> Compare:
        if expected is None:
            return Compare(result=Compare.EQUAL, target=Compare.CREATE, key=self.abs_key(key), create_revision=0)
        return Compare(result=Compare.EQUAL, target=Compare.VALUE, key=self.abs_key(key), value=_to_bytes(expected))

    async def _cas(self, key: str, expected: Value | None, ops: Sequence[RequestOp]) -> tuple[bool, int]:
        resp = await self._txn(f"compare_and_swap {key}", [self._cas_compare(key, expected)], ops)
        return resp.succeeded, resp.header.revision  # type: ignore[attr-defined]

    async def chunked_save_non_atomic(
        self, saves: Saves, removals: Iterable[str] = (), *, max_ops: int = MAX_TXN_OPS
    ) -> int:
        """NOT ATOMIC: write a set too large for one txn as several txns, in order.

        Each chunk is atomic on its own, but a crash or error between chunks
        leaves the earlier chunks written and the later ones not. Use it only
        for data whose readers tolerate a partial set (caches, bulk imports
        that are re-run), never for state whose keys must change together.
        Returns the number of txns sent.
        """
        if not 1 <= max_ops <= MAX_TXN_OPS:
            raise ValueError(f"max_ops must be in 1..{MAX_TXN_OPS}")
        ops = self._build_ops(saves, removals)
        chunk: list[RequestOp] = []
        size = 0
        sent = 0
        for op in ops:
            op_size = op.ByteSize() + 4
            if op_size > MAX_TXN_BYTES - 64:
                raise RequestTooLarge(1, op_size, MAX_TXN_OPS, MAX_TXN_BYTES)
            if chunk and (len(chunk) >= max_ops or size + op_size > MAX_TXN_BYTES - 64):
                await self._write("chunked_save_non_atomic", chunk)
                sent += 1
                chunk, size = [], 0
            chunk.append(op)
            size += op_size
        if chunk:
            await self._write("chunked_save_non_atomic", chunk)
            sent += 1
        return sent


class FencedKV(MetaKV):
    """The leader's view of a ``MetaKV``: every write is guarded by the fence.

    Each write is one txn whose compare is ``CreateRevision(leader_key) ==
    fence.revision``. When the compare fails nothing is written and
    ``NotLeader`` is raised: a deposed leader (paused, partitioned, slow)
    cannot change anything once its leader key is gone. Reads are plain.
    """

    def __init__(self, base: MetaKV, fence: Fence):
        super().__init__(base.client, base.root)
        self.fence = fence
        self._fence_key = fence.leader_key.encode()
        self._guard = Compare(
            result=Compare.EQUAL, target=Compare.CREATE, key=self._fence_key, create_revision=fence.revision
        )
        self._on_failure = [RequestOp(request_range=RangeRequest(key=self._fence_key))]
        # What etcd accepted and refused through this fence: the revision etcd
        # returns for each committed txn is the proof (drills compare the last
        # one with the revision at which the leader key was deleted).
        self.writes = 0
        self.refused = 0
        self.last_write_revision = 0

    def fenced(self, fence: Fence) -> FencedKV:
        raise TypeError("this view is already fenced")

    def _not_leader(self, resp: object) -> NotLeader:
        current = 0
        for r in resp.responses:  # type: ignore[attr-defined]
            if r.HasField("response_range") and r.response_range.kvs:
                current = r.response_range.kvs[0].create_revision
        return NotLeader(self.fence.leader_key, self.fence.revision, current)

    def _request(self) -> TxnRequest:
        return TxnRequest(compare=[self._guard], failure=self._on_failure)

    async def _commit(self, operation: str, request: TxnRequest) -> int:
        if not request.success:
            return 0
        resp = await self._send(operation, request)
        if not resp.succeeded:  # type: ignore[attr-defined]
            self.refused += 1
            raise self._not_leader(resp)
        self._count(resp.header.revision)  # type: ignore[attr-defined]
        return resp.header.revision  # type: ignore[attr-defined]

    def _count(self, revision: int) -> None:
        self.writes += 1
        self.last_write_revision = max(self.last_write_revision, revision)

    async def check(self) -> None:
        """Raise ``NotLeader`` unless the fence still holds (a read, no write).

        A Range, not a read-only txn: etcd before 3.5.5 panics when a read-only
        txn is cancelled (etcd-io/etcd#14110).
        """
        resp = await self._range(RangeRequest(key=self._fence_key), "fence check")
        current = resp.kvs[0].create_revision if resp.kvs else 0  # type: ignore[attr-defined]
        if current != self.fence.revision:
            raise NotLeader(self.fence.leader_key, self.fence.revision, current)

    async def _cas(self, key: str, expected: Value | None, ops: Sequence[RequestOp]) -> tuple[bool, int]:
        """Fenced CAS: the failure branch reads the fence key to tell a lost fence from a lost swap."""
        resp = await self._txn(
            f"fenced compare_and_swap {key}", [self._guard, self._cas_compare(key, expected)], ops, self._on_failure
        )
        if resp.succeeded:  # type: ignore[attr-defined]
            self._count(resp.header.revision)  # type: ignore[attr-defined]
            return True, resp.header.revision  # type: ignore[attr-defined]
        err = self._not_leader(resp)
        if err.current_revision != self.fence.revision:
            self.refused += 1
            raise err
        return False, resp.header.revision  # type: ignore[attr-defined]


__all__ = [
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "FencedKV",
    "KeyValue",
    "MetaKV",
    "PrefixSnapshot",
]
