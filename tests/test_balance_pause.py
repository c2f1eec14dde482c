"""Balance paused (SuspendBalance/ResumeBalance/CheckBalanceStatus): no optional move while paused, repairs still
run, and the pause outlives the leader that was told.

Facts come from the query nodes themselves (what each holds); passes are counted by the auto balancer's and the
checker's own counters, so "nothing moved" means nothing moved over several rounds that could have moved it.
"""

from __future__ import annotations

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.checkers.activation import ACTIVATION_KEY, CheckerSwitches
from querycoord.leader.switchover import call_coordinator
from querycoord.serving.coordinator_metrics import coordinator_families
from tests.cluster import MiB, QueryCluster, wait_until


def _switches(c: QueryCluster, leader) -> CheckerSwitches:
    lead = leader.coord.leadership
    assert lead is not None
    return lead.checker.switches


async def _gauge(coord, name: str) -> float:
    families = await coordinator_families(coord)
    return next(s.value for f in families for s in f.samples if s.name == name)


async def _balance_triggers(c: QueryCluster) -> list[qc.TaskTree]:
    trees = (await c.client.query("ListTasks", qc.ListTasksRequest(include_finished=True, limit=1000))).trees
    return [t for t in trees if t.trigger.kind == qc.TASK_KIND_LOAD_BALANCE]


async def test_paused_balance_moves_nothing_until_resumed(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.auto_balance_interval = 0.3
        c.config.checker_interval = 0.3
        leader = await c.start_coordinator()
        await c.wait_leader()
        first = await c.add_node(capacity=200 * MiB)
        cid = await c.create_collection("paused", partitions=1, segments=24)  # ~62 % of the first node
        await c.load_collection(cid)
        await c.wait_idle()

        paused = await c.client.query("SuspendBalance", qc.SuspendBalanceRequest())
        assert paused.status.error_code == common_pb2.SUCCESS, paused
        assert paused.paused and paused.since_ms > 0 and paused.by, paused
        again = await c.client.query("SuspendBalance", qc.SuspendBalanceRequest())  # idempotent: first since kept
        assert (again.paused, again.since_ms, again.by) == (True, paused.since_ms, paused.by)
        assert await _gauge(leader.coord, "querycoord_balance_paused") == 1

        second = await c.add_node(capacity=200 * MiB)  # empty: the spread calls for a move
        switches = _switches(c, leader)
        checker = leader.coord.leadership.checker
        rounds, runs = switches.balance_rounds, checker.runs
        await wait_until(lambda: switches.balance_rounds >= rounds + 5 and checker.runs >= runs + 3,
                         "five auto balance rounds and three checker passes while paused")
        assert not second.state.segments, "a paused balance moved segments"
        assert len(first.state.segments) == 24
        assert await _balance_triggers(c) == []

        # A user's LoadBalance still runs while paused: the operator asked for that move.
        one = sorted(first.state.segments)[0]
        moved = await c.client.query("LoadBalance", qc.LoadBalanceRequest(
            source_node_ids=[first.node_id], dst_node_ids=[second.node_id], sealed_segment_ids=[one]))
        assert moved.status.error_code == common_pb2.SUCCESS, moved
        await wait_until(lambda: set(second.state.segments) == {one} and one not in first.state.segments,
                         "the user's move, made while paused")
        await c.wait_idle()

        resumed = await c.client.query("ResumeBalance", qc.ResumeBalanceRequest())
        assert resumed.status.error_code == common_pb2.SUCCESS and not resumed.paused, resumed
        assert (resumed.since_ms, resumed.by) == (0, "")
        assert await _gauge(leader.coord, "querycoord_balance_paused") == 0
        await wait_until(lambda: len(second.state.segments) > 1, "auto balance moves segments once resumed")
        await c.wait_idle()
        a, b = set(first.state.segments), set(second.state.segments)
        assert not a & b and len(a | b) == 24, "moved, not copied"
        assert any(t.trigger.summary.startswith("balance (auto)") for t in await _balance_triggers(c))


async def test_paused_balance_still_repairs_a_lost_copy(etcd: EtcdCluster, root_path: str,
                                                         subprocess_env: dict[str, str]) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.auto_balance_interval = 0.3
        c.config.checker_interval = 0.3
        await c.start_coordinator()
        await c.wait_leader()
        survivor = await c.add_node()
        proc, ready = await c.start_node_process(env=subprocess_env)
        assert (await c.client.query("SuspendBalance", qc.SuspendBalanceRequest())).paused
        cid = await c.create_collection("lost", partitions=1, segments=30, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        meta = c.coords[0].coord.leadership.meta
        on_dead = {s.segment_id for s in meta.segments_on_node(ready["node_id"])}
        assert on_dead, "the node process got segments"
        await proc.kill()  # SIGKILL: its session lapses after the TTL; the checker repairs, balance paused or not
        await wait_until(lambda: len(survivor.state.segments) == 30 and len(survivor.state.dm_channels) == 2,
                         "the survivor holds every segment and DM channel again")
        await c.wait_idle()
        status = await c.client.query("CheckBalanceStatus", qc.CheckBalanceStatusRequest())
        assert status.paused, "the repair did not resume balance"
        assert await _balance_triggers(c) == []


async def test_pause_survives_a_leader_change_and_a_standby_reports_it(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        c.config.auto_balance_interval = 0.3
        first = await c.start_coordinator()
        await c.wait_leader()
        second = await c.start_coordinator()
        paused = await c.client.query("SuspendBalance", qc.SuspendBalanceRequest())
        assert paused.paused
        off = await c.client.query("DeactivateChecker", qc.CheckerRequest(name="releases"))
        assert off.status.error_code == common_pb2.SUCCESS and not off.checker.active, off
        assert await c.kv.get(ACTIVATION_KEY) is not None, "kept in etcd"
        cid = await c.create_collection("after", partitions=1, segments=12)  # the test's catalog is the first's

        # The standby answers the reads from etcd.
        seen = await call_coordinator(second.address, "CheckBalanceStatus", qc.CheckBalanceStatusRequest(), 10)
        assert (seen.paused, seen.since_ms, seen.by) == (True, paused.since_ms, paused.by), seen
        listed = await call_coordinator(second.address, "ListCheckers", qc.ListCheckersRequest(), 10)
        assert {i.name: i.active for i in listed.checkers}["releases"] is False
        # ... and refuses the mutations, naming the leader (clients follow it).
        try:
            await call_coordinator(second.address, "ResumeBalance", qc.ResumeBalanceRequest(), 10)
        except Exception as exc:  # grpc.aio.AioRpcError: UNAVAILABLE "the leader is at ..."
            assert first.address in str(exc), exc
        else:
            raise AssertionError("a standby resumed balance")

        await first.stop()  # resigns: the standby takes over and reads the switches at takeover
        new = await c.wait_leader()
        assert new is second
        switches = _switches(c, new)
        assert switches.balance_paused and not switches.is_active("releases")
        status = await c.client.query("CheckBalanceStatus", qc.CheckBalanceStatusRequest())
        assert (status.paused, status.since_ms, status.by) == (True, paused.since_ms, paused.by), status
        assert await _gauge(new.coord, "querycoord_balance_paused") == 1

        node = await c.add_node(capacity=200 * MiB)
        await c.load_collection(cid)
        await c.add_node(capacity=200 * MiB)
        rounds = switches.balance_rounds
        await wait_until(lambda: switches.balance_rounds >= rounds + 5, "five auto balance rounds on the new leader")
        assert len(node.state.segments) == 12, "the new leader balanced while paused"
        assert await _balance_triggers(c) == []
