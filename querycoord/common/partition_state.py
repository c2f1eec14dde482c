"""A loaded partition's states (``data.PartitionState``) under the short names the coordinator's code uses.

NOT_PRESENT: recorded in query meta, nothing of it loaded yet (a trigger that never reached its commit point
leaves a partition so). PARTIAL: some of it served. IN_MEMORY: all of it served (100 %).
"""

from __future__ import annotations

from proto import data_pb2

PartitionState = data_pb2.PartitionState
NOT_PRESENT = data_pb2.PARTITION_STATE_NOT_PRESENT
PARTIAL = data_pb2.PARTITION_STATE_PARTIAL_IN_MEMORY
IN_MEMORY = data_pb2.PARTITION_STATE_IN_MEMORY

__all__ = ["IN_MEMORY", "NOT_PRESENT", "PARTIAL", "PartitionState"]
