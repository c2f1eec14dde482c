"""Query meta: what the query coordinator has loaded, persisted in etcd (``QueryMeta``, see ``store``).

Modules, top down: ``store`` (``QueryMeta``, the thin facade callers use) over
one manager per job: ``collections`` (load records: collections, partitions,
their states), ``replicas`` (replica membership and percentages, the replica
of a copy), ``segments`` (segment records: which node of each replica holds
a segment), ``channels`` (DM channel watches, delta and query channels),
``nodes`` (the nodes the records name; a gone node's removal), ``progress``
(load progress reported without waiting, flushed in the background). They
share ``core`` (the in-memory index, the write path and its rules, reload)
and ``locks`` (per-collection locks, claims on records). Below them:
``batch`` (packing changes into txns within etcd's limits, memory applied
after etcd), ``index`` (the in-memory mirror and its indexes), ``records``
(stored form, checks on reload, derived percentage), ``copies`` (a record's
copies, one per replica), ``keys`` (etcd key layout, Milvus names),
``errors``. Beside them: ``mirror`` (the warm standby's copy, kept current
by a watch).
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
