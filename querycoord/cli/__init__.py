"""The ``querycoord`` command line.

Server commands (``cli/servers.py``): ``etcd`` (embedded etcd), ``coord``
(one coordinator), ``querynode`` / ``streamnode`` (reference nodes), ``up``
(the all-in-one cluster), ``demo``, ``drill``. Client commands talk to the
coordinators named by ``--address`` (any of them: the client follows the
leader): ``collection create|load|release|show`` (``cli/collection.py``),
``balance``, ``tasks``, ``nodes`` (``cli/tasks.py``). Each module adds its
own sub-commands; ``cli/common.py`` holds what the client commands share.
"""

from __future__ import annotations

import argparse

from querycoord.cli import collection, servers, tasks
from querycoord.cli.common import client_options
from querycoord.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="querycoord", description="etcd-backed query coordinator",
                                     parents=[client_options(False)])
    parser.add_argument("--log-level", default=None,
                        help="DEBUG, INFO, WARNING (default $QUERYCOORD_LOG_LEVEL or INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = [client_options(True)]
    servers.add_parsers(sub)
    collection.add_parsers(sub, client)
    tasks.add_parsers(sub, client)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return int(args.func(args))


__all__ = ["build_parser", "main"]
