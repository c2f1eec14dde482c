"""The etcd meta layer as a library: ``from meta import MetaKV, Session, Election, ...``.

What an application needs is importable from ``meta`` itself (``__all__``):
connecting (``EtcdConfig``, ``connect``), keys under a root path (``MetaKV``,
the fenced view ``FencedKV``, the txn vocabulary), sessions, elections and
the ``Fence`` they return, resumable watches, id allocation, an embedded etcd
for tests (``EtcdCluster``) and the errors. The submodules stay importable
for everything else.

A library is silent until the application turns its logs on:
``logger.enable("meta")`` does (``querycoord.logs.setup_logging`` calls it),
so a program that imports ``meta`` keeps control of what reaches its log.
The package ships ``py.typed``: type checkers read its annotations.
"""

from loguru import logger

logger.disable("meta")

from meta.client import EtcdClient, connect  # noqa: E402  (after disable: importing must log nothing)
from meta.config import EtcdConfig  # noqa: E402
from meta.election import Election, LeaderInfo, SessionLost, current_leader, election_prefix  # noqa: E402
from meta.errors import (  # noqa: E402
    ClientClosed,
    InvalidKey,
    MetaAuthError,
    MetaError,
    MetaNoSpace,
    MetaUnavailable,
    NotLeader,
    RequestTooLarge,
)
from meta.etcd_server import EtcdCluster, EtcdNotFound, EtcdStartError  # noqa: E402
from meta.fence import Fence  # noqa: E402
from meta.idalloc import IdAllocator  # noqa: E402
from meta.kv import FencedKV, MetaKV, PrefixSnapshot  # noqa: E402
from meta.session import (  # noqa: E402
    Session,
    SessionError,
    SessionEvent,
    SessionIdTaken,
    SessionInfo,
    SessionSnapshot,
    list_sessions,
    watch_sessions,
)
from meta.txn import KeyValue, TxnResult, absent, created_at, delete, delete_prefix, modified_at, put, value_is  # noqa: E402
from meta.watch import EventType, Resync, WatchBatch, WatchCancelled, WatchEvent, watch_prefix  # noqa: E402

__all__ = [
    "ClientClosed",
    "Election",
    "EtcdClient",
    "EtcdCluster",
    "EtcdConfig",
    "EtcdNotFound",
    "EtcdStartError",
    "EventType",
    "Fence",
    "FencedKV",
    "IdAllocator",
    "InvalidKey",
    "KeyValue",
    "LeaderInfo",
    "MetaAuthError",
    "MetaError",
    "MetaKV",
    "MetaNoSpace",
    "MetaUnavailable",
    "NotLeader",
    "PrefixSnapshot",
    "RequestTooLarge",
    "Resync",
    "Session",
    "SessionError",
    "SessionEvent",
    "SessionIdTaken",
    "SessionInfo",
    "SessionLost",
    "SessionSnapshot",
    "TxnResult",
    "WatchBatch",
    "WatchCancelled",
    "WatchEvent",
    "absent",
    "connect",
    "created_at",
    "current_leader",
    "delete",
    "delete_prefix",
    "election_prefix",
    "list_sessions",
    "modified_at",
    "put",
    "value_is",
    "watch_prefix",
    "watch_sessions",
]
