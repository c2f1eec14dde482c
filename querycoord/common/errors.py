"""One error base and one mapping to the wire: every refusal carries the code its caller sees.

Catalog, stream, task, node and query-meta errors all subclass ``CoordError``,
so whatever layer refuses, the code survives to the gRPC answer: a code lost
on the way (a load-type conflict answered as UNEXPECTED_ERROR) tells a client
to report a bug instead of fixing its request. ``status_of`` is the only
place an exception becomes a ``common.Status``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from meta.errors import MetaError, MetaNoSpace, NotLeader, RequestTooLarge
from proto import common_pb2

TIMEOUT_REASON = "the request did not finish before its deadline; it may still complete"


class CoordError(Exception):
    """A refusal or failure with the ``common.ErrorCode`` its caller sees.

    ``reason`` says what was wrong in the raiser's words; ``str(exc)`` is the
    sentence the caller reads (the same, unless a subclass adds context such
    as the node and method, or what to do).
    """

    code: common_pb2.ErrorCode = common_pb2.UNEXPECTED_ERROR

    def __init__(self, reason: str, code: common_pb2.ErrorCode | None = None):
        super().__init__(reason)
        self.reason = reason
        if code is not None:
            self.code = code

    def status(self) -> common_pb2.Status:
        """This error as the Status of an answer."""
        return status_of(self)


class IllegalArgument(CoordError):
    """The request itself is malformed (no ids, bad values)."""

    code = common_pb2.ILLEGAL_ARGUMENT


class NotFound(CoordError):
    """Something the request names is unknown or not loaded."""

    code = common_pb2.NOT_FOUND


class Conflict(CoordError):
    """The request contradicts the current state (e.g. partitions of a collection loaded as a whole)."""

    code = common_pb2.CONFLICT


class AlreadyExists(CoordError):
    """What the request would create is held already by another owner; the reason names the holder."""

    code = common_pb2.ALREADY_EXISTS


class NotLeading(CoordError):
    """This coordinator cannot serve the call as leader; the reason names the leader (``protocol.leader_is_at``)."""

    code = common_pb2.NOT_LEADER


class DeadlinePassed(CoordError):
    """The caller's deadline passed while the work went on (it may still complete)."""

    code = common_pb2.TIMEOUT


def status_of(exc: BaseException, *, source: str = "") -> common_pb2.Status:
    """The Status a caller sees for ``exc``: its code, and a reason naming what was wrong.

    ``source`` names the component in reasons of errors that do not carry their
    own context (etcd failures, bugs), e.g. ``"the catalog"``.
    """
    if isinstance(exc, CoordError):
        return common_pb2.Status(error_code=exc.code, reason=str(exc))
    if isinstance(exc, RequestTooLarge):
        return common_pb2.Status(error_code=common_pb2.REQUEST_TOO_LARGE, reason=str(exc))
    if isinstance(exc, NotLeader):
        return common_pb2.Status(error_code=common_pb2.NOT_LEADER, reason=str(exc))
    if isinstance(exc, MetaNoSpace):
        return common_pb2.Status(error_code=common_pb2.RESOURCE_EXHAUSTED, reason=str(exc))
    if isinstance(exc, MetaError):
        return common_pb2.Status(error_code=common_pb2.META_UNAVAILABLE,
                                 reason=f"{source}: {exc}" if source else str(exc))
    if isinstance(exc, TimeoutError):
        return common_pb2.Status(error_code=common_pb2.TIMEOUT, reason=TIMEOUT_REASON)
    where = f" in {source}" if source else ""
    return common_pb2.Status(error_code=common_pb2.UNEXPECTED_ERROR,
                             reason=f"internal error{where}: {type(exc).__name__}: {exc}")


def status_for(source: str) -> Callable[[BaseException], common_pb2.Status]:
    """``status_of`` as one component answers: reasons of errors without context of their own name ``source``."""
    return functools.partial(status_of, source=source)


__all__ = [
    "TIMEOUT_REASON",
    "AlreadyExists",
    "Conflict",
    "CoordError",
    "DeadlinePassed",
    "IllegalArgument",
    "NotFound",
    "NotLeading",
    "status_for",
    "status_of",
]
