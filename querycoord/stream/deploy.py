"""Deploy planning: streams queued for a plan get their task set, heartbeats hand the tasks out.

A stream is queued (``Runtime.to_plan``) when it is created or started, when
its error-stop retry comes, or when WATCH falls back. Planning allocates
fresh task ids from the store's etcd id allocator (never reused across
leaders) and places the tasks with ``plan.plan_stream`` on the live snodes;
a stream without a live snode waits for one. The tasks are pending until a
heartbeat of the node that leads their vgroup (readers) or hosts their snode
(trigger, runners) takes them in its reply. Planning errors are logged and
counted per stream and never replace the reply: it carries the starts,
updates and undeploys of other streams.
"""

from __future__ import annotations

import asyncio

from loguru import logger

from meta.errors import NotLeader
from proto import stream_pb2
from querycoord.stream.plan import RUNNER, TRIGGER_READER, expected_counts, plan_stream
from querycoord.stream.runtime import READER_KINDS, STOP_NO_SNODE, Runtime, StreamRuntime, TaskRuntime
from querycoord.stream.store import NoSnodeAvailable, StreamError


class Deploy:
    """Plan the queued streams and hand their pending tasks to the nodes that may run them."""

    def __init__(self, shared: Runtime):
        self.shared = shared
        self.lock = asyncio.Lock()
        # The last planning error logged ('' while planning works): logged once per distinct error.
        self.error = ""

    async def plan_pending(self, now: float) -> None:
        """Plan every stream waiting for a deploy (fresh task ids, SID 1); streams without a live snode wait.

        Heartbeats are handled concurrently and planning awaits the id
        allocator: one planner at a time, and each stream re-checked after the
        wait, or two overlapping heartbeats would plan (and hand out) the same
        stream twice.
        """
        async with self.lock:
            await self._plan_pending_locked(now)

    async def _plan_pending_locked(self, now: float) -> None:
        shared = self.shared
        if not shared.to_plan:
            return
        live_snodes = shared.live_snodes(now)
        for stream_id in sorted(shared.to_plan):
            rt = shared.streams.get(stream_id)
            if rt is None or rt.sdef.user_stopped or rt.error_stopped:
                shared.to_plan.discard(stream_id)
                continue
            try:
                total = expected_counts(rt.sdef).total
                ids = list(await shared.store.task_ids.allocate(total))

                def take(n: int, ids: list[int] = ids) -> list[int]:
                    return ids[:n]

                plan = plan_stream(rt.sdef, None, live_snodes, shared.replica_of, take, shared.rng)
            except NoSnodeAvailable as exc:
                rt.waiting = exc.reason  # shown by ShowStreams; retried on the next heartbeat
                continue
            except StreamError as exc:
                shared.stop_by_error(rt, STOP_NO_SNODE, exc.reason, now)
                continue
            except NotLeader:
                raise  # deposed: the service drops leadership
            except Exception as exc:  # e.g. etcd unreachable: the stream stays queued, the reply still goes out
                self._failed(rt, exc)
                continue
            if (shared.streams.get(stream_id) is not rt or stream_id not in shared.to_plan
                    or rt.sdef.user_stopped or rt.error_stopped):
                continue  # stopped, dropped or replaced while the ids were being reserved
            if self.error:
                logger.info("stream planning works again (after: {})", self.error)
                self.error = ""
            rt.waiting = ""
            rt.tasks = {p.task_id: TaskRuntime(task=p) for p in plan.tasks()}
            rt.pending = set(rt.tasks)
            rt.deploy_times += 1
            rt.last_action = now
            shared.to_plan.discard(stream_id)

    def _failed(self, rt: StreamRuntime, exc: Exception) -> None:
        """Planning one stream raised: count it, log once per distinct error, retry on the next heartbeat.

        Never raised out of the heartbeat: the reply carries starts, updates
        and undeploys of other streams, which a failed reply would lose.
        """
        self.shared.errors += 1
        message = f"{type(exc).__name__}: {exc}"
        if message != self.error:
            self.error = message
            logger.warning("planning stream {} failed ({}); retried on the next heartbeat", rt.sdef.name, message)

    def hand_out(
        self,
        node_id: int,
        snode_id: int,
        vgroups: set[int],
        now: float,
        reply: stream_pb2.HeartbeatReply,
        skip: set[int],
    ) -> None:
        """Give this node the pending tasks of the vgroups and the snode it was verified to speak for."""
        for stream_id, rt in self.shared.streams.items():
            if not rt.pending or stream_id in skip:
                continue
            # Every task starts from the newest checkpoint all tasks held (``checkpoint``), committed or about to be.
            resume = max(rt.checkpoint_id, rt.settled_id)
            deploy = stream_pb2.StreamDeploy(stream_id=stream_id, stream_name=rt.sdef.name,
                                             resume_checkpoint_id=resume,
                                             start_from_ms=rt.sdef.start_from_ms)
            given: list[TaskRuntime] = []
            for task_id in sorted(rt.pending):
                t = rt.tasks[task_id]
                p = t.task
                mine = p.vgroup_id in vgroups if p.kind in READER_KINDS else bool(snode_id) and p.snode_id == snode_id
                if not mine:
                    continue
                t.node_id, t.deployed_at, t.checkpoint_id = node_id, now, resume
                given.append(t)
                msg = p.to_proto(stream_id, node_id)
                if p.kind in READER_KINDS:
                    deploy.readers.append(stream_pb2.ReaderDeploy(task=msg, trigger_reader=p.kind == TRIGGER_READER))
                elif p.kind == RUNNER:
                    deploy.runners.append(stream_pb2.RunnerDeploy(task=msg))
                else:
                    readers = [
                        r.task.to_proto(stream_id, r.node_id)
                        for r in rt.tasks.values()
                        if r.task.kind == TRIGGER_READER
                    ]
                    tops = [r.task.to_proto(stream_id, r.node_id) for r in self.shared.top_runners(rt)]
                    deploy.trigger.CopyFrom(stream_pb2.TriggerDeploy(task=msg, readers=readers, top_runners=tops))
            if given:
                for t in given:
                    rt.pending.discard(t.task.task_id)
                rt.last_action = now
                reply.deploys.append(deploy)

    def retry_tick(self, now: float) -> None:
        """Error-stopped streams whose back-off is over are queued for a fresh plan."""
        shared = self.shared
        for rt in shared.streams.values():
            if rt.error_stopped and not rt.sdef.user_stopped and rt.next_retry is not None and now >= rt.next_retry:
                rt.stop_code, rt.stop_reason, rt.next_retry = 0, "", None
                shared.to_plan.add(rt.sdef.id)
                shared.redeploys += 1
