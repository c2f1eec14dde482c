"""What the commands share: the global options, the client options, ``-o json``, argument checks, error messages.

A client command that is refused prints ``error: <reason>`` (the Status
reason, which says what was wrong) and exits 1; an unreachable coordinator
is reported with what each address answered (nothing listens, no leader yet,
not a coordinator...). Bad arguments are one ``error: ...`` line naming the
option and exit 2. Never a traceback: a refused request is an answer, not a
crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

from meta.address import MAX_PORT, address_problem
from querycoord.cli.etcd_read import add_root_option
from querycoord.cli.watch import watch, watching
from querycoord.console.tables import headers
from querycoord.settings.config_file import add_config_option
from querycoord.settings.etcd_options import add_etcd_options
from querycoord.settings.logs import add_log_options
from querycoord.settings.security_options import add_security_options, configure_from_args
from querycoord.settings.setting_rules import INT64_MAX, Rule, flag_type

if TYPE_CHECKING:
    from querycoord.net.client import QueryCoordClient

DEFAULT_ADDRESS = "127.0.0.1:19531"
OUTPUTS = ("table", "wide", "json", "yaml")
STRUCTURED = ("json", "yaml")  # one document of the data, the same in both

ClientFn = Callable[["QueryCoordClient", argparse.Namespace], Awaitable[int]]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one ``error: ...`` line (and exit 2), as every other error.

    Sub-command parsers are of the same class (argparse makes them so), so
    every command of ``querycoord`` answers a bad option alike.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see `{self.prog} --help`)\n")


# ----- global options: accepted before and after the sub-command ------------------------------------------------------
def global_options(suppress: bool) -> argparse.ArgumentParser:
    """Options of every command (``--log-level``; add new ones here), declared on the root parser with their
    defaults and on every sub-command with SUPPRESS defaults (``spread_global_options``), so a value given
    before the sub-command is not overwritten by the sub-command's default."""
    p = argparse.ArgumentParser(add_help=False)
    d = argparse.SUPPRESS
    p.add_argument("--log-level", default=d if suppress else None, type=str.upper,
                   choices=("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"),
                   metavar="LEVEL", help="DEBUG, INFO, WARNING, ERROR (default $QUERYCOORD_LOG_LEVEL or INFO)")
    add_log_options(p, suppress=suppress, skip=("--log-level",))  # --log-format
    add_config_option(p, suppress=suppress)
    add_security_options(p, suppress=suppress)  # gRPC TLS and authentication: every server and client alike
    return p


def spread_global_options(parser: argparse.ArgumentParser) -> None:
    """Give every sub-command of ``parser``, at any depth, the global options (those it does not declare itself).

    argparse has no public way to list a parser's sub-parsers or to add an existing action to another parser: the
    private members below are argparse's own, the same since Python 3.2."""
    for action in parser._actions:  # noqa: SLF001 - argparse lists actions only here
        if not isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - argparse's sub-command action class
            continue
        for sub in set(action.choices.values()):
            template = global_options(True)
            for opt in template._actions:  # noqa: SLF001 - argparse lists actions only here
                if not any(s in sub._option_string_actions for s in opt.option_strings):  # noqa: SLF001 - its index
                    sub._add_action(opt)  # noqa: SLF001 - add_argument cannot take an existing action
            spread_global_options(sub)


# ----- argument checks (argparse ``type=``): a bad value is a usage error naming the option -------------------------
# The same rules as every configured value (``setting_rules``): a number is finite, then within its bounds.
positive_float = flag_type(float, Rule(0, above=True))
non_negative_float = flag_type(float, Rule(0))
positive_int = flag_type(int, Rule(1, INT64_MAX))
non_negative_int = flag_type(int, Rule(0, INT64_MAX))


def at_least(minimum: float, maximum: float | None = None) -> Callable[[str], float]:
    """A ``type=`` for a finite float from ``minimum`` to ``maximum`` (e.g. a session TTL)."""
    return flag_type(float, Rule(minimum, maximum))


def name_or_id(text: str) -> str:
    """A ``type=`` for a collection named by name or by id (``console.actions.describe`` resolves it)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("needs a collection name or id")
    return text.strip()


def host_port(text: str) -> str:
    """A ``type=`` for HOST:PORT with a port from 0 to 65535 (0: any free port)."""
    problem = address_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def coordinator_addresses(text: str) -> str:
    """A ``type=`` for ``--address``: comma-separated HOST:PORT items, each with a port from 1 to 65535 (a
    client dials a port; none is "any free port"). A bad item is a usage error at once, not a wait."""
    items = [item.strip() for item in text.split(",")]
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host.strip("[]") or not (port.isascii() and port.isdigit()):
            what = f"{item!r} is not HOST:PORT"
        elif not 0 < int(port) <= MAX_PORT:
            what = f"{item!r}: port {port} is out of range (1 to {MAX_PORT})"
        else:
            continue
        several = "; several are comma-separated" if len(items) > 1 else ""
        raise argparse.ArgumentTypeError(f"{what}: give the coordinator's gRPC address, e.g. {DEFAULT_ADDRESS}"
                                         f"{several}")
    return ",".join(items)


# ----- output: -o table|wide|json|yaml, --no-headers -----------------------------------------------------------------
def add_output_option(p: argparse.ArgumentParser) -> None:
    """``-o/--output table|wide|json|yaml`` and ``--no-headers`` on a show or list command; print through ``emit``."""
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table",
                   help="table (default); wide: the table with more columns where the command has them; json or "
                        "yaml: one document on stdout, for scripts")
    p.add_argument("--no-headers", action="store_true", help="tables without their header lines, for scripts")


def add_etcd_read_options(p: argparse.ArgumentParser) -> None:
    """What a command reading a deployment straight from etcd takes: the etcd options, ``--root`` (layered as
    ``coord``'s: ``cli/etcd_read.py``), ``-o`` and ``--timeout``."""
    add_etcd_options(p)
    add_root_option(p)
    add_output_option(p)
    p.add_argument("--timeout", type=positive_float, default=argparse.SUPPRESS,
                   help="seconds to wait for etcd before giving up (default 15)")


def fail(message: object, code: int = 1) -> int:
    """Print the command's one ``error: ...`` line on stderr; return its exit ``code`` (2: a bad argument)."""
    print(f"error: {message}", file=sys.stderr)
    return code


def emit(args: argparse.Namespace, data: Any, render: Callable[[], Iterable[str]]) -> None:
    """``data`` as JSON or YAML with ``-o json|yaml``, else the lines ``render`` draws (tables, trees, "nothing
    there"; ``-o wide`` is for ``render`` to read), without table headers under ``--no-headers``."""
    output = getattr(args, "output", "table")
    if output in STRUCTURED:
        print(document(data, output))
        return
    with headers(not getattr(args, "no_headers", False)):
        for line in render():
            print(line)


def document(data: Any, output: str) -> str:
    """``data`` as one JSON (``output`` json) or YAML document: the same keys and values in both."""
    if output == "yaml":
        import yaml  # only a command asked for YAML pays for the import

        return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True)).rstrip("\n")
    return json.dumps(data, indent=2, sort_keys=False)


def utc(ms: int) -> str:
    """``2025-03-01 12:00:00 UTC`` from unix ms (``-`` for 0): one clock whoever reads it."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else "-"


def wide(args: argparse.Namespace) -> bool:
    """``-o wide``: the command's table with its extra columns."""
    return getattr(args, "output", "table") == "wide"


# ----- client commands ------------------------------------------------------------------------------------------------
def client_command(fn: ClientFn) -> Callable[[argparse.Namespace], int]:
    """Run ``fn`` with a client; turn refusals, an unreachable coordinator and Ctrl-C into messages and codes.

    ``--timeout`` bounds every wait, a single call as well as the search for
    the leader: each call gets what is left of it (a coordinator that cannot
    reach etcd answers late, and a user asked for an answer within it).
    """

    def handler(args: argparse.Namespace) -> int:
        # Imported when a command runs, not when it is registered: every command's start-up would pay for them.
        import grpc

        from querycoord.console.actions import Refusal
        from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient

        async def main() -> int:
            async with QueryCoordClient(args.address, deadline=args.timeout, call_timeout=args.timeout) as c:
                if watching(args):
                    return await watch(lambda: fn(c, args), args)
                return await fn(c, args)

        try:
            configure_from_args(args)  # TLS and the token this command presents
            return asyncio.run(main())
        except Refusal as exc:
            print(f"error: {exc.reason}", file=sys.stderr)
            return 1
        except CoordinatorUnavailable as exc:
            if exc.in_flight and not is_read(exc.method):
                hint = (f"; the request may have been queued at {exc.in_flight} before it went away: once a "
                        "coordinator leads, `querycoord tasks` shows whether it runs (sending it again is safe)")
            elif exc.nothing_listens:
                hint = "; is `querycoord up` or `querycoord coord` running there?"
            else:
                hint = ""
            print(f"error: no leading coordinator answered at {args.address} within {args.timeout:g}s: "
                  f"{exc.summary()}{hint}", file=sys.stderr)
            return 1
        except grpc.aio.AioRpcError as exc:
            print(f"error: {exc.code().name} from the coordinator at {args.address}: {exc.details()}",
                  file=sys.stderr)
            return 1
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            if watching(args):  # the way a watch ends: quietly
                return 0
            print("\ninterrupted: the request, if sent, goes on in the cluster; see `querycoord tasks`",
                  file=sys.stderr)
            return 130

    return handler


def is_read(method: str) -> bool:
    """Whether an RPC only reads (``ShowCollections``, ``GetTask``...): one lost in flight changed nothing."""
    return method.startswith(("Show", "Get", "List", "Describe", "Check"))


def client_options(suppress: bool) -> argparse.ArgumentParser:
    """``--address`` and ``--timeout``, accepted before or after the sub-command.

    Sub-commands declare them with SUPPRESS defaults so that a value given
    before the sub-command is not overwritten by the sub-command's default.
    """
    p = argparse.ArgumentParser(add_help=False)
    d = argparse.SUPPRESS
    p.add_argument("--address", type=coordinator_addresses,
                   default=d if suppress else os.environ.get("QUERYCOORD_ADDRESS", DEFAULT_ADDRESS),
                   help="comma-separated coordinator addresses (any of them; the leader is followed) "
                        f"(default $QUERYCOORD_ADDRESS or {DEFAULT_ADDRESS})")
    p.add_argument("--timeout", type=positive_float, default=d if suppress else 15.0,
                   help="seconds to wait for the leading coordinator's answer, finding it included (default 15)")
    return p
