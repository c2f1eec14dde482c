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
from collections.abc import Sequence
from typing import Any, NoReturn

# gRPC's C core writes its own lines to stderr, past our log format (a plain-text "Got goaway" line was once seen in a
# coordinator's JSON log). Its errors are enough: set before anything imports grpc, unless the user chose a level.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from querycoord.cli.common import Parser, client_options, global_options, spread_global_options
from querycoord.settings.config_file import apply_layers
from querycoord.settings.logs import setup_logging

# The modules that add sub-commands, in the order `querycoord --help` lists them, with the command words each adds.
# A command's run imports only its own module: a short command (`status`) does not pay for the start-up of every
# other one (the checker, metatool, the tooling). tests/test_cli_start.py checks this table against the parser.
COMMAND_MODULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("servers", ("etcd", "coord", "querynode", "streamnode", "drill", "up", "demo")),
    ("collection", ("collection", "replicas")),
    ("describe_cmd", ("segments",)),
    ("tasks", ("balance", "tasks", "nodes")),
    ("balance_cmd", ("checkers",)),
    ("node_cmd", ("node",)),
    ("health_cmd", ("health", "explain")),
    ("status", ("status", "switchover")),
    ("config_cmd", ("config",)),
    ("stream_cmd", ("stream", "snode")),
    ("meta_cmd", ("meta",)),
    ("completion", ("completion",)),
)
MODULE_OF = {word: module for module, words in COMMAND_MODULES for word in words}
ALL_COMMANDS = ("completion",)  # its scripts complete every command: it needs the whole parser


def root_options() -> list[argparse.ArgumentParser]:
    """The options the root parser takes before the command word (``--address``, ``--log-level``...)."""
    return [client_options(False), global_options(False)]


def build_parser(command: str | None = None, *,
                 root: list[argparse.ArgumentParser] | None = None) -> argparse.ArgumentParser:
    """The ``querycoord`` parser: every command, or with ``command`` (a word of ``MODULE_OF``) only the module
    that adds it, which parses that command's arguments, and says its help and errors, the same. ``root``:
    ``root_options()`` when the caller has them already."""
    parser = Parser(prog="querycoord", description="etcd-backed query coordinator", parents=root or root_options())
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = [client_options(True)]
    only = MODULE_OF.get(command or "") if command not in ALL_COMMANDS else None
    for module, _ in COMMAND_MODULES:
        if only is None or module == only:
            _add_parsers(module, sub, client, parser)
    spread_global_options(parser)  # last: every sub-command, whoever added it, takes --log-level after its name
    return parser


def _add_parsers(module: str, sub: Any, client: list[argparse.ArgumentParser], root: argparse.ArgumentParser) -> None:
    """Import ``querycoord.cli.<module>`` and let it add its sub-commands (imported here, when a command needs them)."""
    if module == "servers":
        from querycoord.cli import servers
        servers.add_parsers(sub)
    elif module == "collection":
        from querycoord.cli import collection
        collection.add_parsers(sub, client)
    elif module == "describe_cmd":
        from querycoord.cli import describe_cmd
        describe_cmd.add_parsers(sub, client)  # segments
    elif module == "tasks":
        from querycoord.cli import tasks
        tasks.add_parsers(sub, client)
    elif module == "balance_cmd":
        from querycoord.cli import balance_cmd
        balance_cmd.add_parsers(sub, client)
    elif module == "node_cmd":
        from querycoord.cli import node_cmd
        node_cmd.add_parsers(sub, client)
    elif module == "health_cmd":
        from querycoord.cli import health_cmd
        health_cmd.add_parsers(sub, client)
    elif module == "status":
        from querycoord.cli import status
        status.add_parsers(sub, client)
    elif module == "config_cmd":
        from querycoord.cli import config_cmd
        config_cmd.add_parsers(sub, client)
    elif module == "stream_cmd":
        from querycoord.cli import stream_cmd
        stream_cmd.add_parsers(sub, client)
    elif module == "meta_cmd":
        from querycoord.cli import meta_cmd
        meta_cmd.add_parsers(sub)
    elif module == "completion":
        from querycoord.cli import completion
        completion.add_parsers(sub, root)
    else:
        raise ValueError(f"no command module {module!r}")


class _NoCommand(Exception):
    """``command_word`` could not tell the command: the whole parser parses, and says what was wrong."""


class _Probe(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _NoCommand(message)


def command_word(argv: list[str], root: list[argparse.ArgumentParser] | None = None) -> str | None:
    """The command ``argv`` runs, found the way the whole parser finds it (the same root options before it), or
    None when that is not plain (no command, an unknown word, a bad or unknown root option, ``-h`` or
    ``--version`` before it): then every command is registered, for the root's help and errors."""
    probe = _Probe(add_help=False, parents=root or root_options())
    probe.add_argument("command", nargs="?")
    probe.add_argument("rest", nargs=argparse.REMAINDER)
    try:
        args, unknown = probe.parse_known_args(argv)
    except _NoCommand:
        return None
    word = args.command
    return word if not unknown and word in MODULE_OF else None


class _Version(argparse._VersionAction):  # noqa: SLF001 - argparse's --version, whose help and output are kept
    """``--version``, reading the installed version only when asked (a metadata lookup every command would pay)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        self.version = f"querycoord {_version()}"
        super().__call__(parser, namespace, values, option_string)


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
        argv = sys.argv[1:] if argv is None else argv
        root = root_options()  # built once: the command word is found with the root's own options
        args = build_parser(command_word(argv, root), root=root).parse_args(argv)
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


__all__ = ["CLOSED_PIPE_EXIT", "COMMAND_MODULES", "MODULE_OF", "build_parser", "closed_pipe", "command_word", "main",
           "root_options"]
