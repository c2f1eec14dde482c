"""The public vocabulary of etcd transactions: compares, operations, results, and the packer.

Callers outside ``meta`` describe a txn with these plain values (keys relative
to the ``MetaKV`` root, as everywhere in ``meta``) and send it with
``MetaKV.txn``; only ``meta/kv.py`` turns them into etcd protobufs. That keeps
etcd (and its client library) behind ``meta``, and lets a txn mix what the
convenience methods cannot: compares, puts, key deletes, range deletes, gets.

``pack`` is the one place that splits "many ops" into txns within etcd's
limits (``MAX_TXN_OPS`` operations, ``MAX_TXN_BYTES`` bytes): callers group
ops that must share a txn into a ``Unit``, name the commit-point unit
``last``, and get ``Batch``es to send in order (``MetaKV.write_packed``). A
unit that cannot fit in one txn is refused with ``RequestTooLarge`` before
anything is sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, NamedTuple

from meta.errors import InvalidKey, RequestTooLarge

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops (compares, success ops and failure ops each)
MAX_TXN_BYTES = 1536 * 1024  # etcd's default --max-request-bytes (1.5 MiB)
#: Bytes ``pack`` leaves free in every txn: the fence compare and failure read of a ``FencedKV``, the
#: txn envelope, and the slack of the size estimate (a few hundred bytes at most; 16 KiB is ample).
TXN_HEADROOM = 16 * 1024
TXN_BYTE_BUDGET = MAX_TXN_BYTES - TXN_HEADROOM
#: Compares ``pack`` puts in one txn: one slot stays free for the fence compare of a ``FencedKV``.
MAX_PACKED_COMPARES = MAX_TXN_OPS - 1

# Upper bounds of the protobuf framing around an op or compare in a TxnRequest: per length-delimited
# field one tag byte and a varint length of at most 3 bytes (every field of a sendable txn is < 2 MiB).
_FIELD = 4
_PUT_FRAMING = 4 * _FIELD + 11  # RequestOp in the txn, PutRequest in it, key, value; lease <= 11 bytes
_DELETE_FRAMING = 3 * _FIELD  # RequestOp, DeleteRangeRequest, key
_PREFIX_FRAMING = 4 * _FIELD  # ... and range_end (as long as the key)
_GET_FRAMING = 3 * _FIELD  # RequestOp, RangeRequest, key
_COMPARE_FRAMING = 3 * _FIELD + 2 + 11  # Compare in the txn, key, value; target enum; an int64 target


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as stored: ``key`` is relative to the root path."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


# ----- compares -------------------------------------------------------------------------------------------------------
class Target(Enum):
    """What a ``Compare`` looks at (always compared for equality)."""

    VALUE = "value"
    CREATE = "create_revision"
    MOD = "mod_revision"
    VERSION = "version"


@dataclass(frozen=True, slots=True)
class Compare:
    """``<target of key> == expected``; a txn's ops run only if all its compares hold. Hashable, so
    ``pack`` can add a compare shared by several units once per txn."""

    key: str
    target: Target
    expected: bytes | int

    @property
    def size(self) -> int:
        """Upper bound of its bytes in a txn, without the root path."""
        extra = len(self.expected) if isinstance(self.expected, bytes) else 0
        return _key_len(self.key) + extra + _COMPARE_FRAMING


def value_is(key: str, value: bytes | str) -> Compare:
    """The key exists and holds ``value``."""
    return Compare(key, Target.VALUE, _to_bytes(value))


def created_at(key: str, revision: int) -> Compare:
    """The key was created at ``revision`` (this very key still exists, not a re-created one)."""
    return Compare(key, Target.CREATE, revision)


def absent(key: str) -> Compare:
    """The key does not exist (its create revision is 0)."""
    return Compare(key, Target.CREATE, 0)


def modified_at(key: str, revision: int) -> Compare:
    """The key was last written at ``revision`` (0: it does not exist): nobody wrote it since it was read."""
    return Compare(key, Target.MOD, revision)


def version_is(key: str, version: int) -> Compare:
    """The key has been written ``version`` times since its creation (0: it does not exist)."""
    return Compare(key, Target.VERSION, version)


# ----- operations -----------------------------------------------------------------------------------------------------
class Put(NamedTuple):
    """Write ``value`` at ``key`` (with ``lease``, when not 0).

    A named tuple, not a frozen dataclass as the other ops: as immutable, and made in a third of the time (a
    frozen dataclass sets each field through ``object.__setattr__``), for one Put per record of every save.
    """

    key: str
    value: bytes
    lease: int = 0

    @property
    def size(self) -> int:
        return _key_len(self.key) + len(self.value) + _PUT_FRAMING


@dataclass(frozen=True, slots=True)
class _OneKey:
    """An op on one key whose request costs the key plus a fixed framing (``_framing`` of each kind)."""

    key: str
    _framing: ClassVar[int]

    @property
    def size(self) -> int:
        return _key_len(self.key) + self._framing


@dataclass(frozen=True, slots=True)
class Delete(_OneKey):
    _framing = _DELETE_FRAMING


@dataclass(frozen=True, slots=True)
class DeletePrefix:
    """Every key under ``prefix`` (one range delete, however many keys)."""

    prefix: str

    @property
    def size(self) -> int:
        return 2 * len(self.prefix.encode()) + _PREFIX_FRAMING


@dataclass(frozen=True, slots=True)
class Get(_OneKey):
    """Read one key inside the txn, at the txn's revision: its answer is in ``TxnResult.responses``."""

    _framing = _GET_FRAMING


Op = Put | Delete | DeletePrefix | Get


def put(key: str, value: bytes | str, lease: int = 0) -> Put:
    return Put(key, _to_bytes(value), lease)


def delete(key: str) -> Delete:
    return Delete(key)


def delete_prefix(prefix: str) -> DeletePrefix:
    return DeletePrefix(prefix)


def get(key: str) -> Get:
    return Get(key)


def _to_bytes(v: bytes | str) -> bytes:
    return v.encode() if isinstance(v, str) else v


def _key_len(key: str) -> int:
    """Bytes of a key; an empty key is refused here, while packing, so it never fails half-way through a write."""
    if not key:
        raise InvalidKey("empty key")
    # An ASCII key (every key of ours) is as many bytes as characters, known without encoding it: this runs once
    # per record of every save, 100,000s in a big load.
    return len(key) if key.isascii() else len(key.encode())


def _key_count(op: Op) -> int:
    """Keys of ``op`` that carry the root path (a range delete carries it in its key and its range end)."""
    return 2 if type(op) is DeletePrefix else 1


# ----- results --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TxnResult:
    """What etcd answered to a txn.

    ``succeeded``: whether the caller's compares held (so the ops ran, not the
    ``on_failure_ops``). ``revision``: the store revision after the txn (the
    txn's own revision if it wrote). ``responses``: one entry per op of the
    branch that ran, in order: a ``Get``'s key as a ``KeyValue`` (``None`` if
    absent), ``None`` for every other op.
    """

    succeeded: bool
    revision: int
    responses: tuple[KeyValue | None, ...] = ()


# ----- packing --------------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Unit:
    """Ops that must share one txn, with the compares that guard them.

    ``shared``: compares that guard the whole txn rather than this unit (a
    collection that must still exist); each is added once to every txn that
    holds a unit needing it. ``payload``: anything the caller wants back from
    the batch (what to apply to memory once the txn committed, ids written).
    """

    ops: Sequence[Op]
    compares: Sequence[Compare] = ()
    shared: Sequence[Compare] = ()
    payload: Any = None
    #: Bytes of ``ops`` in a txn (key prefix included) when the caller measured them already (``split_puts``);
    #: -1: ``pack`` measures them (a large load then need not measure every put twice).
    ops_size: int = -1


@dataclass(slots=True)
class Batch:
    """One txn's worth of units, as ``pack`` made it: send ``compares`` and ``ops`` together."""

    units: list[Unit] = field(default_factory=list)
    compares: list[Compare] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    size: int = 0
    shared: set[Compare] = field(default_factory=set)  # the units' shared compares already among ``compares``

    @property
    def payloads(self) -> list[Any]:
        return [u.payload for u in self.units]


@dataclass(frozen=True, slots=True)
class _Limits:
    max_ops: int
    max_compares: int
    max_bytes: int
    key_prefix: int


def pack(
    units: Iterable[Unit],
    last: Unit | None = None,
    *,
    atomic: bool = False,
    key_prefix: int = 0,
    max_ops: int = MAX_TXN_OPS,
    max_compares: int = MAX_PACKED_COMPARES,
    max_bytes: int = TXN_BYTE_BUDGET,
) -> list[Batch]:
    """Pack ``units`` in order, then ``last`` (the commit point), into as few txns as etcd's limits allow.

    Greedy and order-preserving: a unit never straddles two txns, and ``last``
    is always in the final batch, so sending the batches in order writes the
    commit point only after everything before it. ``atomic``: everything in one
    batch or ``RequestTooLarge``. ``key_prefix``: bytes the root path adds to
    every key (``MetaKV.pack`` passes its own). Nothing is returned before
    every unit has been placed, so a unit too large for one txn raises
    ``RequestTooLarge`` before anything is sent. No units: no batches.
    """
    limits = _Limits(max_ops, max_compares, max_bytes, key_prefix)
    todo = [*units, *([last] if last is not None else [])]
    batches: list[Batch] = []
    current = Batch()
    for unit in todo:
        size = _unit_size(unit, key_prefix)
        shared = _new_shared(current, unit, key_prefix)
        if current.units and not _fits(current, unit, size, shared, limits):
            batches.append(current)
            current = Batch()
            shared = _new_shared(current, unit, key_prefix)
        if not current.units and not _fits(current, unit, size, shared, limits):  # too large even alone
            raise _too_large(len(unit.ops), len(unit.compares) + len(shared[0]), size + shared[1], limits)
        _add(current, unit, size, shared)
    if current.units:
        batches.append(current)
    if atomic and len(batches) > 1:
        n_ops = sum(len(b.ops) for b in batches)
        raise _too_large(n_ops, sum(len(b.compares) for b in batches), sum(b.size for b in batches), limits)
    return batches


def split_puts(
    puts: Sequence[Put], *, key_prefix: int = 0, max_ops: int = MAX_TXN_OPS, max_bytes: int = TXN_BYTE_BUDGET
) -> list[tuple[int, int, int]]:
    """Ranges ``[start, end)`` of ``puts`` that each fit one txn, with their bytes, greedy and in order: what
    ``pack`` makes of one unit per put, without building a unit per put.

    Why: a big load saves 100,000s of independent records, and a unit per record would make packing a large
    share of the coordinator's time per segment. A caller turns each range into one unit whose ``ops_size`` is the bytes
    given here (see ``TxnWriter.independent_puts``). A put too large even alone raises ``RequestTooLarge``
    before anything is sent, as ``pack`` does.
    """
    ranges: list[tuple[int, int, int]] = []
    start = size = 0
    for i, put in enumerate(puts):
        s = put.size + key_prefix
        if s > max_bytes:
            raise _too_large(1, 0, s, _Limits(max_ops, MAX_PACKED_COMPARES, max_bytes, key_prefix))
        if i > start and (i - start >= max_ops or size + s > max_bytes):
            ranges.append((start, i, size))
            start, size = i, 0
        size += s
    if start < len(puts):
        ranges.append((start, len(puts), size))
    return ranges


def _unit_size(unit: Unit, key_prefix: int) -> int:
    """Bytes of a unit's ops and own compares in a txn (its shared compares are counted per batch)."""
    size = unit.ops_size
    if size < 0:
        size = 0
        for op in unit.ops:
            size += op.size + key_prefix * _key_count(op)
    for c in unit.compares:
        size += c.size + key_prefix
    return size


_Shared = tuple[Sequence[Compare], int]
_NO_SHARED: _Shared = ((), 0)


def _new_shared(batch: Batch, unit: Unit, key_prefix: int) -> _Shared:
    """The unit's shared compares that ``batch`` lacks yet, and their bytes."""
    if not unit.shared:
        return _NO_SHARED  # the common case, kept cheap: packing 100,000 records walks this per record
    new = [c for c in dict.fromkeys(unit.shared) if c not in batch.shared]
    return new, sum(c.size + key_prefix for c in new)


def _fits(batch: Batch, unit: Unit, size: int, shared: _Shared, limits: _Limits) -> bool:
    return (
        len(batch.ops) + len(unit.ops) <= limits.max_ops
        and len(batch.compares) + len(unit.compares) + len(shared[0]) <= limits.max_compares
        and batch.size + size + shared[1] <= limits.max_bytes
    )


def _add(batch: Batch, unit: Unit, size: int, shared: _Shared) -> None:
    new, shared_size = shared
    if new:
        batch.shared.update(new)
        batch.compares.extend(new)
    batch.units.append(unit)
    batch.compares.extend(unit.compares)
    batch.ops.extend(unit.ops)
    batch.size += size + shared_size


def _too_large(n_ops: int, n_compares: int, size: int, limits: _Limits) -> RequestTooLarge:
    """The error of a txn that cannot be sent; the size shown includes the headroom kept for the fence."""
    return RequestTooLarge(max(n_ops, n_compares), size + MAX_TXN_BYTES - limits.max_bytes, MAX_TXN_OPS, MAX_TXN_BYTES)


__all__ = [
    "MAX_PACKED_COMPARES",
    "MAX_TXN_BYTES",
    "MAX_TXN_OPS",
    "TXN_BYTE_BUDGET",
    "TXN_HEADROOM",
    "Batch",
    "Compare",
    "Delete",
    "DeletePrefix",
    "Get",
    "KeyValue",
    "Op",
    "Put",
    "Target",
    "TxnResult",
    "Unit",
    "absent",
    "created_at",
    "delete",
    "delete_prefix",
    "get",
    "modified_at",
    "pack",
    "put",
    "split_puts",
    "value_is",
]
