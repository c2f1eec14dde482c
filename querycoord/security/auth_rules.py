"""Who may call what: the roles, one method -> role table for every served service, and the principal a call is
made by (the overview is ``querycoord.security.auth``'s docstring)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from proto import catalog_pb2, querycoord_pb2, querynode_pb2, stream_pb2


class Role(enum.StrEnum):
    ADMIN = "admin"
    READER = "reader"
    NODE = "node"
    COORDINATOR = "coordinator"


# ----- the method -> role table ---------------------------------------------------------------------------------------
OPEN: frozenset[Role] = frozenset()  # no credential needed (health)
ANYONE = frozenset(Role)  # any known principal
READ = frozenset({Role.READER, Role.ADMIN, Role.COORDINATOR})
ADMIN = frozenset({Role.ADMIN})
NODE = frozenset({Role.NODE})
COORDINATOR = frozenset({Role.COORDINATOR})

SERVICES: tuple[ServiceDescriptor, ...] = (
    querycoord_pb2.DESCRIPTOR.services_by_name["QueryCoord"],
    catalog_pb2.DESCRIPTOR.services_by_name["Catalog"],
    stream_pb2.DESCRIPTOR.services_by_name["StreamMgmt"],
    querynode_pb2.DESCRIPTOR.services_by_name["QueryNode"],
    health_pb2.DESCRIPTOR.services_by_name["Health"],
    reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
)

# Service (by its name in the .proto) -> method -> the roles that may call it.
_TABLE: dict[str, dict[str, frozenset[Role]]] = {
    "QueryCoord": {
        "ShowCollections": READ, "ShowPartitions": READ, "GetPartitionStates": READ, "GetSegmentInfo": READ,
        "GetComponentStates": READ, "ListTasks": READ, "GetTask": READ, "ShowNodes": READ,
        "GetCoordinatorState": READ, "GetReplicas": READ, "CheckHealth": READ, "Explain": READ,
        "CheckBalanceStatus": READ, "ListCheckers": READ,
        "LoadCollection": ADMIN, "ReleaseCollection": ADMIN, "LoadPartitions": ADMIN, "ReleasePartitions": ADMIN,
        "LoadBalance": ADMIN, "Switchover": ADMIN, "CancelTask": ADMIN, "UpdateLoadConfig": ADMIN,
        "SuspendBalance": ADMIN, "ResumeBalance": ADMIN, "ActivateChecker": ADMIN, "DeactivateChecker": ADMIN,
        "CordonNode": ADMIN, "UncordonNode": ADMIN,
        "DrainNode": ADMIN | NODE,  # a node only for itself (require_node): its graceful stop
        "StepBack": COORDINATOR,  # only a leader asks, during a switchover
    },
    "Catalog": {
        "DescribeCollection": READ, "ShowCollections": READ, "ShowPartitions": READ, "GetRecoveryInfo": READ,
        "CreateCollection": ADMIN, "DropCollection": ADMIN, "AddSegments": ADMIN,
    },
    "StreamMgmt": {
        "ShowStreams": READ,
        "CreateStream": ADMIN, "DropStream": ADMIN, "StopStream": ADMIN, "StartStream": ADMIN,
        "CreateSnode": ADMIN, "DropSnode": ADMIN,
        "StreamHeartbeat": NODE,  # and only as the node its credential names (require_node)
        "RecalculateStream": ADMIN,
    },
    "QueryNode": {
        "LoadSegments": COORDINATOR, "ReleaseSegments": COORDINATOR, "WatchDmChannels": COORDINATOR,
        "ReleaseDmChannels": COORDINATOR,
        "WatchDeltaChannels": COORDINATOR, "AddQueryChannel": COORDINATOR, "ReleaseCollection": COORDINATOR,
        "ReleasePartitions": COORDINATOR,
        "GetSegmentInfo": READ, "GetDataDistribution": READ, "GetComponentStates": READ,
    },
    "Health": {"Check": OPEN, "Watch": OPEN, "List": OPEN},
    "ServerReflection": {"ServerReflectionInfo": ANYONE},
}


def _rules() -> dict[str, frozenset[Role]]:
    """``/package.Service/Method`` -> roles, for every method of ``SERVICES`` that has a rule. A rule naming a
    method the descriptors do not have is a bug here, caught at import."""
    rules: dict[str, frozenset[Role]] = {}
    for service in SERVICES:
        table = _TABLE.get(service.name, {})
        methods = {m.name for m in service.methods}
        unknown = set(table) - methods
        if unknown:
            raise RuntimeError(f"access rules for methods {service.full_name} does not have: {sorted(unknown)}")
        for name, roles in table.items():
            rules[f"/{service.full_name}/{name}"] = roles
    return rules


RULES: Mapping[str, frozenset[Role]] = _rules()


def missing_rules() -> list[str]:
    """RPCs of the served services without an access rule (each is refused to everyone until it gets one)."""
    return [f"/{s.full_name}/{m.name}" for s in SERVICES for m in s.methods if f"/{s.full_name}/{m.name}" not in RULES]


@dataclass(frozen=True)
class Principal:
    """Who calls: ``name`` (from the principals file), its ``role``, its node id (``node`` role), and how it was
    recognised (``token`` or ``certificate``)."""

    name: str
    role: Role
    node_id: int | None = None
    via: str = "token"

    def __str__(self) -> str:
        node = f", node {self.node_id}" if self.node_id is not None else ""
        return f"{self.name} ({self.role}{node}, by {self.via})"


class Refused(Exception):
    """A call not admitted: ``code`` is UNAUTHENTICATED or PERMISSION_DENIED; the message says why (no secret)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def authorize(principal: Principal, method: str) -> None:
    """``Refused(PERMISSION_DENIED)`` unless ``principal``'s role may call ``method`` (``/pkg.Service/Method``)."""
    roles = RULES.get(method)
    if roles is None:
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{short_method(method)} has no access rule: refused to all")
    if roles and principal.role not in roles:
        needs = " or ".join(sorted(r.value for r in roles))
        raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                      f"{principal.name} (role {principal.role}) may not call {short_method(method)}: it needs {needs}")


def short_method(method: str) -> str:
    """``/querycoord.query.QueryCoord/LoadCollection`` -> ``QueryCoord/LoadCollection``."""
    service, _, name = method.strip("/").partition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"
