"""The suite's guard against asyncio exceptions nobody retrieved (tests/unretrieved.py), run on a small suite of
its own in a subprocess: a test that leaks a failing task, or logs such a line, fails; a clean one passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

INNER = '''
import asyncio
import gc

from loguru import logger


async def test_leaks_a_failing_task():
    async def boom():
        raise RuntimeError("boom from a leaked task")

    asyncio.create_task(boom())  # nobody keeps it, nobody awaits it
    await asyncio.sleep(0.05)


def test_logs_a_never_retrieved_line():
    logger.error("Task exception was never retrieved (said by hand)")


def test_what_collection_made_is_frozen_out_of_the_collections():
    assert gc.get_freeze_count() > 0


async def test_awaits_what_it_starts():
    async def boom():
        raise RuntimeError("retrieved")

    task = asyncio.create_task(boom())
    await asyncio.wait({task})
    assert isinstance(task.exception(), RuntimeError)
'''


def test_the_guard_fails_a_test_that_leaves_an_exception_unretrieved(tmp_path: Path,
                                                                       subprocess_env: dict[str, str]) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.unretrieved", "-p", "no:cacheprovider", "-o",
         "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function", "-q", "-rE",
         str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=subprocess_env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "4 passed, 2 errors" in out, out
    assert "ERROR at teardown of test_leaks_a_failing_task" in out, out
    assert "RuntimeError: boom from a leaked task" in out, out
    assert "ERROR at teardown of test_logs_a_never_retrieved_line" in out, out
    assert "test_awaits_what_it_starts" not in out.split("short test summary")[-1], out
