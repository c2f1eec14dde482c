"""etcd's wire messages and stubs: the one module that imports etcd3aio's private protobuf package.

Why: ``etcd3aio._protobuf`` is not part of that library's public API, so it may
move in any release. Every request the meta library builds by hand (txns,
paged ranges, watches, leases, the maintenance calls) takes its message types
from here; an upgrade that moves them changes this file alone.
"""

from __future__ import annotations

from etcd3aio._protobuf import (
    AlarmResponse,
    CompactionRequest,
    KVStub,
    LeaseGrantRequest,
    LeaseKeepAliveRequest,
    LeaseRevokeRequest,
    LeaseStub,
    LeaseTimeToLiveRequest,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
    WatchCreateRequest,
    WatchRequest,
    WatchStub,
)
from etcd3aio._protobuf import Compare as PbCompare

__all__ = ["AlarmResponse", "CompactionRequest", "KVStub", "LeaseGrantRequest", "LeaseKeepAliveRequest",
           "LeaseRevokeRequest", "LeaseStub", "LeaseTimeToLiveRequest", "PbCompare", "PutRequest", "RangeRequest",
           "RequestOp", "TxnRequest", "WatchCreateRequest", "WatchRequest", "WatchStub"]
