"""StreamStore against a real etcd, and plan.py's task sets.

What these prove: stream and snode records keep their invariants under
concurrent writers (unique names, a single consistent replica ring, no stream
left on a dropped snode), every refusal names its cause, a deposed leader's
writes change nothing, and the planned task set matches TDengine's placement
and the counts WATCH checks against.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from itertools import count

import pytest

from meta.errors import NotLeader
from meta.kv import MetaKV
from proto import common_pb2, stream_pb2
from querycoord.stream import plan as P
from querycoord.stream.store import (
    MOVE_CHUNK,
    InvalidStream,
    NoSnodeAvailable,
    SnodeExists,
    SnodeNotFound,
    StreamExists,
    StreamNotFound,
    StreamStateConflict,
    StreamStore,
    check_ring,
    ring_replicas,
    status_of,
)
from tests.leader import leader_fence
from tests.streams import create_req


def req(name: str, **kw: object) -> stream_pb2.CreateStreamRequest:
    return create_req(name, **{"num_calc_subplans": 3, **kw})


@pytest.fixture
async def store(kv: MetaKV) -> StreamStore:
    """The leader's store: every write fenced, as the coordinator will use it."""
    return StreamStore(kv.fenced(await leader_fence(kv)), rng=random.Random(7))


async def stored(kv: MetaKV) -> dict[str, bytes]:
    return (await kv.load_prefix("")).as_dict()


# ----- streams -----------------------------------------------------------------------------------------------------
async def test_create_list_stop_start_drop(store: StreamStore) -> None:
    s1 = await store.create_snode(11)
    s2 = await store.create_snode(12)
    a = await store.create_stream(req("a"), [s1.id, s2.id])
    b = await store.create_stream(req("b", runner_deploys=2), [s2.id])
    assert a.id != b.id and a.id > 0
    assert a.main_snode_id in (s1.id, s2.id) and b.main_snode_id == s2.id
    assert a.runner_deploys == 3 and b.runner_deploys == 2  # 0 means the default 3
    assert a.create_ms > 0 and a.update_ms == a.create_ms
    assert [s.name for s in await store.list_streams()] == ["a", "b"]
    assert await store.get_stream_by_name("b") == b

    stopped = await store.stop_stream(a.id)
    assert stopped.user_stopped and (await store.get_stream(a.id)).user_stopped
    with pytest.raises(StreamStateConflict, match="already stopped"):
        await store.stop_stream(a.id)
    started = await store.start_stream(a.id)
    assert not started.user_stopped
    with pytest.raises(StreamStateConflict, match="not stopped"):
        await store.start_stream(a.id)

    dropped = await store.drop_stream(a.id)
    assert dropped.user_dropped and dropped.name == "a"
    assert [s.name for s in await store.list_streams()] == ["b"]
    for call in (store.get_stream, store.drop_stream, store.stop_stream, store.start_stream):
        with pytest.raises(StreamNotFound, match=f"unknown stream {a.id}"):
            await call(a.id)
    with pytest.raises(StreamNotFound, match="unknown stream 'a'"):
        await store.get_stream_by_name("a")
    # The name is free again at once, and the new stream gets a new id.
    again = await store.create_stream(req("a"), [s1.id])
    assert again.id not in (a.id, b.id)


async def test_create_errors(store: StreamStore) -> None:
    with pytest.raises(NoSnodeAvailable, match=r"no snode is available.*create an snode first"):
        await store.create_stream(req("s"), [])
    s1 = await store.create_snode(1)
    with pytest.raises(NoSnodeAvailable, match=f"no snode is available.*none of the snodes \\[{s1.id}\\] is live"):
        await store.create_stream(req("s"), [999])
    assert status_of(NoSnodeAvailable("x")).error_code == common_pb2.NO_AVAILABLE_NODE
    for bad, match in [
        (req(""), "invalid stream name"),
        (req("1abc"), "invalid stream name"),
        (req("s", num_calc_subplans=-1), "num_calc_subplans must be in"),
        (req("s", num_calc_scan_plans=10_000), "num_calc_scan_plans must be in"),
        (req("s", runner_deploys=-2), "runner_deploys must be in"),
        (req("s", runner_deploys=99), "runner_deploys must be in"),
        (req("s", source_vgroup_ids=[2, 2]), "positive and distinct"),
        (req("s", source_db="", source_vgroup_ids=[]), "give a source database"),
        (req("s", source_vgroup_ids=[], trigger_vgroup_id=5), "calc scan plans need source vgroups"),
    ]:
        with pytest.raises(InvalidStream, match=match):
            await store.create_stream(bad, [s1.id])
    assert await store.list_streams() == []

    first = await store.create_stream(req("dup"), [s1.id])
    with pytest.raises(StreamExists, match=f"'dup' already exists \\(id {first.id}\\)"):
        await store.create_stream(req("dup"), [s1.id])
    assert await store.create_stream(req("dup", if_not_exists=True), [s1.id]) == first
    assert status_of(StreamExists("x")).error_code == common_pb2.CONFLICT


async def test_concurrent_creates_of_one_name_exactly_one_wins(kv: MetaKV) -> None:
    fenced = kv.fenced(await leader_fence(kv))
    s1 = await StreamStore(fenced).create_snode(1)
    # Separate stores (separate id allocators), as several requests racing on the leader.
    stores = [StreamStore(fenced) for _ in range(6)]
    results = await asyncio.gather(*(s.create_stream(req("race"), [s1.id]) for s in stores), return_exceptions=True)
    won = [r for r in results if isinstance(r, stream_pb2.StreamDef)]
    lost = [r for r in results if isinstance(r, StreamExists)]
    assert len(won) == 1 and len(lost) == 5, results
    assert [s.id for s in await stores[0].list_streams()] == [won[0].id]
    assert await kv.get("stream/names/race") == str(won[0].id).encode()


# ----- snodes ------------------------------------------------------------------------------------------------------
async def test_snode_ring_add_and_drop(store: StreamStore) -> None:
    assert ring_replicas([5]) == {5: 0}
    assert ring_replicas([3, 1, 2]) == {1: 2, 2: 3, 3: 1}
    a = await store.create_snode(10)
    assert a.replica_id == 0  # alone: no replica
    with pytest.raises(SnodeExists, match="node 10 already hosts snode"):
        await store.create_snode(10)
    ids = [a.id]
    for node in (20, 30, 40):
        ids.append((await store.create_snode(node)).id)
        snodes = await store.list_snodes()
        assert check_ring(snodes) == [] and [s.id for s in snodes] == sorted(ids)
    # Drop from the middle, the end, the start: the ring stays one cycle.
    for victim in (ids[2], ids[3], ids[0]):
        await store.drop_snode(victim)
        ids.remove(victim)
        snodes = await store.list_snodes()
        assert check_ring(snodes) == [] and [s.id for s in snodes] == ids
    assert (await store.list_snodes())[0].replica_id == 0
    await store.drop_snode(ids[0])  # no streams use it: the last snode may go
    assert await store.list_snodes() == []
    with pytest.raises(SnodeNotFound, match=f"unknown snode {ids[0]}"):
        await store.drop_snode(ids[0])


async def test_concurrent_snode_changes_keep_the_ring(kv: MetaKV) -> None:
    fenced = kv.fenced(await leader_fence(kv))
    stores = [StreamStore(fenced) for _ in range(8)]
    created = await asyncio.gather(*(s.create_snode(100 + i) for i, s in enumerate(stores)))
    assert check_ring(await stores[0].list_snodes()) == []
    await asyncio.gather(*(s.drop_snode(c.id) for s, c in zip(stores[:5], created[:5], strict=True)))
    snodes = await stores[0].list_snodes()
    assert len(snodes) == 3 and check_ring(snodes) == []


async def test_drop_snode_moves_streams_to_replica_in_one_txn(kv: MetaKV, store: StreamStore) -> None:
    s1, s2, s3 = [await store.create_snode(n) for n in (1, 2, 3)]
    on1 = [await store.create_stream(req(f"a{i}"), [s1.id]) for i in range(5)]
    on3 = await store.create_stream(req("c"), [s3.id])
    writes = store.kv.writes  # type: ignore[attr-defined]
    result = await store.drop_snode(s1.id)
    assert store.kv.writes == writes + 1 and result.txns == 1  # type: ignore[attr-defined]
    assert result.moved_streams == 5 and result.moved_to == result.snode.replica_id == s2.id
    by_id = {s.id: s for s in await store.list_streams()}
    assert all(by_id[s.id].main_snode_id == s2.id for s in on1)
    assert by_id[on3.id].main_snode_id == s3.id
    assert check_ring(await store.list_snodes()) == []


async def test_creates_racing_a_snode_drop_never_leave_a_stream_on_a_dropped_snode(kv: MetaKV) -> None:
    fenced = kv.fenced(await leader_fence(kv))
    store = StreamStore(fenced, rng=random.Random(1))
    for round_ in range(5):
        a, b = await store.create_snode(10 * round_ + 1), await store.create_snode(10 * round_ + 2)
        creates = [
            StreamStore(fenced, rng=random.Random(i)).create_stream(req(f"r{round_}_{i}"), [a.id, b.id])
            for i in range(10)
        ]
        await asyncio.gather(store.drop_snode(a.id), *creates)
        existing = {s.id for s in await store.list_snodes()}
        assert a.id not in existing
        assert {s.main_snode_id for s in await store.list_streams()} <= existing
        assert check_ring(await store.list_snodes()) == []


async def test_drop_last_snode_with_streams_is_refused(kv: MetaKV, store: StreamStore) -> None:
    s1 = await store.create_snode(1)
    await store.create_stream(req("only"), [s1.id])
    before = await stored(kv)
    with pytest.raises(NoSnodeAvailable, match=f"cannot drop snode {s1.id}: it is the only snode and 1 stream"):
        await store.drop_snode(s1.id)
    assert await stored(kv) == before
    # With a second snode the same drop goes through, to it.
    s2 = await store.create_snode(2)
    assert (await store.drop_snode(s1.id)).moved_to == s2.id
    assert (await store.get_stream_by_name("only")).main_snode_id == s2.id


async def test_drop_snode_beyond_one_txn_is_chunked_with_the_removal_last(kv: MetaKV) -> None:
    fenced = kv.fenced(await leader_fence(kv))
    store = StreamStore(fenced, move_chunk=4)
    s1, s2 = await store.create_snode(1), await store.create_snode(2)
    names = [f"s{i}" for i in range(11)]
    for n in names:
        await store.create_stream(req(n), [s1.id])

    # A failure after the first chunk: state stays consistent (every stream on an existing snode).
    real_move = store.move_streams
    calls = 0

    async def failing_move(*args: object, **kw: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("crash between chunks")
        return await real_move(*args, **kw)  # type: ignore[arg-type]

    store.move_streams = failing_move  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await store.drop_snode(s1.id)
    snodes = {s.id: s for s in await store.list_snodes()}
    assert snodes[s1.id].dropping  # marked: no new stream picks it
    mains = [s.main_snode_id for s in await store.list_streams()]
    assert set(mains) == {s1.id, s2.id} and mains.count(s2.id) == 4
    with pytest.raises(NoSnodeAvailable):
        await store.create_stream(req("late"), [s1.id])  # the dropping snode is not offered

    store.move_streams = real_move  # type: ignore[method-assign]
    result = await store.drop_snode(s1.id)  # re-running finishes the drop
    assert result.moved_streams == 7 and result.txns >= 2
    assert {s.main_snode_id for s in await store.list_streams()} == {s2.id}
    assert [s.id for s in await store.list_snodes()] == [s2.id]


async def test_drop_snode_with_more_streams_than_one_txn_holds(kv: MetaKV) -> None:
    fenced = kv.fenced(await leader_fence(kv))
    store = StreamStore(fenced)
    _, s2, s3 = [await store.create_snode(n) for n in (1, 2, 3)]
    n = MOVE_CHUNK + 15  # more than fit in one txn with the ring update
    await asyncio.gather(*(StreamStore(fenced).create_stream(req(f"x{i}"), [s2.id]) for i in range(n)))
    result = await store.drop_snode(s2.id)
    assert result.moved_streams == n and result.moved_to == s3.id and result.txns == 3  # mark, chunk, final
    assert {s.main_snode_id for s in await store.list_streams()} == {s3.id}
    assert check_ring(await store.list_snodes()) == [] and len(await store.list_snodes()) == 2


async def test_deposed_leader_changes_nothing(kv: MetaKV) -> None:
    fence = await leader_fence(kv)
    store = StreamStore(kv.fenced(fence))
    s1, s2 = await store.create_snode(1), await store.create_snode(2)
    a = await store.create_stream(req("a"), [s1.id])
    await kv.remove("election/leader")  # leadership lost
    before = await stored(kv)
    attempts = [
        store.create_stream(req("b"), [s1.id]),
        store.stop_stream(a.id),
        store.drop_stream(a.id),
        store.create_snode(3),
        store.drop_snode(s1.id),
    ]
    for attempt in attempts:
        with pytest.raises(NotLeader):
            await attempt
    assert await stored(kv) == before
    assert status_of(NotLeader("k", 1, 0)).error_code == common_pb2.NOT_LEADER
    # A new leader (new fence) writes fine.
    new = StreamStore(kv.fenced(await leader_fence(kv)))
    assert (await new.stop_stream(a.id)).user_stopped
    assert s2.id in {s.id for s in await new.list_snodes()}


# ----- plan --------------------------------------------------------------------------------------------------------
def sdef(**kw: object) -> stream_pb2.StreamDef:
    fields: dict[str, object] = {
        "id": 42,
        "name": "s",
        "source_vgroup_ids": [2, 3, 4],
        "num_calc_scan_plans": 2,
        "num_calc_subplans": 3,
        "runner_deploys": 3,
        "main_snode_id": 1,
    }
    fields.update(kw)
    return stream_pb2.StreamDef(**fields)  # type: ignore[arg-type]


def ids_from(start: int = 1000) -> Callable[[int], list[int]]:
    """An id callback like the manager's (which draws from the task IdAllocator)."""
    c = count(start)
    return lambda n: [next(c) for _ in range(n)]


RING = {1: 2, 2: 3, 3: 1}


def test_plan_counts_and_placement() -> None:
    d = sdef()
    plan = P.plan_stream(d, [4, 3, 2], [1, 2, 3], RING, ids_from(), random.Random(1))
    assert len(plan.trigger_readers) == 3 and [t.vgroup_id for t in plan.trigger_readers] == [2, 3, 4]
    # One calc reader per (scan plan, vgroup), not per scan plan.
    assert [(t.scan_plan_idx, t.vgroup_id) for t in plan.calc_readers] == [(p, v) for p in (0, 1) for v in (2, 3, 4)]
    assert plan.trigger.kind == stream_pb2.TRIGGER and plan.trigger.snode_id == 1 and plan.trigger.task_id == 1000
    assert len(plan.runners) == 3 and all(len(dep) == 3 for dep in plan.runners)
    assert plan.runners[0][0].snode_id == 1  # deploy 0 on the main snode
    for d_idx, dep in enumerate(plan.runners):
        assert [r.task_idx for r in dep] == [0, 1, 2] and [r.top for r in dep] == [False, False, True]
        assert {r.deploy_id for r in dep} == {d_idx} and len({r.snode_id for r in dep}) == 1
    tasks = plan.tasks()
    assert len(tasks) == 3 + 6 + 9 + 1 == P.expected_counts(d, [2, 3, 4]).total
    assert len({t.task_id for t in tasks}) == len(tasks) and all(t.sid == 1 for t in tasks)
    assert [t.task_id for t in plan.top_runners()] == [dep[-1].task_id for dep in plan.runners]
    proto = plan.trigger.to_proto(42, node_id=7)
    assert proto.kind == stream_pb2.TRIGGER and proto.sid == 1 and proto.node_id == 7 and proto.snode_id == 1


def test_plan_is_deterministic_with_a_seed() -> None:
    def placement(seed: int, live: list[int]) -> list[int]:
        plan = P.plan_stream(sdef(runner_deploys=6), None, live, RING, ids_from(), random.Random(seed))
        return [dep[0].snode_id for dep in plan.runners]

    assert placement(5, [1, 2, 3]) == placement(5, [3, 2, 1])  # order of the live set does not matter
    seen = {tuple(placement(seed, [1, 2, 3])) for seed in range(20)}
    assert len(seen) > 1 and all(p[0] == 1 and set(p) <= {1, 2, 3} for p in seen)


def test_plan_falls_back_to_the_replica() -> None:
    plan = P.plan_stream(sdef(), None, [2, 3], RING, ids_from(), random.Random(0))
    assert plan.static_snode_id == 2 and plan.trigger.snode_id == 2 and plan.runners[0][0].snode_id == 2
    assert all(r.snode_id in (2, 3) for dep in plan.runners for r in dep)
    with pytest.raises(NoSnodeAvailable, match="main snode 1 is not live and neither is its replica 2"):
        P.plan_stream(sdef(), None, [3], RING, ids_from(), random.Random(0))
    with pytest.raises(NoSnodeAvailable, match="it has no replica"):
        P.plan_stream(sdef(), None, [3], {1: 0}, ids_from(), random.Random(0))


@pytest.mark.parametrize(
    ("kw", "vgroups", "expected"),
    [
        ({}, [2, 3, 4], (3, 6, 3, 3)),
        ({"trigger_vgroup_id": 9}, [2, 3, 4], (1, 6, 3, 3)),  # triggered by one table
        ({"num_calc_scan_plans": 0, "num_calc_subplans": 0}, [5], (1, 0, 0, 0)),
        ({"runner_deploys": 1, "num_calc_subplans": 5}, [2, 3], (2, 4, 1, 5)),
        ({}, None, (3, 6, 3, 3)),  # the persisted vgroups
    ],
)
def test_expected_counts_match_the_plan(kw: dict[str, object], vgroups: list[int] | None, expected: tuple) -> None:
    d = sdef(**kw)
    counts = P.expected_counts(d, vgroups)
    assert (counts.trigger_readers, counts.calc_readers, counts.runner_deploys, counts.runners_per_deploy) == expected
    plan = P.plan_stream(d, vgroups, [1, 2, 3], RING, ids_from(), random.Random(3))
    assert plan.counts() == counts and len(plan.tasks()) == counts.total


def test_plan_refuses_a_source_without_vgroups() -> None:
    with pytest.raises(InvalidStream, match="no vgroups"):
        P.plan_stream(sdef(source_vgroup_ids=[]), [], [1], RING, ids_from(), random.Random(0))


# ----- proto -------------------------------------------------------------------------------------------------------
def test_stream_proto_is_registered_and_every_response_carries_a_status() -> None:
    fd = stream_pb2.DESCRIPTOR
    assert fd.name == "proto/stream.proto" and fd.package == "querycoord.stream"
    service = fd.services_by_name["StreamMgmt"]
    assert {m.name for m in service.methods} == {
        "CreateStream",
        "DropStream",
        "StopStream",
        "StartStream",
        "ShowStreams",
        "CreateSnode",
        "DropSnode",
        "StreamHeartbeat",
        "RecalculateStream",
    }
    for method in service.methods:
        status = method.output_type.fields_by_name["status"]
        assert status.message_type.full_name == "querycoord.common.Status", method.name
    # Zero is never a real kind or status: an unset field cannot pass for INIT or a trigger reader.
    assert stream_pb2.TaskKind.Name(0) == "TASK_KIND_UNSPECIFIED"
    assert stream_pb2.TaskStatus.Name(0) == "TASK_STATUS_UNSPECIFIED"
