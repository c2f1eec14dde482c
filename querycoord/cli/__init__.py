"""The ``querycoord`` command line.

Server commands (``cli/servers.py``): ``etcd`` (embedded etcd), ``coord``
(one coordinator), ``querynode`` / ``streamnode`` (reference nodes), ``up``
(the all-in-one cluster, ``cli/up_cmd.py``), ``demo``, ``drill``. Client commands talk to the
coordinators named by ``--address`` (any of them: the client follows the
leader): ``collection create|load|release|drop|show`` and ``replicas`` (``cli/collection.py``), ``collection describe``
and ``segments`` (``cli/describe_cmd.py``),
``stream create|show|stop|start|drop`` and ``snode create|drop|show``
(``cli/stream_cmd.py``), ``balance``, ``tasks``, ``nodes`` (``cli/tasks.py``), ``balance pause|resume|status`` and
``checkers list|activate|deactivate`` (``cli/balance_cmd.py``), ``node cordon|uncordon|drain`` (``cli/node_cmd.py``),
``health`` and
``explain`` (``cli/health_cmd.py``), ``status`` (from etcd)
and ``switchover`` (``cli/status.py``); ``completion`` prints a shell
completion script (``cli/completion.py``). Each module adds its own
sub-commands; ``cli/common.py`` holds what the commands share: the global
options (taken before or after the sub-command), the client options,
``-o json``, argument checks and one-line errors.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from querycoord.cli import (
    balance_cmd,
    collection,
    completion,
    config_cmd,
    describe_cmd,
    health_cmd,
    meta_cmd,
    node_cmd,
    servers,
    status,
    stream_cmd,
    tasks,
)
from querycoord.cli.common import Parser, client_options, global_options, spread_global_options
from querycoord.settings.config_file import apply_layers
from querycoord.settings.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="querycoord", description="etcd-backed query coordinator",
                    parents=[client_options(False), global_options(False)])
    parser.add_argument("--version", action="version", version=f"querycoord {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = [client_options(True)]
    servers.add_parsers(sub)
    collection.add_parsers(sub, client)
    describe_cmd.add_parsers(sub, client)  # segments
    tasks.add_parsers(sub, client)
    balance_cmd.add_parsers(sub, client)
    node_cmd.add_parsers(sub, client)
    health_cmd.add_parsers(sub, client)
    status.add_parsers(sub, client)
    config_cmd.add_parsers(sub, client)
    stream_cmd.add_parsers(sub, client)
    meta_cmd.add_parsers(sub)
    completion.add_parsers(sub, parser)
    spread_global_options(parser)  # last: every sub-command, whoever added it, takes --log-level after its name
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("querycoord")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


# Exit code of a command whose stdout was closed by its reader (`| head`): 128 + SIGPIPE, as a shell reports a
# Unix tool that SIGPIPE ended.
CLOSED_PIPE_EXIT = 141


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C ends every command, however it was started: a shell starts a background job (`cmd &` in a script)
    # with SIGINT ignored, and Python then leaves it ignored; etcd and kubectl (Go) take it back the same way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args = build_parser().parse_args(argv)
        try:
            apply_layers(args)  # options not given as flags: from QUERYCOORD_* variables, then the --config file
            setup_logging(args.log_level, args.log_format)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a closed pipe must reach the handler below
        return code
    except BrokenPipeError:
        return closed_pipe()


def closed_pipe() -> int:
    """End quietly once stdout's reader is gone (Python's documented recipe): what is left in stdout's buffer
    would fail again at exit, so stdout is pointed at /dev/null first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (replaced, closed): nothing left to flush there
        pass
    return CLOSED_PIPE_EXIT


__all__ = ["CLOSED_PIPE_EXIT", "build_parser", "closed_pipe", "main"]
