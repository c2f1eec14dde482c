"""A coordinator on a 3-member etcd: losing the majority, and getting it back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from meta.client import EtcdClient, is_transient
from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, querycoord_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.serving.process import CoordinatorProcess
from querycoord.settings.config import CoordConfig, scaled_config


async def test_majority_down_means_not_serving_then_leadership_returns_with_quorum(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path / "etcd", size=3) as cluster:
        config = scaled_config(etcd=cluster.config(call_timeout=1.0, deadline=3.0), root="faults",
                               rpc_timeout=CoordConfig.rpc_timeout)
        proc = CoordinatorProcess(config)
        await proc.start()
        try:
            deadline = time.monotonic() + 30
            while not proc.coord.is_leader:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            leader = cluster.leader_index()
            victims = [*[i for i in range(3) if i != leader][:1], leader]  # keep one follower alive
            for i in victims:
                cluster.kill_member(i)
            lost_at = time.monotonic()
            while proc.coord.is_leader:
                assert time.monotonic() - lost_at < 30, "leadership must be given up without quorum"
                await asyncio.sleep(0.05)
            print(f"leadership given up {time.monotonic() - lost_at:.1f}s after losing the etcd majority")
            async with grpc.aio.insecure_channel(proc.address) as ch:
                stub = querycoord_pb2_grpc.QueryCoordStub(ch)
                started = time.monotonic()
                try:
                    await stub.LoadCollection(qc.LoadCollectionRequest(collection_id=1), timeout=30)
                    raise AssertionError("a coordinator without etcd must not accept a load")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    assert "not the leader" in (exc.details() or "")
                assert time.monotonic() - started < 30, "answered within its deadlines"
                show = await stub.ShowCollections(qc.ShowCollectionsRequest(), timeout=30)
                assert show.status.error_code == common_pb2.META_UNAVAILABLE
                assert "etcd unavailable" in show.status.reason
            for i in victims:
                await asyncio.to_thread(cluster.restart_member, i)
            back = time.monotonic()
            while not proc.coord.is_leader:
                assert time.monotonic() - back < 60, "leadership must come back with quorum"
                await asyncio.sleep(0.1)
            print(f"leading again {time.monotonic() - back:.1f}s after quorum returned")
        finally:
            await proc.stop()


def test_a_send_failing_in_our_grpc_core_is_transient_and_etcd_refusals_are_not() -> None:
    """etcd killed under a lease keepalive stream: our gRPC core fails the send with INTERNAL "Internal error from
    Core". That is a broken connection, not etcd's answer, so a session retries it (until its TTL) instead of
    calling itself lost at once (seen as a flake of test_session's unreachable-etcd test)."""

    def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)

    assert is_transient(rpc_error(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert is_transient(rpc_error(grpc.StatusCode.UNAVAILABLE, "Stream removed (sendmsg: Broken pipe (32))"))
    assert not is_transient(rpc_error(grpc.StatusCode.INTERNAL, "etcdserver: corrupt cluster"))
    assert not is_transient(rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided"))


async def test_an_answer_to_a_call_sent_before_etcd_failed_does_not_say_it_is_back(client: EtcdClient) -> None:
    """A call in flight when the connection failed may still be answered: that is no sign etcd is back. It logged
    "reachable again" right after "unreachable" and "unreachable" again at the next call (seen in the CLI test
    that counts those lines, once a standby's watches kept calls in flight)."""
    sent = time.monotonic()
    client.note_unreachable("the connection failed")
    try:
        client.note_reachable(sent)  # the answer to the call sent before
        assert client.unreachable_since is not None
        client.note_reachable(time.monotonic())  # a call sent afterwards
        assert client.unreachable_since is None
    finally:
        client.note_reachable()
