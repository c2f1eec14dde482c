"""``querycoord meta show KIND``: the records of one kind, decoded, as rows (JSON-ready dicts) and a table.

Each kind is read from the snapshot with the decoders the stores use, and
joined with what an operator asks next (is the collection in the catalog, is
the node alive, does the snode exist), so a look at one kind answers whether
its records make sense.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from meta.session import SESSION_PREFIX, SessionInfo
from proto import data_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.protocol import STREAMNODE_ROLE
from querycoord.console import draw
from querycoord.querymeta.copies import copies
from querycoord.querymeta.records import collection_percentage
from querycoord.task.store import INFO_PREFIX, request_key

from .check_query import decode_catalog, decode_query_meta, live_nodes
from .check_streams import decode_streams
from .snapshot import Snapshot

Row = dict[str, Any]


def _enum(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def collections(snap: Snapshot) -> list[Row]:
    catalog, meta = decode_catalog(snap), decode_query_meta(snap)
    rows = []
    for cid in sorted(set(catalog) | set(meta.collections)):
        desc, info = catalog.get(cid), meta.collections.get(cid)
        rows.append({"collection_id": cid, "name": desc.name if desc else None, "in_catalog": cid in catalog,
                     "partitions": len(desc.partitions) if desc else None,
                     "load_type": _enum(data_pb2.LoadType, info.load_type, "LOAD_TYPE_") if info else None,
                     "in_memory_percentage": collection_percentage(info) if info else None,
                     "loaded_partitions": [p.partition_id for p in info.partitions] if info else [],
                     "released_partitions": list(info.released_partition_ids) if info else [],
                     "replicas": [{"replica_id": r.replica_id, "node_ids": sorted(r.node_ids),
                                   "in_memory_percentage": r.in_memory_percentage}
                                  for r in info.replicas] if info else []})
    return rows


def partitions(snap: Snapshot) -> list[Row]:
    catalog, meta = decode_catalog(snap), decode_query_meta(snap)
    rows: dict[tuple[int, int], Row] = {}
    for cid, desc in catalog.items():
        for p in desc.partitions if desc else ():
            rows[(cid, p.partition_id)] = {"collection_id": cid, "partition_id": p.partition_id, "name": p.name,
                                           "in_catalog": True, "state": None, "in_memory_percentage": None}
    for cid, info in meta.collections.items():
        for p in info.partitions:
            row = rows.setdefault((cid, p.partition_id), {"collection_id": cid, "partition_id": p.partition_id,
                                                          "name": None, "in_catalog": False})
            row.update(state=_enum(data_pb2.PartitionState, p.state, "PARTITION_STATE_"),
                       in_memory_percentage=p.in_memory_percentage)
    return [rows[k] for k in sorted(rows)]


def segments(snap: Snapshot) -> list[Row]:
    meta, live = decode_query_meta(snap), live_nodes(snap)
    return [{"segment_id": s.segment_id, "collection_id": s.collection_id, "partition_id": s.partition_id,
             "node_id": s.node_id, "node_live": s.node_id in live,
             "copies": [{"replica_id": r, "node_id": n, "node_live": n in live} for r, n in sorted(copies(s).items())],
             "num_rows": s.num_rows, "mem_size": s.mem_size,
             "state": _enum(data_pb2.SegmentState, s.state, "SEGMENT_STATE_"), "dm_channel": s.dm_channel}
            for s in sorted(meta.segments.values(), key=lambda s: s.segment_id)]


def channels(snap: Snapshot) -> list[Row]:
    meta, live = decode_query_meta(snap), live_nodes(snap)
    rows: list[Row] = []
    for cid, watches in sorted(meta.dm_channels.items()):
        rows += [{"collection_id": cid, "channel": name, "kind": "dm", "node_id": w.node_id,
                  "node_live": w.node_id in live, "partition_ids": list(w.partition_ids),
                  "copies": [{"replica_id": r, "node_id": n, "node_live": n in live}
                             for r, n in sorted(copies(w).items())]}
                 for name, w in sorted(watches.items())]
    for cid, deltas in sorted(meta.delta_channels.items()):
        rows += [{"collection_id": cid, "channel": name, "kind": "delta", "node_id": None, "node_live": None,
                  "partition_ids": []} for name in sorted(deltas)]
    return rows


def tasks(snap: Snapshot) -> list[Row]:
    rows = []
    for item in snap.under(INFO_PREFIX):
        try:
            rec = task_pb2.TaskRecord.FromString(item.value)
        except DecodeError:
            rows.append({"key": item.key, "task_id": None, "decodes": False})
            continue
        rows.append({"key": item.key, "task_id": rec.id, "parent_id": rec.parent_id, "decodes": True,
                     "kind": draw.kind_name(rec.kind), "state": _enum(qc.TaskState, rec.state, "TASK_STATE_"),
                     "collection_id": rec.collection_id, "node_id": rec.node_id,
                     "trigger_condition": draw.CONDITION_NAMES.get(rec.trigger_condition, ""),
                     "retry_count": rec.retry_count, "replaces_task_id": rec.replaces_task_id, "error": rec.error,
                     "has_request": snap.get(request_key(rec)) is not None})
    return sorted(rows, key=lambda r: (r["task_id"] or 0, r["key"]))


def sessions(snap: Snapshot) -> list[Row]:
    rows = []
    for item in snap.under(SESSION_PREFIX):
        info = SessionInfo.parse(item.key, item.value)
        rows.append({"key": item.key, "role": info.role if info else None,
                     "server_id": info.server_id if info else None, "address": info.address if info else None,
                     "lease": f"{item.lease:x}", "valid": info is not None, "extra": info.extra if info else {}})
    return rows


def streams(snap: Snapshot) -> list[Row]:
    defs, snodes = decode_streams(snap)
    return [{"stream_id": s.id, "name": s.name, "source_db": s.source_db, "vgroups": list(s.source_vgroup_ids),
             "main_snode_id": s.main_snode_id, "snode_exists": s.main_snode_id in snodes,
             "stopped": s.user_stopped, "runner_deploys": s.runner_deploys} for _, s in sorted(defs.items())]


def snodes(snap: Snapshot) -> list[Row]:
    defs, nodes = decode_streams(snap)
    live = live_nodes(snap, STREAMNODE_ROLE)
    return [{"snode_id": s.id, "node_id": s.node_id, "node_live": s.node_id in live, "replica_id": s.replica_id,
             "dropping": s.dropping, "streams": sum(1 for d in defs.values() if d.main_snode_id == s.id)}
            for _, s in sorted(nodes.items())]


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, list):
        return ",".join(map(str, v)) or "-"
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items()) or "-"
    return str(v)


def _copies_cell(row: Row) -> str:
    """Every node holding a copy of the segment or channel, with its replica and whether the node has a session:
    ``3 (replica 1), 5 (replica 2, no session)``; the record's node when it names no replica."""
    held = row.get("copies") or ([] if row.get("node_id") is None else
                                 [{"replica_id": 0, "node_id": row["node_id"], "node_live": row["node_live"]}])
    cells = []
    for c in held:
        notes = ([f"replica {c['replica_id']}"] if c["replica_id"] else []) + ([] if c["node_live"] else
                                                                                 ["no session"])
        cells.append(f"{c['node_id']}" + (f" ({', '.join(notes)})" if notes else ""))
    return ", ".join(cells) or "-"


# Table columns drawn from a whole row rather than one field.
_DERIVED: dict[str, Callable[[Row], str]] = {"copies": _copies_cell}

# kind -> (rows, columns shown in the table: (header, field)); -o json prints every field.
KINDS: dict[str, tuple[Callable[[Snapshot], list[Row]], tuple[tuple[str, str], ...]]] = {
    "collections": (collections, (("ID", "collection_id"), ("NAME", "name"), ("IN CATALOG", "in_catalog"),
                                  ("PARTITIONS", "partitions"), ("LOADED", "load_type"),
                                  ("IN MEMORY %", "in_memory_percentage"), ("RELEASED", "released_partitions"))),
    "partitions": (partitions, (("COLLECTION", "collection_id"), ("PARTITION", "partition_id"), ("NAME", "name"),
                                ("IN CATALOG", "in_catalog"), ("STATE", "state"),
                                ("IN MEMORY %", "in_memory_percentage"))),
    "segments": (segments, (("SEGMENT", "segment_id"), ("COLLECTION", "collection_id"),
                            ("PARTITION", "partition_id"), ("ROWS", "num_rows"), ("STATE", "state"),
                            ("NODES", "copies"))),
    "channels": (channels, (("COLLECTION", "collection_id"), ("CHANNEL", "channel"), ("KIND", "kind"),
                            ("NODES", "copies"))),
    "tasks": (tasks, (("ID", "task_id"), ("PARENT", "parent_id"), ("KIND", "kind"), ("STATE", "state"),
                      ("COLLECTION", "collection_id"), ("NODE", "node_id"), ("RETRIES", "retry_count"),
                      ("REQUEST", "has_request"), ("ERROR", "error"))),
    "sessions": (sessions, (("KEY", "key"), ("ROLE", "role"), ("ID", "server_id"), ("ADDRESS", "address"),
                            ("LEASE", "lease"), ("EXTRA", "extra"))),
    "streams": (streams, (("ID", "stream_id"), ("NAME", "name"), ("DB", "source_db"), ("VGROUPS", "vgroups"),
                          ("SNODE", "main_snode_id"), ("SNODE EXISTS", "snode_exists"), ("STOPPED", "stopped"))),
    "snodes": (snodes, (("ID", "snode_id"), ("NODE", "node_id"), ("NODE LIVE", "node_live"),
                        ("REPLICA", "replica_id"), ("DROPPING", "dropping"), ("STREAMS", "streams"))),
}


def show(snap: Snapshot, kind: str) -> list[Row]:
    """The rows of ``kind`` (one of ``KINDS``)."""
    return KINDS[kind][0](snap)


def render(kind: str, rows: list[Row], root: str, revision: int) -> list[str]:
    columns = KINDS[kind][1]
    lines = [f"{kind} under {root} at revision {revision}: {len(rows)}"]  # the count of records
    if rows:
        lines += draw.table([h for h, _ in columns],
                            ([_DERIVED[f](r) if f in _DERIVED else _cell(r.get(f)) for _, f in columns]
                             for r in rows))
    return lines


__all__ = ["KINDS", "render", "show"]
