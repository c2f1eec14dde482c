"""The reference query node: a gRPC QueryNode server registered under a meta session.

Real deployments bring their own query nodes; this one exists so the demo,
drills, benchmarks and tests have workers that speak the protocol of
proto/querynode.proto, keep what they hold in memory (see
``querynode_state``) and misbehave on demand (see ``querynode_faults``).

Life cycle: ``start()`` binds the port, registers the session (role
``querynode``, address ``host:port``, extra ``{"capacity_bytes": N}``) and
only then starts serving, so no call is ever answered by a node without an
id. ``stop()`` revokes the session first (the coordinator sees the node go
at once, not after the TTL) and then stops the server with a short grace
for calls in flight. A node whose session is lost (lease expired, key
deleted) answers NOT_READY to every mutating call: the coordinator has
already given its work to others, so it must not take more under an identity
that no longer exists. ``run_forever`` (the process) exits with status 1 in
that case, to be restarted with a new id.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import grpc
from loguru import logger
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from meta.address import local_host, split_address
from meta.config import EtcdConfig
from meta.election import read_leader_record
from meta.errors import MetaError
from meta.kv import MetaKV
from meta.session import DEFAULT_TTL, Session
from proto import common_pb2, querynode_pb2, querynode_pb2_grpc
from querycoord.common.errors import status_of
from querycoord.common.metrics import gauge as _gauge
from querycoord.common.protocol import MUTATING_METHODS, QUERYCOORD_ELECTION, QUERYNODE_ROLE
from querycoord.nodes.node_metrics import session_up
from querycoord.nodes.node_process import NodeCommand, SessionNode, crash_process, meta_of, run_node
from querycoord.nodes.querynode_checks import load_columns, refused
from querycoord.nodes.querynode_drain import DEFAULT_TIMEOUT_S as DEFAULT_DRAIN_TIMEOUT_S
from querycoord.nodes.querynode_drain import drain_before_stop
from querycoord.nodes.querynode_faults import INJECTED_FAILURE, CrashAction, CrashMode, FaultConfig, FaultInjector
from querycoord.nodes.querynode_state import EC, NodeRefusal, QueryNodeState, ok_status
from querycoord.security.grpc_channels import add_port, make_server
from querycoord.settings.setting_rules import COUNT, Rule, flag_type, seconds

DEFAULT_LISTEN = "127.0.0.1:0"
DEFAULT_CAPACITY_MB = 1024
MIB = 1024 * 1024

Resp = TypeVar("Resp")


def _crash_process(node_id: int, kind: str, calls: int) -> None:
    crash_process(f"query node {node_id}: crash-after reached on call {calls} ({kind})")


def _split_listen(listen: str) -> tuple[str, int]:
    try:
        return split_address(listen)
    except ValueError as exc:
        raise ValueError(f"listen address {exc}") from None


class QueryNode(SessionNode):
    """One reference query node (see module docstring).

    ``crash`` replaces ``os._exit`` for the crash-after fault (tests of an
    in-process node); it is called with (node_id, kind, call_number).
    """

    kind = "query node"

    def __init__(
        self,
        kv: MetaKV,
        *,
        listen: str = DEFAULT_LISTEN,
        capacity_bytes: int = DEFAULT_CAPACITY_MB * MIB,
        ttl: float = DEFAULT_TTL,
        faults: FaultConfig | None = None,
        grace: float = 1.0,
        crash: Callable[[int, str, int], None] = _crash_process,
        advertise: str | None = None,
        node_id: int | None = None,
        verify_fences: bool = True,
    ):
        """``verify_fences``: check a fence higher than any seen against the election in etcd before adopting it
        (see ``_fence_refusal``); off only where a test drives the ordering rules with made-up revisions."""
        self.kv = kv
        self.verify_fences = verify_fences
        self.fixed_node_id = node_id  # None: the session allocates one
        self.listen = listen
        if advertise is not None:
            _split_listen(advertise)
        # What the session advertises instead of the bound address (e.g. a proxy in front of the node).
        self.advertise = advertise
        self._host, self._port = _split_listen(listen)
        self.capacity_bytes = int(capacity_bytes)
        self.state = QueryNodeState(self.capacity_bytes)
        self.ttl = ttl
        self.faults = faults or FaultConfig()
        self.injector = FaultInjector(self.faults)
        self.grace = grace
        self._crash_fn = crash
        self._crashed = False
        self._server: grpc.aio.Server | None = None
        self._session: Session | None = None
        self._stopping = False
        self.port = 0
        # Mutating calls in flight by kind, and the most there ever were at once: read-only counters a test or an
        # operator reads to see how many loads the coordinator has this node work on at the same time.
        self.in_flight: Counter[str] = Counter()
        self.peak_in_flight: Counter[str] = Counter()

    # ----- identity --------------------------------------------------------
    @property
    def address(self) -> str:
        """What the session advertises: ``advertise`` if given, else the bound address (a wildcard host as
        loopback, for local workers)."""
        return self.advertise or self.bound_address

    @property
    def bound_address(self) -> str:
        """Where the gRPC server really listens."""
        return f"{local_host(self._host)}:{self.port}"

    @property
    def healthy(self) -> bool:
        s = self._session
        return s is not None and s.info is not None and not s.lost.is_set() and not self._stopping

    @property
    def registered(self) -> bool:
        """Its session was registered (it may have been lost or closed since)."""
        s = self._session
        return s is not None and s.info is not None

    # ----- life cycle ------------------------------------------------------
    async def start(self) -> QueryNode:
        """Bind, register the session, then serve (see module docstring)."""
        # TLS, message size limits, roles: this process's (grpc_channels). No SO_REUSEPORT: a node restarted on its
        # old address while another process holds that port must fail to bind (and say so), not share the port and
        # have the kernel hand part of the coordinator's connections to the other process.
        server = make_server(options=[("grpc.so_reuseport", 0)])
        querynode_pb2_grpc.add_QueryNodeServicer_to_server(QueryNodeServicer(self), server)
        try:
            self.port = add_port(server, self.listen)
        except RuntimeError as exc:
            raise OSError(f"query node cannot listen on {self.listen}: {exc} (port in use?)") from exc
        self._server = server
        session = Session(self.kv, QUERYNODE_ROLE, self.address, ttl=self.ttl,
                          extra={"capacity_bytes": self.capacity_bytes}, server_id=self.fixed_node_id)
        try:
            await session.start()
        except BaseException:
            await server.stop(None)
            self._server = None
            raise
        self._session = session
        self.state.node_id = session.server_id
        await server.start()
        logger.info("query node {} serving on {} (capacity {} bytes{})", self.node_id, self.address,
                    self.capacity_bytes, f", faults: {self.faults.describe()}" if self.faults.active else "")
        return self

    async def stop(self) -> None:
        """Revoke the session (the node disappears at once), then stop serving after a short grace."""
        self._stopping = True
        if self._session is not None:
            await self._session.close(revoke=True)
        if self._server is not None:
            await self._server.stop(self.grace)
            self._server = None
        logger.info("query node {} stopped", self._session.server_id if self._session and self._session.info else "?")

    async def crash(self, *, revoke: bool = False) -> None:
        """Test seam: stop answering at once, as a dead process would, inside the caller's event loop (calls in
        flight are cut). The session's keep-alive stops: it lapses after its TTL, or is revoked now with ``revoke``
        (a node whose death etcd learns at once)."""
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        if self._session is not None:
            await self._session.close(revoke=revoke)

    async def __aenter__(self) -> QueryNode:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----- call plumbing ---------------------------------------------------
    def _check_ready(self, kind: str) -> None:
        if self._stopping:
            raise NodeRefusal(EC.NOT_READY, f"{kind}: query node {self.state.node_id} is stopping")
        if not self.healthy:
            reason = self._session.lost_reason if self._session is not None else "not started"
            raise NodeRefusal(
                EC.NOT_READY,
                f"{kind}: query node {self.state.node_id} lost its session ({reason}); it takes no more work",
            )

    async def mutate(
        self,
        kind: str,
        request: Any,
        apply: Callable[[Any], object],
        response: Callable[..., Resp],
        context: grpc.aio.ServicerContext | None,
    ) -> Resp:
        """``_mutate``, counted in ``in_flight`` (and ``peak_in_flight``) while it runs, its injected latency
        included."""
        self.in_flight[kind] += 1
        self.peak_in_flight[kind] = max(self.peak_in_flight[kind], self.in_flight[kind])
        try:
            return await self._mutate(kind, request, apply, response, context)
        finally:
            self.in_flight[kind] -= 1

    async def _mutate(
        self,
        kind: str,
        request: Any,
        apply: Callable[[Any], object],
        response: Callable[..., Resp],
        context: grpc.aio.ServicerContext | None,
    ) -> Resp:
        """Run one mutating call: crash/latency faults, readiness, fence, injected failure, then ``apply``.

        Fence check and ``apply`` run with no await in between (see
        querynode_state). Any exception becomes an error status: bad input
        never takes the node down.
        """
        assert kind in MUTATING_METHODS
        action = self.injector.crash_action()
        calls = self.injector.mutating_calls
        if self.faults.latency_ms > 0:
            await asyncio.sleep(self.injector.latency_s)
        if action is CrashAction.EXIT_NOW:
            self._crash(self.state.node_id, kind, calls)
        try:
            self._check_ready(kind)
            forged = await self._fence_refusal(kind, request)
            if forged is not None:
                raise forged
            self.state.admit(kind, request, mutating=True)  # no await from here to apply: the mark holds
            if self.injector.should_fail(kind):
                raise NodeRefusal(EC.UNEXPECTED_ERROR, INJECTED_FAILURE)
            apply(request)
            status = ok_status()
        except NodeRefusal as refusal:
            status = status_of(refusal)
        except Exception as exc:  # a bug must answer an error, never kill the node
            logger.exception("query node {}: {} failed", self.state.node_id, kind)
            status = status_of(exc, source=kind)
        if status.error_code != EC.SUCCESS:
            logger.info("query node {}: {} (task {}) refused: {}", self.state.node_id, kind,
                        getattr(request, "task_id", 0), status.reason)
        else:
            logger.debug("query node {}: {} (task {}) done", self.state.node_id, kind, getattr(request, "task_id", 0))
        if action is CrashAction.EXIT_AFTER_REPLY:
            self._crash_after_reply(kind, calls, context)
        return response(status=status)

    def _crash(self, node_id: int, kind: str, calls: int) -> None:
        if not self._crashed:
            self._crashed = True
            self._crash_fn(node_id, kind, calls)

    def _crash_after_reply(self, kind: str, calls: int, context: grpc.aio.ServicerContext | None) -> None:
        node_id = self.state.node_id
        if context is None:
            self._crash(node_id, kind, calls)
            return
        # Die once the answer is out; the timer is a backstop if the done callback never fires.
        context.add_done_callback(lambda _ctx: self._crash(node_id, kind, calls))
        asyncio.get_running_loop().call_later(1.0, self._crash, node_id, kind, calls)

    async def read(self, kind: str, request: Any) -> common_pb2.Status:
        """Admission for a read: bounds first, then never refused for its fence (only for naming another node)."""
        bad = refused(kind, request, self.state.node_id)
        if bad is not None:
            return bad
        if self.faults.latency_ms > 0:
            await asyncio.sleep(self.injector.latency_s)
        if await self._fence_refusal(kind, request) is not None:  # answered, but its fence does not raise the mark
            request = type(request).FromString(request.SerializeToString())
            request.ClearField("fence")
        try:
            self.state.admit(kind, request, mutating=False)
        except NodeRefusal as refusal:
            return status_of(refusal)
        return ok_status()

    async def _fence_refusal(self, kind: str, request: Any) -> NodeRefusal | None:
        """Why a fence above the node's mark cannot be adopted, or None (it is the leading coordinator's).

        The mark only rises, and every lower fence is refused from then on: one request with a made-up revision
        (2**63-1, or a standby's election key) would make the node refuse every real leader, each of which would
        take STALE_LEADER for lost leadership and resign, for ever. So before adopting a higher revision the node
        reads the leader record (``meta.election``), which only a leader can write (through its fence): the
        revision must be the record's. One etcd read per leader change; a deposed leader's older revision is
        refused as stale. The node never reads the election itself: its keys name the coordinators' leases.
        """
        fence = request.fence if request.HasField("fence") else None
        if not self.verify_fences or fence is None or fence.leader_revision <= self.state.fence.leader_revision:
            return None
        revision = fence.leader_revision
        try:
            record = await read_leader_record(self.kv, QUERYCOORD_ELECTION)
        except MetaError as exc:
            return NodeRefusal(EC.NOT_READY, f"{kind}: cannot check fence revision {revision} against the leader "
                                             f"record in etcd ({exc}); retry")
        held = record.revision if record is not None else 0
        if revision == held:
            return None
        if revision < held:
            return NodeRefusal(EC.STALE_LEADER, f"stale coordinator: fence revision {revision} is not the leader's "
                                                f"({held}); {kind} refused, a newer leader is in charge")
        logger.warning("query node {}: {} refused: fence revision {} is held by no coordinator (the leader's is {})",
                       self.state.node_id, kind, revision, held or "none")
        return NodeRefusal(EC.ILLEGAL_ARGUMENT, f"{kind}: fence revision {revision} is not held by the leading "
                                                f"coordinator (its revision is {held or 'none: no leader'})")


def _mutation(state_method: str, response: type[Resp]) -> Callable[..., Awaitable[Resp]]:
    """The RPC answered by ``response`` (``LoadSegments`` for ``LoadSegmentsResponse``): ``QueryNode.mutate``
    applying ``QueryNodeState.<state_method>``."""
    kind = response.__name__.removesuffix("Response")

    async def rpc(servicer: QueryNodeServicer, request: Any, context: grpc.aio.ServicerContext) -> Resp:
        node = servicer.node
        apply: Callable[[Any], object] = getattr(node.state, state_method)
        # A load's infos are read once, for the checks and the state both (most of a node's cost per segment).
        columns = load_columns(request) if isinstance(request, querynode_pb2.LoadSegmentsRequest) else None
        bad = refused(kind, request, node.state.node_id, columns=columns)  # bounds first: changes nothing
        if bad is not None:
            answer: Callable[..., Resp] = response
            return answer(status=bad)
        if columns is not None:
            apply = partial(node.state.load_segments, columns=columns)
        return await node.mutate(kind, request, apply, response, context)

    rpc.__name__ = rpc.__qualname__ = kind
    return rpc


class QueryNodeServicer(querynode_pb2_grpc.QueryNodeServicer):
    """The QueryNode gRPC service of one ``QueryNode``: thin adapters onto ``QueryNodeState``."""

    def __init__(self, node: QueryNode):
        self.node = node

    # The mutating calls, each applied by the state method named after it (see ``QueryNode.mutate``).
    LoadSegments = _mutation("load_segments", querynode_pb2.LoadSegmentsResponse)
    ReleaseSegments = _mutation("release_segments", querynode_pb2.ReleaseSegmentsResponse)
    WatchDmChannels = _mutation("watch_dm_channels", querynode_pb2.WatchDmChannelsResponse)
    ReleaseDmChannels = _mutation("release_dm_channels", querynode_pb2.ReleaseDmChannelsResponse)
    WatchDeltaChannels = _mutation("watch_delta_channels", querynode_pb2.WatchDeltaChannelsResponse)
    AddQueryChannel = _mutation("add_query_channel", querynode_pb2.AddQueryChannelResponse)
    ReleaseCollection = _mutation("release_collection", querynode_pb2.ReleaseCollectionResponse)
    ReleasePartitions = _mutation("release_partitions", querynode_pb2.ReleasePartitionsResponse)

    async def GetSegmentInfo(
        self, request: querynode_pb2.GetSegmentInfoRequest, context: grpc.aio.ServicerContext
    ) -> querynode_pb2.GetSegmentInfoResponse:
        status = await self.node.read("GetSegmentInfo", request)
        if status.error_code != EC.SUCCESS:
            return querynode_pb2.GetSegmentInfoResponse(status=status)
        infos = self.node.state.segment_infos(request.segment_ids, request.collection_id)
        return querynode_pb2.GetSegmentInfoResponse(status=status, infos=infos)

    async def GetDataDistribution(
        self, request: querynode_pb2.GetDataDistributionRequest, context: grpc.aio.ServicerContext
    ) -> querynode_pb2.GetDataDistributionResponse:
        status = await self.node.read("GetDataDistribution", request)
        if status.error_code != EC.SUCCESS:
            return querynode_pb2.GetDataDistributionResponse(status=status, node_id=self.node.state.node_id)
        known = {k.collection_id: k.version for k in request.known}
        return self.node.state.distribution(ids_only=request.segment_ids_only, incarnation=request.incarnation,
                                            known=known, skip=request.skip_collection_ids)

    async def GetComponentStates(
        self, request: querynode_pb2.GetComponentStatesRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ComponentStates:
        node = self.node
        if node.healthy:
            code = common_pb2.HEALTHY
        elif node.registered:
            code = common_pb2.ABNORMAL  # session lost or stopping
        else:
            code = common_pb2.INITIALIZING
        return common_pb2.ComponentStates(
            state=common_pb2.ComponentInfo(node_id=node.state.node_id, role=QUERYNODE_ROLE, state_code=code),
            status=ok_status(),
        )


# ----- the process ------------------------------------------------------------
async def run_forever(
    etcd: EtcdConfig,
    root: str,
    *,
    listen: str = DEFAULT_LISTEN,
    capacity_bytes: int = DEFAULT_CAPACITY_MB * MIB,
    ttl: float = DEFAULT_TTL,
    faults: FaultConfig | None = None,
    advertise: str | None = None,
    http_listen: str = "",
    node_id: int | None = None,
    graceful_stop_timeout: float = DEFAULT_DRAIN_TIMEOUT_S,
) -> int:
    """Run one node until SIGTERM/SIGINT (exit 0) or until its session is lost (exit 1). A first signal asks
    the leader to drain the node, waiting at most ``graceful_stop_timeout`` seconds (``querynode_drain``).

    Prints one JSON line ``{"event": "ready", "node_id", "address", "listen_address", "pid"}``
    on stdout once the node serves (``address`` is the advertised one; ``http_address`` too with
    ``http_listen``); drills and tests parse it.
    """

    def build(kv: MetaKV) -> QueryNode:
        return QueryNode(kv, listen=listen, capacity_bytes=capacity_bytes, ttl=ttl, faults=faults, advertise=advertise,
                         node_id=node_id)

    def ready(node: QueryNode) -> dict[str, Any]:
        return {"address": node.address, "listen_address": node.bound_address, "capacity_bytes": node.capacity_bytes}

    async def drain(node: QueryNode) -> bool:
        return await drain_before_stop(node.kv, node.node_id, graceful_stop_timeout)

    return await run_node(etcd, root, build, ready=ready, start_errors=(MetaError, OSError), http_listen=http_listen,
                          families=querynode_families, before_stop=drain if graceful_stop_timeout > 0 else None)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=DEFAULT_LISTEN, help="gRPC listen address (port 0: any free port)")
    p.add_argument("--advertise", default=None, metavar="ADDR",
                   help="host:port to advertise in the session instead of the bound address (e.g. a proxy or NAT "
                        "in front of the node; the drills put a partitionable proxy there)")
    p.add_argument("--capacity-mb", type=flag_type(float, Rule(0, 1 << 30)), default=DEFAULT_CAPACITY_MB,
                   help="memory capacity in MiB, accounted from segment mem_size")
    p.add_argument("--ttl", type=flag_type(float, seconds(2, 3600)), default=DEFAULT_TTL,
                   help="session lease TTL in seconds (>= 2)")
    p.add_argument("--graceful-stop-timeout", type=flag_type(float, Rule(0, 86_400)), default=DEFAULT_DRAIN_TIMEOUT_S,
                   metavar="SECONDS",
                   help="on SIGTERM, ask the leader to drain this node and wait until it is drained, at most this "
                        "long, before stopping (0: stop at once; a second signal stops at once)")
    f = p.add_argument_group("fault injection")
    f.add_argument("--failure-rate", type=flag_type(float, Rule(0, 1)), default=0.0,
                   help="probability (0..1) that a mutating call answers 'injected failure'")
    f.add_argument("--fail-kinds", default="",
                   help="comma-separated RPC names the failure rate applies to (default: every mutating call)")
    f.add_argument("--latency-ms", type=flag_type(float, Rule(0, 3_600_000)), default=0.0,
                   help="latency added to every call")
    f.add_argument("--crash-after", type=flag_type(int, COUNT), default=0,
                   help="exit with status 137 after the Nth mutating call (0: never)")
    f.add_argument("--crash-mode", choices=[m.value for m in CrashMode], default=CrashMode.AFTER_REPLY.value,
                   help="after-reply: the Nth call is answered, then the node dies; mid-call: it dies on the Nth call")
    f.add_argument("--seed", type=int, default=0, help="seed of the failure-rate RNG (reproducible drills)")


def cmd_querynode(args: argparse.Namespace) -> int:
    """Handler of ``querycoord querynode``."""
    try:
        etcd = meta_of(args)
        faults = FaultConfig(
            failure_rate=args.failure_rate,
            latency_ms=args.latency_ms,
            crash_after=args.crash_after,
            seed=args.seed,
            fail_kinds=frozenset(k.strip() for k in args.fail_kinds.split(",") if k.strip()),
            crash_mode=CrashMode(args.crash_mode),
        )
        capacity = int(args.capacity_mb * MIB)
        if capacity <= 0:
            raise ValueError(f"--capacity-mb must be positive, got {args.capacity_mb}")
        _split_listen(args.listen)
        if args.advertise is not None:
            _split_listen(args.advertise)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(
        run_forever(etcd, args.root, listen=args.listen, capacity_bytes=capacity, ttl=args.ttl, faults=faults,
                    advertise=args.advertise, http_listen=args.http_listen, node_id=args.node_id,
                    graceful_stop_timeout=args.graceful_stop_timeout)
    )


# ``querycoord querynode`` (cli/servers.py adds the parser) and ``python -m querycoord.nodes.querynode``.
COMMAND = NodeCommand("querynode", "run a reference query node (with optional fault injection)",
                      _add_options, cmd_querynode)
add_querynode_parser = COMMAND.add_parser


def querynode_families(node: QueryNode) -> list[Metric]:
    state = node.state
    return [
        _gauge("querycoord_querynode_session_up", "1 while the node's session is registered and alive",
               session_up(node)),
        _gauge("querycoord_querynode_segments", "Sealed segments this query node holds", len(state.segments)),
        _gauge("querycoord_querynode_dm_channels", "DM channels this query node watches", len(state.dm_channels)),
        _gauge("querycoord_querynode_memory_used_bytes", "Memory of the segments this query node holds",
               state.memory_used),
        _gauge("querycoord_querynode_memory_capacity_bytes", "Memory this query node offers", state.capacity_bytes),
        _gauge("querycoord_querynode_fence_revision", "The newest leader fence revision this node has seen (calls "
               "with an older one are refused)", state.fence.leader_revision),
        _gauge("querycoord_querynode_loads_in_flight", "LoadSegments calls this query node is working on now",
               node.in_flight["LoadSegments"]),
        CounterMetricFamily("querycoord_querynode_mutating_calls", "Mutating calls this query node received",
                            value=node.injector.mutating_calls),
    ]


if __name__ == "__main__":
    sys.exit(COMMAND.main())
