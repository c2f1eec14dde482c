"""A leader change adopts every task as deployed: every field of every task, calc readers' scan plans included.

Reports that leave identity fields out are completed from the stream's definition, a report that does not fit the
definition is not adopted, and a reader redeployed after adoption keeps its scan plan. The nodes are the reference
stream node's state machine under real sessions (``tests.real_stream_nodes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from meta.kv import MetaKV
from querycoord.stream.manager import StreamManager
from querycoord.stream.runtime import ManagerState
from querycoord.stream.store import StreamStore
from tests.real_stream_nodes import (
    TWO_NODES,
    RealNode,
    create_req,
    create_streams,
    manager,
    node_by_id,
    real_nodes,
    run_until,
    running,
    sp,
    tasks_of,
)
from tests.streams import Clock


async def adopt_after_leader_change(
    store: StreamStore, kv: MetaKV, clock: Clock, nodes: list[RealNode],
    edit: Callable[[sp.HeartbeatRequest], None] | None = None,
) -> tuple[StreamManager, dict[tuple[int, int], tuple[Any, int]]]:
    """Streams deployed by one leader, then adopted by the next; returns the new manager and the deployed tasks."""
    old = await manager(store, kv, clock)
    await run_until(old, nodes, clock, lambda: running(old))
    deployed = tasks_of(old)
    mgr = await manager(store, kv, clock, revision=200)
    for _ in range(max(n.state.groups for n in nodes)):  # WATCH ends once every node reported every group
        for n in nodes:
            await n.beat(mgr, clock, edit=edit)
    assert mgr.state is ManagerState.NORMAL
    return mgr, deployed


def assert_same_tasks(mgr: StreamManager, deployed: dict[tuple[int, int], tuple[Any, int]],
                      nodes: list[RealNode]) -> None:
    adopted = tasks_of(mgr)
    assert adopted.keys() == deployed.keys()
    for key, (task, node) in deployed.items():
        assert adopted[key] == (task, node), f"task {key}: adopted {adopted[key]}, deployed {(task, node)}"
        # And what the node holds: every TaskId field of the deploy message.
        info = node_by_id(nodes, node).state.tasks[key].info
        assert task.to_proto(key[0], node) == info


async def test_adoption_restores_every_field_of_every_task(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with real_nodes(kv, [([1, 2], True), ([3, 4], True)], groups=2) as nodes:
        snodes = [n.state.snode_id for n in nodes]
        await create_streams(store, nodes, 3, source_vgroup_ids=[1, 2, 3, 4], num_calc_scan_plans=3,
                             num_calc_subplans=3)
        await store.create_stream(create_req("by-table", trigger_vgroup_id=3), snodes)
        await store.create_stream(create_req("no-calc", num_calc_scan_plans=0, num_calc_subplans=0), snodes)
        mgr, deployed = await adopt_after_leader_change(store, kv, clock, nodes)
        assert mgr.adopted == 5
        assert {task.scan_plan_idx for task, _ in deployed.values()} == {0, 1, 2}
        assert_same_tasks(mgr, deployed, nodes)
        assert mgr.redeploys == 0


async def test_reports_without_identity_fields_are_restored_from_the_definition(
    store: StreamStore, kv: MetaKV
) -> None:
    """An older node reports no scan plan and no top flag: the leader recomputes them from the persisted stream."""
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        await create_streams(store, nodes, 2)

        def older_node(req: sp.HeartbeatRequest) -> None:
            for rep in req.tasks:
                rep.ClearField("scan_plan_idx")
                rep.ClearField("top")

        mgr, deployed = await adopt_after_leader_change(store, kv, clock, nodes, edit=older_node)
        assert_same_tasks(mgr, deployed, nodes)


@pytest.mark.parametrize("misfit", ["vgroup", "scan_plan"])
async def test_report_that_does_not_fit_the_definition_is_not_adopted(
    store: StreamStore, kv: MetaKV, misfit: str
) -> None:
    """A calc reader reported on another vgroup, or with another scan plan, than its slot in the persisted
    definition is not the task that was planned: its stream is stopped and redeployed instead of adopted."""
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        sdefs = await create_streams(store, nodes, 2)
        bad = sdefs[0].id

        def wrong(req: sp.HeartbeatRequest) -> None:
            for rep in req.tasks:
                if rep.stream_id == bad and rep.kind == sp.CALC_READER and rep.task_idx == 0:
                    if misfit == "vgroup":
                        rep.vgroup_id = 3  # slot 0 reads vgroup 1
                    else:
                        rep.scan_plan_idx = 1  # slot 0 is scan plan 0

        mgr, _ = await adopt_after_leader_change(store, kv, clock, nodes, edit=wrong)
        assert mgr.adopted == 1 and mgr.streams[bad].error_stopped  # stopped, then redeployed afresh
        await run_until(mgr, nodes, clock, lambda: running(mgr))


async def test_reader_redeployed_after_adoption_keeps_its_scan_plan(store: StreamStore, kv: MetaKV) -> None:
    clock = Clock()
    async with real_nodes(kv, TWO_NODES) as nodes:
        await create_streams(store, nodes, 1)
        mgr, deployed = await adopt_after_leader_change(store, kv, clock, nodes)
        (key, (task, node_id)) = next((k, v) for k, v in sorted(deployed.items())
                                      if v[0].kind == sp.CALC_READER and v[0].scan_plan_idx == 2)
        node = node_by_id(nodes, node_id)
        node.state.fail_task(key[1], "scan failed")
        await run_until(mgr, nodes, clock, lambda: running(mgr) and node.state.tasks[key].info.sid == task.sid + 1,
                        what="the failed reader redeployed")
        info = node.state.tasks[key].info
        assert (info.scan_plan_idx, info.vgroup_id, info.task_idx) == (2, task.vgroup_id, task.task_idx)
        assert mgr.streams[key[0]].tasks[key[1]].task.scan_plan_idx == 2
