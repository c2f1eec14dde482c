"""The checker's rules, on a real cluster (real etcd, real gRPC nodes in this process).

What nodes hold is read from the nodes themselves (``node.state``), never from what the coordinator believes.
"""

from __future__ import annotations

import asyncio

from meta.ops.etcd_server import EtcdCluster
from proto import common_pb2, data_pb2, querynode_pb2, task_pb2
from proto import querycoord_pb2 as qc
from querycoord.leader.view import Leadership
from querycoord.nodes.querynode import FaultConfig, QueryNode
from querycoord.nodes.querynode_faults import FaultInjector
from querycoord.querymeta import QueryMeta
from querycoord.task.repair import RepairTask
from tests.cluster import MiB, QueryCluster, running_cluster, wait_until


async def replica_nodes_shown(c: QueryCluster, cid: int) -> set[int]:
    assert c.client is not None
    r = await c.client.query("GetReplicas", qc.GetReplicasRequest(collection_id=cid))
    assert r.status.error_code == common_pb2.SUCCESS, r.status
    return {n for rep in r.replicas for n in rep.node_ids}


def leadership(c: QueryCluster) -> Leadership:
    lead = c.coords[0].coord.leadership
    assert lead is not None
    return lead


async def pause_checker(lead: Leadership) -> None:
    """Stop the leader's checker loop (and what kicks it): the test plays the checker, so no pass of its own
    repairs what the test arranged before the test looks (nor the repair a lost node's forget queues)."""
    lead.checker.repair_at_forget = False
    loops = [t for t in lead.tasks if t.get_name() in ("checker", "checker-kicks")]
    for t in loops:
        t.cancel()
    await asyncio.gather(*loops, return_exceptions=True)


def give(node: QueryNode, cid: int, sid: int, pid: int) -> None:
    """Outside hands: the node loads a copy nobody asked it to."""
    req = querynode_pb2.LoadSegmentsRequest(collection_id=cid, node_id=node.node_id, infos=[
        data_pb2.SegmentLoadInfo(segment_id=sid, collection_id=cid, partition_id=pid, mem_size=10)])
    node.state.load_segments(req)


async def run_repair(lead: Leadership, c: QueryCluster, cid: int, req: task_pb2.RepairRequest) -> None:
    """Queue a repair as the checker would, and wait until it ended."""
    task = RepairTask.new(lead.env, req, trigger_condition=qc.TRIGGER_CONDITION_CHECKER, collection_id=cid)
    await lead.scheduler.enqueue(task)
    await c.wait_idle()


async def test_a_queued_release_never_drops_what_became_the_replicas_only_copy(etcd: EtcdCluster,
                                                                               root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None, None]) as c:
        cid = await c.create_collection("only_copy", partitions=1, segments=6, channels=1)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = leadership(c)
        await pause_checker(lead)
        meta = lead.meta
        a, b = c.nodes
        on_b = sorted(b.state.segments)
        assert len(on_b) >= 2, "the load spreads the segments over both nodes"
        dup, only = on_b[:2]
        pid = meta.get_segment(dup).partition_id
        for sid in (dup, only):
            give(a, cid, sid, pid)  # A holds a second copy of each, in the same replica as B's
        release = [task_pb2.NodeSegments(node_id=a.node_id, segment_ids=[dup])]

        # While B holds its copy, the planned release of A's second copy goes through.
        await run_repair(lead, c, cid, task_pb2.RepairRequest(release_segments=release, reason="duplicate"))
        assert dup not in a.state.segments and dup in b.state.segments

        # Planned while B held ``only`` too; B dies before the repair runs: A's copy is now the replica's only one.
        planned = task_pb2.RepairRequest(release_segments=[
            task_pb2.NodeSegments(node_id=a.node_id, segment_ids=[only])], reason="duplicate")
        await b.stop()
        c.nodes.remove(b)
        await wait_until(lambda: b.node_id not in meta.bound_node_ids(), "the leader forgot node B")
        await run_repair(lead, c, cid, planned)
        assert only in a.state.segments, "the release ran after B died: it must keep the replica's only copy"


async def test_a_replica_member_that_held_nothing_leaves_its_replica_when_it_dies(etcd: EtcdCluster,
                                                                                 root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None], checker_interval=0.3) as c:
        cid = await c.create_collection("empty_member", partitions=1, segments=4, channels=1)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = c.coords[0].coord.leadership
        assert lead is not None
        meta = lead.meta
        (replica,) = meta.replica_ids(cid)
        spare = await c.add_node()
        await c.wait_node_online(spare.node_id)
        # A spare joins the replica (as ``plan_children`` makes one join) and is given nothing to hold.
        await meta.add_replica_nodes(cid, replica, [spare.node_id])
        assert spare.node_id in await replica_nodes_shown(c, cid)
        assert not spare.state.segments and not spare.state.dm_channels

        await spare.stop()
        c.nodes.remove(spare)
        await wait_until(lambda: spare.node_id not in meta.replica_nodes(cid, replica), "the dead member left")
        assert spare.node_id not in await replica_nodes_shown(c, cid)
        assert c.kv is not None
        persisted = QueryMeta(c.kv)  # what a standby or the next leader reads from etcd
        await persisted.reload()
        assert spare.node_id not in persisted.replica_nodes(cid, replica)
        assert spare.node_id not in persisted.known_node_ids()

        # A member that died while nobody watched (no node-down event reaches this leader): the checker's pass
        # forgets it all the same, although it holds nothing the pass could have noticed missing.
        ghost = max(meta.known_node_ids() | {n.node_id for n in c.nodes}) + 100
        await meta.add_replica_nodes(cid, replica, [ghost])
        await wait_until(lambda: ghost not in meta.replica_nodes(cid, replica), "the checker forgot the ghost")
        assert ghost not in await replica_nodes_shown(c, cid)


async def test_compaction_sources_are_kept_through_a_chain_until_the_final_result_is_held(etcd: EtcdCluster,
                                                                                          root_path: str) -> None:
    """A -> B -> C by handoff, B never loaded (no room): A serves its rows until C is held anywhere, then goes."""
    async with running_cluster(etcd, root_path, [None], capacity=64 * MiB, checker_interval=0.3) as c:
        cid = await c.create_collection("chain", partitions=1, segments=4, channels=1)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = leadership(c)
        assert lead.checker is not None
        (first,) = c.nodes
        catalog = c.coords[0].coord.catalog
        assert catalog is not None
        a = min(first.state.segments)
        pid = lead.meta.get_segment(a).partition_id

        def compacted(sources: list[int]) -> data_pb2.SegmentBinlogs:
            # Too big for the one node with or without A: parked for room, never loaded there.
            return data_pb2.SegmentBinlogs(collection_id=cid, partition_id=pid, num_rows=100, mem_size=48 * MiB,
                                           binlog_paths=["x"], compaction_from=sources)

        (b,) = await catalog.add_segments([compacted([a])])
        (final,) = await catalog.add_segments([compacted([b])])
        (replica,) = lead.meta.replica_ids(cid)
        await wait_until(lambda: lead.env.parked.get(cid, replica) is not None, "the final result parked for room")
        runs = lead.checker.runs
        await wait_until(lambda: lead.checker is not None and lead.checker.runs >= runs + 2, "two more passes")
        await c.wait_idle()
        assert a in first.state.segments, "A is the only thing serving the rows of C (through B): kept"
        assert final not in first.state.segments and b not in first.state.segments

        roomy = await c.add_node()  # room for C: it is loaded there, and only then is A released
        await wait_until(lambda: final in roomy.state.segments and a not in first.state.segments,
                         "C held by the new node, then A released")
        await c.wait_idle()
        held = [s for n in c.nodes for s in n.state.segments]
        assert held.count(final) == 1 and a not in held and b not in held


def watchers(c: QueryCluster, cid: int, name: str) -> set[int]:
    """The nodes that say they watch DM channel ``name`` of the collection."""
    return {n.node_id for n in c.nodes if n.healthy and (w := n.state.dm_channels.get(name)) is not None
            and w.collection_id == cid}


def watch(node: QueryNode, cid: int, name: str) -> None:
    """Outside hands: the node watches a channel nobody asked it to."""
    node.state.watch_dm_channels(querynode_pb2.WatchDmChannelsRequest(collection_id=cid, node_id=node.node_id,
                                                                      infos=[data_pb2.VChannelInfo(
                                                                          collection_id=cid, channel_name=name)]))


async def test_a_dm_channel_watched_twice_in_a_replica_or_outside_the_replicas_is_released(
        etcd: EtcdCluster, root_path: str) -> None:
    async with running_cluster(etcd, root_path, [None, None], checker_interval=0.3) as c:
        cid = await c.create_collection("twice", partitions=1, segments=4, channels=2)
        await c.load_collection(cid)
        await c.wait_idle()
        meta = leadership(c).meta
        recorded = {name: w.node_id for name, w in ((w.dm_channel, w) for w in meta.dm_channels_of(cid))}
        c0, c1 = sorted(recorded)
        assert all(watchers(c, cid, name) == {node} for name, node in recorded.items())
        by_id = {n.node_id: n for n in c.nodes}
        second = next(n for n in c.nodes if n.node_id != recorded[c0])  # the replica's other node
        spare = await c.add_node()  # in no replica of the collection
        await c.wait_node_online(spare.node_id)
        watch(second, cid, c0)
        watch(spare, cid, c1)
        assert watchers(c, cid, c0) == {recorded[c0], second.node_id}
        assert watchers(c, cid, c1) == {recorded[c1], spare.node_id}

        await wait_until(lambda: all(watchers(c, cid, name) == {node} for name, node in recorded.items()),
                         "each channel watched once again, by the node meta records")
        await c.wait_idle()
        assert {w.dm_channel: w.node_id for w in meta.dm_channels_of(cid)} == recorded
        assert recorded[c0] in by_id and all(watchers(c, cid, n) == {recorded[n]} for n in (c0, c1))


async def test_a_release_that_failed_on_a_node_is_not_recorded_as_done(etcd: EtcdCluster, root_path: str) -> None:
    """The checker's release of a DM channel watch recorded on a node outside the replicas, and a handoff's release
    of a compaction source: while the node refuses, meta keeps the copy recorded there (it is still held); once it
    lets go, the record goes."""
    async with running_cluster(etcd, root_path, [None], checker_interval=0.3) as c:
        cid = await c.create_collection("refused", partitions=1, segments=4, channels=1)
        await c.load_collection(cid)
        await c.wait_idle()
        lead = leadership(c)
        meta = lead.meta
        (name,) = [w.dm_channel for w in meta.dm_channels_of(cid)]
        (member,) = c.nodes
        outsider = await c.add_node()
        await c.wait_node_online(outsider.node_id)
        healthy = outsider.injector
        refusing = FaultInjector(FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"ReleaseDmChannels"})))
        outsider.injector = refusing
        watch(outsider, cid, name)
        foreign = max(meta.replica_ids(cid)) + 1000  # a copy recorded under no replica of the collection
        await meta.save_dm_channel_watch([data_pb2.DmChannelWatchInfo(
            collection_id=cid, dm_channel=name, node_id=outsider.node_id, replica_id=foreign)])
        await wait_until(lambda: refusing.injected_failures >= 2, "the outsider refused the release twice")
        assert outsider.node_id in watchers(c, cid, name)
        assert meta.dm_channel_copies(cid)[name].get(foreign) == outsider.node_id, "refused: still recorded"
        outsider.injector = healthy
        await wait_until(lambda: watchers(c, cid, name) == {member.node_id}, "the outsider let the channel go")
        await c.wait_idle()
        assert foreign not in meta.dm_channel_copies(cid)[name]

        # A handoff's release of the compaction source, refused by its node: the source stays recorded there.
        await pause_checker(lead)  # its own release of the source would retry for as long as the node refuses
        source = min(member.state.segments)
        (replica,) = meta.replica_ids(cid)
        member.injector = FaultInjector(FaultConfig(failure_rate=1.0, fail_kinds=frozenset({"ReleaseSegments"})))
        catalog = c.coords[0].coord.catalog
        assert catalog is not None
        (result,) = await catalog.add_segments([data_pb2.SegmentBinlogs(
            collection_id=cid, partition_id=meta.get_segment(source).partition_id, num_rows=100, mem_size=1 << 20,
            binlog_paths=["x"], compaction_from=[source])])
        await wait_until(lambda: result in member.state.segments, "the handoff loaded the result")
        await c.wait_idle()
        assert source in member.state.segments, "the node refused to release it"
        assert meta.segment_copies(source) == {replica: member.node_id}, "still held there: still recorded"
        member.injector = healthy
        assert lead.checker is not None
        await lead.checker.check_once()
        await c.wait_idle()
        assert source not in member.state.segments and not meta.segment_copies(source)
