"""Planned leader changes (``querycoord switchover``), built on the etcd election's queue.

Candidates lead in the order of their election keys' create revisions, and a
candidate waits only for the key just before its own (``meta.election``). So
a switchover to a standby T is:

1. every standby queued ahead of T steps back: it withdraws its key and
   campaigns again, which queues it behind T (``Switchable.request_step_back``);
2. the leader checks in etcd that T is now next in line;
3. the leader stops its work (the scheduler stops without another write; the
   persisted task trees stay in etcd, to be resumed by T exactly as after a
   failover), then deletes its election key and revokes its session at once
   (``Switchable.hand_over``): T's wait ends with that deletion, without a
   lease having to expire. The old leader campaigns again, from the back.

One switchover runs at a time: the leader holds ``SWITCHOVER_KEY`` from the
first check to the new leader's election, written through its fence and under
its session's lease (so a leader that dies frees it); another switchover is
refused while the key exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import grpc
from google.protobuf.message_factory import GetMessageClass

from meta.election import LeaderInfo, election_prefix, observe_leader
from meta.errors import MetaError
from meta.kv import MetaKV
from meta.log import logger
from meta.txn import absent, created_at, delete, get, put
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.errors import Conflict, CoordError, NotFound
from querycoord.common.protocol import QUERYCOORD_ELECTION
from querycoord.security.grpc_channels import make_channel

if TYPE_CHECKING:
    from querycoord.leader.view import CoordinatorView, Leadership, Switchable

# Held by the leader while a switchover runs (relative to the meta root; JSON {"from", "to", "started"}).
SWITCHOVER_KEY = "switchover/querycoord"
# How long a standby may take to queue again, and the new leader to be elected, before the switchover is refused.
STEP_BACK_TIMEOUT = 3.0
ELECTED_TIMEOUT = 10.0
# A target must answer this fast to be taken for live.
PROBE_TIMEOUT = 1.0


@dataclass(frozen=True)
class Candidate:
    """A coordinator queued in the election: its address (the key's value) and its place (create revision)."""

    address: str
    create_revision: int
    lease: int


async def candidates(kv: MetaKV) -> list[Candidate]:
    """The coordinators queued in the election, the leader first."""
    snap = await kv.load_prefix(election_prefix(QUERYCOORD_ELECTION))
    return sorted((Candidate(k.value.decode(), k.create_revision, k.lease) for k in snap.kvs),
                  key=lambda c: c.create_revision)


async def switchover_holder(kv: MetaKV) -> dict[str, Any] | None:
    """The switchover in progress (``{"from", "to", "started"}``), if any."""
    raw = await kv.get(SWITCHOVER_KEY)
    if raw is None:
        return None
    try:
        held = json.loads(raw)
    except ValueError:
        return {"from": "?", "to": "?", "started": 0, "raw": raw.decode(errors="replace")}
    return held if isinstance(held, dict) else {"from": "?", "to": "?", "started": 0}


async def call_coordinator(address: str, method: str, request: Any, timeout: float) -> Any:
    """One QueryCoord call to the coordinator at ``address`` itself (no leader following), as this process (a
    leader asking a standby to step back presents the coordinator's credential)."""
    async with make_channel(address) as channel:
        return await _unary(channel, method)(request, timeout=timeout)


_SERVICE = qc.DESCRIPTOR.services_by_name["QueryCoord"]


def _unary(channel: grpc.aio.Channel, method: str) -> Any:
    """The one QueryCoord method ``method`` on ``channel``, built from the service descriptor: the generated stub
    (``querycoord_pb2_grpc``) builds every method of the service, and its module is most of what a short
    ``querycoord status`` would import."""
    response = GetMessageClass(_SERVICE.methods_by_name[method].output_type)  # the generated class itself
    return channel.unary_unary(f"/{_SERVICE.full_name}/{method}", request_serializer=_serialize,
                               response_deserializer=response.FromString)


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def coordinator_state(coord: Switchable) -> qc.GetCoordinatorStateResponse:
    """What this coordinator says of itself (``querycoord status``)."""
    election = coord.election
    fence = election.fence if election is not None else None
    return qc.GetCoordinatorStateResponse(
        status=common_pb2.Status(error_code=common_pb2.SUCCESS), address=coord.address, server_id=coord.server_id,
        leader=coord.is_leader, since_ms=int(coord.role_since * 1000),
        election_revision=fence.revision if fence is not None else 0)


async def step_back(coord: Switchable, requested_by: str, timeout: float = STEP_BACK_TIMEOUT) -> int:
    """Queue this standby again at the back of the election; the create revision of its new key."""
    election = coord.election
    before = election.fence if election is not None else None
    if coord.leadership is not None or before is None:
        raise Conflict(f"{coord.address} cannot step back: it " +
                       ("leads" if coord.leadership is not None else "is not queued in the election right now"))
    logger.info("coordinator {}: stepping back in the election for a switchover asked by {}", coord.address,
                requested_by or "?")
    coord.request_step_back()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if coord.leadership is not None:
            raise Conflict(f"{coord.address} was elected leader before it could step back")
        election = coord.election
        now = election.fence if election is not None else None
        if now is not None and now != before:
            return now.revision
        await asyncio.sleep(0.01)
    raise CoordError(f"{coord.address} did not queue again within {timeout:g}s", common_pb2.TIMEOUT)


async def switch_over(coord: Switchable, lead: Leadership, target: str) -> qc.SwitchoverResponse:
    """Hand the leadership of ``coord`` (which leads: ``lead``) to the standby ``target`` (empty: the next in line)
    and answer once another coordinator holds the election (see module docstring)."""
    assert coord.kv is not None and coord.session is not None
    me = coord.address
    queue = await candidates(coord.kv)
    if not queue or queue[0].address != me:
        raise Conflict(f"the election does not show {me} leading (it shows {queue[0].address if queue else 'none'});"
                       " retry")
    standbys = [c for c in queue[1:] if c.address != me]
    if not standbys:
        raise Conflict(f"no standby coordinator is queued in the election, only the leader {me}: start another "
                       "`querycoord coord` with the same etcd and --root first")
    if target == me:
        raise Conflict(f"{me} already leads; --to names the standby that is to lead")
    chosen = next((c for c in standbys if c.address == target), None) if target else standbys[0]
    if chosen is None:
        raise NotFound(f"{target} is not a live standby coordinator; the standbys are "
                       f"{', '.join(c.address for c in standbys)}")
    lock = await _lock(coord, lead, chosen.address)
    try:
        await _check_standby(chosen.address)
        stepped = [c.address for c in standbys if c.create_revision < chosen.create_revision]
        for address in stepped:
            await _ask_step_back(address, me, chosen.address)
        queue = await candidates(coord.kv)
        order = [c.address for c in queue]
        if order[:2] != [me, chosen.address]:
            raise Conflict(f"{chosen.address} is not next in line after the standbys stepped back "
                           f"(queue: {', '.join(order)}); the leadership was not handed over, retry")
        logger.info("switchover: {} hands the leadership over to {}", me, chosen.address)
        started = time.monotonic()
        await coord.hand_over()
        leader = await _elected(coord.kv, me)
        took = time.monotonic() - started
    finally:
        await _unlock(coord.kv, lock)
    logger.info("switchover: {} leads {:.3f}s after {} resigned", leader, took, me)
    if leader != chosen.address:
        raise CoordError(f"{me} resigned, but {leader} was elected instead of {chosen.address} (did it stop?)",
                         common_pb2.UNEXPECTED_ERROR)
    return qc.SwitchoverResponse(status=common_pb2.Status(error_code=common_pb2.SUCCESS), previous_leader=me,
                                 leader=leader, stepped_back=stepped, handover_seconds=took)


async def _lock(coord: CoordinatorView, lead: Leadership, to: str) -> int:
    """Take ``SWITCHOVER_KEY`` through the fence, under the session's lease; its create revision."""
    assert coord.session is not None
    value = json.dumps({"from": coord.address, "to": to, "started": time.time()})
    result = await lead.kv.txn([absent(SWITCHOVER_KEY)], [put(SWITCHOVER_KEY, value, coord.session.lease_id)],
                               on_failure_ops=[get(SWITCHOVER_KEY)], operation="switchover lock")
    if result.succeeded:
        return result.revision
    held = result.responses[0]
    try:
        other = json.loads(held.value) if held is not None else {}
    except ValueError:
        other = {}
    since = time.strftime("%H:%M:%S", time.localtime(float(other.get("started") or 0)))
    raise Conflict(f"another switchover is in progress (from {other.get('from', '?')} to {other.get('to', '?')}, "
                   f"started at {since}); wait for it to finish")


async def _unlock(kv: MetaKV, revision: int) -> None:
    """Release the switchover key if it is still ours (revoking the session at the handover removed it already)."""
    with contextlib.suppress(MetaError):
        await kv.txn([created_at(SWITCHOVER_KEY, revision)], [delete(SWITCHOVER_KEY)], operation="switchover unlock")


async def _check_standby(address: str) -> None:
    try:
        state = await call_coordinator(address, "GetCoordinatorState", qc.GetCoordinatorStateRequest(),
                                       PROBE_TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        raise Conflict(f"the standby {address} does not answer ({exc.code().name}: {exc.details()}); "
                       "nothing was changed") from None
    if state.leader:
        raise Conflict(f"{address} says it leads; nothing was changed, retry")


async def _ask_step_back(address: str, me: str, target: str) -> None:
    try:
        resp = await call_coordinator(address, "StepBack", qc.StepBackRequest(requested_by=me),
                                      STEP_BACK_TIMEOUT + 1.0)
    except grpc.aio.AioRpcError as exc:
        raise Conflict(f"the standby {address}, queued ahead of {target}, did not step back "
                       f"({exc.code().name}: {exc.details()}); the leadership was not handed over") from None
    if resp.status.error_code != common_pb2.SUCCESS:
        raise Conflict(f"the standby {address}, queued ahead of {target}, did not step back: {resp.status.reason}; "
                       "the leadership was not handed over")


async def _elected(kv: MetaKV, me: str) -> str:
    """The first leader other than ``me`` in the election (``TIMEOUT`` after ``ELECTED_TIMEOUT``)."""
    try:
        async with asyncio.timeout(ELECTED_TIMEOUT):
            observed = cast(AsyncGenerator[LeaderInfo | None, None], observe_leader(kv, election_prefix(
                QUERYCOORD_ELECTION)))
            async with contextlib.aclosing(observed) as leaders:
                async for leader in leaders:
                    if leader is not None and leader.value.decode() != me:
                        return leader.value.decode()
    except TimeoutError:
        pass
    raise CoordError(f"{me} resigned, but no other coordinator was elected within {ELECTED_TIMEOUT:g}s",
                     common_pb2.TIMEOUT)


__all__ = ["SWITCHOVER_KEY", "Candidate", "call_coordinator", "candidates", "coordinator_state", "step_back",
           "switch_over", "switchover_holder"]
