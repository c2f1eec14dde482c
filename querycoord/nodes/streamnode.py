"""The reference stream node: heartbeats to the coordinator's StreamMgmt service under a meta session.

Real deployments run streams in their own nodes; this one exists so the demo,
drills, benchmarks and tests have stream nodes that speak proto/stream.proto,
hold their tasks in memory (``streamnode_state``, no I/O there) and misbehave
on demand.

Life cycle: ``start()`` registers the session (role ``streamnode``, address
``stream-node`` (it serves nothing: the coordinator never calls it, every
action rides on heartbeat replies), extra ``{"vgroups": [...]}``), then the
heartbeat loop runs every ``heartbeat_ms``: tasks advance in time, the next
stream group is reported, the reply is applied. ``stop()`` revokes the
session first so the coordinator sees the node go at once.

Coordinators: the given addresses, or (none given) the addresses of the live
``querycoord`` sessions, re-read when no coordinator answers. A NOT_LEADER
status (or UNAVAILABLE) naming the leader moves the node there: the heartbeat
client is ``querycoord.net.client``'s leader-following client, but a heartbeat is
never retried past its tick: the next tick reports again.

Control (stdin, one command per line; each answered by one JSON line on
stdout ``{"event": "ack", "cmd": ..., "ok": ...}``), so drills and tests can
move vgroup leadership and inject faults in a running process:

    lead <vgroup>       take leadership of a vgroup
    unlead <vgroup>     give it up
    fail <task_id> [message...]   mark a task FAILED
    mute / unmute       stop / resume heartbeating (the session stays)
    pause <stream> [task]    stop processing a stream's tasks (or one task): they keep
                        reporting RUNNING while their lag grows
    resume <stream> [task]   process again (no task: every pause of the stream ends)
    checkpoints ok|refuse|slow <seconds>   take checkpoint orders at once, ignore them, or take them late
    resumes             answer with every deploy taken and the checkpoint it resumed from
                        (``"resumes": [[stream, task, sid, checkpoint], ...]``)
    crash               exit at once with status 137, no cleanup (lease left to expire)
    tasks               answer with every held task (``"tasks": [...]``) and the recalculation runs
                        finished by this process (``"recalc_runs": [[stream, recalc, task, sid, count]...]``)

Run as a process, the node also prints ``{"event": "recalc_done", "stream_id", "recalc_id", "task_id", "sid",
"runs"}`` for each recalculation run it finishes, so a drill counts runs of nodes it later kills.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from loguru import logger
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from meta.config import EtcdConfig
from meta.errors import MetaError
from meta.kv import MetaKV
from meta.session import DEFAULT_TTL, Session, list_sessions
from proto import stream_pb2, stream_pb2_grpc
from querycoord.common.metrics import gauge as _gauge
from querycoord.common.protocol import QUERYCOORD_ROLE, SNODES_PREFIX, STREAMNODE_ADDRESS, STREAMNODE_ROLE
from querycoord.net.client import CoordinatorUnavailable, Discover, LeaderFollowingClient
from querycoord.nodes.node_metrics import session_up
from querycoord.nodes.node_process import NodeCommand, SessionNode, crash_process, meta_of, run_node
from querycoord.nodes.streamnode_state import (
    DEFAULT_GROUPS,
    DEFAULT_INIT_DELAY_S,
    DEFAULT_RECALC_DELAY_S,
    DEFAULT_RUNNER_THREADS,
    INJECTED_TASK_MESSAGE,
    StreamNodeState,
)
from querycoord.settings.setting_rules import INT64_MAX, POSITIVE_COUNT, Rule, flag_type, seconds

DEFAULT_HEARTBEAT_MS = 600.0


def _crash_process(node_id: int, why: str) -> None:
    crash_process(f"stream node {node_id}: crash ({why})")


class HeartbeatClient(LeaderFollowingClient):
    """Sends one heartbeat to whichever coordinator leads (see module docstring).

    The leader-following is ``querycoord.net.client``'s, limited to one round over
    the known addresses: a heartbeat is never retried past its tick.
    ``discover`` returns coordinator addresses when none answered (None: keep
    the fixed list).
    """

    def __init__(self, addresses: Sequence[str], *, timeout: float, discover: Discover | None = None):
        super().__init__(addresses, call_timeout=timeout, deadline=None, pause=0.0, discover=discover)

    async def heartbeat(self, request: stream_pb2.HeartbeatRequest) -> stream_pb2.HeartbeatReply | None:
        """The leader's reply, or None when no coordinator answered as leader within one round."""
        try:
            return await self.call(stream_pb2_grpc.StreamMgmtStub, "StreamHeartbeat", request)
        except CoordinatorUnavailable:
            return None
        except grpc.aio.AioRpcError as exc:  # an error no other coordinator would answer differently
            self.last_error = f"{self.current}: {exc.code().name} {exc.details()}"
            return None


class StreamNode(SessionNode):
    """One reference stream node (see module docstring).

    ``snode_id``: the snode it hosts (0: none); with ``discover_snode`` the
    node instead takes the snode persisted for its node id under
    ``stream/snodes/`` (created by CreateSnode), re-read every second.
    """

    kind = "stream node"

    def __init__(
        self,
        kv: MetaKV,
        *,
        coordinators: Sequence[str] = (),
        vgroups: Sequence[int] = (),
        snode_id: int = 0,
        discover_snode: bool = False,
        heartbeat_ms: float = DEFAULT_HEARTBEAT_MS,
        groups: int = DEFAULT_GROUPS,
        init_delay_s: float = DEFAULT_INIT_DELAY_S,
        runner_threads: int = DEFAULT_RUNNER_THREADS,
        ttl: float = DEFAULT_TTL,
        crash: Callable[[int, str], None] = _crash_process,
        node_id: int | None = None,
        recalc_delay_s: float = DEFAULT_RECALC_DELAY_S,
        on_recalc_done: Callable[[dict[str, Any]], None] | None = None,
    ):
        if heartbeat_ms <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {heartbeat_ms} ms")
        self.kv = kv
        self.fixed_node_id = node_id  # None: the session allocates one
        self.state = StreamNodeState(vgroups=vgroups, snode_id=snode_id, groups=groups, init_delay_s=init_delay_s,
                                     runner_threads=runner_threads, recalc_delay_s=recalc_delay_s)
        self.on_recalc_done = on_recalc_done
        self.discover_snode = discover_snode
        self.interval = heartbeat_ms / 1000.0
        self.ttl = ttl
        self.muted = False
        self._crash_fn = crash
        self.client = HeartbeatClient(coordinators, timeout=max(1.0, 5 * self.interval),
                                      discover=None if coordinators else self._coordinator_addresses)
        self._session: Session | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._last_snode_poll = 0.0
        self.replies = 0
        self.failed_heartbeats = 0

    async def _coordinator_addresses(self) -> list[str]:
        snap = await list_sessions(self.kv, QUERYCOORD_ROLE)
        return [snap.sessions[i].address for i in sorted(snap.sessions)]

    # ----- life cycle ------------------------------------------------------
    async def start(self) -> StreamNode:
        """Register the session, then start heartbeating."""
        session = Session(self.kv, STREAMNODE_ROLE, STREAMNODE_ADDRESS, ttl=self.ttl,
                          extra={"vgroups": sorted(self.state.vgroups)}, server_id=self.fixed_node_id)
        await session.start()
        self._session = session
        self.state.node_id = session.server_id
        self._loop_task = asyncio.create_task(self._run(), name=f"streamnode-{self.node_id}-heartbeat")
        logger.info("stream node {} heartbeating every {:.0f} ms (vgroups {}, snode {})", self.node_id,
                    self.interval * 1000, sorted(self.state.vgroups), self.state.snode_id or "none")
        return self

    async def stop(self) -> None:
        """Revoke the session (the node disappears at once), then stop heartbeating."""
        if self._session is not None:
            await self._session.close(revoke=True)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
            self._loop_task = None
        await self.client.close()

    async def _run(self) -> None:
        while not self.session.lost.is_set():
            began = time.monotonic()
            try:
                await self.beat_once()
            except Exception:  # a bug must not end heartbeating silently: log it and go on
                logger.exception("stream node {}: heartbeat failed", self.node_id)
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - began)))

    async def beat_once(self) -> None:
        """One tick: tasks advance, the snode is refreshed, one stream group is reported, the reply applied."""
        now = time.monotonic()
        for key in self.state.tick(now, int(time.time() * 1000)):
            logger.debug("stream node {}: task {} RUNNING", self.node_id, key)
        self._report_finished_recalcs()
        if self.discover_snode and now - self._last_snode_poll >= 1.0:
            self._last_snode_poll = now
            await self._refresh_snode()
        if self.muted:
            return
        request = self.state.build_heartbeat()
        reply = await self.client.heartbeat(request)
        if reply is None:
            self.failed_heartbeats += 1
            if self.failed_heartbeats % 50 == 1:
                logger.warning("stream node {}: no coordinator answered ({})", self.node_id, self.client.last_error)
            return
        self.replies += 1
        outcome = self.state.apply_reply(reply, time.monotonic())
        if not outcome.accepted:
            logger.info("stream node {}: reply ignored: {}", self.node_id, outcome.reason)
        elif outcome.deployed or outcome.undeployed or outcome.started or outcome.runner_updates:
            logger.info("stream node {}: deployed {}, started {}, undeployed {} (cleanup {}), runner updates {}",
                        self.node_id, outcome.deployed, outcome.started, outcome.undeployed,
                        outcome.cleaned_streams, outcome.runner_updates)

    def _report_finished_recalcs(self) -> None:
        finished, self.state.finished_recalcs = self.state.finished_recalcs, []
        for stream_id, rid, task_id, sid in finished:
            runs = self.state.recalc_runs[(stream_id, rid, task_id, sid)]
            logger.info("stream node {}: recalculation {} of stream {} done on task {} (SID {})", self.node_id, rid,
                        stream_id, task_id, sid)
            if self.on_recalc_done is not None:
                self.on_recalc_done({"event": "recalc_done", "stream_id": stream_id, "recalc_id": rid,
                                     "task_id": task_id, "sid": sid, "runs": runs})

    async def _refresh_snode(self) -> None:
        with contextlib.suppress(MetaError):
            snap = await self.kv.load_prefix(SNODES_PREFIX)
            mine = 0
            for item in snap.kvs:
                info = stream_pb2.SnodeInfo.FromString(item.value)
                if info.node_id == self.node_id:
                    mine = info.id
            if mine != self.state.snode_id:
                logger.info("stream node {}: hosts snode {}", self.node_id, mine or "none")
                self.state.snode_id = mine

    # ----- control ---------------------------------------------------------
    def control(self, line: str) -> dict[str, Any]:
        """Run one control command (see module docstring); returns its JSON answer."""
        words = line.split()
        if not words:
            return {"event": "ack", "cmd": "", "ok": False, "error": "empty command"}
        cmd, args = words[0], words[1:]
        answer: dict[str, Any] = {"event": "ack", "cmd": cmd, "ok": True}
        try:
            if cmd == "lead":
                self.state.lead_vgroup(int(args[0]))
            elif cmd == "unlead":
                answer["readers_left"] = [list(k) for k in self.state.drop_vgroup(int(args[0]))]
            elif cmd == "fail":
                key = self.state.fail_task(int(args[0]), " ".join(args[1:]) or INJECTED_TASK_MESSAGE)
                answer["task"] = list(key)
            elif cmd in ("pause", "resume"):
                stream_id, task_id = int(args[0]), int(args[1]) if len(args) > 1 else 0
                (self.state.pause if cmd == "pause" else self.state.resume)(stream_id, task_id)
                answer["paused"] = sorted(list(k) for k in self.state.paused)
            elif cmd == "checkpoints":
                fault = {"ok": "", "refuse": "refuse", "slow": "slow"}.get(args[0] if args else "?")
                if fault is None:
                    raise ValueError("checkpoints needs ok, refuse or slow <seconds>")
                self.state.set_checkpoint_fault(fault, float(args[1]) if fault == "slow" else 0.0)
            elif cmd == "resumes":
                answer["resumes"] = [list(r) for r in self.state.resumes]
            elif cmd == "mute":
                self.muted = True
            elif cmd == "unmute":
                self.muted = False
            elif cmd == "crash":
                self._crash_fn(self.state.node_id, "crash command")
            elif cmd == "tasks":
                answer["tasks"] = self.state.snapshot()
                answer["vgroups"] = sorted(self.state.vgroups)
                answer["snode_id"] = self.state.snode_id
                answer["leader_revision"] = self.state.max_leader_revision
                answer["recalc_runs"] = [[*run, n] for run, n in sorted(self.state.recalc_runs.items())]
            else:
                raise ValueError(f"unknown command {cmd!r} (lead, unlead, fail, pause, resume, mute, unmute, "
                                 "checkpoints, resumes, crash, tasks)")
        except (ValueError, IndexError, KeyError) as exc:
            answer.update(ok=False, error=str(exc).strip("'\""))
        return answer


# ----- the process ------------------------------------------------------------
def stdin_is_pollable() -> bool:
    """Whether stdin can be a control channel: a pipe, a socket or a terminal.

    Anything else has no control channel, and is not even handed to the event
    loop: /dev/null (what nohup and systemd give) is a character device that
    epoll refuses, which asyncio reports only later, as an error with a
    traceback in the log; a regular file or a closed stdin is refused too.
    """
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, ValueError, OSError):
        return False  # no stdin at all (closed, or replaced by an object without a descriptor)
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


async def _read_control(node: StreamNode) -> None:
    """Apply stdin commands until EOF; a node whose stdin is no pipe, socket or terminal has none."""
    if not stdin_is_pollable():
        logger.debug("stream node {}: stdin is no pipe, socket or terminal: no control channel", node.node_id)
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):
        return  # refused after all: no control channel
    while True:
        line = await reader.readline()
        if not line:
            return
        print(json.dumps(node.control(line.decode(errors="replace"))), flush=True)


async def run_forever(etcd: EtcdConfig, root: str, *, http_listen: str = "", **node_options: Any) -> int:
    """Run one node until SIGTERM/SIGINT (exit 0) or until its session is lost (exit 1).

    Prints one JSON line ``{"event": "ready", "node_id", "pid", "vgroups",
    "snode_id"}`` (and ``http_address`` with ``http_listen``) on stdout once the session is registered; drills
    and tests parse it.
    Control commands are read from stdin meanwhile (its EOF ends only the control reader).
    """

    def ready(node: StreamNode) -> dict[str, Any]:
        return {"vgroups": sorted(node.state.vgroups), "snode_id": node.state.snode_id}

    def printed(event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    return await run_node(etcd, root, lambda kv: StreamNode(kv, on_recalc_done=printed, **node_options), ready=ready,
                          alongside=_read_control,
                          http_listen=http_listen, families=streamnode_families)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--coordinator", default="",
                   help="comma-separated coordinator addresses (default: the live querycoord sessions)")
    p.add_argument("--vgroups", default="", help="comma-separated vgroup ids this node leads at start")
    p.add_argument("--snode", action="store_true",
                   help="host the snode created for this node (read from stream/snodes/ every second)")
    p.add_argument("--snode-id", type=flag_type(int, Rule(0, INT64_MAX)), default=0,
                   help="host this snode id (fixed; overrides --snode)")
    p.add_argument("--heartbeat-ms", type=flag_type(float, Rule(0, 3_600_000, above=True)),
                   default=DEFAULT_HEARTBEAT_MS,
                   help="heartbeat tick (default 600)")
    p.add_argument("--groups", type=flag_type(int, POSITIVE_COUNT), default=DEFAULT_GROUPS,
                   help="stream groups, one reported per tick")
    p.add_argument("--init-delay-ms", type=flag_type(float, Rule(0, 3_600_000)), default=DEFAULT_INIT_DELAY_S * 1000,
                   help="how long a deployed reader or runner stays INIT before RUNNING")
    p.add_argument("--runner-threads", type=flag_type(int, Rule(1, 1024)), default=DEFAULT_RUNNER_THREADS)
    p.add_argument("--recalc-delay-ms", type=flag_type(float, Rule(0, 3_600_000)),
                   default=DEFAULT_RECALC_DELAY_S * 1000,
                   help="how long a runner takes to run one recalculation order (simulated)")
    p.add_argument("--ttl", type=flag_type(float, seconds(2, 3600)), default=DEFAULT_TTL,
                   help="session lease TTL in seconds (>= 2)")


def cmd_streamnode(args: argparse.Namespace) -> int:
    """Handler of ``querycoord streamnode`` (and of ``python -m querycoord.nodes.streamnode``)."""
    try:
        etcd = meta_of(args)
        if args.groups < 1:
            raise ValueError(f"--groups must be at least 1, got {args.groups}")
        if args.heartbeat_ms <= 0 or args.init_delay_ms < 0:
            raise ValueError("--heartbeat-ms must be positive and --init-delay-ms not negative")
        options: dict[str, Any] = dict(
            coordinators=[a.strip() for a in args.coordinator.split(",") if a.strip()],
            vgroups=_int_list(args.vgroups), snode_id=args.snode_id, discover_snode=args.snode and not args.snode_id,
            heartbeat_ms=args.heartbeat_ms, groups=args.groups, init_delay_s=args.init_delay_ms / 1000,
            runner_threads=args.runner_threads, ttl=args.ttl, node_id=args.node_id,
            recalc_delay_s=args.recalc_delay_ms / 1000,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run_forever(etcd, args.root, http_listen=args.http_listen, **options))


# ``querycoord streamnode`` (cli/servers.py adds the parser) and ``python -m querycoord.nodes.streamnode``.
COMMAND = NodeCommand("streamnode", "run a reference stream node (heartbeats to StreamMgmt)",
                      _add_options, cmd_streamnode)
add_streamnode_parser = COMMAND.add_parser


def streamnode_families(node: StreamNode) -> list[Metric]:
    state = node.state
    tasks = GaugeMetricFamily("querycoord_streamnode_tasks", "Stream tasks this node holds, by status",
                              labels=["status"])
    by_status = {stream_pb2.TaskStatus.Name(s).removeprefix("TASK_").lower(): 0
                 for s in stream_pb2.TaskStatus.values() if s}
    for t in state.tasks.values():
        name = stream_pb2.TaskStatus.Name(t.status).removeprefix("TASK_").lower()
        by_status[name] = by_status.get(name, 0) + 1
    for name, n in sorted(by_status.items()):
        tasks.add_metric([name], n)
    heartbeats = CounterMetricFamily("querycoord_streamnode_heartbeats", "Heartbeats sent, by result (replied: a "
                                     "coordinator answered; unanswered: none did)", labels=["result"])
    heartbeats.add_metric(["replied"], node.replies)
    heartbeats.add_metric(["unanswered"], node.failed_heartbeats)
    return [
        _gauge("querycoord_streamnode_session_up", "1 while the node's session is registered and alive",
               session_up(node)),
        tasks,
        heartbeats,
        _gauge("querycoord_streamnode_vgroups", "Vgroups this node leads", len(state.vgroups)),
        _gauge("querycoord_streamnode_snode_id", "The snode this node hosts (0: none)", state.snode_id),
    ]


if __name__ == "__main__":
    sys.exit(COMMAND.main())
