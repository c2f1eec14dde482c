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
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)


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


def rpc_method(service: ServiceDescriptor, request: Message) -> str:
    """The method of ``service`` that takes ``request`` (every method of the services here has its own type)."""
    return next(m.name for m in service.methods if m.input_type.full_name == request.DESCRIPTOR.full_name)


__all__ = ["copy_fields", "rpc_method"]
