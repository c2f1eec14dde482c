"""Hooks through which the process observes the engine (the scheduler, the stream manager), without the engine
knowing of Prometheus or of the process.

The engine calls these module-level functions where something worth counting
happens; ``querycoord.common.metrics.install`` points them at Prometheus. The
defaults do nothing, so the engine runs alone (tests, benchmarks) at the cost
of one call. The arguments are plain values, never the engine's objects, so
this module imports nothing of the engine: the arrow points down. Observers
run inline on the event loop: they must be quick and must not raise.
"""

from __future__ import annotations

from collections.abc import Callable


def _ignore(*_args: object) -> None:
    return None


# (kind, trigger condition, created_ms, result "done" | "cancelled" | "failed"): a trigger answered its callers.
trigger_finished: Callable[[int, int, int, str], None] = _ignore
# (kind, created_ms): a child task finished.
child_done: Callable[[int, int], None] = _ignore
# (kind,): a child task is tried again after a failure.
child_retried: Callable[[int], None] = _ignore
# (kind,): a failed child task is replaced by children on other nodes.
child_rescheduled: Callable[[int], None] = _ignore
# (seconds,): the leader handled one stream heartbeat.
heartbeat_handled: Callable[[float], None] = _ignore


def set_observers(
    *,
    on_trigger_finished: Callable[[int, int, int, str], None] | None = None,
    on_child_done: Callable[[int, int], None] | None = None,
    on_child_retried: Callable[[int], None] | None = None,
    on_child_rescheduled: Callable[[int], None] | None = None,
    on_heartbeat_handled: Callable[[float], None] | None = None,
) -> None:
    """Install the given observers (None: keep the current one)."""
    global trigger_finished, child_done, child_retried, child_rescheduled, heartbeat_handled
    if on_trigger_finished is not None:
        trigger_finished = on_trigger_finished
    if on_child_done is not None:
        child_done = on_child_done
    if on_child_retried is not None:
        child_retried = on_child_retried
    if on_child_rescheduled is not None:
        child_rescheduled = on_child_rescheduled
    if on_heartbeat_handled is not None:
        heartbeat_handled = on_heartbeat_handled


def reset_observers() -> None:
    """Back to the no-op defaults (tests)."""
    global trigger_finished, child_done, child_retried, child_rescheduled, heartbeat_handled
    trigger_finished = child_done = child_retried = child_rescheduled = heartbeat_handled = _ignore


__all__ = ["child_done", "child_rescheduled", "child_retried", "heartbeat_handled", "reset_observers",
           "set_observers", "trigger_finished"]
