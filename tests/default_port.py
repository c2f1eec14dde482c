"""One test at a time on etcd's default client port (127.0.0.1:2379).

``up`` starts its etcd there when the port is free, and readers of etcd
with no endpoints given try it, as etcdctl does. Two test workers using the
default at once would see each other's cluster; a test that starts ``up``
without an explicit etcd port, or runs a reader with no endpoints, holds
this lock for its whole run (an ``fcntl`` lock: released when the process
dies, so a killed test leaves no stale lock behind).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

DEFAULT_ETCD = "127.0.0.1:2379"
_LOCK = Path("/tmp/querycoord-tests-default-etcd-port.lock")


@contextmanager
def default_etcd_port() -> Iterator[str]:
    """Hold the default port for the block; yields its endpoint."""
    with _LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield DEFAULT_ETCD
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture
def default_etcd() -> Iterator[str]:
    """The default etcd endpoint, held for the test (see the module docstring)."""
    with default_etcd_port() as endpoint:
        yield endpoint
