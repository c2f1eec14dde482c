"""The coordinator's state as Prometheus reads it at scrape time: leadership, scheduler, checker, served figures,
streams, sessions, etcd's space.

Read from the objects that already hold the state, so nothing has to be kept
in step; counters that live in a leader's objects start again at zero with
each leadership (Prometheus reads that as a counter reset). The events
(counters and histograms updated where things happen) are ``querycoord.common.metrics``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from meta.session import role_prefix
from proto import querycoord_pb2 as qc
from proto import stream_pb2
from querycoord.checkers.activation import CHECK_KINDS
from querycoord.cluster.lifecycle import state_name
from querycoord.common.metrics import ETCD_SCRAPE_TIMEOUT, kind_label
from querycoord.common.metrics import gauge as _gauge
from querycoord.common.protocol import QUERYCOORD_ROLE, QUERYNODE_ROLE, STREAMNODE_ROLE
from querycoord.leader.maintenance import holds_placements
from querycoord.served.state import HEALTH_STATES
from querycoord.serving.stream_metrics import stream_progress_families
from querycoord.task.throttle import KINDS as MOVE_KINDS

if TYPE_CHECKING:
    from querycoord.leader.view import CoordinatorView, Leadership
    from querycoord.task.scheduler import Scheduler


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
    unremoved = _gauge("querycoord_tasks_unremoved", "Finished trees whose keys etcd has not removed yet, and "
                       "triggers whose persist etcd never answered (removed at the next sweep)",
                       len(scheduler.unremoved))
    return [tasks, children, unremoved, *_move_families(scheduler)]


def _move_families(scheduler: Scheduler) -> list[Metric]:
    """Segment moves in flight and waiting for a slot, by kind (recovery, balance: ``task.throttle``)."""
    throttle = scheduler.env.throttle
    running = GaugeMetricFamily("querycoord_moves_running", "Segment moves (LoadSegments calls of repairs and "
                                "balances) in flight on the leader, by kind", labels=["kind"])
    waiting = GaugeMetricFamily("querycoord_moves_throttled", "Segment moves waiting for a slot of their budget "
                                "(--max-recoveries-per-node and the like), by kind", labels=["kind"])
    for kind in MOVE_KINDS:
        running.add_metric([kind], throttle.running[kind])
        waiting.add_metric([kind], throttle.waiting[kind])
    return [running, waiting]


def _child_state(state: int) -> str:
    # EXPIRED is Milvus's name for a finished task; users see DONE.
    name = qc.TaskState.Name(state).removeprefix("TASK_STATE_").lower()
    return "done" if name == "expired" else name


def _leader_families(lead: Leadership) -> list[Metric]:
    out: list[Metric] = [_gauge("querycoord_leader_fence_revision", "The etcd revision of this leader's fence",
                                lead.fence.revision)]
    out.extend(_scheduler_families(lead.scheduler))
    out.append(CounterMetricFamily("querycoord_checker_runs", "Checker passes in this leadership",
                                   value=lead.checker.runs))
    out.append(CounterMetricFamily("querycoord_checker_passes", "Checker passes finished in this leadership",
                                   value=lead.checker.passes))
    out.append(CounterMetricFamily("querycoord_checker_pass_seconds", "Wall seconds of the checker passes finished "
                                   "in this leadership", value=lead.checker.pass_seconds))
    out.append(CounterMetricFamily("querycoord_checker_pass_cpu_seconds", "Process CPU seconds (every thread) "
                                   "while the checker passes finished in this leadership ran",
                                   value=lead.checker.pass_cpu_seconds))
    out.append(CounterMetricFamily("querycoord_checker_skipped_collections", "Collections checker passes skipped in "
                                   "this leadership: every input as when a pass last found nothing to do",
                                   value=lead.checker.unchanged.skipped))
    out.append(CounterMetricFamily("querycoord_checker_repairs", "Repair triggers the checker queued in this "
                                   "leadership", value=lead.checker.repairs))
    out.append(CounterMetricFamily("querycoord_checker_errors", "Checker passes that failed in this leadership",
                                   value=lead.checker.errors))
    out.extend(_switch_families(lead))
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
    shown = {n for n in set(per_node) | set(per_node_channels) if holds_placements(lead, n)}
    for node_id in sorted(shown | set(online)):
        label = [str(node_id)]
        segments.add_metric(label, per_node.get(node_id, 0))
        channels.add_metric(label, per_node_channels.get(node_id, 0))
        used.add_metric(label, lead.meta.node_memory_usage(node_id))
        if node_id in online:
            capacity.add_metric(label, online[node_id].capacity)
    out += [segments, channels, used, capacity,
            _gauge("querycoord_query_nodes_online", "Query nodes the leader sees online", len(online))]
    out.extend(_served_families(lead))
    out.extend(_stream_families(lead))
    return out


def _switch_families(lead: Leadership) -> list[Metric]:
    """Balance paused, and which check kinds run (``querycoord.checkers.activation``), as the leader holds them."""
    switches = lead.checker.switches
    active = GaugeMetricFamily("querycoord_checker_active", "1 while this check kind runs, 0 while an operator has "
                               "turned it off (`querycoord checkers`)", labels=["checker"])
    for kind in CHECK_KINDS:
        active.add_metric([kind.name], 1 if switches.is_active(kind.name) else 0)
    return [_gauge("querycoord_balance_paused", "1 while balance is paused (`querycoord balance pause`): no "
                   "optional move is planned; repairs, loads and releases still run", 1 if switches.balance_paused
                   else 0), active]


# The gauge's labels are the served view's states, in their order.
HEALTH_LABELS = HEALTH_STATES


def _served_families(lead: Leadership) -> list[Metric]:
    """Health and load percentage of each loaded collection, live: from what online nodes hold
    (``querycoord.served``), so no gauge says 100 % while a target segment or DM channel is held by no online node
    of some replica."""
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


async def _session_families(coord: CoordinatorView) -> list[Metric]:
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


def _space_families(coord: CoordinatorView) -> list[Metric]:
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


LIFECYCLES = ("active", "cordoned", "draining", "drained")


def _lifecycle_families(lead: Leadership) -> list[Metric]:
    """Each known query node's maintenance lifecycle (1 for its state, 0 for the others) and what its drain has
    left to move."""
    lifecycles = lead.lifecycles
    state = GaugeMetricFamily("querycoord_node_lifecycle", "1 for the maintenance lifecycle each query node is in "
                              "(active, cordoned, draining, drained), 0 for the others", labels=["node", "state"])
    left = GaugeMetricFamily("querycoord_node_drain_copies_left", "Copies (segments and DM channel watches) a "
                             "draining query node still holds (0 once drained)", labels=["node"])
    if lifecycles is None:
        return [state, left]
    for node_id in sorted(set(lead.nodes.nodes) | set(lifecycles.records)):
        current = state_name(lifecycles.state(node_id))
        for name in LIFECYCLES:
            state.add_metric([str(node_id), name], 1 if name == current else 0)
        progress = lifecycles.progress(node_id)
        if progress is not None:
            left.add_metric([str(node_id)], progress.copies_left)
    return [state, left]


async def coordinator_families(coord: CoordinatorView) -> list[Metric]:
    """The coordinator's state at scrape time (runs on its event loop)."""
    out: list[Metric] = [_gauge("querycoord_leader", "1 while this coordinator leads (has taken over), else 0",
                                1 if coord.is_leader else 0)]
    lead = coord.leadership
    if lead is not None and coord.is_leader:
        out.extend(_leader_families(lead))
        out.extend(_lifecycle_families(lead))
        out.extend(stream_progress_families(lead.streams, coord.config.limits.max_stream_metrics))
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


__all__ = ["coordinator_families"]
