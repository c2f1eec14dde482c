"""A stream protocol whose socket transport is freed by reference counting once its connection is lost.

Why: on Python 3.11 every asyncio socket transport refers to itself (its
``_read_ready_cb`` is one of its own bound methods: CPython gh-100348, fixed
in 3.12 by dropping it in ``close``, not backported). So a closed
connection's transport, its socket object and its address tuples (about
2 KiB) wait for the cyclic GC, and a coordinator runs that rarely: its
thresholds are raised (``querycoord.serving.process``), so what survives a young
collection waits for a generation-2 pass that practically never comes. Under
a flood of short HTTP connections (idle ones the head timeout or the
connection cap closes, probes, scrapes) the memory would grow by that much
per connection, without bound.

``UntyingProtocol`` drops the self-reference when the transport is done with
it (after ``connection_lost``: the transport has stopped reading for good).
Under TLS the socket transport is the one below the SSL protocol's; it is
remembered when the connection is made, as the upper one no longer knows it
once the connection is lost.
"""

from __future__ import annotations

import asyncio
from typing import Any

# The attribute of a selector socket transport that refers back to it (CPython's asyncio.selector_events).
_SELF_REFERENCE = "_read_ready_cb"


def socket_transport(transport: asyncio.BaseTransport) -> Any:
    """The selector transport that owns the socket under ``transport`` (itself for a plain connection, the one
    below the SSL protocol under TLS); None where there is none to find (another event loop)."""
    below = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    return below if below is not None else transport


def untie(transport: Any) -> None:
    """Drop the transport's reference to itself; for a transport whose connection is lost (it reads no more)."""
    if transport is not None and getattr(transport, _SELF_REFERENCE, None) is not None:
        setattr(transport, _SELF_REFERENCE, None)


class UntyingProtocol(asyncio.StreamReaderProtocol):
    """``asyncio.StreamReaderProtocol`` that unties its socket transport when the connection is lost."""

    _below: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._below = socket_transport(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            untie(self._below)
            self._below = None


__all__ = ["UntyingProtocol", "socket_transport", "untie"]
