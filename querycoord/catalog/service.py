"""The Catalog gRPC service over a ``CatalogStore``.

Every RPC answers a ``Status``: SUCCESS, or the code of what went wrong
(ILLEGAL_ARGUMENT, NOT_FOUND, CONFLICT, REQUEST_TOO_LARGE, META_UNAVAILABLE,
...) with a reason naming it. No exception reaches gRPC: a client can always
tell a refused request (a Status) from a transport failure (an RpcError).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from loguru import logger

from meta.errors import RequestTooLarge
from proto import catalog_pb2, catalog_pb2_grpc, common_pb2
from querycoord.catalog.store import STATUS_SOURCE, CatalogStore, InvalidArgument
from querycoord.errors import CoordError, status_of

# Largest GetRecoveryInfo page served over gRPC: at up to about 1 KiB per segment a page stays well under
# the 4 MiB a client accepts. A request asking for more gets pages of this size (and a next pointer).
MAX_PAGE_SIZE = 2000

R = TypeVar("R", bound=Message)
Method = Callable[["CatalogServicer", Any, grpc.aio.ServicerContext], Awaitable[R]]
OK = common_pb2.Status(error_code=common_pb2.SUCCESS)


async def _answer(method: str, response: type[R], work: Callable[[], Awaitable[R]]) -> R:
    """Run ``work``; turn any exception into ``response(status=...)`` so none escapes to gRPC."""
    try:
        return await work()
    except Exception as exc:
        status = status_of(exc, source=STATUS_SOURCE)
        if isinstance(exc, CoordError | RequestTooLarge):
            logger.debug("catalog {} refused: {}", method, status.reason)
        else:
            logger.warning("catalog {} failed: {}", method, status.reason)
        return response(status=status)


def _answered(response: type[R]) -> Callable[[Method[R]], Method[R]]:
    """An RPC of the servicer that answers ``response(status=...)`` for whatever its body raises (see ``_answer``)."""

    def wrap(method: Method[R]) -> Method[R]:
        @functools.wraps(method)
        async def rpc(servicer: CatalogServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
            return await _answer(method.__name__, response, lambda: method(servicer, request, context))

        return rpc

    return wrap


def _ref(collection_id: int, collection_name: str) -> int | str:
    """A collection named by id, or by name when the id is 0 (neither: 0, which the store refuses)."""
    return collection_id or collection_name or 0


class CatalogServicer(catalog_pb2_grpc.CatalogServicer):
    """Serves the Catalog API from a ``CatalogStore`` (in the coordinator process or on its own)."""

    def __init__(self, store: CatalogStore, *, max_page_size: int = MAX_PAGE_SIZE):
        self.store = store
        self.max_page_size = max_page_size

    @_answered(catalog_pb2.CreateCollectionResponse)
    async def CreateCollection(
        self, request: catalog_pb2.CreateCollectionRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.CreateCollectionResponse:
        desc = await self.store.create_collection(
            request.collection_name,
            request.schema if request.HasField("schema") else None,
            partition_names=list(request.partition_names),
            num_partitions=request.num_partitions,
            num_channels=request.num_dm_channels,
        )
        return catalog_pb2.CreateCollectionResponse(status=OK, collection=desc)

    @_answered(catalog_pb2.DropCollectionResponse)
    async def DropCollection(
        self, request: catalog_pb2.DropCollectionRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.DropCollectionResponse:
        await self.store.drop_collection(_ref(request.collection_id, request.collection_name))
        return catalog_pb2.DropCollectionResponse(status=OK)

    @_answered(catalog_pb2.DescribeCollectionResponse)
    async def DescribeCollection(
        self, request: catalog_pb2.DescribeCollectionRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.DescribeCollectionResponse:
        desc = await self.store.describe_collection(_ref(request.collection_id, request.collection_name))
        return catalog_pb2.DescribeCollectionResponse(status=OK, collection=desc)

    @_answered(catalog_pb2.ShowCollectionsResponse)
    async def ShowCollections(
        self, request: catalog_pb2.ShowCollectionsRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.ShowCollectionsResponse:
        return catalog_pb2.ShowCollectionsResponse(status=OK, collections=await self.store.show_collections())

    @_answered(catalog_pb2.ShowPartitionsResponse)
    async def ShowPartitions(
        self, request: catalog_pb2.ShowPartitionsRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.ShowPartitionsResponse:
        parts = await self.store.show_partitions(request.collection_id)
        return catalog_pb2.ShowPartitionsResponse(status=OK, partitions=parts)

    @_answered(catalog_pb2.AddSegmentsResponse)
    async def AddSegments(
        self, request: catalog_pb2.AddSegmentsRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.AddSegmentsResponse:
        ids = await self.store.add_segments(list(request.segments), collection_id=request.collection_id)
        return catalog_pb2.AddSegmentsResponse(status=OK, segment_ids=ids)

    @_answered(catalog_pb2.GetRecoveryInfoResponse)
    async def GetRecoveryInfo(
        self, request: catalog_pb2.GetRecoveryInfoRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.GetRecoveryInfoResponse:
        page_size = request.page_size
        if page_size < 0:
            raise InvalidArgument(f"page_size must be >= 0, got {page_size}")
        # A paging client follows next_after_segment_id, so its pages may be cut to what fits a message.
        # page_size 0 means "everything" (as the proto says): never silently cut, and a client whose
        # message limit it exceeds gets a loud RESOURCE_EXHAUSTED rather than a partial answer.
        if page_size:
            page_size = min(page_size, self.max_page_size)
        page = await self.store.get_recovery_page(
            request.collection_id,
            request.partition_id,
            list(request.segment_ids) or None,
            after_segment_id=request.after_segment_id,
            page_size=page_size,
        )
        return catalog_pb2.GetRecoveryInfoResponse(
            status=OK,
            channels=page.channels,
            binlogs=page.binlogs,
            next_after_segment_id=page.next_after_segment_id,
        )


async def start_catalog_server(store: CatalogStore, address: str = "127.0.0.1:0") -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server serving only the Catalog on ``address``; returns it and the bound port."""
    server = grpc.aio.server()
    catalog_pb2_grpc.add_CatalogServicer_to_server(CatalogServicer(store), server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind the catalog service to {address}")
    await server.start()
    return server, port


__all__ = ["MAX_PAGE_SIZE", "CatalogServicer", "start_catalog_server"]
