"""A query node PROCESS stopped by a real SIGTERM is drained first, and is ACTIVE again when it registers again.

Real etcd, a real coordinator, a real query node process (signalled) beside an in-process query node.
"""

from __future__ import annotations

import signal

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.cluster.lifecycle import GRACEFUL_STOP, OPERATOR
from querycoord.leader.view import Leadership
from tests.cluster import QueryCluster, wait_until

NODE_ID = 5150


async def test_sigterm_drains_before_exit_and_restart_is_active(etcd: EtcdCluster, root_path: str,
                                                                   tmp_path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        leader = await c.start_coordinator()
        await c.wait_leader()
        proc, _ = await c.start_node_process("--node-id", str(NODE_ID), "--graceful-stop-timeout", "60",
                                             log_dir=tmp_path)
        cid = await c.create_collection("kept", partitions=1, segments=12, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = leader.coord.leadership
        assert lead is not None and lead.lifecycles is not None
        lifecycles = lead.lifecycles
        segments = set(lead.meta.segment_ids_of(cid))
        assert {s.segment_id for s in lead.meta.segments_on_node(NODE_ID)} == segments, "all on the process node"

        other = await c.add_node()
        drained_while_online: list[bool] = []

        def drained(lead: Leadership) -> bool:
            if lifecycles.state(NODE_ID) == qc.NODE_LIFECYCLE_DRAINED:
                drained_while_online.append(lead.nodes.is_online(NODE_ID))
                return True
            return False

        assert proc.signal(signal.SIGTERM)
        await wait_until(lambda: drained(lead), "the stopping node was drained", timeout=90)
        assert drained_while_online == [True], "drained while its process still ran"
        # Drained means: the other node holds every segment and channel, and the stopping one nothing.
        assert segments <= set(other.state.segments) and len(other.state.dm_channels) == 2
        assert lifecycles.get(NODE_ID) is not None and lifecycles.get(NODE_ID).reason == GRACEFUL_STOP
        assert await proc.wait(60) == 0, proc.tail()
        assert segments <= set(other.state.segments)

        # Started again under its id: ACTIVE (a rolling restart is a non-event).
        again, _ = await c.start_node_process("--node-id", str(NODE_ID), "--graceful-stop-timeout", "0",
                                              log_dir=tmp_path)
        await wait_until(lambda: lifecycles.state(NODE_ID) == qc.NODE_LIFECYCLE_ACTIVE, "active again", timeout=60)

        # An operator's drain stays across a restart; a SIGTERM with a 0 timeout stops at once.
        assert c.client is not None
        r = await c.client.query("DrainNode", qc.NodeLifecycleRequest(node_id=NODE_ID))
        assert r.node.lifecycle in (qc.NODE_LIFECYCLE_DRAINING, qc.NODE_LIFECYCLE_DRAINED)
        await wait_until(lambda: lifecycles.state(NODE_ID) == qc.NODE_LIFECYCLE_DRAINED, "operator drain done")
        assert again.signal(signal.SIGTERM)
        assert await again.wait(30) == 0
        third, _ = await c.start_node_process("--node-id", str(NODE_ID), log_dir=tmp_path)
        lead.checker.kick()
        await c.wait_idle()
        assert lifecycles.state(NODE_ID) == qc.NODE_LIFECYCLE_DRAINED and lifecycles.get(NODE_ID).reason == OPERATOR
        await third.kill()


async def test_sigterm_without_a_leader_stops_after_the_timeout(etcd: EtcdCluster, root_path: str,
                                                                tmp_path) -> None:
    async with QueryCluster(etcd, root_path) as c:
        leader = await c.start_coordinator()
        await c.wait_leader()
        proc, _ = await c.start_node_process("--graceful-stop-timeout", "2", log_dir=tmp_path)
        await leader.stop()
        assert proc.signal(signal.SIGTERM)
        assert await proc.wait(30) == 0, proc.tail()
        assert "stops before it is drained" in proc.tail(200)
