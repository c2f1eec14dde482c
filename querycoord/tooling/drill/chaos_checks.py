"""The chaos drill's checks after each phase: the leader's own view (task trees, nodes), quiescence, the oracle's
admissible states, and the failover drill's invariants plus idempotence (``invariants.check``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import grpc

from proto import common_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.security.grpc_channels import make_channel
from querycoord.task.store import TASK_PREFIXES, TaskStore
from querycoord.tooling.drill.chaos_cluster import ChaosCluster
from querycoord.tooling.drill.chaos_ops import (
    INF,
    LOAD_STATE_KINDS,
    RELEASED,
    Attempt,
    State,
    admissible_states,
    make_plan,
    state_name,
)
from querycoord.tooling.drill.chaos_records import ChaosCall, ChaosResult, PhaseReport
from querycoord.tooling.drill.invariants import UNCLEAR_CODES, Expected, MetaView, check
from querycoord.tooling.drill.options import ChaosOptions
from querycoord.tooling.drill.sampler import DrillSources, Sampler

EC = common_pb2


def _actual_state(meta: MetaView, cid: int, every: frozenset[int]) -> State:
    m = meta.collections.get(cid)
    if m is None:
        return RELEASED
    if m.load_type == "collection":
        return ("collection", every if m.partitions == every else m.partitions)
    return ("partitions", m.partitions)


def _expected(state: State, label: str) -> Expected:
    kind, parts = state
    return Expected(kind, parts if kind != "released" else frozenset(), label)


def _overlaps(c: ChaosCall, start: float, end: float) -> bool:
    answered = c.answered if c.answered is not None and c.outcome in ("success", "error") else INF
    return c.sent <= end and answered >= start


def idempotence_violations(calls: list[ChaosCall], every_call: list[ChaosCall]) -> list[str]:
    """Identical requests (a duplicate, a retry) answered SUCCESS and CONFLICT, with no other request about that
    collection in between (``every_call``): such a retry is not idempotent, yet clients retry on every
    ambiguity (``QueryCoordClient`` itself, after a timeout or a leader change)."""
    out: list[str] = []
    groups: dict[int, list[ChaosCall]] = {}
    for c in calls:
        if c.pattern in ("duplicate", "retry") and c.kind in LOAD_STATE_KINDS:
            groups.setdefault(c.group, []).append(c)
    for g, members in sorted(groups.items()):
        answered = [c for c in members if c.outcome in ("success", "error")]
        if not {"SUCCESS", "CONFLICT"} <= {c.code for c in answered}:
            continue
        start = min(c.sent for c in members)
        end = max(c.answered if c.answered is not None else INF for c in members)
        if any(c.group != g and c.cid == members[0].cid and c.kind in LOAD_STATE_KINDS and _overlaps(c, start, end)
               for c in every_call):
            continue
        refused = next(c for c in answered if c.code == "CONFLICT")
        out.append(f"violation: identical requests ({members[0].pattern}) answered SUCCESS and CONFLICT with nothing "
                   f"else about collection {members[0].cid} in between: "
                   + "; ".join(f"{c.label()} {c.outcome} {c.code}" for c in members)
                   + f" (CONFLICT: {refused.reason[:160]})")
    return out


class ChaosChecks(ChaosCluster):
    """The oracle's state and the checks of each phase; ``ChaosDrill`` runs the phases."""

    def __init__(self, opts: ChaosOptions, out: Any = None):
        super().__init__(opts, out)
        self.plan = make_plan(opts.seed, opts)
        self.cres = ChaosResult(opts, self.plan, faults=self.result.faults, counts=self.counts)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._poller: asyncio.Task[None] | None = None
        self.sampler: Sampler | None = None
        self.sources: DrillSources | None = None
        self._group = 0
        # The oracle: per collection, the states it may be in at the last check, and the requests since.
        self._states: dict[int, set[State]] = {}
        self._attempts: dict[int, list[Attempt]] = {}
        self._last_label: dict[int, str] = {}
        self._seen_details: set[str] = set()
        self._leak_notes: list[str] = []
        self._history: dict[int, qc.TaskInfo] = {}

    # ----- the leader's view --------------------------------------------------------------------------------------
    def _stub(self, address: str) -> querycoord_pb2_grpc.QueryCoordStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = make_channel(address)
        return querycoord_pb2_grpc.QueryCoordStub(ch)

    async def _leader_call(self, method: str, request: Any, timeout: float = 5.0) -> Any:
        """``method`` on the coordinator that leads now, asked directly (a standby would answer ListTasks from
        etcd, not from the scheduler); None when no coordinator answers as the leader."""
        leader = self.cluster.leader
        if leader is None:
            return None
        stub = self._stub(leader.address)
        try:
            states = await stub.GetComponentStates(qc.GetComponentStatesRequest(), timeout=timeout)
            if states.state.state_code != EC.HEALTHY:
                return None
            resp = await getattr(stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError:
            return None
        return resp if resp.status.error_code == EC.SUCCESS else None

    async def _leader_trees(self, include_finished: bool) -> list[qc.TaskTree] | None:
        trees: list[qc.TaskTree] = []
        after = 0
        while True:
            resp = await self._leader_call("ListTasks", qc.ListTasksRequest(
                include_finished=include_finished, limit=1000, after_task_id=after))
            if resp is None:
                return None
            trees += resp.trees
            if not resp.next_after_task_id:
                return trees
            after = resp.next_after_task_id

    def _rehomed(self) -> set[int]:
        return {t.collection_id for t in self._history.values() if t.kind == qc.TASK_KIND_REHOME_NODE}

    def _remember(self, trees: list[qc.TaskTree]) -> None:
        for tree in trees:
            t = tree.trigger
            self._history[t.task_id] = t
            if t.state == qc.TASK_STATE_FAILED:
                self.cres.failed_triggers[t.task_id] = t
        checker = getattr(qc, "TRIGGER_CONDITION_CHECKER", None)
        self.cres.triggers_seen = len(self._history)
        if checker is not None:
            self.cres.checker_repairs = sum(t.trigger_condition == checker for t in self._history.values())

    async def _poll_history_forever(self) -> None:
        """The leader keeps finished trees in memory only, and a bounded number: read them often."""
        while True:
            await asyncio.sleep(1.5)
            with contextlib.suppress(Exception):
                trees = await self._leader_trees(include_finished=True)
                if trees:
                    self._remember(trees)

    # ----- checks ------------------------------------------------------------------------------------------------
    async def _quiesce_chaos(self) -> tuple[list[str], list[qc.TaskTree]]:
        """Until the leader runs no trigger (except known stuck ones), no task key exists (unless a stuck trigger
        holds some) and the leader sees exactly the live nodes, for ``settle_s``; bounded. Returns (problems,
        stuck trees)."""
        assert self.kv is not None
        deadline = time.monotonic() + self.copts.quiesce_timeout
        good = leaked = 0
        quiet_since: float | None = None
        last = "no leader answered"
        pending: list[qc.TaskTree] = []
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            trees = await self._leader_trees(include_finished=False)
            nodes = await self._leader_call("ShowNodes", qc.ShowNodesRequest())
            if trees is None or nodes is None:
                good, last = 0, "no coordinator answered as the leader"
                continue
            pending = [t for t in trees if t.trigger.task_id not in self.cres.stuck_ids]
            keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
            live = {n.node_id for n in self.nodes}
            online = {n.node_id for n in nodes.nodes if n.state == "online"}
            known = {n.node_id for n in nodes.nodes}
            quiet = (not pending and (not any(keys.values()) or bool(self.cres.stuck_ids))
                     and online == live and known == live)
            last = (f"{len(pending)} triggers queued or running, task keys {keys}, online nodes {sorted(online)} "
                    f"(known {sorted(known)}), live nodes {sorted(live)}")
            good = good + 1 if quiet else 0
            quiet_since = (quiet_since or time.monotonic()) if quiet else None
            if good >= 3 and quiet_since is not None and time.monotonic() - quiet_since >= self.copts.settle_s:
                return [], []
            # Keys while the leader runs nothing, for 5 s: leaked (the checker reports them), not worth waiting on.
            leak = not pending and any(keys.values()) and online == live and known == live
            leaked = leaked + 1 if leak else 0
            if leaked >= 10:
                self._leak_notes = await self._describe_task_keys()
                return [], []
        if pending:
            return [], pending
        return [f"not quiescent after {self.copts.quiesce_timeout:.0f}s: {last}"], []

    async def _describe_task_keys(self) -> list[str]:
        """What the task keys left in etcd are, and what the leader said about those triggers (diagnosis)."""
        assert self.kv is not None
        try:
            records = await TaskStore(self.kv).load_all()
        except Exception as exc:  # diagnosis only
            return [f"task keys could not be read: {exc}"]
        out = []
        children: Counter[int] = Counter(r.parent_id for r in records if r.parent_id)
        now_ms = time.time() * 1000
        for r in records:
            if r.parent_id:
                continue
            seen = self._history.get(r.id)
            leader = (f"the leader finished it as {qc.TaskState.Name(seen.state)}" if seen is not None
                      and seen.state in (qc.TASK_STATE_EXPIRED, qc.TASK_STATE_FAILED) else
                      "the leader lists it" if seen is not None else "the leader never listed it")
            out.append(f"task keys left: trigger {r.id} {qc.TaskKind.Name(r.kind)} "
                       f"{qc.TriggerCondition.Name(r.trigger_condition)} collection {r.collection_id} persisted as "
                       f"{qc.TaskState.Name(r.state)} with {children[r.id]} children, updated "
                       f"{(now_ms - r.updated_ms) / 1000:.0f}s ago; {leader}; error {r.error[:120] or '-'}")
        orphans = [r.id for r in records if r.parent_id and r.parent_id not in {x.id for x in records}]
        if orphans:
            out.append(f"task keys left: children without a trigger: {orphans[:10]}")
        return out

    def _new_problems(self, rep: PhaseReport | None, details: list[str]) -> None:
        """Count each distinct problem once, in the phase that found it (a lasting one is seen at every check,
        and the report says for how long: repaired later, or never)."""
        for d in details:
            self.cres.seen_in.setdefault(d, []).append(self._phase)
            if d in self._seen_details:
                continue
            self._seen_details.add(d)
            self.cres.violations.append(d)
            if rep is not None:
                rep.problems.append(d)

    def _resolve_expected(self, meta: MetaView, rep: PhaseReport) -> dict[int, Expected]:
        """Per collection, the admissible state found in meta (or the first admissible one, which the checker
        then reports against); the oracle restarts from what was found."""
        expected: dict[int, Expected] = {}
        for cid in self.coll_ids:
            every = frozenset(self.part_ids[cid])
            attempts = self._attempts[cid]
            cands = admissible_states(self._states[cid], attempts, every)
            actual = _actual_state(meta, cid, every)
            label = self._last_label.get(cid, "")
            if cands is None:
                rep.notes.append(f"collection {cid}: {len(attempts)} overlapping requests, too many orders to "
                                 f"enumerate: its state ({state_name(actual)}) is accepted as is")
                chosen = actual
            elif actual in cands:
                chosen = actual
            else:
                chosen = sorted(cands, key=lambda s: (s[0], sorted(s[1])))[0]
                reqs = "; ".join(f"{a.label} {a.effect}" for a in attempts) or "none"
                rep.notes.append(f"collection {cid}: found {state_name(actual)}, admissible "
                                 f"{sorted(state_name(s) for s in cands)} (requests since the last check: {reqs})")
            expected[cid] = _expected(chosen, label)
            self._states[cid] = {actual}
            self._attempts[cid] = []
        return expected

    async def _check_phase(self, rep: PhaseReport, calls: list[ChaosCall]) -> None:
        assert self.kv is not None
        t = time.monotonic()
        not_quiet, stuck = await self._quiesce_chaos()
        rep.quiesce_s = time.monotonic() - t
        for tree in stuck:
            tr = tree.trigger
            self.cres.stuck_ids.add(tr.task_id)
            cc = tree.child_counts
            line = (f"trigger {tr.task_id} {qc.TaskKind.Name(tr.kind)} collection {tr.collection_id} "
                    f"{qc.TaskState.Name(tr.state)} ({tr.summary}); children {cc.total} (doing {cc.doing}, "
                    f"undo {cc.undo}, failed {cc.failed}); error {tr.error[:160] or '-'}")
            rep.stuck.append(line)
            self.say(f"phase {rep.index}: STUCK {line}")
        trees = await self._leader_trees(include_finished=True)
        if trees:
            self._remember(trees)
        rep.notes += self._leak_notes
        self._leak_notes = []
        await self._close_dead_proxies()
        catalog = await self._catalog_view()
        t_meta = self.now()
        meta = await self._meta_view()
        self._judge_replicas(self._observation(f"phase {rep.index} check", t_meta, meta.collections, quiescent=True))
        history, self._replica_history = self._replica_history, []
        comparisons, self._replica_comparisons = self._replica_comparisons, 0
        nodes = await self._node_views()
        keys = {p: await self.kv.count_prefix(p) for p in TASK_PREFIXES}
        expected = self._resolve_expected(meta, rep)
        unclear = [f"{c.label()}: {c.code} {c.reason[:200]}" for c in calls
                   if c.outcome == "error" and c.code in UNCLEAR_CODES]
        mechanics, self._extra_violations = self._extra_violations, []
        # Units that cannot be placed now (no node, no room) are excused from "every copy in each replica".
        unplaceable = await self.sampler.unplaceable({cid: (m.partitions, m.replicas)
                                                      for cid, m in meta.collections.items()}) if self.sampler else {}
        res = check(expected, catalog, meta, nodes, task_keys=keys, unanswered=[], unclear=unclear,
                    extra_violations=mechanics + not_quiet, replica_number=self.copts.replicas,
                    replica_history=history, replica_comparisons=comparisons, unplaceable=unplaceable)
        rep.notes += res.notes
        details = [*res.details, *idempotence_violations(calls, self.cres.calls),
                   *(f"violation: unanswered call {c.label()}: {c.reason[:200]}" for c in calls
                     if c.outcome == "unanswered")]
        self._new_problems(rep, details)
        outcomes = Counter(c.outcome for c in calls)
        self.say(f"phase {rep.index}: {len(calls)} calls ({', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}"
                 f"), quiescent after {rep.quiesce_s:.1f}s, {len(rep.problems)} new problems, "
                 f"{len(rep.stuck)} stuck triggers")
        for d in rep.problems[:12]:
            self.say(f"    {d[:400]}")
        for n in rep.notes[:6]:
            self.say(f"    note: {n[:400]}")
