"""How the coordinator reaches the catalog: only through a ``Broker``.

The coordinator never touches catalog keys or the Catalog stub itself, so an
external catalog (a real RootCoord/DataCoord, another service speaking the
Catalog protocol) can replace the built-in one without touching the
scheduler. Two implementations:

* ``LocalBroker``: the catalog runs in the coordinator process over the same
  etcd (the default); calls go straight to a ``CatalogStore``.
* ``GrpcBroker``: a remote Catalog service over grpc.aio, every call bounded by
  a timeout, recovery info fetched page by page.

Every failure, whatever its origin (a refused request, etcd or the network
down), surfaces as ``BrokerError(code, reason)`` with a common.ErrorCode, so
callers handle one exception type and can tell NOT_FOUND from a transient
outage by its code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Protocol, runtime_checkable

import grpc

from proto import catalog_pb2, catalog_pb2_grpc, common_pb2, data_pb2
from querycoord.catalog.store import STATUS_SOURCE, CatalogStore, SegmentWatchItem
from querycoord.common.errors import CoordError, status_of
from querycoord.security.grpc_channels import GrpcSecurity, make_channel

Channels = list[data_pb2.VChannelInfo]
Binlogs = list[data_pb2.SegmentBinlogs]

DEFAULT_TIMEOUT = 5.0
DEFAULT_PAGE_SIZE = 1000


class BrokerError(CoordError):
    """The catalog refused a call or could not be reached; ``code`` is a common.ErrorCode.

    ``reason`` is the catalog's own; ``str()`` (what the coordinator's callers read) names the code first.
    """

    def __init__(self, code: common_pb2.ErrorCode, reason: str):
        super().__init__(reason, code)

    def __str__(self) -> str:
        name = common_pb2.ErrorCode.Name(self.code) if self.code in common_pb2.ErrorCode.values() else str(self.code)
        return f"{name}: {self.reason}"

    @classmethod
    def from_status(cls, status: common_pb2.Status) -> BrokerError:
        return cls(status.error_code, status.reason)

    @property
    def transient(self) -> bool:
        """Whether retrying later may succeed (the catalog or etcd was unreachable or slow)."""
        return self.code in (common_pb2.META_UNAVAILABLE, common_pb2.TIMEOUT, common_pb2.NOT_READY)


@runtime_checkable
class Broker(Protocol):
    """What the coordinator needs from the catalog (Milvus's RootCoord + DataCoord brokers)."""

    async def describe_collection(self, collection_id: int | str) -> catalog_pb2.CollectionDescription:
        """The collection's schema, partitions and DM channels, by id (int) or name (str)."""
        ...

    async def show_partitions(self, collection_id: int) -> list[int]:
        """Partition ids of the collection, in creation order."""
        ...

    async def get_recovery_info(
        self, collection_id: int, partition_id: int, segment_ids: Iterable[int] | None = None
    ) -> tuple[Channels, Binlogs]:
        """Channels and sealed segments of a partition; with ``segment_ids`` only those (missing ids are absent)."""
        ...

    def watch_segments(self, start_revision: int = 0) -> AsyncIterator[SegmentWatchItem]:
        """Segment additions and removals (handoff); may raise ``NotImplementedError`` when the catalog cannot."""
        ...

    async def close(self) -> None:
        """Release connections; the broker is unusable afterwards."""
        ...


def _error(exc: Exception) -> BrokerError:
    if isinstance(exc, BrokerError):
        return exc
    return BrokerError.from_status(status_of(exc, source=STATUS_SOURCE))


class LocalBroker:
    """The in-process catalog: calls go straight to a ``CatalogStore``; its errors become ``BrokerError``."""

    def __init__(self, store: CatalogStore):
        self.store = store

    async def describe_collection(self, collection_id: int | str) -> catalog_pb2.CollectionDescription:
        try:
            return await self.store.describe_collection(collection_id)
        except Exception as exc:
            raise _error(exc) from exc

    async def show_partitions(self, collection_id: int) -> list[int]:
        try:
            return [p.partition_id for p in await self.store.show_partitions(collection_id)]
        except Exception as exc:
            raise _error(exc) from exc

    async def get_recovery_info(
        self, collection_id: int, partition_id: int, segment_ids: Iterable[int] | None = None
    ) -> tuple[Channels, Binlogs]:
        try:
            return await self.store.get_recovery_info(collection_id, partition_id, segment_ids)
        except Exception as exc:
            raise _error(exc) from exc

    async def watch_segments(self, start_revision: int = 0) -> AsyncIterator[SegmentWatchItem]:
        try:
            async for item in self.store.watch_segments(start_revision):
                yield item
        except Exception as exc:
            raise _error(exc) from exc

    async def close(self) -> None:
        """Nothing to release: the store's etcd client belongs to whoever created it."""


class GrpcBroker:
    """A remote Catalog service over grpc.aio.

    Every call carries ``timeout`` seconds and fails fast when the server is
    down (no wait-for-ready), so a dead catalog costs a caller at most one
    timeout, never a hang. Recovery info is fetched in pages of ``page_size``
    segments so no answer exceeds gRPC's 4 MiB message limit.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        page_size: int = DEFAULT_PAGE_SIZE,
        options: Iterable[tuple[str, object]] = (),
        security: GrpcSecurity | None = None,
    ):
        if timeout <= 0 or page_size <= 0:
            raise ValueError(f"timeout and page_size must be positive, got {timeout} and {page_size}")
        self.address = address
        self.timeout = timeout
        self.page_size = page_size
        self._options = list(options)
        self._security = security  # None: this process's (grpc_channels.current)
        self._channel: grpc.aio.Channel | None = None
        self._stub: catalog_pb2_grpc.CatalogStub | None = None

    def _get_stub(self) -> catalog_pb2_grpc.CatalogStub:
        """Channel and stub are made on first use, inside the running event loop that grpc.aio binds them to."""
        if self._stub is None:
            self._channel = make_channel(self.address, self._security, options=self._options)
            self._stub = catalog_pb2_grpc.CatalogStub(self._channel)
        return self._stub

    async def _call(self, method: str, request: object) -> object:
        """Call ``method``; a transport failure or a non-success Status raises ``BrokerError``."""
        rpc = getattr(self._get_stub(), method)
        try:
            response = await rpc(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._transport_error(method, exc) from exc
        status = response.status
        if status.error_code != common_pb2.SUCCESS:
            raise BrokerError.from_status(status)
        return response

    def _transport_error(self, method: str, exc: grpc.aio.AioRpcError) -> BrokerError:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return BrokerError(
                common_pb2.TIMEOUT, f"catalog at {self.address} did not answer {method} within {self.timeout}s"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return BrokerError(
                common_pb2.META_UNAVAILABLE,
                f"catalog at {self.address} is unreachable ({exc.details()}); is the catalog service running?",
            )
        return BrokerError(
            common_pb2.UNEXPECTED_ERROR, f"catalog at {self.address}: {method} failed with {code.name}: {exc.details()}"
        )

    async def describe_collection(self, collection_id: int | str) -> catalog_pb2.CollectionDescription:
        req = catalog_pb2.DescribeCollectionRequest()
        if isinstance(collection_id, str):
            req.collection_name = collection_id
        else:
            req.collection_id = collection_id
        resp = await self._call("DescribeCollection", req)
        return resp.collection  # type: ignore[attr-defined]

    async def show_partitions(self, collection_id: int) -> list[int]:
        resp = await self._call("ShowPartitions", catalog_pb2.ShowPartitionsRequest(collection_id=collection_id))
        return [p.partition_id for p in resp.partitions]  # type: ignore[attr-defined]

    async def get_recovery_info(
        self, collection_id: int, partition_id: int, segment_ids: Iterable[int] | None = None
    ) -> tuple[Channels, Binlogs]:
        """All pages merged: channels in catalog order with the union of their pages' flushed ids."""
        ids = None if segment_ids is None else sorted(set(segment_ids))
        if ids is not None and not ids:
            # The protocol reads an empty id list as "all segments"; asking for none gets the channels only.
            ids = [0]
        channels: dict[str, data_pb2.VChannelInfo] = {}
        binlogs: Binlogs = []
        after = 0
        while True:
            req = catalog_pb2.GetRecoveryInfoRequest(
                collection_id=collection_id,
                partition_id=partition_id,
                segment_ids=ids or (),
                after_segment_id=after,
                page_size=self.page_size,
            )
            resp = await self._call("GetRecoveryInfo", req)
            for ch in resp.channels:  # type: ignore[attr-defined]
                if ch.channel_name in channels:
                    channels[ch.channel_name].flushed_segment_ids.extend(ch.flushed_segment_ids)
                else:
                    channels[ch.channel_name] = ch
            binlogs.extend(resp.binlogs)  # type: ignore[attr-defined]
            after = resp.next_after_segment_id  # type: ignore[attr-defined]
            if not after:
                return list(channels.values()), binlogs

    def watch_segments(self, start_revision: int = 0) -> AsyncIterator[SegmentWatchItem]:
        raise NotImplementedError(
            "the Catalog gRPC service has no segment watch; with a remote catalog, learn new segments by polling "
            "get_recovery_info (or run the catalog in-process with LocalBroker)"
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None


__all__ = ["DEFAULT_PAGE_SIZE", "DEFAULT_TIMEOUT", "Broker", "BrokerError", "GrpcBroker", "LocalBroker"]
