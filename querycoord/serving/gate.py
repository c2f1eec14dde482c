"""The door of every coordinator gRPC service: admit a call to the leadership, or redirect; always answer a Status.

Shared by the QueryCoord and StreamMgmt services so both redirect alike (a
standby aborts with gRPC UNAVAILABLE naming the leader, which the query
client and the stream nodes' heartbeat client both follow) and map errors
alike (``errors.status_of``): no exception reaches gRPC but that deliberate
abort, so a caller can always tell a refusal (a Status) from a transport
failure.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import grpc
from loguru import logger

from meta.errors import MetaError, MetaNoSpace, NotLeader
from proto import common_pb2
from querycoord.common.errors import CoordError, NotLeading, status_of

if TYPE_CHECKING:
    from querycoord.leader.view import Leadership, Leading

# Kept back from the caller's deadline so the answer still reaches it in time.
_ANSWER_MARGIN = 0.2


def budget(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds a call may wait for its work before answering (None: the caller set no deadline)."""
    remaining = context.time_remaining()
    return None if remaining is None else max(0.1, remaining - _ANSWER_MARGIN)


class LeaderGate:
    """Admission and answers of one service, reading the coordinator through ``Leading``.

    ``source`` names the service in reasons of errors without context of
    their own (etcd failures, bugs).
    """

    def __init__(self, coord: Leading, *, source: str = ""):
        self.coord = coord
        self.source = source

    def leadership(self) -> Leadership | None:
        """The leadership if this coordinator leads; None on a standby."""
        lead = self.coord.leadership
        if lead is None or not self.coord.is_leader:
            return None
        return lead

    async def lead(self, context: grpc.aio.ServicerContext | None) -> Leadership:
        """The leadership, or (on a standby) gRPC UNAVAILABLE naming the leader, so clients move on."""
        lead = self.leadership()
        if lead is not None:
            return lead
        message = await self.coord.not_leader_message()
        if context is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        raise NotLeading(message)

    async def answer(self, response_cls: type, fn: Callable[[], Awaitable[Any]]) -> Any:
        """``fn()``'s response, or ``response_cls`` carrying the Status of what it raised."""
        try:
            return await fn()
        except grpc.aio.AbortError:
            raise  # context.abort(): the status is already set
        except NotLeader as exc:
            # A fenced write was refused: this coordinator was deposed. Step down, then name the leader.
            self._deposed(exc)
            reason = await self.coord.not_leader_message()
            return response_cls(status=common_pb2.Status(error_code=common_pb2.NOT_LEADER, reason=reason))
        except MetaNoSpace as exc:  # RESOURCE_EXHAUSTED, with the db size and quota and what to run
            space = self.coord.space
            return response_cls(status=status_of(await space.refusal(exc) if space is not None else exc))
        except Exception as exc:  # a bug must not crash the server or leave the caller hanging
            if not isinstance(exc, CoordError | MetaError | TimeoutError):
                logger.exception("unexpected error in {}", response_cls.__name__)
            return response_cls(status=status_of(exc, source=self.source))

    def _deposed(self, exc: NotLeader) -> None:
        """Stop the leadership whose fence was refused (never a later one that took its place)."""
        lead = self.coord.leadership
        if lead is not None and lead.fence.revision == exc.revision:
            lead.scheduler.leadership_lost(exc)


class Gated(Protocol):
    """A servicer whose RPCs go through its ``gate``."""

    gate: LeaderGate


Rpc = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def answered(response_cls: type) -> Callable[[Rpc], Rpc]:
    """An RPC of a ``Gated`` servicer, answered through ``LeaderGate.answer``: what its body returns, or
    ``response_cls`` carrying the Status of what it raised."""

    def wrap(method: Rpc) -> Rpc:
        @functools.wraps(method)
        async def rpc(servicer: Gated, request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await servicer.gate.answer(response_cls, lambda: method(servicer, request, context))

        return rpc

    return wrap


__all__ = ["Gated", "LeaderGate", "answered", "budget"]
