"""Bounds a reference query node checks on every request before its state sees it (``querycoord.common.validate``).

The node's state already refuses what contradicts its rules (another node's
id, a stale fence, a segment of another collection); these checks come first
and refuse what no rule should have to look at: lists longer than the
``Limits`` allow, names and paths too long or with control characters,
unknown enum values, negative ids. A refusal is ILLEGAL_ARGUMENT naming the
field, its value and the limit, and changes nothing.

Lists the coordinator fills from what it holds (segment ids of a release,
the flushed and dropped ids of a channel) are only checked value by value:
their length is that of the collection, bounded by the message size, not by
a request limit a large collection could exceed. Query nodes use the default
limits (they have no coordinator configuration).

A LoadSegments request carries up to ``max_segments_per_request`` infos, and
checking them one by one was most of what a node spent per segment: the
infos are read once, column-wise (``LoadColumns``, shared with the state),
and the usual request is accepted by a few tests over whole columns. Only a
request that fails those is checked info by info, to refuse the first bad
info with the message it always had.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

from loguru import logger

from proto import common_pb2, data_pb2, querynode_pb2
from querycoord.common.errors import status_of
from querycoord.common.limits import DEFAULT_LIMITS, INT64_MAX, Limits
from querycoord.common.messages import LoadItem, load_items
from querycoord.common.validate import (
    InvalidField,
    check_count,
    check_enum,
    check_id,
    check_name,
    check_range,
    check_text,
    check_texts,
    name_ok,
)
from querycoord.nodes.querynode_state import LoadColumns


def _nonnegative_ids(field: str, values: Any) -> None:
    for value in values:
        check_range(field, value, 0, INT64_MAX)


def _check_common(request: Any) -> None:
    """The fields every coordinator-to-node request carries (proto/querynode.proto conventions)."""
    if request.HasField("fence"):
        check_range("fence.leader_revision", request.fence.leader_revision, 0, INT64_MAX)
        check_range("fence.coordinator_id", request.fence.coordinator_id, 0, INT64_MAX)
    check_range("node_id", request.node_id, 0, INT64_MAX)
    check_range("task_id", request.task_id, 0, INT64_MAX)


def _check_channels(field: str, infos: Any, limits: Limits) -> None:
    check_count(field, infos, limits.max_dm_channels)
    for ch in infos:
        check_id(f"{field}.collection_id", ch.collection_id, optional=True)
        check_name(f"{field}.channel_name", ch.channel_name, limits.max_name_length, required=False)
        for name in ("unflushed_segment_ids", "flushed_segment_ids", "dropped_segment_ids"):
            _nonnegative_ids(f"{field}.{name}", getattr(ch, name))


# The characters ``str.isprintable`` refuses among ASCII ones: the C0 controls and DEL.
_ASCII_CONTROLS = (*range(0x20), 0x7F)


def _printable(text: str) -> bool:
    """``text.isprintable()``, several times faster for ASCII text (file paths, names): ``isprintable`` looks up
    every character in the Unicode database, while an ASCII string (``isascii`` is a flag, not a scan) is
    printable exactly when it has none of the 33 ASCII controls, each looked for by ``memchr`` (``in``)."""
    if not text.isascii():
        return text.isprintable()
    raw = text.encode("ascii")
    return not any(map(raw.__contains__, _ASCII_CONTROLS))


def _paths_ok(paths: Any, limit: int) -> bool:
    """The fast test that every path is non-empty, at most ``limit`` long and printable (``text_ok``), in C: a
    concatenation of strings is printable exactly when each of them is."""
    return not paths or (all(paths) and max(map(len, paths)) <= limit and _printable("".join(paths)))


_BINLOG_PATHS = attrgetter("binlog_paths")
# A repeated field as a list, copied in C: iterating the field itself ends each time in an IndexError the message
# formats (the sequence protocol), which cost more than the paths it listed.
_AS_LIST = itemgetter(slice(None))


def _plain_infos_ok(columns: LoadColumns, limits: Limits) -> bool:
    """Whether every info passes the one-expression test of ``_check_load_info`` (so none is refused), tested on
    the whole request at once: min over a column instead of a comparison per info, each distinct insert channel
    once, and the binlog paths of all infos as one list (``_paths_ok``: all non-empty, short and printable
    exactly when each info's are). False: ask ``_check_load_info``, info by info, which refusal it is."""
    if not (columns.plain and columns.nonnegative):
        return False
    name = limits.max_name_length
    if not all(name_ok(channel, name) for channel in set(columns.insert_channels)):
        return False
    paths = list(map(_AS_LIST, map(_BINLOG_PATHS, columns.infos)))
    return (max(map(len, paths)) <= limits.max_files_per_segment
            and _paths_ok(list(chain.from_iterable(paths)), limits.max_text_length))


def _check_load_infos(infos: Any, limits: Limits, columns: LoadColumns | None, field: str = "infos") -> None:
    """Refuse the first info ``_check_load_info`` refuses; the usual request (all fine) tested in bulk first."""
    if not infos:
        return
    if columns is None:
        columns = LoadColumns.of(infos)
    if len(columns) == len(infos) and _plain_infos_ok(columns, limits):
        return
    for info in infos:
        _check_load_info(info, limits, field)


def _check_load_info(info: LoadItem, limits: Limits, field: str = "infos") -> None:
    text, name = limits.max_text_length, limits.max_name_length
    # The usual segment in one expression; any doubt: the named checks below.
    if (info.segment_id > 0 and info.partition_id >= 0 and info.collection_id >= 0 and info.num_rows >= 0
            and info.mem_size >= 0 and len(info.binlog_paths) <= limits.max_files_per_segment
            and not info.compaction_from and not info.index_infos and name_ok(info.insert_channel, name)
            and _paths_ok(info.binlog_paths, text)):
        return
    check_id(f"{field}.segment_id", info.segment_id)
    check_range(f"{field}.partition_id", info.partition_id, 0, INT64_MAX)
    check_range(f"{field}.collection_id", info.collection_id, 0, INT64_MAX)
    check_range(f"{field}.num_rows", info.num_rows, 0, INT64_MAX)
    check_range(f"{field}.mem_size", info.mem_size, 0, INT64_MAX)
    check_texts(f"{field}.binlog_paths", info.binlog_paths, limits.max_files_per_segment, limits.max_text_length)
    check_count(f"{field}.compaction_from", info.compaction_from, limits.max_ids_per_request)
    _nonnegative_ids(f"{field}.compaction_from", info.compaction_from)
    check_name(f"{field}.insert_channel", info.insert_channel, limits.max_name_length, required=False)
    check_count(f"{field}.index_infos", info.index_infos, limits.max_fields)
    for index in info.index_infos:
        check_name(f"{field}.index_infos.index_name", index.index_name, limits.max_name_length, required=False)
        check_texts(f"{field}.index_infos.index_file_paths", index.index_file_paths, limits.max_files_per_segment,
                    limits.max_text_length)


def check_node_request(kind: str, request: Any, limits: Limits = DEFAULT_LIMITS, *,
                       columns: LoadColumns | None = None) -> None:
    """Refuse (``InvalidField``) a request of RPC ``kind`` that is out of bounds; see the module docstring.

    ``columns``: ``LoadColumns.of(load_items(request))`` of a LoadSegments request, when the caller has read them (to
    hand them to the state too); read here otherwise, once the number of infos is checked.
    """
    if kind == "GetComponentStates":
        return
    _check_common(request)
    if hasattr(request, "collection_id"):
        check_range("collection_id", request.collection_id, 0, INT64_MAX)
    if hasattr(request, "partition_ids"):
        check_count("partition_ids", request.partition_ids, limits.max_partitions)
        _nonnegative_ids("partition_ids", request.partition_ids)
    if isinstance(request, querynode_pb2.LoadSegmentsRequest):
        check_count("infos", request.infos, limits.max_segments_per_request)
        check_count("binlogs", request.binlogs, limits.max_segments_per_request)
        if request.infos and request.binlogs:
            raise InvalidField("binlogs", len(request.binlogs), "sent with infos: a LoadSegments request carries "
                                                                 "infos or binlogs, not both")
        if request.HasField("planned"):
            raise InvalidField("planned", len(request.planned.segment_ids),
                               "segment references sent: they are the coordinator's record of a load, not a load")
        _check_load_infos(load_items(request), limits, columns, "binlogs" if request.binlogs else "infos")
        check_range("source_node_id", request.source_node_id, 0, INT64_MAX)
        check_enum("load_type", request.load_type, data_pb2.LoadType)
    elif isinstance(request, querynode_pb2.ReleaseSegmentsRequest):
        _nonnegative_ids("segment_ids", request.segment_ids)
    elif isinstance(request, querynode_pb2.WatchDmChannelsRequest):
        _check_channels("infos", request.infos, limits)
        check_enum("load_type", request.load_type, data_pb2.LoadType)
    elif isinstance(request, querynode_pb2.ReleaseDmChannelsRequest):
        check_count("channel_names", request.channel_names, limits.max_dm_channels)
        for name in request.channel_names:
            check_name("channel_names", name, limits.max_name_length)
    elif isinstance(request, querynode_pb2.WatchDeltaChannelsRequest):
        _check_channels("infos", request.infos, limits)
    elif isinstance(request, querynode_pb2.AddQueryChannelRequest):
        check_name("query_channel", request.query_channel, limits.max_name_length, required=False)
        check_name("query_result_channel", request.query_result_channel, limits.max_name_length, required=False)
        if request.HasField("seek_position"):
            check_name("seek_position.channel_name", request.seek_position.channel_name, limits.max_name_length,
                       required=False)
            check_text("seek_position.msg_group", request.seek_position.msg_group, limits.max_name_length)
    elif isinstance(request, querynode_pb2.GetSegmentInfoRequest):
        check_count("segment_ids", request.segment_ids, limits.max_ids_per_request)
        _nonnegative_ids("segment_ids", request.segment_ids)


def load_columns(request: querynode_pb2.LoadSegmentsRequest, limits: Limits = DEFAULT_LIMITS) -> LoadColumns | None:
    """The infos of a LoadSegments request read once for the checks and the state to share (``columns`` of
    ``check_node_request`` and ``QueryNodeState.load_segments``), or None when they are more than the checks
    accept: those are refused before any info is read."""
    infos = load_items(request)
    return LoadColumns.of(infos) if len(infos) <= limits.max_segments_per_request else None


def refused(kind: str, request: Any, node_id: int, limits: Limits = DEFAULT_LIMITS, *,
            columns: LoadColumns | None = None) -> common_pb2.Status | None:
    """The ILLEGAL_ARGUMENT status of an out-of-bounds request (logged in one line), or None when it is fine;
    ``columns`` as ``check_node_request`` takes them."""
    try:
        check_node_request(kind, request, limits, columns=columns)
    except InvalidField as exc:
        logger.info("query node {}: {} refused: {}", node_id, kind, exc)
        return status_of(exc)
    return None


__all__ = ["check_node_request", "load_columns", "refused"]
