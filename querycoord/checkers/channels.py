"""DM channels: every target channel watched by one node of every replica, and by no other node."""

from __future__ import annotations

from collections.abc import Iterable

from proto import data_pb2
from querycoord.checkers.replicas import ReplicaView
from querycoord.checkers.scan import Scan, repair_of
from querycoord.querymeta.copies import copies


def check_channels(scan: Scan, cid: int, view: ReplicaView, tchans: Iterable[str], loaded: set[int]) -> None:
    """Every target DM channel of collection ``cid`` (``loaded``: its loaded partitions)."""
    meta = scan.meta
    pids = [] if meta.get_load_type(cid) == data_pb2.LOAD_TYPE_COLLECTION else sorted(loaded)
    for name in sorted(tchans):
        _check_channel(scan, cid, name, view.split(scan.held.channels.get((cid, name), set())), view.replicas,
                       pids)


def _check_channel(scan: Scan, cid: int, name: str, placed: tuple[dict[int, set[int]], set[int]],
                   replicas: list[int], pids: list[int]) -> None:
    """One target DM channel (``placed``: its reachable watchers by replica, and those in no replica): watched by
    one node of every replica, the one meta records when it watches (else the lowest id, then recorded); watched
    again where no node of a replica watches it (unless the recorded node did not report: unknown); and no longer
    watched by every other node, a second watcher in one replica (two nodes consuming one channel for one replica)
    or a node in no replica of the collection."""
    out = scan.out
    by_replica, strays = placed
    recorded = scan.meta.get_dm_channel(cid, name)
    watch_copies = copies(recorded) if recorded is not None else {}
    parts = list(recorded.partition_ids) if recorded is not None else pids
    extra = set(strays)
    for replica in replicas:
        node = watch_copies.get(replica, 0)
        holding = by_replica.get(replica)
        if holding:
            keep = node if node in holding else min(holding)
            extra |= holding - {keep}
            if keep != node:
                repair_of(out, cid).adopt_dm_channels.append(data_pb2.DmChannelWatchInfo(
                    collection_id=cid, dm_channel=name, node_id=keep, replica_id=replica, partition_ids=parts))
        elif node not in scan.silent:
            repair_of(out, cid).rewatch.append(data_pb2.DmChannelWatchInfo(
                collection_id=cid, dm_channel=name, node_id=node if node in scan.reachable else 0,
                replica_id=replica, partition_ids=parts))
    for n in sorted(extra):
        req = repair_of(out, cid)
        entry = next((e for e in req.release_dm_channels if e.node_id == n), None)
        if entry is None:
            entry = req.release_dm_channels.add(node_id=n)
        entry.channel_names.append(name)
