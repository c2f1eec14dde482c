"""Shared fixtures: one real etcd for the whole session, a fresh root path per test.

Tests never replace etcd: isolation comes from a unique root path, so tests
can share one member without seeing each other's keys. Every test fails if it
leaves an asyncio exception unretrieved (``tests/unretrieved.py``).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from loguru import logger

from meta.client import EtcdClient, connect
from meta.kv import MetaKV
from meta.ops.etcd_server import EtcdCluster
from querycoord.stream.store import StreamStore
from tests.certs import CertFiles, make_certs
from tests.default_port import default_etcd  # noqa: F401  (fixture: tests using etcd's default port)
from tests.streams import fenced_store
from tests.unretrieved import (  # noqa: F401  (an autouse fixture and a hook: see tests/unretrieved.py)
    no_unretrieved_exceptions,
    pytest_collection_finish,
)

# The tests are meta's application: they read its logs (as a library it is silent until enabled).
logger.enable("meta")


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdCluster]:
    """A single etcd member on free loopback ports, shared by the session.

    Its data dir is not under pytest's numbered temp dirs: another pytest run
    on the machine prunes old ones, and deleting a live member's data dir
    kills it (seen when several suites ran at once).
    """
    data_dir = Path(tempfile.mkdtemp(prefix="querycoord-test-etcd-"))
    cluster = EtcdCluster(data_dir, size=1)
    cluster.start()
    yield cluster
    cluster.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def on_etcd(etcd: EtcdCluster) -> Iterator[tuple[asyncio.AbstractEventLoop, EtcdClient]]:
    """One loop and client for every example of a hypothesis test (it runs its examples inside one test call,
    outside pytest-asyncio's loop)."""
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(connect(etcd.config()))
    yield loop, client
    loop.run_until_complete(client.close())
    loop.close()


@pytest.fixture
def root_path(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:60]
    return f"test/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def client(etcd: EtcdCluster) -> AsyncIterator[EtcdClient]:
    c = await connect(etcd.config())
    yield c
    await c.close()


@pytest.fixture
async def kv(client: EtcdClient, root_path: str) -> MetaKV:
    return MetaKV(client, root_path)


@pytest.fixture
def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture
def subprocess_env(project_root: Path) -> dict[str, str]:
    """Environment for child Python processes started by tests (unbuffered, project importable), without the
    variables a developer's shell may hold that would point a command at another etcd or root (a test that wants
    one sets it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ETCDCTL_ENDPOINTS", "QUERYCOORD_ROOT")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(project_root) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """pytest's ``caplog`` that also holds what loguru logs (the project logs through loguru), at or above the
    level ``caplog.set_level`` gave its handler."""
    sink = logger.add(caplog.handler, format="{message}", level=0,
                      filter=lambda record: record["level"].no >= caplog.handler.level)
    yield caplog
    logger.remove(sink)


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """What the project logs through loguru at INFO and above while the test runs, as "LEVEL message" lines."""
    lines: list[str] = []
    sink = logger.add(lambda msg: lines.append(str(msg)), level="INFO", format="{level} {message}")
    yield lines
    logger.remove(sink)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A CA, an etcd server pair (SAN localhost and 127.0.0.1) and a client pair, made once per run."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
async def store(kv: MetaKV) -> StreamStore:
    """The stream tests' store: the leader's, every write fenced (``tests.streams.fenced_store``). A module whose
    tests mean another store (the catalog's, a differently seeded one) defines its own ``store``."""
    return await fenced_store(kv)
