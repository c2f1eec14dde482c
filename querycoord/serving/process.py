"""Run one coordinator process: the gRPC server (QueryCoord, Catalog, StreamMgmt, health, reflection), the Coordinator.

Every server of the process is built by ``grpc_channels`` (TLS, message size limits, authentication and roles
from ``querycoord.security.auth``; development mode without settings).

Health follows leadership through the standard gRPC health service: SERVING
on the leader, NOT_SERVING on a standby, so probes and load balancers can
route. SIGTERM resigns first, so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import time
from typing import Any

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from loguru import logger

from meta.address import local_host, split_address
from meta.loops import keep_running
from proto import catalog_pb2, catalog_pb2_grpc, querycoord_pb2, stream_pb2
from querycoord.catalog.service import CatalogServicer
from querycoord.common.protocol import QUERYCOORD_SERVICE
from querycoord.leader.coordinator import Coordinator
from querycoord.net.probes import bind_http
from querycoord.security.grpc_channels import add_port, make_server
from querycoord.serving.health import CoordinatorEndpoints
from querycoord.serving.loop_watch import LoopWatch
from querycoord.serving.server import add_to_server
from querycoord.serving.stream_service import add_stream_service
from querycoord.settings.config import CoordConfig


class GrpcHealth(health.aio.HealthServicer):
    """grpcio-health-checking's servicer with ``List``, which its asyncio class lacks: the generated base then
    raised NotImplementedError and every ``Health/List`` call logged a traceback (found by the fuzzer)."""

    async def List(self, request: health_pb2.HealthListRequest, context: Any) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()})


class CoordinatorProcess:
    """A Coordinator behind a gRPC server on ``config.listen``."""

    def __init__(self, config: CoordConfig):
        self.config = config
        # No SO_REUSEPORT: a second coordinator on a busy port must fail, not share it silently. TLS, message size
        # limits, authentication and roles: this process's gRPC security (grpc_channels.configure, from the options).
        self.server = make_server(options=[("grpc.so_reuseport", 0)])
        self.port = add_port(self.server, config.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {config.listen}")
        self.address = f"{local_host(split_address(config.listen, any_host=True)[0])}:{self.port}"
        self.coord = Coordinator(config, self.address)
        self.health = GrpcHealth()
        self._health_task: asyncio.Task[None] | None = None
        self.loop_watch = LoopWatch(config.session_ttl)
        self._loop_watch_task: asyncio.Task[None] | None = None
        # /metrics, /healthz and /readyz (--http-listen): bound now, as the gRPC port is; served from start() on.
        self.http = bind_http(config.http_listen, CoordinatorEndpoints(self.coord), pages=True,
                              addresses=[self.address],
                              allowed_hosts=[h.strip() for h in config.http_allowed_hosts.split(",") if h.strip()])

    async def start(self) -> None:
        if self.http is not None:
            self.http.start()  # before etcd is reached: the process is live (not ready) while it waits
        self._loop_watch_task = asyncio.create_task(self.loop_watch.run(), name="loop watch")
        # A leader holds a protobuf per segment (100,000s): with the default thresholds the
        # cyclic GC rescans them all over and over (a noticeable share of a large load); they are not cyclic.
        gc.set_threshold(100_000, 50, 1000)
        await self.coord.start()
        add_to_server(self.server, self.coord)
        assert self.coord.catalog is not None
        catalog_pb2_grpc.add_CatalogServicer_to_server(CatalogServicer(self.coord.catalog), self.server)
        add_stream_service(self.server, self.coord)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (
            querycoord_pb2.DESCRIPTOR.services_by_name["QueryCoord"].full_name,
            catalog_pb2.DESCRIPTOR.services_by_name["Catalog"].full_name,
            stream_pb2.DESCRIPTOR.services_by_name["StreamMgmt"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, self.server)
        await self._set_health(False)
        await self.server.start()
        self._health_task = asyncio.create_task(
            keep_running("health", self._follow_leadership, client=self.coord.client), name="health")

    async def _set_health(self, serving: bool) -> None:
        st = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", QUERYCOORD_SERVICE):
            result = self.health.set(name, st)
            if asyncio.iscoroutine(result):
                await result

    async def _follow_leadership(self) -> None:
        serving = False
        while True:
            leading = self.coord.is_leader
            if leading != serving:
                serving = leading
                await self._set_health(serving)
                logger.info("coordinator {} is now {}", self.address, "LEADER (SERVING)" if serving else "STANDBY")
                event: dict[str, Any] = {"event": "leader" if serving else "standby", "address": self.address,
                         "server_id": self.coord.server_id, "t": time.time()}
                if serving:
                    event["takeover"] = self.coord.last_takeover  # where its query meta came from, how long it took
                if not serving:
                    # Wait (bounded) until the leadership is dropped, so its write counts are final.
                    for _ in range(100):
                        if self.coord.leadership is None:
                            break
                        await asyncio.sleep(0.05)
                    event["previous"] = self.coord.last_leadership
                print(json.dumps(event), flush=True)
            if serving:
                await asyncio.sleep(0.05)
            else:
                # Woken at once when leadership is taken: health says SERVING without a polling delay.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):  # not wait_for: it can swallow this task's cancellation
                        await self.coord.became_leader.wait()

    async def crash(self) -> None:
        """Test seam: this process dies as a killed one would, inside the caller's event loop (a model test or drill
        that crashes the leader between its own steps). No resignation and no revoke: leadership drops in memory,
        gRPC calls in flight are cut, health stops following; the session and election key lapse after the TTL."""
        await self.coord.halt_as_crashed()
        await self.server.stop(None)
        self._cancel_background()
        await self.coord.close_as_crashed()

    def _cancel_background(self) -> None:
        for task in (self._health_task, self._loop_watch_task):
            if task is not None:
                task.cancel()

    async def stop(self) -> None:
        self._cancel_background()
        await self.coord.stop()
        await self.server.stop(grace=1.0)
        if self.http is not None:
            await self.http.stop()


async def run_coordinator(config: CoordConfig) -> int:
    """The process body of ``querycoord coord``: run until SIGTERM / SIGINT."""
    proc = CoordinatorProcess(config)
    await proc.start()
    ready: dict[str, Any] = {"event": "ready", "address": proc.address, "t": time.time()}
    if proc.http is not None:
        ready["http_address"] = proc.http.address
    print(json.dumps(ready), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await proc.stop()
    return 0
