"""What the benchmarks (``scripts/bench_*.py``) share: their common options, their logging, the etcd they run on.

A bench runs on an external etcd (``--etcd-endpoints``; it removes its keys at
the end) or on an embedded member in a temporary directory, announced on
stderr so that the bench tests can check it is gone afterwards
(``tests/bench.py``). Imported by the scripts as a sibling module: they run as
``python scripts/bench_<name>.py``, which puts this directory on the path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TypeVar

from loguru import logger

from meta.config import EtcdConfig
from meta.ops.etcd_server import EtcdCluster

T = TypeVar("T")


class BenchError(Exception):
    """The benchmark could not run as planned (the message says why): one ``error:`` line and exit 1."""


def arg_parser(doc: str, *, verbose_help: str) -> argparse.ArgumentParser:
    """A bench's parser, described by the first paragraph of its ``doc``, with ``--etcd-endpoints`` and ``-v``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--etcd-endpoints", help="external etcd (host:port,...); default: start an embedded member")
    p.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    return p


def add_cluster_options(p: argparse.ArgumentParser, *, segments: int, partitions: int, nodes: int, poll: float,
                        node_help: str) -> argparse._ArgumentGroup:
    """The options of a bench that runs a coordinator and query nodes on one collection (the load and the soak);
    ``check_cluster_options`` validates them. Returns the group, for the bench's own cluster options."""
    g = p.add_argument_group("cluster")
    g.add_argument("--segments", type=int, default=segments, help=f"segments of the collection (default {segments})")
    g.add_argument("--partitions", type=int, default=partitions, help=f"partitions (default {partitions})")
    g.add_argument("--nodes", type=int, default=nodes, help=f"{node_help} (default {nodes})")
    g.add_argument("--ttl", type=float, default=10.0, help="session TTL of coordinator and nodes (default 10)")
    g.add_argument("--poll", type=float, default=poll, help=f"task poll interval in seconds (default {poll:g})")
    return g


def check_cluster_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    require_positive(p, args, ("segments", "partitions", "nodes"))
    if args.ttl < 2:
        p.error("--ttl must be >= 2")
    if args.poll <= 0:
        p.error("--poll must be > 0")


def require_positive(p: argparse.ArgumentParser, args: argparse.Namespace, names: Iterable[str]) -> None:
    """Exit with a usage error naming the first of the options ``names`` that is below 1."""
    for name in names:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")


def log_to_stderr(verbose: bool) -> None:
    """Progress on stderr with ``-v``, else warnings only: stdout holds the bench's report."""
    logger.remove()
    logger.add(sys.stderr, level="INFO" if verbose else "WARNING")


def run_on_etcd(
    bench_main: Callable[[EtcdConfig, argparse.Namespace], Coroutine[Any, Any, T]],
    args: argparse.Namespace,
    tmp_prefix: str,
) -> T:
    """``bench_main`` on ``--etcd-endpoints``, else on an embedded member whose data dir is removed afterwards."""
    if args.etcd_endpoints:
        return asyncio.run(bench_main(EtcdConfig.from_endpoints(args.etcd_endpoints), args))
    with tempfile.TemporaryDirectory(prefix=tmp_prefix) as tmp, EtcdCluster(Path(tmp), size=1) as cluster:
        member = cluster.members[0]
        print(f"embedded etcd pid {member.pid} on {member.endpoint}, data dir {member.data_dir}",
              file=sys.stderr, flush=True)
        return asyncio.run(bench_main(cluster.config(), args))


def report(measure: Callable[[], dict[str, Any]], *, verbose: bool) -> int:
    """Run ``measure`` (logging as ``log_to_stderr(verbose)``) and print its result as the last line, one JSON
    object; 1 after a ``BenchError``.

    What the bench's processes and libraries print meanwhile goes to stderr, so stdout holds only the bench's
    table (written to the stdout saved before, ``args.out``) and, last, the JSON line.
    """
    log_to_stderr(verbose)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = measure()
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result), flush=True)
    return 0
