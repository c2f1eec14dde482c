"""The catalog: collections, partitions, DM channels and sealed segments (Milvus's RootCoord + DataCoord roles).

``store.CatalogStore`` keeps it in etcd, ``service.CatalogServicer`` serves it
over gRPC, and the coordinator reads it only through a ``broker.Broker``
(``LocalBroker`` in process, ``GrpcBroker`` for a remote catalog), so an
external catalog can be plugged in. The package exports the broker, the
service and everything ``store`` exports (its errors and keys).
"""

from querycoord.catalog import store
from querycoord.catalog.broker import Broker, BrokerError, GrpcBroker, LocalBroker
from querycoord.catalog.service import CatalogServicer, start_catalog_server
from querycoord.catalog.store import *  # noqa: F403

__all__ = ["Broker", "BrokerError", "CatalogServicer", "GrpcBroker", "LocalBroker", "start_catalog_server"]
__all__ += store.__all__
