"""The drills' options: one dataclass per drill, each command-line option declared once, on its field.

``querycoord drill ...`` is built from these fields (``cli_options``): the flag is the field's name, its default the
field's default and its help the field's metadata, so the command line cannot drift from what a drill runs
with. The seeded plans are drawn from the same objects (``schedule.make_schedule``, ``chaos_ops.make_plan``).
This module imports nothing of the runtime, so that ``querycoord --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

MIB = 1 << 20
#: Bytes accounted for one segment the chaos and failover drills create (1,000 rows of a 128-dim vector and a pk).
SEGMENT_BYTES = 1000 * (128 * 4 + 8)


def option(default: T, text: str, *, shown: str | None = None, kind: type | None = None,
           choices: tuple[Any, ...] | None = None) -> T:
    """A field that is also ``--name`` on the command line; ``shown`` stands for a default that needs words."""
    return field(default=default, metadata={"help": text, "shown": shown, "kind": kind or type(default),
                                            "choices": choices})


def cli_options(options: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``options`` that are command-line options, in the order they are declared."""
    return [f for f in dataclasses.fields(options) if "help" in f.metadata]


def cli_help(f: dataclasses.Field[Any]) -> str:
    """The field's help with its default, as ``--help`` shows it."""
    shown = f.metadata["shown"]
    return f"{f.metadata['help']} (default: {shown})" if shown else f"{f.metadata['help']} (default {f.default:g})"


@dataclass(kw_only=True)
class RunOptions:
    """What every drill takes. Keyword-only, so that each drill's own fields keep their positions."""

    seed: int = option(0, "seed of the drill's plan: its requests and faults")
    ttl: float = option(2.0, "session TTL of coordinators and nodes")
    work_dir: str | None = None
    keep: bool = False
    verbose: bool = False
    json_only: bool = False

    def validate(self) -> None:
        """ValueError naming the first option out of range (each drill checks its own options first)."""
        if self.ttl < 2:
            raise ValueError("--ttl must be >= 2 (the session minimum)")

    def replay(self, command: str, always: tuple[str, ...], optional: tuple[str, ...]) -> str:
        """``command`` with the options that replay this run: each of ``always``, then each of ``optional`` whose
        value is not its default."""
        default = type(self)()
        flags = [f"--{n.replace('_', '-')} {_flag(getattr(self, n))}" for n in (*always, *optional)
                 if n in always or getattr(self, n) != getattr(default, n)]
        return f"{command} {' '.join(flags)}"


def _flag(value: Any) -> str:
    return value if isinstance(value, str) else f"{value:g}"


@dataclass
class DrillOptions(RunOptions):
    """``drill failover``; ``make_schedule`` draws its schedule from them."""

    coordinators: int = option(3, "coordinator processes, at least 2")
    nodes: int = option(5, "query node processes (two per replica and one to kill: each killed node is replaced)")
    replicas: int = option(2, "replica_number of every load: each replica holds every segment and DM channel once")
    collections: int = option(20, "collections created in the catalog")
    kills: int = option(10, "leader SIGKILLs")
    etcd_members: int = option(1, "embedded etcd members", choices=(1, 3))
    etcd_kills: int = option(0, "etcd member SIGKILLs, one down at a time; needs 3 members")
    segments_per_collection: int = option(80, "sealed segments per collection")
    partitions: int = option(2, "partitions per collection")
    channels: int = 2
    pauses: int = option(1, "SIGSTOP rounds proving fencing")
    node_kills: int = option(2, "query node SIGKILLs with replacement")
    ops: int = option(0, "client requests in the schedule", shown="derived")
    node_latency_ms: float = option(10.0, "latency of every node call")
    max_request_bytes: int = 3000
    client_deadline: float = 60.0
    quiesce_timeout: float = option(120.0, "bound of the final wait")
    pause_windows: int = 3
    pause_window_s: float = 0.35
    max_wait_s: float = 0.25  # the longest wait before a step of the schedule

    def validate(self) -> None:
        if self.coordinators < 2:
            raise ValueError("--coordinators must be >= 2 (someone has to take over)")
        if self.nodes < 2:
            raise ValueError("--nodes must be >= 2 (a killed node's segments need somewhere to go)")
        if self.replicas < 1 or self.replicas > self.nodes:
            raise ValueError("--replicas must be >= 1 and at most --nodes (each replica needs its own nodes)")
        if self.collections < 1 or self.partitions < 1 or self.segments_per_collection < 0:
            raise ValueError("--collections and --partitions must be >= 1, --segments-per-collection >= 0")
        if self.kills < 0 or self.pauses < 0 or self.node_kills < 0 or self.etcd_kills < 0:
            raise ValueError("kill and pause counts must be >= 0")
        if self.etcd_members not in (1, 3):
            raise ValueError("--etcd-members must be 1 or 3")
        if self.etcd_kills and self.etcd_members < 3:
            raise ValueError("--etcd-kills needs --etcd-members 3 (killing the only member is an outage, "
                             "not a fault the cluster can ride out)")
        super().validate()

    def op_count(self) -> int:
        """The schedule's requests: ``ops``, or enough for every kill to meet some work."""
        return self.ops or max(30, 5 * self.kills + self.collections + 3 * (self.node_kills + self.etcd_kills))

    def command(self) -> str:
        """The command line that replays this run's schedule."""
        return self.replay("python -m querycoord.tooling.drill failover",
                           ("coordinators", "nodes", "collections", "kills", "seed"),
                           ("replicas", "etcd_members", "etcd_kills", "ttl", "segments_per_collection", "partitions",
                            "pauses", "node_kills", "ops", "node_latency_ms"))


@dataclass
class StreamDrillOptions(RunOptions):
    """``drill streams``."""

    nodes: int = option(4, "stream node processes, 2 vgroups each")
    snodes: int = option(2, "nodes hosting an snode")
    streams: int = option(50, "streams created")
    leader_kills: int = option(2, "coordinator leader SIGKILLs")
    node_kills: int = option(1, "SIGKILLs of an snode's node")
    vgroup_moves: int = option(1, "vgroup leadership moves")
    task_fails: int = option(3, "tasks failed through stdin")
    user_stops: int = option(-1, "streams stopped by the user", shown="streams/10")
    heartbeat_ms: float = option(100.0, "stream node heartbeat tick")
    watch_timeout: float = option(2.0, "the leader's WATCH bound")
    quiesce_timeout: float = option(60.0, "bound of each wait")

    def validate(self) -> None:
        if self.nodes < 2:
            raise ValueError("--nodes must be at least 2 (a vgroup moves between two nodes)")
        if not 1 <= self.snodes <= self.nodes:
            raise ValueError("--snodes must be between 1 and --nodes")
        if self.node_kills and self.snodes < 2:
            raise ValueError("killing an snode's node needs --snodes >= 2 (streams need a live snode)")
        if self.streams < 1:
            raise ValueError("--streams must be at least 1")
        if min(self.leader_kills, self.node_kills, self.vgroup_moves, self.task_fails) < 0:
            raise ValueError("fault counts must not be negative")
        super().validate()

    @property
    def stops(self) -> int:
        return self.streams // 10 if self.user_stops < 0 else min(self.user_stops, self.streams)

    def command(self) -> str:
        return (f"querycoord drill streams --nodes {self.nodes} --snodes {self.snodes} --streams {self.streams} "
                f"--seed {self.seed} --leader-kills {self.leader_kills} --node-kills {self.node_kills} "
                f"--vgroup-moves {self.vgroup_moves} --task-fails {self.task_fails}")


@dataclass
class ChaosOptions(RunOptions):
    """``drill chaos``; ``make_plan`` draws its plan from them."""

    ops: int = option(300, "client requests in the plan")
    coordinators: int = option(3, "coordinator processes")
    nodes: int = option(5, "query node processes at the start; kills and adds keep two per replica (at least 3) "
                           "to that + 3")
    replicas: int = option(2, "replica_number of every load: each replica holds every segment and DM channel once")
    clients: int = option(3, "concurrent clients")
    collections: int = option(12, "collections in the catalog")
    partitions: int = option(3, "partitions per collection")
    segments_per_collection: int = option(30, "sealed segments per collection at the start")
    node_latency_ms: float = option(10.0, "latency of every node call")
    rpc_timeout: float = 3.0
    call_deadline: float = option(60.0, "every call must be answered within this")
    quiesce_timeout: float = option(60.0, "bound of each wait for quiescence; triggers still running then are stuck")
    checker_interval: float = option(1.0, "the coordinators' checker interval, when `querycoord coord` has that "
                                          "option")
    settle: float | None = option(None, "seconds the leader must stay idle to be quiescent", kind=float,
                                  shown="one checker interval + 1 s; 1.5 without a checker")  # see ``settle_s``
    time_budget: float = option(900.0, "bound of the whole run in seconds; phases left are skipped")
    capacity: str = option("ample", "ample: every node has room for every replica; tight: room for about half "
                                    "the replicas, nodes under fixed ids restarted, whole-cluster restarts and "
                                    "compaction chains join the plan", shown="ample", kind=str,
                           choices=("ample", "tight"))
    node_memory_mb: float = option(0.0, "memory capacity of each query node in MiB",
                                   shown="4096, or with --capacity tight room for about half the replicas")
    sample_interval: float = option(1.0, "seconds between two samples of the continuous invariants (false "
                                         "full answers, blocked units and releases)")
    # The plan's phases: requests per phase, and the longest wait before one.
    min_phase_ops: int = 8
    max_phase_ops: int = 14
    max_wait_s: float = 0.3

    def validate(self) -> None:
        if self.ops < 1:
            raise ValueError("--ops must be >= 1")
        if self.coordinators < 2:
            raise ValueError("--coordinators must be >= 2 (someone has to take over)")
        if self.replicas < 1:
            raise ValueError("--replicas must be >= 1")
        if self.nodes < 2 or not self.min_nodes <= self.nodes <= self.max_nodes:
            raise ValueError(f"--nodes must be >= 2 and within [{self.min_nodes}, {self.max_nodes}] (with "
                             f"--replicas {self.replicas})")
        if self.clients < 1 or self.collections < 1 or self.partitions < 1 or self.segments_per_collection < 0:
            raise ValueError("--clients, --collections and --partitions must be >= 1")
        super().validate()
        if self.call_deadline < 10 or self.time_budget <= 0 or self.quiesce_timeout <= 0:
            raise ValueError("--call-deadline must be >= 10, --time-budget and --quiesce-timeout > 0")
        if self.capacity not in ("ample", "tight"):
            raise ValueError(f"--capacity must be ample or tight, got {self.capacity!r}")
        if self.node_memory_mb < 0 or self.sample_interval <= 0:
            raise ValueError("--node-memory-mb must be >= 0 (0: derived) and --sample-interval > 0")
        if self.node_memory_mb and self.node_memory_mb * MIB < 2 * SEGMENT_BYTES:
            raise ValueError(f"--node-memory-mb {self.node_memory_mb:g} cannot hold even one segment "
                             f"({SEGMENT_BYTES / MIB:.2f} MiB) under the memory limit")

    @property
    def min_nodes(self) -> int:
        """Node kills stop at two query nodes per replica (at least 3): a killed node's copies need a mate."""
        return max(3, 2 * self.replicas)

    @property
    def max_nodes(self) -> int:
        return self.min_nodes + 3

    @property
    def settle_s(self) -> float:
        """How long the leader must stay idle to be quiescent: it must outlast one checker pass (every
        ``--checker-interval`` seconds), since a difference the checker repairs is a repair, not a violation;
        what is still wrong after a pass is."""
        if self.settle is not None:
            return self.settle
        return self.checker_interval + 1.0

    @property
    def tight(self) -> bool:
        return self.capacity == "tight"

    @property
    def node_memory(self) -> int:
        """Bytes of each query node (``--node-memory-mb``; derived when 0). Tight: every replica of every
        collection, at its initial size, would need twice what the nodes have under the 90 % memory limit, so
        loads are refused for want of memory (load admission) and a lost node's copies often have nowhere to go
        (parked for room)."""
        if self.node_memory_mb:
            return int(self.node_memory_mb * MIB)
        if not self.tight:
            return 4096 * MIB
        demand = self.collections * self.replicas * self.segments_per_collection * SEGMENT_BYTES
        return max(2 * SEGMENT_BYTES, int(demand / 2 / self.nodes / 0.9))

    @property
    def client_deadline(self) -> float:
        """The leader-following client's own deadline: its last attempt still ends within the call deadline."""
        return max(5.0, self.call_deadline - self.call_timeout - 3.0)

    @property
    def call_timeout(self) -> float:
        """One attempt on one coordinator: long enough for a release that waits for its nodes."""
        return max(5.0, min(15.0, self.call_deadline / 4))

    def command(self) -> str:
        """The command line that replays this run's plan."""
        return self.replay("querycoord drill chaos", ("ops", "seed"),
                           ("coordinators", "nodes", "replicas", "clients", "collections", "partitions",
                            "segments_per_collection", "ttl", "node_latency_ms", "call_deadline", "quiesce_timeout",
                            "capacity", "node_memory_mb"))


@dataclass
class RestartOptions(RunOptions):
    """``drill restart``; ``restart_plan.plan_rounds`` draws each restart's signal and orders from them."""

    restarts: int = option(3, "whole-cluster restarts: etcd, coordinators and query nodes stopped and started again")
    segments: int = option(20000, "sealed segments in all collections together")
    collections: int = option(3, "loaded collections: the first with --replicas replicas, the others with one")
    replicated_segments: int = option(1000, "segments of the first collection (the one with --replicas replicas)")
    replicas: int = option(2, "replica_number of the first collection")
    nodes: int = option(4, "query node processes, each under a fixed --node-id across restarts")
    coordinators: int = option(2, "coordinator processes")
    partitions: int = option(4, "partitions per collection")
    channels: int = 2
    sample_interval: float = option(0.3, "seconds between samples of the leader's figures and the nodes' holdings")
    whole_timeout: float = option(120.0, "a restart after which some collection is not whole within this many "
                                         "seconds counts as never whole")
    # A node's loss is not a lie until the leader could have seen it: its figures are excused this long after.
    grace_s: float = 1.0
    stop_timeout: float = 10.0  # SIGTERM rounds: a process still running after this is SIGKILLed (and counted)

    def validate(self) -> None:
        if self.restarts < 1:
            raise ValueError("--restarts must be >= 1")
        if self.collections < 2:
            raise ValueError("--collections must be >= 2 (one with --replicas replicas, at least one with one)")
        if self.replicas < 1 or self.replicas > self.nodes:
            raise ValueError("--replicas must be >= 1 and at most --nodes (each replica needs its own nodes)")
        if self.nodes < 1 or self.coordinators < 1:
            raise ValueError("--nodes and --coordinators must be >= 1")
        if self.partitions < 1:
            raise ValueError("--partitions must be >= 1")
        if not 0 < self.replicated_segments < self.segments:
            raise ValueError("--replicated-segments must be > 0 and below --segments (the other collections hold "
                             "the rest)")
        if self.segments - self.replicated_segments < self.collections - 1:
            raise ValueError("--segments leaves fewer than one segment for some collection")
        if self.sample_interval <= 0 or self.whole_timeout <= 0:
            raise ValueError("--sample-interval and --whole-timeout must be > 0")
        super().validate()

    def segments_of(self) -> list[int]:
        """Segments per collection: the replicated one first, then the rest split as evenly as possible."""
        rest, n = self.segments - self.replicated_segments, self.collections - 1
        return [self.replicated_segments] + [rest // n + (1 if i < rest % n else 0) for i in range(n)]

    def replicas_of(self) -> list[int]:
        return [self.replicas] + [1] * (self.collections - 1)

    def command(self) -> str:
        """The command line that replays this run's plan."""
        return self.replay("querycoord drill restart", ("restarts", "seed"),
                           ("segments", "collections", "replicated_segments", "replicas", "nodes", "coordinators",
                            "partitions", "ttl", "sample_interval", "whole_timeout"))


@dataclass
class RollingOptions(RunOptions):
    """``drill rolling``: every query node in turn drained, stopped, restarted and uncordoned."""

    coordinators: int = option(2, "coordinator processes")
    nodes: int = option(4, "query node processes, each under a fixed --node-id; each is restarted once, in order")
    collections_two: int = option(2, "collections loaded with 2 replicas (judged: a whole replica at every sample)")
    collections_one: int = option(1, "collections loaded with 1 replica (their unserved time is measured)")
    segments: int = option(600, "sealed segments per judged collection")
    churn_collections: int = option(2, "other collections that clients load and release all along")
    churn_segments: int = option(50, "sealed segments per churned collection")
    partitions: int = option(2, "partitions per collection")
    channels: int = 2
    sample_interval: float = option(0.1, "seconds between two samples of what the nodes hold")
    graceful_stop_timeout: float = option(30.0, "a query node's --graceful-stop-timeout: on SIGTERM it drains "
                                                "first for at most this long")
    drain_timeout: float = option(120.0, "bound of the wait for a drained node (DRAINED)")
    drain_stall: float = option(10.0, "a drain that says why it waits, with no progress for this long, is given "
                                      "up: the node is stopped undrained (counted in drains_waiting)")
    whole_timeout: float = option(120.0, "bound of the wait, after a node is back, until every judged collection is "
                                         "whole again by the nodes' reports")
    fill: float = option(0.4, "share of the query nodes' memory the judged collections' copies fill (sets each "
                                "node's capacity, so a returned node is emptier than the others by more than the "
                                "auto balance's spread)")
    auto_balance_interval: float = option(1.0, "the coordinators' --auto-balance-interval (0: no auto balance)")
    drain: int = option(1, "1: cordon and drain each node before its SIGTERM; 0: SIGTERM only, the node's graceful "
                           "stop drains it (with --graceful-stop-timeout 0 nothing does: its copies are repaired "
                           "after it left and 1-replica collections go unserved meanwhile)", choices=(0, 1))
    stop_timeout_margin: float = 15.0  # SIGKILL a node this long after its graceful stop timeout (and count it)

    def validate(self) -> None:
        if self.nodes < 3:
            raise ValueError("--nodes must be >= 3 (a 2-replica collection keeps a whole replica on other nodes "
                             "while one is down)")
        if self.coordinators < 1:
            raise ValueError("--coordinators must be >= 1")
        if self.collections_two < 0 or self.collections_one < 0 or self.collections_two + self.collections_one < 1:
            raise ValueError("--collections-two and --collections-one must be >= 0, and one of them >= 1")
        if self.segments < 1 or self.churn_segments < 1 or self.partitions < 1:
            raise ValueError("--segments, --churn-segments and --partitions must be >= 1")
        if self.churn_collections < 0:
            raise ValueError("--churn-collections must be >= 0")
        if min(self.sample_interval, self.drain_timeout, self.drain_stall, self.whole_timeout) <= 0:
            raise ValueError("--sample-interval, --drain-timeout, --drain-stall and --whole-timeout must be > 0")
        if self.graceful_stop_timeout < 0 or self.auto_balance_interval < 0:
            raise ValueError("--graceful-stop-timeout and --auto-balance-interval must be >= 0")
        if not 0 < self.fill < 0.9:
            raise ValueError("--fill must be > 0 and below the memory limit 0.9")
        super().validate()

    def specs(self) -> list[tuple[str, int, int]]:
        """The collections: (name, segments, replica_number); the judged ones first, then the churned ones
        (replica_number 0: not loaded by the drill's start, the clients load them)."""
        return ([(f"rolling_two_{i}", self.segments, 2) for i in range(self.collections_two)]
                + [(f"rolling_one_{i}", self.segments, 1) for i in range(self.collections_one)]
                + [(f"churn_{i}", self.churn_segments, 0) for i in range(self.churn_collections)])

    def command(self) -> str:
        """The command line that replays this run."""
        return self.replay("querycoord drill rolling", ("seed",),
                           ("coordinators", "nodes", "collections_two", "collections_one", "segments",
                            "churn_collections", "churn_segments", "partitions", "ttl", "sample_interval",
                            "graceful_stop_timeout", "fill", "auto_balance_interval", "drain"))


__all__ = ["MIB", "SEGMENT_BYTES", "ChaosOptions", "DrillOptions", "RestartOptions", "RollingOptions", "RunOptions",
           "StreamDrillOptions", "cli_help", "cli_options", "option"]
