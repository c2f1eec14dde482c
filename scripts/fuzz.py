"""``make fuzz``: fuzz every RPC of a running cluster (10,000 requests, a fresh seed) and check it afterwards.

Starts its own etcd and cluster (2 coordinators, 2 query nodes, 2 stream nodes as processes; see
``tests/fuzz_cluster.py``), sends hostile, valid and garbage requests from several clients
(``tests/fuzzing.py``), kills the leader at the end, then prints a table per service and RPC, the distinct
failures with the shortest request that showed each, tracebacks found in the logs, and ends with exactly one
JSON line::

    {"requests": 10000, "crashes": 0, "tracebacks": 0, "unanswered": 0, "leftover_keys": 0, "violations": 0,
     "exhaustion": {"healthz_misses": 0, "leader_changes": 0, "processes_died": 0, "rss_over_bound": 0,
                    "unclean_refusals": 0, "rss_growth_mib": 41.2, "rss_bound_mib": 256.0}, "seed": 123}

Between the hostile requests and the failover, a resource-exhaustion phase (``tests/exhaustion.py``) holds
1,000 idle and 300 slow HTTP connections, 200 gRPC Watch streams, sends oversized HTTP heads, gRPC requests and
metadata, and runs 48 loops of heavy reads (the reader role's token on a coordinator with a principals file) for
``--exhaustion-seconds``, sampling /healthz, the leader's fence, the processes and the coordinators' RSS.

Exit status 1 when any count but requests and seed is non-zero (``violations``: a dead process, a leader not
SERVING, a half-written collection or stream, meta disagreeing with the nodes, a failed takeover), the
exhaustion counts included (``rss_growth_mib`` and ``rss_bound_mib`` are figures, not counts). The same
seed draws the same requests (the ids they name come from the run). Logs stay in the work dir it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tests/ is not an installed package

from meta.ops.etcd_server import EtcdCluster  # noqa: E402
from tests.exhaustion import ExhaustionOptions  # noqa: E402
from tests.fuzz_cluster import FuzzOptions, run_fuzz  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/fuzz.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=10_000, help="requests to send (default 10000)")
    p.add_argument("--seed", type=int, default=None, help="the run's seed (default: a fresh one, printed)")
    p.add_argument("--clients", type=int, default=6, help="concurrent clients (default 6)")
    p.add_argument("--deadline", type=float, default=20.0, help="seconds per call (default 20)")
    p.add_argument("--no-failover", action="store_true", help="do not kill the leader at the end")
    p.add_argument("--exhaustion-seconds", type=float, default=60.0,
                   help="length of the resource-exhaustion phase (default 60; 0 skips it)")
    p.add_argument("--findings", type=Path, default=None, help="also write the distinct failures here (markdown)")
    args = p.parse_args(argv)
    if args.requests <= 0 or args.clients <= 0 or args.deadline <= 0:
        p.error("--requests, --clients and --deadline must be positive")
    if not math.isfinite(args.exhaustion_seconds) or args.exhaustion_seconds < 0:
        p.error("--exhaustion-seconds must be a finite number, 0 or more")
    return args


async def main(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    opts = FuzzOptions(requests=args.requests, seed=seed, clients=args.clients, deadline=args.deadline,
                       failover=not args.no_failover,
                       exhaustion=ExhaustionOptions(seconds=args.exhaustion_seconds)
                       if args.exhaustion_seconds > 0 else None)
    work = Path(tempfile.mkdtemp(prefix="querycoord-fuzz-"))
    print(f"fuzz: {opts.requests} requests, seed {seed}, {opts.clients} clients; work dir {work}", flush=True)
    etcd = EtcdCluster(work / "etcd", size=1)
    await asyncio.to_thread(etcd.start)
    try:
        report = await run_fuzz(etcd, f"fuzz-{seed}", work / "cluster", opts,
                                say=lambda s: print(s, flush=True))
    finally:
        await asyncio.to_thread(etcd.stop)
    print(report.render(), flush=True)
    if args.findings is not None:
        lines = [f"# fuzz run, seed {seed}, {report.stats.requests} requests", "", *report.stats.findings.render()]
        lines += ["", "## tracebacks", *(f"--- {n}\n```\n{e}\n```" for n, e in report.tracebacks)]
        lines += ["", "## violations", *(f"- {v}" for v in report.violations)]
        if report.exhaustion is not None:
            lines += ["", "## exhaustion", "```", report.exhaustion.render(), "```"]
        await asyncio.to_thread(args.findings.write_text, "\n".join(lines) + "\n")
    print(report.json_line(), flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
