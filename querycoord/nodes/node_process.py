"""What the reference query and stream node processes share.

Both are known by a meta session (their id is its server id), both run until
SIGTERM/SIGINT (exit 0) or until that session is lost (exit 1: restart under a
new id), both announce themselves with one JSON ``ready`` line that drills and
tests parse, both die like a SIGKILL-ed process when told to crash, and both
are started by ``querycoord <role>`` or ``python -m querycoord.nodes.<role>``
with the same options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from loguru import logger
from prometheus_client.metrics_core import Metric

from meta.client import connect
from meta.config import EtcdConfig
from meta.errors import MetaError
from meta.kv import MetaKV
from meta.session import Session
from querycoord.net.http_server import HttpServer, split_listen
from querycoord.net.probes import NodeEndpoints, bind_http
from querycoord.settings.etcd_options import add_etcd_options, etcd_config_from_args
from querycoord.settings.security_options import add_security_options, configure_from_args
from querycoord.settings.setting_rules import INT64_MAX, Rule, flag_type

# The exit status of a SIGKILL-ed process: a crashed node must look like a killed one.
CRASH_EXIT_CODE = 137


def crash_process(what: str) -> None:
    """Die like a SIGKILL-ed process: no cleanup, the session lease is left to expire."""
    logger.warning("{}: exiting {}", what, CRASH_EXIT_CODE)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        sys.stdout.flush()
    os._exit(CRASH_EXIT_CODE)


class SessionNode:
    """A node known by its meta session (set by ``start``); ``kind`` names it in errors ("query node")."""

    kind = "node"
    _session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            raise RuntimeError(f"{self.kind} not started")
        return self._session

    @property
    def node_id(self) -> int:
        return self.session.server_id


class RunnableNode(Protocol):
    kind: str

    @property
    def session(self) -> Session: ...

    @property
    def node_id(self) -> int: ...

    async def start(self) -> object: ...

    async def stop(self) -> None: ...


N = TypeVar("N", bound=RunnableNode)


async def run_node(
    etcd: EtcdConfig,
    root: str,
    build: Callable[[MetaKV], N],
    *,
    ready: Callable[[N], dict[str, Any]],
    start_errors: tuple[type[BaseException], ...] = (MetaError,),
    alongside: Callable[[N], Coroutine[Any, Any, None]] | None = None,
    http_listen: str = "",
    families: Callable[[N], list[Metric]] = lambda _node: [],
    before_stop: Callable[[N], Coroutine[Any, Any, object]] | None = None,
) -> int:
    """Run the node ``build`` makes until SIGTERM/SIGINT (exit 0) or until its session is lost (exit 1).

    With ``http_listen``, serves /metrics (``families(node)`` and the registry), /healthz and /readyz there from
    before the node starts; the ready event then has its ``http_address``.

    Prints ``{"event": "ready", "node_id", "pid", **ready(node)}`` on stdout once
    the node has started. ``alongside`` (e.g. a control reader) runs as long as
    the node; its end does not end the node. ``before_stop`` (a query node's drain) runs after a first
    SIGTERM/SIGINT, before the node stops; a second signal, or the session's loss, cuts it short.
    """
    # Signals first: a SIGTERM during start-up must still end in a clean stop (session revoked).
    stop = asyncio.Event()
    again = asyncio.Event()  # a second signal: stop at once

    def on_signal() -> None:
        if stop.is_set():
            again.set()
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        client = await connect(etcd)
    except MetaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    http: HttpServer | None = None
    try:
        node = build(MetaKV(client, root))
        try:
            http = bind_http(http_listen, NodeEndpoints(node, lambda: families(node)))
        except OSError as exc:
            print(f"error: {node.kind} could not start: {exc}", file=sys.stderr)
            return 1
        if http is not None:
            http.start()
        try:
            await node.start()
        except start_errors as exc:
            print(f"error: {node.kind} could not start: {exc}", file=sys.stderr)
            return 1
        if stop.is_set():
            await node.stop()
            return 0
        logger.configure(extra={"node": node.node_id})  # this process is this node: every later line says which
        logger.info("{} {} started", node.kind, node.node_id)
        served = {"http_address": http.address} if http is not None else {}
        print(json.dumps({"event": "ready", "node_id": node.node_id, "pid": os.getpid(), **ready(node), **served}),
              flush=True)
        waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait()),
                                            asyncio.create_task(node.session.lost.wait())]
        if alongside is not None:
            waiters.append(asyncio.create_task(alongside(node)))
        while not (stop.is_set() or node.session.lost.is_set()):
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            waiters = [w for w in waiters if not w.done()]
        for w in waiters:
            w.cancel()
        code = 0
        if not stop.is_set():
            print(f"error: {node.kind} {node.node_id} lost its session ({node.session.lost_reason}); exiting so it "
                  f"can be restarted under a new id", file=sys.stderr)
            code = 1
        elif before_stop is not None:
            await _first(before_stop(node), again.wait(), node.session.lost.wait())
        await node.stop()
        return code
    finally:
        if http is not None:
            await http.stop()
        await client.close()


async def _first(*steps: Coroutine[Any, Any, object]) -> None:
    """Run ``steps`` until the first of them ends; the others are cancelled."""
    tasks = [asyncio.create_task(s) for s in steps]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def meta_of(args: argparse.Namespace) -> EtcdConfig:
    """The etcd the options name (endpoints, TLS, user), with the process's gRPC security configured from its
    options; a ``ValueError`` names a bad option (``--ttl`` below 2 s and a malformed ``--http-listen`` too)."""
    if args.ttl < 2:
        raise ValueError(f"--ttl must be at least 2 seconds, got {args.ttl}")
    if args.http_listen:
        split_listen(args.http_listen)
    if args.node_id is not None and args.node_id < 1:
        raise ValueError(f"--node-id must be a positive integer, got {args.node_id}")
    configure_from_args(args)  # this process's gRPC security (TLS, its token, the principals it accepts)
    return etcd_config_from_args(args)


@dataclass(frozen=True)
class NodeCommand:
    """``querycoord <role>`` and ``python -m querycoord.nodes.<role>``: the same options, the same handler.

    ``add_options`` adds the role's own options (``--etcd-endpoints`` and
    ``--root`` are every role's); ``handler`` runs the node and returns the
    exit status.
    """

    role: str
    summary: str
    add_options: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]

    def _options(self, p: argparse.ArgumentParser) -> None:
        add_etcd_options(p)
        p.add_argument("--root", required=True, help="meta root path in etcd shared with the coordinator")
        p.add_argument("--http-listen", default="", metavar="HOST:PORT",
                       help="serve /metrics (Prometheus), /healthz and /readyz over HTTP here (port 0: any free "
                            "port; default: none)")
        p.add_argument("--node-id", type=flag_type(int, Rule(1, INT64_MAX)), default=None, metavar="N",
                       help="register under this fixed id instead of taking one from etcd (needed when the node's "
                            "etcd role may write only its own session key; `querycoord etcd roles`)")
        self.add_options(p)

    def add_parser(self, subparsers: Any) -> argparse.ArgumentParser:
        """Register the role on the ``querycoord`` sub-command parsers (``args.func`` is the handler)."""
        p = subparsers.add_parser(self.role, help=self.summary)
        self._options(p)
        p.set_defaults(func=self.handler)
        return p

    def main(self, argv: list[str] | None = None) -> int:
        """``python -m querycoord.nodes.<role>``: the options of ``querycoord <role>``, the log options and
        ``--config``, layered as ``querycoord`` layers them."""
        from querycoord.settings.config_file import add_config_option, apply_layers
        from querycoord.settings.logs import add_log_options, setup_logging

        parser = argparse.ArgumentParser(prog=f"querycoord {self.role}", description=self.summary)
        add_log_options(parser)
        add_config_option(parser)
        add_security_options(parser)
        self._options(parser)
        args = parser.parse_args(argv)
        try:
            apply_layers(args)
            setup_logging(args.log_level, args.log_format)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return self.handler(args)
