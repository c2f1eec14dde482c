"""Records and text of CheckHealth and Explain answers: ``querycoord health``, ``querycoord explain``, the status page.

Records (``-o json``, the status page's snapshot) carry names for enums and every number as it is; the text is
drawn from the records, so what a script reads and what a person reads never differ. Nothing here talks to the
network; times are drawn relative to a ``now`` the caller gives (tests draw the README's examples with a fixed
one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proto import querycoord_pb2 as qc
from querycoord.console.draw import mib, span, table

HEALTH_NAMES: dict[int, str] = {qc.HEALTH_STATE_GREEN: "green", qc.HEALTH_STATE_YELLOW: "yellow",
                                qc.HEALTH_STATE_RED: "red"}
HEALTH_ORDER = ("green", "yellow", "red")
# An explain reason in records (``-o json``) and in words.
REASON_WORDS = {"trigger": "task", "retrying": "retrying", "no_node": "no node", "no_room": "no room",
                "waiting_for_node": "waiting for a node", "checker": "checker"}
HEALTH_HEADERS = ("ID", "NAME", "HEALTH", "LOADED", "WHOLE")
# Segment ids drawn per replica by `explain` (-o json carries every id the answer listed).
DRAWN_SEGMENTS = 10


def health_name(state: int) -> str:
    return HEALTH_NAMES.get(state, "unknown")


# ----- health ---------------------------------------------------------------------------------------------------
def health_record(resp: qc.CheckHealthResponse) -> dict[str, Any]:
    """CheckHealth as ``querycoord health -o json`` prints it."""
    return {"state": health_name(resp.state), "collections": [collection_health_record(c) for c in resp.collections]}


def collection_health_record(c: qc.CollectionHealth) -> dict[str, Any]:
    return {
        "id": c.collection_id, "name": c.name, "health": health_name(c.state), "loaded_percentage": c.percentage,
        "unserved_segments": c.unserved_segments, "unserved_dm_channels": c.unserved_channels,
        "missing": c.missing,
        "replicas": [{"id": r.replica_id, "loaded_percentage": r.percentage, "whole": r.whole,
                      "segments": r.segments, "missing_segments": r.missing_segments, "dm_channels": r.channels,
                      "missing_dm_channels": list(r.missing_channels), "node_ids": list(r.online_node_ids),
                      "offline_node_ids": list(r.offline_node_ids)} for r in c.replicas],
    }


def health_lines(record: dict[str, Any]) -> list[str]:
    """The table of ``querycoord health`` (WHOLE: replicas whole of all), what each collection that is not green
    lacks, and the count by health."""
    collections = record["collections"]
    if not collections:
        return ["no collection is loaded: nothing to be unhealthy"]
    rows = [[c["id"], c["name"] or "?", c["health"], f"{c['loaded_percentage']}%",
             f"{sum(r['whole'] for r in c['replicas'])}/{len(c['replicas'])}"] for c in collections]
    lacks = [f"{c['name'] or '?'} (id {c['id']}): {c['missing']}" for c in collections if c["missing"]]
    by = {h: sum(c["health"] == h for c in collections) for h in HEALTH_ORDER}
    total = f"{len(collections)} collection{'s' if len(collections) > 1 else ''}: " + \
        ", ".join(f"{n} {h}" for h, n in by.items())
    why = "; `querycoord explain NAME` says why and what happens next" if lacks else ""
    return [*table(HEALTH_HEADERS, rows, right=(0, 3, 4)), "", *lacks, total + why]


# ----- explain --------------------------------------------------------------------------------------------------
def explain_record(resp: qc.ExplainResponse) -> dict[str, Any]:
    """Explain as ``querycoord explain -o json`` prints it."""
    return {"id": resp.collection_id, "name": resp.name, "health": health_name(resp.state),
            "replicas": [unit_record(u) for u in resp.units]}


def unit_record(u: qc.ExplainUnit) -> dict[str, Any]:
    return {
        "id": u.replica_id, "missing_segments": u.missing_segments, "segment_ids": list(u.segment_ids),
        "missing_dm_channels": list(u.missing_channels), "node_ids": list(u.online_node_ids),
        "offline_node_ids": list(u.offline_node_ids),
        "reason": qc.ExplainReason.Name(u.reason).removeprefix("EXPLAIN_REASON_").lower()
        if u.reason in qc.ExplainReason.values() else str(u.reason),
        "why": u.reason_text, "next": u.next, "since_ms": u.since_ms, "task_id": u.task_id,
        "child_task_id": u.child_task_id, "node_id": u.node_id, "error": u.error, "retry_count": u.retry_count,
        "short_bytes": u.short_bytes, "room_bytes": {str(n): b for n, b in sorted(u.room_bytes.items())},
    }


def _ids(ids: Sequence[int], total: int) -> str:
    shown = ", ".join(map(str, ids[:DRAWN_SEGMENTS]))
    return shown + (f", … ({total:,} in all)" if total > min(len(ids), DRAWN_SEGMENTS) else "")


def _lacks(u: dict[str, Any]) -> str:
    parts = [f"{u['missing_segments']:,} segment{'s' if u['missing_segments'] != 1 else ''}"
             if u["missing_segments"] else "",
             f"{len(u['missing_dm_channels'])} DM channel{'s' if len(u['missing_dm_channels']) != 1 else ''}"
             if u["missing_dm_channels"] else ""]
    return " and ".join(p for p in parts if p)


def unit_lines(u: dict[str, Any], now_ms: int) -> list[str]:
    """One replica of ``querycoord explain``: what it lacks, why, what happens next, since when."""
    rows: list[tuple[str, str]] = []
    if u["missing_segments"]:
        rows.append(("segments", _ids(u["segment_ids"], u["missing_segments"])))
    if u["missing_dm_channels"]:
        rows.append(("channels", ", ".join(u["missing_dm_channels"])))
    nodes = ", ".join(map(str, u["node_ids"])) or "none online"
    if u["offline_node_ids"]:
        nodes += f" (offline: {', '.join(map(str, u['offline_node_ids']))})"
    rows.append(("nodes", nodes))
    rows.append(("why", f"{REASON_WORDS.get(u['reason'], u['reason'])}: {u['why']}"))
    if u["room_bytes"]:
        room = ", ".join(f"node {n}: {mib(b)} free" for n, b in u["room_bytes"].items())
        rows.append(("room", room + (f" ({mib(u['short_bytes'])} short)" if u["short_bytes"] else "")))
    if u["error"]:
        rows.append(("error", f"node {u['node_id']}, attempt {u['retry_count']}: {u['error']}"))
    if u["task_id"]:
        rows.append(("task", f"#{u['task_id']}" + (f", child #{u['child_task_id']}" if u["child_task_id"] else "")))
    rows.append(("next", u["next"]))
    if u["since_ms"]:
        rows.append(("since", f"{span((now_ms - u['since_ms']) / 1000)} ago"))
    return [f"replica {u['id']} lacks {_lacks(u)}", *(f"  {k:<9} {v}" for k, v in rows)]


def explain_lines(record: dict[str, Any], now_ms: int) -> list[str]:
    """``querycoord explain``: the collection's health, then each replica that lacks something."""
    head = f"{record['name'] or '?'} (id {record['id']}): {record['health']}"
    if not record["replicas"]:
        return [f"{head}: every replica holds every target segment and DM channel on online nodes"]
    lines = [head]
    for u in record["replicas"]:
        lines.extend(unit_lines(u, now_ms))
    return lines
