"""CordonNode, UncordonNode and DrainNode: the QueryCoord service's node maintenance calls
(``querycoord.leader.maintenance`` does the work on the leader).

Cordon and uncordon are an administrator's. DrainNode is also a query node's own call when it is stopped
(``nodes.querynode``'s graceful stop): a caller authenticated as a query node may drain only itself (its
credential must name the node id asked for, as a stream node's heartbeat must) and its drain is always a
graceful stop's, undone when the node registers again.
"""

from __future__ import annotations

from typing import Any

import grpc

from proto import common_pb2
from proto import querycoord_pb2 as qc
from querycoord.common.validate import check_id
from querycoord.leader import maintenance
from querycoord.security.auth import caller, require_node
from querycoord.security.auth_rules import Role
from querycoord.serving.gate import LeaderGate, answered

OK = common_pb2.Status(error_code=common_pb2.SUCCESS)


class NodeLifecycleRpcs:
    """Mixed into the QueryCoord servicer, whose ``gate`` it uses."""

    gate: LeaderGate

    @answered(qc.NodeLifecycleResponse)
    async def CordonNode(self, request: qc.NodeLifecycleRequest, context: grpc.aio.ServicerContext) -> Any:
        node_id = check_id("node_id", request.node_id)
        lead = await self.gate.lead(context)
        return qc.NodeLifecycleResponse(status=OK, node=await maintenance.cordon(lead, node_id))

    @answered(qc.NodeLifecycleResponse)
    async def UncordonNode(self, request: qc.NodeLifecycleRequest, context: grpc.aio.ServicerContext) -> Any:
        node_id = check_id("node_id", request.node_id)
        lead = await self.gate.lead(context)
        return qc.NodeLifecycleResponse(status=OK, node=await maintenance.uncordon(lead, node_id))

    @answered(qc.NodeLifecycleResponse)
    async def DrainNode(self, request: qc.NodeLifecycleRequest, context: grpc.aio.ServicerContext) -> Any:
        node_id = check_id("node_id", request.node_id)
        who = caller()
        graceful = request.graceful_stop
        if who is not None and who.role is Role.NODE:
            await require_node(context, node_id, what="drain request")
            graceful = True
        lead = await self.gate.lead(context)
        return qc.NodeLifecycleResponse(status=OK, node=await maintenance.drain(lead, node_id,
                                                                               graceful_stop=graceful))
