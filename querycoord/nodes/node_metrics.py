"""What both nodes' metrics share: whether a node's session is up, as a gauge's value."""

from __future__ import annotations

from typing import Protocol

from meta.session import Session


class SessionHolder(Protocol):
    """A node as the gauge reads it: its session (RuntimeError before start)."""

    @property
    def session(self) -> Session: ...


def session_up(node: SessionHolder) -> int:
    """1 while the node's session is registered and alive (a metric's value)."""
    try:
        session = node.session
    except RuntimeError:
        return 0
    return 1 if session.info is not None and not session.lost.is_set() else 0


__all__ = ["SessionHolder", "session_up"]
