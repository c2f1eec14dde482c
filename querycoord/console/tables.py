"""Whether tables are drawn with their header lines: on by default, off under ``--no-headers`` (as kubectl).

One switch read by ``draw.table``, so every table of every command follows it without each renderer taking a
flag. A context variable rather than a global: the switch holds for the code ``headers`` wraps and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_SHOWN: ContextVar[bool] = ContextVar("table_headers_shown", default=True)


def headers_shown() -> bool:
    """Whether ``draw.table`` draws its header and rule lines here."""
    return _SHOWN.get()


@contextmanager
def headers(shown: bool) -> Iterator[None]:
    """Tables drawn inside the block have their header lines (``shown``) or not."""
    token = _SHOWN.set(shown)
    try:
        yield
    finally:
        _SHOWN.reset(token)
