"""Checks of what a new collection names: its name, partitions and schema (Milvus's rules and limits).

The limits are those of Milvus (proxy.maxPartitionNum, maxShardNum, maxFieldNum, maxDimension, maxNameLength);
their defaults are ``querycoord.common.limits.Limits``, which a store is given (the coordinator's configuration).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from proto import catalog_pb2
from querycoord.catalog.errors import InvalidArgument
from querycoord.common.limits import DEFAULT_LIMITS, Limits

MAX_PARTITIONS = DEFAULT_LIMITS.max_partitions
MAX_DM_CHANNELS = DEFAULT_LIMITS.max_dm_channels
DEFAULT_DM_CHANNELS = 2
MAX_FIELDS = DEFAULT_LIMITS.max_fields
MAX_DIM = 32768
MAX_NAME_LENGTH = DEFAULT_LIMITS.max_name_length
DEFAULT_PARTITION_NAME = "_default"
# Milvus gives user fields ids from 100 on (0 and 1 are the row id and timestamp system fields).
FIRST_FIELD_ID = 100

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VECTOR_TYPES = (catalog_pb2.DATA_TYPE_FLOAT_VECTOR, catalog_pb2.DATA_TYPE_BINARY_VECTOR)


def check_name(kind: str, name: str, limit: int = MAX_NAME_LENGTH) -> None:
    """Milvus's naming rule; it also keeps names usable as etcd key segments."""
    if not name:
        raise InvalidArgument(f"{kind} name is empty")
    if len(name) > limit:
        raise InvalidArgument(f"{kind} name {name[:40]!r}... is {len(name)} characters long (limit {limit})")
    if not _NAME_RE.match(name):
        raise InvalidArgument(
            f"{kind} name {name!r} is invalid: it must start with a letter or '_' and contain only letters, "
            f"digits and '_'"
        )


def short_list(values: Iterable[object], limit: int = 10) -> str:
    """The first ``limit`` values, comma-separated, and how many there are in all if more."""
    items = list(values)
    text = ", ".join(map(str, items[:limit]))
    return text + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def checked_partition_names(partition_names: Sequence[str], num_partitions: int, limits: Limits) -> list[str]:
    """The partition names to create, checked. The counts are checked before any name is built, so a request
    for billions of partitions is refused without building a name."""
    if partition_names and num_partitions and num_partitions != len(partition_names):
        raise InvalidArgument(
            f"num_partitions is {num_partitions} but {len(partition_names)} partition names were given; "
            f"give one or the other"
        )
    if num_partitions < 0:
        raise InvalidArgument(f"num_partitions must be >= 0, got {num_partitions}")
    requested = max(num_partitions, len(partition_names))
    if requested > limits.max_partitions:
        raise InvalidArgument(f"{requested} partitions requested (num_partitions / partition_names); a "
                              f"collection has at most {limits.max_partitions} (limit max_partitions)")
    if partition_names:
        names = list(partition_names)
    elif num_partitions:
        names = [f"partition_{i}" for i in range(num_partitions)]
    else:
        names = [DEFAULT_PARTITION_NAME]
    for pname in names:
        check_name("partition", pname, limits.max_name_length)
    dup = sorted(n for n, count in Counter(names).items() if count > 1)
    if dup:
        raise InvalidArgument(f"partition names must be unique; repeated: {short_list(dup)}")
    return names

def _check_field_type(f: catalog_pb2.FieldSchema) -> None:
    """A field's data type is a valid one; a vector field has a dim in range (a multiple of 8 for binary vectors),
    a scalar field none."""
    if f.data_type == catalog_pb2.DATA_TYPE_NONE or f.data_type not in catalog_pb2.DataType.values():
        raise InvalidArgument(f"field {f.name!r} has no valid data type ({f.data_type})")
    if f.data_type in _VECTOR_TYPES:
        if not 0 < f.dim <= MAX_DIM:
            raise InvalidArgument(f"vector field {f.name!r} needs a dim in 1..{MAX_DIM}, got {f.dim}")
        if f.data_type == catalog_pb2.DATA_TYPE_BINARY_VECTOR and f.dim % 8:
            raise InvalidArgument(f"binary vector field {f.name!r} needs a dim divisible by 8, got {f.dim}")
    elif f.dim:
        raise InvalidArgument(f"scalar field {f.name!r} must not have a dim (got {f.dim})")


def checked_schema(
    name: str, schema: catalog_pb2.CollectionSchema | None, limits: Limits = DEFAULT_LIMITS
) -> catalog_pb2.CollectionSchema:
    """A copy of ``schema`` with its name set and field ids assigned, after Milvus's checks."""
    out = catalog_pb2.CollectionSchema()
    if schema is not None:
        out.CopyFrom(schema)
    if out.name and out.name != name:
        raise InvalidArgument(f"schema name {out.name!r} differs from the collection name {name!r}")
    out.name = name
    if len(out.fields) > limits.max_fields:
        raise InvalidArgument(f"schema has {len(out.fields)} fields; at most {limits.max_fields} are allowed")
    seen_names: set[str] = set()
    used_ids = {f.field_id for f in out.fields if f.field_id}
    if len(used_ids) != len([f for f in out.fields if f.field_id]):
        raise InvalidArgument("schema field ids must be unique")
    if any(f.field_id < 0 for f in out.fields):
        raise InvalidArgument("schema field ids must be >= 0 (0 = assign)")
    next_id = FIRST_FIELD_ID
    for f in out.fields:
        check_name("field", f.name, limits.max_name_length)
        if f.name in seen_names:
            raise InvalidArgument(f"schema field name {f.name!r} is repeated")
        seen_names.add(f.name)
        _check_field_type(f)
        if not f.field_id:
            while next_id in used_ids:
                next_id += 1
            f.field_id = next_id
            used_ids.add(next_id)
    primaries = [f.name for f in out.fields if f.is_primary_key]
    if len(primaries) > 1:
        raise InvalidArgument(f"a schema has at most one primary key field; got {', '.join(primaries)}")
    return out
