"""Stream definitions in the leader's memory: loaded at the start, kept by notifications, reconciled by refresh.

The caller notifies ``put`` (create, stop, start) and ``remove`` (drop) after
each committed store txn, never before: a deploy must not go out for a write
that may not have happened. ``refresh`` is the checker's definition part: it
re-reads the store and repairs a missed notification (a create, drop, stop or
start the manager was not told of), counted and logged. Streams notified
while the store was being read are left alone: the read is older.
"""

from __future__ import annotations

from loguru import logger

from proto import stream_pb2
from querycoord.stream.adoption import Adoption
from querycoord.stream.runtime import ManagerState, Runtime, StreamRuntime


class Definitions:
    """The leader's set of stream definitions, and the plan queue entries their changes make."""

    def __init__(self, shared: Runtime, adoption: Adoption):
        self.shared = shared
        self.adoption = adoption
        # refresh() leaves alone the streams notified (put, remove) after its read began.
        self.notify_seq = 0
        self.notified: dict[int, int] = {}

    async def start(self) -> None:
        """Load the persisted streams and snodes; WATCH when any stream exists (running tasks may be out there)."""
        shared = self.shared
        await shared.load_snodes()
        for sdef in await shared.store.list_streams():
            shared.streams[sdef.id] = StreamRuntime(sdef=sdef, last_action=shared.clock())
        shared.state = ManagerState.WATCH if shared.streams else ManagerState.NORMAL
        shared.state_since = shared.clock()
        if shared.state is ManagerState.NORMAL:
            shared.to_plan.update(shared.streams)
        logger.info("stream manager starts in {} with {} streams", shared.state.value, len(shared.streams))

    def _notify(self, stream_id: int) -> None:
        self.notify_seq += 1
        self.notified[stream_id] = self.notify_seq

    def put(self, sdef: stream_pb2.StreamDef) -> None:
        """A committed create, stop or start."""
        self._notify(sdef.id)
        self._put(sdef)

    def _put(self, sdef: stream_pb2.StreamDef) -> None:
        shared = self.shared
        rt = shared.streams.get(sdef.id)
        if rt is None:
            rt = shared.streams[sdef.id] = StreamRuntime(sdef=sdef, last_action=shared.clock())
            if shared.state is ManagerState.NORMAL:
                shared.to_plan.add(sdef.id)
            return
        was_stopped = rt.sdef.user_stopped
        rt.sdef = sdef
        if sdef.user_stopped:
            # Tasks are undeployed (with checkpoint) as they report; nothing is pending any more.
            shared.clear_tasks(rt)
            shared.to_plan.discard(sdef.id)
        elif was_stopped and shared.state is ManagerState.NORMAL:
            rt.stop_code, rt.stop_reason, rt.retries, rt.next_retry = 0, "", 0, None
            shared.to_plan.add(sdef.id)

    def remove(self, stream_id: int) -> None:
        """A committed drop: forget the stream; its tasks are undeployed with cleanup when they report."""
        self._notify(stream_id)
        self._remove(stream_id)

    def _remove(self, stream_id: int) -> None:
        self.shared.streams.pop(stream_id, None)
        self.shared.to_plan.discard(stream_id)
        self.adoption.forget(stream_id)

    async def refresh(self) -> None:
        """Re-read the store and reconcile.

        A stream created, dropped, stopped or started without the manager
        being told is a missed notification: repaired, counted and logged. A
        stream notified while the store was being read is skipped (the read
        may predate its txn: acting on it would resurrect a dropped stream or
        drop a new one). Other differences (a main snode moved by an snode
        drop) are ordinary updates.
        """
        shared = self.shared
        seq = self.notify_seq
        await shared.load_snodes()
        persisted = {s.id: s for s in await shared.store.list_streams()}

        def fresh(stream_id: int) -> bool:
            return self.notified.get(stream_id, 0) <= seq

        for stream_id in [s for s in shared.streams if s not in persisted and fresh(s)]:
            shared.repaired(shared.streams[stream_id].sdef, "in the leader's memory but no longer persisted (a "
                                                            "missed drop): forgotten, its tasks are undeployed "
                                                            "with cleanup")
            self._remove(stream_id)
        for sdef in persisted.values():
            rt = shared.streams.get(sdef.id)
            if not fresh(sdef.id) or (rt is not None and rt.sdef == sdef):
                continue
            if rt is None:
                then = "kept stopped" if sdef.user_stopped else "planned"
                shared.repaired(sdef, f"persisted but unknown to the leader (a missed create): {then}")
            elif rt.sdef.user_stopped != sdef.user_stopped:
                now_state = "stopped" if sdef.user_stopped else "started"
                shared.repaired(sdef, f"persisted {now_state} by a user, the leader had it "
                                      f"{'running' if sdef.user_stopped else 'stopped'} (a missed notification)")
            self._put(sdef)
        self.notified = {s: n for s, n in self.notified.items() if n > seq}
