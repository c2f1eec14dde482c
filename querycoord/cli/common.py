"""What every client command shares: ``--address``/``--timeout``, and one way to turn failures into messages.

A client command that is refused prints ``error: <reason>`` (the Status
reason, which says what was wrong) and exits 1; an unreachable coordinator
is reported with the addresses tried. Never a traceback: a refused request
is an answer, not a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable

import grpc

from querycoord.actions import Refusal
from querycoord.client import CoordinatorUnavailable, QueryCoordClient

DEFAULT_ADDRESS = "127.0.0.1:19531"

ClientFn = Callable[[QueryCoordClient, argparse.Namespace], Awaitable[int]]


def client_command(fn: ClientFn) -> Callable[[argparse.Namespace], int]:
    """Run ``fn`` with a client; turn refusals, an unreachable coordinator and Ctrl-C into messages and codes."""

    def handler(args: argparse.Namespace) -> int:
        async def main() -> int:
            async with QueryCoordClient(args.address, deadline=args.timeout,
                                        call_timeout=max(args.timeout, 60.0)) as c:
                return await fn(c, args)

        try:
            return asyncio.run(main())
        except Refusal as exc:
            print(f"error: {exc.reason}", file=sys.stderr)
            return 1
        except CoordinatorUnavailable as exc:
            print(f"error: no leading coordinator answered at {args.address} within {args.timeout:g}s; is "
                  f"`querycoord up` or `querycoord coord` running there? ({exc})", file=sys.stderr)
            return 1
        except grpc.aio.AioRpcError as exc:
            print(f"error: {exc.code().name} from the coordinator at {args.address}: {exc.details()}",
                  file=sys.stderr)
            return 1
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("\ninterrupted: the request, if sent, goes on in the cluster; see `querycoord tasks`",
                  file=sys.stderr)
            return 130

    return handler


def client_options(suppress: bool) -> argparse.ArgumentParser:
    """``--address`` and ``--timeout``, accepted before or after the sub-command.

    Sub-commands declare them with SUPPRESS defaults so that a value given
    before the sub-command is not overwritten by the sub-command's default.
    """
    p = argparse.ArgumentParser(add_help=False)
    d = argparse.SUPPRESS
    p.add_argument("--address", default=d if suppress else os.environ.get("QUERYCOORD_ADDRESS", DEFAULT_ADDRESS),
                   help="comma-separated coordinator addresses (any of them; the leader is followed) "
                        f"(default $QUERYCOORD_ADDRESS or {DEFAULT_ADDRESS})")
    p.add_argument("--timeout", type=float, default=d if suppress else 15.0,
                   help="seconds to find a leading coordinator before giving up (default 15)")
    return p
