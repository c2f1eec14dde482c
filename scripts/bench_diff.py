"""Micro benchmark of the checker pass's CPU part: ``checkers.distribution.collect`` (building ``Held`` from every
node's answer) and ``diff``, on a consistent query meta of 100k / 1M segments.

No etcd, no nodes: the query meta's in-memory index is filled directly (``MetaIndex.put_collection`` /
``put_segment`` / ``put_dm_channel``), and the nodes are stubs that answer ``GetDataDistribution`` with a response
built beforehand (what gRPC would hand the checker after parsing). The state is consistent (every node holds
exactly its recorded copies), which is the takeover's common case: the pass should find nothing to repair.

Times are CPU seconds of this process (the work is single-threaded Python on one event loop), best of
``--rounds``: on a shared machine wall time varies twice as much. It measures whatever ``querycoord.checkers`` is
importable: run it once on a clone of the old code
(``PYTHONPATH=/path/to/old``) for "before". Prints a table, then one JSON line:
``{"segments": [...], "replicas": [...], "diff_s": [...], "distribution_s": [...], "longest_turn_s": [...]}``
(``longest_turn_s``: the longest the event loop went without a turn during ``collect`` + ``diff_async``,
wall seconds; null for code without ``diff_async``).

    python scripts/bench_diff.py --sizes 100000 1000000 --replicas 1 2
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from dataclasses import dataclass
from typing import Any, cast

from meta.kv import MetaKV
from proto import data_pb2, querynode_pb2
from querycoord import checkers
from querycoord.checkers.distribution import collect
from querycoord.common.target import Target, TargetSegment
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import set_copies

CID = 1
PARTITIONS = 16
CHANNELS = 4


@dataclass
class _Node:
    node_id: int


class _Client:
    def __init__(self, answer: querynode_pb2.GetDataDistributionResponse):
        self.answer = answer
        self.ids_answer = ids_only(answer)

    async def call(self, method: str, request: Any) -> querynode_pb2.GetDataDistributionResponse:
        assert method == "GetDataDistribution"
        return self.ids_answer if getattr(request, "segment_ids_only", False) else self.answer


def ids_only(answer: querynode_pb2.GetDataDistributionResponse) -> querynode_pb2.GetDataDistributionResponse:
    """The answer a node gives with ``segment_ids_only`` (ids grouped by partition, no SegmentInfo)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for s in answer.segments:
        groups.setdefault((s.collection_id, s.partition_id), []).append(s.segment_id)
    out = querynode_pb2.GetDataDistributionResponse(node_id=answer.node_id, channels=answer.channels)
    for (cid, pid), ids in sorted(groups.items()):
        out.segment_groups.add(collection_id=cid, partition_id=pid, segment_ids=sorted(ids))
    return out


class _Nodes:
    def __init__(self, answers: dict[int, querynode_pb2.GetDataDistributionResponse]):
        self.answers = answers
        self.clients = {n: _Client(a) for n, a in answers.items()}  # built before anything is timed

    def online(self) -> list[_Node]:
        return [_Node(n) for n in sorted(self.answers)]

    def client(self, node_id: int) -> _Client:
        return self.clients[node_id]

    def heard(self, node_id: int) -> None:
        pass


def build(segments: int, replicas: int, nodes: int) -> tuple[QueryMeta, dict[int, Target], _Nodes]:
    """One collection of ``segments`` segments in ``replicas`` replicas over ``nodes`` nodes, all consistent."""
    meta = QueryMeta(cast(MetaKV, None))  # never written: only the in-memory index is used
    index = meta.index
    per = nodes // replicas
    groups = {r: list(range(1 + (r - 1) * per, 1 + r * per)) for r in range(1, replicas + 1)}
    info = data_pb2.CollectionLoadInfo(collection_id=CID, load_type=data_pb2.LOAD_TYPE_COLLECTION,
                                       replica_number=replicas)
    for pid in range(PARTITIONS):
        info.partitions.add(partition_id=100 + pid, state=data_pb2.PARTITION_STATE_IN_MEMORY,
                            in_memory_percentage=100)
    for r, members in groups.items():
        info.replicas.add(replica_id=r, collection_id=CID, node_ids=members)
    index.put_collection(info)
    answers = {n: querynode_pb2.GetDataDistributionResponse(node_id=n) for n in range(1, nodes + 1)}
    target = Target()
    for i in range(segments):
        sid, pid = 10_000_000 + i, 100 + i % PARTITIONS
        by_replica = {r: members[i % len(members)] for r, members in groups.items()}
        rec = set_copies(data_pb2.SegmentInfo(segment_id=sid, collection_id=CID, partition_id=pid, num_rows=1000,
                                              mem_size=1 << 20, state=data_pb2.SEGMENT_STATE_SEALED), by_replica)
        index.put_segment(rec)
        target.segments[sid] = TargetSegment(sid, pid)
        for node in by_replica.values():
            answers[node].segments.add(segment_id=sid, collection_id=CID, partition_id=pid, node_id=node)
    for c in range(CHANNELS):
        name = f"dml-{CID}-{c}"
        by_replica = {r: members[c % len(members)] for r, members in groups.items()}
        index.put_dm_channel(set_copies(data_pb2.DmChannelWatchInfo(collection_id=CID, dm_channel=name),
                                        by_replica))
        target.channels.add(name)
        for node in by_replica.values():
            answers[node].channels.add(collection_id=CID, channel_name=name, kind=querynode_pb2.CHANNEL_KIND_DM)
    return meta, {CID: target}, _Nodes(answers)


def best(rounds: int, run: Any) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(rounds):
        gc.collect()
        t0 = time.process_time()
        out = run()
        times.append(time.process_time() - t0)
    return min(times), out


def measure(size: int, replicas: int, nodes: int, rounds: int) -> tuple[float, float, float | None]:
    """(distribution_s, diff_s, longest_turn_s): best of ``rounds`` each, on one freshly built state."""
    meta, targets, answers = build(size, replicas, nodes)
    online = {n.node_id for n in answers.online()}
    loop = asyncio.new_event_loop()
    try:
        dist_s, (held, reachable) = best(rounds, lambda: loop.run_until_complete(
            collect(cast(Any, answers), set(), [])))
    finally:
        loop.close()
    diff_s, d = best(rounds, lambda: checkers.diff(meta, targets, held, reachable=reachable, online=online,
                                                  busy=set()))
    assert not d.repairs, f"a consistent state needs no repair: {d.repairs}"
    per_partition = size // PARTITIONS * replicas
    assert d.progress[CID] == {100 + p: (per_partition, per_partition) for p in range(PARTITIONS)}, "all counted"
    return dist_s, diff_s, asyncio.run(longest_turn(answers, meta, targets, online))


async def longest_turn(nodes: _Nodes, meta: QueryMeta, targets: dict[int, Target],
                       online: set[int]) -> float | None:
    """The longest the event loop waited for a turn (wall seconds) during ``collect`` and ``diff_async``;
    None where ``diff_async`` does not exist (the old code: one pass is one turn)."""
    diff_async = getattr(checkers, "diff_async", None)
    if diff_async is None:
        return None
    gaps: list[float] = []
    done = False

    async def tick() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    held, reachable = await collect(cast(Any, nodes), set(), [])
    await diff_async(meta, targets, held, reachable=reachable, online=online, busy=set())
    done = True
    await ticker
    return max(gaps)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="best of this many runs of each step")
    args = ap.parse_args()
    result: dict[str, list[Any]] = {"segments": [], "replicas": [], "diff_s": [], "distribution_s": [],
                                    "longest_turn_s": []}
    print(f"{'segments':>10} {'replicas':>8} {'distribution_s':>15} {'diff_s':>8} {'longest_turn_s':>15}")
    for size in args.sizes:
        for replicas in args.replicas:
            dist_s, diff_s, turn_s = measure(size, replicas, args.nodes, args.rounds)
            gc.collect()
            turn = round(turn_s, 3) if turn_s is not None else None
            print(f"{size:>10} {replicas:>8} {dist_s:>15.3f} {diff_s:>8.3f} {turn!s:>15}", flush=True)
            for key, value in (("segments", size), ("replicas", replicas), ("diff_s", round(diff_s, 3)),
                               ("distribution_s", round(dist_s, 3)), ("longest_turn_s", turn)):
                result[key].append(value)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
