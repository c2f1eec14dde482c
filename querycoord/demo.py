"""``make demo``: leader election and fencing on the embedded etcd, end to end.

Starts etcd, three candidate processes campaign, the leader is SIGKILLed, a
standby takes over, and its fenced write lands while a write with the dead
leader's fence is refused by etcd. Prints the timeline and the takeover
time, exits 0 and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time

from meta.campaign import CandidateProcess
from meta.client import connect
from meta.errors import NotLeader
from meta.etcd_server import EtcdCluster
from meta.fence import Fence
from meta.kv import MetaKV
from querycoord.logs import setup_logging

TTL = 2.0


class Timeline:
    def __init__(self) -> None:
        self.t0 = time.time()

    def say(self, what: str, at: float | None = None) -> None:
        print(f"  {(at or time.time()) - self.t0:7.3f}s  {what}", flush=True)


async def first_leader(cands: list[CandidateProcess]) -> tuple[CandidateProcess, dict]:
    tasks = {asyncio.create_task(c.next_event("leader", timeout=30)): c for c in cands}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    task = done.pop()
    return tasks[task], task.result()


async def run(cluster: EtcdCluster) -> None:
    tl = Timeline()
    root = "demo"
    tl.say(f"embedded etcd up at {', '.join(cluster.endpoints)}")
    names = ("alpha", "beta", "gamma")
    cands = [await CandidateProcess.spawn(cluster.endpoints, root, name, ttl=TTL) for name in names]
    try:
        sessions = [(await c.next_event("session"), c) for c in cands]
        for ev, c in sorted(sessions, key=lambda x: x[0]["t"]):
            tl.say(f"candidate {c.name} (pid {c.pid}) registered session ServerID {ev['server_id']}", ev["t"])
        leader, ev = await first_leader(cands)
        old_fence = Fence(ev["key"], ev["revision"])
        tl.say(f"{leader.name} leads with fence {old_fence}", ev["t"])
        w = await leader.next_event("write")
        tl.say(f"{leader.name} fenced write #{w['seq']} landed at revision {w['revision']}", w["t"])

        killed_at = time.time()
        leader.send_signal(signal.SIGKILL)
        tl.say(f"SIGKILL {leader.name} (pid {leader.pid}); its lease expires within the TTL of {TTL:g}s", killed_at)
        standbys = [c for c in cands if c is not leader]
        new, ev = await first_leader(standbys)
        takeover = ev["t"] - killed_at
        tl.say(f"{new.name} takes over with fence {ev['key']}@{ev['revision']}", ev["t"])
        w = await new.next_event("write")
        tl.say(f"{new.name} fenced write #{w['seq']} landed at revision {w['revision']}", w["t"])

        client = await connect(cluster.config())
        try:
            kv = MetaKV(client, root)
            try:
                await kv.fenced(old_fence).save("campaign/owner", f"{leader.name}:stale")
                raise SystemExit("BUG: a write with the dead leader's fence landed")
            except NotLeader as exc:
                tl.say(f"write with {leader.name}'s old fence refused by etcd: {exc}")
            owner = await kv.get("campaign/owner")
            tl.say(f"campaign/owner = {owner.decode() if owner else None}")
        finally:
            await client.close()

        for c in standbys:
            c.send_signal(signal.SIGTERM)
        for c in standbys:
            await c.wait()
        tl.say("standbys stopped (resigned on SIGTERM)")
        print(f"\ntakeover after SIGKILL: {takeover:.2f}s (lease TTL {TTL:g}s; target <= TTL + 1s)")
    finally:
        for c in cands:
            await c.kill()


def main() -> int:
    setup_logging("WARNING")
    os.environ.setdefault("QUERYCOORD_LOG_LEVEL", "WARNING")  # for the candidate processes
    print("querycoord demo: leader election and fencing on the embedded etcd\n")
    with tempfile.TemporaryDirectory(prefix="querycoord-demo-") as tmp, EtcdCluster(tmp) as cluster:
        asyncio.run(run(cluster))
    print("done: every process stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
