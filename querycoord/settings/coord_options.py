"""The options of ``querycoord coord``, one table from flag to ``CoordConfig`` field.

The defaults a user sees in ``--help`` are read from the dataclasses, so the
command line cannot drift from the configuration it builds. An option not
given keeps the value of the base configuration: production values, or the
scaled preset with ``--scaled`` (tests, drills and the demo), so a drill can
start from the preset and still change one knob. The same tables give the
keys of the configuration file and the ``QUERYCOORD_COORD_*`` variables
(``querycoord.settings.config_file``), so an option is declared once.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from meta.session_guard import GuardLimits
from querycoord.settings.config import CoordConfig, scaled_config
from querycoord.settings.etcd_options import add_etcd_options, etcd_config_from_args
from querycoord.settings.setting_rules import (
    ADDRESS,
    COUNT,
    DAY,
    POSITIVE_COUNT,
    SECONDS,
    TEXT,
    YEAR,
    Rule,
    check,
    check_args,
    seconds,
)


@dataclass(frozen=True)
class Option:
    """``--flag`` sets the field at ``path`` (``scheduler.retry_backoff``) to a value ``rule`` accepts
    (``setting_rules``: finite, within bounds, not empty); ``help`` None hides it from --help."""

    flag: str
    path: str
    kind: type
    rule: Rule
    help: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


# Request limits (querycoord/common/limits.py): what one request may ask for; bigger asks get ILLEGAL_ARGUMENT.
# (field of ``limits``, help): each is a positive count, set by ``--max-...`` named after its field.
LIMIT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("max_partitions", "partitions per collection"),
    ("max_dm_channels", "DM channels (shards) per collection"),
    ("max_fields", "fields per collection schema"),
    ("max_name_length", "characters of a name (collection, partition, field, channel, stream, database)"),
    ("max_text_length", "characters of free text (descriptions, addresses, file paths, error messages)"),
    ("max_segments_per_request", "segments in one AddSegments or LoadSegments request"),
    ("max_files_per_segment", "binlog or index files of one segment"),
    ("max_ids_per_request", "ids in one list field (collection, partition, segment ids...)"),
    ("max_nodes_per_request", "node ids in one LoadBalance"),
    ("max_replicas", "replica_number of a load or a resize"),
    ("max_list_tasks", "task trees per ListTasks page (larger asks are capped)"),
    ("max_vgroups_per_stream", "source vgroups of one stream"),
    ("max_tasks_per_stream", "tasks of one stream (readers, trigger and runners)"),
    ("max_snodes", "snodes in all"),
    ("max_tasks_per_heartbeat", "task reports in one stream heartbeat"),
    ("max_stream_groups", "stream groups a stream node reports in"),
    ("max_streams_per_request", "stream refs in one ShowStreams"),
    ("max_heavy_reads", "heavy reads (GetSegmentInfo, GetReplicas, ListTasks) running at once, per kind"),
    ("max_heavy_reads_waiting", "heavy reads waiting for a slot, per kind (the next is refused)"),
    ("max_stream_metrics", "streams with their own /metrics series (lag, processed, failed): beyond it those "
                           "stopped by an error, then the most lagging"),
)


OPTIONS: tuple[Option, ...] = (
    Option("--root", "root", str, TEXT, "meta root path in etcd"),
    Option("--listen", "listen", str, ADDRESS, "gRPC listen address (port 0: any free port)"),
    Option("--http-listen", "http_listen", str, Rule(empty_ok=True, address=True),
           "serve /metrics (Prometheus), /healthz and /readyz over HTTP at host:port (port 0: any free port)"),
    Option("--ttl", "session_ttl", float, seconds(2, 3600),
           "session lease TTL in seconds: how soon a crash is noticed (at least 2)"),
    Option("--rpc-timeout", "rpc_timeout", float, seconds(0, 3600, above=True),
           "timeout of a call to a query node, in seconds"),
    Option("--auto-balance-interval", "auto_balance_interval", float, seconds(0, DAY),
           "seconds between auto balance checks; 0 disables"),
    Option("--checker-interval", "checker_interval", float, seconds(0, DAY, above=True),
           "seconds between checks of what nodes hold against what should be loaded; the checker is also kicked "
           "by node changes, takeover and handoff"),
    Option("--node-left-delay", "node_left_delay", float, seconds(0, DAY),
           "seconds the leader waits after a query node's session is lost before re-replicating its copies, while "
           "every collection it served keeps a whole replica on online nodes (0: at once; the scaled preset uses 0)"),
    Option("--warm-standby", "warm_standby", int, Rule(0, 1),
           "1: a standby keeps the query meta in memory, followed by a watch, so a takeover needs no reload "
           "(as much memory as the leader's meta); 0: a new leader reads it from etcd"),
    Option("--http-allowed-hosts", "http_allowed_hosts", str, Rule(empty_ok=True),
           "with security on, the status page answers only a Host that is an IP address, localhost, this machine's "
           "name, the host of --listen or --http-listen, or one of these comma-separated names (DNS rebinding)"),
    Option("--node-session-max-bytes", "node_session_max_bytes", int, Rule(256, 65536),
           "the leader fences (revokes the lease of) a node whose session value is larger (256..65536)"),
    Option("--node-session-max-writes", "node_session_max_writes", int, Rule(2, 100_000),
           "the leader fences a node that rewrites its session more often than this per minute"),
    # Scheduler knobs: drills and the demo change them; production keeps the defaults.
    Option("--max-request-bytes", "scheduler.max_request_bytes", int, Rule(1, 1 << 30)),
    Option("--max-repair-bytes", "scheduler.max_repair_bytes", int, Rule(256, 1 << 20),
           "a checker repair's persisted request at most; a bigger one is done in parts (256..1048576)"),
    Option("--max-concurrent-children", "scheduler.max_concurrent_children", int, POSITIVE_COUNT),
    Option("--node-load-concurrency", "scheduler.node_load_concurrency", int, POSITIVE_COUNT,
           "LoadSegments calls in flight to one query node at once (a node loads its requests one by one)"),
    Option("--max-recoveries-per-node", "scheduler.max_recoveries_per_node", int, POSITIVE_COUNT,
           "recovery moves (the checker's repairs: LoadSegments calls) in flight on one query node, counted on the "
           "destination and on the source"),
    Option("--max-cluster-recoveries", "scheduler.max_cluster_recoveries", int, POSITIVE_COUNT,
           "recovery moves in flight in the whole cluster"),
    Option("--max-balance-moves-per-node", "scheduler.max_balance_moves_per_node", int, POSITIVE_COUNT,
           "balance moves (auto balance, LoadBalance: LoadSegments calls) in flight on one query node, counted on "
           "the destination and on the source"),
    Option("--max-cluster-balance-moves", "scheduler.max_cluster_balance_moves", int, POSITIVE_COUNT,
           "balance moves in flight in the whole cluster"),
    Option("--retry-backoff", "scheduler.retry_backoff", float, seconds(0, DAY)),
    Option("--retry-backoff-max", "scheduler.retry_backoff_max", float, seconds(0, DAY)),
    Option("--wait-interval", "scheduler.wait_interval", float, seconds(0, DAY, above=True),
           "seconds between looks of a resumed task tree waiting for query nodes to register"),
    Option("--resume-node-wait", "scheduler.resume_node_wait", float, seconds(0, DAY),
           "seconds after a takeover during which a resumed task tree that finds no online query node waits for "
           "nodes to register instead of failing"),
    Option("--trigger-timeout", "scheduler.trigger_timeout", float, seconds(0, YEAR, above=True)),
    Option("--stream-watch-timeout", "stream.watch_timeout", float, seconds(0, DAY)),
    Option("--checkpoint-interval", "stream.checkpoint_interval", float, seconds(0, DAY),
           "seconds between checkpoint rounds of each running stream (0: no rounds; a stop still takes a final one)"),
    Option("--checkpoint-timeout", "stream.checkpoint_timeout", float, seconds(0, DAY, above=True),
           "seconds a checkpoint round may take before it is abandoned and a new one started; a stop waits this "
           "long for its final checkpoint"),
    # Task history (querycoord/task/history.py): finished trees kept in etcd for `querycoord tasks --history`.
    Option("--history-keep", "scheduler.history_keep", int, COUNT,
           "finished task trees kept in etcd's task history, newest first (0: keep no history)"),
    Option("--history-max-age-s", "scheduler.history_max_age", float, SECONDS,
           "seconds a finished task tree stays in the task history (0: no age limit)"),
    Option("--history-sweep-interval", "scheduler.history_sweep_interval", float, seconds(0, DAY, above=True),
           "seconds between the leader's prunings of the task history"),
    Option("--history-children", "scheduler.history_children", int, COUNT,
           "children listed per task-history record at most (their counts by state cover them all)"),
    *(Option(f"--{field.replace('_', '-')}", f"limits.{field}", int, POSITIVE_COUNT, help_)
      for field, help_ in LIMIT_OPTIONS),
)
# The options that choose the base configuration rather than a field of it (flag, type); configurable like the rest.
PRESET_OPTIONS: tuple[tuple[str, type], ...] = (("--scaled", bool), ("--stream-scale", float))
PRESET_RULES = {"--scaled": Rule(), "--stream-scale": Rule(0, 1000, above=True)}


def option_value(config: Any, path: str) -> Any:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def _replaced(config: Any, path: str, value: Any) -> Any:
    """A copy of ``config`` with the (possibly nested) field at ``path`` set; the original is left alone."""
    head, _, rest = path.partition(".")
    return dataclasses.replace(config, **{head: _replaced(getattr(config, head), rest, value) if rest else value})


def add_coord_options(p: argparse.ArgumentParser) -> None:
    """Declare every option of ``coord``; defaults stay None so that "not given" is visible to ``config_from_args``."""
    defaults = CoordConfig()
    add_etcd_options(p)
    for opt in OPTIONS:
        shown = argparse.SUPPRESS if opt.help is None else f"{opt.help} (default {option_value(defaults, opt.path)})"
        p.add_argument(opt.flag, type=opt.kind, default=None, help=shown)
    p.add_argument("--scaled", action="store_true",
                   help="start from the scaled preset (tests, drills, demos): TTL 2 s, short back-offs, no auto "
                        "balance, stream management about ten times faster; other options still apply")
    p.add_argument("--stream-scale", type=float, default=None,
                   help="multiply every stream-manager duration (isolation, WATCH timeout, back-off...) by this "
                        "(default 1: TDengine's timings)")
    # Before --scaled existed: the scaled stream timings alone. Kept so older scripts keep working.
    p.add_argument("--stream-fast", action="store_true", help=argparse.SUPPRESS)
    # Read by config_file: these options take [coord] keys and QUERYCOORD_COORD_* variables.
    p.set_defaults(config_section="coord")
    p.epilog = p.epilog or ("Each option can also be set in the --config file ([coord] ttl, [etcd] endpoints, "
                            "[log] format...) or by a variable (QUERYCOORD_COORD_TTL, QUERYCOORD_ETCD_ENDPOINTS...); "
                            "a flag beats the variable, which beats the file. `querycoord config show` prints the "
                            "result.")


def config_from_args(args: argparse.Namespace) -> CoordConfig:
    """The configuration ``args`` ask for; ``ValueError`` names the first option out of its rule, with the
    flag, variable or file key that set it."""
    check_args(args, [*((o.dest, o.flag, o.rule) for o in OPTIONS),
                      *((flag.lstrip("-").replace("-", "_"), flag, rule) for flag, rule in PRESET_RULES.items())])
    config = scaled_config(listen=CoordConfig.listen) if args.scaled else CoordConfig()
    if args.stream_fast:
        scaled = scaled_config()
        config.stream, config.stream_tick, config.stream_refresh = scaled.stream, scaled.stream_tick, 5.0
    if args.stream_scale is not None:
        config.stream = config.stream.scaled(args.stream_scale)
        config.stream_tick = min(config.stream_tick, max(0.05, config.stream_tick * args.stream_scale))
    for opt in OPTIONS:
        value = getattr(args, opt.dest)
        if value is not None:
            config = _replaced(config, opt.path, value)
    config.etcd = etcd_config_from_args(args)
    check_numbers(config)
    for name in config.http_allowed_hosts.split(","):
        if name.strip() and (any(c.isspace() or c in "/\\@?#[]" for c in name.strip()) or name.count(":") > 1):
            raise ValueError(f"--http-allowed-hosts: {name.strip()!r} is not a host name (give names separated by "
                             f"commas, such as querycoord.prod.svc,status.example.com)")
    try:
        GuardLimits(max_value_bytes=config.node_session_max_bytes, max_writes=config.node_session_max_writes).check()
    except ValueError as exc:
        raise ValueError(f"--node-session-max-bytes/--node-session-max-writes: {exc}") from None
    return config


def check_numbers(config: Any, path: str = "") -> None:
    """Every number anywhere in ``config`` (nested dataclasses too) is finite and not negative: the net under the
    option rules, for values no option sets (derived by ``--stream-scale``, or built in Python)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f"{path}{f.name}"
        if dataclasses.is_dataclass(value):
            check_numbers(value, f"{name}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            check(f"configuration value {name}", value, Rule(0))


__all__ = ["OPTIONS", "PRESET_OPTIONS", "PRESET_RULES", "Option", "add_coord_options", "check_numbers",
           "config_from_args", "option_value"]
