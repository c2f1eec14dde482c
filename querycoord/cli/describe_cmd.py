"""``querycoord collection describe NAME_OR_ID`` and ``querycoord segments COLLECTION``: one collection in depth.

``describe`` is kubectl's describe for a collection: what the catalog knows (id, name, schema, partitions, DM
channels, segment count) beside its load (each partition's state and in-memory %, which node of each replica
watches each DM channel, each replica's nodes and in-memory %), from DescribeCollection, the catalog's
ShowCollections, ShowCollections and GetReplicas. ``segments`` is one row per copy of each segment, as Milvus's
GetSegmentInfo answers: the coordinator asks every online query node what it holds, so a row is a copy a node
reports, with the replica that copy belongs to.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from proto import catalog_pb2, common_pb2, data_pb2
from proto import querycoord_pb2 as qc
from querycoord.cli.common import add_output_option, client_command, emit, wide
from querycoord.cli.watch import add_watch_option
from querycoord.console import draw
from querycoord.console.actions import LOAD_TYPES, check, describe, get_replicas
from querycoord.net.client import QueryCoordClient


def _clock(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _enum(enum: Any, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix) if value in enum.values() else str(value)


def partition_state(value: int) -> str:
    """``IN_MEMORY``, ``PARTIAL_IN_MEMORY``, ``NOT_PRESENT``, ...: Milvus's partition states, short."""
    return _enum(data_pb2.PartitionState, value, "PARTITION_STATE_")


def segment_state(value: int) -> str:
    """``SEALED``, ``FLUSHED``, ...: Milvus's segment states, short."""
    return _enum(data_pb2.SegmentState, value, "SEGMENT_STATE_")


def field_text(f: dict[str, Any]) -> str:
    """``vec FLOAT_VECTOR dim 128`` / ``pk INT64 primary key``."""
    return " ".join([f["name"], f["type"], *([f"dim {f['dim']}"] if f["dim"] else []),
                     *(["primary key"] if f["primary_key"] else [])])


async def _loaded(c: QueryCoordClient, collection_id: int) -> data_pb2.CollectionLoadInfo | None:
    """The collection's load as users may see it (ShowCollections); None when it is not loaded."""
    resp = await c.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[collection_id]))
    if resp.status.error_code == common_pb2.NOT_FOUND:
        return None
    return check(resp, f"show collection {collection_id}").collections[0]


async def describe_record(c: QueryCoordClient, ref: str) -> dict[str, Any]:
    """Everything ``collection describe`` shows, as ``-o json`` prints it."""
    desc = await describe(c, ref)
    cid = desc.collection_id
    cat = check(await c.catalog("ShowCollections", catalog_pb2.ShowCollectionsRequest()), "catalog show")
    summary = next((s for s in cat.collections if s.collection_id == cid), catalog_pb2.CollectionSummary())
    info = await _loaded(c, cid)
    replicas = await get_replicas(c, cid) if info is not None else None
    states = {p.partition_id: p for p in info.partitions} if info is not None else {}
    watchers: dict[str, list[dict[str, Any]]] = {name: [] for name in desc.dm_channels}
    for r in sorted(replicas or (), key=lambda r: r.replica_id):
        nodes = list(r.dm_channel_nodes)
        for i, name in enumerate(r.dm_channels):  # dm_channel_nodes is parallel (absent from older servers)
            watchers.setdefault(name, []).append(
                {"replica_id": r.replica_id, "node_id": nodes[i] if i < len(nodes) else None})
    return {
        "id": cid, "name": desc.name, "created_ms": desc.created_ms,
        "schema": {"description": desc.schema.description, "fields": [
            {"id": f.field_id, "name": f.name, "type": _enum(catalog_pb2.DataType, f.data_type, "DATA_TYPE_"),
             "primary_key": f.is_primary_key, "dim": f.dim} for f in desc.schema.fields]},
        "segments": summary.num_segments, "rows": summary.num_rows,
        "load": None if info is None else {
            "type": LOAD_TYPES.get(info.load_type, "?"), "replicas": len(replicas or ()),
            "loaded_percentage": int(info.in_memory_percentage)},
        "partitions": [{
            "id": p.partition_id, "name": p.name, "created_ms": p.created_ms,
            "state": partition_state(states[p.partition_id].state) if p.partition_id in states else None,
            "loaded_percentage": int(states[p.partition_id].in_memory_percentage) if p.partition_id in states
            else None} for p in desc.partitions],
        "dm_channels": [{"name": name, "watched_by": w} for name, w in watchers.items()],
        "replicas": None if replicas is None else draw.replica_records(replicas),
    }


def describe_lines(r: dict[str, Any], *, wide_: bool = False) -> list[str]:
    """``collection describe`` as a page: facts, then the partitions, DM channels and replicas tables."""
    load = r["load"]
    fields = r["schema"]["fields"]
    lines = [f"Name:        {r['name']}", f"ID:          {r['id']}", f"Created:     {_clock(r['created_ms'])}",
             f"Schema:      {len(fields)} field{'' if len(fields) == 1 else 's'}"
             + (": " + ", ".join(map(field_text, fields)) if fields else ""),
             f"Segments:    {r['segments']:,} sealed, {r['rows']:,} rows",
             "Load:        " + ("not loaded" if load is None else
                                f"{load['type']}, {load['replicas']} replica{'' if load['replicas'] == 1 else 's'}, "
                                f"{load['loaded_percentage']}% in memory"), ""]
    heads = ("PARTITION", "ID", "STATE", "LOADED", *(("CREATED",) if wide_ else ()))
    lines += draw.table(heads, [[p["name"], p["id"], p["state"] or "not loaded",
                                 "-" if p["loaded_percentage"] is None else f"{p['loaded_percentage']}%",
                                 *([_clock(p["created_ms"])] if wide_ else [])] for p in r["partitions"]],
                        right=(1, 3))
    replica_ids = [x["id"] for x in r["replicas"] or ()]
    rows = []
    for ch in r["dm_channels"]:
        by_replica = {w["replica_id"]: w["node_id"] for w in ch["watched_by"]}
        rows.append([ch["name"], *(_watcher(by_replica, rid) for rid in replica_ids)])
    lines += ["", *draw.table(("DM CHANNEL", *(f"REPLICA {rid}" for rid in replica_ids)), rows)]
    if r["replicas"]:
        lines += ["", *draw.table(draw.REPLICA_HEADERS, draw.replica_rows(r["replicas"]), right=(0, 2, 3, 4))]
    return lines


def _watcher(by_replica: dict[int, int | None], replica_id: int) -> str:
    """``node 3``; ``-`` when no online node of the replica watches the channel; ``?`` when the server does not
    say which node."""
    if replica_id not in by_replica:
        return "-"
    node = by_replica[replica_id]
    return "?" if node is None else (f"node {node}" if node else "-")


async def _describe(c: QueryCoordClient, args: argparse.Namespace) -> int:
    record = await describe_record(c, args.collection)
    emit(args, record, lambda: describe_lines(record, wide_=wide(args)))
    return 0


# ----- segments ---------------------------------------------------------------------------------------------------
SEGMENT_HEADERS = ("SEGMENT", "PARTITION", "NODE", "REPLICA", "SIZE", "ROWS", "STATE")
WIDE_SEGMENT_HEADERS = (*SEGMENT_HEADERS, "DM CHANNEL", "INDEXES")


def segment_ids(values: Sequence[str] | None) -> list[int]:
    """``--segments`` values (comma- or space-separated ids); ``ValueError`` naming a bad one."""
    out: list[int] = []
    for item in (x.strip() for v in values or () for x in v.split(",")):
        if not item:
            continue
        if not item.isdigit() or int(item) == 0:
            raise ValueError(f"--segments takes positive segment ids, got {item!r}")
        out.append(int(item))
    return out


def segment_records(infos: Sequence[data_pb2.SegmentInfo], names: dict[int, str]) -> list[dict[str, Any]]:
    """GetSegmentInfo's copies by segment, replica and node, as ``segments -o json`` prints them."""
    return [{"segment_id": s.segment_id, "collection_id": s.collection_id, "partition_id": s.partition_id,
             "partition": names.get(s.partition_id), "node_id": s.node_id, "replica_id": s.replica_id,
             "mem_size_bytes": s.mem_size, "num_rows": s.num_rows, "state": segment_state(s.state),
             "dm_channel": s.dm_channel, "indexes": len(s.index_infos)}
            for s in sorted(infos, key=lambda s: (s.segment_id, s.replica_id, s.node_id))]


def segment_rows(records: Sequence[dict[str, Any]], *, wide_: bool = False) -> list[list[object]]:
    return [[r["segment_id"], r["partition"] or r["partition_id"], r["node_id"], r["replica_id"],
             draw.mib(r["mem_size_bytes"]), f"{r['num_rows']:,}", r["state"],
             *([r["dm_channel"] or "-", r["indexes"]] if wide_ else [])] for r in records]


async def _segments(c: QueryCoordClient, args: argparse.Namespace) -> int:
    wanted = segment_ids(args.segments)
    desc = await describe(c, args.collection)
    resp = check(await c.query("GetSegmentInfo", qc.GetSegmentInfoRequest(
        collection_id=desc.collection_id, segment_ids=wanted)), f"segments of {desc.name}")
    records = segment_records(resp.infos, {p.partition_id: p.name for p in desc.partitions})
    not_loaded = not records and await _loaded(c, desc.collection_id) is None

    def render() -> list[str]:
        if not records:
            hint = f"; it is not loaded: `querycoord collection load {desc.name}`" if not_loaded else ""
            return [f"no online query node holds a segment of {desc.name} (id {desc.collection_id}){hint}"]
        heads = WIDE_SEGMENT_HEADERS if wide(args) else SEGMENT_HEADERS
        return draw.table(heads, segment_rows(records, wide_=wide(args)), right=(0, 2, 3, 4, 5, 8))

    emit(args, records, render)
    return 0


def add_describe_parser(csub: Any, client: list[argparse.ArgumentParser]) -> None:
    """``collection describe``, added to ``collection``'s sub-commands."""
    q = csub.add_parser("describe", parents=client,
                        help="one collection in depth: schema, partitions with their load, DM channels with the "
                             "node of each replica watching them, replicas")
    q.add_argument("collection", help="collection id or name")
    add_output_option(q)
    add_watch_option(q)
    q.set_defaults(func=client_command(_describe))


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("segments", parents=client,
                       help="each copy of a collection's segments that online query nodes hold: partition, node, "
                            "replica, size, rows, state (GetSegmentInfo)")
    p.add_argument("collection", help="collection id or name")
    p.add_argument("--segments", nargs="+", metavar="ID", help="only these segment ids (comma or space separated)")
    add_output_option(p)
    add_watch_option(p)
    p.set_defaults(func=client_command(_segments))
