"""Guards on operator actions that would pull the ground from under a stream, and the facts they rest on.

* Dropping an snode is refused (``SnodeInUse``, CONFLICT) while a stream
  depends on it: it is the stream's main snode (persisted), or the leader has
  the stream's trigger or runners placed there (its runtime; a stream running
  on its main snode's replica depends on that replica). The refusal names the
  first few streams and how many there are. Forced, the drop goes on and
  ``snode_dropped`` redeploys the streams' tasks elsewhere at once, as for a
  lost snode: runners move to live snodes, and a stream whose trigger was
  there is planned again from scratch (on its main snode, which the drop
  moved to the replica).
* An snode is created only on a node that is a live stream node (a live
  session of role ``streamnode``); an unknown id, or the id of a query node or
  a coordinator, is refused before anything is written: an snode on a node
  that never heartbeats it would hold a place in the replica ring that no
  stream could ever fall back to.
* Vgroups that no live node leads: a stream on them is accepted (TDengine
  takes the vgroups from its catalog, and a vgroup without a leader is a
  transient state of the cluster, not bad input), and ``unled_vgroups`` lets
  the create answer and ShowStreams say what the stream waits for.

No RPC or command drops a vgroup: a vgroup exists while a stream node
reports leading it (``HeartbeatRequest.vgroup_ids``) and goes when that node
stops reporting it (it gives the vgroup up, or stops), which is not a call to
the coordinator. The closest coordinator action, dropping an snode, is the
one guarded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from loguru import logger

from meta.kv import MetaKV
from meta.session import list_sessions
from proto import stream_pb2
from querycoord.common.errors import Conflict, IllegalArgument, NotFound
from querycoord.common.protocol import QUERYCOORD_ROLE, QUERYNODE_ROLE, STREAMNODE_ROLE
from querycoord.stream.liveness import Liveness
from querycoord.stream.plan import RUNNER, TRIGGER
from querycoord.stream.runtime import Runtime
from querycoord.stream.store import StreamError

# How many stream names a refusal lists before it says "and N more".
NAMED_STREAMS = 5


class SnodeInUse(StreamError, Conflict):
    """An snode drop refused because streams depend on the snode (``force`` overrides)."""


class NotAStreamNode(StreamError, NotFound):
    """An snode asked for on a node id that has no live session at all."""


class WrongNodeKind(StreamError, IllegalArgument):
    """An snode asked for on the id of a live node that is no stream node (a query node, a coordinator)."""


def name_streams(names: Sequence[str]) -> str:
    """``s1, s2, s3`` or ``s1, ..., s5 and 7 more``: the first few names and how many there are."""
    shown = ", ".join(names[:NAMED_STREAMS])
    more = len(names) - NAMED_STREAMS
    return f"{shown} and {more} more" if more > 0 else shown


def snode_dependents(
    shared: Runtime, persisted: Iterable[stream_pb2.StreamDef], snode_id: int
) -> list[stream_pb2.StreamDef]:
    """The streams that depend on ``snode_id``, by id: its main snode is it, or tasks of it are placed there."""
    deps = {s.id: s for s in persisted if s.main_snode_id == snode_id}
    for stream_id, rt in shared.streams.items():
        if stream_id in deps or rt.sdef.user_stopped:
            continue
        if any(t.task.kind in (TRIGGER, RUNNER) and t.task.snode_id == snode_id for t in rt.tasks.values()):
            deps[stream_id] = rt.sdef
    return [deps[i] for i in sorted(deps)]


def refuse_snode_drop(snode_id: int, deps: Sequence[stream_pb2.StreamDef]) -> SnodeInUse:
    """The refusal of an unforced drop of an snode that ``deps`` depend on."""
    return SnodeInUse(
        f"cannot drop snode {snode_id}: {len(deps)} stream{'s depend' if len(deps) != 1 else ' depends'} on it "
        f"({name_streams([s.name for s in deps])}): their main snode is it or their tasks run there; stop or "
        f"drop them first, or force the drop (their tasks are then redeployed elsewhere)"
    )


def snode_dropped(shared: Runtime, liveness: Liveness, snode_id: int, forced: bool) -> int:
    """A committed snode drop: the leader stops placing anything there and moves what ran there.

    Returns how many streams had tasks redeployed. The snode is forgotten at
    once (no claim of it counts any more, nothing new is placed there); the
    streams' runners move to live snodes, and a stream whose trigger was
    there is planned again now, not after an error back-off: a drop is an
    operator's decision, not a failure to retry.
    """
    now = shared.clock()
    shared.snodes.pop(snode_id, None)
    shared.snode_owner.pop(snode_id, None)
    shared.replica_of.pop(snode_id, None)
    shared.lost_snodes[snode_id] = now
    why = f"snode {snode_id} dropped" + (" (forced)" if forced else "")
    moved = 0
    for rt in shared.streams.values():
        if rt.sdef.user_stopped or rt.error_stopped or not rt.tasks:
            continue
        trig = rt.trigger()
        if trig is not None and trig.task.snode_id == snode_id:
            shared.clear_tasks(rt)
            shared.to_plan.add(rt.sdef.id)
            rt.last_action = now
            shared.redeploys += 1
            moved += 1
            logger.info("stream {}: {} with its trigger: planned again elsewhere", rt.sdef.name, why)
            continue
        deploys = sorted({t.task.deploy_id for t in rt.tasks.values()
                          if t.task.kind == RUNNER and t.task.snode_id == snode_id})
        if deploys:
            liveness.move_runners(rt, trig, deploys, now, why)
            moved += 1
    return moved


def unled_vgroups(shared: Runtime, vgroup_ids: Iterable[int]) -> list[int]:
    """Of ``vgroup_ids``, those no live node leads now (no holder, holder without session, silent, or lost)."""
    now = shared.clock()
    out = []
    for vg in sorted(set(vgroup_ids)):
        h = shared.vgroups.get(vg)
        live = shared.live_nodes is not None and h is not None and h.node_id in shared.live_nodes
        if h is None or not h.claiming or not live or vg in shared.lost_vgroups \
                or now - h.last_heard >= shared.config.isolation:
            out.append(vg)
    return out


def stream_vgroups(sdef: stream_pb2.StreamDef) -> list[int]:
    """Every vgroup the stream's readers read: its source vgroups and its trigger vgroup."""
    return sorted({*sdef.source_vgroup_ids, *([sdef.trigger_vgroup_id] if sdef.trigger_vgroup_id else [])})


def waiting_for_vgroups(vgroups: Sequence[int]) -> str:
    """What a stream on ``vgroups`` without a leader waits for (ShowStreams' ``wait_reason``)."""
    return (f"waiting for a node to lead vgroup{'s' if len(vgroups) != 1 else ''} {list(vgroups)}: their readers "
            f"are deployed on the stream node that reports leading them")


async def check_stream_node(kv: MetaKV, node_id: int) -> None:
    """Refuse ``node_id`` unless a live stream-node session has it: ``NotAStreamNode`` or ``WrongNodeKind``."""
    if node_id in (await list_sessions(kv, STREAMNODE_ROLE)).sessions:
        return
    for role, what in ((QUERYNODE_ROLE, "a query node"), (QUERYCOORD_ROLE, "a coordinator")):
        if node_id in (await list_sessions(kv, role)).sessions:
            raise WrongNodeKind(f"cannot create an snode on node {node_id}: it is {what}, not a stream node; give "
                                f"the id of a live stream node (`querycoord streamnode` prints it when ready)")
    raise NotAStreamNode(f"cannot create an snode on node {node_id}: no live stream node has this id (unknown, "
                         f"or its session is gone); start the stream node first and use the id it prints")


__all__ = ["NotAStreamNode", "SnodeInUse", "WrongNodeKind", "check_stream_node", "name_streams",
           "refuse_snode_drop", "snode_dependents", "snode_dropped", "stream_vgroups", "unled_vgroups",
           "waiting_for_vgroups"]
