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
* ``duplicate_segments``: segments held by more than one node of one replica;
* ``invariant_violations``: everything else (a DM channel watched twice in a
  replica, replicas sharing a node, a copy on a node outside the collection's replicas, a replica on a node
  that is not online, segments of unloaded partitions held, segments compacted away still held, meta disagreeing
  with the nodes copy by copy, task keys left, unanswered calls, answers that are not a clear error, no
  quiescence, no takeover).

Replicas (``replica_number``): a loaded collection's replicas own disjoint sets of nodes, and every segment and
DM channel it loads is held exactly once by the nodes of each replica ("exactly once per replica"). A collection
whose meta lists no replica (hand-made views, records from before replicas) has one implicit replica, id 0, on
every node: the single-copy checks are its N=1 case. ``replica_changes`` compares two observations of the
replicas (across a leader kill, a node kill, a phase): they keep their ids, and change nodes only when one died
(a spare may join the replica that needs room); a live node never moves from one replica to another.

"Every call got an answer" means success or a *clear* error (DESIGN.md:
every error names what was wrong and what to do): CONFLICT, NOT_FOUND,
NO_AVAILABLE_NODE... An UNEXPECTED_ERROR, or a NOT_LEADER / STALE_LEADER
that reached the caller instead of being retried by the client helper, is
not one: it counts as a violation.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
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
    sources: dict[int, tuple[int, ...]] = field(default_factory=dict)  # segment -> what it was compacted from


@dataclass
class MetaColl:
    load_type: str  # "collection" / "partitions"
    percentage: int
    partitions: frozenset[int]
    # replica id -> its nodes; {}: one implicit replica (id 0) that any node serves
    replicas: dict[int, frozenset[int]] = field(default_factory=dict)


#: Every copy of a segment or DM watch: replica id -> node (a bare node id is one copy, in replica 0).
Copies = dict[int, int]


@dataclass
class MetaView:
    collections: dict[int, MetaColl] = field(default_factory=dict)
    segments: dict[int, tuple[int, int, int | Copies]] = field(default_factory=dict)  # sid -> (cid, pid, copies)
    channels: dict[tuple[int, str], int | Copies] = field(default_factory=dict)  # (cid, channel) -> copies


def copies_of(held: int | Copies) -> Copies:
    """A meta view's copies as replica id -> node (a bare node id: one copy in replica 0; 0: none)."""
    if isinstance(held, dict):
        return held
    return {0: held} if held else {}


def _where(held: Copies) -> str:
    if not held:
        return "nothing"
    if len(held) == 1:
        return f"node {next(iter(held.values()))}"
    return "nodes " + ", ".join(f"{n} (replica {r})" for r, n in sorted(held.items()))


def _lists(held: Copies, replica: int, node: int, recorded: bool) -> bool:
    """Whether meta's copies include ``node``'s copy: as replica ``replica``'s when the collection records
    replicas, else anywhere (the implicit replica)."""
    return held.get(replica) == node if recorded else node in held.values()


class _Replicas:
    """Which replica of its collection a node's copy counts for: ``None`` when the node is in none of them."""

    def __init__(self, meta: MetaView):
        self.by_node: dict[int, dict[int, int]] = {}  # cid -> node -> replica id (recorded replicas only)
        for cid, m in meta.collections.items():
            self.by_node[cid] = {n: rid for rid, nodes in m.replicas.items() for n in nodes}
        self.meta = meta

    def ids(self, cid: int) -> list[int]:
        m = self.meta.collections.get(cid)
        return sorted(m.replicas) if m is not None and m.replicas else [0]

    def recorded(self, cid: int) -> bool:
        m = self.meta.collections.get(cid)
        return m is not None and bool(m.replicas)

    def of(self, cid: int, node: int) -> int | None:
        if not self.recorded(cid):
            return 0  # the implicit replica: every node (and any collection meta does not know)
        return self.by_node[cid].get(node)

    def split(self, cid: int, holders: set[int]) -> tuple[dict[int, set[int]], set[int]]:
        """Holders by replica, and holders in no replica of the collection (strays)."""
        by: dict[int, set[int]] = {}
        strays: set[int] = set()
        for n in holders:
            r = self.of(cid, n)
            (strays if r is None else by.setdefault(r, set())).add(n)
        return by, strays


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
    notes: list[str] = field(default_factory=list)  # not violations: units excused as unplaceable
    kept_sources: set[int] = field(default_factory=set)  # compacted away, still served (see "compacted away")
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


@dataclass
class _Seen:
    """The check's inputs with what the online nodes hold indexed as every invariant reads it: who holds each
    segment (and its collection, as the nodes report it), who watches each DM channel, and which replica each
    node's copy counts for."""

    catalog: dict[int, CatalogColl]
    meta: MetaView
    nodes: dict[int, NodeView]
    reps: _Replicas
    holders: dict[int, set[int]] = field(default_factory=dict)  # segment -> nodes holding it
    seg_coll: dict[int, int] = field(default_factory=dict)  # segment -> its collection, as the nodes report it
    watchers: dict[tuple[int, str], set[int]] = field(default_factory=dict)  # (cid, DM channel) -> nodes

    @classmethod
    def of(cls, catalog: dict[int, CatalogColl], meta: MetaView, nodes: dict[int, NodeView]) -> _Seen:
        seen = cls(catalog, meta, nodes, _Replicas(meta))
        for nid, nv in nodes.items():
            for sid, (cid, _pid) in nv.segments.items():
                seen.holders.setdefault(sid, set()).add(nid)
                seen.seg_coll[sid] = cid
        for nid, nv in nodes.items():
            for watched in nv.dm_channels:
                seen.watchers.setdefault(watched, set()).add(nid)
        return seen

    def in_replica(self, cid: int, held_by: set[int], rid: int) -> bool:
        """Whether a node of replica ``rid`` of ``cid`` is among ``held_by``."""
        return bool(self.reps.split(cid, held_by)[0].get(rid))


def _check_duplicates(res: CheckResult, seen: _Seen) -> None:
    """No segment on more than one node of a replica (counted in ``duplicate_segments``, the first 20 named)."""
    dups: dict[int, dict[int, set[int]]] = {}
    for sid, ns in seen.holders.items():
        by, _strays = seen.reps.split(seen.seg_coll[sid], ns)
        twice = {r: g for r, g in by.items() if len(g) > 1}
        if twice:
            dups[sid] = twice
    res.duplicate_segments = len(dups)
    for sid, twice in sorted(dups.items())[:20]:
        for r, g in sorted(twice.items()):
            res.details.append(f"duplicate: segment {sid} held by nodes {sorted(g)}{f' of replica {r}' if r else ''}")
    res.checks["no segment on more than one node of a replica"] = (not dups, f"{len(dups)} duplicated")


def _check_replica_sets(res: CheckResult, seen: _Seen, replica_number: int | None) -> None:
    """A collection's replicas are disjoint, on online nodes, as many as asked."""
    reps = seen.reps
    for cid, coll in sorted(seen.meta.collections.items()):
        owner: dict[int, int] = {}
        for rid, members in sorted(coll.replicas.items()):
            for n in sorted(members):
                if n in owner:
                    res.violation(f"collection {cid}: node {n} is in replicas {owner[n]} and {rid}")
                owner[n] = rid
            offline = sorted(members - set(seen.nodes))
            if offline:
                res.violation(f"collection {cid}: replica {rid} lists nodes {offline}, which are not online")
        if replica_number is not None and len(reps.ids(cid)) != replica_number:
            res.violation(f"collection {cid} has {len(reps.ids(cid))} replicas {reps.ids(cid)}, loaded with "
                          f"replica_number {replica_number}")


def _check_replicas(res: CheckResult, seen: _Seen, replica_number: int | None) -> None:
    """The replica sets (``_check_replica_sets``), and no copy on a node outside its collection's replicas."""
    before = res.invariant_violations
    _check_replica_sets(res, seen, replica_number)
    reps = seen.reps
    strays: dict[int, set[int]] = {}
    for nid, nv in seen.nodes.items():
        held_cids = {cid for cid, _ in nv.segments.values()} | {cid for cid, _ in nv.dm_channels}
        for cid in held_cids:
            if reps.recorded(cid) and reps.of(cid, nid) is None:
                strays.setdefault(cid, set()).add(nid)
    for cid, ns in sorted(strays.items()):
        res.violation(f"collection {cid}: nodes {sorted(ns)} hold copies of it but are in none of its replicas "
                      f"{reps.ids(cid)}")
    n = res.invariant_violations - before
    res.checks["replicas: disjoint, on online nodes, as many as asked; no copy outside them"] = (
        n == 0, f"{sum(len(reps.ids(c)) for c in seen.meta.collections)} replicas of {len(seen.meta.collections)} "
                f"collections, {n} problems")


def _check_compacted_away(res: CheckResult, seen: _Seen) -> None:
    """No segment held that the catalog no longer lists, except sources kept while what replaced them is parked.

    A segment of a known collection that the catalog no longer lists (a compaction replaced it) must be
    released by the handoff; meta and the nodes could agree on keeping it, so the other checks miss it. Except
    while a segment compacted from something is held by no node of some replica (no room for it yet: its unit is
    parked): the sources serve meanwhile, and the checker keeps them (``checkers.releases.Sources``): the direct
    ones, and every other held segment of that partition the catalog no longer lists, since in a chain
    A -> B -> C whose B was never loaded nothing on record links C to A.
    """
    catalog = seen.catalog
    listed = {sid for cat in catalog.values() for sids in cat.partitions.values() for sid in sids}
    waiting: set[tuple[int, int]] = set()  # (collection, partition) with a compaction result missing somewhere
    for cid, cc in catalog.items():
        partition_of = {sid: pid for pid, sids in cc.partitions.items() for sid in sids}
        for made, srcs in cc.sources.items():
            if srcs and any(not seen.in_replica(cid, seen.holders.get(made, set()), r) for r in seen.reps.ids(cid)):
                res.kept_sources.update(srcs)
                if made in partition_of:
                    waiting.add((cid, partition_of[made]))
    gone: dict[int, list[int]] = {}
    for nv in seen.nodes.values():
        for sid, (cid, pid) in nv.segments.items():
            if cid in catalog and sid not in listed and (cid, pid) in waiting:
                res.kept_sources.add(sid)
            if cid in catalog and sid not in listed and sid not in res.kept_sources:
                gone.setdefault(cid, []).append(sid)
    for cid, sids in sorted(gone.items()):
        res.violation(f"collection {cid}: segments no longer in the catalog (compacted away) still held: "
                      f"{_short(sorted(set(sids)))}")
    res.checks["no segment held that the catalog no longer has"] = (not gone, f"{len(gone)} collections")


def _meta_problems(m: MetaColl | None, exp: Expected, want_parts: frozenset[int],
                   parked: Mapping[int, str]) -> list[str]:
    """How query meta's record of a loaded collection differs from what the answers say."""
    if m is None:
        return ["not in query meta"]
    problems: list[str] = []
    if m.percentage != 100 and not parked:
        problems.append(f"at {m.percentage} %")
    if m.partitions != want_parts:
        problems.append(f"meta has partitions {sorted(m.partitions)}, expected {sorted(want_parts)}")
    if m.load_type != exp.state:
        problems.append(f"loaded as {m.load_type}, expected {exp.state}")
    return problems


def _copies_lacking(res: CheckResult, seen: _Seen, cid: int, cat: CatalogColl, want_parts: frozenset[int],
                    parked: Mapping[int, str], problems: list[str]) -> bool:
    """Adds to ``problems`` each replica's segments and DM channels held by none of its online nodes (a parked
    replica's lack is a note instead); whether any replica lacks a copy."""
    recorded = seen.reps.recorded(cid)
    wanted = [sid for p in want_parts for sid in cat.partitions.get(p, ())]
    lacking = False
    for rid in seen.reps.ids(cid):
        of = f" of replica {rid}" if recorded else ""
        missing = [sid for sid in wanted if not seen.in_replica(cid, seen.holders.get(sid, set()), rid)]
        unwatched = [ch for ch in cat.channels if not seen.in_replica(cid, seen.watchers.get((cid, ch), set()), rid)]
        lacking = lacking or bool(missing or unwatched)
        if (missing or unwatched) and rid in parked:
            res.notes.append(f"collection {cid}: replica {rid} lacks {len(missing)} segments and "
                             f"{len(unwatched)} DM channels and cannot be placed: {parked[rid]}")
            continue
        if missing:
            problems.append(f"segments on no online node{of}: {_short(missing)}")
        if unwatched:
            problems.append(f"DM channels watched by no online node{of}: {sorted(unwatched)}")
    return lacking


def _dup_channels(res: CheckResult, seen: _Seen, cid: int, cat: CatalogColl) -> int:
    """DM channels of ``cid`` watched by more than one node of a replica: each a violation; how many."""
    found = 0
    for ch in sorted(cat.channels):
        by, _strays = seen.reps.split(cid, seen.watchers.get((cid, ch), set()))
        for rid, ws in sorted(by.items()):
            if len(ws) > 1:
                found += 1
                res.violation(f"DM channel {ch} of collection {cid} watched by nodes {sorted(ws)}"
                              f"{f' of replica {rid}' if seen.reps.recorded(cid) else ''}")
    return found


def _check_loaded(res: CheckResult, seen: _Seen, expected: dict[int, Expected],
                  unplaceable: Mapping[tuple[int, int], str] | None) -> None:
    """Loaded collections: at 100 %, every segment and DM channel once in each replica, no unloaded partition's
    segment held (one pass over the collections, so each one's details stay together)."""
    lost_before = res.lost_tasks
    n_loaded = dup_channels = stray_partitions = 0
    for cid, exp in sorted(expected.items()):
        cat = seen.catalog.get(cid)
        if cat is None:
            res.violation(f"collection {cid} is not in the catalog")
            continue
        want_parts = exp.loaded_partitions(frozenset(cat.partitions))
        if not want_parts:
            continue
        n_loaded += 1
        m = seen.meta.collections.get(cid)
        parked = {r: why for (c, r), why in (unplaceable or {}).items() if c == cid}
        problems = _meta_problems(m, exp, want_parts, parked)
        lacking = _copies_lacking(res, seen, cid, cat, want_parts, parked, problems)
        if lacking and m is not None and m.percentage == 100:
            problems.append("at 100 % in meta while a replica lacks copies")
        if problems:
            res.lost_tasks += 1
            res.details.append(f"lost: collection {cid} (last answered: {exp.last_success}): {'; '.join(problems)}")
        dup_channels += _dup_channels(res, seen, cid, cat)
        not_loaded = {sid for p, sids in cat.partitions.items() if p not in want_parts for sid in sids}
        held_stray = sorted(sid for sid in not_loaded if sid in seen.holders)
        if held_stray:
            stray_partitions += 1
            res.violation(f"collection {cid}: segments of partitions not loaded are held: {_short(held_stray)}")
    res.checks["loaded collections at 100 %, every segment and DM channel on an online node of each replica"] = (
        res.lost_tasks == lost_before, f"{n_loaded} loaded, {res.lost_tasks - lost_before} incomplete")
    res.checks["every DM channel watched by at most one node of a replica"] = (
        not dup_channels, f"{dup_channels} watched twice")
    res.checks["no segment of an unloaded partition held"] = (not stray_partitions,
                                                             f"{stray_partitions} collections")


def _left_of_released(seen: _Seen, cid: int) -> list[str]:
    """What is left of a released collection in query meta and on the online nodes."""
    problems: list[str] = []
    if cid in seen.meta.collections:
        problems.append("still in query meta")
    held = sorted(sid for nv in seen.nodes.values() for sid, (c, _) in nv.segments.items() if c == cid)
    if held:
        problems.append(f"segments still held: {_short(held)}")
    chans = sorted({f"{ch}@{nid}" for nid, nv in seen.nodes.items() for c, ch in nv.dm_channels | nv.other_channels
                    if c == cid})
    if chans:
        problems.append(f"channels still watched: {chans[:6]}")
    return problems


def _check_released(res: CheckResult, seen: _Seen, expected: dict[int, Expected]) -> None:
    """Released collections: nothing of them in meta or on any node (a lost task when a request said so, a
    violation when none ever loaded them)."""
    lost_before = res.lost_tasks
    n_released = 0
    for cid, exp in sorted(expected.items()):
        cat = seen.catalog.get(cid)
        if cat is None or exp.loaded_partitions(frozenset(cat.partitions)):
            continue
        n_released += 1
        problems = _left_of_released(seen, cid)
        if problems:
            if exp.last_success:
                res.lost_tasks += 1
                res.details.append(f"lost: collection {cid} (last answered: {exp.last_success}): "
                                   f"{'; '.join(problems)}")
            else:
                res.violation(f"collection {cid} was never loaded successfully but: {'; '.join(problems)}")
    res.checks["released collections: nothing in meta or on any node"] = (
        res.lost_tasks == lost_before, f"{n_released} released, {res.lost_tasks - lost_before} left behind")


def _check_meta_segments(res: CheckResult, seen: _Seen) -> None:
    """Every segment copy meta records is on its node, in its replica; every copy a node holds is in meta. A copy
    on a node that is gone and in no replica of the collection is a lost node's, left for the repair that loads
    it elsewhere to rewrite (it counts for nothing: the checks of what is served read the nodes)."""
    reps, holders = seen.reps, seen.holders
    for sid, (cid, _pid, recorded_copies) in sorted(seen.meta.segments.items()):
        for rid, nid in sorted(copies_of(recorded_copies).items()):
            if nid not in seen.nodes and reps.of(cid, nid) is None:
                continue
            if nid not in holders.get(sid, set()):
                res.violation(f"meta places segment {sid} (collection {cid}) on node {nid}, which does not hold it"
                              f" (held by {sorted(holders.get(sid, set()))})")
            elif reps.recorded(cid) and reps.of(cid, nid) != rid:
                res.violation(f"meta places replica {rid}'s copy of segment {sid} (collection {cid}) on node {nid}, "
                              f"which is in replica {reps.of(cid, nid)}")
    for sid, ns in sorted(holders.items()):
        m_seg = seen.meta.segments.get(sid)
        in_meta = copies_of(m_seg[2]) if m_seg is not None else {}
        cid = seen.seg_coll[sid]
        for nid in sorted(ns):
            rep = reps.of(cid, nid)
            if rep is None:
                continue  # a copy outside the replicas: counted by _check_replicas
            if not _lists(in_meta, rep, nid, reps.recorded(cid)):
                res.violation(f"node {nid} holds segment {sid}, meta says {_where(in_meta)}")


def _check_meta_channels(res: CheckResult, seen: _Seen) -> None:
    """Every DM watch meta records is on its node, in its replica; every watch a node reports is in meta."""
    reps, watchers = seen.reps, seen.watchers
    for (cid, ch), watch in sorted(seen.meta.channels.items()):
        for rid, nid in sorted(copies_of(watch).items()):
            if nid not in watchers.get((cid, ch), set()):
                res.violation(f"meta says node {nid} watches DM channel {ch} of collection {cid}; it does not")
            elif reps.recorded(cid) and reps.of(cid, nid) != rid:
                res.violation(f"meta says node {nid} watches DM channel {ch} of collection {cid} for replica {rid}; "
                              f"the node is in replica {reps.of(cid, nid)}")
    for key, ns in sorted(watchers.items()):
        m_watch = seen.meta.channels.get(key)
        in_meta = copies_of(m_watch) if m_watch is not None else {}
        for nid in sorted(ns):
            rep = reps.of(key[0], nid)
            if rep is None:
                continue
            if not _lists(in_meta, rep, nid, reps.recorded(key[0])):
                res.violation(f"node {nid} watches DM channel {key[1]} of collection {key[0]}, meta says "
                              f"{_where(in_meta)}")


def _check_meta_equals_nodes(res: CheckResult, seen: _Seen) -> None:
    """Query meta equals the nodes' distribution, copy by copy: segments, then DM channels."""
    before = res.invariant_violations
    _check_meta_segments(res, seen)
    _check_meta_channels(res, seen)
    n = res.invariant_violations - before
    res.checks["query meta equals the nodes' distribution, copy by copy"] = (n == 0, f"{n} mismatches")


def _check_replica_history(res: CheckResult, replica_history: list[str] | None, replica_comparisons: int) -> None:
    """Replicas kept their ids and nodes over the run: what ``replica_changes`` found, each a violation."""
    for v in replica_history or []:
        res.violation(v)
    res.checks["replicas kept their ids and nodes across kills (a node leaves only when it dies)"] = (
        not replica_history, f"{len(replica_history or [])} changes nothing explains, {replica_comparisons} "
                             f"comparisons")


def _check_tasks_and_calls(res: CheckResult, task_keys: dict[str, int], unanswered: list[str],
                           unclear: list[str] | None, extra_violations: list[str] | None) -> None:
    """No task key left, every call answered with success or a clear error, and the drill's own mechanics."""
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


def check(expected: dict[int, Expected], catalog: dict[int, CatalogColl], meta: MetaView,
          nodes: dict[int, NodeView], *, task_keys: dict[str, int], unanswered: list[str],
          unclear: list[str] | None = None, extra_violations: list[str] | None = None,
          replica_number: int | None = None, replica_history: list[str] | None = None,
          replica_comparisons: int = 0, unplaceable: Mapping[tuple[int, int], str] | None = None) -> CheckResult:
    """Every invariant of the drill (see module docstring); ``nodes`` are the online nodes only;
    ``replica_number``: how many replicas every collection in meta must have (None: not checked);
    ``replica_history``: what ``replica_changes`` found over the run, in ``replica_comparisons`` comparisons of a
    collection's replicas at two observations; ``unplaceable``: (collection, replica) units that cannot be placed
    now (``placement.weigh``: no node, no room), with why: what they lack is a note, not a lost task, provided
    meta does not show their collection at 100 %.

    The invariants are checked in a fixed order (the details and the table follow it); the compacted-away check
    runs before the loaded one, as it settles ``kept_sources``."""
    res = CheckResult()
    seen = _Seen.of(catalog, meta, nodes)
    _check_duplicates(res, seen)
    _check_replicas(res, seen, replica_number)
    _check_compacted_away(res, seen)
    _check_loaded(res, seen, expected, unplaceable)
    _check_released(res, seen, expected)
    _check_meta_equals_nodes(res, seen)
    _check_replica_history(res, replica_history, replica_comparisons)
    _check_tasks_and_calls(res, task_keys, unanswered, unclear, extra_violations)
    return res


def replica_changes(before: dict[int, MetaColl], after: dict[int, MetaColl], *, live: AbstractSet[int],
                    released: AbstractSet[int] = frozenset(), loading: AbstractSet[int] = frozenset(),
                    reborn: AbstractSet[int] = frozenset(),
                    rehomed: AbstractSet[int] = frozenset()) -> tuple[list[str], dict[int, str]]:
    """What changed in the replicas of the collections in meta at two observations that nothing explains.

    Replicas keep their ids while the collection stays loaded; a node leaves its replica only when it dies, and
    joins one only as a spare (in no replica of the collection before): a live node never moves to another
    replica, and the replicas a dead node was not in keep their nodes. Not compared: collections that a request
    may have released (and loaded again) in between (``released``), and those that were still being loaded at
    the first observation while a load request ran (``loading``: a failed first load is rolled back, and a retry
    creates new replicas). ``live``: the nodes running at the second observation; ``reborn``: nodes that died and
    came back under their fixed id in between (the leader forgot the dead one: the new one may join any replica
    as a spare); ``rehomed``: collections a REHOME_NODE trigger worked on (a parked replica with no node given one
    of a sibling's, or a resize or drain): their running nodes may move between replicas.

    Returns (violations, suspects): a node that left its replica while still running is a suspect (node id ->
    what happened) until a quiescent observation tells: dead by then (its session had lapsed), or still serving.
    """
    problems: list[str] = []
    suspects: dict[int, str] = {}
    for cid in sorted(before.keys() & after.keys()):
        a, b = before[cid].replicas, after[cid].replicas
        if cid in released or not a or (cid in loading and before[cid].percentage < 100):
            continue
        if sorted(a) != sorted(b):
            problems.append(f"collection {cid}: replicas {sorted(a)} became {sorted(b)} with no release in between")
            continue
        if cid in rehomed:
            continue
        owner = {n: r for r, ns in a.items() for n in ns if n not in reborn}
        for rid in sorted(a):
            for n in sorted(a[rid] - b[rid]):
                if n in live and n not in reborn:
                    suspects[n] = f"node {n} left replica {rid} of collection {cid} while running"
            for n in sorted(b[rid] - a[rid]):
                if n in owner:
                    problems.append(f"collection {cid}: node {n} moved from replica {owner[n]} to replica {rid}")
    return problems, suspects
