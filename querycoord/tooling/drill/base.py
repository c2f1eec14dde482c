"""What every process drill shares: its work dir, its timestamped lines, its run and its report.

A drill (``FailoverDrill``, ``StreamDrill``) starts a cluster of real processes (``_start_cluster``), drives
it (``_drive``) and stops every process (``_stop_cluster``) before ``run`` returns, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import grpc

from meta.ops.etcd_server import EtcdCluster
from proto import querycoord_pb2 as qc
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.tooling.drill.leaders import wait_until
from querycoord.tooling.drill.options import RunOptions
from querycoord.tooling.harness import Harness, Member, StartError


class DrillSetupError(StartError):
    """The cluster could not be set up beyond starting its processes (no leader, nodes never online, a stream
    refused...).

    A ``StartError`` too, so one ``except StartError`` covers every way a drill cannot get going.
    """


class _Timed(Protocol):
    duration_s: float


Opts = TypeVar("Opts", bound=RunOptions)
Res = TypeVar("Res", bound=_Timed)


class ProcessDrill(Generic[Opts, Res]):
    """One run of a drill with options ``Opts`` and result ``Res``."""

    result: Res

    def __init__(self, opts: Opts, out: Any, work_prefix: str):
        self.opts = opts
        self.out = out or sys.stdout
        self.work = Path(opts.work_dir) if opts.work_dir else Path(tempfile.mkdtemp(prefix=work_prefix))
        self.etcd: EtcdCluster | None = None
        self.harness: Harness | None = None  # once etcd is up
        self._t0 = time.monotonic()

    @property
    def cluster(self) -> Harness:
        assert self.harness is not None, "the harness exists once etcd is up"
        return self.harness

    # ----- output -----------------------------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self._t0

    def say(self, text: str) -> None:
        print(f"[{self.now():7.2f}s] {text}", file=self.out, flush=True)

    def note(self, text: str) -> None:
        if self.opts.verbose:
            self.say(text)

    # ----- run --------------------------------------------------------------------------------------------------
    async def run(self) -> Res:
        started = time.monotonic()
        try:
            await self._start_cluster()
            await self._drive()
        finally:
            self.result.duration_s = time.monotonic() - started
            await self._stop_cluster()
        return self.result

    async def _start_cluster(self) -> None:
        raise NotImplementedError

    async def _drive(self) -> None:
        """The drill proper, once the cluster is up."""
        raise NotImplementedError

    async def _stop_cluster(self) -> None:
        raise NotImplementedError

    async def _stop_processes(self, *closing: Awaitable[None] | None) -> None:
        """Await each of ``closing`` (closes of clients and channels; errors ignored), then stop every process and
        etcd."""
        for c in closing:
            if c is not None:
                with contextlib.suppress(Exception):
                    await c
        if self.harness is not None:
            await self.harness.stop(5)
        if self.etcd is not None:
            await asyncio.to_thread(self.etcd.stop)

    async def _wait_leader(self, timeout: float) -> Member:
        """The current leader; TimeoutError if none appears within ``timeout``."""
        return await wait_until(lambda: self.cluster.leader, self.cluster.changed, timeout)

    async def _first_leader(self) -> None:
        """Until the new cluster has a leader; ``DrillSetupError`` (the drill could not start) after 60 s."""
        try:
            await self._wait_leader(60)
        except TimeoutError:
            raise DrillSetupError(f"no coordinator became leader within 60s; logs in {self.work}") from None


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait for its end, whatever it is: the drill is stopping."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def wait_nodes_online(client: QueryCoordClient | None, nodes: Sequence[Member], timeout: float) -> None:
    """Until the leader lists every one of ``nodes`` online; ``DrillSetupError`` after ``timeout`` seconds."""
    assert client is not None
    want = {n.node_id for n in nodes}
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(CoordinatorUnavailable, grpc.aio.AioRpcError):
            resp = await client.query("ShowNodes", qc.ShowNodesRequest())
            if want <= {n.node_id for n in resp.nodes if n.state == "online"}:
                return
        if time.monotonic() > deadline:
            raise DrillSetupError(f"query nodes {sorted(want)} never all online at the leader")
        await asyncio.sleep(0.1)


def verdict_lines(fails: Sequence[str], passed: str) -> list[str]:
    """A drill table's last lines: each failure, then RESULT (``passed`` when there is none)."""
    return [*(f"FAILED: {f}" for f in fails), "RESULT: " + ("FAILED" if fails else passed)]


async def run_and_report(drill: ProcessDrill[Any, Any], opts: Any, render_result: Callable[[Any], str], out: Any,
                         *, plan: str) -> int:
    """What every process drill does around ``drill.run()``: the table, how to rerun a failure, where the
    logs are (kept on failure, with --keep or --work-dir), and the JSON line last. 0 passed, 1 failed, 2 setup."""
    try:
        result = await drill.run()
    except StartError as exc:
        print(f"error: the drill could not start or keep its processes running: {exc}\n(work dir kept: "
              f"{drill.work})", file=sys.stderr)
        return 2
    print(render_result(result), file=out)
    failed = result.failed
    if failed:
        print(f"\nFAILED; the same {plan}: {opts.command()}", file=out)
    if failed or opts.keep or opts.work_dir:
        print(f"\nlogs and etcd data kept in {drill.work}", file=out)
    else:
        shutil.rmtree(drill.work, ignore_errors=True)
    print(json.dumps(result.summary()), file=out, flush=True)
    return 1 if failed else 0


__all__ = ["DrillSetupError", "ProcessDrill", "run_and_report", "stop_task", "verdict_lines", "wait_nodes_online"]
