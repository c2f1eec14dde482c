"""A pytest plugin (loaded by conftest.py): a test fails if it leaves an asyncio exception unretrieved.

Why: a background task that ends with an exception nobody awaits ends silently; asyncio only reports "Task
exception was never retrieved" when the task is garbage collected, often after the test (or the run) is over,
where nobody reads it. That is how the etcd space monitor's loop died unnoticed in a model-test run.

How: for each test, every call of an event loop's exception handler whose message says "never retrieved" (a task
or future whose exception nobody asked for) is recorded, whichever loop and handler; so is every error-level
loguru line that says it. At teardown, after the test's event loop is gone, ``gc.collect()`` makes tasks dropped
during the test report now rather than during a later test; anything recorded fails the test (an error at
teardown) with what was reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import pytest
from loguru import logger

MARK = "never retrieved"
_SHOWN = 3000  # characters of each report in the failure


def _describe(context: dict[str, Any]) -> str:
    exc = context.get("exception")
    parts = [str(context.get("message", ""))]
    if context.get("future") is not None:
        parts.append(f"future: {context['future']!r}"[:500])
    if exc is not None:
        parts.append(f"exception: {type(exc).__name__}: {exc}")
    return "\n".join(parts)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Moves every object alive now out of the collector's reach for good (see module docstring): the test items
    exist and no test has run."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def no_unretrieved_exceptions() -> Iterator[None]:
    """Autouse, so it is set up before the test's event loop and torn down after it (see module docstring)."""
    gc.collect()  # what earlier tests dropped reports now, before this test is watched
    found: list[str] = []
    original = asyncio.BaseEventLoop.call_exception_handler

    def recording(loop: asyncio.BaseEventLoop, context: dict[str, Any]) -> None:
        if MARK in str(context.get("message", "")):
            found.append(_describe(context))
        original(loop, context)

    asyncio.BaseEventLoop.call_exception_handler = recording  # type: ignore[method-assign]
    sink = logger.add(lambda message: found.append(str(message)), level="ERROR", format="{message}\n{exception}",
                      filter=lambda record: MARK in record["message"])
    try:
        yield
        gc.collect()
    finally:
        asyncio.BaseEventLoop.call_exception_handler = original  # type: ignore[method-assign]
        with contextlib.suppress(ValueError):  # a test that set up logging (``logger.remove()``) removed it
            logger.remove(sink)
    if found:
        shown = "\n---\n".join(text[:_SHOWN] for text in found)
        pytest.fail(f"{len(found)} asyncio exception(s) never retrieved during this test:\n{shown}", pytrace=False)
