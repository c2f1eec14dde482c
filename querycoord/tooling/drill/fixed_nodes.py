"""What the drills that restart query nodes under fixed ids share: starting them, reading them, the catalog.

The restart and rolling drills start query node ``index`` as node ``FIRST_NODE_ID + index`` and, after a stop,
start it again under the same id on the same address (``start_fixed_node``). They judge from what each node
process reports itself, asked directly at its own address (``DirectReads``), never from the coordinator's
belief; they create their collections straight in the catalog (``create_collections``) and read the task
history from the leader (``finished_trees``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import grpc

from meta.client import connect
from meta.config import EtcdConfig
from meta.kv import MetaKV
from proto import common_pb2, querynode_pb2, querynode_pb2_grpc
from proto import querycoord_pb2 as qc
from querycoord.catalog.store import CatalogStore
from querycoord.net.client import QueryCoordClient
from querycoord.security.grpc_channels import make_channel
from querycoord.tooling.drill.base import DrillSetupError
from querycoord.tooling.drill.restart_judge import Holding, Target
from querycoord.tooling.harness import QUERY_NODE, Harness, Member, StartError

FIRST_NODE_ID = 101  # fixed node ids: 101, 102, ...
SILENT = "silent"  # a node that runs but did not answer in time: what it holds is unknown


async def start_fixed_node(cluster: Harness, index: int, *, member: Member | None = None, capacity_mb: float = 65536,
                           graceful_stop_timeout: float = 0.0, say: Callable[[str], None] = print) -> Member:
    """Query node ``index`` under its fixed id, on its old address when it had one (else any free port); on
    SIGTERM it drains itself for at most ``graceful_stop_timeout`` seconds (0: it stops at once)."""
    listen = member.ready.get("listen_address", "127.0.0.1:0") if member is not None else "127.0.0.1:0"
    flags = ["--node-id", str(FIRST_NODE_ID + index), "--capacity-mb", f"{capacity_mb:g}", "--graceful-stop-timeout",
             f"{graceful_stop_timeout:g}"]
    try:
        return await cluster.start_node(QUERY_NODE, index, *flags, "--listen", listen, member=member)
    except StartError:
        if listen.endswith(":0"):
            raise
        say(f"query node {FIRST_NODE_ID + index} did not start on {listen}; on another port")
        return await cluster.start_node(QUERY_NODE, index, *flags, "--listen", "127.0.0.1:0", member=member)


async def create_collections(etcd: EtcdConfig, root: str, specs: Sequence[tuple[str, int, int]], *, partitions: int,
                             channels: int) -> dict[int, Target]:
    """Collections ``(name, segments, replicas)`` in the catalog under ``root``, with small accounted sizes
    (1,000 rows of 8 dimensions a segment: these drills are about processes, not capacity); id -> target."""
    kv = MetaKV(await connect(etcd), root)
    targets: dict[int, Target] = {}
    try:
        catalog = CatalogStore(kv)
        for name, n, replicas in specs:
            desc, ids = await catalog.create_bulk_collection(
                name, num_partitions=partitions, num_segments=n, num_channels=channels, rows_per_segment=1000, dim=8)
            targets[desc.collection_id] = Target(frozenset(ids), frozenset(desc.dm_channels), replicas)
    finally:
        with contextlib.suppress(Exception):
            await kv.client.close()
    return targets


class DirectReads:
    """One gRPC channel per process, and what a query node process reports holding (module docstring)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._channels: dict[str, tuple[int, grpc.aio.Channel]] = {}
        self._closing: list[asyncio.Task[None]] = []  # closes of the channels of processes since replaced

    def channel(self, member: Member, address: str) -> grpc.aio.Channel:
        """The channel to ``member``'s current process: a channel that met a dead process backs off for seconds,
        and would not see the next process on that address in time (that node would look empty)."""
        pid, ch = self._channels.get(address, (0, None))
        if ch is None or pid != member.child.pid:
            if ch is not None:
                self._closing.append(asyncio.create_task(ch.close()))
            # Its own subchannels: gRPC shares them between channels to one address by default, and the back-off
            # of one that met the dead process (seconds, growing) would hold the new channel too.
            ch = make_channel(address, options=(("grpc.use_local_subchannel_pool", 1),))
            self._channels[address] = (member.child.pid, ch)
        return ch

    async def holding(self, node: Member) -> Holding | str:
        """What ``node`` reports holding; ``SILENT`` when it runs but did not answer in time, "" when it holds
        nothing by construction (not running, not serving)."""
        if not node.running:
            return ""
        address = str(node.ready.get("listen_address") or node.address)
        stub = querynode_pb2_grpc.QueryNodeStub(self.channel(node, address))
        try:
            d = await stub.GetDataDistribution(querynode_pb2.GetDataDistributionRequest(segment_ids_only=True),
                                               timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            return SILENT if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else ""
        if d.status.error_code != common_pb2.SUCCESS:
            return ""
        segments: dict[int, set[int]] = {}
        for g in d.segment_groups:
            segments.setdefault(g.collection_id, set()).update(g.segment_ids)
        for s in d.segments:  # a node that predates segment_ids_only
            segments.setdefault(s.collection_id, set()).add(s.segment_id)
        channels: dict[int, set[str]] = {}
        for c in d.channels:
            if c.kind == querynode_pb2.CHANNEL_KIND_DM:
                channels.setdefault(c.collection_id, set()).add(c.channel_name)
        return Holding({k: frozenset(v) for k, v in segments.items()}, {k: frozenset(v) for k, v in channels.items()})

    async def close(self) -> None:
        for _, ch in self._channels.values():
            with contextlib.suppress(Exception):
                await ch.close()
        await asyncio.gather(*self._closing, return_exceptions=True)


async def finished_trees(client: QueryCoordClient, *, after: int = 0, children: bool = False,
                         max_pages: int = 1000) -> AsyncIterator[qc.TaskTree]:
    """The task history (and running trees) past trigger id ``after``, in id order, page by page, with every
    child its record kept when ``children``; the client's errors propagate."""
    for _ in range(max_pages):
        page = await client.query("ListTasks", qc.ListTasksRequest(
            include_finished=True, limit=500, after_task_id=after, include_children=children,
            children_limit=0 if children else 1))
        for t in page.trees:
            yield t
        after = page.next_after_task_id
        if not after:
            return


async def load_targets(client: QueryCoordClient, targets: Mapping[int, Target]) -> None:
    """LoadCollection of every target collection with its replica number; ``DrillSetupError`` on a refusal."""
    for cid, target in targets.items():
        resp = await client.query("LoadCollection", qc.LoadCollectionRequest(collection_id=cid,
                                                                             replica_number=target.replicas))
        if resp.status.error_code != common_pb2.SUCCESS:
            raise DrillSetupError(f"LoadCollection {cid}: {common_pb2.ErrorCode.Name(resp.status.error_code)} "
                                  f"{resp.status.reason}")


def failed_text(t: qc.TaskTree) -> str:
    """A FAILED trigger of the task history, on one line."""
    return (f"{t.trigger.task_id} {t.trigger.summary}: {common_pb2.ErrorCode.Name(t.trigger.error_code)} "
            f"{t.trigger.error[:200]}")


def new_exits(members: Sequence[Member], seen: set[int]) -> list[Member]:
    """Members whose process exited without the drill stopping it (``state`` not "dead"), each process once."""
    out = []
    for m in members:
        if not m.running and m.state != "dead" and id(m.child) not in seen:
            seen.add(id(m.child))
            out.append(m)
    return out


def exit_text(m: Member) -> str:
    return f"{m.child.name} (code {m.child.proc.returncode}; see {m.child.log_path})"


__all__ = ["FIRST_NODE_ID", "SILENT", "DirectReads", "create_collections", "exit_text", "failed_text",
           "finished_trees", "load_targets", "new_exits", "start_fixed_node"]
