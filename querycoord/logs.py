"""One place that configures logging for every querycoord process.

Everything goes to loguru on stderr; records of the standard ``logging``
module (the etcd client library behind ``meta``, grpc, and any module that
uses it) are forwarded to loguru so that nothing is silently dropped.
"""

from __future__ import annotations

import logging
import os
import sys

from loguru import logger


class _ToLoguru(logging.Handler):
    """Forward a standard-library record to loguru with its level and origin."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).bind(name=record.name).log(level, record.getMessage())


def setup_logging(level: str | None = None) -> None:
    """Log to stderr at ``level`` (default ``$QUERYCOORD_LOG_LEVEL`` or INFO)."""
    chosen = (level or os.environ.get("QUERYCOORD_LOG_LEVEL", "INFO")).upper()
    logger.remove()
    logger.add(
        sys.stderr,
        level=chosen,
        format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> <cyan>{name}</cyan> {message}",
    )
    logging.basicConfig(handlers=[_ToLoguru()], level=chosen, force=True)
