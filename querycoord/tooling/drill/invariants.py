"""The invariants checked once the drill's workload has quiesced, over plain data.

The inputs are what the drill collected: the expected load state of every
collection (from the answers the client got), the catalog (what each loaded
partition consists of), query meta as persisted in etcd, and what every
online node reports through GetDataDistribution. Keeping the check a pure
function of plain data lets tests feed it hand-made violations.

Counting (the drill's JSON line):

* ``lost_tasks``: requests answered SUCCESS whose effect is missing at the
  end, one per collection (a loaded collection not at 100 %, a segment or DM
  channel of it held by no node, a released collection still in meta or on
  a node);
* ``duplicate_segments``: segments held by more than one node;
* ``invariant_violations``: everything else (a DM channel watched twice,
  segments of unloaded partitions held, segments compacted away still held, meta disagreeing with the nodes,
  task keys left, unanswered calls, answers that are not a clear error, no
  quiescence, no takeover).

"Every call got an answer" means success or a *clear* error (DESIGN.md:
every error names what was wrong and what to do): CONFLICT, NOT_FOUND,
NO_AVAILABLE_NODE... An UNEXPECTED_ERROR, or a NOT_LEADER / STALE_LEADER
that reached the caller instead of being retried by the client helper, is
not one: it counts as a violation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from proto import querynode_pb2

LoadState = Literal["released", "collection", "partitions"]


@dataclass
class Expected:
    """What the answers say a collection must be at the end, and the request that says so."""

    state: LoadState = "released"
    partitions: frozenset[int] = frozenset()
    last_success: str = ""  # "" when no request about it succeeded

    def loaded_partitions(self, catalog_parts: frozenset[int]) -> frozenset[int]:
        if self.state == "collection":
            return catalog_parts
        if self.state == "partitions":
            return self.partitions
        return frozenset()


@dataclass
class CatalogColl:
    partitions: dict[int, frozenset[int]]  # partition -> segment ids
    channels: frozenset[str]


@dataclass
class MetaColl:
    load_type: str  # "collection" / "partitions"
    percentage: int
    partitions: frozenset[int]


@dataclass
class MetaView:
    collections: dict[int, MetaColl] = field(default_factory=dict)
    segments: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # sid -> (cid, pid, node)
    channels: dict[tuple[int, str], int] = field(default_factory=dict)  # (cid, channel) -> node


@dataclass
class NodeView:
    segments: dict[int, tuple[int, int]] = field(default_factory=dict)  # sid -> (cid, pid)
    dm_channels: set[tuple[int, str]] = field(default_factory=set)
    other_channels: set[tuple[int, str]] = field(default_factory=set)  # delta / query channels


def node_view(d: querynode_pb2.GetDataDistributionResponse) -> NodeView:
    """What a node reports holding, as the check reads it (the drills ask over gRPC, tests ask the node)."""
    view = NodeView()
    for s in d.segments:
        view.segments[s.segment_id] = (s.collection_id, s.partition_id)
    for c in d.channels:
        (view.dm_channels if c.kind == querynode_pb2.CHANNEL_KIND_DM else view.other_channels).add(
            (c.collection_id, c.channel_name))
    return view


@dataclass
class CheckResult:
    lost_tasks: int = 0
    duplicate_segments: int = 0
    invariant_violations: int = 0
    details: list[str] = field(default_factory=list)
    # name -> (passed, one-line summary), in a fixed order for the table
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def violation(self, what: str) -> None:
        self.invariant_violations += 1
        self.details.append(f"violation: {what}")


def _short(items: list[int] | set[int], n: int = 6) -> str:
    s = sorted(items)
    return f"{s[:n]}{' ...' if len(s) > n else ''} ({len(s)})"


#: Error codes that are not a clear answer to a client (see module docstring).
UNCLEAR_CODES = frozenset({"UNEXPECTED_ERROR", "NOT_LEADER", "STALE_LEADER"})


def check(expected: dict[int, Expected], catalog: dict[int, CatalogColl], meta: MetaView,
          nodes: dict[int, NodeView], *, task_keys: dict[str, int], unanswered: list[str],
          unclear: list[str] | None = None, extra_violations: list[str] | None = None) -> CheckResult:
    """Every invariant of the drill (see module docstring); ``nodes`` are the online nodes only."""
    res = CheckResult()
    holders: dict[int, set[int]] = {}
    for nid, nv in nodes.items():
        for sid in nv.segments:
            holders.setdefault(sid, set()).add(nid)
    watchers: dict[tuple[int, str], set[int]] = {}
    for nid, nv in nodes.items():
        for watched in nv.dm_channels:
            watchers.setdefault(watched, set()).add(nid)

    # --- duplicates -------------------------------------------------------------------------------------------
    dups = {sid: ns for sid, ns in holders.items() if len(ns) > 1}
    res.duplicate_segments = len(dups)
    for sid, ns in sorted(dups.items())[:20]:
        res.details.append(f"duplicate: segment {sid} held by nodes {sorted(ns)}")
    res.checks["no segment on more than one node"] = (not dups, f"{len(dups)} duplicated")

    # --- compacted away -----------------------------------------------------------------------------------------
    # A segment of a known collection that the catalog no longer lists (a compaction replaced it) must be
    # released by the handoff; meta and the nodes could agree on keeping it, so the checks below miss it.
    listed = {sid for cat in catalog.values() for sids in cat.partitions.values() for sid in sids}
    gone: dict[int, list[int]] = {}
    for nv in nodes.values():
        for sid, (cid, _pid) in nv.segments.items():
            if cid in catalog and sid not in listed:
                gone.setdefault(cid, []).append(sid)
    for cid, sids in sorted(gone.items()):
        res.violation(f"collection {cid}: segments no longer in the catalog (compacted away) still held: "
                      f"{_short(sorted(set(sids)))}")
    res.checks["no segment held that the catalog no longer has"] = (not gone, f"{len(gone)} collections")

    # --- loaded collections -----------------------------------------------------------------------------------
    lost_before = res.lost_tasks
    n_loaded = n_released = 0
    dup_channels = 0
    stray_partitions = 0
    for cid, exp in sorted(expected.items()):
        cat = catalog.get(cid)
        if cat is None:
            res.violation(f"collection {cid} is not in the catalog")
            continue
        want_parts = exp.loaded_partitions(frozenset(cat.partitions))
        if not want_parts:
            continue
        n_loaded += 1
        problems: list[str] = []
        m = meta.collections.get(cid)
        if m is None:
            problems.append("not in query meta")
        else:
            if m.percentage != 100:
                problems.append(f"at {m.percentage} %")
            if m.partitions != want_parts:
                problems.append(f"meta has partitions {sorted(m.partitions)}, expected {sorted(want_parts)}")
            if m.load_type != exp.state:
                problems.append(f"loaded as {m.load_type}, expected {exp.state}")
        missing = [sid for p in want_parts for sid in cat.partitions.get(p, ()) if sid not in holders]
        if missing:
            problems.append(f"segments on no online node: {_short(missing)}")
        unwatched = [ch for ch in cat.channels if (cid, ch) not in watchers]
        if unwatched:
            problems.append(f"DM channels watched by no online node: {sorted(unwatched)}")
        if problems:
            res.lost_tasks += 1
            res.details.append(f"lost: collection {cid} (last answered: {exp.last_success}): {'; '.join(problems)}")
        for ch in cat.channels:
            ws = watchers.get((cid, ch), set())
            if len(ws) > 1:
                dup_channels += 1
                res.violation(f"DM channel {ch} of collection {cid} watched by nodes {sorted(ws)}")
        not_loaded = {sid for p, sids in cat.partitions.items() if p not in want_parts for sid in sids}
        held_stray = sorted(sid for sid in not_loaded if sid in holders)
        if held_stray:
            stray_partitions += 1
            res.violation(f"collection {cid}: segments of partitions not loaded are held: {_short(held_stray)}")
    res.checks["loaded collections at 100 %, every segment and DM channel on an online node"] = (
        res.lost_tasks == lost_before, f"{n_loaded} loaded, {res.lost_tasks - lost_before} incomplete")
    res.checks["every DM channel watched by at most one node"] = (not dup_channels, f"{dup_channels} watched twice")
    res.checks["no segment of an unloaded partition held"] = (not stray_partitions,
                                                             f"{stray_partitions} collections")

    # --- released collections ---------------------------------------------------------------------------------
    lost_before = res.lost_tasks
    for cid, exp in sorted(expected.items()):
        cat = catalog.get(cid)
        if cat is None or exp.loaded_partitions(frozenset(cat.partitions)):
            continue
        n_released += 1
        problems = []
        if cid in meta.collections:
            problems.append("still in query meta")
        held = sorted(sid for nv in nodes.values() for sid, (c, _) in nv.segments.items() if c == cid)
        if held:
            problems.append(f"segments still held: {_short(held)}")
        chans = sorted({f"{ch}@{nid}" for nid, nv in nodes.items() for c, ch in nv.dm_channels | nv.other_channels
                        if c == cid})
        if chans:
            problems.append(f"channels still watched: {chans[:6]}")
        if problems:
            if exp.last_success:
                res.lost_tasks += 1
                res.details.append(f"lost: collection {cid} (last answered: {exp.last_success}): "
                                   f"{'; '.join(problems)}")
            else:
                res.violation(f"collection {cid} was never loaded successfully but: {'; '.join(problems)}")
    res.checks["released collections: nothing in meta or on any node"] = (
        res.lost_tasks == lost_before, f"{n_released} released, {res.lost_tasks - lost_before} left behind")

    # --- meta equals the nodes ------------------------------------------------------------------------------------
    before = res.invariant_violations
    for sid, (cid, _pid, nid) in sorted(meta.segments.items()):
        if nid not in holders.get(sid, set()):
            res.violation(f"meta places segment {sid} (collection {cid}) on node {nid}, which does not hold it"
                          f" (held by {sorted(holders.get(sid, set()))})")
    for sid, ns in sorted(holders.items()):
        m_seg = meta.segments.get(sid)
        for nid in sorted(ns):
            if m_seg is None or m_seg[2] != nid:
                res.violation(f"node {nid} holds segment {sid}, meta says "
                              f"{'nothing' if m_seg is None else f'node {m_seg[2]}'}")
    for (cid, ch), nid in sorted(meta.channels.items()):
        if nid not in watchers.get((cid, ch), set()):
            res.violation(f"meta says node {nid} watches DM channel {ch} of collection {cid}; it does not")
    for key, ns in sorted(watchers.items()):
        m_node = meta.channels.get(key)
        for nid in sorted(ns):
            if m_node != nid:
                res.violation(f"node {nid} watches DM channel {key[1]} of collection {key[0]}, meta says "
                              f"{'nothing' if m_node is None else f'node {m_node}'}")
    n = res.invariant_violations - before
    res.checks["query meta equals the nodes' distribution"] = (n == 0, f"{n} mismatches")

    # --- tasks and calls ------------------------------------------------------------------------------------------
    left = {p: c for p, c in task_keys.items() if c}
    for p, c in sorted(left.items()):
        res.violation(f"{c} keys left under {p}")
    res.checks["no key under the task prefixes"] = (not left, f"{sum(left.values())} keys")
    for u in unanswered:
        res.violation(f"unanswered call: {u}")
    res.checks["every client call answered"] = (not unanswered, f"{len(unanswered)} unanswered")
    for u in unclear or []:
        res.violation(f"answer that is not a clear error: {u}")
    res.checks["every error answer is a clear one (no UNEXPECTED_ERROR / NOT_LEADER)"] = (
        not unclear, f"{len(unclear or [])} unclear")
    for v in extra_violations or []:
        res.violation(v)
    if extra_violations:
        res.checks["drill mechanics (quiescence, takeovers, pause round)"] = (False, f"{len(extra_violations)}")
    return res
