"""Query meta: what the query coordinator has loaded, persisted in etcd (see ``store``).

Modules: ``keys`` (etcd key layout, Milvus names), ``index`` (the in-memory
mirror and its indexes), ``batch`` (packing changes into txns within etcd's
limits, memory applied after etcd), ``records`` (stored form, checks on
reload, derived percentage), ``store`` (``QueryMeta``, the API), ``errors``.
"""

from .errors import CollectionNotLoaded, CorruptRecord, LoadTypeConflict, PartitionNotLoaded, QueryMetaError
from .keys import query_channels
from .records import collection_percentage, stored_delta_channel, stored_segment
from .store import QueryMeta

__all__ = [
    "CollectionNotLoaded",
    "CorruptRecord",
    "LoadTypeConflict",
    "PartitionNotLoaded",
    "QueryMeta",
    "QueryMetaError",
    "collection_percentage",
    "query_channels",
    "stored_delta_channel",
    "stored_segment",
]
