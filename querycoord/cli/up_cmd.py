"""``querycoord up``: the all-in-one cluster in the foreground (embedded etcd, a coordinator, query nodes).

What the README documents for servers is passed to every process it starts:
``--log-level``/``--log-format``, the gRPC security options (``--tls-*``,
``--auth-*``, ``--insecure``, ``--grpc-max-message-mb``) and ``--config``;
``--http-listen`` to the coordinator (``--node-http``: each query node on a
free port). ``--root`` and ``--listen`` come from the flag, the variable or
the file as for ``coord`` (``[coord] root``, ``$QUERYCOORD_COORD_ROOT``, and
``$QUERYCOORD_ROOT`` as the readers take it).

etcd listens on etcdctl's default port when it is free (``tooling/up_env``),
an ``export`` line and ``<data-dir>/env`` tell the other commands where the
cluster is, and a process that exits is restarted (``tooling/up_watch``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from meta.address import address_problem
from querycoord.cli.common import DEFAULT_ADDRESS, at_least, non_negative_int, positive_float
from querycoord.settings.setting_rules import FILE, Rule, flag_type

if TYPE_CHECKING:
    from querycoord.tooling.allinone import AllInOne

ROOT_ENV = "QUERYCOORD_ROOT"
DEFAULT_ROOT = "querycoord"


def _err(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def resolve(args: argparse.Namespace) -> None:
    """Defaults of the options the configuration layers left unset; ``ValueError`` for an unusable value."""
    sources = getattr(args, "config_sources", {})
    if args.root is None or (ROOT_ENV in os.environ and str(sources.get("coord.root")) in ("file", "default")):
        args.root = os.environ.get(ROOT_ENV) or args.root or DEFAULT_ROOT
    if not args.root.strip():
        raise ValueError("--root is empty: name the meta root path")
    args.listen = args.listen or DEFAULT_ADDRESS
    for flag, value in (("--listen", args.listen), ("--http-listen", args.http_listen)):
        problem = address_problem(value) if value else None
        if problem:
            raise ValueError(f"{flag}: {problem}")


def child_args(args: argparse.Namespace) -> list[str]:
    """The options every child gets from ours: log format, configuration file, gRPC security (files absolute)."""
    from querycoord.settings.security_options import OPTIONS

    out: list[str] = []
    if getattr(args, "log_format", None):
        out += ["--log-format", str(args.log_format)]
    if getattr(args, "config_file", None):
        out += ["--config", os.path.abspath(args.config_file)]
    for o in OPTIONS:
        value = getattr(args, o.dest, None)
        if value is None or value is False:
            continue
        if o.kind is bool:
            out.append(o.flag)
        else:
            out += [o.flag, os.path.abspath(str(value)) if o.rule is FILE else str(value)]
    return out


def cmd_up(args: argparse.Namespace) -> int:
    """The all-in-one cluster in the foreground: Ctrl-C or SIGTERM stops every process it started."""
    from querycoord.settings.security_options import configure_from_args
    from querycoord.tooling.allinone import data_dir_problem
    from querycoord.tooling.up_env import etcd_port

    try:
        resolve(args)
        configure_from_args(args)  # our own client (waiting for the nodes) reaches a secured cluster too
        port, default_taken = etcd_port(args.etcd_port)
    except ValueError as exc:
        _err(str(exc))
        return 2
    problem = data_dir_problem(args.data_dir) if args.data_dir else None
    if problem:
        _err(problem)
        return 2
    try:
        return asyncio.run(_run_up(args, port, default_taken))
    except KeyboardInterrupt:  # a Ctrl-C before the signal handlers were installed: nothing was started yet
        return 130


async def _run_up(args: argparse.Namespace, port: int, default_taken: bool) -> int:
    from querycoord.tooling.allinone import AllInOne, ClusterStartError
    from querycoord.tooling.up_env import default_taken_note
    from querycoord.tooling.up_watch import UpWatch

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        cluster = AllInOne(nodes=args.nodes, listen=args.listen, data_dir=args.data_dir, ttl=args.ttl,
                           root=args.root, node_capacity_mb=args.node_capacity_mb, log_level=args.log_level,
                           keep_logs=True, etcd_port=port, http_listen=args.http_listen or "",
                           node_args=["--http-listen", "127.0.0.1:0"] if args.node_http else (),
                           child_args=child_args(args))
    except ValueError as exc:
        _err(str(exc))
        return 2
    starting = asyncio.create_task(cluster.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await cluster.stop()
        print("stopped before the cluster was ready; every process it started is gone", flush=True)
        return 0
    stopping.cancel()
    try:
        starting.result()
    except ClusterStartError as exc:
        _err(str(exc))
        return 1
    watch = UpWatch(cluster, say=lambda line: print(line, file=sys.stderr, flush=True),
                    tell=lambda line: print(line, flush=True))
    code = 0
    try:
        if default_taken:
            print(default_taken_note(cluster.etcd_endpoints), flush=True)
        print_ready(cluster, args)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except TimeoutError:
                pass
            watch.poll()
            if watch.failed is not None:
                _err(f"{watch.failed}; stopping the cluster")
                code = 1
                break
    finally:
        await watch.close()
        print("stopping: coordinator, query nodes, etcd ...", flush=True)
        await cluster.stop()
    print(f"stopped: every process of the cluster is gone (logs in {cluster.data_dir})", flush=True)
    return code


def variables(cluster: AllInOne, args: argparse.Namespace) -> dict[str, str]:
    """What the other commands need to reach this cluster, as ``QUERYCOORD_*`` variables."""
    out = {"QUERYCOORD_ETCD_ENDPOINTS": ",".join(cluster.etcd_endpoints), "QUERYCOORD_ROOT": cluster.root,
           "QUERYCOORD_ADDRESS": cluster.coordinator_address}
    if getattr(args, "tls_ca", None):
        out["QUERYCOORD_TLS_CA"] = os.path.abspath(args.tls_ca)
    return out


def print_ready(cluster: AllInOne, args: argparse.Namespace) -> None:
    """The ready table: every process with its address, pid and log; the export line (also in ``DIR/env``)."""
    from querycoord.tooling.up_env import export_line, write_env_file

    kept = "kept" if cluster.keeps_data else "etcd data removed on exit, logs kept"
    coord = cluster.coordinator
    assert coord is not None and cluster.etcd is not None
    etcd_pid = cluster.etcd.members[0].pid
    lines = [
        f"querycoord all-in-one cluster is up (data and logs in {cluster.data_dir}; {kept})",
        f"  etcd endpoints  {','.join(cluster.etcd_endpoints)}  (pid {etcd_pid}, log {cluster.etcd_log})",
        f"  meta root       {cluster.root}",
        f"  coordinator     {cluster.coordinator_address}  (leader, pid {coord.child.pid}, log {coord.child.log_path})",
    ]
    http = coord.ready.get("http_address")
    if http:
        scheme = "https" if getattr(args, "tls_http", False) else "http"
        lines.append(f"  status page     {scheme}://{http}/  (metrics /metrics, probes /healthz /readyz)")
    for n in sorted(cluster.nodes, key=lambda m: m.node_id):
        node_http = f", http {n.ready['http_address']}" if n.ready.get("http_address") else ""
        lines.append(f"  query node {n.node_id:<4} {n.address}  (pid {n.child.pid}{node_http}, log {n.child.log_path})")
    env = variables(cluster, args)
    path = write_env_file(cluster.data_dir, env)
    lines.append(export_line(env))
    lines.append(f"ready: in another shell paste that line or `source {path}`, then try `querycoord status`; "
                 f"Ctrl-C stops everything")
    print("\n".join(lines), flush=True)


def add_up_parser(sub: Any) -> None:
    p = sub.add_parser("up", help="run the all-in-one cluster (embedded etcd, a coordinator, query nodes)")
    p.add_argument("--nodes", type=non_negative_int, default=3, help="query nodes to start (default 3)")
    p.add_argument("--listen", default=None,
                   help=f"coordinator address (default {DEFAULT_ADDRESS}; port 0: any free port; [coord] listen)")
    p.add_argument("--http-listen", default=None, metavar="HOST:PORT",
                   help="the coordinator's HTTP: /metrics, /healthz, /readyz, the status page (port 0: any free "
                        "port; default none)")
    p.add_argument("--node-http", action="store_true",
                   help="each query node serves its /metrics, /healthz, /readyz on a free port (printed)")
    p.add_argument("--etcd-port", type=flag_type(int, Rule(0, 65535)), default=None, metavar="PORT",
                   help="etcd's client port (default 2379, etcdctl's default, or a free port when that is taken; "
                        "0: any free port)")
    p.add_argument("--data-dir", default=None, help="keep etcd data and logs here (default: a temp dir whose etcd "
                                                    "data is removed on exit and whose logs are kept)")
    p.add_argument("--ttl", type=at_least(2, 3600), default=10.0,
                   help="session TTL of the coordinator and nodes, at least 2 (default 10)")
    p.add_argument("--root", default=None,
                   help=f"meta root path in etcd (default $QUERYCOORD_ROOT, [coord] root or {DEFAULT_ROOT})")
    p.add_argument("--node-capacity-mb", type=positive_float, default=1024,
                   help="memory of each query node (default 1024)")
    p.set_defaults(func=cmd_up, config_section="coord")  # --root, --listen, --http-listen: [coord] keys too


__all__ = ["add_up_parser", "child_args", "cmd_up", "print_ready", "resolve", "variables"]
