"""One place that configures logging for every querycoord process.

Everything goes to loguru on stderr; records of the standard ``logging``
module (the etcd client library behind ``meta``, grpc, and any module that
uses it) are forwarded to loguru so that nothing is silently dropped, and so are Python's own warnings and the
exceptions it can only ignore or that end the process (in the json format, every line is an object).

Two formats: ``text`` (the default: for a person at a terminal) and ``json``
(one object per line, for a log pipeline): time, level, component (the
module that logged), message, and the ids the code bound where it logged
(``node``, ``task``, ``collection``, ``fence_revision``...), so lines can be
filtered by id without parsing messages. ``meta`` is a library and is
silent until an application turns its logs on; ``setup_logging`` does.
A traceback never shows local values (every sink has loguru's ``diagnose``
and ``backtrace`` off): a secret held in a variable stays out of the log.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import traceback
from collections.abc import Container
from typing import TYPE_CHECKING, Any, TextIO

from meta.log import logger, when_loguru_loaded

if TYPE_CHECKING:
    from loguru import Logger, Message, Record

FORMATS = ("text", "json")
DEFAULT_FORMAT = "text"
DEFAULT_LEVEL = "INFO"
LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
# loguru's numbers of its levels (fixed by loguru), known without loading it.
LEVEL_NUMBERS = {"TRACE": 5, "DEBUG": 10, "INFO": 20, "SUCCESS": 25, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
TEXT_FORMAT = "<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> <cyan>{name}</cyan> {message}"
# Every sink is added with ``diagnose=False, backtrace=False``: loguru's defaults print the value of the variables
# of every frame of a traceback, so a token, a password or a key held in a local would be in the log.
# The format of the last setup_logging call: a later call that only changes the level (a drill) keeps it.
_current_format = DEFAULT_FORMAT


class _ToLoguru(logging.Handler):
    """Forward a standard-library record to loguru with its level and origin."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).bind(component=record.name).log(level, record.getMessage())


def json_line(record: Record) -> str:
    """One log record as one JSON object (no newline); bound ids follow the fixed fields and never replace them."""
    extra = dict(record["extra"])
    entry: dict[str, Any] = {
        "time": record["time"].astimezone(dt.UTC).isoformat(timespec="milliseconds"),
        "level": record["level"].name,
        "component": extra.pop("component", None) or record["name"],
        "message": record["message"],
    }
    for key, value in extra.items():
        entry.setdefault(key, value)
    exc = record["exception"]
    if exc is not None and exc.type is not None:
        entry.setdefault("exception", "".join(traceback.format_exception(exc.type, exc.value, exc.traceback)))
    return json.dumps(entry, default=str)


def _json_sink(stream: TextIO) -> Any:
    def write(message: Message) -> None:
        stream.write(json_line(message.record) + "\n")
        stream.flush()

    return write


def _unraisable(info: Any) -> None:
    """An exception Python can only ignore (raised in ``__del__``, a finalizer, a callback of the collector) as a
    log record, so a JSON log stays JSON: Python's default hook writes it to stderr as plain text."""
    exc = (info.exc_type, info.exc_value, info.exc_traceback) if info.exc_type is not None else None
    logger.opt(exception=exc).bind(component="python").error("{} {!r}", info.err_msg or "Exception ignored in",
                                                              info.object)


def _uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """An exception that ends the process, as a log record (see ``_unraisable``)."""
    logger.opt(exception=(exc_type, exc, tb)).bind(component="python").critical("uncaught {}", exc_type.__name__)


def add_log_options(p: argparse.ArgumentParser, *, suppress: bool = False, skip: Container[str] = ()) -> None:
    """``--log-level`` and ``--log-format`` (but those in ``skip``); ``suppress`` on a sub-command, so a value given
    before it is kept."""
    default = argparse.SUPPRESS if suppress else None
    if "--log-level" not in skip:
        p.add_argument("--log-level", default=default, type=str.upper, metavar="LEVEL",
                       help=f"DEBUG, INFO, WARNING... ($QUERYCOORD_LOG_LEVEL, [log] level; default {DEFAULT_LEVEL})")
    if "--log-format" not in skip:
        p.add_argument("--log-format", default=default, choices=FORMATS,
                       help="text (for a terminal) or json (one object per line) ($QUERYCOORD_LOG_FORMAT, "
                            f"[log] format; default {DEFAULT_FORMAT})")


def setup_logging(level: str | None = None, fmt: str | None = None) -> None:
    """Log to stderr at ``level`` (default ``$QUERYCOORD_LOG_LEVEL`` or INFO) in ``fmt`` (default
    ``$QUERYCOORD_LOG_FORMAT``, else the format set last, else text); ``ValueError`` names a bad value."""
    global _current_format
    chosen = (level or os.environ.get("QUERYCOORD_LOG_LEVEL") or DEFAULT_LEVEL).upper()
    form = (fmt or os.environ.get("QUERYCOORD_LOG_FORMAT") or _current_format).lower()
    if chosen not in LEVELS:
        raise ValueError(f"--log-level: unknown log level {chosen!r} (one of {', '.join(LEVELS)})")
    if form not in FORMATS:
        raise ValueError(f"--log-format: unknown log format {form!r} (text or json)")

    def configure(real: Logger) -> None:
        real.remove()
        if form == "json":
            real.add(_json_sink(sys.stderr), level=chosen, format="{message}", diagnose=False, backtrace=False)
        else:
            real.add(sys.stderr, level=chosen, format=TEXT_FORMAT, diagnose=False, backtrace=False)
        real.enable("meta")

    # The sink is set up when loguru is loaded: at once in a process that has it already, else at the first record
    # (a command that logs nothing never loads it; ``meta.log``).
    when_loguru_loaded(configure)
    _current_format = form
    # The standard library knows no TRACE or SUCCESS: it gets loguru's number of the level.
    logging.basicConfig(handlers=[_ToLoguru()], level=LEVEL_NUMBERS[chosen], force=True)
    # What Python itself writes to stderr goes through the same sink: warnings, ignored and uncaught exceptions.
    logging.captureWarnings(True)
    sys.unraisablehook = _unraisable
    sys.excepthook = _uncaught


__all__ = ["DEFAULT_FORMAT", "DEFAULT_LEVEL", "FORMATS", "LEVELS", "add_log_options", "json_line", "setup_logging"]
