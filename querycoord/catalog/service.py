"""The Catalog gRPC service over a ``CatalogStore``.

Every RPC answers a ``Status``: SUCCESS, or the code of what went wrong
(ILLEGAL_ARGUMENT, NOT_FOUND, CONFLICT, REQUEST_TOO_LARGE, META_UNAVAILABLE,
...) with a reason naming it. No exception reaches gRPC: a client can always
tell a refused request (a Status) from a transport failure (an RpcError).

Every request is checked against the store's ``Limits`` before the store is
called (``check_*`` below, ``querycoord.common.validate``): counts and lists are
bounded before anything is built from them, names and paths are bounded and
well-formed, enums known. A refusal is ILLEGAL_ARGUMENT naming the field, its
value and the limit, and nothing is written. Duplicates: repeated partition
names and explicit segment ids are refused (by the store); repeated ids in
GetRecoveryInfo's filter are dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from loguru import logger

from meta.errors import RequestTooLarge
from proto import catalog_pb2, catalog_pb2_grpc, common_pb2, data_pb2
from querycoord.catalog.store import STATUS_SOURCE, CatalogStore
from querycoord.common.errors import CoordError, status_of
from querycoord.common.limits import Limits
from querycoord.common.validate import (
    InvalidField,
    check_count,
    check_enum,
    check_id,
    check_ids,
    check_name,
    check_number_or_default,
    check_range,
    check_text,
    check_texts,
    name_ok,
    text_ok,
)
from querycoord.security.grpc_channels import GrpcSecurity, add_port, make_server

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


def _ref(collection_id: int, collection_name: str, limits: Limits) -> int | str:
    """A collection named by id, or by name when the id is 0 (neither: 0, which the store refuses)."""
    check_id("collection_id", collection_id, optional=True)
    if not collection_id:
        check_name("collection_name", collection_name, limits.max_name_length, required=False)
    return collection_id or collection_name or 0


def check_create_collection(request: catalog_pb2.CreateCollectionRequest, limits: Limits) -> None:
    """Counts first (nothing is built from a number the caller sent), then names and the schema's texts."""
    check_name("collection_name", request.collection_name, limits.max_name_length)
    check_number_or_default("num_partitions", request.num_partitions, limits.max_partitions)
    check_count("partition_names", request.partition_names, limits.max_partitions)
    for name in request.partition_names:
        check_name("partition_names", name, limits.max_name_length)
    check_number_or_default("num_dm_channels", request.num_dm_channels, limits.max_dm_channels)
    if request.HasField("schema"):
        schema = request.schema
        check_name("schema.name", schema.name, limits.max_name_length, required=False)
        check_text("schema.description", schema.description, limits.max_text_length)
        check_count("schema.fields", schema.fields, limits.max_fields)
        for f in schema.fields:
            check_id("schema.fields.field_id", f.field_id, optional=True)
            check_name("schema.fields.name", f.name, limits.max_name_length)
            check_enum("schema.fields.data_type", f.data_type, catalog_pb2.DataType, allow_unspecified=False)
            check_text("schema.fields.description", f.description, limits.max_text_length)


def check_add_segments(request: catalog_pb2.AddSegmentsRequest, limits: Limits) -> None:
    """At most ``max_segments_per_request`` segments, each with bounded ids, sizes, files and channel."""
    check_id("collection_id", request.collection_id, optional=True)
    check_count("segments", request.segments, limits.max_segments_per_request, required=True)
    files, text, name = limits.max_files_per_segment, limits.max_text_length, limits.max_name_length
    for seg in request.segments:
        # The usual segment in one expression (10,000 of them in a few ms); any doubt: the named checks below.
        if (seg.segment_id >= 0 and seg.collection_id >= 0 and seg.partition_id > 0 and seg.num_rows >= 0
                and seg.mem_size >= 0 and len(seg.binlog_paths) <= files and not seg.compaction_from
                and not seg.index_infos and name_ok(seg.insert_channel, name)
                and all(p and text_ok(p, text) for p in seg.binlog_paths)):
            continue
        _check_segment(seg, limits)


def _check_segment(seg: data_pb2.SegmentBinlogs, limits: Limits) -> None:
    """One segment of AddSegments, field by field: refuses naming the first field out of bounds."""
    check_id("segments.segment_id", seg.segment_id, optional=True)
    check_id("segments.collection_id", seg.collection_id, optional=True)
    check_id("segments.partition_id", seg.partition_id)
    check_range("segments.num_rows", seg.num_rows, 0, 2**63 - 1)
    check_range("segments.mem_size", seg.mem_size, 0, 2**63 - 1)
    check_texts("segments.binlog_paths", seg.binlog_paths, limits.max_files_per_segment, limits.max_text_length)
    check_name("segments.insert_channel", seg.insert_channel, limits.max_name_length, required=False)
    check_ids("segments.compaction_from", seg.compaction_from, limits.max_ids_per_request)
    check_count("segments.index_infos", seg.index_infos, limits.max_fields)
    for index in seg.index_infos:
        check_range("segments.index_infos.field_id", index.field_id, 0, 2**63 - 1)
        check_range("segments.index_infos.index_id", index.index_id, 0, 2**63 - 1)
        check_name("segments.index_infos.index_name", index.index_name, limits.max_name_length, required=False)
        check_texts("segments.index_infos.index_file_paths", index.index_file_paths,
                    limits.max_files_per_segment, limits.max_text_length)
        check_range("segments.index_infos.index_size", index.index_size, 0, 2**63 - 1)


def check_recovery_info(request: catalog_pb2.GetRecoveryInfoRequest, limits: Limits) -> list[int]:
    """Positive collection and partition ids, a bounded segment filter (ids >= 0, repeats dropped), paging >= 0."""
    check_id("collection_id", request.collection_id)
    check_id("partition_id", request.partition_id)
    # Id 0 is allowed here: a broker asking for no segment at all (only the channels) sends [0].
    check_count("segment_ids", request.segment_ids, limits.max_ids_per_request)
    ids = list(dict.fromkeys(check_range("segment_ids", i, 0, 2**63 - 1) for i in request.segment_ids))
    check_range("after_segment_id", request.after_segment_id, 0, 2**63 - 1)
    if request.page_size < 0:
        raise InvalidField("page_size", request.page_size, "must be >= 0 (0: every segment)", "0..2147483647")
    return ids


class CatalogServicer(catalog_pb2_grpc.CatalogServicer):
    """Serves the Catalog API from a ``CatalogStore`` (in the coordinator process or on its own)."""

    def __init__(self, store: CatalogStore, *, max_page_size: int = MAX_PAGE_SIZE, limits: Limits | None = None):
        self.store = store
        self.max_page_size = max_page_size
        # The store's limits unless told otherwise: the coordinator gives its store the configured ones.
        self.limits = limits if limits is not None else store.limits

    @_answered(catalog_pb2.CreateCollectionResponse)
    async def CreateCollection(
        self, request: catalog_pb2.CreateCollectionRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.CreateCollectionResponse:
        check_create_collection(request, self.limits)
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
        await self.store.drop_collection(_ref(request.collection_id, request.collection_name, self.limits))
        return catalog_pb2.DropCollectionResponse(status=OK)

    @_answered(catalog_pb2.DescribeCollectionResponse)
    async def DescribeCollection(
        self, request: catalog_pb2.DescribeCollectionRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.DescribeCollectionResponse:
        desc = await self.store.describe_collection(_ref(request.collection_id, request.collection_name, self.limits))
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
        parts = await self.store.show_partitions(check_id("collection_id", request.collection_id))
        return catalog_pb2.ShowPartitionsResponse(status=OK, partitions=parts)

    @_answered(catalog_pb2.AddSegmentsResponse)
    async def AddSegments(
        self, request: catalog_pb2.AddSegmentsRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.AddSegmentsResponse:
        check_add_segments(request, self.limits)
        ids = await self.store.add_segments(list(request.segments), collection_id=request.collection_id)
        return catalog_pb2.AddSegmentsResponse(status=OK, segment_ids=ids)

    @_answered(catalog_pb2.GetRecoveryInfoResponse)
    async def GetRecoveryInfo(
        self, request: catalog_pb2.GetRecoveryInfoRequest, context: grpc.aio.ServicerContext
    ) -> catalog_pb2.GetRecoveryInfoResponse:
        segment_ids = check_recovery_info(request, self.limits)
        page_size = request.page_size
        # A paging client follows next_after_segment_id, so its pages may be cut to what fits a message.
        # page_size 0 means "everything" (as the proto says): never silently cut, and a client whose
        # message limit it exceeds gets a loud RESOURCE_EXHAUSTED rather than a partial answer.
        if page_size:
            page_size = min(page_size, self.max_page_size)
        page = await self.store.get_recovery_page(
            request.collection_id,
            request.partition_id,
            segment_ids or None,
            after_segment_id=request.after_segment_id,
            page_size=page_size,
        )
        return catalog_pb2.GetRecoveryInfoResponse(
            status=OK,
            channels=page.channels,
            binlogs=page.binlogs,
            next_after_segment_id=page.next_after_segment_id,
        )


async def start_catalog_server(store: CatalogStore, address: str = "127.0.0.1:0", *,
                               security: GrpcSecurity | None = None) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server serving only the Catalog on ``address``; returns it and the bound port. TLS, limits
    and roles: ``security``, default this process's (``grpc_channels``)."""
    server = make_server(security)
    catalog_pb2_grpc.add_CatalogServicer_to_server(CatalogServicer(store), server)
    port = add_port(server, address, security)
    if port == 0:
        raise OSError(f"could not bind the catalog service to {address}")
    await server.start()
    return server, port


__all__ = ["MAX_PAGE_SIZE", "CatalogServicer", "check_add_segments", "check_create_collection", "check_recovery_info",
           "start_catalog_server"]
