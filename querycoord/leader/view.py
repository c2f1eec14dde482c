"""The leader as its surfaces see it: the leader's world (``Leadership``) and the narrow views of a coordinator.

The services, probes, metrics and status page (``querycoord.serving``, ``querycoord.console``) and the
switchover do not take the whole ``Coordinator`` (the composition root, ``coordinator``): each takes the
smallest of these views that covers what it reads, so what a surface may touch is written down here, and a
test can hand it a small stand-in. ``Coordinator`` satisfies all three structurally.

* ``Leading``: the gate's view (``querycoord.serving.gate``): the leadership while this coordinator leads,
  what a standby tells callers, etcd's space.
* ``CoordinatorView``: what a surface reads besides: who this coordinator is (address, server id, role since),
  its settings, its etcd view for a standby's reads, the warm standby's copy, the catalog's targets, its
  session, whether its campaign-and-lead loop still runs, and who leads.
* ``Switchable``: what a planned leader change drives (``switchover``): the election, stepping back, handing
  over.

Their attributes are read-only properties: a surface reads the coordinator's state and never sets it (what it
may change, it changes through the leadership's objects or ``Switchable``'s two actions).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from meta.election import Election
    from meta.fence import Fence
    from meta.kv import FencedKV, MetaKV
    from meta.session import Session
    from querycoord.catalog.targets import CatalogTargets
    from querycoord.checkers import Checker
    from querycoord.cluster.lifecycle import NodeLifecycles
    from querycoord.cluster.nodes import NodeManager
    from querycoord.common.etcd_space import SpaceMonitor
    from querycoord.querymeta import QueryMeta
    from querycoord.querymeta.mirror import MetaMirror
    from querycoord.served.state import ServedView
    from querycoord.settings.config import CoordConfig
    from querycoord.stream.manager import StreamManager
    from querycoord.stream.store import StreamStore
    from querycoord.task.model import TaskEnv
    from querycoord.task.scheduler import Scheduler


@dataclass
class Leadership:
    """Everything that exists only while this coordinator leads, built whole by the takeover
    (``Coordinator._take_over``): no part of it is ever missing while it is the coordinator's leadership."""

    fence: Fence
    kv: FencedKV  # the KV through the fence: every write of this leadership goes through it
    meta: QueryMeta
    nodes: NodeManager
    scheduler: Scheduler
    env: TaskEnv
    tasks: list[asyncio.Task[None]]  # the leader's loops, cancelled when it stops leading
    stream_store: StreamStore  # stream definitions and snodes, written through the fence
    streams: StreamManager  # the stream runtime (``querycoord.serving.stream_service`` serves it)
    checker: Checker
    served: ServedView  # what online nodes serve: the state users are shown (``querycoord.served``)
    lifecycles: NodeLifecycles | None = None  # the query nodes' maintenance lifecycles (``cluster.lifecycle``)


class Leading(Protocol):
    """What the gate reads of a coordinator to admit a call or redirect it."""

    @property
    def leadership(self) -> Leadership | None:
        """The leader's world; None on a standby (and for a moment after a loss, see ``is_leader``)."""

    @property
    def is_leader(self) -> bool:
        """It leads and its scheduler still runs (a leadership whose fence was refused stops at once)."""

    @property
    def space(self) -> SpaceMonitor | None:
        """etcd's NOSPACE alarm and db size as last polled; None before the coordinator started."""

    async def not_leader_message(self) -> str:
        """What a standby tells callers: who leads now, in the form clients follow."""


class CoordinatorView(Leading, Protocol):
    """What the services, probes, metrics and status page read of a coordinator."""

    @property
    def address(self) -> str:
        """The address it serves gRPC on (its election key's value)."""

    @property
    def server_id(self) -> int:
        """Its session's server id; 0 before its session is registered."""

    @property
    def role_since(self) -> float:
        """When it took its current role, leader or standby (epoch seconds)."""

    @property
    def config(self) -> CoordConfig:
        """Its settings (the request limits among them)."""

    @property
    def kv(self) -> MetaKV | None:
        """Its unfenced view of etcd under the root, for reads a standby answers; None before it started."""

    @property
    def mirror(self) -> MetaMirror | None:
        """The warm standby's copy of the query meta, while it campaigns with ``warm_standby`` on."""

    @property
    def targets(self) -> CatalogTargets | None:
        """The local catalog's segments and channels, followed; None with a remote catalog."""

    @property
    def session(self) -> Session | None:
        """Its current session; None before the first is registered."""

    @property
    def loop_ended(self) -> bool:
        """Its campaign-and-lead loop has ended before it was stopped (liveness fails then)."""

    async def leader_address(self) -> str | None:
        """The address the election names as leader, read from etcd; None when nobody leads."""


class Switchable(CoordinatorView, Protocol):
    """What a planned leader change (``querycoord.leader.switchover``) drives besides what it reads."""

    @property
    def election(self) -> Election | None:
        """The election it campaigns in with its current session; None before its first campaign."""

    def request_step_back(self) -> None:
        """Withdraw from the election and campaign again behind every candidate queued now."""

    async def hand_over(self) -> None:
        """Stop leading and free the election key and the session at once, for the next in line."""


__all__ = ["CoordinatorView", "Leadership", "Leading", "Switchable"]
