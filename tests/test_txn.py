"""meta.txn and MetaKV.txn / pack / write_packed against a real etcd: mixed txns, fencing, packing limits."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meta.errors import InvalidKey, NotLeader, RequestTooLarge
from meta.etcd_pb import PbCompare, PutRequest, RequestOp, TxnRequest
from meta.fence import Fence
from meta.kv import FencedKV, MetaKV
from meta.txn import (
    MAX_PACKED_COMPARES,
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    TXN_BYTE_BUDGET,
    Batch,
    Compare,
    Put,
    Target,
    Unit,
    absent,
    created_at,
    delete,
    delete_prefix,
    get,
    modified_at,
    pack,
    put,
    split_puts,
    value_is,
    version_is,
)


async def _fenced(kv: MetaKV) -> FencedKV:
    await kv.save("election/leader", "me")
    item = await kv.get_kv("election/leader")
    assert item is not None
    return kv.fenced(Fence(kv.abs_key("election/leader").decode(), item.create_revision))


async def _setup_mixed(kv: MetaKV) -> dict[str, object]:
    await kv.multi_save({"old/1": "a", "old/2": "b", "old/sub/3": "c", "keep": "k", "cas": "a", "ver": "1"})
    await kv.save("ver", "2")  # version 2
    keep = await kv.get_kv("keep")
    assert keep is not None
    return {"keep": keep}


def _mixed_compares(keep: object) -> list[Compare]:
    return [
        value_is("cas", "a"),
        created_at("keep", keep.create_revision),  # type: ignore[attr-defined]
        modified_at("keep", keep.mod_revision),  # type: ignore[attr-defined]
        version_is("ver", 2),
        absent("new"),
    ]


# ----- one txn mixing compares, range deletes, puts, deletes and gets -------------------------------------------------
async def test_mixed_compares_range_delete_and_puts_in_one_txn(kv: MetaKV) -> None:
    state = await _setup_mixed(kv)
    before = await kv.revision()
    result = await kv.txn(
        _mixed_compares(state["keep"]),
        [delete_prefix("old/"), put("new", "n"), put("cas", b"b"), delete("keep"), get("ver"), get("missing")],
        on_failure_ops=[get("cas")],
    )
    assert result.succeeded
    assert result.revision == before + 1, "every op of the txn lands at one revision"
    assert await kv.count_prefix("old/") == 0, "the range delete removed the nested key too"
    assert await kv.get("new") == b"n" and await kv.get("cas") == b"b" and await kv.get("keep") is None
    new = await kv.get_kv("new")
    assert new is not None and new.create_revision == result.revision
    # One response per op of the branch that ran: gets decoded to KeyValues (relative keys), None otherwise.
    assert len(result.responses) == 6 and result.responses[:4] == (None, None, None, None)
    ver = result.responses[4]
    assert ver is not None and ver.key == "ver" and ver.value == b"2" and ver.version == 2
    assert result.responses[5] is None, "a get of an absent key answers None"


@pytest.mark.parametrize("broken", range(5))
async def test_any_failed_compare_runs_the_failure_branch_and_writes_nothing(kv: MetaKV, broken: int) -> None:
    state = await _setup_mixed(kv)
    compares = _mixed_compares(state["keep"])
    c = compares[broken]
    wrong: bytes | int = b"not-it" if c.target is Target.VALUE else int(c.expected) + 1  # type: ignore[arg-type]
    compares[broken] = Compare(c.key, c.target, wrong)
    before = (await kv.load_prefix("")).as_dict()
    revision = await kv.revision()
    result = await kv.txn(compares, [delete_prefix("old/"), put("new", "n")], on_failure_ops=[get("cas"), get("nope")])
    assert not result.succeeded
    assert result.revision == revision, "the failure branch only read"
    assert (await kv.load_prefix("")).as_dict() == before
    cas, nope = result.responses
    assert cas is not None and cas.key == "cas" and cas.value == b"a" and nope is None


async def test_txn_limits_and_keys_are_checked_before_sending(kv: MetaKV) -> None:
    with pytest.raises(RequestTooLarge):
        await kv.txn([], [put(f"k/{i}", "v") for i in range(MAX_TXN_OPS + 1)])
    with pytest.raises(RequestTooLarge):
        await kv.txn([absent(f"k/{i}") for i in range(MAX_TXN_OPS + 1)], [put("k/x", "v")])
    with pytest.raises(InvalidKey):
        await kv.txn([], [put("", "v")])
    assert await kv.count_prefix("") == 0


async def test_reads_at_a_revision_and_range_pages(kv: MetaKV) -> None:
    first = await kv.multi_save({f"p/{i:03d}": str(i) for i in range(10)})
    await kv.save("p/000", "changed")
    old = await kv.get_kv("p/000", revision=first)
    assert old is not None and old.value == b"0"
    page, more = await kv.range_page("p/", limit=4)
    assert [k.key for k in page] == ["p/000", "p/001", "p/002", "p/003"] and more
    page, more = await kv.range_page("p/", start="p/008", limit=4)
    assert [k.key for k in page] == ["p/008", "p/009"] and not more


# ----- the fenced form ------------------------------------------------------------------------------------------------
async def test_fenced_txn_tells_a_failed_compare_from_a_lost_fence(kv: MetaKV) -> None:
    fenced = await _fenced(kv)
    await fenced.save("k", "v0")
    writes = fenced.writes

    # The fence holds, the caller's compare fails: an ordinary answer, not an error; the failure ops ran.
    result = await fenced.txn([value_is("k", "other")], [put("k", "v1")], on_failure_ops=[get("k")])
    assert not result.succeeded and fenced.refused == 0 and fenced.writes == writes
    (current,) = result.responses  # the fence read of the failure branch is not the caller's
    assert current is not None and current.value == b"v0"
    assert await kv.get("k") == b"v0"

    # Both hold: written and counted.
    result = await fenced.txn([value_is("k", "v0")], [put("k", "v1"), delete_prefix("gone/")])
    assert result.succeeded and fenced.writes == writes + 1 and fenced.last_write_revision == result.revision

    # The fence is gone: NotLeader, whether the caller's compares hold or not; nothing written.
    await kv.remove("election/leader")
    for compares in ([value_is("k", "v1")], [value_is("k", "other")], []):
        with pytest.raises(NotLeader) as e:
            await fenced.txn(compares, [put("k", "v2")], on_failure_ops=[get("k")])
        assert e.value.current_revision == 0
    assert fenced.refused == 3
    assert await kv.get("k") == b"v1"

    # Re-created by someone else (another create revision): still NotLeader, naming the new revision.
    await kv.save("election/leader", "other")
    with pytest.raises(NotLeader) as e:
        await fenced.txn([], [put("k", "v3")])
    assert e.value.current_revision > fenced.fence.revision
    assert await kv.get("k") == b"v1"


async def test_fenced_compare_and_swap_is_the_fenced_txn(kv: MetaKV) -> None:
    fenced = await _fenced(kv)
    assert await fenced.compare_and_swap("c", None, "1")
    assert not await fenced.compare_and_swap("c", None, "2")
    await kv.remove("election/leader")
    with pytest.raises(NotLeader):
        await fenced.compare_and_swap("c", "1", "2")
    assert await kv.get("c") == b"1"


# ----- the packer -----------------------------------------------------------------------------------------------------
def _unit(tag: str, n_ops: int = 1, value: bytes = b"v", compares: int = 0) -> Unit:
    return Unit(
        [put(f"{tag}/{i}", value) for i in range(n_ops)],
        [absent(f"{tag}/c{i}") for i in range(compares)],
        payload=tag,
    )


def _request_of(kv: MetaKV, batch: Batch) -> TxnRequest:
    """The etcd request for a batch, built independently of meta (for an exact ByteSize)."""
    ops = [RequestOp(request_put=PutRequest(key=kv.abs_key(op.key), value=op.value)) for op in batch.ops]
    compares = [
        PbCompare(target=PbCompare.CREATE, key=kv.abs_key(c.key), create_revision=int(c.expected))
        for c in batch.compares
    ]
    return TxnRequest(compare=compares, success=ops)


def _check_limits(kv: MetaKV, batches: list[Batch]) -> None:
    for b in batches:
        assert len(b.ops) <= MAX_TXN_OPS and len(b.compares) <= MAX_PACKED_COMPARES
        assert b.size <= TXN_BYTE_BUDGET
        assert _request_of(kv, b).ByteSize() <= b.size, "the size estimate is an upper bound"
        assert sum(len(u.ops) for u in b.units) == len(b.ops), "units are never split"


async def test_pack_respects_the_op_limit_and_keeps_units_whole(kv: MetaKV) -> None:
    units = [_unit(f"u{i}", n_ops=1 + i % 5, compares=i % 3) for i in range(200)]
    batches = kv.pack(units[:-1], units[-1])
    _check_limits(kv, batches)
    assert [p for b in batches for p in b.payloads] == [u.payload for u in units], "order kept, last is last"
    assert batches[-1].units[-1] is units[-1]
    for b, nxt in itertools.pairwise(batches):
        assert len(b.ops) + len(nxt.units[0].ops) > MAX_TXN_OPS, "greedy: a batch is closed only when full"
    fenced = await _fenced(kv)
    results = await fenced.write_packed(fenced.pack(units[:-1], units[-1]))
    assert all(r.succeeded for r in results) and len(results) == len(batches)
    assert await kv.count_prefix("u") == sum(len(u.ops) for u in units)


async def test_pack_respects_the_byte_limit(kv: MetaKV) -> None:
    value = b"x" * 100_000
    units = [_unit(f"b{i}", value=value) for i in range(40)]
    batches = kv.pack(units)
    _check_limits(kv, batches)
    assert [len(b.ops) for b in batches] == [15, 15, 10], "bytes, not the op count, close these txns"
    fenced = await _fenced(kv)  # the fence's compare and failure read fit in the headroom
    assert len(await fenced.write_packed(fenced.pack(units))) == 3
    assert await kv.count_prefix("b") == 40


def test_pack_counts_the_root_path_in_every_key() -> None:
    units = [Unit([put("k" * 10 + str(i), b"v" * 1000)]) for i in range(300)]
    plain = pack(units, max_bytes=100_000)
    rooted = pack(units, max_bytes=100_000, key_prefix=500)
    assert len(rooted) > len(plain)


def test_pack_adds_a_shared_compare_once_per_batch() -> None:
    guard = created_at("coll/1", 7)
    units = [Unit([put(f"s/{i}", "v")], [absent(f"s/{i}")], [guard]) for i in range(300)]
    batches = pack(units)
    for b in batches:
        assert b.compares.count(guard) == 1 and b.compares[0] == guard
        assert len(b.compares) <= MAX_PACKED_COMPARES
    # The compare limit binds before the op limit here: 126 own compares + the shared one.
    assert [len(b.units) for b in batches] == [126, 126, 48]


def test_pack_atomic_is_one_batch_or_refused() -> None:
    assert len(pack([_unit("a", 60), _unit("b", 60)], atomic=True)) == 1
    with pytest.raises(RequestTooLarge):
        pack([_unit("a", 60), _unit("b", 60), _unit("c", 60)], atomic=True)
    assert pack([]) == [] and pack([], atomic=True) == []


async def test_a_unit_larger_than_one_txn_is_refused_before_anything_is_sent(kv: MetaKV) -> None:
    small = [_unit(f"s{i}") for i in range(300)]
    for huge in (_unit("many", n_ops=MAX_TXN_OPS + 1), _unit("big", value=b"x" * MAX_TXN_BYTES),
                 _unit("cmp", compares=MAX_PACKED_COMPARES + 1)):
        with pytest.raises(RequestTooLarge):
            kv.pack(small, huge)
        with pytest.raises(RequestTooLarge):
            kv.pack([huge], small[0])
    with pytest.raises(InvalidKey):
        kv.pack([*small, Unit([put("", "v")])])
    # Through a writer that packs and sends: the oversized value comes last, yet nothing was written.
    saves = {f"w/{i:04d}": b"v" for i in range(500)} | {"w/huge": b"x" * MAX_TXN_BYTES}
    with pytest.raises(RequestTooLarge):
        await kv.chunked_save_non_atomic(saves)
    assert await kv.count_prefix("") == 0


async def test_write_packed_writes_the_commit_unit_last(kv: MetaKV) -> None:
    units = [Unit([put(f"child/{i:04d}", "c")]) for i in range(300)]
    commit = Unit([put("trigger", "done")])
    seen: list[int] = []
    results = await kv.write_packed(kv.pack(units, commit), on_sent=lambda b, r: seen.append(r.revision))
    assert len(results) == 3 and seen == [r.revision for r in results] and seen == sorted(seen)
    trigger = await kv.get_kv("trigger")
    children = (await kv.load_prefix("child/")).kvs
    assert trigger is not None and len(children) == 300
    # Three txns, in order; the commit unit shares the last one's revision with the children packed beside it.
    assert sorted({c.mod_revision for c in children}) == seen
    assert trigger.mod_revision == results[-1].revision == max(c.mod_revision for c in children)


async def test_write_packed_stops_at_the_first_failed_compare(kv: MetaKV) -> None:
    await kv.save("taken", "x")
    units = [Unit([put(f"a/{i:04d}", "v")]) for i in range(200)]
    units.append(Unit([put("b/0", "v")], [absent("taken")]))  # fails: the key exists
    units.extend(Unit([put(f"c/{i:04d}", "v")]) for i in range(200))
    batches = kv.pack(units)
    results = await kv.write_packed(batches)
    assert [r.succeeded for r in results] == [True, False], "the batch after the failed one was not sent"
    assert await kv.count_prefix("a/") == MAX_TXN_OPS and await kv.count_prefix("b/") == 0
    assert await kv.count_prefix("c/") == 0


async def test_write_packed_through_a_lost_fence_writes_nothing(kv: MetaKV) -> None:
    fenced = await _fenced(kv)
    await kv.remove("election/leader")
    with pytest.raises(NotLeader):
        await fenced.write_packed(fenced.pack([Unit([Put(f"x/{i}", b"v")]) for i in range(300)]))
    assert await kv.count_prefix("x/") == 0


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 400_000), max_size=400),
    key_prefix=st.integers(0, 300),
    max_ops=st.integers(1, MAX_TXN_OPS),
)
def test_split_puts_makes_the_txns_pack_makes_of_one_unit_per_put(sizes: list[int], key_prefix: int,
                                                                   max_ops: int) -> None:
    """The load path's shortcut (``split_puts``) must cut where ``pack`` would: never a txn over the limits."""
    puts = [Put(f"k/{i}", b"v" * n) for i, n in enumerate(sizes)]
    ranges = split_puts(puts, key_prefix=key_prefix, max_ops=max_ops)
    batches = pack([Unit([p]) for p in puts], key_prefix=key_prefix, max_ops=max_ops)
    assert [b.ops for b in batches] == [puts[a:b] for a, b, _ in ranges]
    assert [b.size for b in batches] == [size for _, _, size in ranges]
    # A unit per range whose size is the one measured packs into the same txns without measuring again.
    again = pack([Unit(puts[a:b], ops_size=size) for a, b, size in ranges], key_prefix=key_prefix, max_ops=max_ops)
    assert [(b.ops, b.size) for b in again] == [(b.ops, b.size) for b in batches]


def test_a_unit_of_a_known_size_is_packed_by_that_size() -> None:
    """``ops_size`` is trusted (it is what ``split_puts`` measured): the packing follows it, not the ops."""
    small = [Unit([Put(f"k{i}", b"v")], ops_size=TXN_BYTE_BUDGET // 2) for i in range(3)]
    assert [len(b.units) for b in pack(small)] == [2, 1]
    assert [len(b.units) for b in pack([Unit(u.ops) for u in small])] == [3]


def test_split_puts_refuses_a_put_too_large_alone() -> None:
    puts = [Put("a", b"v"), Put("b", b"x" * MAX_TXN_BYTES)]
    with pytest.raises(RequestTooLarge):
        split_puts(puts)
    with pytest.raises(RequestTooLarge):
        pack([Unit([p]) for p in puts])
    assert split_puts([]) == []
