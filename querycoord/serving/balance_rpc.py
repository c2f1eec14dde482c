"""The QueryCoord calls that pause balance and switch check kinds at runtime (``querycoord.checkers.activation``).

SuspendBalance, ResumeBalance, ActivateChecker and DeactivateChecker change the leader's switches through its
fence (a standby aborts UNAVAILABLE naming the leader, as for every mutation); CheckBalanceStatus and
ListCheckers are reads, answered by the leader from its switches and by a standby from etcd. A change is
idempotent: pausing a paused balance keeps its first since and by. Activating a kind kicks a checker pass, so
what it was kept from doing is planned now rather than at the next interval.

The functions are the servicer's methods (``server.QueryCoordServicer`` binds them), kept here so the service
module stays one of reads and jobs.
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc

from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.checkers.activation import (
    BALANCE,
    CHECK_KINDS,
    Off,
    kind_of,
    read_activation,
    warning_for,
)
from querycoord.common.limits import Limits
from querycoord.common.validate import check_name
from querycoord.leader.view import CoordinatorView
from querycoord.security.auth import caller
from querycoord.serving.gate import LeaderGate, answered


class QueryCoordServicer(Protocol):
    """What these calls read of the servicer that binds them (``server.QueryCoordServicer``)."""

    coord: CoordinatorView
    gate: LeaderGate
    limits: Limits


def _who(context: grpc.aio.ServicerContext) -> str:
    """Who asks: the authenticated principal, or the caller's address when the server authenticates nobody."""
    principal = caller()
    if principal is not None:
        return principal.name
    peer = context.peer() or ""
    return peer.rsplit(":", 1)[0].removeprefix("ipv4:").removeprefix("ipv6:") if peer else ""


async def _inactive(servicer: QueryCoordServicer) -> dict[str, Off]:
    """The kinds that are off: the leader's switches, or on a standby etcd's key."""
    lead = servicer.gate.leadership()
    if lead is not None:
        return lead.checker.switches.inactive()
    assert servicer.coord.kv is not None
    return await read_activation(servicer.coord.kv)


def _balance_status(off: dict[str, Off], reason: str = "") -> qc.BalanceStatusResponse:
    paused = off.get(BALANCE)
    return qc.BalanceStatusResponse(status=common_pb2.Status(error_code=common_pb2.SUCCESS, reason=reason),
                                    paused=paused is not None, since_ms=paused.since_ms if paused else 0,
                                    by=paused.by if paused else "")


def _info(name: str, off: dict[str, Off]) -> qc.CheckerInfo:
    kind = kind_of(name)
    return qc.CheckerInfo(name=kind.name, active=kind.name not in off, description=kind.description)


async def _switch(servicer: QueryCoordServicer, context: grpc.aio.ServicerContext, name: str,
                  active: bool) -> dict[str, Off]:
    """Turn ``name`` on or off on the leader; the kinds off afterwards."""
    kind_of(name)  # NOT_FOUND before the leader is even looked for
    lead = await servicer.gate.lead(context)
    switches = lead.checker.switches
    await switches.set_active(lead.kv, name, active, _who(context))
    if active:
        lead.checker.kick()
    return switches.inactive()


def _name(servicer: QueryCoordServicer, request: Any) -> str:
    return check_name("name", request.name, servicer.limits.max_name_length)


@answered(qc.BalanceStatusResponse)
async def suspend_balance(servicer: QueryCoordServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
    return _balance_status(await _switch(servicer, context, BALANCE, False))


@answered(qc.BalanceStatusResponse)
async def resume_balance(servicer: QueryCoordServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
    return _balance_status(await _switch(servicer, context, BALANCE, True))


@answered(qc.BalanceStatusResponse)
async def check_balance_status(servicer: QueryCoordServicer, request: Any,
                               context: grpc.aio.ServicerContext) -> Any:
    return _balance_status(await _inactive(servicer))


@answered(qc.ListCheckersResponse)
async def list_checkers(servicer: QueryCoordServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
    off = await _inactive(servicer)
    return qc.ListCheckersResponse(status=common_pb2.Status(error_code=common_pb2.SUCCESS),
                                   checkers=[_info(k.name, off) for k in CHECK_KINDS])


@answered(qc.CheckerResponse)
async def activate_checker(servicer: QueryCoordServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
    name = _name(servicer, request)
    off = await _switch(servicer, context, name, True)
    return qc.CheckerResponse(status=common_pb2.Status(error_code=common_pb2.SUCCESS), checker=_info(name, off))


@answered(qc.CheckerResponse)
async def deactivate_checker(servicer: QueryCoordServicer, request: Any,
                             context: grpc.aio.ServicerContext) -> Any:
    """Succeeds for every known kind; for one that repairs lost copies the status reason carries a warning."""
    name = _name(servicer, request)
    off = await _switch(servicer, context, name, False)
    return qc.CheckerResponse(status=common_pb2.Status(error_code=common_pb2.SUCCESS,
                                                       reason=warning_for(kind_of(name))),
                              checker=_info(name, off))


__all__ = ["activate_checker", "check_balance_status", "deactivate_checker", "list_checkers", "resume_balance",
           "suspend_balance"]
