"""The coordinator's view of etcd's space: is the NOSPACE alarm raised, how large is the db, what is the quota.

While etcd's NOSPACE alarm is raised it refuses every write (reads and lease
keepalives still work) until an operator compacts, defragments and disarms
it (``querycoord etcd maintain``). A coordinator must neither crash nor spin
meanwhile: requests that need a write are refused at once with
RESOURCE_EXHAUSTED and a reason saying what to run, work already running
pauses (``wait_writable``) and resumes by itself once the alarm is gone. One
``SpaceMonitor`` per coordinator process polls the alarm every few seconds
(more often while it is raised) so that all of this costs one small read per
poll, not one refused write per request; health, status and metrics read its
attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from loguru import logger

from meta.client import EtcdClient
from meta.errors import ClientClosed, MetaError, MetaNoSpace
from meta.loops import keep_running
from meta.ops.maintenance import MIB, backend_quota, space_status
from proto import common_pb2
from querycoord.common.errors import CoordError

# A quota nobody could read (TLS-only metrics, an old etcd) is looked for again this often.
_QUOTA_RETRY_S = 60.0


class EtcdOutOfSpace(CoordError):
    """A request needing a write while etcd's NOSPACE alarm is raised; the reason says what to run."""

    code = common_pb2.RESOURCE_EXHAUSTED


class SpaceMonitor:
    """etcd's NOSPACE alarm and db size as this coordinator last saw them (see module docstring).

    ``nospace``: the alarm is raised (or a write was just refused for it);
    ``db_size`` / ``db_size_in_use`` / ``quota``: bytes of the member this
    client talks to (``quota`` 0: unknown); ``alarms``: (member id, name);
    ``checked_at``: wall time of the last successful poll (0: none yet);
    ``poll_error``: why the last poll failed ("" when it did not);
    ``raised``: how many times a poll saw the alarm go up.
    """

    def __init__(self, client: EtcdClient, *, interval: float = 3.0, nospace_interval: float = 1.0,
                 min_interval: float = 0.5):
        self.client = client
        self.interval = interval
        self.nospace_interval = nospace_interval
        self.min_interval = min_interval
        self.nospace = False
        self.db_size = 0
        self.db_size_in_use = 0
        self.quota = 0
        self.alarms: list[tuple[int, str]] = []
        self.checked_at = 0.0
        self.poll_error = ""
        self.raised = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()
        self._refreshed = 0.0  # monotonic time of the last refresh attempt
        self._logged = False  # whether the last line logged said "out of space" (one line per change)
        self._quota_tried = -_QUOTA_RETRY_S
        self._task: asyncio.Task[None] | None = None

    # ----- life cycle -------------------------------------------------------------------------------------------
    @property
    def poll_task(self) -> asyncio.Task[None] | None:
        """The poll loop between ``start`` and ``stop``: it also ends by itself once the etcd client is closed, and
        how it ended (cleanly, not cancelled) is what a caller checks."""
        return self._task

    def start(self) -> None:
        if self._task is None:
            # Never dies: a poll that raises anything but etcd trouble (kept in ``poll_error``) is logged, counted
            # and polled again (``meta.loops``); a closed client ends it (the process is stopping).
            self._task = asyncio.create_task(keep_running("etcd space monitor", self._poll_forever, client=self.client),
                                             name="etcd-space")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self._writable.set()  # nobody waits on a stopped monitor forever

    async def _poll_forever(self) -> None:
        while True:
            await self.refresh()
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.nospace_interval if self.nospace else self.interval)
            wait = self.min_interval - (time.monotonic() - self._refreshed)
            if wait > 0:  # kicked right after a refresh: never poll more often than ``min_interval``
                await asyncio.sleep(wait)

    # ----- state ------------------------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Ask etcd for its alarms and the db size now; a failure is kept in ``poll_error`` (the state stays)."""
        async with self._lock:
            self._refreshed = time.monotonic()
            client = self.client
            try:
                status = await space_status(client)
            except ClientClosed:
                raise
            except MetaError as exc:
                self.poll_error = str(exc).splitlines()[0]
                return
            self.db_size, self.db_size_in_use = status.db_size, status.db_size_in_use
            if status.quota:
                self.quota = status.quota
            elif not self.quota and time.monotonic() - self._quota_tried >= _QUOTA_RETRY_S:
                self._quota_tried = time.monotonic()
                for endpoint in client.endpoints:
                    self.quota = await backend_quota(client.config, endpoint)
                    if self.quota:
                        break
            self.alarms = status.alarms
            self.checked_at = time.time()
            self.poll_error = ""
            self._set_nospace(any(name == "NOSPACE" for _, name in self.alarms))
            if self.nospace != self._logged:  # logged here, where the sizes are fresh
                self._logged = self.nospace
                if self.nospace:
                    self.raised += 1
                    logger.error("{}; writes wait or are refused until then", self.reason())
                else:
                    logger.warning("etcd has space again (db {:.0f} MiB{}): writes resume", self.db_size / MIB,
                                   f" of quota {self.quota / MIB:.0f} MiB" if self.quota else "")

    def _set_nospace(self, nospace: bool) -> None:
        if nospace == self.nospace:
            return
        self.nospace = nospace
        if nospace:
            self._writable.clear()
        else:
            self._writable.set()

    def noted(self, exc: MetaNoSpace) -> None:
        """A write was just refused for NOSPACE: take the alarm as raised now, and poll soon for the sizes."""
        self._set_nospace(True)
        self._kick.set()

    def reason(self) -> str:
        """What a refused caller reads: the db size, the quota, what to run."""
        quota = f"quota {self.quota / MIB:.0f} MiB" if self.quota else "quota unknown"
        return f"etcd is out of space (db {self.db_size / MIB:.0f} MiB of {quota}): run `querycoord etcd maintain`"

    async def refusal(self, exc: MetaNoSpace | None = None) -> EtcdOutOfSpace:
        """The error to answer a request needing a write with (``exc``: etcd just refused one), with sizes at most
        ``min_interval`` old."""
        if exc is not None:
            self.noted(exc)
        if time.monotonic() - self._refreshed > self.min_interval:
            await self.refresh()
        return EtcdOutOfSpace(self.reason())

    async def wait_writable(self) -> None:
        """Return once etcd is not known to be out of space (at once when it is not)."""
        await self._writable.wait()

    def as_dict(self) -> dict[str, object]:
        return {"nospace": self.nospace, "db_size": self.db_size, "db_size_in_use": self.db_size_in_use,
                "quota": self.quota, "alarms": [{"member_id": m, "alarm": a} for m, a in self.alarms],
                "checked_at": self.checked_at, "poll_error": self.poll_error, "raised": self.raised}


__all__ = ["EtcdOutOfSpace", "SpaceMonitor"]
