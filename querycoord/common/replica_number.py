"""How many replicas a load asks for: one rule for the job that checks a request and the trigger that creates them.

A load's ``replica_number`` when set is the number, from 1 to ``Limits.max_replicas``; omitted, it means the
number the collection is loaded with, else 1. A collection stored with 0 was loaded before replicas existed:
it has one. Whether the online nodes can hold that many is the job's to check (it needs the cluster).

A resize (UpdateLoadConfig) asks for a number in the same range. While a grow runs, the collection's record
lists its new replicas beside the old ones but keeps the old ``replica_number`` until they are whole: the
replicas past that number (the newest ids: ids only grow) are *joining*, shown with their progress but not
counted in the collection's own figures (``serving_replica_ids``).
"""

from __future__ import annotations

from proto import data_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.limits import Limits
from querycoord.common.validate import check_range

LoadRequest = qc.LoadCollectionRequest | qc.LoadPartitionsRequest


def check_replicas(request: LoadRequest, limits: Limits) -> None:
    """Refuse a ``replica_number`` set below 1 or above the limit (``InvalidField``)."""
    if request.HasField("replica_number"):
        check_range("replica_number", request.replica_number, 1, limits.max_replicas)


def check_resize(request: qc.UpdateLoadConfigRequest, limits: Limits) -> None:
    """Refuse a resize to fewer than 1 or more than the limit replicas (``InvalidField``): the number is required."""
    check_range("replica_number", request.replica_number, 1, limits.max_replicas)


def serving_replica_ids(info: data_pb2.CollectionLoadInfo) -> list[int]:
    """The replicas the collection counts: all but those a grow is still adding (see module docstring)."""
    ids = sorted(r.replica_id for r in info.replicas)
    return ids[:info.replica_number] if 0 < info.replica_number < len(ids) else ids


def joining_replica_ids(info: data_pb2.CollectionLoadInfo) -> list[int]:
    """The replicas a grow is adding and has not made whole yet (see module docstring)."""
    ids = sorted(r.replica_id for r in info.replicas)
    return ids[info.replica_number:] if 0 < info.replica_number < len(ids) else []


def asked_replicas(request: LoadRequest) -> int | None:
    """The number ``request`` sets; None when it leaves it out."""
    return request.replica_number if request.HasField("replica_number") else None


def loaded_replicas(info: data_pb2.CollectionLoadInfo | None) -> int:
    """The number a collection is loaded with (0: it is not loaded)."""
    return max(1, info.replica_number) if info is not None else 0


def replica_number(request: LoadRequest, info: data_pb2.CollectionLoadInfo | None) -> int:
    """What ``request`` loads: its number, else that of the loaded collection ``info``, else 1."""
    asked = asked_replicas(request)
    return asked if asked is not None else loaded_replicas(info) or 1
