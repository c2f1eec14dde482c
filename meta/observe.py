"""Hooks through which an application observes the meta layer (metrics), without meta knowing of it.

``meta`` must not depend on ``querycoord`` nor on a metrics library: it calls
these module-level functions at the few places worth counting, and an
application replaces them with ``set_observers`` (querycoord.common.metrics does).
The defaults do nothing, so meta used as a library costs one call per etcd
request. Observers run inline on the event loop: they must be quick and must
not raise.
"""

from __future__ import annotations

from collections.abc import Callable


def _ignore(*_args: object) -> None:
    return None


# (operation, seconds): one etcd call through ``EtcdClient.call``, retries included, whatever its outcome.
etcd_call: Callable[[str, float], None] = _ignore
# (operation,): one more attempt of an etcd call after a transient failure.
etcd_retry: Callable[[str], None] = _ignore
# (operation,): an etcd call gave up with ``MetaUnavailable``.
etcd_unavailable: Callable[[str], None] = _ignore
# (): etcd refused a fenced write because the fence is gone (``NotLeader``).
fenced_write_refused: Callable[[], None] = _ignore
# (loop,): a background loop met an exception and goes on (``meta.loops``); the application's loops report too.
loop_error: Callable[[str], None] = _ignore


def set_observers(
    *,
    on_etcd_call: Callable[[str, float], None] | None = None,
    on_etcd_retry: Callable[[str], None] | None = None,
    on_etcd_unavailable: Callable[[str], None] | None = None,
    on_fenced_write_refused: Callable[[], None] | None = None,
    on_loop_error: Callable[[str], None] | None = None,
) -> None:
    """Install the given observers (None: keep the current one)."""
    global etcd_call, etcd_retry, etcd_unavailable, fenced_write_refused, loop_error
    if on_etcd_call is not None:
        etcd_call = on_etcd_call
    if on_etcd_retry is not None:
        etcd_retry = on_etcd_retry
    if on_etcd_unavailable is not None:
        etcd_unavailable = on_etcd_unavailable
    if on_fenced_write_refused is not None:
        fenced_write_refused = on_fenced_write_refused
    if on_loop_error is not None:
        loop_error = on_loop_error


def reset_observers() -> None:
    """Back to the no-op defaults (tests)."""
    global etcd_call, etcd_retry, etcd_unavailable, fenced_write_refused, loop_error
    etcd_call = etcd_retry = etcd_unavailable = fenced_write_refused = loop_error = _ignore


__all__ = ["etcd_call", "etcd_retry", "etcd_unavailable", "fenced_write_refused", "loop_error", "reset_observers",
           "set_observers"]
