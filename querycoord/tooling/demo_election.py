"""``querycoord demo --election``: leader election and fencing with candidate processes on the embedded etcd.

Three candidates campaign; the leader is SIGKILLed; a standby takes over once the dead leader's lease lapses;
a write with the old leader's fence is refused by etcd.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time

from meta.client import connect
from meta.errors import NotLeader
from meta.fence import Fence
from meta.kv import MetaKV
from meta.ops.child import ChildProcess
from meta.ops.etcd_server import EtcdCluster
from querycoord.settings.logs import setup_logging
from querycoord.tooling.campaign import spawn_candidate
from querycoord.tooling.demo_timeline import TTL, Timeline


# ===== the stage-one demo: election and fencing ===================================================================
async def first_leader(cands: list[ChildProcess]) -> tuple[ChildProcess, dict]:
    tasks = {asyncio.create_task(c.next_event("leader", timeout=30)): c for c in cands}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    task = done.pop()
    return tasks[task], task.result()


async def run_election(cluster: EtcdCluster) -> None:
    """Three candidates campaign; the leader is SIGKILLed; a standby takes over; the old fence is refused."""
    tl = Timeline()
    root = "demo"
    tl.say(f"embedded etcd up at {', '.join(cluster.endpoints)}")
    names = ("alpha", "beta", "gamma")
    cands = [await spawn_candidate(cluster.endpoints, root, name, ttl=TTL) for name in names]
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


def election_main() -> int:
    setup_logging("WARNING")
    os.environ.setdefault("QUERYCOORD_LOG_LEVEL", "WARNING")  # for the candidate processes
    print("querycoord demo --election: leader election and fencing on the embedded etcd\n")
    with tempfile.TemporaryDirectory(prefix="querycoord-demo-") as tmp, EtcdCluster(tmp) as cluster:
        asyncio.run(run_election(cluster))
    print("done: every process stopped")
    return 0
