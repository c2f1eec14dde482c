"""Logs: the json format and its ids, text as the default, and ``meta`` quiet as a library.

The ids are checked where the code binds them: a real load on an in-process
cluster (scheduler and coordinator), and real ``querycoord coord`` /
``querynode`` processes started with ``--log-format json`` after the
sub-command.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from meta.ops.child import child_env
from meta.ops.etcd_server import EtcdCluster
from querycoord.nodes.querynode import FaultConfig
from querycoord.settings.logs import json_line, setup_logging
from tests.cluster import running_cluster
from tests.spawn import spawn_coordinator, spawn_query_node

FIELDS = {"time", "level", "component", "message"}


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``setup_logging`` replaces loguru's sinks and remembers its format: put text and pytest's default sink back
    after the test."""
    monkeypatch.delenv("QUERYCOORD_LOG_FORMAT", raising=False)
    monkeypatch.delenv("QUERYCOORD_LOG_LEVEL", raising=False)
    yield
    setup_logging("DEBUG", "text")
    logger.remove()
    logger.add(sys.stderr)


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line must be one JSON object: a line that is not fails the test here, naming the line."""
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"not a JSON line: {line[:300]!r}") from None
    return out


def test_json_format_one_object_per_line_with_ids(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "json")
    logger.bind(task=12, collection=7).info("loading {} segments", 3)
    with logger.contextualize(node=4, fence_revision=99):
        logger.warning("held {}", "x")
    logger.debug("not shown at INFO")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("it failed")
    logging.getLogger("grpc._test").warning("from the standard library")
    lines = json_lines(capsys.readouterr().err)
    assert len(lines) == 4, lines
    first, second, third, fourth = lines
    assert FIELDS <= first.keys()
    assert (first["level"], first["message"], first["task"], first["collection"]) == ("INFO", "loading 3 segments",
                                                                                       12, 7)
    assert first["component"] == __name__ and first["time"].endswith("+00:00")
    assert (second["node"], second["fence_revision"], second["level"]) == (4, 99, "WARNING")
    assert "node" not in third and "RuntimeError: boom" in third["exception"]
    assert (fourth["component"], fourth["message"]) == ("grpc._test", "from the standard library")


def test_text_stays_the_default(restore_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO")
    logger.info("plain words")
    err = capsys.readouterr().err
    assert "plain words" in err and not err.lstrip().startswith("{")


def test_bad_level_or_format_is_a_value_error(restore_logging: None) -> None:
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        setup_logging("loud")
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        setup_logging("INFO", "xml")


_LIBRARY_USE = """
import asyncio, sys
from loguru import logger
from meta.client import connect
from meta.config import EtcdConfig
if sys.argv[2] == "app":
    from querycoord.settings.logs import setup_logging
    setup_logging("INFO")
async def main():
    client = await connect(EtcdConfig(endpoints=(sys.argv[1],), user="someone", password="pw"))
    await client.close()
asyncio.run(main())
"""


async def run_python(code: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, *args, env=child_env(),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, err.decode()


async def test_meta_is_quiet_as_a_library_until_the_application_turns_it_on(etcd: EtcdCluster) -> None:
    """``meta.client`` logs an INFO line when credentials meet an etcd with auth off: a library user's
    loguru (default sink on stderr) does not see it; an application that called setup_logging does."""
    code, err = await run_python(_LIBRARY_USE, etcd.endpoints[0], "library")
    assert code == 0, err
    assert "authentication disabled" not in err
    code, err = await run_python(_LIBRARY_USE, etcd.endpoints[0], "app")
    assert code == 0, err
    assert "authentication disabled" in err


async def test_scheduler_and_coordinator_bind_task_collection_and_fence(etcd: EtcdCluster, root_path: str) -> None:
    """A node that refuses every load makes the scheduler log retries and reschedules: each such line names the
    trigger (``task``), its collection, the child and its node, and the leader's fence revision."""
    broken = FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"LoadSegments"}))
    records: list[dict[str, Any]] = []
    sink = logger.add(lambda m: records.append(json.loads(json_line(m.record))), level="DEBUG")
    try:
        async with running_cluster(etcd, root_path, [broken, None]) as c:
            lead = (await c.wait_leader()).coord.leadership
            assert lead is not None
            cid = await c.create_collection("logs", partitions=2, segments=20)
            reply = await c.load_collection(cid)
            broken_id = c.nodes[0].node_id
    finally:
        logger.remove(sink)
    revision = lead.fence.revision
    assert any(r.get("fence_revision") == revision and "leads with fence" in r["message"] for r in records)
    retries = [r for r in records if "attempt" in r["message"] and "failed" in r["message"]]
    # Every retry line names its trigger, child, node and the fence; the checker may repair with triggers of its
    # own meanwhile (no collection of their own): the load's lines also name its collection.
    ours = [r for r in retries if r.get("task") == reply.task_id]
    assert ours, [r["message"] for r in records]
    for r in retries:
        assert (r["node"], r["fence_revision"]) == (broken_id, revision) and f"task {r['child']} " in r["message"], r
    for r in ours:
        assert r["collection"] == cid, r


async def test_processes_log_json_with_their_ids(etcd: EtcdCluster, root_path: str, tmp_path: Path) -> None:
    """``--log-format json`` after the sub-command: every line of the coordinator's and the node's log is JSON;
    the coordinator's carry its fence revision once it leads, the node's its node id once it is registered."""
    coord = await spawn_coordinator(etcd, root_path, tmp_path, "--log-format", "json", log_level="INFO")
    node = None
    try:
        await coord.wait_event("leader", 60)
        node = await spawn_query_node(etcd, root_path, tmp_path, "--ttl", "2", "--log-format", "json")
    finally:
        if node is not None:
            await node.stop()
        await coord.stop()
    coord_lines = json_lines((tmp_path / "coord.log").read_text())
    leads = [r for r in coord_lines if "leads with fence" in r["message"]]
    assert leads and all(FIELDS <= r.keys() for r in coord_lines)
    assert isinstance(leads[0]["fence_revision"], int) and leads[0]["fence_revision"] > 0
    node_lines = json_lines((tmp_path / "querynode.log").read_text())
    assert any(r.get("node") == node.node_id and "started" in r["message"] for r in node_lines), node_lines


_PYTHON_OWN = """
import gc, sys, warnings
from querycoord.settings.logs import setup_logging
setup_logging("INFO", "json")
warnings.warn("a deprecated call", DeprecationWarning, stacklevel=1)
class Broken:
    def __del__(self):
        raise RuntimeError("in a finalizer")
Broken()
gc.collect()
raise ValueError("the end")
"""


async def test_what_python_writes_itself_is_json_too() -> None:
    """A warning, an exception raised in a finalizer and an uncaught one: Python writes each to stderr as plain
    text unless the logging setup routes it; in the json format every line must stay one JSON object."""
    code, err = await run_python(_PYTHON_OWN)
    assert code == 1
    lines = json_lines(err)
    messages = " | ".join(r["message"] for r in lines)
    assert "a deprecated call" in messages and "Exception ignored" in messages, messages
    assert any("RuntimeError: in a finalizer" in r.get("exception", "") for r in lines), lines
    assert any(r["level"] == "CRITICAL" and "ValueError: the end" in r.get("exception", "") for r in lines), lines


def _refuse(token: str) -> None:
    raise RuntimeError("the call failed")


def _fails_holding_a_secret() -> None:
    secret_token = "tok-" + "7f3a9c" * 4  # a local that a traceback with diagnose shows on the failing line
    _refuse(secret_token)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_traceback_never_prints_local_values(restore_logging: None, capsys: pytest.CaptureFixture[str],
                                               fmt: str) -> None:
    """loguru's defaults (diagnose, backtrace) annotate every frame of a traceback with its variables' values: a
    token or password held in a local would be written to the log."""
    setup_logging("INFO", fmt)
    try:
        _fails_holding_a_secret()
    except RuntimeError:
        logger.exception("it failed")
    err = capsys.readouterr().err
    assert "RuntimeError: the call failed" in err and "_fails_holding_a_secret" in err
    assert "7f3a9c" not in err, err


def test_every_sink_of_the_package_is_added_without_local_values(project_root: Path) -> None:
    """Every ``logger.add`` in the package turns loguru's ``diagnose`` and ``backtrace`` off."""
    import re

    calls = {path: re.findall(r"logger\.add\(((?:[^()]|\([^()]*\))*)\)", path.read_text())
             for path in (project_root / "querycoord").rglob("*.py")}
    found = {path: lines for path, lines in calls.items() if lines}
    assert found, "no logger.add in the package?"
    for path, lines in found.items():
        assert all("diagnose=False" in call and "backtrace=False" in call for call in lines), (path, lines)
