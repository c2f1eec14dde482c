"""Prometheus metrics of the coordinator, the query node and the stream node (``prometheus-client``).

Two kinds, kept apart on purpose:

* Events (a trigger finished, a child retried, an etcd call took so long):
  counters and histograms defined here, in the process-wide
  ``prometheus_client.REGISTRY``, updated by one call at the place the event
  happens. meta/ reports its events (etcd latency, retries, MetaUnavailable,
  refused fenced writes) through ``meta.observe``, which ``install`` points
  here, so meta/ stays free of querycoord and of Prometheus.
* State (is this coordinator the leader, how many triggers are queued, what
  each node holds, which streams run, how big etcd's db is): read at scrape
  time from the objects that already hold it (``coordinator_families`` and
  the node functions), so nothing has to be kept in step. Counters that
  live in a leader's objects (the checker's repairs, the stream manager's
  redeploys) start again at zero with each leadership, which Prometheus
  reads as a counter reset.

Labels stay low-cardinality: task kinds, trigger conditions, results,
states, session roles, etcd operations (the leading words of the operation
name, at most ``MAX_OPERATIONS`` distinct), and node ids only for the
leader's per-node gauges (bounded by the cluster's size). Never a task id.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from meta import observe
from meta.session import role_prefix
from proto import querycoord_pb2 as qc
from proto import stream_pb2
from querycoord.protocol import QUERYCOORD_ROLE, QUERYNODE_ROLE, STREAMNODE_ROLE

if TYPE_CHECKING:
    from querycoord.coordinator import Coordinator, Leadership
    from querycoord.nodes.querynode import QueryNode
    from querycoord.nodes.streamnode import StreamNode
    from querycoord.task.model import Task
    from querycoord.task.scheduler import Scheduler

# Task durations run from milliseconds (a release) to the trigger deadline (600 s).
TASK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
ETCD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
HEARTBEAT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1)
# The time a scrape waits for etcd (sessions, db size, alarms) before reporting it unreachable.
ETCD_SCRAPE_TIMEOUT = 2.0
# Distinct etcd operation labels; any further operation is counted as "other".
MAX_OPERATIONS = 64

# ----- events: the coordinator -------------------------------------------------------------------------------------
TASKS_FINISHED = Counter(
    "querycoord_tasks_finished_total", "Trigger tasks finished, by kind, trigger condition and result "
    "(done, failed, cancelled)", ["kind", "trigger", "result"])
TASK_DURATION = Histogram(
    "querycoord_task_duration_seconds", "Trigger tasks from creation to finish (a resumed trigger counts from its "
    "first creation), by kind and result", ["kind", "result"], buckets=TASK_BUCKETS)
CHILD_DURATION = Histogram(
    "querycoord_child_task_duration_seconds", "Child tasks from planning to done, retries included, by kind",
    ["kind"], buckets=TASK_BUCKETS)
CHILD_RETRIES = Counter(
    "querycoord_child_task_retries_total", "Failed child task attempts retried on the same node, by kind", ["kind"])
CHILD_RESCHEDULES = Counter(
    "querycoord_child_task_reschedules_total", "Child tasks rescheduled to other nodes, by kind", ["kind"])
LEADER_CHANGES = Counter(
    "querycoord_leader_changes_total", "Leaderships this coordinator took (change=acquired) and lost (change=lost)",
    ["change"])
TAKEOVER_SECONDS = Histogram(
    "querycoord_leader_takeover_seconds", "From winning the election to leading: reload of query meta, nodes and "
    "task trees, start of the leader's loops", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
HEARTBEAT_DURATION = Histogram(
    "querycoord_stream_heartbeat_duration_seconds", "Stream node heartbeats handled by the leader's stream manager",
    buckets=HEARTBEAT_BUCKETS)
NODES_FENCED = Counter(
    "querycoord_nodes_fenced_total", "Node sessions the leader fenced (lease revoked) for a value too large or "
    "written too often, by reason", ["reason"])
# ----- events: meta (through meta.observe) ----------------------------------------------------------------------------
FENCED_WRITES_REFUSED = Counter(
    "querycoord_fenced_writes_refused_total", "Writes etcd refused because this process's leader fence was gone")
ETCD_DURATION = Histogram(
    "querycoord_etcd_request_duration_seconds", "etcd calls, retries included, by operation",
    ["operation"], buckets=ETCD_BUCKETS)
ETCD_RETRIES = Counter(
    "querycoord_etcd_retries_total", "etcd call attempts retried after a transient failure, by operation",
    ["operation"])
ETCD_UNAVAILABLE = Counter(
    "querycoord_etcd_unavailable_total", "etcd calls that gave up (MetaUnavailable), by operation", ["operation"])
LOOP_ERRORS = Counter(
    "querycoord_background_loop_errors_total", "Exceptions a background loop met and went on after (meta.loops), "
    "by loop", ["loop"])
# ----- events: bounds on what callers may cost (querycoord/read_slots.py, querycoord/grpc_bounds.py) ---------------
READS_REFUSED = Counter(
    "querycoord_reads_refused_total", "Heavy reads (GetSegmentInfo, ListTasks, GetReplicas) refused with "
    "RESOURCE_EXHAUSTED because too many of their kind ran or waited, by read", ["read"])
OPEN_CALLS_REFUSED = Counter(
    "querycoord_open_calls_refused_total", "Calls of methods open to anyone (the gRPC health service) refused: "
    "request too large, or too many Watch streams, by reason", ["reason"])
# ----- events: the principals file (querycoord/auth.py) ---------------------------------------------------------------
AUTH_RELOAD_ERRORS = Counter(
    "querycoord_auth_reload_errors_total", "Changes of a principals file (or a token file it names) that could not be "
    "used: the previous table stayed in force")
AUTH_CONFIG_STALE = Gauge(
    "querycoord_auth_config_stale", "Principals tables in force that are older than their files, because the last "
    "change could not be used (0: every table is what its files say)")

_WORD = re.compile(r"[A-Za-z][A-Za-z_.]*")
_operations: set[str] = set()


def operation_label(operation: str) -> str:
    """The low-cardinality name of an etcd operation: its leading words, up to the first that carries a key or a
    number (``get tasks/7`` is ``get``, ``register session session/querynode-3`` is ``register session``)."""
    words = []
    for word in operation.split(" ", 3)[:3]:
        if not _WORD.fullmatch(word):
            break
        words.append(word)
    label = " ".join(words) or "other"
    if label not in _operations:
        if len(_operations) >= MAX_OPERATIONS:
            return "other"
        _operations.add(label)
    return label


def _etcd_call(operation: str, seconds: float) -> None:
    ETCD_DURATION.labels(operation_label(operation)).observe(seconds)


def _etcd_retry(operation: str) -> None:
    ETCD_RETRIES.labels(operation_label(operation)).inc()


def _etcd_unavailable(operation: str) -> None:
    ETCD_UNAVAILABLE.labels(operation_label(operation)).inc()


def _fenced_write_refused() -> None:
    FENCED_WRITES_REFUSED.inc()


def _loop_error(loop: str) -> None:
    LOOP_ERRORS.labels(loop).inc()


def install() -> None:
    """Count meta's events here (each process calls this once at start)."""
    observe.set_observers(on_etcd_call=_etcd_call, on_etcd_retry=_etcd_retry, on_etcd_unavailable=_etcd_unavailable,
                          on_fenced_write_refused=_fenced_write_refused, on_loop_error=_loop_error)


# ----- the scheduler's events -----------------------------------------------------------------------------------------
def kind_label(kind: int) -> str:
    """``TASK_KIND_LOAD_SEGMENT`` is ``load_segment``."""
    return qc.TaskKind.Name(kind).removeprefix("TASK_KIND_").lower()


def trigger_label(condition: int) -> str:
    """``TRIGGER_CONDITION_NODE_DOWN`` is ``node_down``."""
    return qc.TriggerCondition.Name(condition).removeprefix("TRIGGER_CONDITION_").lower()


def _since_created(task: Task) -> float:
    return max(0.0, time.time() - task.rec.created_ms / 1000) if task.rec.created_ms else 0.0


def trigger_finished(task: Task, error: BaseException | None) -> None:
    """A trigger answered its callers: done, cancelled (by a release) or failed."""
    from querycoord.task.model import TaskCancelled

    result = "done" if error is None else "cancelled" if isinstance(error, TaskCancelled) else "failed"
    kind = kind_label(task.KIND)
    TASKS_FINISHED.labels(kind, trigger_label(task.rec.trigger_condition), result).inc()
    TASK_DURATION.labels(kind, result).observe(_since_created(task))


def child_done(child: Task) -> None:
    CHILD_DURATION.labels(kind_label(child.KIND)).observe(_since_created(child))


def child_retried(child: Task) -> None:
    CHILD_RETRIES.labels(kind_label(child.KIND)).inc()


def child_rescheduled(child: Task) -> None:
    CHILD_RESCHEDULES.labels(kind_label(child.KIND)).inc()


# ----- leadership and streams -----------------------------------------------------------------------------------------
def leader_acquired(takeover_seconds: float) -> None:
    LEADER_CHANGES.labels("acquired").inc()
    TAKEOVER_SECONDS.observe(takeover_seconds)


def leader_lost() -> None:
    LEADER_CHANGES.labels("lost").inc()


def node_fenced(reason: str) -> None:
    NODES_FENCED.labels(reason).inc()


def heartbeat_handled(seconds: float) -> None:
    HEARTBEAT_DURATION.observe(seconds)


# ----- state read at scrape time: the coordinator -------------------------------------------------------------------
def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _scheduler_families(scheduler: Scheduler) -> list[Metric]:
    tasks = GaugeMetricFamily("querycoord_tasks", "Trigger tasks queued or running on the leader, by kind and state",
                              labels=["kind", "state"])
    children = GaugeMetricFamily("querycoord_child_tasks", "Child tasks of the leader's queued and running triggers, "
                                 "by kind and state", labels=["kind", "state"])
    counts: dict[tuple[str, str], int] = {}
    child_counts: dict[tuple[str, str], int] = {}
    for t in scheduler.pending():
        key = (kind_label(t.KIND), "running" if scheduler.is_running(t.id) else "queued")
        counts[key] = counts.get(key, 0) + 1
        for c in t.children:
            ckey = (kind_label(c.KIND), _child_state(c.state))
            child_counts[ckey] = child_counts.get(ckey, 0) + 1
    for key, n in sorted(counts.items()):
        tasks.add_metric(list(key), n)
    for key, n in sorted(child_counts.items()):
        children.add_metric(list(key), n)
    unremoved = _gauge("querycoord_tasks_unremoved", "Finished trees whose keys etcd has not removed yet (retried)",
                       len(scheduler.unremoved))
    return [tasks, children, unremoved]


def _child_state(state: int) -> str:
    # EXPIRED is Milvus's name for a finished task; users see DONE.
    name = qc.TaskState.Name(state).removeprefix("TASK_STATE_").lower()
    return "done" if name == "expired" else name


def _leader_families(lead: Leadership) -> list[Metric]:
    out: list[Metric] = [_gauge("querycoord_leader_fence_revision", "The etcd revision of this leader's fence",
                                lead.fence.revision)]
    out.extend(_scheduler_families(lead.scheduler))
    if lead.checker is not None:
        out.append(CounterMetricFamily("querycoord_checker_runs", "Checker passes in this leadership",
                                       value=lead.checker.runs))
        out.append(CounterMetricFamily("querycoord_checker_repairs", "Repair triggers the checker queued in this "
                                       "leadership", value=lead.checker.repairs))
        out.append(CounterMetricFamily("querycoord_checker_errors", "Checker passes that failed in this leadership",
                                       value=lead.checker.errors))
    segments = GaugeMetricFamily("querycoord_node_segments", "Sealed segments query meta places on each node",
                                 labels=["node_id"])
    channels = GaugeMetricFamily("querycoord_node_dm_channels", "DM channels query meta places on each node",
                                 labels=["node_id"])
    used = GaugeMetricFamily("querycoord_node_memory_used_bytes", "Memory of the segments query meta places on each "
                             "node", labels=["node_id"])
    capacity = GaugeMetricFamily("querycoord_node_memory_capacity_bytes", "Memory each online query node offers",
                                 labels=["node_id"])
    per_node = lead.meta.segment_count_by_node()
    per_node_channels = lead.meta.channel_count_by_node()
    online = {n.node_id: n for n in lead.nodes.online()}
    for node_id in sorted(set(per_node) | set(per_node_channels) | set(online)):
        label = [str(node_id)]
        segments.add_metric(label, per_node.get(node_id, 0))
        channels.add_metric(label, per_node_channels.get(node_id, 0))
        used.add_metric(label, lead.meta.node_memory_usage(node_id))
        if node_id in online:
            capacity.add_metric(label, online[node_id].capacity)
    out += [segments, channels, used, capacity,
            _gauge("querycoord_query_nodes_online", "Query nodes the leader sees online", len(online))]
    out.extend(_served_families(lead))
    if lead.streams is not None:
        out.extend(_stream_families(lead))
    return out


# ``querycoord.served.state.HEALTH_STATES``, not imported: the reference nodes import this module, and nothing of
# the coordinator side (tests/test_health.py checks both agree).
HEALTH_LABELS = ("green", "yellow", "red")


def _served_families(lead: Leadership) -> list[Metric]:
    """Health and load percentage of each loaded collection, live: from what online nodes hold
    (``querycoord.served``), so no gauge says 100 % while a target segment or DM channel is held by no online node
    of some replica."""
    if lead.served is None:
        return []
    by_health = GaugeMetricFamily("querycoord_collections_by_health", "Loaded collections by health: green (every "
                                  "replica whole), yellow (a replica lacks what another holds), red (something held "
                                  "by no replica)", labels=["state"])
    loaded = GaugeMetricFamily("querycoord_collection_loaded_percentage", "The in-memory percentage online query "
                               "nodes serve of each loaded collection", labels=["collection_id"])
    counts = dict.fromkeys(HEALTH_LABELS, 0)
    for served in lead.served.collections():
        counts[served.health] += 1
        loaded.add_metric([str(served.collection_id)], served.percentage)
    for state in HEALTH_LABELS:
        by_health.add_metric([state], counts[state])
    return [by_health, loaded]


def _stream_families(lead: Leadership) -> list[Metric]:
    streams = lead.streams
    assert streams is not None
    by_state = {stream_pb2.StreamState.Name(s).removeprefix("STREAM_").lower(): 0
                for s in stream_pb2.StreamState.values() if s}
    for info in streams.show_streams(stream_pb2.ShowStreamsRequest(with_tasks=False)).streams:
        name = stream_pb2.StreamState.Name(info.state).removeprefix("STREAM_").lower()
        by_state[name] = by_state.get(name, 0) + 1
    family = GaugeMetricFamily("querycoord_streams", "Streams by state on the leader", labels=["state"])
    for name, n in sorted(by_state.items()):
        family.add_metric([name], n)
    return [
        family,
        _gauge("querycoord_stream_manager_watching", "1 while the stream manager watches after a leader change "
               "(replies carry no actions)", 1 if streams.state.name == "WATCH" else 0),
        CounterMetricFamily("querycoord_stream_redeploys", "Stream tasks redeployed in this leadership",
                            value=streams.redeploys),
        CounterMetricFamily("querycoord_stream_adoptions", "Running streams adopted after a leader change",
                            value=streams.adopted),
        CounterMetricFamily("querycoord_stream_checker_repairs", "Stream tasks the stream checker repaired in this "
                            "leadership", value=streams.checker_repairs),
        CounterMetricFamily("querycoord_stream_heartbeats_rejected", "Heartbeats refused (no live session of the "
                            "sender) in this leadership", value=streams.rejected_heartbeats),
    ]


async def _session_families(coord: Coordinator) -> list[Metric]:
    """Sessions by role, read from etcd within ``ETCD_SCRAPE_TIMEOUT``."""
    kv = coord.kv

    async def read() -> dict[str, int]:
        assert kv is not None
        return {role: await kv.count_prefix(role_prefix(role))
                for role in (QUERYCOORD_ROLE, QUERYNODE_ROLE, STREAMNODE_ROLE)}

    reachable = "1 when this scrape's etcd reads (the sessions) answered"
    try:
        counts = await asyncio.wait_for(read(), ETCD_SCRAPE_TIMEOUT) if kv is not None else None
    except Exception:
        counts = None
    if counts is None:
        return [_gauge("querycoord_etcd_reachable", reachable, 0)]
    sessions = GaugeMetricFamily("querycoord_sessions_online", "Live sessions in etcd, by role", labels=["role"])
    for role, n in sorted(counts.items()):
        sessions.add_metric([role], n)
    return [_gauge("querycoord_etcd_reachable", reachable, 1), sessions]


def _space_families(coord: Coordinator) -> list[Metric]:
    """etcd's space and alarms as the coordinator's space monitor last polled them (none before its first poll)."""
    space = coord.space
    if space is None or not space.checked_at:
        return []
    alarm = GaugeMetricFamily("querycoord_etcd_alarm", "1 while etcd has this alarm raised (NOSPACE: every write "
                              "refused until `querycoord etcd maintain`)", labels=["alarm"])
    names = {name for _, name in space.alarms}
    for name in sorted(names | {"NOSPACE"}):
        alarm.add_metric([name], 1 if name in names else 0)
    return [
        alarm,
        _gauge("querycoord_etcd_nospace", "1 while this coordinator holds etcd to be out of space (the alarm, or a "
               "write just refused for it): writes wait or are refused", 1 if space.nospace else 0),
        CounterMetricFamily("querycoord_etcd_nospace_raised", "Times this coordinator saw the NOSPACE alarm go up",
                            value=space.raised),
        _gauge("querycoord_etcd_db_size_bytes", "Size of the etcd member's db file (the backend quota applies to it)",
               space.db_size),
        _gauge("querycoord_etcd_db_size_in_use_bytes", "Bytes of the etcd member's db in use (the rest is freed by "
               "a defragmentation)", space.db_size_in_use),
        _gauge("querycoord_etcd_quota_bytes", "etcd's backend quota (0: unknown)", space.quota),
        _gauge("querycoord_etcd_space_last_check_timestamp_seconds", "When the space monitor last read etcd's "
               "alarms and db size", space.checked_at),
    ]


async def coordinator_families(coord: Coordinator) -> list[Metric]:
    """The coordinator's state at scrape time (runs on its event loop)."""
    out: list[Metric] = [_gauge("querycoord_leader", "1 while this coordinator leads (has taken over), else 0",
                                1 if coord.is_leader else 0)]
    lead = coord.leadership
    if lead is not None and coord.is_leader:
        out.extend(_leader_families(lead))
    mirror = coord.mirror
    out.append(_gauge("querycoord_warm_standby_revision", "etcd revision up to which this standby's copy of the "
                      "query meta is current (0: no copy: a leader, a copy still being read, or --warm-standby 0)",
                      mirror.revision if mirror is not None and mirror.ready else 0))
    targets = coord.targets
    out.append(_gauge("querycoord_checker_targets_revision", "etcd revision up to which this coordinator's copy of "
                      "the catalog (the checker's targets) is current (0: no copy: still being read, or a remote "
                      "catalog)", targets.revision if targets is not None and targets.ready else 0))
    out.extend(await _session_families(coord))
    out.extend(_space_families(coord))
    return out


# ----- state read at scrape time: the nodes ----------------------------------------------------------------------
def _session_up(node: QueryNode | StreamNode) -> int:
    try:
        session = node.session
    except RuntimeError:
        return 0
    return 1 if session.info is not None and not session.lost.is_set() else 0


def querynode_families(node: QueryNode) -> list[Metric]:
    state = node.state
    return [
        _gauge("querycoord_querynode_session_up", "1 while the node's session is registered and alive",
               _session_up(node)),
        _gauge("querycoord_querynode_segments", "Sealed segments this query node holds", len(state.segments)),
        _gauge("querycoord_querynode_dm_channels", "DM channels this query node watches", len(state.dm_channels)),
        _gauge("querycoord_querynode_memory_used_bytes", "Memory of the segments this query node holds",
               state.memory_used),
        _gauge("querycoord_querynode_memory_capacity_bytes", "Memory this query node offers", state.capacity_bytes),
        _gauge("querycoord_querynode_fence_revision", "The newest leader fence revision this node has seen (calls "
               "with an older one are refused)", state.fence.leader_revision),
        CounterMetricFamily("querycoord_querynode_mutating_calls", "Mutating calls this query node received",
                            value=node.injector.mutating_calls),
    ]


def streamnode_families(node: StreamNode) -> list[Metric]:
    state = node.state
    tasks = GaugeMetricFamily("querycoord_streamnode_tasks", "Stream tasks this node holds, by status",
                              labels=["status"])
    by_status = {stream_pb2.TaskStatus.Name(s).removeprefix("TASK_").lower(): 0
                 for s in stream_pb2.TaskStatus.values() if s}
    for t in state.tasks.values():
        name = stream_pb2.TaskStatus.Name(t.status).removeprefix("TASK_").lower()
        by_status[name] = by_status.get(name, 0) + 1
    for name, n in sorted(by_status.items()):
        tasks.add_metric([name], n)
    heartbeats = CounterMetricFamily("querycoord_streamnode_heartbeats", "Heartbeats sent, by result (replied: a "
                                     "coordinator answered; unanswered: none did)", labels=["result"])
    heartbeats.add_metric(["replied"], node.replies)
    heartbeats.add_metric(["unanswered"], node.failed_heartbeats)
    return [
        _gauge("querycoord_streamnode_session_up", "1 while the node's session is registered and alive",
               _session_up(node)),
        tasks,
        heartbeats,
        _gauge("querycoord_streamnode_vgroups", "Vgroups this node leads", len(state.vgroups)),
        _gauge("querycoord_streamnode_snode_id", "The snode this node hosts (0: none)", state.snode_id),
    ]


__all__ = ["coordinator_families", "install", "operation_label", "querynode_families", "streamnode_families"]
