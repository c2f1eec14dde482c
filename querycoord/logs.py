"""One place that configures loguru for every querycoord process."""

from __future__ import annotations

import os
import sys

from loguru import logger


def setup_logging(level: str | None = None) -> None:
    """Log to stderr at ``level`` (default ``$QUERYCOORD_LOG_LEVEL`` or INFO)."""
    logger.remove()
    logger.add(
        sys.stderr,
        level=(level or os.environ.get("QUERYCOORD_LOG_LEVEL", "INFO")).upper(),
        format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> <cyan>{name}</cyan> {message}",
    )
