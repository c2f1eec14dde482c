"""Node and etcd faults of the failover drill: seeded kills, and a supervisor that replaces what exits on its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from meta.ops.child import log_tail
from querycoord.tooling.drill.activity import FaultRecord
from querycoord.tooling.drill.replica_watch import ReplicaWatch
from querycoord.tooling.drill.schedule import EtcdKill
from querycoord.tooling.harness import Member, StartError


class FailoverFaults(ReplicaWatch):
    """Query nodes SIGKILLed and replaced, etcd members SIGKILLed and restarted, processes that exit on their own
    replaced (a coordinator or etcd member doing so is a violation)."""

    async def _supervise(self) -> None:
        """Replace processes that exit without being killed by the drill, as a deployment's supervisor would.

        A query node exits by design when it loses its session (an etcd fault
        longer than its TTL): it must come back under a new id. A coordinator
        must never exit on its own (it campaigns again instead): that is
        recorded as a violation, and it is restarted too.
        """
        while True:
            await asyncio.sleep(0.3)
            for node in list(self.nodes):
                if node.running or node.state == "dead" or node.index in self._replacing:
                    continue
                last = log_tail(node.child.log_path, 1).strip()
                rec = FaultRecord(self.now(), f"node n{node.index}: node {node.node_id} exited on its own "
                                              f"(code {node.child.proc.returncode}: {last[:110]})")
                self.result.faults.append(rec)
                self.say(rec.what)
                await self._replace_node(node, rec)
            await self._supervise_etcd()
            for c in self.coords:
                if c.running or c.state == "dead":
                    continue
                c.state = "dead"
                what = (f"coordinator {c.label} exited on its own (code {c.child.proc.returncode}); "
                        f"see {c.child.log_path}")
                self._extra_violations.append(what)
                self.say(what)
                await self._restart_coordinator(c)

    async def _supervise_etcd(self) -> None:
        """An etcd member that exits on its own (a crash, not a drill fault) is a violation; restart it."""
        etcd = self.etcd
        assert etcd is not None
        for i, m in enumerate(etcd.members):
            if i in self._etcd_down or m.running or m.proc is None:
                continue
            what = (f"etcd member {m.name} exited on its own (code {m.proc.returncode})"
                    f"{': ' + etcd_crash_reason(m.log_path) if etcd_crash_reason(m.log_path) else ''}")
            self._extra_violations.append(what)
            self.result.faults.append(FaultRecord(self.now(), what))
            self.say(what)
            self._etcd_down.add(i)
            try:
                await asyncio.to_thread(etcd.restart_member, i, 60.0)
                self.result.faults[-1].note = "restarted by the drill"
            except Exception as exc:  # recorded; the run goes on and its checks will show the damage
                self._extra_violations.append(f"etcd member {m.name} did not restart: {exc}")
            finally:
                self._etcd_down.discard(i)

    async def _replace_node(self, node: Member, rec: FaultRecord) -> None:
        """A new process in the dead node's slot (the same ``Member``, a new node id)."""
        self._replacing.add(node.index)
        try:
            for attempt in range(1, 4):  # etcd may be losing a member right now
                try:
                    await self._start_node(node.index, member=node)
                    break
                except StartError:
                    if attempt == 3:
                        raise
                    await asyncio.sleep(1.0)
            rec.note = f"replaced by node {node.node_id}"
        finally:
            self._replacing.discard(node.index)

    async def _kill_node(self, slot_index: int) -> None:
        node = self.nodes[slot_index % len(self.nodes)]
        while node.index in self._replacing:  # the supervisor is replacing it already
            await asyncio.sleep(0.1)
            node = self.nodes[slot_index % len(self.nodes)]
        await self._observe_replicas(f"node {node.node_id} kill")
        await self.cluster.kill(node)
        rec = FaultRecord(self.now(), f"node n{node.index}: SIGKILL node {node.node_id}")
        self.result.faults.append(rec)
        await self._replace_node(node, rec)
        self.say(f"{rec.what}, {rec.note}")

    async def _etcd_fault(self, action: EtcdKill) -> None:
        etcd = self.etcd
        assert etcd is not None
        leader = await asyncio.to_thread(etcd.leader_index)
        index = action.member if action.member is not None else (leader if leader is not None else 0)
        name = etcd.members[index].name
        rec = FaultRecord(self.now(), f"etcd {name}{' (raft leader)' if index == leader else ''}: SIGKILL for "
                                      f"{action.down_s:.2f}s")
        self.result.faults.append(rec)
        self.say(rec.what)
        self._etcd_down.add(index)
        try:
            await asyncio.to_thread(etcd.kill_member, index)
            await asyncio.sleep(action.down_s)
            await asyncio.to_thread(etcd.restart_member, index, 60.0)
            rec.note = "restarted"
        except Exception as exc:  # a member that cannot come back is a drill failure, not a crash of the drill
            rec.note = f"restart failed: {exc}"
            self._extra_violations.append(f"etcd member {name} did not restart: {exc}")
        finally:
            self._etcd_down.discard(index)
        self.note(f"etcd {name}: {rec.note}")


def etcd_crash_reason(log_path: Path) -> str:
    """The panic / fatal message at the end of an etcd member's log, with a hint when it is a known etcd bug."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, log_path.stat().st_size - 512_000))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if '"level":"panic"' in line or '"level":"fatal"' in line:
            try:
                entry = json.loads(line)
            except ValueError:
                return line[:200]
            reason = f"{entry.get('level')}: {entry.get('msg')}: {entry.get('error', '')}".rstrip(": ")
            if "unexpected error during txn" in reason and "context canceled" in reason:
                reason += (" (etcd-io/etcd#14110, fixed in etcd 3.5.5: a read-only txn whose caller went away, "
                           "e.g. CatalogStore.read_many's 'catalog get' txn of a coordinator killed or cancelled)")
            return reason
    return ""
