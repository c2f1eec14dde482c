"""The failover drill's final check: wait until the cluster is quiescent, then compare what was asked with the
catalog, query meta in etcd and the nodes' own distributions (``invariants.check``)."""

from __future__ import annotations

import asyncio
import time

import grpc

from proto import common_pb2, querynode_pb2, querynode_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.net.client import CoordinatorUnavailable
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies
from querycoord.security.grpc_channels import make_channel
from querycoord.task.store import TASK_PREFIXES
from querycoord.tooling.drill.failover_base import direct_address
from querycoord.tooling.drill.invariants import UNCLEAR_CODES, CatalogColl, MetaView, NodeView, check, node_view
from querycoord.tooling.drill.replica_watch import ReplicaWatch, meta_collections

EC = common_pb2


class FailoverChecks(ReplicaWatch):
    """Quiescence, then the invariants over the catalog, query meta and the nodes."""

    async def _quiesce(self) -> list[str]:
        """Until no task runs, no task key exists and the leader sees exactly the live nodes online (bounded)."""
        assert self.client is not None and self.kv is not None
        deadline = time.monotonic() + self.opts.quiesce_timeout
        good = 0
        last = ""
        while time.monotonic() < deadline:
            try:
                nodes = await self.client.query("ShowNodes", qc.ShowNodesRequest())
                tasks = await self.client.query("ListTasks", qc.ListTasksRequest(limit=1000))
            except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                last = f"no leader answered: {exc}"
                good = 0
                await asyncio.sleep(0.5)
                continue
            live = {n.node_id for n in self.nodes}
            online = {n.node_id for n in nodes.nodes if n.state == "online"}
            known = {n.node_id for n in nodes.nodes}
            keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
            quiet = (nodes.status.error_code == EC.SUCCESS and tasks.status.error_code == EC.SUCCESS
                     and not tasks.trees and not any(keys.values()) and online == live and known == live)
            last = (f"{len(tasks.trees)} task trees, task keys {keys}, online nodes {sorted(online)} (known "
                    f"{sorted(known)}), live nodes {sorted(live)}")
            good = good + 1 if quiet else 0
            if good >= 3:
                return []
            await asyncio.sleep(0.5)
        return [f"not quiescent after {self.opts.quiesce_timeout:.0f}s: {last}"]

    async def _check(self) -> None:
        assert self.kv is not None
        self.say("workload done; waiting until the cluster is quiescent")
        t = time.monotonic()
        not_quiet = await self._quiesce()
        self.say(f"quiescent after {time.monotonic() - t:.1f}s" if not not_quiet else not_quiet[0])
        catalog = await self._catalog_view()
        t_meta = self.now()
        meta = await self._meta_view()
        self._judge_replicas(self._observation("final check", t_meta, meta.collections, quiescent=True))
        nodes = await self._node_views()
        keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
        unanswered = [f"#{r.seq} {r.method} {r.target}: {r.reason}" for r in self.result.calls
                      if r.outcome == "unanswered"]
        unclear = [f"#{r.seq} {r.method} {r.target}: {r.code} {r.reason[:200]}" for r in self.result.calls
                   if r.outcome == "error" and r.code in UNCLEAR_CODES]
        inconclusive = [f"pause round {i + 1} inconclusive: {'; '.join(p.notes)}"
                        for i, p in enumerate(self.result.pauses) if not p.conclusive]
        self.result.check = check(self.expected, catalog, meta, nodes, task_keys=keys, unanswered=unanswered,
                                  unclear=unclear, extra_violations=self._extra_violations + not_quiet + inconclusive,
                                  replica_number=self.opts.replicas, replica_history=self._replica_history,
                                  replica_comparisons=self._replica_comparisons)

    async def _catalog_view(self) -> dict[int, CatalogColl]:
        assert self.kv is not None
        store = CatalogStore(self.kv)
        out: dict[int, CatalogColl] = {}
        for cid in self.coll_ids:
            desc = await store.describe_collection(cid)
            parts: dict[int, frozenset[int]] = {}
            sources: dict[int, tuple[int, ...]] = {}
            for p in desc.partitions:
                _, binlogs = await store.get_recovery_info(cid, p.partition_id)
                parts[p.partition_id] = frozenset(b.segment_id for b in binlogs)
                sources.update((b.segment_id, tuple(b.compaction_from)) for b in binlogs if b.compaction_from)
            out[cid] = CatalogColl(parts, frozenset(desc.dm_channels), sources)
        return out

    async def _meta_view(self) -> MetaView:
        assert self.kv is not None
        meta = QueryMeta(self.kv)  # a plain (unfenced) view, only read
        await meta.reload()
        view = MetaView()
        view.collections = meta_collections(meta)
        for cid in self.coll_ids:
            for s in meta.segments_of(cid):
                view.segments[s.segment_id] = (s.collection_id, s.partition_id, copies(s))
            for w in meta.dm_channels_of(cid):
                view.channels[(cid, w.dm_channel)] = copies(w)
        return view

    async def _node_views(self) -> dict[int, NodeView]:
        out: dict[int, NodeView] = {}
        for n in self.nodes:
            async with make_channel(direct_address(n)) as ch:
                try:
                    d = await querynode_pb2_grpc.QueryNodeStub(ch).GetDataDistribution(
                        querynode_pb2.GetDataDistributionRequest(), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    self._extra_violations.append(f"node {n.node_id} did not report its distribution: {exc.code()}")
                    continue
            out[n.node_id] = node_view(d)
        return out
