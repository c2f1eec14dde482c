"""A candidate process for drills, tests and the demo: campaign, then write through the fence.

``python -m querycoord.tooling.campaign --endpoints 127.0.0.1:2379 --root demo --name c1``
prints one JSON object per line (event, wall time ``t``, details):
``session``, ``leader`` (won, with its fence), ``write`` (a fenced write
landed), ``not_leader`` (etcd refused a fenced write: exit 3),
``session_lost``, ``resigned`` (after SIGTERM: exit 0).

After winning it keeps writing ``<write-key> = <name>:<seq>`` through the
fenced view, even once it believes its session is lost: the point is to show
that etcd, not the candidate's belief, decides whether a write lands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time

from loguru import logger

from meta.client import connect
from meta.config import EtcdConfig
from meta.election import Election, SessionLost
from meta.errors import MetaError, NotLeader
from meta.kv import MetaKV
from meta.ops.child import ChildProcess
from meta.session import Session

EXIT_NOT_LEADER = 3
EXIT_SESSION_LOST = 4


async def spawn_candidate(
    endpoints: list[str],
    root: str,
    name: str,
    *,
    ttl: float = 2.0,
    election: str = "demo",
    write_interval: float = 0.1,
    env: dict[str, str] | None = None,
) -> ChildProcess:
    """Parent side: start a candidate process; its JSON events come as ``ChildProcess`` events."""
    return await ChildProcess.spawn(
        name, ["-m", "querycoord.tooling.campaign", "--endpoints", ",".join(endpoints), "--root", root, "--name", name,
               "--ttl", str(ttl), "--election", election, "--write-interval", str(write_interval)],
        env=env, new_session=False,
    )


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


async def run(args: argparse.Namespace) -> int:
    client = await connect(EtcdConfig.from_endpoints(args.endpoints, call_timeout=1.0, deadline=5.0))
    kv = MetaKV(client, args.root)
    session = Session(kv, "candidate", args.name, ttl=args.ttl)
    info = await session.start()
    emit("session", name=args.name, server_id=info.server_id, lease=session.lease_id)
    election = Election(kv, session, args.election)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        campaign = asyncio.create_task(election.campaign(args.name))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({campaign, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            campaign.cancel()
            await asyncio.gather(campaign, return_exceptions=True)
            emit("resigned", name=args.name, leader=False)
            return 0
        stopper.cancel()
        try:
            fence = campaign.result()
        except SessionLost as exc:
            emit("session_lost", name=args.name, reason=str(exc))
            return EXIT_SESSION_LOST
        emit("leader", name=args.name, key=fence.leader_key, revision=fence.revision)
        fenced = kv.fenced(fence)
        seq = 0
        reported_lost = False
        while not stop.is_set():
            if session.lost.is_set() and not reported_lost:
                reported_lost = True
                emit("session_lost", name=args.name, reason=session.lost_reason)
            seq += 1
            try:
                rev = await fenced.save(args.write_key, f"{args.name}:{seq}")
            except NotLeader as exc:
                emit("not_leader", name=args.name, seq=seq, error=str(exc))
                return EXIT_NOT_LEADER
            except MetaError as exc:
                emit("write_error", name=args.name, seq=seq, error=str(exc))
            else:
                emit("write", name=args.name, seq=seq, revision=rev)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.write_interval)
        await election.resign()
        emit("resigned", name=args.name, leader=True)
        return 0
    finally:
        await session.close(revoke=stop.is_set())
        await client.close()


def main(argv: list[str] | None = None) -> int:
    logger.remove()
    logger.add(sys.stderr, level=os.environ.get("QUERYCOORD_LOG_LEVEL", "INFO").upper(), diagnose=False,
               backtrace=False)
    p = argparse.ArgumentParser(prog="python -m querycoord.tooling.campaign", description=__doc__.splitlines()[0])
    p.add_argument("--endpoints", required=True, help="etcd endpoints, comma separated")
    p.add_argument("--root", required=True, help="root path in etcd")
    p.add_argument("--name", required=True, help="this candidate's name (its election value)")
    p.add_argument("--election", default="demo")
    p.add_argument("--ttl", type=float, default=2.0, help="session lease TTL in seconds (>= 2)")
    p.add_argument("--write-key", default="campaign/owner")
    p.add_argument("--write-interval", type=float, default=0.1)
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
