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
  time from the objects that already hold it (``querycoord.serving.coordinator_metrics``
  and ``querycoord.nodes.node_metrics``), so nothing has to be kept in step.

The engine reports its events through ``querycoord.common.events`` and meta through
``meta.observe``; ``install`` points both here. This module imports nothing
of the engine, the nodes or the coordinator, so every part may import it. Counters that
  live in a leader's objects (the checker's repairs, the stream manager's
  redeploys) start again at zero with each leadership, which Prometheus
  reads as a counter reset.

Labels stay low-cardinality: task kinds, trigger conditions, results,
states, session roles, etcd operations (the leading words of the operation
name, at most ``MAX_OPERATIONS`` distinct), and node ids only for the
leader's per-node gauges (bounded by the cluster's size). Never a task id.
"""

from __future__ import annotations

import re
import time

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from meta import observe
from proto import querycoord_pb2 as qc
from querycoord.common import events

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
LOOP_BLOCKED = Histogram(
    "querycoord_event_loop_blocked_seconds", "Times the event loop ran nothing else for over 50 ms, by how long "
    "(a block longer than the session TTL loses the session)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30, 60))
LOOP_BLOCKED_MAX = Gauge(
    "querycoord_event_loop_blocked_max_seconds", "The longest the event loop ran nothing else since the process "
    "started (counted from 50 ms)")
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
# ----- events: bounds on what callers may cost (serving/read_slots.py, security/grpc_bounds.py) -----------------------
READS_REFUSED = Counter(
    "querycoord_reads_refused_total", "Heavy reads (GetSegmentInfo, ListTasks, GetReplicas) refused with "
    "RESOURCE_EXHAUSTED because too many of their kind ran or waited, by read", ["read"])
OPEN_CALLS_REFUSED = Counter(
    "querycoord_open_calls_refused_total", "Calls of methods open to anyone (the gRPC health service) refused: "
    "request too large, or too many Watch streams, by reason", ["reason"])
# ----- events: the principals file (security/auth_principals.py) ------------------------------------------------------
AUTH_RELOAD_ERRORS = Counter(
    "querycoord_auth_reload_errors_total", "Changes of a principals file (or a token file it names) that could not be "
    "used: the previous table stayed in force")
AUTH_CONFIG_STALE = Gauge(
    "querycoord_auth_config_stale", "Principals tables in force that are older than their files, because the last "
    "change could not be used (0: every table is what its files say)")

_WORD = re.compile(r"[A-Za-z][A-Za-z_.]*")
OPERATION_LABELS: set[str] = set()


def operation_label(operation: str) -> str:
    """The low-cardinality name of an etcd operation: its leading words, up to the first that carries a key or a
    number (``get tasks/7`` is ``get``, ``register session session/querynode-3`` is ``register session``)."""
    words = []
    for word in operation.split(" ", 3)[:3]:
        if not _WORD.fullmatch(word):
            break
        words.append(word)
    label = " ".join(words) or "other"
    if label not in OPERATION_LABELS:
        if len(OPERATION_LABELS) >= MAX_OPERATIONS:
            return "other"
        OPERATION_LABELS.add(label)
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
    """Count meta's and the engine's events here (each process calls this once at start)."""
    observe.set_observers(on_etcd_call=_etcd_call, on_etcd_retry=_etcd_retry, on_etcd_unavailable=_etcd_unavailable,
                          on_fenced_write_refused=_fenced_write_refused, on_loop_error=_loop_error)
    events.set_observers(on_trigger_finished=_trigger_finished, on_child_done=_child_done,
                         on_child_retried=_child_retried, on_child_rescheduled=_child_rescheduled,
                         on_heartbeat_handled=_heartbeat_handled)


# ----- the engine's events (``common.events``, pointed here by ``install``) -------------------------------------------
def kind_label(kind: int) -> str:
    """``TASK_KIND_LOAD_SEGMENT`` is ``load_segment``."""
    return qc.TaskKind.Name(kind).removeprefix("TASK_KIND_").lower()


def trigger_label(condition: int) -> str:
    """``TRIGGER_CONDITION_NODE_DOWN`` is ``node_down``."""
    return qc.TriggerCondition.Name(condition).removeprefix("TRIGGER_CONDITION_").lower()


def _since(created_ms: int) -> float:
    return max(0.0, time.time() - created_ms / 1000) if created_ms else 0.0


def _trigger_finished(kind: int, condition: int, created_ms: int, result: str) -> None:
    """A trigger answered its callers: done, cancelled (by a release) or failed."""
    label = kind_label(kind)
    TASKS_FINISHED.labels(label, trigger_label(condition), result).inc()
    TASK_DURATION.labels(label, result).observe(_since(created_ms))


def _child_done(kind: int, created_ms: int) -> None:
    CHILD_DURATION.labels(kind_label(kind)).observe(_since(created_ms))


def _child_retried(kind: int) -> None:
    CHILD_RETRIES.labels(kind_label(kind)).inc()


def _child_rescheduled(kind: int) -> None:
    CHILD_RESCHEDULES.labels(kind_label(kind)).inc()


def _heartbeat_handled(seconds: float) -> None:
    HEARTBEAT_DURATION.observe(seconds)

# ----- leadership and streams -----------------------------------------------------------------------------------------
def leader_acquired(takeover_seconds: float) -> None:
    LEADER_CHANGES.labels("acquired").inc()
    TAKEOVER_SECONDS.observe(takeover_seconds)


def leader_lost() -> None:
    LEADER_CHANGES.labels("lost").inc()


def node_fenced(reason: str) -> None:
    NODES_FENCED.labels(reason).inc()


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    """One unlabelled gauge read at scrape time (``coordinator_metrics``, ``nodes.node_metrics``)."""
    return GaugeMetricFamily(name, documentation, value=value)


__all__ = ["gauge", "install", "kind_label", "operation_label", "trigger_label"]
