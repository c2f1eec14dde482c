"""Client side of resizing replicas: UpdateLoadConfig, and following a resize to its end.

A resize's progress is that of its new replicas (GetReplicas: the lowest replica percentage, the old replicas
being whole); a shrink has none to show and ends when its nodes have released the dropped replicas.
"""

from __future__ import annotations

import asyncio

from proto import catalog_pb2, common_pb2
from proto import querycoord_pb2 as qc
from querycoord.console import draw
from querycoord.console.actions import POLL_INTERVAL, Refusal, check, get_replicas
from querycoord.net.client import QueryCoordClient

RESIZE = qc.TASK_KIND_UPDATE_LOAD_CONFIG


async def update_load_config(c: QueryCoordClient, desc: catalog_pb2.CollectionDescription, replicas: int) -> int:
    """UpdateLoadConfig of one collection; the resize's task id (0: it already has that number)."""
    req = qc.UpdateLoadConfigRequest(collection_ids=[desc.collection_id], replica_number=replicas)
    return int(check(await c.query("UpdateLoadConfig", req), f"resize {desc.name}").task_id)


async def task_summary(c: QueryCoordClient, task_id: int) -> tuple[int, str]:
    """The kind and summary of a trigger (queued, running or finished)."""
    got = check(await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=1)), f"task {task_id}")
    return got.tree.trigger.kind, got.tree.trigger.summary


async def follow_resize(c: QueryCoordClient, collection_id: int, task_id: int,
                        bar: draw.ProgressBar | None = None) -> int:
    """Poll until the resize task ends; its replicas' count once done. A failed or cancelled resize is a
    ``Refusal`` with its error."""
    while True:
        replicas = await get_replicas(c, collection_id)
        if replicas and bar is not None:
            bar.update(int(min(r.in_memory_percentage for r in replicas)), f"task #{task_id}")
        got = await c.query("GetTask", qc.GetTaskRequest(task_id=task_id, children_limit=1))
        if got.status.error_code == common_pb2.SUCCESS:
            trig = got.tree.trigger
            if trig.state == qc.TASK_STATE_FAILED:
                raise Refusal(f"resize task #{task_id} failed: {trig.error}", trig.error_code)
            if trig.state == qc.TASK_STATE_EXPIRED:
                done = await get_replicas(c, collection_id)
                if done is None:
                    raise Refusal(f"resize task #{task_id} ended but collection {collection_id} is not loaded "
                                  "(released meanwhile?)", common_pb2.NOT_FOUND)
                if bar is not None:
                    bar.update(100, f"task #{task_id}")
                return len(done)
        elif got.status.error_code != common_pb2.NOT_FOUND:
            check(got, f"task {task_id}")
        await asyncio.sleep(POLL_INTERVAL)
