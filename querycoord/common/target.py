"""What a loaded collection should hold: its target, as the checker compares it with the nodes.

A module of its own because two places build it: the checker from catalog
reads (a remote catalog), and ``catalog.targets.CatalogTargets`` from its
followed copy of the catalog (a local one).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TargetSegment:
    segment_id: int
    partition_id: int
    compaction_from: tuple[int, ...] = ()
    mem_size: int = 0  # bytes a node needs to hold it: what the checker weighs a repair's placement by


@dataclass
class Target:
    """What one loaded collection should have held: segments by id, DM channel names."""

    segments: dict[int, TargetSegment] = field(default_factory=dict)
    channels: set[str] = field(default_factory=set)
    # The same segments by partition, when whoever built the target had them so (the catalog copy does): the
    # checker's whole-collection fast path (``checkers.whole``) compares a node's report of one partition with
    # it. Empty: not known.
    partitions: dict[int, dict[int, TargetSegment]] = field(default_factory=dict)
