"""Protobuf helpers: copies between message types that share field names, and the method a request is for.

Several messages are views of one thing: a stream task's ``TaskId`` and the
``TaskStatusReport`` a node sends about it, a catalog ``SegmentBinlogs`` and
the ``SegmentLoadInfo`` a node loads it from, a persisted ``TaskRecord`` and
the ``TaskInfo`` clients see. Where one is built from the other, the fields
they share are copied by name, so a field added to both is carried along
instead of being forgotten in a hand-written list. Likewise a request's type
names its method, so a caller holding the request does not name it again.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor, ServiceDescriptor
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer
from google.protobuf.message import Message

from proto import data_pb2, querynode_pb2

M = TypeVar("M", bound=Message)

# A segment as a load sends it: a load info, or the catalog's binlogs as read (the same field names, which is how a
# node, the coordinator's records and the checks read either).
LoadItem = data_pb2.SegmentLoadInfo | data_pb2.SegmentBinlogs


def load_items(request: querynode_pb2.LoadSegmentsRequest) -> RepeatedCompositeFieldContainer[Any]:
    """The segments of a LoadSegments request: its infos, or its binlogs when it has no infos (a node refuses a
    request with both). The request's own repeated field: removing from it removes from the request."""
    items: RepeatedCompositeFieldContainer[Any] = request.infos or request.binlogs
    return items


def copy_fields(source: Message, target: type[M], **fields: Any) -> M:
    """A ``target`` with the fields of ``source`` that it has by name, and ``fields`` over them.

    A field with presence (``optional``, a sub-message) is copied only when
    ``source`` has it set, so the copy leaves it unset as the source does.
    """
    shared = {
        name: getattr(source, name)
        for name, has_presence in _shared_fields(source.DESCRIPTOR, target.DESCRIPTOR)
        if name not in fields and (not has_presence or source.HasField(name))
    }
    return target(**shared, **fields)


@functools.cache
def _shared_fields(source: Descriptor, target: Descriptor) -> tuple[tuple[str, bool], ...]:
    """The fields of ``source`` that ``target`` has by name, each with whether it has presence (cached: hot paths
    such as a stream node's reports copy the same pair of types again and again)."""
    names = target.fields_by_name
    return tuple((f.name, f.has_presence) for f in source.fields if f.name in names)


def copy_without(source: M, *fields: str) -> M:
    """A copy of ``source`` with every field set but ``fields`` (left unset).

    Why not ``CopyFrom`` and clear them: such a field is often the bulk of the message (a request's thousands of
    segments), which ``CopyFrom`` copies only to throw away. The other fields are found by ``ListFields``, so a
    field added to the message later is copied too.
    """
    out = type(source)()
    for fd, value in source.ListFields():
        if fd.name in fields:
            continue
        if fd.is_repeated:
            getattr(out, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(out, fd.name).CopyFrom(value)
        else:
            setattr(out, fd.name, value)
    return out


def rpc_method(service: ServiceDescriptor, request: Message) -> str:
    """The method of ``service`` that takes ``request`` (every method of the services here has its own type)."""
    return next(m.name for m in service.methods if m.input_type.full_name == request.DESCRIPTOR.full_name)


__all__ = ["copy_fields", "copy_without", "rpc_method"]
