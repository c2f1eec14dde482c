"""``querycoord status`` and ``querycoord switchover``: who leads, who stands by, the nodes and etcd; a planned
leader change.

``status`` reads etcd, not a coordinator, so it works with no leader at all;
what it reads is gathered by ``querycoord.console.status_gather.gather_status`` (which
the coordinators' status page shares) and drawn here.

``switchover`` asks the leader (``querycoord.leader.switchover``) and then waits for
the new leader's gRPC health to say SERVING, timing both.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import TYPE_CHECKING, Any

from meta.errors import MetaError, MetaRefused, NotEtcd
from meta.log import when_loguru_loaded
from meta.ops.maintenance import MIB
from proto import querycoord_pb2 as qc
from querycoord.cli.common import add_etcd_read_options, add_output_option, client_command, emit, fail, utc
from querycoord.cli.etcd_read import read_root, reader_config, refused_message, say_target
from querycoord.console.status_gather import PROBE_TIMEOUT, coordinator_health, gather_status
from querycoord.settings.security_options import configure_from_args

if TYPE_CHECKING:
    from querycoord.net.client import QueryCoordClient


def _since(t: float | None, now: float) -> str:
    if not t:
        return "-"
    ago = max(0, int(now - t))
    span = f"{ago}s" if ago < 120 else f"{ago // 60}m" if ago < 7200 else f"{ago // 3600}h"
    return f"{time.strftime('%H:%M:%S', time.localtime(t))} ({span} ago)"


def control_lines(controls: dict[str, Any] | None) -> list[str]:
    """Balance paused and check kinds turned off (``querycoord balance pause``, ``querycoord checkers``); nothing
    while everything runs."""
    if not controls:
        return []
    lines = []
    balance = controls["balance"]
    if balance["paused"]:
        lines.append(f"balance paused since {utc(balance['since_ms'])}" + (f" by {balance['by']}" if balance["by"]
                                                                          else ""))
    off = [c for c in controls["inactive_checkers"] if c["name"] != "balance"]
    if off:
        lines.append("checkers off: " + ", ".join(f"{c['name']} (since {utc(c['since_ms'])}"
                                                  + (f" by {c['by']})" if c["by"] else ")") for c in off))
    return lines


def render(status: dict[str, Any], now: float | None = None) -> list[str]:
    """The one screen of ``querycoord status``."""
    from querycoord.console import draw  # tables only: ``-o json`` does without

    now = time.time() if now is None else now
    lines = [f"root {status['root']}: " + (f"{status['leader']} leads" if status["leader"] else "no leader elected")]
    if status["switchover"]:
        s = status["switchover"]
        lines.append(f"switchover in progress: {s.get('from')} -> {s.get('to')}")
    lines += control_lines(status.get("controls"))
    coords = status["coordinators"]
    lines += ["", f"coordinators ({len(coords)})"]
    if coords:
        lines += draw.table(("ADDRESS", "ID", "ROLE", "SINCE", "FENCE", "HEALTH"), (
            (c["address"], c["server_id"], c["role"] + (f" #{c['queue_position']}" if c["role"] == "standby" else ""),
             _since(c["since"], now), c["fence_revision"] or "-", c["health"]) for c in coords), right=(1, 4))
    else:
        lines.append("  none: start one with `querycoord coord` (or `querycoord up`)")
    qn, sn = status["query_nodes"], status["stream_nodes"]
    lines += ["", f"query nodes ({len(qn)})"]
    if qn:
        lines += draw.table(("ID", "ADDRESS", "STATE", "CAPACITY", "LIFECYCLE"), (
            (n["id"], n["address"], n["state"], draw.mib(n["capacity_bytes"]) if n["capacity_bytes"] else "-",
             n.get("lifecycle", "active")) for n in qn), right=(0, 3))
    lines += ["", f"stream nodes ({len(sn)})"]
    if sn:
        lines += draw.table(("ID", "STATE", "VGROUPS"), (
            (n["id"], n["state"], ",".join(str(v) for v in n["vgroups"]) or "-") for n in sn), right=(0,))
    etcd = status["etcd"]
    lines += ["", f"etcd members ({len(etcd['members'])}; revision {etcd['revision']}, "
                  f"compacted at {etcd['compacted_revision']})"]
    lines += draw.table(("ENDPOINT", "ID", "VERSION", "DB MiB", "IN USE MiB", "REVISION", "LEADER", "STATE"), (
        (m["endpoint"], f"{m['member_id']:x}" if m["member_id"] else "-", m["version"] or "-",
         f"{m['db_size'] / MIB:.1f}", f"{m['db_size_in_use'] / MIB:.1f}", m["revision"] or "-",
         "yes" if m["is_leader"] else "", m["error"] or "; ".join(m["errors"]) or "ok")
        for m in etcd["members"]), right=(3, 4, 5))
    alarms = etcd["alarms"]
    lines.append("alarms: " + (", ".join(f"{a['alarm']} on member {a['member_id']:x}" for a in alarms)
                               if alarms else "none"))
    return lines


def cmd_status(args: argparse.Namespace) -> int:
    if (getattr(args, "log_level", None) or "") not in ("TRACE", "DEBUG"):
        # A one-shot read: etcd not answering is the one error line, not retry chatter (and loguru stays unloaded
        # while nothing logs).
        when_loguru_loaded(lambda real: real.disable("meta"))
    try:
        configure_from_args(args)  # the coordinators are asked for their health and state over gRPC
        config = reader_config(args, float(args.timeout))
        root = read_root(args)
        say_target(args, root, config)
        status = asyncio.run(gather_status(config, root))
    except ValueError as exc:
        return fail(exc, 2)
    except MetaRefused as exc:
        return fail(refused_message(args, exc))
    except NotEtcd as exc:
        return fail(str(exc))
    except MetaError as exc:
        return fail(f"etcd did not answer: {str(exc).splitlines()[0]}")
    emit(args, status, lambda: render(status))
    return 0


async def _wait_serving(address: str, timeout: float) -> float | None:
    """Seconds until the coordinator at ``address`` reports SERVING (None: not within ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await coordinator_health(address, PROBE_TIMEOUT) == "SERVING":
            return time.monotonic() - started
        await asyncio.sleep(0.01)
    return None


async def _switchover(c: QueryCoordClient, args: argparse.Namespace) -> int:
    from querycoord.console.actions import check
    from querycoord.leader.switchover import call_coordinator

    # Find the leader with a call only it answers, then ask it once: a switchover retried elsewhere after a
    # timeout would be a second switchover.
    check(await c.query("ShowNodes", qc.ShowNodesRequest()), "find the leader")
    started = time.monotonic()
    resp = check(await call_coordinator(c.current, "Switchover", qc.SwitchoverRequest(target=args.to),
                                        args.timeout), "switchover")
    serving = await _wait_serving(resp.leader, args.timeout)
    serving_s = None if serving is None else time.monotonic() - started
    result = {"previous_leader": resp.previous_leader, "leader": resp.leader, "stepped_back": list(resp.stepped_back),
              "handover_s": round(resp.handover_seconds, 4),
              "serving_s": None if serving_s is None else round(serving_s, 4)}

    def render_switchover() -> list[str]:
        lines = [f"stepped back behind {resp.leader}: {', '.join(resp.stepped_back)}"] if resp.stepped_back else []
        when = (f"serving {serving_s:.3f}s after the request" if serving_s is not None else
                f"not serving yet after {args.timeout:g}s (see `querycoord status`)")
        return [*lines, f"switchover: {resp.previous_leader} led, {resp.leader} leads now; elected "
                        f"{resp.handover_seconds:.3f}s after {resp.previous_leader} resigned, {when}"]

    emit(args, result, render_switchover)
    return 0 if serving_s is not None else 1


def add_parsers(sub: Any, client: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="coordinators (role, since, fence, health), nodes and etcd members, from etcd")
    add_etcd_read_options(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("switchover", parents=client,
                       help="planned leader change: a standby leads, the leader stands by; no task lost")
    p.add_argument("--to", default="", metavar="ADDR",
                   help="the standby coordinator to lead (default: the next in line)")
    add_output_option(p)
    p.set_defaults(func=client_command(_switchover))
