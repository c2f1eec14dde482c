"""Each query node's maintenance lifecycle: ACTIVE, CORDONED, DRAINING, DRAINED, persisted by node id.

A cordoned node keeps serving what it holds and is given nothing new: the placement (``task.units``), new
replicas (``task.triggers``), the auto balancer and LoadBalance destinations leave out every id in
``NodeManager.cordoned``, which this store keeps equal to its non-ACTIVE records. A draining node is cordoned and
the checker moves its copies within their replicas (``checkers.drain``); a drained node is cordoned, holds
nothing and is in no replica. ACTIVE is the absence of a record, so uncordon deletes the key.

Why keyed by node id, not by session: an operator's cordon or drain is about a machine, and must outlast the
node's restarts and the leader's changes (a new leader ``load``s the records before its checker runs). A drain a
node asked for itself when it was stopped (``reason`` graceful-stop) remembers the incarnation (session create
revision) it was asked in: once the node registers again under another one, the record goes (``back_from_stop``),
so a rolling restart leaves every node ACTIVE.

Records are JSON (state, reason, since, drain start and copies); every write goes through the fenced KV the
leader passes in. Malformed records are logged and skipped, never fatal.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TypeAlias

from meta.kv import MetaKV
from meta.log import logger
from proto import querycoord_pb2 as qc

if TYPE_CHECKING:  # named only: a reader of the records (``querycoord status``) needs no node registry
    from querycoord.cluster.nodes import NodeManager

PREFIX = "queryCoord-nodeLifecycle/"
OPERATOR = "operator"
GRACEFUL_STOP = "graceful-stop"

ACTIVE = qc.NODE_LIFECYCLE_ACTIVE
CORDONED = qc.NODE_LIFECYCLE_CORDONED
DRAINING = qc.NODE_LIFECYCLE_DRAINING
DRAINED = qc.NODE_LIFECYCLE_DRAINED

Lifecycle: TypeAlias = qc.NodeLifecycle
_NAMES: dict[Lifecycle, str] = {CORDONED: "cordoned", DRAINING: "draining", DRAINED: "drained"}
_BY_NAME: dict[str, Lifecycle] = {v: k for k, v in _NAMES.items()}


def lifecycle_key(node_id: int) -> str:
    return f"{PREFIX}{node_id}"


def state_name(state: Lifecycle) -> str:
    """``active``, ``cordoned``, ``draining`` or ``drained``."""
    return _NAMES.get(state, "active")


@dataclass
class LifecycleRecord:
    """One node's persisted lifecycle (ACTIVE nodes have none)."""

    state: str  # cordoned | draining | drained
    reason: str = OPERATOR  # operator | graceful-stop
    since_ms: int = 0
    incarnation: int = 0  # the session create revision a graceful stop was asked in
    copies_total: int = 0  # copies held when the drain began
    started_ms: int = 0  # when the drain began

    @property
    def lifecycle(self) -> Lifecycle:
        return _BY_NAME.get(self.state, CORDONED)


@dataclass
class DrainStatus:
    """What the drain of one node looks like now (kept in memory by the checker's passes, not persisted)."""

    copies_left: int = -1  # -1: no pass has counted yet
    waiting: str = ""


def _now_ms() -> int:
    return int(time.time() * 1000)


class NodeLifecycles:
    """The lifecycle records of the query nodes (see module docstring); writes go through ``kv`` (fenced)."""

    def __init__(self, kv: MetaKV, nodes: NodeManager):
        self.kv = kv
        self.nodes = nodes
        self.records: dict[int, LifecycleRecord] = {}
        self.status: dict[int, DrainStatus] = {}
        self.version = 0  # bumped on every change (metrics and pages recompute when it moved)

    async def load(self) -> None:
        """Read every record (at takeover, before the checker's first pass)."""
        snap = await self.kv.load_prefix(PREFIX)
        records: dict[int, LifecycleRecord] = {}
        for item in snap.kvs:
            try:
                node_id = int(item.key[len(PREFIX):])
                raw = json.loads(item.value)
                rec = LifecycleRecord(**{k: raw[k] for k in LifecycleRecord.__dataclass_fields__ if k in raw})
                if rec.state not in _BY_NAME or node_id <= 0:
                    raise ValueError(f"state {rec.state!r}")
            except (ValueError, TypeError, KeyError) as exc:
                logger.warning("node lifecycles: ignoring malformed record {}: {}", item.key, exc)
                continue
            records[node_id] = rec
        self.records = records
        self._sync()
        if records:
            logger.info("node lifecycles: {}", ", ".join(f"node {n} {r.state} ({r.reason})"
                                                         for n, r in sorted(records.items())))

    def _sync(self) -> None:
        self.nodes.cordoned = {n: r.state for n, r in self.records.items()}
        self.version += 1

    def state(self, node_id: int) -> Lifecycle:
        rec = self.records.get(node_id)
        return rec.lifecycle if rec is not None else ACTIVE

    def get(self, node_id: int) -> LifecycleRecord | None:
        return self.records.get(node_id)

    def draining(self) -> list[int]:
        return sorted(n for n, r in self.records.items() if r.lifecycle == DRAINING)

    async def _write(self, node_id: int, rec: LifecycleRecord) -> None:
        await self.kv.save(lifecycle_key(node_id), json.dumps(asdict(rec), sort_keys=True).encode())
        self.records[node_id] = rec
        self._sync()

    async def cordon(self, node_id: int) -> LifecycleRecord:
        """CORDONED by an operator; a node draining or drained stays where it is (it is cordoned already), but
        its record becomes the operator's."""
        rec = self.records.get(node_id)
        if rec is not None:
            if rec.reason != OPERATOR:
                rec = LifecycleRecord(**{**asdict(rec), "reason": OPERATOR})
                await self._write(node_id, rec)
            return rec
        rec = LifecycleRecord(state="cordoned", since_ms=_now_ms())
        await self._write(node_id, rec)
        logger.info("query node {} cordoned: it keeps what it holds and is given nothing new", node_id)
        return rec

    async def drain(self, node_id: int, *, reason: str, incarnation: int, copies: int) -> LifecycleRecord:
        """DRAINING (``copies``: what it holds now). A drain already asked for stays as it is (its start and
        total); an operator's record stays the operator's even when the node asks for itself."""
        rec = self.records.get(node_id)
        if rec is not None and rec.lifecycle in (DRAINING, DRAINED):
            if reason == OPERATOR and rec.reason != OPERATOR:
                rec = LifecycleRecord(**{**asdict(rec), "reason": OPERATOR})
                await self._write(node_id, rec)
            return rec
        if rec is not None and rec.reason == OPERATOR:
            reason = OPERATOR  # cordoned by an operator, stopped gracefully: the cordon outlives the restart
        now = _now_ms()
        rec = LifecycleRecord(state="draining", reason=reason, since_ms=now, incarnation=incarnation,
                              copies_total=copies, started_ms=now)
        await self._write(node_id, rec)
        self.status[node_id] = DrainStatus(copies_left=copies)
        logger.info("query node {} draining ({}): {} copies to move within their replicas", node_id, reason, copies)
        return rec

    async def drained(self, node_id: int) -> None:
        rec = self.records.get(node_id)
        if rec is None or rec.lifecycle != DRAINING:
            return
        await self._write(node_id, LifecycleRecord(**{**asdict(rec), "state": "drained", "since_ms": _now_ms()}))
        self.status[node_id] = DrainStatus(copies_left=0)
        logger.info("query node {} drained: it holds nothing and is in no replica", node_id)

    async def uncordon(self, node_id: int) -> None:
        """ACTIVE again: the record goes."""
        if node_id not in self.records:
            return
        await self.kv.remove(lifecycle_key(node_id))
        self.records.pop(node_id, None)
        self.status.pop(node_id, None)
        self._sync()
        logger.info("query node {} uncordoned: it takes new work again", node_id)

    async def back_from_stop(self) -> list[int]:
        """Uncordon every node drained for a graceful stop that is online again as another incarnation (its
        rolling restart is done); returns them."""
        back = []
        for node_id, rec in sorted(self.records.items()):
            node = self.nodes.get(node_id)
            if (rec.reason == GRACEFUL_STOP and node is not None and node.online and node.created
                    and node.created != rec.incarnation):
                await self.uncordon(node_id)
                back.append(node_id)
        if back:
            logger.info("query nodes {} registered again after a graceful stop: active", back)
        return back

    def progress(self, node_id: int) -> qc.DrainProgress | None:
        """The drain's progress as NodeInfo shows it (None when it never drained). ``eta_ms`` from the rate seen
        since the drain began: copies moved over time spent."""
        rec = self.records.get(node_id)
        if rec is None or rec.lifecycle not in (DRAINING, DRAINED):
            return None
        st = self.status.get(node_id, DrainStatus())
        left = 0 if rec.lifecycle == DRAINED else (st.copies_left if st.copies_left >= 0 else rec.copies_total)
        total = max(rec.copies_total, left)
        out = qc.DrainProgress(copies_total=total, copies_left=left, started_ms=rec.started_ms,
                               waiting=st.waiting if rec.lifecycle == DRAINING else "")
        moved = total - left
        now = _now_ms()
        if rec.lifecycle == DRAINING and moved > 0 and left > 0 and now > rec.started_ms:
            out.eta_ms = now + int(left * (now - rec.started_ms) / moved)
        return out
