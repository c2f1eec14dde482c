"""A fuzzing run against a cluster of real processes, and the checks after it (``run_fuzz``).

The cluster is the harness's (``querycoord.tooling.harness``): two coordinators (``querycoord coord --scaled``),
query nodes and stream nodes as processes with log files. The run seeds real things (collections with
segments, one of them loaded, snodes, streams) through the public services, fuzzes the leader, the standby
and the query nodes with ``tests.fuzzing``, then checks what must hold afterwards:

* every process alive, the leader SERVING (gRPC health);
* every request answered with a status or a proper gRPC code (``Stats``: crashes, unanswered);
* no task key left under the root once idle (polled with a deadline);
* no half-written collection or stream: every catalog collection has partitions and DM channels and its name
  key, every name key and segment points at a collection and partition that exist; every stream has its
  name key and a main snode that exists, the snode ring is whole; every stream the leader runs has tasks;
* query meta equals what the nodes hold (the failover drill's ``check``);
* failover: the leader is killed (SIGKILL), the standby takes over, serves, keeps the loaded collections,
  and the same checks hold again;
* no Python traceback in any process log.

``FuzzReport.summary`` is the one JSON line of ``make fuzz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meta.client import connect
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from proto import catalog_pb2, common_pb2, data_pb2, querycoord_pb2, querynode_pb2, stream_pb2
from querycoord.catalog import store as catalog_store
from querycoord.common.protocol import QUERYCOORD_SERVICE
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.querymeta import QueryMeta
from querycoord.stream import store as stream_store
from querycoord.task.store import TASK_PREFIXES
from querycoord.tooling.drill.invariants import CatalogColl, MetaColl, MetaView, NodeView, check, node_view
from querycoord.tooling.harness import QUERY_NODE, STREAM_NODE, Harness, Member
from tests.exhaustion import Exhaustion, ExhaustionOptions, exhaust, target, write_principals
from tests.fuzzing import COORDINATOR, CaseStrategies, Fuzzer, Stats, World, generate, rpcs, tracebacks
from tests.fuzzing import QUERY_NODE as QUERY_NODE_SURFACE

EC = common_pb2
HTTP = ("--http-listen", "127.0.0.1:0")


@dataclass
class FuzzOptions:
    requests: int = 1000
    seed: int = 0
    clients: int = 6
    deadline: float = 20.0  # per call
    batch: int = 100
    query_nodes: int = 2
    stream_nodes: int = 2
    ttl: float = 3.0
    idle_timeout: float = 45.0  # how long task keys may take to drain once the fuzzing stopped
    failover: bool = True
    # The resource-exhaustion phase (``tests.exhaustion``) after the hostile requests; None: skipped.
    exhaustion: ExhaustionOptions | None = field(default_factory=ExhaustionOptions.small)


@dataclass
class FuzzReport:
    seed: int
    stats: Stats = field(default_factory=Stats)
    tracebacks: list[tuple[str, str]] = field(default_factory=list)
    leftover_keys: int = 0
    leftover_detail: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    exhaustion: Exhaustion | None = None
    work: Path | None = None
    elapsed: float = 0.0

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.stats.requests, "crashes": self.stats.crashes, "tracebacks": len(self.tracebacks),
            "unanswered": self.stats.unanswered, "leftover_keys": self.leftover_keys,
            "violations": len(self.violations)}
        if self.exhaustion is not None:
            out["exhaustion"] = self.exhaustion.counts()
        return out | {"seed": self.seed}

    @property
    def failed(self) -> bool:
        s = self.summary()
        counts = any(v for k, v in s.items() if k not in ("requests", "seed", "exhaustion"))
        return counts or (self.exhaustion is not None and self.exhaustion.failed)

    def render(self) -> str:
        """The table, the distinct failures, tracebacks and violations: what a person reads after a run."""
        out = [self.stats.table(), ""]
        found = self.stats.findings.render()
        if found:
            out += [f"distinct failures ({len(found)}):", *found, ""]
        if self.tracebacks:
            out.append(f"tracebacks in process logs ({len(self.tracebacks)}):")
            seen: set[str] = set()
            for name, excerpt in self.tracebacks:
                last = excerpt.splitlines()[-1]
                if last in seen:
                    continue
                seen.add(last)
                out += [f"--- {name}", excerpt]
            out.append("")
        if self.exhaustion is not None:
            out.append(self.exhaustion.render())
        if self.leftover_keys:
            out.append(f"task keys left once idle: {self.leftover_detail}")
        for v in self.violations:
            out.append(f"violation: {v}")
        out.append(f"work dir (logs): {self.work}; {self.elapsed:.1f}s")
        return "\n".join(out)

    def json_line(self) -> str:
        return json.dumps(self.summary())


class FuzzCluster:
    """The processes of one fuzzing run and the leader-following client the checks use."""

    def __init__(self, etcd: EtcdCluster, root: str, work: Path, opts: FuzzOptions,
                 say: Callable[[str], None] = lambda _s: None):
        self.etcd, self.root, self.work, self.opts, self.say = etcd, root, work, opts, say
        self.harness = Harness(etcd.endpoints, root, work, ttl=opts.ttl)
        self.kv: MetaKV | None = None
        self.client: QueryCoordClient | None = None
        self.query_nodes: list[Member] = []
        self.stream_nodes: list[Member] = []

    # ----- life cycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        h = self.harness
        coords = await asyncio.gather(*(h.start_coordinator(i, "127.0.0.1:0", "--scaled", *HTTP) for i in range(2)))
        self.client = QueryCoordClient([c.address for c in coords], deadline=30.0, call_timeout=10.0)
        await h.wait_leader(60)
        self.query_nodes = list(await asyncio.gather(*(
            h.start_node(QUERY_NODE, i, "--capacity-mb", "4096") for i in range(self.opts.query_nodes))))
        self.stream_nodes = list(await asyncio.gather(*(
            h.start_node(STREAM_NODE, i, "--vgroups", f"{2 * i + 1},{2 * i + 2}", "--snode", "--heartbeat-ms", "100",
                         "--groups", "2", "--init-delay-ms", "100") for i in range(self.opts.stream_nodes))))
        self.kv = MetaKV(await connect(self.etcd.config()), self.root)

    async def stop(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()
        await self.harness.stop(5)
        if self.kv is not None:
            with contextlib.suppress(Exception):
                await self.kv.client.close()

    # ----- addressing -------------------------------------------------------------------------------------------
    def coordinator(self, role: str) -> str:
        """The leader's address ("leader") or a running standby's ("standby"); any running one as a fallback."""
        coords = [m for m in self.harness.coordinators if m.running]
        leader = self.harness.leader
        if role == "leader" and leader is not None:
            return leader.address
        others = [m for m in coords if m is not leader]
        return (others or coords)[0].address

    def resolve(self, target: str) -> str:
        if target.startswith("node"):
            node = self.query_nodes[int(target[4:]) % len(self.query_nodes)]
            return str(node.ready.get("listen_address") or node.address)
        return self.coordinator(target)

    def targets(self) -> dict[str, list[str]]:
        # The leader gets most calls: the standby's answers are mostly the redirect.
        return {COORDINATOR: ["leader", "leader", "leader", "standby"],
                QUERY_NODE_SURFACE: [f"node{i}" for i in range(len(self.query_nodes))]}

    # ----- seeding ----------------------------------------------------------------------------------------------
    async def seed_world(self, world: World) -> None:
        """Real things to fuzz around: 3 collections with segments (the first loaded), an snode per stream node,
        2 streams. Everything through the public services, as a client would."""
        c = self.client
        assert c is not None
        world.query_nodes = [n.node_id for n in self.query_nodes]
        world.stream_nodes = [n.node_id for n in self.stream_nodes]
        world.vgroups = list(range(1, 2 * len(self.stream_nodes) + 1))
        world.coordinators = [m.address for m in self.harness.coordinators]
        for i in range(3):
            r = await c.catalog("CreateCollection", catalog_pb2.CreateCollectionRequest(
                collection_name=f"seed_{i}", num_partitions=2, num_dm_channels=2))
            _ok(r, "CreateCollection")
            world.learn(r)
            desc = r.collection
            segs = [data_pb2.SegmentBinlogs(partition_id=p.partition_id, num_rows=100, mem_size=1 << 16,
                                            binlog_paths=[f"seed/{desc.collection_id}/{p.partition_id}/{k}"])
                    for p in desc.partitions for k in range(3)]
            r2 = await c.catalog("AddSegments", catalog_pb2.AddSegmentsRequest(collection_id=desc.collection_id,
                                                                               segments=segs))
            _ok(r2, "AddSegments")
            for sid, seg in zip(r2.segment_ids, segs, strict=True):
                world.segments[sid] = (desc.collection_id, seg.partition_id)
        first = next(iter(world.collections))
        _ok(await c.query("LoadCollection", querycoord_pb2.LoadCollectionRequest(collection_id=first)),
            "LoadCollection")
        for n in self.stream_nodes:
            r3 = await c.stream("CreateSnode", stream_pb2.CreateSnodeRequest(node_id=n.node_id))
            _ok(r3, "CreateSnode")
            world.learn(r3)
        deadline = time.monotonic() + 30
        for i in range(2):
            req = stream_pb2.CreateStreamRequest(name=f"seed_s{i}", source_db="db", source_vgroup_ids=[1],
                                                 num_calc_subplans=1, runner_deploys=1)
            while True:
                r4 = await c.stream("CreateStream", req)
                if r4.status.error_code != EC.NO_AVAILABLE_NODE or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)  # the snodes' first heartbeats
            _ok(r4, "CreateStream")
            world.learn(r4)
        state = await c.query("GetCoordinatorState", querycoord_pb2.GetCoordinatorStateRequest())
        world.fence_revision = state.election_revision

    # ----- checks -----------------------------------------------------------------------------------------------
    async def task_keys(self) -> dict[str, int]:
        assert self.kv is not None
        return {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}

    async def wait_no_task_keys(self, timeout: float) -> dict[str, int]:
        """Task keys left after waiting up to ``timeout`` for them to drain (empty dict values: none left)."""
        deadline = time.monotonic() + timeout
        while True:
            keys = await self.task_keys()
            if not any(keys.values()) or time.monotonic() > deadline:
                return keys
            await asyncio.sleep(0.25)

    async def alive(self) -> list[str]:
        return [f"{m.child.name} exited with code {m.child.proc.returncode}" for m in self.harness.members
                if not m.running and m.state != "dead"]

    async def leader_serving(self, timeout: float = 30.0) -> list[str]:
        try:
            leader = await self.harness.wait_leader(timeout)
        except (TimeoutError, EOFError) as exc:
            return [f"no leader: {exc}"]
        try:
            async with grpc.aio.insecure_channel(leader.address) as ch:
                r = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=QUERYCOORD_SERVICE), timeout=10)
        except grpc.aio.AioRpcError as exc:
            return [f"leader {leader.label}: health check failed: {exc.code().name} {exc.details()}"]
        if r.status != health_pb2.HealthCheckResponse.SERVING:
            return [f"leader {leader.label} is {health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}"]
        return []

    async def catalog_problems(self) -> list[str]:
        """Half-written collections: a record without partitions, channels or its name; a name or a segment
        naming a collection or partition that does not exist."""
        assert self.kv is not None
        cs = catalog_store
        out: list[str] = []
        colls: dict[int, catalog_pb2.CollectionDescription] = {}
        for key, value in (await self.kv.load_prefix(cs.COLLECTIONS_PREFIX)).items():
            desc = catalog_pb2.CollectionDescription.FromString(value)
            colls[desc.collection_id] = desc
            if key != cs.collection_key(desc.collection_id):
                out.append(f"catalog: {key} holds collection {desc.collection_id}")
            if not desc.partitions:
                out.append(f"catalog: collection {desc.collection_id} has no partitions")
            if not desc.dm_channels:
                out.append(f"catalog: collection {desc.collection_id} has no DM channels")
        names = (await self.kv.load_prefix(cs.NAMES_PREFIX)).as_dict()
        for desc in colls.values():
            if names.get(cs.name_key(desc.name)) != str(desc.collection_id).encode():
                out.append(f"catalog: collection {desc.collection_id} ({desc.name!r}) has no name key pointing "
                           f"at it ({names.get(cs.name_key(desc.name))!r})")
        for key, value in names.items():
            if not value.isdigit() or int(value) not in colls:
                out.append(f"catalog: name key {key!r} -> {value!r}, no such collection")
        for key in (await self.kv.load_prefix(cs.SEGMENTS_PREFIX, keys_only=True)).as_dict():
            ref = cs.parse_segment_key(key)
            desc = colls.get(ref.collection_id)
            if desc is None or ref.partition_id not in {p.partition_id for p in desc.partitions}:
                out.append(f"catalog: segment key {key} of a collection or partition that does not exist")
        meta = QueryMeta(self.kv)
        await meta.reload()
        for info in meta.collections():
            if info.collection_id not in colls:
                out.append(f"query meta: collection {info.collection_id} is loaded but not in the catalog")
        return out

    async def stream_problems(self) -> list[str]:
        """Half-written streams and snodes: a stream without its name key or main snode, a dangling name,
        a broken ring."""
        assert self.kv is not None
        ss = stream_store
        out: list[str] = []
        snodes = [stream_pb2.SnodeInfo.FromString(v) for _, v in (await self.kv.load_prefix(ss.SNODES_PREFIX)).items()]
        out += [f"snode ring: {p}" for p in ss.check_ring(snodes)]
        snode_ids = {s.id for s in snodes}
        streams = {}
        for _, value in (await self.kv.load_prefix(ss.STREAMS_PREFIX)).items():
            sdef = stream_pb2.StreamDef.FromString(value)
            streams[sdef.id] = sdef
        names = (await self.kv.load_prefix(ss.NAMES_PREFIX)).as_dict()
        for sdef in streams.values():
            if names.get(ss.name_key(sdef.name)) != str(sdef.id).encode():
                out.append(f"stream {sdef.id} ({sdef.name!r}) has no name key pointing at it")
            if sdef.main_snode_id not in snode_ids:
                out.append(f"stream {sdef.id}: main snode {sdef.main_snode_id} does not exist ({sorted(snode_ids)})")
        for key, value in names.items():
            if not value.isdigit() or int(value) not in streams:
                out.append(f"stream name key {key!r} -> {value!r}, no such stream")
        return out

    async def streams_without_tasks(self, timeout: float = 20.0) -> list[str]:
        """Every stream the leader runs has its tasks (or a stop reason): polled, since redeploys take a beat."""
        assert self.client is not None
        deadline = time.monotonic() + timeout
        while True:
            problems: list[str] = []
            leader = self.harness.leader
            if leader is not None:
                self.client.prefer(leader.address)  # a standby answers ShowStreams itself, without tasks
            try:
                show = await self.client.stream("ShowStreams", stream_pb2.ShowStreamsRequest(with_tasks=True))
            except (CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
                problems = [f"ShowStreams: {exc}"]
            else:
                if show.status.error_code != EC.SUCCESS:
                    problems = [f"ShowStreams: {EC.ErrorCode.Name(show.status.error_code)} {show.status.reason}"]
                for info in show.streams:
                    sdef = info.stream
                    if sdef.user_stopped:
                        continue
                    if info.state == stream_pb2.STREAM_STOPPED_BY_ERROR and info.stop_reason:
                        continue
                    # Queued with a stated wait, which is true: its snode (and that snode's replica) is not live.
                    if (info.state == stream_pb2.STREAM_UNDEPLOYED and info.plan_queued and info.wait_reason
                            and sdef.main_snode_id not in show.live_snode_ids):
                        continue
                    if info.state == stream_pb2.STREAM_STATE_UNSPECIFIED or not info.tasks:
                        problems.append(f"stream {sdef.id} ({sdef.name}): state "
                                        f"{stream_pb2.StreamState.Name(info.state)}, {len(info.tasks)} tasks "
                                        f"(plan queued {info.plan_queued}, deploys {info.deploy_times}, retries "
                                        f"{info.retries}, next retry {info.next_retry_ms}, snodes "
                                        f"{sorted(show.live_snode_ids)}, main snode {sdef.main_snode_id})")
            if not problems or time.monotonic() > deadline:
                return problems
            await asyncio.sleep(0.25)

    async def meta_problems(self, timeout: float = 30.0) -> list[str]:
        """Query meta equals the nodes' distribution, no segment on two nodes, no task key (the failover drill's
        ``check`` with no expectations of its own): polled until it holds or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            catalog, meta, nodes, problems = await self._views()
            res = check({}, catalog, meta, nodes, task_keys={}, unanswered=[])  # task keys are counted apart
            details = problems + [d for d in res.details if d.startswith(("violation", "duplicate", "lost"))]
            if not details or time.monotonic() > deadline:
                return details
            await asyncio.sleep(0.5)

    async def _views(self) -> tuple[dict[int, CatalogColl], MetaView, dict[int, NodeView], list[str]]:
        assert self.kv is not None
        store = catalog_store.CatalogStore(self.kv)
        catalog: dict[int, CatalogColl] = {}
        for summary in await store.show_collections(with_stats=False):
            desc = await store.describe_collection(summary.collection_id)
            parts = {}
            for p in desc.partitions:
                _, binlogs = await store.get_recovery_info(desc.collection_id, p.partition_id)
                parts[p.partition_id] = frozenset(b.segment_id for b in binlogs)
            catalog[desc.collection_id] = CatalogColl(parts, frozenset(desc.dm_channels))
        meta = QueryMeta(self.kv)
        await meta.reload()
        view = MetaView()
        for info in meta.collections():
            view.collections[info.collection_id] = MetaColl(
                "collection" if info.load_type == data_pb2.LOAD_TYPE_COLLECTION else "partitions",
                int(info.in_memory_percentage), frozenset(p.partition_id for p in info.partitions))
            for s in meta.segments_of(info.collection_id):
                view.segments[s.segment_id] = (s.collection_id, s.partition_id, s.node_id)
            for w in meta.dm_channels_of(info.collection_id):
                view.channels[(info.collection_id, w.dm_channel)] = w.node_id
        nodes: dict[int, NodeView] = {}
        problems = []
        for n in self.query_nodes:
            async with grpc.aio.insecure_channel(self.resolve(f"node{self.query_nodes.index(n)}")) as ch:
                try:
                    d = await ch.unary_unary(
                        "/querycoord.node.QueryNode/GetDataDistribution",
                        request_serializer=querynode_pb2.GetDataDistributionRequest.SerializeToString,
                        response_deserializer=querynode_pb2.GetDataDistributionResponse.FromString,
                    )(querynode_pb2.GetDataDistributionRequest(), timeout=10)
                except grpc.aio.AioRpcError as exc:
                    problems.append(f"query node {n.node_id}: no distribution: {exc.code().name}")
                    continue
            nodes[n.node_id] = node_view(d)
        return catalog, view, nodes, problems

    async def loaded(self) -> set[int]:
        """Collections the leader shows loaded."""
        assert self.client is not None
        leader = self.harness.leader
        if leader is not None:
            self.client.prefer(leader.address)
        r = await self.client.query("ShowCollections", querycoord_pb2.ShowCollectionsRequest())
        return {c.collection_id for c in r.collections}

    def logs(self) -> list[tuple[str, str]]:
        return [(p.name, p.read_text(errors="replace")) for p in sorted(self.work.glob("*.log"))]


def _ok(resp: Any, what: str) -> None:
    if resp.status.error_code != EC.SUCCESS:
        raise RuntimeError(f"seeding: {what}: {EC.ErrorCode.Name(resp.status.error_code)} {resp.status.reason}")


async def consistency(cluster: FuzzCluster, when: str) -> list[str]:
    """Every after-run check but the task keys (counted apart), each problem prefixed with ``when``."""
    out = [*await cluster.alive(), *await cluster.leader_serving(), *await cluster.catalog_problems(),
           *await cluster.stream_problems(), *await cluster.streams_without_tasks(), *await cluster.meta_problems()]
    return [f"{when}: {p}" for p in out]


async def run_fuzz(etcd: EtcdCluster, root: str, work: Path, opts: FuzzOptions,
                   say: Callable[[str], None] = lambda _s: None) -> FuzzReport:
    """One run (see module docstring); every process is stopped before it returns."""
    started = time.monotonic()
    report = FuzzReport(seed=opts.seed, work=work)
    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    cluster = FuzzCluster(etcd, root, work, opts, say)
    try:
        await cluster.start()
        world = World()
        await cluster.seed_world(world)
        say(f"cluster up in {time.monotonic() - started:.1f}s: leader {cluster.coordinator('leader')}, query nodes "
            f"{world.query_nodes}, stream nodes {world.stream_nodes}, collections {sorted(world.collections)}; "
            f"logs in {work}")
        all_rpcs = rpcs()
        targets = cluster.targets()

        def produce(snapshot: World, index: int) -> list[Any]:
            return generate(CaseStrategies(all_rpcs, snapshot, targets=targets), opts.batch,
                            random.Random(f"{opts.seed}/{index}").getrandbits(64))

        progress = {"n": 0}

        def on_record(_rec: Any) -> None:
            progress["n"] += 1
            if progress["n"] % 1000 == 0:
                say(f"{progress['n']} requests sent")

        fuzzer = Fuzzer(cluster.resolve, world, clients=opts.clients, deadline=opts.deadline, on_record=on_record)
        t = time.monotonic()
        report.stats = await fuzzer.run(produce, opts.requests, batch=opts.batch)
        say(f"{report.stats.requests} requests in {time.monotonic() - t:.1f}s: {report.stats.crashes} crashes, "
            f"{report.stats.unanswered} unanswered")

        left = await cluster.wait_no_task_keys(opts.idle_timeout)
        report.leftover_keys, report.leftover_detail = sum(left.values()), left
        report.violations += await consistency(cluster, "after fuzzing")

        if opts.exhaustion is not None:
            report.exhaustion = await exhaustion(cluster, world, opts.exhaustion, say)
            report.violations += await consistency(cluster, "after exhaustion")

        if opts.failover:
            report.violations += await failover(cluster, opts, report, say)
        report.tracebacks = tracebacks(await asyncio.to_thread(cluster.logs))
    finally:
        await cluster.stop()
        report.elapsed = time.monotonic() - started
    return report


async def exhaustion(cluster: FuzzCluster, world: World, opts: ExhaustionOptions,
                     say: Callable[[str], None]) -> Exhaustion:
    """The resource-exhaustion phase against the leader, the standby and a third coordinator started with a
    principals file (so reads present the reader role's token and its status page is guarded); the third one is
    stopped afterwards, before the failover, since the nodes of this cluster hold no credential for it."""
    h = cluster.harness
    leader = await h.wait_leader(30)
    principals, reader = await asyncio.to_thread(write_principals, cluster.work)
    secured = await h.start_coordinator(len(h.coordinators), "127.0.0.1:0", "--scaled", *HTTP,
                                        "--auth-tokens-file", str(principals))
    try:
        others = [target(m, f"standby {m.label}", None) for m in h.coordinators
                  if m.running and m is not leader and m is not secured]
        found = await exhaust(h, target(leader, f"leader {leader.label}", None),
                              [*others, target(secured, f"secured standby {secured.label}", reader)],
                              next(iter(world.collections)), opts, say)
    finally:
        await h.kill(secured, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(15):
                await secured.child.proc.wait()
    say(f"exhaustion: {found.counts()}")
    return found


async def failover(cluster: FuzzCluster, opts: FuzzOptions, report: FuzzReport,
                   say: Callable[[str], None]) -> list[str]:
    """Kill the leader; the standby takes over, serves, keeps what was loaded; the checks hold again."""
    h = cluster.harness
    try:
        old = await h.wait_leader(30)
    except (TimeoutError, EOFError) as exc:
        return [f"failover: no leader to kill: {exc}"]
    before = await cluster.loaded()
    t = time.time()
    await h.kill(old, signal.SIGKILL)
    try:
        new = await h.wait_leader(60, after=t)
    except (TimeoutError, EOFError) as exc:
        return [f"failover: no takeover after killing {old.label}: {exc}"]
    say(f"failover: killed {old.label}, {new.label} leads after {time.time() - t:.1f}s")
    cluster.client.prefer(new.address)  # type: ignore[union-attr]
    out = []
    after = await cluster.loaded()
    if after != before:
        out.append(f"failover: loaded collections {sorted(before)} before, {sorted(after)} after")
    left = await cluster.wait_no_task_keys(opts.idle_timeout)
    if sum(left.values()) > report.leftover_keys:
        report.leftover_keys, report.leftover_detail = sum(left.values()), left
    out += await consistency(cluster, "after failover")
    return out


__all__ = ["FuzzCluster", "FuzzOptions", "FuzzReport", "consistency", "exhaustion", "failover", "run_fuzz"]
