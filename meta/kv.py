"""Key-value access to etcd under a root path, with etcd's limits enforced before sending.

Every key given to ``MetaKV`` is relative to its root path; ``MetaKV`` never
reads or writes outside it. Multi-key writes are single transactions, and a
transaction that etcd would refuse (more than ``MAX_TXN_OPS`` operations or
more than ``MAX_TXN_BYTES`` bytes) is refused here first with
``RequestTooLarge``, so nothing is half-written. Prefix loads are paged at one
revision so that no response exceeds gRPC's 4 MiB receive limit.

Arbitrary txns (compares, puts, deletes, range deletes and gets together) are
described with ``meta.txn``'s values and sent with ``MetaKV.txn``; writes too
large for one txn are split by ``MetaKV.pack`` and sent by ``write_packed``.
This module is the only one that turns them into etcd requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
from etcd3aio.kv import prefix_range_end

from meta import observe
from meta.client import EtcdClient
from meta.errors import InvalidKey, MetaError, NotLeader, RequestTooLarge
from meta.etcd_pb import PbCompare, RangeRequest, RequestOp, TxnRequest
from meta.fence import Fence
from meta.prefix_snapshot import PrefixSnapshot
from meta.txn import (
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    Batch,
    Compare,
    Delete,
    DeletePrefix,
    Get,
    KeyValue,
    Op,
    Put,
    Target,
    TxnResult,
    Unit,
    absent,
    pack,
    split_puts,
    value_is,
)

DEFAULT_PAGE_SIZE = 1000
# The largest page a prefix load grows to (see ``MetaKV._load_pages``); records of ~100-250 bytes stay well
# under the 16 MiB gRPC receive limit, and a larger answer is halved anyway.
MAX_PAGE_SIZE = 50_000

Value = bytes | str
Saves = Mapping[str, Value] | Iterable[tuple[str, Value]]

# ``Compare.target`` -> (etcd's target, the field of etcd's Compare that holds the expected value).
_TARGETS = {
    Target.VALUE: (PbCompare.VALUE, "value"),
    Target.CREATE: (PbCompare.CREATE, "create_revision"),
    Target.MOD: (PbCompare.MOD, "mod_revision"),
    Target.VERSION: (PbCompare.VERSION, "version"),
}


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

    async def get_kv(self, key: str, *, revision: int = 0) -> KeyValue | None:
        """The key as stored now, or as of ``revision`` (0: now): reads of several keys at one revision agree.

        A Range, not a read-only txn: etcd before 3.5.5 panics when a read-only
        txn is cancelled (etcd-io/etcd#14110).
        """
        resp = await self._range(RangeRequest(key=self.abs_key(key), revision=revision), f"get {key}")
        return self._kv(resp.kvs[0]) if resp.kvs else None  # type: ignore[attr-defined]

    async def range_page(self, prefix: str, *, start: str = "", limit: int,
                         revision: int = 0) -> tuple[list[KeyValue], bool]:
        """Keys under ``prefix`` from ``start`` on (a key >= ``prefix``; empty: from the first), at most
        ``limit``; and whether more follow. One page of a cursor that callers resume after its last key;
        ``revision``: every page as of it (0: now)."""
        first = self.abs_key(start) if start else self.abs_prefix(prefix)
        req = RangeRequest(key=first, range_end=prefix_range_end(self.abs_prefix(prefix)), limit=limit,
                           revision=revision)
        resp = await self._range(req, f"range_page {start or prefix}")
        return [self._kv(raw) for raw in resp.kvs], bool(resp.more)  # type: ignore[attr-defined]

    async def load_key(self, key: str) -> PrefixSnapshot:
        """``key`` alone as a snapshot (empty if absent): what a watch of one key re-reads after a compaction,
        for a user whose role may read that key and nothing beside it."""
        resp = await self._range(RangeRequest(key=self.abs_key(key)), f"load_key {key}")
        return PrefixSnapshot(list(resp.kvs), resp.header.revision, len(self._root_prefix.encode()))  # type: ignore[attr-defined]

    async def first_created(
        self, prefix: str, *, newest: bool = False, max_create_revision: int = 0, operation: str = "first_created"
    ) -> tuple[KeyValue | None, int]:
        """The key under ``prefix`` created first (``newest``: last, at most at ``max_create_revision`` when not
        0), and the revision read at: the queue order of an election."""
        start = self.abs_prefix(prefix)
        req = RangeRequest(key=start, range_end=prefix_range_end(start), limit=1,
                           sort_order=RangeRequest.DESCEND if newest else RangeRequest.ASCEND,
                           sort_target=RangeRequest.CREATE, max_create_revision=max_create_revision)
        resp = await self._range(req, operation)
        return (self._kv(resp.kvs[0]) if resp.kvs else None), resp.header.revision  # type: ignore[attr-defined]

    async def get(self, key: str) -> bytes | None:
        kv = await self.get_kv(key)
        return kv.value if kv is not None else None

    async def revision(self) -> int:
        """The cluster's current revision (a cheap count-only read)."""
        req = RangeRequest(key=self.abs_key("\x00"), count_only=True)
        resp = await self._range(req, "revision")
        return resp.header.revision  # type: ignore[attr-defined]

    async def count_between(self, first: str, last: str, *, revision: int = 0) -> int:
        """How many keys lie from ``first`` to ``last``, both included, as of ``revision`` (0: now); etcd counts
        them in its index, no value is sent."""
        req = RangeRequest(key=self.abs_key(first), range_end=self.abs_key(last) + b"\x00", count_only=True,
                           revision=revision)
        resp = await self._range(req, f"count {first}..{last}")
        return resp.count  # type: ignore[attr-defined]

    async def count_prefix(self, prefix: str) -> int:
        start = self.abs_prefix(prefix)
        req = RangeRequest(key=start, range_end=prefix_range_end(start), count_only=True)
        resp = await self._range(req, f"count {prefix}")
        return resp.count  # type: ignore[attr-defined]

    async def load_prefix(
        self, prefix: str, *, page_size: int = DEFAULT_PAGE_SIZE, keys_only: bool = False, through: str | None = None,
        until: str | None = None, revision: int = 0,
    ) -> PrefixSnapshot:
        """Every key under ``prefix``, read page by page at one revision.

        The first page fixes the revision; later pages read at it, so the
        result is a consistent snapshot however many keys there are. A page
        whose answer exceeds the gRPC receive limit is halved and retried.
        If the revision is compacted mid-way the load starts over.

        ``through``: read every key from ``prefix`` up to and including the keys under ``through`` (several
        neighbouring prefixes as one snapshot at one revision). ``until``: read from ``prefix`` up to, not including,
        the key ``until`` (a credential that may read around a prefix but not it). ``revision``: read as of it (to
        join several loads into one snapshot; a compacted one is then an error).
        """
        start = self.abs_prefix(prefix)
        end = self.abs_key(until) if until is not None else \
            prefix_range_end(self.abs_prefix(through if through is not None else prefix))
        while True:
            try:
                return await self._load_pages(start, end, page_size, keys_only, revision)
            except grpc.aio.AioRpcError as exc:
                if not revision and exc.code() == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (exc.details() or ""):
                    continue
                raise

    async def _load_pages(self, start: bytes, end: bytes, page_size: int, keys_only: bool,
                          revision: int = 0) -> PrefixSnapshot:
        """Pages of ``page_size`` keys at first, each next page twice as large up to ``MAX_PAGE_SIZE``.

        Why growing: etcd answers every page with the count of the whole rest of the range, which it finds by
        walking its index, so n keys in pages of p cost O(n^2 / p) on etcd. Small prefixes stay one small read;
        large ones take few pages. A page whose answer exceeds the gRPC receive limit is halved, and pages stay
        below that size from then on.
        """
        kvs: list[object] = []
        key = start
        limit = page_size
        ceiling = max(page_size, MAX_PAGE_SIZE)
        while True:
            req = RangeRequest(key=key, range_end=end, limit=limit, revision=revision, keys_only=keys_only)
            try:
                resp = await self._range(req, f"load_prefix {self.rel_key(start)}")
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                    limit = max(1, limit // 2)
                    ceiling = limit
                    continue
                raise
            if revision == 0:
                revision = resp.header.revision  # type: ignore[attr-defined]
            kvs.extend(resp.kvs)  # type: ignore[attr-defined]
            if not resp.more or not resp.kvs:  # type: ignore[attr-defined]
                return PrefixSnapshot(kvs, revision, len(self._root_prefix.encode()))
            key = resp.kvs[-1].key + b"\x00"  # type: ignore[attr-defined]
            limit = min(limit * 2, ceiling)

    # ----- writes -------------------------------------------------------------
    def _request(self) -> TxnRequest:
        """An empty write txn; the fenced view adds its guard."""
        return TxnRequest()

    async def _send(self, operation: str, request: TxnRequest, deadline: float | None = None) -> object:
        """Send one txn after checking it against etcd's limits (``RequestTooLarge``: nothing sent)."""
        n_ops = max(len(request.success), len(request.failure), len(request.compare))
        size = request.ByteSize()
        if n_ops > MAX_TXN_OPS or size > MAX_TXN_BYTES:
            raise RequestTooLarge(n_ops, size, MAX_TXN_OPS, MAX_TXN_BYTES)
        return await self.client.call(
            operation, lambda t: self.client.kv.Txn(request, metadata=self.client.metadata, timeout=t),
            deadline=deadline,
        )

    async def _commit(self, operation: str, request: TxnRequest) -> int:
        """Send a write txn; returns the revision it committed at. Overridden by the fenced view."""
        if not request.success:
            return 0
        resp = await self._send(operation, request)
        return resp.header.revision  # type: ignore[attr-defined]

    def _fill(self, request: TxnRequest, saves: Saves, removals: Iterable[str]) -> TxnRequest:
        """Add puts and deletes to ``request`` in place: building each op and then copying it into the
        request doubles the protobuf work of a large txn."""
        items = saves.items() if isinstance(saves, Mapping) else saves
        for key, value in items:
            pb_put = request.success.add().request_put
            pb_put.key = self.abs_key(key)
            pb_put.value = value.encode() if isinstance(value, str) else value
        for key in removals:
            request.success.add().request_delete_range.key = self.abs_key(key)
        return request

    def _fill_ops(self, branch: Any, ops: Iterable[Op]) -> bool:
        """Add ``ops`` to ``branch`` (a TxnRequest's ``success`` or ``failure``) in place, as ``_fill`` does
        and for the same reason (speed); returns whether any op is a get."""
        has_get = False
        root, add = self._root_prefix, branch.add
        for op in ops:
            if type(op) is Put:  # most ops of every big write: abs_key written out (Put is never subclassed)
                key = op.key
                if not key:
                    raise InvalidKey("empty key")
                pb_put = add().request_put
                pb_put.key = (root + key).encode()
                pb_put.value = op.value
                if op.lease:
                    pb_put.lease = op.lease
            elif isinstance(op, Delete):
                branch.add().request_delete_range.key = self.abs_key(op.key)
            elif isinstance(op, DeletePrefix):
                start = self.abs_prefix(op.prefix)
                rng = branch.add().request_delete_range
                rng.key = start
                rng.range_end = prefix_range_end(start)
            elif isinstance(op, Get):
                branch.add().request_range.key = self.abs_key(op.key)
                has_get = True
            else:
                raise TypeError(f"not a meta.txn operation: {op!r}")
        return has_get

    def _fill_compares(self, request: TxnRequest, compares: Iterable[Compare]) -> None:
        for c in compares:
            target, field = _TARGETS[c.target]
            pb = request.compare.add()
            pb.key = self.abs_key(c.key)
            pb.target = target
            setattr(pb, field, c.expected)

    async def _commit_ops(self, operation: str, ops: Sequence[Op]) -> int:
        """Write ``ops`` in one txn (fenced in the fenced view); the revision it committed at."""
        request = self._request()
        self._fill_ops(request.success, ops)
        return await self._commit(operation, request)

    async def save(self, key: str, value: Value, *, lease: int = 0) -> int:
        request = self._request()  # filled in place, as ``_fill``: the sequential-put path of the benchmark
        pb_put = request.success.add().request_put
        pb_put.key = self.abs_key(key)
        pb_put.value = _to_bytes(value)
        if lease:
            pb_put.lease = lease
        return await self._commit(f"save {key}", request)

    async def multi_save(self, saves: Saves) -> int:
        """All keys in one txn, or ``RequestTooLarge`` and nothing written."""
        return await self._commit("multi_save", self._fill(self._request(), saves, ()))

    async def multi_save_and_remove(self, saves: Saves, removals: Iterable[str]) -> int:
        """Saves and removals in one txn (removals applied after the saves)."""
        return await self._commit("multi_save_and_remove", self._fill(self._request(), saves, removals))

    async def remove(self, key: str) -> int:
        return await self._commit_ops(f"remove {key}", (Delete(key),))

    async def multi_remove(self, keys: Iterable[str]) -> int:
        return await self._commit("multi_remove", self._fill(self._request(), (), keys))

    async def remove_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix`` (one range delete, atomic)."""
        return await self._commit_ops(f"remove_prefix {prefix}", (DeletePrefix(prefix),))

    async def compare_and_swap(self, key: str, expected: Value | None, value: Value) -> bool:
        """Write ``value`` only if ``key`` holds ``expected`` (``None``: only if absent).

        Returns whether the swap happened (fenced view: ``NotLeader`` if the fence is gone).
        """
        compare = absent(key) if expected is None else value_is(key, expected)
        result = await self.txn([compare], [Put(key, _to_bytes(value))], operation=f"compare_and_swap {key}")
        return result.succeeded

    # ----- transactions ------------------------------------------------------
    async def txn(
        self,
        compares: Sequence[Compare] = (),
        ops: Sequence[Op] = (),
        *,
        on_failure_ops: Sequence[Op] = (),
        operation: str = "txn",
        deadline: float | None = None,
    ) -> TxnResult:
        """One etcd txn: if every compare holds, ``ops`` run, else ``on_failure_ops``; all at one revision.

        Checked against etcd's limits first (``RequestTooLarge``, nothing
        sent). A failed compare is an ordinary answer (``succeeded=False``),
        not an error. The fenced view adds its fence: there ``NotLeader`` is
        raised when the fence is gone, whatever the caller's compares did.
        ``operation`` names the txn in errors and logs; ``deadline`` bounds its
        retries (default: the client's). A txn without writes
        is a read-only txn, which etcd before 3.5.5 panics on when the caller
        cancels it (etcd-io/etcd#14110): read with ``get_kv`` instead.
        """
        request = self._request()
        self._fill_compares(request, compares)
        gets = self._fill_ops(request.success, ops)
        gets |= self._fill_ops(request.failure, on_failure_ops)
        resp = await self._send(operation, request, deadline)
        succeeded = self._judge(resp)
        branch = ops if succeeded else on_failure_ops
        revision: int = resp.header.revision  # type: ignore[attr-defined]
        return TxnResult(succeeded, revision, self._responses(resp, branch, succeeded, gets))

    async def txn_values(self, keys: Sequence[str], *, on_failure_ops: Sequence[Op] = (),
                         operation: str = "txn") -> dict[str, bytes]:
        """One txn of a get per key (no compare of the caller's: the fenced view raises ``NotLeader`` when its
        fence is gone), answered as ``key -> value`` of the keys that exist. ``txn`` with ``get`` ops reads the
        same, but builds an op and a ``KeyValue`` per key: for a bulk read of records (``meta.get_many``: a lost
        node's 125,000 catalog records at a million segments) that was most of the read's CPU."""
        request = self._request()
        add, root = request.success.add, self._root_prefix
        for key in keys:
            if not key:
                raise InvalidKey("empty key")
            add().request_range.key = (root + key).encode()
        self._fill_ops(request.failure, on_failure_ops)
        resp = await self._send(operation, request)
        if not self._judge(resp):  # no compare of ours: only a fenced view's lost fence fails, and it raised
            raise MetaError(f"{operation}: etcd took the failure branch of a txn without compares")
        out: dict[str, bytes] = {}
        cut = len(root)
        for r in resp.responses:  # type: ignore[attr-defined]
            kvs = r.response_range.kvs
            if kvs:
                kv = kvs[0]
                out[kv.key.decode()[cut:]] = kv.value
        return out

    def _judge(self, resp: object) -> bool:
        """Whether the caller's compares held. The fenced view also tells a lost fence (raised) apart."""
        return bool(resp.succeeded)  # type: ignore[attr-defined]

    def _failure_skip(self) -> int:
        """Failure-branch responses of ``meta``'s own before the caller's (the fenced view's fence read)."""
        return 0

    def _responses(
        self, resp: object, branch: Sequence[Op], succeeded: bool, gets: bool
    ) -> tuple[KeyValue | None, ...]:
        """The branch's answers: gets decoded to ``KeyValue``s (skipped entirely when the txn had no get)."""
        if not gets:
            return (None,) * len(branch)
        skip = 0 if succeeded else self._failure_skip()
        raw = resp.responses[skip:]  # type: ignore[attr-defined]
        out: list[KeyValue | None] = []
        for op, r in zip(branch, raw, strict=True):
            kvs = r.response_range.kvs if type(op) is Get else ()
            out.append(self._kv(kvs[0]) if kvs else None)
        return tuple(out)

    def pack(self, units: Iterable[Unit], last: Unit | None = None, *, atomic: bool = False) -> list[Batch]:
        """``meta.txn.pack`` for this root (its path's bytes counted in every key): txns within etcd's limits."""
        return pack(units, last, atomic=atomic, key_prefix=len(self._root_prefix.encode()))

    def split_puts(self, puts: Sequence[Put]) -> list[tuple[int, int, int]]:
        """``meta.txn.split_puts`` for this root: ranges of ``puts`` that each fit one txn, and their bytes."""
        return split_puts(puts, key_prefix=len(self._root_prefix.encode()))

    async def write_packed(
        self,
        batches: Sequence[Batch],
        *,
        operation: str = "write_packed",
        on_sent: Callable[[Batch, TxnResult], None] | None = None,
    ) -> list[TxnResult]:
        """NOT ATOMIC as a whole: send ``batches`` (from ``pack``) one txn each, strictly in order.

        Each txn starts after the previous one committed, so the last batch
        (which holds the commit-point unit) is written only after every one
        before it. Stops after the first batch whose compares fail (its result,
        ``succeeded=False``, ends the list) or at the first error (raised;
        earlier batches stay written). ``on_sent`` sees each batch's result as
        soon as etcd answered. In the fenced view every txn carries the fence.
        """
        results: list[TxnResult] = []
        for i, batch in enumerate(batches):
            name = operation if len(batches) == 1 else f"{operation} ({i + 1}/{len(batches)})"
            result = await self.txn(batch.compares, batch.ops, operation=name)
            results.append(result)
            if on_sent is not None:
                on_sent(batch, result)
            if not result.succeeded:
                break
        return results

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
        units = [Unit((Put(k, v),)) for k, v in _pairs(saves)]
        units.extend(Unit((Delete(k),)) for k in removals)
        batches = pack(units, max_ops=max_ops, key_prefix=len(self._root_prefix.encode()))
        return len(await self.write_packed(batches, operation="chunked_save_non_atomic"))


class FencedKV(MetaKV):
    """The leader's view of a ``MetaKV``: every write is guarded by the fence.

    Each write is one txn whose compare is ``CreateRevision(leader_key) ==
    fence.revision``. When the compare fails nothing is written and
    ``NotLeader`` is raised: a deposed leader (paused, partitioned, slow)
    cannot change anything once its leader key is gone. Reads are plain.

    ``txn`` puts the fence compare first and a read of the leader key first in
    the failure branch, so a failed txn tells a lost fence (``NotLeader``)
    from a failed compare of the caller's own (``succeeded=False``).
    """

    def __init__(self, base: MetaKV, fence: Fence):
        super().__init__(base.client, base.root)
        self.fence = fence
        self._fence_key = fence.leader_key.encode()
        self._guard = PbCompare(
            result=PbCompare.EQUAL, target=PbCompare.CREATE, key=self._fence_key, create_revision=fence.revision
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
        r = resp.responses[0]  # type: ignore[attr-defined]  # the fence read, first of the failure branch
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
            observe.fenced_write_refused()
            raise self._not_leader(resp)
        self._count(resp.header.revision)  # type: ignore[attr-defined]
        return resp.header.revision  # type: ignore[attr-defined]

    def _judge(self, resp: object) -> bool:
        """Succeeded: counted. Failed: ``NotLeader`` if the fence is gone, else the caller's compare failed."""
        if resp.succeeded:  # type: ignore[attr-defined]
            self._count(resp.header.revision)  # type: ignore[attr-defined]
            return True
        err = self._not_leader(resp)
        if err.current_revision != self.fence.revision:
            self.refused += 1
            observe.fenced_write_refused()
            raise err
        return False

    def _failure_skip(self) -> int:
        return len(self._on_failure)

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


# The limits and the values ``MetaKV``'s methods take and return are re-exported from ``meta.txn``; the rest of
# the transaction API (``put``, ``value_is``, ``pack``...) is imported from ``meta.txn`` itself.
__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "Batch",
    "FencedKV",
    "KeyValue",
    "MetaKV",
    "PrefixSnapshot",
    "TxnResult",
    "Value",
]
