"""``--watch`` (``-w``) on show and list commands: the command again every ``--interval`` seconds until Ctrl-C.

One wrapper for every command that takes it (``client_command`` runs it), as ``watch(1)`` or ``kubectl get -w``:
on a terminal each frame replaces the last (the screen is cleared, a header line says what runs and when); in a
pipe or a file each frame follows the last after a blank line and the same header, so a log of it reads back.
With ``-o json`` the frames are a stream of JSON documents (no header: ``jq`` reads them one by one); with ``-o
yaml`` each frame is a YAML document whose ``---`` line carries the time. Ctrl-C ends it quietly with exit 0:
watching is a read, nothing is left half done. A frame that fails (the leader changes, etcd is slow) prints its
one error line and the next frame tries again; only a failing first frame ends the command, as it would without
``--watch`` (an unknown collection stays unknown).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import redirect_stdout

from querycoord.settings.setting_rules import Rule, flag_type

DEFAULT_INTERVAL = 2.0
_interval = flag_type(float, Rule(0.1, 86400))
CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen


def add_watch_option(p: argparse.ArgumentParser) -> None:
    """``-w/--watch`` and ``--interval SECONDS`` on a show or list command (a read: repeating it is harmless)."""
    p.add_argument("-w", "--watch", action="store_true",
                   help="show it again every --interval seconds until Ctrl-C (on a terminal, in place)")
    p.add_argument("--interval", type=_interval, default=DEFAULT_INTERVAL, metavar="SECONDS",
                   help=f"seconds between two frames of --watch (default {DEFAULT_INTERVAL:g}; at least 0.1)")


def watching(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "watch", False))


def frame_header(args: argparse.Namespace, now: float) -> str | None:
    """The line above a frame: ``Every 2s: querycoord nodes    2025-01-31 12:00:00``; None for JSON frames."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    output = getattr(args, "output", "table")
    if output == "json":
        return None
    if output == "yaml":
        return f"--- # {stamp}"
    command = " ".join(["querycoord", *sys.argv[1:]])
    return f"Every {args.interval:g}s: {command}    {stamp}"


async def watch(run: Callable[[], Awaitable[int]], args: argparse.Namespace) -> int:
    """Run ``run`` (one frame) every ``args.interval`` seconds, forever; the caller turns Ctrl-C into exit 0.

    A frame is drawn whole once it is complete (its output is collected first): the screen never shows half a
    frame, and a first frame that fails prints nothing but its error."""
    import grpc  # here, not at the top: registering ``--watch`` is part of every command's start-up

    from querycoord.console.actions import Refusal
    from querycoord.net.client import CoordinatorUnavailable

    tty = sys.stdout.isatty()
    output = getattr(args, "output", "table")
    first = True
    while True:
        started = time.time()
        text = io.StringIO()
        try:
            with redirect_stdout(text):
                await run()
        except (Refusal, CoordinatorUnavailable, grpc.aio.AioRpcError) as exc:
            if first:
                raise
            print(f"error: {_reason(exc)} (trying again in {args.interval:g}s)", file=sys.stderr)
        else:
            header = frame_header(args, started)
            if tty and output != "json":
                sys.stdout.write(CLEAR)
            elif not first:
                sys.stdout.write("\n")
            if header is not None:
                sys.stdout.write(header + ("\n" if output == "yaml" else "\n\n"))
            sys.stdout.write(text.getvalue())
            sys.stdout.flush()
            first = False
        await asyncio.sleep(args.interval)


def _reason(exc: Exception) -> str:
    import grpc

    from querycoord.console.actions import Refusal
    from querycoord.net.client import CoordinatorUnavailable

    if isinstance(exc, Refusal):
        return exc.reason
    if isinstance(exc, CoordinatorUnavailable):
        return exc.summary()
    assert isinstance(exc, grpc.aio.AioRpcError)
    return f"{exc.code().name}: {exc.details()}"
