"""``querycoord etcd status`` and ``querycoord etcd maintain``, and the options of the bare ``querycoord etcd``.

``status`` shows each member (version, db size and in use, quota, revision,
compacted revision, raft leader, alarms) as a table or ``-o json``; it exits
1 when a member does not answer or an alarm is raised, so it can serve as a
check. ``maintain`` compacts to a safe revision, defragments the members one
at a time and disarms NOSPACE (``meta.maintenance.maintain``); ``--dry-run``
says what it would do. Both reach etcd through the common etcd options
(``querycoord.etcd_options``). The bare ``querycoord etcd`` still runs the
embedded etcd (``cli/servers.py``); its space and port options are here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from meta.errors import MetaError
from meta.etcd_server import DEFAULT_QUOTA_BYTES
from meta.maintenance import DEFAULT_KEEP_REVISIONS, MIB, ClusterStatus, cluster_status, maintain
from querycoord import draw
from querycoord.etcd_options import add_etcd_options, etcd_config_from_args

STATUS_HEADERS = ["ENDPOINT", "MEMBER", "VERSION", "DB", "IN USE", "QUOTA", "REVISION", "COMPACTED", "LEADER",
                  "ALARMS"]


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The embedded etcd's space and port options (on the bare ``querycoord etcd``)."""
    p.add_argument("--port", type=int, default=None,
                   help="client port of the first member (the others take the next ones); default: the ports of "
                        "the last run with this --data-dir, else free ones")
    p.add_argument("--quota-mb", type=int, default=DEFAULT_QUOTA_BYTES // MIB,
                   help=f"backend quota in MiB: etcd refuses writes (NOSPACE) beyond it "
                        f"(default {DEFAULT_QUOTA_BYTES // MIB})")
    p.add_argument("--keep-revisions", type=int, default=DEFAULT_KEEP_REVISIONS,
                   help="auto compaction every 5 minutes keeps this many revisions (0: no auto compaction; "
                        f"default {DEFAULT_KEEP_REVISIONS})")


def cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """``EtcdCluster`` keyword arguments from the run options; ``ValueError`` names the option that is wrong."""
    if args.port is not None and not 1 <= args.port <= 65535 - 2:
        raise ValueError(f"--port must be between 1 and {65535 - 2}, got {args.port}")
    if args.quota_mb < 1:
        raise ValueError(f"--quota-mb must be >= 1, got {args.quota_mb}")
    if args.keep_revisions < 0:
        raise ValueError(f"--keep-revisions must be >= 0, got {args.keep_revisions}")
    ports = tuple(args.port + i for i in range(args.members)) if args.port is not None else ()
    return {"quota_backend_bytes": args.quota_mb * MIB, "auto_compaction_retention": args.keep_revisions,
            "client_ports": ports}


def add_subcommands(p: argparse.ArgumentParser) -> None:
    """``status`` and ``maintain`` under ``querycoord etcd`` (whose bare form runs the embedded etcd)."""
    sub = p.add_subparsers(dest="etcd_command", metavar="{status,maintain}",
                           help="without one: run the embedded etcd in the foreground")
    s = sub.add_parser("status", help="each member: version, db size, quota, revisions, leader, alarms")
    add_etcd_options(s)
    s.add_argument("-o", "--output", choices=("table", "json"), default="table", help="table (default) or json")
    s.set_defaults(func=cmd_status)
    m = sub.add_parser("maintain", help="compact to a safe revision, defragment member by member, disarm NOSPACE")
    add_etcd_options(m)
    m.add_argument("--keep", type=int, default=DEFAULT_KEEP_REVISIONS,
                   help=f"revisions kept by the compaction (watchers that far behind resume; default "
                        f"{DEFAULT_KEEP_REVISIONS})")
    m.add_argument("--dry-run", action="store_true", help="only say what it would do")
    m.set_defaults(func=cmd_maintain)


def status_rows(st: ClusterStatus) -> list[list[object]]:
    by_member: dict[int, list[str]] = {}
    for member_id, name in st.alarms:
        by_member.setdefault(member_id, []).append(name)
    rows: list[list[object]] = []
    for m in st.members:
        if m.error:
            rows.append([m.endpoint, "-", "-", "-", "-", "-", "-", "-", "-", f"not answering: {m.error}"])
            continue
        rows.append([m.endpoint, f"{m.member_id:x}", m.version, draw.mib(m.db_size), draw.mib(m.db_size_in_use),
                     draw.mib(m.db_size_quota) if m.db_size_quota else "?", m.revision, m.compacted_revision,
                     "*" if m.is_leader else f"{m.leader:x}" if m.leader else "none",
                     ",".join(by_member.get(m.member_id, [])) or "-"])
    return rows


def cmd_status(args: argparse.Namespace) -> int:
    try:
        config = etcd_config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        st = asyncio.run(cluster_status(config))
    except MetaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(st.as_dict()))
    else:
        print("\n".join(draw.table(STATUS_HEADERS, status_rows(st), right=(3, 4, 5, 6, 7))))
        for member_id, name in st.alarms:
            print(f"alarm {name} on member {member_id:x}"
                  + (": run `querycoord etcd maintain`" if name == "NOSPACE" else ""))
    return 1 if st.alarms or any(m.error for m in st.members) else 0


def cmd_maintain(args: argparse.Namespace) -> int:
    try:
        config = etcd_config_from_args(args)
        if args.keep < 0:
            raise ValueError(f"--keep must be >= 0, got {args.keep}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        after = asyncio.run(maintain(config, keep=args.keep, dry_run=args.dry_run,
                                     say=lambda line: print(line, flush=True)))
    except MetaError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not args.dry_run and after.nospace:
        print("error: the NOSPACE alarm is still raised (see above)", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_run_options", "add_subcommands", "cluster_options", "cmd_maintain", "cmd_status"]
