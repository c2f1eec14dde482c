"""Background loops never die (meta/loops.py): what a loop meets is logged, counted and the loop goes on; a closed
etcd client stops it quietly. Real etcd."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from meta.client import connect
from meta.errors import ClientClosed
from meta.kv import MetaKV
from meta.loops import keep_running
from meta.ops.etcd_server import EtcdCluster
from meta.session import Session
from querycoord.common import metrics


def loop_errors(loop: str) -> float:
    return REGISTRY.get_sample_value("querycoord_background_loop_errors_total", {"loop": loop}) or 0.0


async def test_a_loop_that_raises_runs_again_and_each_failure_is_counted() -> None:
    metrics.install()
    before = loop_errors("test loop")
    calls: list[int] = []

    async def body() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise AssertionError("a bug")
        if len(calls) == 2:
            raise KeyError("another")

    await asyncio.wait_for(keep_running("test loop", body, first_pause=0.01), 10)
    assert calls == [0, 1, 2], "run again after each failure, until it returned"
    assert loop_errors("test loop") == before + 2


async def test_a_closed_client_stops_a_loop_and_ends_a_session_quietly(etcd: EtcdCluster, root_path: str) -> None:
    metrics.install()
    client = await connect(etcd.config())
    kv = MetaKV(client, root_path)
    session = Session(kv, "worker", "127.0.0.1:1", ttl=3)
    await session.start()
    rounds: list[int] = []

    async def poll() -> None:
        while True:
            await kv.get("anything")
            rounds.append(1)
            await asyncio.sleep(0.01)

    before = loop_errors("poll")
    loop = asyncio.create_task(keep_running("poll", poll, client=client))
    while not rounds:
        await asyncio.sleep(0.01)
    await client.close()
    await asyncio.wait_for(loop, 10)  # returns: a clean stop, nothing raised
    assert loop_errors("poll") == before, "a closed client is not an error"
    await asyncio.wait_for(session.lost.wait(), 10)
    assert session.lost_reason, "the session ends with its client: nothing keeps its lease alive any more"
    try:
        await kv.get("anything")
    except ClientClosed as exc:
        assert "the etcd client is closed" in str(exc)
    else:
        raise AssertionError("a closed client answers nothing")
    await session.close(revoke=False)
