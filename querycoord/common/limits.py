"""Bounds on what one request may ask for: every count, list and string a caller sends is checked against these.

Why: a request's numbers must never size the coordinator's work. A Catalog
CreateCollection with ``num_partitions = 2**31 - 1`` once made the coordinator
build a list of two billion names and die at 23 GB; a list of a million ids
costs a million etcd reads. Each RPC is checked against these bounds before
anything is queued or written (``querycoord.common.validate``), so what a request
costs is bounded by the configuration, not by the caller.

The defaults follow Milvus where it has a rule (4096 partitions per
collection, 64 shards, 255-character names) and are otherwise generous
enough for every client of this repository: the coordinator's own requests
to query nodes (merged to about 200 KB) and the CLI's AddSegments batches
(2,000 segments) stay far below them. Checking a request is linear in it and
costs a few microseconds per item (10,000 segments: about 0.15 s; 20,000 task
reports of a heartbeat: about 0.15 s), so the bounds also bound how long one
request holds the event loop. They are
configurable (``CoordConfig.limits``, ``--max-*`` options, ``[coord]`` keys,
``QUERYCOORD_COORD_MAX_*`` variables); query nodes use the defaults.

This module imports nothing of the runtime (``querycoord.settings.config`` imports it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# The largest value of a protobuf int64: every id travels as one.
INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class Limits:
    """Configurable bounds of one request (see module docstring); every bound is at least 1."""

    # Catalog: partitions of one collection (Milvus proxy.maxPartitionNum), DM channels (maxShardNum), schema fields.
    max_partitions: int = 4096
    max_dm_channels: int = 64
    max_fields: int = 64
    # Names of collections, partitions, fields, channels, streams, databases (Milvus maxNameLength).
    max_name_length: int = 255
    # Free text: descriptions, addresses, binlog and index file paths, error messages in reports.
    max_text_length: int = 4096
    # Segments in one AddSegments or LoadSegments request, and binlog or index files of one segment.
    max_segments_per_request: int = 10_000
    max_files_per_segment: int = 4096
    # Ids in one list field (collection_ids, partition_ids, segment_ids, node ids, compaction_from...).
    max_ids_per_request: int = 65_536
    # Query nodes named by one LoadBalance.
    max_nodes_per_request: int = 1024
    # In-memory replicas of a loaded collection (each also needs its own online query nodes).
    max_replicas: int = 16
    # Task trees per ListTasks page (larger asks are capped, as the proto says).
    max_list_tasks: int = 1000
    # Streams: source vgroups of one stream, tasks of one stream (readers, trigger, runners), snodes in all,
    # task reports and stream groups of one heartbeat, stream refs of one ShowStreams.
    max_vgroups_per_stream: int = 4096
    max_tasks_per_stream: int = 10_000
    max_snodes: int = 1024
    max_tasks_per_heartbeat: int = 20_000
    max_stream_groups: int = 1024
    max_streams_per_request: int = 4096
    # Heavy reads (GetSegmentInfo, GetReplicas, ListTasks) per kind on one coordinator: running at once, and
    # callers waiting beyond them (``querycoord.serving.read_slots``); the next gets RESOURCE_EXHAUSTED.
    max_heavy_reads: int = 4
    max_heavy_reads_waiting: int = 64
    # Streams with their own series in /metrics (lag, processed time, failed); beyond it the streams stopped by an
    # error and then the most lagging are kept, and ``querycoord_stream_metrics_omitted`` counts the rest.
    max_stream_metrics: int = 10_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {f.name} must be a positive integer, got {value!r}")


DEFAULT_LIMITS = Limits()

__all__ = ["DEFAULT_LIMITS", "INT64_MAX", "Limits"]
