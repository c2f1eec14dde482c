"""A stateful property-based chaos test of query coordination, against a real etcd.

Hypothesis drives a ``RuleBasedStateMachine`` over a real cluster: two
coordinators in this process (real gRPC servers, real sessions and
election), reference query nodes (real gRPC servers and sessions) and the
catalog in the same etcd. Its rules interleave, at random:

* Load/Release Collection/Partitions, one at a time, retried (the same
  request sent again at once, as a client that lost the answer would), or
  several sent together with ``asyncio.gather`` (duplicates and conflicting
  requests, with handoffs, compactions and balances mixed in);
* LoadBalance, handoff (new sealed segments in the catalog) and compaction
  (a segment that replaces others of its partition);
* a query node crashed (its gRPC server stopped at once; its session left
  to lapse after the TTL, or its lease revoked), restarted under its id, or
  added, with requests in flight; compaction chains (a segment compacted
  from one that was itself compacted, handed off at once);
* the leader crashed without resigning (the standby takes over once its
  lease lapses; a new standby is started), with requests in flight.

After every step, once the leader is quiescent (no trigger queued or running;
a bounded wait, so a stuck engine fails the test instead of hanging it), the
invariants hold (``querycoord.tooling.drill.invariants.check`` plus the checks below):
every call got, within its deadline, an answer the model explains (success
or a clear error code: never UNEXPECTED_ERROR, never NOT_LEADER, which the
client helper follows); query meta reloaded from etcd equals the leader's
memory and the distribution the nodes report; each segment is held exactly
once and only if its partition is loaded and it is in the catalog; every
segment and DM channel of a loaded partition is held; nothing of a released
collection is held; no task key is left in etcd and no trigger in memory.

Capacity (drawn per example): ample, or tight (nodes with room for about
two of the three replicas: collection 0 asks for two replicas, collection 1
for one), so that loads meet NO_AVAILABLE_NODE (no effect) and a lost
node's copies may have nowhere to go, as in a replica with no spare. Such a
(collection, replica) unit is excused from "every segment held" when it
cannot be placed (``querycoord.tooling.drill.placement``), never shown whole.
All along, a sampler (``tests.truth.InProcessSources``) compares what the
leader shows with what the nodes hold: no sample may show a replica or a
collection at 100 % while a copy it needs is on no online node of it
(``false full``), and no release may wait on a unit that waits for room.

The model: each collection is released, loaded as a whole, or loaded as a
set of partitions; a request's answer and effect follow from that state
(``step``). Requests sent together are explained by *some* serial order of
them (``explain``): the answers must match that order and the final state
must be one of its outcomes. A load answered CANCELLED is explained only by a
release of the same collection (or of one of its partitions) in that order
after it. Requests in flight while the leader crashes may also have taken
effect once before the answer the client got (its helper retries on the new
leader).

Budget: CI runs a small derandomized one (``SETTINGS``);
``QUERYCOORD_CHAOS_EXAMPLES`` / ``QUERYCOORD_CHAOS_STEPS`` raise it, draw
fresh seeds and shrink a failure to a minimal step sequence (``make chaos``).

Reading a failure: the message carries the steps of the failing example,
each followed by its notes (the answers, crashes, catalog changes), ending at
the step that failed. Hypothesis then replays the example to print it; a
failure that depends on timing may not recur then (``Flaky`` /
``FlakyStrategyDefinition``): the steps in the first message are the ones
that count. ``REPRODUCTIONS`` replays shrunk sequences on every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, Phase, note, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from loguru import logger

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogError, CatalogStore
from querycoord.net.client import CoordinatorUnavailable
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.querymeta import QueryMeta
from querycoord.querymeta.copies import copies
from querycoord.serving.process import CoordinatorProcess
from querycoord.tooling.drill.invariants import (
    UNCLEAR_CODES,
    CatalogColl,
    Expected,
    MetaColl,
    MetaView,
    check,
    node_view,
)
from querycoord.tooling.drill.sampler import Sampler
from querycoord.tooling.drill.samples import Disturbances, ReleaseCall, blocked_releases
from tests.cluster import QueryCluster, fast_scheduler
from tests.truth import InProcessSources

T = TypeVar("T")

# ----- budget ---------------------------------------------------------------------------------------------------------
_EXAMPLES = int(os.environ.get("QUERYCOORD_CHAOS_EXAMPLES") or 0)
_STEPS = int(os.environ.get("QUERYCOORD_CHAOS_STEPS") or 0)
CHAOS = bool(_EXAMPLES or _STEPS)
EXAMPLES = _EXAMPLES or 3
STEPS = _STEPS or 12
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=not CHAOS,
    deadline=None,
    database=None,
    print_blob=True,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    # A failing example is shrunk to a minimal step sequence only under ``make chaos``: each replay costs seconds.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if CHAOS else [])],
)

# ----- the cluster's shape and bounds ---------------------------------------------------------------------------------
N_COLLS, N_PARTS, N_SEGMENTS, N_CHANNELS = 2, 3, 9, 2
REPLICAS = (2, 1)  # replica_number of every load of collection 0, 1
MIN_NODES, MAX_NODES, START_NODES = 1, 4, 3
AMPLE, TIGHT = 1 << 30, 64 << 20  # node capacity; tight: a 9-segment replica (45 MiB) fits on one node, not two
SAMPLE_EVERY = 0.2  # seconds between two samples of what the leader shows while a step runs
RELEASE_BOUND = 15.0  # seconds beyond leader crashes a release may take while a unit waits for room
LEADER_KILLS = max(2, STEPS // 4)  # per run: each costs a TTL
TTL = 2.0  # sessions of coordinators and nodes (etcd's minimum lease)
NODE_FAULTS = FaultConfig(latency_ms=30)  # loads take a little while, so later requests meet them in flight
CALL_BOUND = 60.0  # hard bound on one client call (the helper's own deadline is shorter)
TAKEOVER_BOUND = 30.0
SETTLE_BOUND = 45.0  # quiescence plus invariants, repairs included

LOADS = frozenset({"LoadCollection", "LoadPartitions"})
# A load refused for want of nodes (more replicas than nodes) or of room (load admission: RESOURCE_EXHAUSTED; a
# plan that met no room: NO_AVAILABLE_NODE): it changed nothing.
NO_ROOM_CODES = frozenset({"NO_AVAILABLE_NODE", "ILLEGAL_ARGUMENT", "RESOURCE_EXHAUSTED"})
RELEASES = frozenset({"ReleaseCollection", "ReleasePartitions"})
REQUESTS = LOADS | RELEASES

State = tuple[str, frozenset[int]]  # ("released", {}), ("collection", {}), ("partitions", partition indexes)
RELEASED: State = ("released", frozenset())
COLLECTION: State = ("collection", frozenset())


@dataclass(frozen=True)
class Act:
    """One action of a rule: a QueryCoord request, a balance, or a catalog change (indexes, not ids)."""

    kind: str
    coll: int = 0
    parts: tuple[int, ...] = ()
    node: int = 0
    flag: bool = False  # LoadBalance: name a destination node
    wait: float = 0.0  # seconds before it is sent (in a group: it meets the others in flight)

    def __repr__(self) -> str:
        if self.kind in ("LoadCollection", "ReleaseCollection", "ShowCollections"):
            args = f"coll={self.coll}"
        elif self.kind in ("LoadPartitions", "ReleasePartitions", "AddSegments", "Compact", "CompactChain"):
            args = f"coll={self.coll}, parts={self.parts}"
        else:
            args = f"node={self.node}, flag={self.flag}"
        return f"Act({self.kind!r}, {args}{f', wait={self.wait}' if self.wait else ''})"


# ----- the model ------------------------------------------------------------------------------------------------------
def step(state: State, act: Act) -> tuple[str, State]:
    """The answer a request gets in ``state`` when it runs alone, and the state after it."""
    kind, loaded = state
    parts = frozenset(act.parts)
    if act.kind == "LoadCollection":
        return ("CONFLICT", state) if kind == "partitions" else ("SUCCESS", COLLECTION)
    if act.kind == "ReleaseCollection":
        return "SUCCESS", RELEASED
    if act.kind == "LoadPartitions":
        if kind == "collection":
            return "CONFLICT", state
        if parts & loaded and not parts <= loaded:
            return "CONFLICT", state
        return "SUCCESS", ("partitions", loaded | parts)
    if act.kind == "ReleasePartitions":
        if kind == "collection":
            return "CONFLICT", state
        left = loaded - parts
        return "SUCCESS", ("partitions", left) if left else RELEASED
    raise AssertionError(f"not a request: {act}")


def cancels(release: Act, load: Act) -> bool:
    """A release of the collection, or of one of the load's partitions, may cancel a load still in flight."""
    if release.kind == "ReleaseCollection":
        return True
    if release.kind == "ReleasePartitions":
        return load.kind == "LoadCollection" or bool(set(release.parts) & set(load.parts))
    return False


@dataclass(frozen=True)
class Call:
    act: Act
    code: str | None  # None: an unanswered attempt the client retried (it may or may not have taken effect)
    sent: float = 0.0
    answered: float = 0.0


def _real_time_ok(seq: list[Call]) -> bool:
    """A call answered before another was sent comes first in the order."""
    return not any(b.answered < a.sent for i, a in enumerate(seq) for b in seq[i + 1:])


def explain(start: State, calls: list[Call], *, hidden_attempts: bool = False) -> set[State]:
    """The final states of every serial order of ``calls`` (one collection) that explains their answers.

    With ``hidden_attempts`` each answered call may also have taken effect
    once before its answer (a first attempt lost in a leader crash).
    """
    answered = [c for c in calls if c.code is not None]
    hidden = [Call(c.act, None, c.sent, c.answered) for c in answered] if hidden_attempts else []
    outcomes: set[State] = set()
    for mask in range(1 << len(hidden)):
        items = answered + [h for i, h in enumerate(hidden) if mask >> i & 1]
        for order in itertools.permutations(range(len(items))):
            # A hidden attempt comes before its own answered call.
            pos = {o: k for k, o in enumerate(order)}
            extra = [i for i in range(len(answered), len(items))]
            owner = [i for i in range(len(hidden)) if mask >> i & 1]
            if any(pos[e] > pos[o] for e, o in zip(extra, owner, strict=True)):
                continue
            seq = [items[o] for o in order]
            if not _real_time_ok(seq):
                continue
            state: State | None = start
            for k, c in enumerate(seq):
                assert state is not None
                code, after = step(state, c.act)
                if c.code is None or c.code == code:
                    state = after
                elif c.code == "CANCELLED" and c.act.kind in LOADS and any(
                        later.code in (None, "SUCCESS") and cancels(later.act, c.act) for later in seq[k + 1:]):
                    continue  # cancelled before it took effect
                elif c.code in NO_ROOM_CODES and c.act.kind in LOADS:
                    continue  # no node or no room for it: refused, nothing changed
                else:
                    state = None
                    break
            if state is not None:
                outcomes.add(state)
    return outcomes


# The steps of the running example, with their notes: a failure carries them in its message, as a
# timing-dependent failure may not recur when Hypothesis replays the example to print it.
_TRACE: list[str] = []


def _note(text: str) -> None:
    """Hypothesis prints notes with the failing example; a replay outside Hypothesis prints them."""
    _TRACE.append(text)
    try:
        note(text)
    except InvalidArgument:
        print(text)


def traced(fn: Callable[..., None]) -> Callable[..., None]:
    """Record a rule's call in the trace; an assertion failing in it carries the whole trace."""
    @functools.wraps(fn)
    def wrapper(self: Any, **kwargs: Any) -> None:
        if fn.__name__ != "settled_and_consistent":  # the invariant runs after every step
            _TRACE.append(f"state.{fn.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        try:
            fn(self, **kwargs)
        except AssertionError as exc:
            _TRACE.append("  ^ failed here")
            raise AssertionError(f"{exc}\n\nsteps of this example, each followed by its notes:\n"
                                 + "\n".join(_TRACE)) from None
    return wrapper


# ----- crashes --------------------------------------------------------------------------------------------------------
async def crash_coordinator(c: CoordinatorProcess) -> None:
    """Stop a coordinator as a crash would: no resignation, no more writes; its lease lapses after the TTL."""
    await c.crash()


async def crash_node(n: QueryNode, *, revoke: bool) -> None:
    """Stop serving at once (in-flight calls are cut); the session lapses after its TTL, or is revoked now."""
    await n.crash(revoke=revoke)


# ----- strategies -----------------------------------------------------------------------------------------------------
_colls = st.integers(0, N_COLLS - 1)
_parts = st.lists(st.integers(0, N_PARTS - 1), min_size=1, max_size=N_PARTS, unique=True).map(
    lambda ps: tuple(sorted(ps)))
_one_part = st.integers(0, N_PARTS - 1).map(lambda p: (p,))


_no_wait = st.just(0.0)
_waits = st.sampled_from([0.0, 0.05, 0.15, 0.4])


def _requests_on(colls: st.SearchStrategy[int], waits: st.SearchStrategy[float] = _no_wait
                 ) -> st.SearchStrategy[Act]:
    return st.one_of(
        st.builds(Act, st.just("LoadCollection"), colls, wait=waits),
        st.builds(Act, st.just("ReleaseCollection"), colls, wait=waits),
        st.builds(Act, st.just("LoadPartitions"), colls, _parts, wait=waits),
        st.builds(Act, st.just("ReleasePartitions"), colls, _parts, wait=waits),
    )


def _side_acts_on(colls: st.SearchStrategy[int], waits: st.SearchStrategy[float] = _no_wait
                  ) -> st.SearchStrategy[Act]:
    return st.one_of(
        st.builds(Act, st.just("AddSegments"), colls, _one_part, wait=waits),
        st.builds(Act, st.just("Compact"), colls, _one_part, wait=waits),
        st.builds(Act, st.just("CompactChain"), colls, _one_part, wait=waits),
        st.builds(Act, st.just("LoadBalance"), node=st.integers(0, MAX_NODES - 1), flag=st.booleans(), wait=waits),
        st.builds(Act, st.just("ShowCollections"), colls, wait=waits),
    )


requests = _requests_on(_colls)
single_acts = st.one_of(requests, _side_acts_on(_colls))
_timed_acts = st.one_of(_requests_on(_colls, _waits), _side_acts_on(_colls, _waits))
# Together: mostly one collection (conflicts), sometimes the same request twice; some sent a little later,
# so that they meet the others in flight (a load is answered once planned and runs on).
groups = st.one_of(
    _colls.flatmap(lambda c: st.lists(st.one_of(_requests_on(st.just(c), _waits), _side_acts_on(st.just(c), _waits)),
                                      min_size=2, max_size=3)),
    st.tuples(requests, _waits).map(lambda aw: [aw[0], replace(aw[0], wait=aw[1])]),
    st.lists(_timed_acts, min_size=2, max_size=3),
)
in_flight = st.lists(_timed_acts, min_size=0, max_size=2)


# ----- the machine ----------------------------------------------------------------------------------------------------
class ChaosMachine(RuleBasedStateMachine):
    etcd: EtcdCluster  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.root = f"test/chaos-{uuid.uuid4().hex[:12]}"
        self.cluster = QueryCluster(self.etcd, self.root, session_ttl=TTL,
                                    scheduler=fast_scheduler(max_request_bytes=600, max_concurrent_children=2))
        self.catalog: CatalogStore | None = None
        self.cids: list[int] = []
        self.pids: dict[int, list[int]] = {}
        self.model: dict[int, set[State]] = {}  # collection -> possible states (one, once settled)
        self.last: dict[int, str] = {}
        self.killed: set[int] = set()
        self.leader_kills = 0
        self.capacity = AMPLE
        self.sampler: Sampler | None = None
        self.sources: InProcessSources | None = None
        self.leader_crashes = Disturbances()  # a release is not timed while its leader is down
        self.false_full: list[str] = []  # what the samples found since the last check
        self.releases: list[ReleaseCall] = []
        _TRACE.clear()
        try:
            self.run(self._setup(), 60)
        except BaseException:
            self.teardown()
            raise

    # ----- plumbing ---------------------------------------------------------------------------------------------
    def run(self, coro: Awaitable[T], bound: float) -> T:
        """Run on the machine's own loop, bounded: a stuck engine fails the step instead of hanging the test."""
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coro, bound))  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise AssertionError(f"the step did not finish within {bound:.0f}s (stuck)") from exc

    async def _setup(self) -> None:
        c = self.cluster
        await c.__aenter__()
        assert c.kv is not None
        self.catalog = CatalogStore(c.kv)
        await c.start_coordinator()
        await c.wait_leader()
        await c.start_coordinator()
        assert c.client is not None
        c.client.deadline, c.client.call_timeout = 40.0, 20.0
        for i in range(N_COLLS):
            desc, _ = await self.catalog.create_bulk_collection(
                f"chaos{i}", num_partitions=N_PARTS, num_segments=N_SEGMENTS, num_channels=N_CHANNELS)
            self.cids.append(desc.collection_id)
            self.pids[desc.collection_id] = sorted(p.partition_id for p in desc.partitions)
            self.model[desc.collection_id] = {RELEASED}
        self.sources = InProcessSources(c, self.cids)
        self.sampler = Sampler(self.sources, now=time.monotonic, disturbances=self.leader_crashes)

    @initialize(tight=st.booleans())
    @traced
    def nodes_with_capacity(self, tight: bool) -> None:
        """The query nodes, with room for every replica or (``tight``) about two of the three."""
        self.capacity = TIGHT if tight else AMPLE

        async def start() -> None:
            for _ in range(START_NODES):
                await self._add_node()

        self.run(start(), 60)
        _note(f"  nodes {[n.node_id for n in self.cluster.nodes]} with {self.capacity >> 20} MiB each")

    def teardown(self) -> None:
        async def close() -> None:
            if self.sources is not None:
                with contextlib.suppress(Exception):
                    await self.sources.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.cluster.__aexit__(None, None, None), 30)

        try:
            self.loop.run_until_complete(close())
            for _ in range(3):  # cancelling may start more (clean-ups)
                pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                if not pending:
                    break
                for t in pending:
                    t.cancel()
                self.loop.run_until_complete(asyncio.wait(pending, timeout=10))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    async def _add_node(self) -> QueryNode:
        assert self.cluster.kv is not None
        n = QueryNode(self.cluster.kv, capacity_bytes=self.capacity, ttl=TTL, faults=NODE_FAULTS)
        await n.start()
        self.cluster.nodes.append(n)
        return n

    def _leader(self) -> CoordinatorProcess | None:
        leaders = [c for c in self.cluster.coords if c.coord.is_leader]
        return leaders[0] if len(leaders) == 1 else None

    # ----- actions ----------------------------------------------------------------------------------------------
    def _request(self, act: Act) -> tuple[str, Any]:
        cid = self.cids[act.coll]
        pids = [self.pids[cid][p] for p in act.parts]
        if act.kind == "LoadCollection":
            return act.kind, qc.LoadCollectionRequest(collection_id=cid, replica_number=REPLICAS[act.coll])
        if act.kind == "ReleaseCollection":
            return act.kind, qc.ReleaseCollectionRequest(collection_id=cid)
        if act.kind == "LoadPartitions":
            return act.kind, qc.LoadPartitionsRequest(collection_id=cid, partition_ids=pids,
                                                      replica_number=REPLICAS[act.coll])
        if act.kind == "ReleasePartitions":
            return act.kind, qc.ReleasePartitionsRequest(collection_id=cid, partition_ids=pids)
        if act.kind == "ShowCollections":
            return act.kind, qc.ShowCollectionsRequest(collection_ids=[cid])
        raise AssertionError(act)

    async def _call(self, method: str, req: Any) -> tuple[str, str]:
        """(code name, reason); an unanswered call or an unclear answer fails the step."""
        assert self.cluster.client is not None
        started = time.monotonic()
        try:
            resp = await asyncio.wait_for(self.cluster.client.query(method, req), CALL_BOUND)
        except (CoordinatorUnavailable, grpc.aio.AioRpcError, TimeoutError) as exc:
            raise AssertionError(f"{method} {_brief(req)} got no answer within its deadline: {exc!r}") from exc
        code = common_pb2.ErrorCode.Name(resp.status.error_code)
        _note(f"  {method} {_brief(req)} -> {code} {resp.status.reason[:160]} ({time.monotonic() - started:.2f}s)")
        if code in UNCLEAR_CODES or code == "TIMEOUT":
            raise AssertionError(f"{method} {_brief(req)} answered {code}, not a clear answer: {resp.status.reason}")
        return code, resp.status.reason

    async def _act(self, act: Act) -> Call | None:
        """Do one action; a request returns its Call (for the model), the rest None."""
        if act.wait:
            await asyncio.sleep(act.wait)
        if act.kind in REQUESTS:
            sent = time.monotonic()
            code, _ = await self._call(*self._request(act))
            if act.kind in RELEASES:
                self.releases.append(ReleaseCall(f"{act!r}", sent, time.monotonic(), code))
            return Call(act, code, sent, time.monotonic())
        if act.kind == "ShowCollections":
            code, _ = await self._call(*self._request(act))
            assert code in ("SUCCESS", "NOT_FOUND"), f"ShowCollections answered {code}"
            return None
        if act.kind == "LoadBalance":
            await self._balance(act)
            return None
        await self._catalog_change(act)
        return None

    async def _balance(self, act: Act) -> None:
        nodes = list(self.cluster.nodes)
        src = nodes[act.node % len(nodes)].node_id
        dst = [n.node_id for n in nodes if n.node_id != src][:1] if act.flag else []
        code, reason = await self._call("LoadBalance", qc.LoadBalanceRequest(source_node_ids=[src],
                                                                             dst_node_ids=dst))
        gone = {src, *dst} & self.killed
        # Clear refusals: no room for the moved copies (tight nodes); a named destination that serves another
        # replica of a collection the source holds (copies move within their replica).
        allowed = {"SUCCESS", "NO_AVAILABLE_NODE", *(("NOT_FOUND",) if gone else ()),
                   *(("ILLEGAL_ARGUMENT",) if dst else ())}
        assert code in allowed, f"LoadBalance from {src} to {dst} answered {code}: {reason}"

    async def _catalog_change(self, act: Act) -> None:
        """Handoff (new sealed segments) or compaction (one segment replacing up to two of its partition)."""
        assert self.catalog is not None
        cid = self.cids[act.coll]
        pid = self.pids[cid][act.parts[0]]
        seg = data_pb2.SegmentBinlogs(collection_id=cid, partition_id=pid, num_rows=1000, mem_size=1 << 20,
                                      binlog_paths=[f"insert_log/{cid}/{pid}/chaos-{uuid.uuid4().hex[:8]}"])
        if act.kind == "CompactChain":
            await self._compact_chain(cid, pid)
            return
        if act.kind == "Compact":
            _, binlogs = await self.catalog.get_recovery_info(cid, pid)
            sources = sorted(b.segment_id for b in binlogs)[:2]
            if not sources:
                _note(f"  Compact {cid}/{pid}: nothing to compact")
                return
            seg.compaction_from.extend(sources)
        try:
            ids = await self.catalog.add_segments([seg])
        except CatalogError as exc:  # a concurrent compaction took the same sources: the catalog refuses, fine
            _note(f"  {act.kind} {cid}/{pid}: catalog refused: {exc}")
            return
        sources = f" from {list(seg.compaction_from)}" if seg.compaction_from else ""
        _note(f"  {act.kind} {cid}/{pid}: segment {ids[0]}{sources}")

    async def _compact_chain(self, cid: int, pid: int) -> None:
        """Two segments compacted into one, which is compacted at once with a third: the second handoff names a
        source that was itself a compaction result (handed off, or not yet)."""
        assert self.catalog is not None
        _, binlogs = await self.catalog.get_recovery_info(cid, pid)
        size = {b.segment_id: b.mem_size for b in binlogs}
        sources = sorted(size)[:3]
        if len(sources) < 3:
            _note(f"  CompactChain {cid}/{pid}: nothing to compact")
            return
        made: list[int] = []
        for step_sources in (sources[:2], None):
            srcs = step_sources if step_sources is not None else [made[0], sources[2]]
            seg = data_pb2.SegmentBinlogs(collection_id=cid, partition_id=pid, num_rows=1000,
                                          mem_size=sum(size[s] for s in srcs), compaction_from=srcs,
                                          binlog_paths=[f"insert_log/{cid}/{pid}/chain-{uuid.uuid4().hex[:8]}"])
            try:
                made += await self.catalog.add_segments([seg])
            except CatalogError as exc:  # a concurrent compaction took a source: the catalog refuses, fine
                _note(f"  CompactChain {cid}/{pid}: catalog refused: {exc}")
                return
            size[made[-1]] = seg.mem_size
        _note(f"  CompactChain {cid}/{pid}: {sources[:2]} -> {made[0]}, then {[made[0], sources[2]]} -> {made[1]}")

    async def _together(self, acts: Iterable[Act], *extra: Awaitable[Any]) -> list[Call]:
        """The acts (and ``extra``) at once, while the sampler compares what the leader shows with what the nodes
        hold (``tests.truth``)."""
        work = asyncio.gather(*(self._act(a) for a in acts), *extra)
        sampling = asyncio.create_task(self._sample_while(work))
        try:
            results = await work
        finally:
            await sampling
        return [r for r in results if isinstance(r, Call)]

    async def _sample_while(self, work: asyncio.Future[Any]) -> None:
        assert self.sampler is not None
        while not work.done():
            with contextlib.suppress(Exception):  # a sample that cannot be taken (a leader crash) is no verdict
                found = await self.sampler.sample_once()
                for f in found:
                    _note(f"  FALSE FULL: {f}")
                self.false_full += found
            await asyncio.sleep(SAMPLE_EVERY)

    def _account(self, calls: list[Call], what: str, *, hidden_attempts: bool = False) -> None:
        """Fold answered requests into the model; answers no serial order explains fail the step."""
        for i, cid in enumerate(self.cids):
            mine = [c for c in calls if c.act.coll == i]
            if not mine:
                continue
            outcomes: set[State] = set()
            for start in self.model[cid]:
                outcomes |= explain(start, mine, hidden_attempts=hidden_attempts)
            if not outcomes:
                raise AssertionError(
                    f"{what}: no serial order of the requests explains their answers for collection {cid} "
                    f"(from {_states(self.model[cid])}): {[(c.act, c.code) for c in mine]}")
            self.model[cid] = outcomes
            self.last[cid] = f"{what}: {[(c.act, c.code) for c in mine]}"

    # ----- rules ------------------------------------------------------------------------------------------------
    @rule(act=single_acts)
    @traced
    def one(self, act: Act) -> None:
        calls = self.run(self._together([act]), CALL_BOUND + 10)
        self._account(calls, f"one {act}")

    @rule(act=requests, times=st.integers(2, 3))
    @traced
    def retried(self, act: Act, times: int) -> None:
        """The same request again at once, as a client that did not get (or trust) the answer."""
        for _ in range(times):
            calls = self.run(self._together([act]), CALL_BOUND + 10)
            self._account(calls, f"retried {act}")

    @rule(acts=groups)
    @traced
    def together(self, acts: list[Act]) -> None:
        calls = self.run(self._together(acts), CALL_BOUND + 10)
        self._account(calls, f"together {acts}")

    @precondition(lambda self: len(self.cluster.nodes) > MIN_NODES)
    @rule(index=st.integers(0, MAX_NODES - 1), revoke=st.booleans(), during=in_flight)
    @traced
    def kill_node(self, index: int, revoke: bool, during: list[Act]) -> None:
        node = self.cluster.nodes[index % len(self.cluster.nodes)]
        _note(f"  crash node {node.node_id} ({'lease revoked' if revoke else 'session left to lapse'})")

        async def kill() -> None:
            await asyncio.sleep(0.02)  # the requests go out first
            self.killed.add(node.node_id)
            self.cluster.nodes.remove(node)
            await crash_node(node, revoke=revoke)

        calls = self.run(self._together(during, kill()), CALL_BOUND + 10)
        self._account(calls, f"kill_node with {during}")

    @precondition(lambda self: len(self.cluster.nodes) < MAX_NODES)
    @rule(during=in_flight)
    @traced
    def add_node(self, during: list[Act]) -> None:
        calls = self.run(self._together(during, self._add_node()), CALL_BOUND + 10)
        _note(f"  added node {self.cluster.nodes[-1].node_id}")
        self._account(calls, f"add_node with {during}")

    @precondition(lambda self: self.leader_kills < LEADER_KILLS)
    @rule(during=in_flight)
    @traced
    def kill_leader(self, during: list[Act]) -> None:
        """The leader crashes (no resignation); the standby takes over after the TTL; a new standby starts."""
        self.leader_kills += 1

        async def go() -> list[Call]:
            leader = await self.cluster.wait_leader()
            _note(f"  crash leader {leader.address}")
            window = self.leader_crashes.open(time.monotonic())

            async def kill() -> None:
                await asyncio.sleep(0.02)
                self.cluster.coords.remove(leader)
                await crash_coordinator(leader)
                assert self.cluster.client is not None
                with contextlib.suppress(ValueError):
                    self.cluster.client.addresses.remove(leader.address)

            calls = await self._together(during, kill())
            new = await self.cluster.wait_leader(TAKEOVER_BOUND)
            _note(f"  {new.address} took over")
            await self.cluster.start_coordinator()
            self.leader_crashes.close(window, time.monotonic() + TTL)
            return calls

        calls = self.run(go(), CALL_BOUND + TAKEOVER_BOUND + 20)
        self._account(calls, f"kill_leader with {during}", hidden_attempts=True)

    @precondition(lambda self: len(self.cluster.nodes) > MIN_NODES)
    @rule(index=st.integers(0, MAX_NODES - 1), revoke=st.booleans(), during=in_flight)
    @traced
    def restart_node(self, index: int, revoke: bool, during: list[Act]) -> None:
        """A query node crashes and starts again under its id: unless its lease was revoked, the new process
        waits for the old session to lapse; it holds nothing of what the old one held."""
        node = self.cluster.nodes[index % len(self.cluster.nodes)]
        _note(f"  restart node {node.node_id} ({'lease revoked' if revoke else 'session left to lapse'})")

        async def restart() -> None:
            await asyncio.sleep(0.02)
            self.killed.add(node.node_id)  # a balance naming it meanwhile may find it gone
            self.cluster.nodes.remove(node)
            await crash_node(node, revoke=revoke)
            assert self.cluster.kv is not None
            back = QueryNode(self.cluster.kv, capacity_bytes=self.capacity, ttl=TTL, faults=NODE_FAULTS,
                             node_id=node.node_id)
            await back.start()
            self.cluster.nodes.append(back)

        calls = self.run(self._together(during, restart()), CALL_BOUND + 10)
        self._account(calls, f"restart_node with {during}")

    # ----- invariants -------------------------------------------------------------------------------------------
    @invariant()
    @traced
    def settled_and_consistent(self) -> None:
        deadline = time.monotonic() + SETTLE_BOUND

        async def settle() -> list[str]:
            while True:
                found = await self._problems()
                if not found or time.monotonic() > deadline:
                    if not found and self.sampler is not None:  # and what it shows once settled
                        self.false_full += await self.sampler.sample_once()
                    return found
                await asyncio.sleep(0.2)

        problems = self.run(settle(), SETTLE_BOUND + 30)
        if problems:
            detail = "\n  ".join(problems[:40])
            raise AssertionError(f"not quiescent and consistent after {SETTLE_BOUND:.0f}s:\n  {detail}\n"
                                 f"model: {self._model_text()}")
        false_full, self.false_full = self.false_full, []
        assert not false_full, "the leader showed whole what the nodes did not hold:\n  " + "\n  ".join(
            false_full[:20])
        assert self.sampler is not None
        blocked = blocked_releases(self.releases, self.sampler.waits, self.leader_crashes, bound=RELEASE_BOUND)
        self.releases = []
        assert not blocked, "releases waited on units waiting for room:\n  " + "\n  ".join(blocked)

    async def _problems(self) -> list[str]:
        """Everything wrong now (empty: quiescent and every invariant holds)."""
        c = self.cluster
        leader = self._leader()
        if leader is None:
            return [f"leaders among live coordinators: {[x.address for x in c.coords if x.coord.is_leader]}"]
        lead = leader.coord.leadership
        assert lead is not None
        sched = lead.scheduler
        busy = [f"{t.describe()} ({t.state})" for t in list(sched.triggers.values())[:5]]
        if busy:
            return [f"triggers still queued or running on the leader: {busy}"]
        for attr in ("_running", "_busy"):
            left = getattr(sched, attr, None)
            if left:
                return [f"scheduler.{attr} not empty with no trigger: {left!r}"[:300]]
        live = {n.node_id for n in c.nodes}
        known = {nid: n.online for nid, n in lead.nodes.nodes.items()}
        if set(known) != live or not all(known.values()):
            return [f"the leader's nodes {known} are not the live nodes {sorted(live)}"]
        unhealthy = [n.node_id for n in c.nodes if not n.healthy]
        if unhealthy:
            return [f"live nodes lost their session: {unhealthy}"]
        keys = await c.task_keys()
        if any(keys.values()):
            return [f"task keys left with no trigger in memory: {keys}"]

        assert c.kv is not None
        fresh = QueryMeta(c.kv)
        await fresh.reload()
        problems: list[str] = []
        mem, disk = lead.meta.records(), fresh.records()
        if mem != disk:
            diff = sorted(k for k in set(mem) | set(disk) if mem.get(k) != disk.get(k))
            problems.append(f"the leader's query meta differs from etcd at {diff[:8]}")
        catalog = await self._catalog_view()
        meta = _meta_view(fresh, self.cids)
        nodes = {n.node_id: node_view(n.state.distribution()) for n in c.nodes}
        expected, unexplained = self._expected(meta)
        assert self.sampler is not None
        # A (collection, replica) that cannot be placed now (no node, no room) may lack copies; never be shown whole.
        unplaceable = await self.sampler.unplaceable({cid: (m.partitions, m.replicas)
                                                      for cid, m in meta.collections.items()})
        res = check(expected, catalog, meta, nodes, task_keys=keys, unanswered=[], unplaceable=unplaceable)
        problems += unexplained + res.details
        # Compaction sources kept while what they were compacted into waits for room are no stale copies (check).
        in_catalog = {sid for cc in catalog.values() for sids in cc.partitions.values() for sid in sids}
        in_catalog |= res.kept_sources
        for nid, nv in sorted(nodes.items()):
            stale = sorted(set(nv.segments) - in_catalog)
            if stale:
                problems.append(f"node {nid} holds segments no longer in the catalog (compacted away): {stale}")
        stale_meta = sorted(set(meta.segments) - in_catalog)
        if stale_meta:
            problems.append(f"query meta keeps segments no longer in the catalog: {stale_meta}")
        if not problems:
            for cid in self.cids:  # settled: the model takes the state the cluster chose among the explained ones
                self.model[cid] = {_meta_state(meta, cid, self.pids[cid])}
        return problems

    def _expected(self, meta: MetaView) -> tuple[dict[int, Expected], list[str]]:
        """What the checker expects of each collection, and where the cluster chose a state no answer explains."""
        out, problems = {}, []
        for cid in self.cids:
            actual = _meta_state(meta, cid, self.pids[cid])
            states = self.model[cid]
            if actual not in states:
                problems.append(f"collection {cid} is {_states({actual})} in query meta; the answers explain only "
                                f"{_states(states)} (last: {self.last.get(cid, 'none')})")
            kind, parts = actual if actual in states else sorted(states, key=repr)[0]
            pids = frozenset(self.pids[cid][p] for p in parts)
            out[cid] = Expected(kind, pids, self.last.get(cid, ""))  # type: ignore[arg-type]
        return out, problems

    async def _catalog_view(self) -> dict[int, CatalogColl]:
        assert self.catalog is not None
        out = {}
        for cid in self.cids:
            desc = await self.catalog.describe_collection(cid)
            parts = {}
            sources: dict[int, tuple[int, ...]] = {}
            for p in desc.partitions:
                _, binlogs = await self.catalog.get_recovery_info(cid, p.partition_id)
                parts[p.partition_id] = frozenset(b.segment_id for b in binlogs)
                sources.update((b.segment_id, tuple(b.compaction_from)) for b in binlogs if b.compaction_from)
            out[cid] = CatalogColl(parts, frozenset(desc.dm_channels), sources)
        return out

    def _model_text(self) -> str:
        return "; ".join(f"{cid}: {_states(self.model[cid])}" for cid in self.cids)


def _states(states: Iterable[State]) -> str:
    return " | ".join(sorted(f"{k}{sorted(p) if p else ''}" for k, p in states))


def _brief(req: Any) -> str:
    return " ".join(str(req).split())[:120]


def _meta_view(meta: QueryMeta, cids: list[int]) -> MetaView:
    view = MetaView()
    for info in meta.collections():
        kind = "collection" if info.load_type == data_pb2.LOAD_TYPE_COLLECTION else "partitions"
        view.collections[info.collection_id] = MetaColl(kind, int(info.in_memory_percentage),
                                                        frozenset(p.partition_id for p in info.partitions),
                                                        {r.replica_id: frozenset(r.node_ids) for r in info.replicas})
    for cid in {*cids, *view.collections}:
        for s in meta.segments_of(cid):
            view.segments[s.segment_id] = (s.collection_id, s.partition_id, copies(s))
        for w in meta.dm_channels_of(cid):
            view.channels[(cid, w.dm_channel)] = copies(w)
    return view


def _meta_state(meta: MetaView, cid: int, pids: list[int]) -> State:
    m = meta.collections.get(cid)
    if m is None:
        return RELEASED
    if m.load_type == "collection":
        return COLLECTION
    return "partitions", frozenset(pids.index(p) for p in m.partitions if p in pids)


# ----- the test -------------------------------------------------------------------------------------------------------
@pytest.fixture
def quiet_logs():
    """Coordinators and nodes log at INFO; keep warnings only (the default handler is restored after)."""
    logger.remove()
    handler = logger.add(sys.stderr, level="WARNING")
    yield
    logger.remove(handler)
    logger.add(sys.stderr)


@pytest.mark.timeout(max(600, EXAMPLES * STEPS * 60) if CHAOS else 600)
def test_query_coordination_model_under_chaos(etcd: EtcdCluster, quiet_logs: None) -> None:
    ChaosMachine.etcd = etcd
    run_state_machine_as_test(ChaosMachine, settings=SETTINGS)


# ----- minimal reproductions, replayed step by step ----------------------------------------------------------------
# Sequences Hypothesis shrank failures to (``make chaos``), as (rule, arguments); each is replayed on a fresh
# cluster with the invariants checked after every step, as the machine does. Timing-dependent ones may pass
# by chance on a broken engine; none may fail on a correct one.
REPRODUCTIONS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    # The same LoadPartitions sent again while the first one runs was answered CONFLICT ("already loaded
    # while [] are not"): the partition was in meta and a trigger of the collection was pending.
    "retried_load_partitions": [("retried", {"act": Act("LoadPartitions", coll=0, parts=(0,)), "times": 2})],
    # LoadCollection and LoadPartitions sent together: both were queued, the LoadPartitions answered SUCCESS,
    # the LoadCollection failed its pre-check (CONFLICT) and its roll-back released the whole collection,
    # partitions of the other request included.
    "failed_load_rolls_back_another": [
        ("together", {"acts": [Act("LoadCollection", coll=0), Act("LoadPartitions", coll=0, parts=(0,))]})],
    # A ReleasePartitions of a partition that was not loaded, sent while a LoadPartitions of another one ran,
    # cancelled that load (answered SUCCESS): both answered SUCCESS and the collection ended released.
    "unrelated_release_cancels_load": [("together", {"acts": [
        Act("LoadPartitions", coll=0, parts=(0,)), Act("ReleasePartitions", coll=0, parts=(1,), wait=0.05)]})],
    # A LoadCollection in flight when the leader crashed, answered SUCCESS by the new leader (the client
    # helper retried there), stayed at 0 % with nothing loaded: the dead leader had written the collection
    # to meta before its plan's commit point, and the new leader took that as loaded.
    "load_in_flight_at_leader_crash": [("kill_leader", {"during": [Act("LoadCollection", coll=0)]})],
    # A LoadPartitions answered SUCCESS, then a ReleasePartitions naming one of its partitions and another:
    # the release cancelled the load, whose roll-back released the partition the release did not name too.
    "overlapping_release_cancels_answered_load": [("together", {"acts": [
        Act("LoadPartitions", coll=1, parts=(0, 2)), Act("ReleasePartitions", coll=1, parts=(1, 2), wait=0.05)]})],
    # Tight nodes: a compaction chain's result had no room in a replica that had lost a node, so the replica kept
    # serving the chain's sources (by design, until the result fits); the invariants took them for stale copies.
    "chain_sources_kept_while_the_result_waits_for_room": [
        ("nodes_with_capacity", {"tight": True}),
        ("restart_node", {"index": 0, "revoke": False, "during": [Act("LoadPartitions", coll=0, parts=(0, 1, 2))]}),
        ("kill_node", {"index": 0, "revoke": False, "during": [Act("CompactChain", coll=0, parts=(0,))]})],
}


def replay(etcd: EtcdCluster, steps: list[tuple[str, dict[str, Any]]]) -> None:
    ChaosMachine.etcd = etcd
    machine = ChaosMachine()
    try:
        if not steps or steps[0][0] != "nodes_with_capacity":
            machine.nodes_with_capacity(tight=False)
        machine.settled_and_consistent()
        for name, kwargs in steps:
            getattr(machine, name)(**kwargs)
            machine.settled_and_consistent()
    finally:
        machine.teardown()


@pytest.mark.parametrize("name", sorted(REPRODUCTIONS))
def test_minimal_reproduction(etcd: EtcdCluster, quiet_logs: None, name: str) -> None:
    replay(etcd, REPRODUCTIONS[name])


def test_model_explains_serial_orders() -> None:
    """The model itself (no cluster): which answers of requests sent together some serial order explains."""
    lc, rc = Act("LoadCollection"), Act("ReleaseCollection")
    lp0, rp1 = Act("LoadPartitions", parts=(0,)), Act("ReleasePartitions", parts=(1,))
    p0: State = ("partitions", frozenset({0}))
    assert explain(RELEASED, [Call(lc, "SUCCESS"), Call(rc, "SUCCESS")]) == {COLLECTION, RELEASED}
    assert explain(RELEASED, [Call(lc, "SUCCESS", 0, 1), Call(rc, "SUCCESS", 2, 3)]) == {RELEASED}, "real time"
    assert explain(RELEASED, [Call(lp0, "SUCCESS"), Call(lp0, "CONFLICT")]) == set(), "a retry is no conflict"
    assert explain(RELEASED, [Call(lc, "CANCELLED"), Call(rc, "SUCCESS")]) == {RELEASED}
    assert explain(RELEASED, [Call(lp0, "CANCELLED"), Call(rp1, "SUCCESS")]) == set(), "unrelated release"
    assert explain(RELEASED, [Call(lp0, "SUCCESS"), Call(rp1, "SUCCESS")]) == {p0}
    assert explain(RELEASED, [Call(lc, "SUCCESS"), Call(lp0, "SUCCESS")]) == set()
    assert explain(COLLECTION, [Call(rc, "SUCCESS", 0, 1), Call(lp0, "SUCCESS", 2, 3)],
                   hidden_attempts=True) == {p0}
    assert explain(RELEASED, [Call(lc, "SUCCESS", 0, 1), Call(rc, "SUCCESS", 2, 3)],
                   hidden_attempts=True) == {RELEASED}
