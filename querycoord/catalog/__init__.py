"""The catalog: collections, partitions, DM channels and sealed segments (Milvus's RootCoord + DataCoord roles).

``store.CatalogStore`` keeps it in etcd, ``service.CatalogServicer`` serves it
over gRPC, and the coordinator reads it only through a ``broker.Broker``
(``LocalBroker`` in process, ``GrpcBroker`` for a remote catalog), so an
external catalog can be plugged in.
"""

from querycoord.catalog.broker import Broker, BrokerError, GrpcBroker, LocalBroker
from querycoord.catalog.service import CatalogServicer, start_catalog_server
from querycoord.catalog.store import (
    AddSegmentsIncomplete,
    CatalogError,
    CatalogStore,
    CollectionExists,
    CollectionNotFound,
    Conflict,
    InvalidArgument,
    NotFound,
    PartitionNotFound,
    RecoveryPage,
    SegmentChange,
    SegmentRef,
    SegmentResync,
    SegmentWatchItem,
    status_of,
)

__all__ = [
    "AddSegmentsIncomplete",
    "Broker",
    "BrokerError",
    "CatalogError",
    "CatalogServicer",
    "CatalogStore",
    "CollectionExists",
    "CollectionNotFound",
    "Conflict",
    "GrpcBroker",
    "InvalidArgument",
    "LocalBroker",
    "NotFound",
    "PartitionNotFound",
    "RecoveryPage",
    "SegmentChange",
    "SegmentRef",
    "SegmentResync",
    "SegmentWatchItem",
    "start_catalog_server",
    "status_of",
]
