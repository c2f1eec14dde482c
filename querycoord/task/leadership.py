"""What the scheduler's parts share about leadership: whether the scheduler stopped, how a lost leadership is
told, and the exceptions that carry it out of a running tree.

Losing leadership (``NotLeader`` from a fenced write, or a node reporting a newer leader) stops everything
without another write: a tree is dropped with its keys left for the next leader.
"""

from __future__ import annotations

from collections.abc import Callable

from loguru import logger

from meta.errors import MetaError
from proto import common_pb2
from querycoord.catalog.broker import BrokerError
from querycoord.cluster.allocator import NoAvailableNode
from querycoord.cluster.client import NodeError
from querycoord.task.model import TaskError

# Failures a child survives by retrying or rescheduling.
CHILD_FAILURES = (NodeError, TaskError, NoAvailableNode, MetaError, BrokerError)


class LeadershipLost(Exception):
    """Raised inside the scheduler when a write or a node says another leader exists."""


class Abandon(Exception):
    """Leadership is gone: drop the trigger without another write (its keys stay for the next leader)."""


def internal(exc: BaseException) -> TaskError:
    """An unexpected failure as the error a trigger's callers receive."""
    err = TaskError(f"internal error: {exc!r}", common_pb2.UNEXPECTED_ERROR)
    err.__cause__ = exc
    return err


def is_stale_leader(exc: BaseException) -> bool:
    """A node answered that it follows a newer leader."""
    return isinstance(exc, NodeError) and exc.code == common_pb2.STALE_LEADER


class Lifecycle:
    """The scheduler's stopped flag, shared by its parts, and the one way to say leadership is lost."""

    def __init__(self, on_leadership_lost: Callable[[BaseException], None] | None = None):
        self.stopped = False
        self.on_leadership_lost = on_leadership_lost

    def lost(self, exc: BaseException) -> None:
        """Stop (once) and tell the owner: no part writes anything more."""
        if not self.stopped:
            logger.error("scheduler: leadership lost ({}); stopping without further writes", exc)
            self.stopped = True
            if self.on_leadership_lost is not None:
                self.on_leadership_lost(exc)
