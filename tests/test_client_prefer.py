"""A client told where the leader is stays there: a standby answers some reads itself (without tasks or live
figures), so a caller that names the leader before each read must get the leader's answer every time."""

from __future__ import annotations

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, stream_pb2
from tests.cluster import QueryCluster


async def test_preferring_the_leader_again_stays_on_the_leader(etcd: EtcdCluster, root_path: str) -> None:
    async with QueryCluster(etcd, root_path) as c:
        first = await c.start_coordinator()
        leader = await c.wait_leader()
        assert leader is first
        await c.start_coordinator()  # a standby, second in the client's addresses
        assert c.client is not None
        for _ in range(4):
            c.client.prefer(leader.address)
            assert c.client.current == leader.address
            show = await c.client.stream("ShowStreams", stream_pb2.ShowStreamsRequest(with_tasks=True))
            assert show.status.error_code == common_pb2.SUCCESS
            assert "persisted streams only" not in show.status.reason, "a standby answered"
