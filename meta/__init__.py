"""The etcd meta layer as a library: ``from meta import MetaKV, Session, Election, ...``.

The library is what an application links against to keep state in etcd:
connecting (``EtcdConfig``, ``connect``), keys under a root path (``MetaKV``,
the fenced view ``FencedKV``, the txn vocabulary of ``meta.txn``), sessions,
elections and the ``Fence`` they return, resumable watches and followed
ranges, id allocation, the background-loop guard, the observation hooks and
the errors. All of it is importable from ``meta`` itself (``__all__``); the
submodules stay importable for everything else. ``etcd3aio`` stays behind
it: the requests it has no API for are built in the module that owns each
etcd service (``kv`` for keys and txns, ``client`` for leases, ``watch`` for
watches), from message types that only ``etcd_pb`` imports (etcd3aio's
protobuf package is private to it), so election, session and the rest speak
``MetaKV``'s API.

``meta.ops`` is the operations tooling beside it: the embedded etcd launcher
(``EtcdCluster``, for development, tests, drills and the demo), child
processes, etcd roles and users, maintenance (status, alarms, compaction,
defragmentation). It builds on the library; the library never imports it
(``scripts/check_imports.py`` enforces that), so an application that only
stores state pulls in no launcher or process tooling.

A library is silent until the application turns its logs on:
``logger.enable("meta")`` does (``querycoord.settings.logs.setup_logging`` calls it),
so a program that imports ``meta`` keeps control of what reaches its log.
``meta`` imports loguru only when it first logs (``meta.log``): the disable
is applied the moment loguru is imported, by whoever imports it first.
The package ships ``py.typed``: type checkers read its annotations.
"""

from meta.log import when_loguru_loaded

# Silent until the application enables it: at once if loguru is loaded, else the moment anything imports it.
when_loguru_loaded(lambda real: real.disable("meta"))

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
    "EtcdConfig",
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
