"""A node credential cannot fill etcd through its session key: the leader fences a session too large or too busy.

Against the real etcd: a node (its own credential in ``test_etcd_roles``;
here the leader of a real in-process cluster) rewrites its session key with a
value far beyond any session, or rewrites it many times a minute. The
leader's guard revokes the session's lease (the node goes offline and is
forgotten), counts it in ``querycoord_nodes_fenced_total{reason}``, refuses
the node's new sessions for the quarantine, and goes on writing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from prometheus_client import REGISTRY

from meta.kv import MetaKV
from meta.session import MAX_SESSION_VALUE_BYTES, Session, SessionInfo, session_key
from meta.session_guard import VALUE_SIZE, WRITE_RATE, GuardLimits, SessionGuard
from querycoord.cluster.nodes import NodeManager
from tests.cluster import running_cluster


async def until(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


def fenced_count(reason: str) -> float:
    return REGISTRY.get_sample_value("querycoord_nodes_fenced_total", {"reason": reason}) or 0.0


async def test_leader_fences_a_node_that_writes_a_huge_session_and_keeps_writing(etcd, root_path: str) -> None:
    before = fenced_count(VALUE_SIZE)
    async with running_cluster(etcd, root_path, [None]) as c:
        node = c.nodes[0]
        nid = node.state.node_id
        await c.wait_node_online(nid)
        session = node.session
        assert session is not None and c.kv is not None
        # What a node credential may do: rewrite its own key, under its own lease, with 1 MiB.
        await c.kv.save(session_key("querynode", nid), b"x" * (1 << 20), lease=session.lease_id)
        await until("the node's session ends", session.lost.is_set)
        lead = (await c.wait_leader()).coord.leadership
        assert lead is not None
        await until("the leader takes the node offline", lambda: not lead.nodes.is_online(nid))
        assert fenced_count(VALUE_SIZE) == before + 1
        # The leader still writes: a collection is created and its meta saved.
        cid = await c.create_collection("after_fence", partitions=1, segments=2)
        assert cid > 0
        await lead.kv.save("probe/after-fence", b"ok")
        # A new session under the fenced id inside the quarantine ends at once and is never taken online.
        again = Session(c.kv, "querynode", node.address, ttl=2, server_id=nid)
        await again.start()
        await until("the new session is revoked too", again.lost.is_set)
        assert not lead.nodes.is_online(nid)
        assert fenced_count(VALUE_SIZE) == before + 1  # one fencing, one count


async def test_a_session_rewritten_too_often_is_fenced_and_dropped(kv: MetaKV) -> None:
    nodes = NodeManager(kv)
    guard = SessionGuard(kv, ["querynode"], GuardLimits(max_writes=5, window=60.0))
    nodes.refuse = lambda n: guard.refused(session_key("querynode", n))
    await nodes.start()
    try:
        async with guard:
            async with Session(kv, "querynode", "127.0.0.1:7001", ttl=2, server_id=31) as session:
                await until("online", lambda: nodes.is_online(31))
                value = SessionInfo(31, "querynode", "127.0.0.1:7001", {}).to_json()
                for _ in range(12):
                    try:
                        await kv.save(session_key("querynode", 31), value, lease=session.lease_id)
                    except grpc.aio.AioRpcError as exc:  # the guard revoked the lease: etcd knows it no more
                        assert exc.code() is grpc.StatusCode.NOT_FOUND, exc
                        break
                await until("the session ends", session.lost.is_set)
                await until("the node is dropped", lambda: not nodes.is_online(31))
            assert guard.fenced[WRITE_RATE] == 1 and guard.fenced[VALUE_SIZE] == 0
            assert guard.refused(session_key("querynode", 31)) and not guard.refused(session_key("querynode", 32))
            # Another node writing its session once is left alone.
            async with Session(kv, "querynode", "127.0.0.1:7002", ttl=2, server_id=32) as other:
                await until("the other node is online", lambda: nodes.is_online(32))
                assert not other.lost.is_set()
    finally:
        await nodes.stop()


async def test_a_lease_less_session_key_is_deleted_and_a_huge_one_never_parsed(kv: MetaKV) -> None:
    huge = b'{"ServerID": 5, "ServerName": "querynode", "Address": "h:1", "Extra": {"pad": "' + b"y" * 100_000 + b'"}}'
    assert SessionInfo.parse(session_key("querynode", 5), huge) is None  # valid JSON, but never parsed
    async with SessionGuard(kv, ["querynode"]) as guard:
        await asyncio.sleep(0.3)  # the guard's first read is done; the write below comes as an event
        await kv.save(session_key("querynode", 5), b"z" * (MAX_SESSION_VALUE_BYTES + 1))
        deadline = time.monotonic() + 30
        while await kv.get(session_key("querynode", 5)) is not None:
            assert time.monotonic() < deadline, "the lease-less key was never deleted"
            await asyncio.sleep(0.05)
        assert guard.fenced[VALUE_SIZE] == 1


@pytest.mark.parametrize("limits", [GuardLimits(max_value_bytes=0), GuardLimits(max_value_bytes=1 << 20),
                                    GuardLimits(max_writes=1), GuardLimits(window=float("nan")),
                                    GuardLimits(quarantine=float("inf"))])
def test_limits_that_cannot_work_are_refused(limits: GuardLimits) -> None:
    with pytest.raises(ValueError, match="session"):
        limits.check()
