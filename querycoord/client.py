"""A client of the coordinators that follows the leader.

Given any coordinator addresses, it calls the one it believes leads; a
``NOT_LEADER`` status names the leader (or says none is elected yet), and an
unreachable coordinator is skipped, so the call is retried on the right one
until it succeeds or the deadline passes. Statuses other than NOT_LEADER are
the answer and are returned as they are.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from typing import Any

import grpc

from proto import catalog_pb2_grpc, common_pb2, querycoord_pb2_grpc

_LEADER_AT = re.compile(r"the leader is at (\S+?)(?:[;,)]|$)")


class CoordinatorUnavailable(Exception):
    """No coordinator answered as leader before the deadline."""


class QueryCoordClient:
    def __init__(self, addresses: Sequence[str] | str, *, deadline: float = 60.0, call_timeout: float = 30.0):
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not addresses:
            raise ValueError("at least one coordinator address is required")
        self.addresses = list(addresses)
        self.deadline = deadline
        self.call_timeout = call_timeout
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._current = self.addresses[0]
        self.leader_changes = 0

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = grpc.aio.insecure_channel(address)
        return ch

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

    async def __aenter__(self) -> QueryCoordClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def query(self, method: str, request: Any) -> Any:
        return await self._call(querycoord_pb2_grpc.QueryCoordStub, method, request)

    async def catalog(self, method: str, request: Any) -> Any:
        return await self._call(catalog_pb2_grpc.CatalogStub, method, request)

    async def _call(self, stub_cls: type, method: str, request: Any) -> Any:
        started = time.monotonic()
        tried: list[str] = []
        last = ""
        while time.monotonic() - started < self.deadline:
            address = self._current
            try:
                stub = stub_cls(self._channel(address))
                resp = await getattr(stub, method)(request, timeout=self.call_timeout)
            except grpc.aio.AioRpcError as exc:
                last = f"{address}: {exc.code().name} {exc.details()}"
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    # The message of a standby names the leader; a dead coordinator names nothing, and a
                    # paused or partitioned one answers nothing at all: try the next. Retrying is safe:
                    # every QueryCoord mutation is idempotent (a repeated load or release is success).
                    self._next(address, _LEADER_AT.search(exc.details() or ""))
                    tried.append(address)
                    await asyncio.sleep(0.1)
                    continue
                raise
            status = getattr(resp, "status", None)
            if status is not None and status.error_code == common_pb2.NOT_LEADER:
                last = f"{address}: {status.reason}"
                self._next(address, _LEADER_AT.search(status.reason))
                tried.append(address)
                await asyncio.sleep(0.1)
                continue
            return resp
        raise CoordinatorUnavailable(f"no leader answered {method} within {self.deadline:.0f}s "
                                     f"(tried {sorted(set(tried))}; last: {last})")

    def _next(self, address: str, leader: re.Match[str] | None) -> None:
        if leader and leader.group(1) != address:
            nxt = leader.group(1)
            if nxt not in self.addresses:
                self.addresses.append(nxt)
        else:
            i = self.addresses.index(address) if address in self.addresses else -1
            nxt = self.addresses[(i + 1) % len(self.addresses)]
        if nxt != self._current:
            self.leader_changes += 1
        self._current = nxt
