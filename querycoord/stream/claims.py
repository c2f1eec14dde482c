"""Heartbeat verification: which sender is heard, and which snode and vgroups it may speak for.

A heartbeat is accepted only from a node id in the live stream-node session
set the caller feeds with ``set_live_nodes`` (none fed yet: every heartbeat
is refused); a refused heartbeat gets a reply with a NOT_FOUND status and no
action. Of an accepted heartbeat, the snode claim counts only when the snode
is recorded for that node id (``SnodeInfo.node_id``), and a vgroup claim only
when no other node holds it: the current holder keeps a vgroup until a
heartbeat of its own leaves it out, its session goes, or it is silent for
``isolation``, so two claimants never make readers flap. Refused claims are
counted (``rejected_heartbeats``, ``rejected_claims``) and logged once per
change, never raised: a node whose claim is refused still gets its reply.
"""

from __future__ import annotations

from loguru import logger

from proto import common_pb2, stream_pb2
from querycoord.stream.runtime import Heard, Runtime

# Refused claims remembered for logging once per change; past this many (a node id sweep) the memory restarts.
MAX_REJECTIONS = 1000

RejectionKey = tuple[str, int, int]  # (what: node, snode, vgroup or task; node id; target id)


class Claims:
    """Who is heard and what it may speak for; refusals logged once per change."""

    def __init__(self, shared: Runtime):
        self.shared = shared
        # The vgroups each node holds (those of ``vgroups`` naming it): a heartbeat releases the ones it leaves out.
        self.held: dict[int, set[int]] = {}
        # Refusals as last logged.
        self.rejections: dict[RejectionKey, str] = {}

    def sender_refused(self, req: stream_pb2.HeartbeatRequest) -> str:
        """Why the sender is not heard ('' when it is): only nodes with a live stream-node session are."""
        live_nodes = self.shared.live_nodes
        if req.node_id <= 0:
            return f"node id {req.node_id} is not a session id"
        if live_nodes is None:
            return "the leader does not know the live stream node sessions yet; heartbeat again"
        if req.node_id not in live_nodes:
            return f"node {req.node_id} has no live stream node session (register one, role streamnode)"
        return ""

    def refuse(self, req: stream_pb2.HeartbeatRequest, reason: str) -> stream_pb2.HeartbeatReply:
        """The reply to a refused heartbeat: NOT_FOUND and no action; counted and logged once per change."""
        self.shared.rejected_heartbeats += 1
        self.note_rejection(("node", req.node_id, 0), f"heartbeat of node {req.node_id} refused: {reason}")
        return stream_pb2.HeartbeatReply(
            leader_revision=self.shared.leader_revision,
            status=common_pb2.Status(error_code=common_pb2.NOT_FOUND, reason=reason),
        )

    def snode_claim(self, req: stream_pb2.HeartbeatRequest, now: float) -> int:
        """The snode this heartbeat may speak for: the claimed one if recorded for the sender, else 0."""
        snode_id, node = req.snode_id, req.node_id
        if not snode_id:
            return 0
        owner = self.shared.snode_owner.get(snode_id)
        if owner != node:
            why = f"it is recorded for node {owner}" if owner is not None else "no such snode is recorded"
            self.reject_claim(("snode", node, snode_id), f"node {node} claims snode {snode_id}, but {why}: ignored")
            return 0
        self.accepted(("snode", node, snode_id))
        self.shared.snodes[snode_id] = Heard(node, now)
        self.shared.lost_snodes.pop(snode_id, None)
        return snode_id

    def vgroup_claims(self, req: stream_pb2.HeartbeatRequest, now: float) -> tuple[list[int], list[int]]:
        """The vgroups this heartbeat may speak for, and those of them that moved to the sender.

        Vgroups the sender held and no longer claims are released. A claim of
        a vgroup another node holds (``holds``) is refused: the holder keeps
        it, so two claimants cannot make its readers flap.
        """
        vgroups = self.shared.vgroups
        node, claimed = req.node_id, set(req.vgroup_ids)
        held = self.held.setdefault(node, set())
        for vg in held - claimed:
            vgroups[vg].claiming = False
        if self.rejections:
            for key in [k for k in self.rejections if k[0] == "vgroup" and k[1] == node and k[2] not in claimed]:
                del self.rejections[key]
        accepted: list[int] = []
        moved: list[int] = []
        for vg in sorted(claimed):
            prev = vgroups.get(vg)
            if prev is not None and prev.node_id != node and self.holds(prev, now):
                self.reject_claim(("vgroup", node, vg), f"node {node} claims vgroup {vg}, which node "
                                                        f"{prev.node_id} still claims: it stays there")
                continue
            self.accepted(("vgroup", node, vg))
            if prev is not None and prev.node_id != node:
                moved.append(vg)
                self.held.get(prev.node_id, set()).discard(vg)
            held.add(vg)
            vgroups[vg] = Heard(node, now)
            self.shared.lost_vgroups.pop(vg, None)
            accepted.append(vg)
        return accepted, moved

    def holds(self, h: Heard, now: float) -> bool:
        """Whether a vgroup's holder keeps it: still claiming, session live, heard within isolation."""
        live_nodes = self.shared.live_nodes
        live = live_nodes is not None and h.node_id in live_nodes
        return h.claiming and live and now - h.last_heard < self.shared.config.isolation

    def leads(self, node_id: int, vgroup_id: int) -> bool:
        """Whether ``node_id`` holds the vgroup and still claims it."""
        h = self.shared.vgroups.get(vgroup_id)
        return h is not None and h.node_id == node_id and h.claiming

    def reject_claim(self, key: RejectionKey, message: str) -> None:
        self.shared.rejected_claims += 1
        self.note_rejection(key, message)

    def note_rejection(self, key: RejectionKey, message: str) -> None:
        """Log a refusal once per change (the same refusal on every heartbeat would flood the log)."""
        if self.rejections.get(key) == message:
            return
        if len(self.rejections) >= MAX_REJECTIONS:
            self.rejections.clear()
        self.rejections[key] = message
        logger.warning("{}", message)

    def accepted(self, key: RejectionKey) -> None:
        """A claim (or sender) refused before counts again: log that once."""
        message = self.rejections.pop(key, None)
        if message is not None:
            logger.info("accepted again after: {}", message)
