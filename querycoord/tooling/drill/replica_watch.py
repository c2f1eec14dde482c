"""Replicas over time: the failover drill reads the replicas in etcd around every fault and compares each
observation with the next at the quiescent checks (``invariants.replica_changes``)."""

from __future__ import annotations

import asyncio
import itertools

from proto import data_pb2
from querycoord.querymeta import QueryMeta
from querycoord.tooling.drill.chaos_ops import effect_of
from querycoord.tooling.drill.failover_base import FailoverBase
from querycoord.tooling.drill.failover_records import ReplicaObservation
from querycoord.tooling.drill.invariants import MetaColl, replica_changes


class ReplicaWatch(FailoverBase):
    """Observations of the replicas and their judgement; the chaos drill overrides the hooks
    (``_current_phase``, ``_requests_between``, ``_reborn_between``)."""

    def _observation(self, what: str, t0: float, collections: dict[int, MetaColl],
                     quiescent: bool = False) -> ReplicaObservation:
        return ReplicaObservation(what, t0, self.now(), collections, {n.node_id for n in self.nodes if n.running},
                                  quiescent, self._current_phase())

    def _current_phase(self) -> int:
        return 0

    async def _observe_replicas(self, what: str) -> None:
        """Read the replicas from etcd now (``_judge_replicas`` compares the observations at the next check)."""
        assert self.kv is not None
        t0 = self.now()
        meta = QueryMeta(self.kv)
        try:
            await asyncio.wait_for(meta.reload(), 15)
        except Exception as exc:  # etcd losing a member right now: this observation is skipped, not the drill
            self.note(f"replicas at {what}: not read ({exc!r})")
            return
        self._replica_obs.append(self._observation(what, t0, meta_collections(meta)))

    def _requests_between(self, a: ReplicaObservation, b: ReplicaObservation) -> list[tuple[int, str]]:
        """(collection, method) of the load and release requests that may have taken effect between two
        observations: sent before the second, not answered before the first; an answer that leaves the effect
        open (unanswered, TIMEOUT: "it may still complete") may take effect at any later time."""
        out = []
        for r in self.result.calls:
            kind = _KIND_OF_METHOD.get(r.method)
            if kind is None or not r.cid:
                continue
            open_ended = not r.outcome or effect_of(kind, r.outcome, r.code) == "maybe"
            end = float("inf") if open_ended else r.t + r.elapsed
            if r.t <= b.t1 and end >= a.t0:
                out.append((r.cid, r.method))
        return out

    def _reborn_between(self, a: ReplicaObservation, b: ReplicaObservation) -> set[int]:
        """Nodes that died and came back under their id between two observations (none here: replaced nodes get
        new ids; the chaos drill restarts nodes under fixed ids)."""
        return set()

    def _rehomed(self) -> set[int]:
        """Collections a REHOME_NODE trigger worked on (none here: the chaos drill reads the leader's task
        history)."""
        return set()

    def _judge_replicas(self, now: ReplicaObservation) -> None:
        """At a quiescent check: compare every observation since the last check with the next one
        (``replica_changes``); a node that left its replica while running must be dead by now."""
        obs = [*sorted(self._replica_obs, key=lambda o: o.t0), now]
        for a, b in itertools.pairwise(obs):
            requests = self._requests_between(a, b)
            released = {c for c, m in requests if m in ("ReleaseCollection", "ReleasePartitions")}
            problems, suspects = replica_changes(
                a.collections, b.collections, live=b.live, released=released,
                loading={c for c, m in requests if m in ("LoadCollection", "LoadPartitions")},
                reborn=self._reborn_between(a, b), rehomed=self._rehomed())
            self._replica_comparisons += len((a.collections.keys() & b.collections.keys()) - released)
            self._replica_history += [f"replicas from {a.what} to {b.what}: {p}" for p in problems]
            for n, what in suspects.items():
                self._replica_suspects.setdefault(n, (f"from {a.what} to {b.what}: {what}", a))
        for n, (what, since) in sorted(self._replica_suspects.items()):
            # Died since and back under its id (a fixed-id restart): not the process that left, which is dead.
            if n in now.live and n not in self._reborn_between(since, now):
                self._replica_history.append(f"replicas {what}, and still runs at {now.what}")
        self._replica_suspects = {}
        self._replica_obs = [now]


#: The chaos oracle's request kinds (``chaos_ops.effect_of``) of the failover drill's load-state methods.
_KIND_OF_METHOD = {"LoadCollection": "load", "LoadPartitions": "load_partitions", "ReleaseCollection": "release",
                   "ReleasePartitions": "release_partitions"}


def meta_collections(meta: QueryMeta) -> dict[int, MetaColl]:
    """Query meta's loaded collections as the checks read them, with their replicas (id -> nodes)."""
    out = {}
    for info in meta.collections():
        kind = "collection" if info.load_type == data_pb2.LOAD_TYPE_COLLECTION else "partitions"
        out[info.collection_id] = MetaColl(kind, int(info.in_memory_percentage),
                                           frozenset(p.partition_id for p in info.partitions),
                                           {r.replica_id: frozenset(r.node_ids) for r in info.replicas})
    return out
