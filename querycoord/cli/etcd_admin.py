"""``querycoord etcd status|maintain|roles``, and the options of the bare ``querycoord etcd``.

``status`` shows each member (version, db size and in use, quota, revision,
compacted revision, raft leader, alarms) as a table or ``-o json``; it exits
1 when a member does not answer or an alarm is raised, so it can serve as a
check. ``maintain`` compacts to a safe revision, defragments the members one
at a time and disarms NOSPACE (``meta.ops.maintenance.maintain``); ``--dry-run``
says what it would do. ``roles`` creates the users and roles of least
privilege (``meta.ops.etcd_roles``: coordinator, reader, one per node id) and
enables auth; ``--dry-run`` prints the plan without touching etcd. All reach
etcd through the common etcd options
(``querycoord.settings.etcd_options``). The bare ``querycoord etcd`` still runs the
embedded etcd (``cli/servers.py``); its space and port options are here.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from meta.client import connect
from meta.config import EtcdConfig
from meta.election import leader_record_key
from meta.errors import MetaError, MetaRefused
from meta.ops.etcd_roles import RolePlan, apply_roles, auth_enabled, enable_auth, password_files, plan_roles
from meta.ops.etcd_server import DEFAULT_QUOTA_BYTES
from meta.ops.maintenance import DEFAULT_KEEP_REVISIONS, MIB, ClusterStatus, cluster_status, maintain
from meta.session import role_prefix
from querycoord.cli.common import emit, fail
from querycoord.cli.etcd_read import add_root_option, describe_root, read_root, refused_message, say_target
from querycoord.common.protocol import (
    QUERYCOORD_ELECTION,
    QUERYCOORD_ROLE,
    QUERYNODE_ROLE,
    SNODES_PREFIX,
    STREAMNODE_ROLE,
)
from querycoord.console import draw
from querycoord.settings.etcd_options import ENV_PREFIX, add_etcd_options, etcd_config_from_args
from querycoord.settings.setting_rules import COUNT, Rule, flag_type

STATUS_HEADERS = ["ENDPOINT", "MEMBER", "VERSION", "DB", "IN USE", "QUOTA", "REVISION", "COMPACTED", "LEADER",
                  "ALARMS"]


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The embedded etcd's space and port options (on the bare ``querycoord etcd``)."""
    p.add_argument("--port", type=int, default=None,
                   help="client port of the first member (the others take the next ones); default: the ports of "
                        "the last run with this --data-dir, else free ones")
    p.add_argument("--quota-mb", type=flag_type(int, Rule(1, 1 << 20)), default=DEFAULT_QUOTA_BYTES // MIB,
                   help=f"backend quota in MiB: etcd refuses writes (NOSPACE) beyond it "
                        f"(default {DEFAULT_QUOTA_BYTES // MIB})")
    p.add_argument("--keep-revisions", type=flag_type(int, COUNT), default=DEFAULT_KEEP_REVISIONS,
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
    """``status``, ``maintain`` and ``roles`` under ``querycoord etcd`` (whose bare form runs the embedded etcd)."""
    sub = p.add_subparsers(dest="etcd_command", metavar="{status,maintain,roles}",
                           help="without one: run the embedded etcd in the foreground")
    s = sub.add_parser("status", help="each member: version, db size, quota, revisions, leader, alarms")
    add_etcd_options(s)
    s.add_argument("-o", "--output", choices=("table", "json"), default="table", help="table (default) or json")
    s.set_defaults(func=cmd_status)
    m = sub.add_parser("maintain", help="compact to a safe revision, defragment member by member, disarm NOSPACE")
    add_etcd_options(m)
    m.add_argument("--keep", type=flag_type(int, COUNT), default=DEFAULT_KEEP_REVISIONS,
                   help=f"revisions kept by the compaction (watchers that far behind resume; default "
                        f"{DEFAULT_KEEP_REVISIONS})")
    m.add_argument("--dry-run", action="store_true", help="only say what it would do")
    m.set_defaults(func=cmd_maintain)
    add_roles_parser(sub)


def add_roles_parser(sub: Any) -> None:
    r = sub.add_parser("roles", help="create the etcd users and roles of least privilege (coordinator, reader, one "
                                     "per node id) and enable auth; idempotent")
    add_etcd_options(r)
    add_root_option(r, "meta root path the roles are confined to")
    r.add_argument("--querynodes", default="", metavar="IDS",
                   help="comma-separated fixed ids of the query nodes (role and user querynode-<id> each)")
    r.add_argument("--streamnodes", default="", metavar="IDS",
                   help="comma-separated fixed ids of the stream nodes (role and user streamnode-<id> each)")
    r.add_argument("--password-dir", default=None, metavar="DIR",
                   help="each user's password is the file DIR/<user>; missing ones are created (random, mode "
                        "0600). Required unless --dry-run")
    r.add_argument("--name-prefix", default="", help="put before every role and user name (several deployments "
                                                      "sharing one etcd)")
    r.add_argument("--no-enable-auth", action="store_true", help="create roles and users only; leave auth as it is")
    r.add_argument("--dry-run", action="store_true", help="print the roles, grants and users it would create")
    r.set_defaults(func=cmd_roles)


def status_rows(st: ClusterStatus) -> list[list[object]]:
    by_member: dict[int, list[str]] = {}
    for member_id, name in st.alarms:
        by_member.setdefault(member_id, []).append(name)
    rows: list[list[object]] = []
    for m in st.members:
        if m.error:  # the short reason here; -o json has the whole error
            rows.append([m.endpoint, "-", "-", "-", "-", "-", "-", "-", "-", m.reason or m.error])
            continue
        rows.append([m.endpoint, f"{m.member_id:x}", m.version, draw.mib(m.db_size), draw.mib(m.db_size_in_use),
                     draw.mib(m.db_size_quota) if m.db_size_quota else "?", m.revision, m.compacted_revision,
                     "*" if m.is_leader else f"{m.leader:x}" if m.leader else "none",
                     ",".join(by_member.get(m.member_id, [])) or "-"])
    return rows


def cmd_status(args: argparse.Namespace) -> int:
    try:
        config = etcd_config_from_args(args, refused_is_final=True)
    except ValueError as exc:
        return fail(exc, 2)
    try:
        st = asyncio.run(cluster_status(config))
    except MetaRefused as exc:
        return fail(refused_message(args, exc))
    except MetaError as exc:
        return fail(exc)
    def render() -> list[str]:
        return [*draw.table(STATUS_HEADERS, status_rows(st), right=(3, 4, 5, 6, 7)),
                *(f"alarm {name} on member {member_id:x}" + (": run `querycoord etcd maintain`" if name == "NOSPACE"
                                                               else "") for member_id, name in st.alarms)]

    emit(args, st.as_dict(), render)
    return 1 if st.alarms or any(m.error for m in st.members) else 0


def cmd_maintain(args: argparse.Namespace) -> int:
    try:
        config = etcd_config_from_args(args, refused_is_final=True)
        if args.keep < 0:
            raise ValueError(f"--keep must be >= 0, got {args.keep}")
    except ValueError as exc:
        return fail(exc, 2)
    try:
        after = asyncio.run(maintain(config, keep=args.keep, dry_run=args.dry_run,
                                     say=lambda line: print(line, flush=True)))
    except MetaRefused as exc:
        return fail(refused_message(args, exc))
    except MetaError as exc:
        return fail(exc)
    if not args.dry_run and after.nospace:
        return fail("the NOSPACE alarm is still raised (see above)")
    return 0


# What a node reads besides its own session key: a query node reads the leader record (never the election, whose
# keys name the coordinators' leases), to check a new leader's fence before adopting it; a stream node finds the
# coordinators by their sessions and its snode under stream/snodes/.
NODE_READS = {QUERYNODE_ROLE: (leader_record_key(QUERYCOORD_ELECTION),),
              STREAMNODE_ROLE: (role_prefix(QUERYCOORD_ROLE), SNODES_PREFIX)}


def _ids(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option}: expected comma-separated integers, got {text!r}") from None


def roles_plan(args: argparse.Namespace, root: str | None = None) -> RolePlan:
    """The plan the options describe (for ``root``, default the one they name); ``ValueError`` names the option
    that is wrong."""
    try:
        return plan_roles(root or read_root(args), querynodes=_ids(args.querynodes, "--querynodes"),
                          streamnodes=_ids(args.streamnodes, "--streamnodes"), node_reads=NODE_READS,
                          name_prefix=args.name_prefix)
    except ValueError as exc:
        raise ValueError(f"etcd roles: {exc}") from None


def _print_dry_run(plan: RolePlan, args: argparse.Namespace) -> None:
    print(f"would make etcd hold these roles for root {plan.root} (one user of the same name each):")
    for line in plan.describe():
        print(f"  {line}")
    if args.password_dir:
        d = Path(args.password_dir)
        for user in plan.users:
            print(f"  password of {user}: {'read' if (d / user).exists() else 'create'} {d / user}")
    print("then enable auth (unless already on)" if not args.no_enable_auth else "auth left as it is")


async def _apply(config: EtcdConfig, plan: RolePlan, passwords: dict[str, str], enable: bool) -> None:
    client = await connect(config)
    try:
        if enable and not await auth_enabled(client) and config.user is None:
            raise ValueError(f"enabling auth needs an administrator: give --etcd-user (e.g. root) and its password "
                             f"(--etcd-password-file or ${ENV_PREFIX}PASSWORD); it gets etcd's root role")
        await apply_roles(client, plan, passwords, say=lambda line: print(line, flush=True))
        if enable:
            assert config.user is not None and config.password is not None
            if await enable_auth(client, config.user, config.password):
                print(f"auth enabled; administrator {config.user}", flush=True)
    finally:
        await client.close()


def cmd_roles(args: argparse.Namespace) -> int:
    """Handler of ``querycoord etcd roles`` (and of ``scripts/etcd_roles.py``)."""
    try:
        root = read_root(args)
        plan = roles_plan(args, root)
        if args.dry_run:
            print(f"planning roles for {describe_root(args, root)}", file=sys.stderr, flush=True)
            _print_dry_run(plan, args)
            return 0
        if not args.password_dir:
            raise ValueError("--password-dir is required: each user's password is read from (or created in) a file")
        config = etcd_config_from_args(args, refused_is_final=True)
        say_target(args, root, config, verb="writing roles for")
        if config.user in plan.users:
            raise ValueError(f"the administrator --etcd-user {config.user} must not be one of the planned users")
        passwords = password_files(Path(args.password_dir), plan.users, create=True)
        asyncio.run(_apply(config, plan, passwords, enable=not args.no_enable_auth))
    except ValueError as exc:
        return fail(exc, 2)
    except MetaRefused as exc:
        return fail(refused_message(args, exc))
    except MetaError as exc:
        return fail(exc)
    except BrokenPipeError:  # stdout closed (`| head`): the command line's main ends quietly
        raise
    except OSError as exc:
        return fail(f"etcd roles: {exc}")
    print(f"etcd roles in place for root {plan.root}: {', '.join(plan.users)} (passwords in {args.password_dir}); "
          "run each node with --node-id <id> --etcd-user <its user> --etcd-password-file <its file>", flush=True)
    return 0


__all__ = ["NODE_READS", "add_run_options", "add_subcommands", "cluster_options", "cmd_maintain", "cmd_roles",
           "cmd_status", "roles_plan"]
