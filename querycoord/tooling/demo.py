"""``make demo``: the all-in-one query cluster, loads interrupted by a crashed node and a crashed leader.

What it shows, each part a real process on the embedded etcd:

1. etcd, two coordinators (one leads, one stands by) and three query nodes
   start (``allinone``, as ``querycoord up`` does), with 2 s session
   TTLs so a crash is noticed quickly;
2. two collections with tens of partitions and thousands of sealed segments
   are created through the Catalog service (as ``querycoord collection
   create`` does);
3. the first is loaded with a progress bar; mid-load one query node is
   SIGKILLed: the children that were meant for it are rescheduled to the
   survivors (the tree is drawn: each new child names the one it replaces and
   excludes the dead node), the load still reaches 100 %, the dead node is
   forgotten and the checker's repair loads again what it had already
   loaded; where the
   segments then are is read from the nodes (each on exactly one online
   node, none left on the dead one);
4. the second is loaded; mid-load the leading coordinator is SIGKILLed: the
   standby takes over once the dead leader's lease lapses, resumes the
   persisted load task (its checker compares meta with the nodes), and the progress bar (its
   client follows the leader) goes on to 100 %; the takeover time (the new
   leader's "leader" event minus the kill) is printed; the killed
   coordinator is replaced by a fresh standby;
5. the first is released, and a summary printed (load state, segments per
   node, task counts, the takeover time);
6. streams (StreamMgmt, with three reference stream nodes: one leads the
   source vgroups, two host an snode each): two snodes and ten streams are
   created and run (a table from ShowStreams); the node of one snode is
   SIGKILLed: once its session lapses the leader declares the snode lost,
   redeploys the runners other streams had there on the surviving snode (same
   task ids, SID + 1) and stops the streams whose trigger was there (their
   retry is 30 s away: the coordinator's stream timings are TDengine's
   defaults, with no flag to shorten them); one such stream is drawn as
   ``querycoord stream show`` draws it (the calls are the ``stream`` and
   ``snode`` commands' own, ``querycoord.console.actions``); then the leading coordinator is
   SIGKILLed: the new leader watches the nodes' reports, adopts every running
   stream as it runs (same task ids, SIDs and nodes) and redeploys the
   stopped ones. The elapsed time is printed. Exit 0, no process left behind.

The query nodes answer each call after a fixed latency (their fault
injection flag): without it a load of thousands of segments finishes before
anyone could kill a node in the middle of it. The coordinator splits loads
into small requests for the same reason, so the bar moves in steps.

``--election`` runs the stage-one demo instead (``demo_election``): leader
election and fencing with candidate processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

from proto import catalog_pb2, stream_pb2
from proto import querycoord_pb2 as qc
from querycoord.console import actions, draw
from querycoord.net.client import CoordinatorUnavailable, QueryCoordClient
from querycoord.settings.logs import setup_logging
from querycoord.tooling.allinone import AllInOne, ClusterStartError
from querycoord.tooling.demo_election import election_main
from querycoord.tooling.demo_timeline import TTL, Timeline
from querycoord.tooling.harness import Member


# ===== the cluster demo ===============================================================================================
def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``querycoord demo`` / ``python -m querycoord.tooling.demo``; the sizes are hidden knobs for tests."""
    p.add_argument("--election", action="store_true",
                   help="run the stage-one demo instead: leader election and fencing with candidate processes")
    hidden = argparse.SUPPRESS
    p.add_argument("--nodes", type=int, default=3, help=hidden)
    p.add_argument("--partitions", type=int, default=24, help=hidden)
    p.add_argument("--segments", type=int, default=3000, help=hidden)
    p.add_argument("--latency-ms", type=float, default=250.0, help=hidden)
    p.add_argument("--request-bytes", type=int, default=4000, help=hidden)
    p.add_argument("--concurrency", type=int, default=6, help=hidden)
    p.add_argument("--kill-at", type=int, default=45, help=hidden)
    p.add_argument("--kill-leader-at", type=int, default=40, help=hidden)
    p.add_argument("--streams", type=int, default=10, help=hidden)  # 0: no stream part


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n:,} {one}" if n == 1 else f"{n:,} {many or one + 's'}"


def _id(node: Member) -> int:
    return node.node_id


async def pick_victim(c: QueryCoordClient, task_id: int, nodes: list[Member]) -> Member:
    """The node to kill: one with loads both done and not yet sent, so the demo shows both recoveries.

    Its loads not yet sent are rescheduled within the load; what it already
    loaded is moved afterwards by the NodeDown balance. A load in flight may
    still be answered before the SIGKILL lands, so loads not yet sent are
    preferred; without them, the node with the most pending loads.
    """
    tree = (await c.query("GetTask", qc.GetTaskRequest(task_id=task_id))).tree
    done: Counter[int] = Counter()
    pending: Counter[int] = Counter()
    unsent: Counter[int] = Counter()  # no attempt made yet: they can only run after the kill
    for ch in tree.children:
        if ch.kind == qc.TASK_KIND_LOAD_SEGMENT:
            (done if ch.state == qc.TASK_STATE_DONE else pending)[ch.node_id] += 1
            if ch.state != qc.TASK_STATE_DONE and ch.retry_count == 0:
                unsent[ch.node_id] += 1
    alive = [n for n in nodes if n.running]
    return max(alive, key=lambda n: (unsent[n.node_id] > 0 and done[n.node_id] > 0, unsent[n.node_id] > 0,
                                     pending[n.node_id] > 0 and done[n.node_id] > 0, pending[n.node_id],
                                     -n.node_id))


def describe_reschedule(tree: qc.TaskTree, dead: int, shown: int = 4) -> list[str]:
    """A headline, then the tree with the rescheduled children only (the rest counted on the last branch).

    The rescheduled segment loads are drawn; when the dead node had no load left to reschedule (its
    last ones were answered before the SIGKILL landed), its rescheduled channel watches are.
    """
    new = [ch for ch in tree.children if draw.is_rescheduled(ch)]
    replaced = {ch.replaces_task_id for ch in new}
    loads = [ch for ch in new if ch.kind == qc.TASK_KIND_LOAD_SEGMENT]
    targets = sorted({ch.node_id for ch in new})
    head = (f"task #{tree.trigger.task_id}: {_count(len(replaced), 'child', 'children')} meant for node {dead} were "
            f"rescheduled to node{'s' if len(targets) > 1 else ''} {', '.join(map(str, targets))}\n"
            f"as {len(new)} new ones ({len(loads)} segment loads, {len(new) - len(loads)} channel watches):")
    drawn = loads or new
    ids = {ch.task_id for ch in drawn}
    more = len(drawn) - min(shown, len(drawn))
    if loads:
        note = (f"other children ({more} more rescheduled loads, their watches, and those done where first planned)"
                if more else "other children (the watches, and those done where first planned)")
    else:
        note = (f"other children ({more} more rescheduled watches, and those done where first planned; node {dead} "
                f"had answered all its loads before the SIGKILL)" if more else
                f"other children (those done where first planned; node {dead} had answered all its loads before "
                f"the SIGKILL)")
    tree_lines = draw.draw_tree(tree, only=lambda ch: ch.task_id in ids, max_children=shown, hidden_note=note)
    return [*head.splitlines(), *tree_lines]


async def wait_node_gone(c: QueryCoordClient, node_id: int, timeout: float = 60.0) -> None:
    """Until the leader places nothing on ``node_id`` (a dead node leaves ShowNodes once its session is gone and
    it is forgotten); at the timeout, return anyway: what it still holds is then printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = (await c.query("ShowNodes", qc.ShowNodesRequest())).nodes
        n = next((n for n in nodes if n.node_id == node_id), None)
        if n is None or (n.state != "online" and n.segment_count == 0 and n.dm_channel_count == 0):
            return
        await asyncio.sleep(0.2)


async def wait_served(c: QueryCoordClient, collection_id: int, timeout: float = 60.0) -> None:
    """Until the leader shows the collection 100 % in memory again (what the dead node held loaded elsewhere);
    at the timeout, return anyway: the placement printed next says what is missing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        show = await c.query("ShowCollections", qc.ShowCollectionsRequest(collection_ids=[collection_id]))
        if show.collections and show.collections[0].in_memory_percentage == 100:
            return
        await asyncio.sleep(0.2)


async def placement(c: QueryCoordClient, collection_id: int, total: int, dead: int) -> str:
    """Where a collection's segments are, as the online nodes report them, and what meta leaves on ``dead``."""
    infos = (await c.query("GetSegmentInfo", qc.GetSegmentInfoRequest(collection_id=collection_id))).infos
    per_node = Counter(s.node_id for s in infos)
    copies = Counter(s.segment_id for s in infos)
    twice = sum(1 for n in copies.values() if n > 1)
    nodes = (await c.query("ShowNodes", qc.ShowNodesRequest())).nodes
    left = next((n.segment_count + n.dm_channel_count for n in nodes if n.node_id == dead), 0)
    return (f"{len(copies):,} of {total:,} segments on online nodes ("
            + ", ".join(f"{nid}: {k:,}" for nid, k in sorted(per_node.items())) + "), "
            + ("none twice" if not twice else f"{twice:,} on two or more")
            + f"; node {dead} holds " + ("none" if not left else f"{left:,} segments and channels in query meta"))


def _cluster(opts: argparse.Namespace, data_dir: str) -> AllInOne:
    """The demo's processes: etcd, two coordinators, the query nodes (answering after ``--latency-ms``) and, with
    ``--streams``, three stream nodes."""
    env = dict(os.environ)
    env["QUERYCOORD_LOG_LEVEL"] = "WARNING"
    return AllInOne(
        nodes=opts.nodes, coordinators=2, listen="127.0.0.1:0", data_dir=data_dir, ttl=TTL, root=f"demo-{os.getpid()}",
        node_capacity_mb=4096,
        coord_args=["--rpc-timeout", "5", "--auto-balance-interval", "0", "--retry-backoff", "0.2",
                    "--max-request-bytes", str(opts.request_bytes),
                    "--max-concurrent-children", str(opts.concurrency)],
        node_args=["--latency-ms", f"{opts.latency_ms:g}"],
        env=env, stop_timeout=5.0,
        # Stream nodes: the first leads the source vgroups, the other two host the snodes (see run_streams).
        stream_nodes=3 if opts.streams else 0, stream_vgroups=[[1, 2], [], []] if opts.streams else None,
        stream_node_args=["--heartbeat-ms", "100"],
    )


def _say_started(tl: Timeline, cluster: AllInOne, opts: argparse.Namespace) -> None:
    """Which process is which: etcd, the leading and the standby coordinator, the query nodes."""
    coord = cluster.coordinator
    assert coord is not None
    tl.say(f"embedded etcd at {', '.join(cluster.etcd_endpoints)}")
    tl.say(f"coordinator {coord.address} (pid {coord.child.pid}) leads; "
           + ", ".join(f"{x.address} (pid {x.child.pid})" for x in cluster.coordinators if x is not coord)
           + " stands by")
    tl.say("query nodes " + ", ".join(f"{n.node_id} (pid {n.child.pid})" for n in sorted(cluster.nodes, key=_id))
           + f" online; each answers after {opts.latency_ms:g} ms")


async def _create(c: QueryCoordClient, tl: Timeline, names: list[str],
                  sizes: list[tuple[int, int]]) -> list[catalog_pb2.CollectionDescription]:
    """The demo's collections, ``sizes`` (partitions, segments) each, through the Catalog service."""
    descs = []
    for name, (parts, segs) in zip(names, sizes, strict=True):
        t = time.monotonic()
        desc, n = await actions.create_collection(c, name, partitions=parts, segments=segs, channels=4)
        descs.append(desc)
        tl.say(f"created {name} (id {desc.collection_id}): {parts} partitions, {n:,} segments of 1 MiB "
               f"in {time.monotonic() - t:.1f}s")
    return descs


async def _load_killing_node(c: QueryCoordClient, tl: Timeline, cluster: AllInOne, opts: argparse.Namespace,
                             a: catalog_pb2.CollectionDescription) -> tuple[int, Member | None]:
    """Load ``a`` and SIGKILL a query node at ``--kill-at`` %; the rescheduled children are drawn. Returns the load's
    task id and the node killed (None when the load finished first)."""
    t = time.monotonic()
    task_a = await actions.load(c, a)
    tl.say(f"LoadCollection {a.name} -> task #{task_a}")
    killed: list[Member] = []
    bar = draw.ProgressBar(f"loading {a.name}", indent=" " * 10)

    async def kill_mid_load(pct: int) -> None:
        if not killed and opts.kill_at <= pct < 100:
            victim = await pick_victim(c, task_a, cluster.nodes)
            killed.append(victim)
            await cluster.kill_node(victim)
            bar.message(f"{tl.stamp()}SIGKILL query node {victim.node_id} (pid {victim.child.pid}) at {pct}%; "
                        f"its session lapses within {TTL:g}s")

    await actions.follow_load(c, a.collection_id, task_a, bar, on_progress=kill_mid_load)
    bar.finish()
    tl.say(f"{a.name} loaded: 100% in {time.monotonic() - t:.1f}s")
    tree = (await c.query("GetTask", qc.GetTaskRequest(task_id=task_a))).tree
    if not killed:
        tl.say("(the load finished before a node could be killed: nothing to reschedule)")
        return task_a, None
    print()
    for line in describe_reschedule(tree, killed[0].node_id):
        print("    " + line)
    print()
    return task_a, killed[0]


async def _say_repaired(c: QueryCoordClient, tl: Timeline, a: catalog_pb2.CollectionDescription, task_a: int,
                        dead: Member, total: int) -> None:
    """Once the dead node is forgotten: what the checker's repairs loaded again, and where ``a``'s segments are."""
    # The load may end before the dead node's session lapses (when its last loads were answered
    # before the SIGKILL): wait for the node to be declared gone and emptied, not only for idle.
    await wait_node_gone(c, dead.node_id)
    await wait_served(c, a.collection_id)
    await wait_idle(c)
    trees = await actions.list_trees(c, include_finished=True, include_children=True)
    for tr in trees:
        if tr.trigger.kind == qc.TASK_KIND_REPAIR and tr.trigger.collection_id == a.collection_id \
                and tr.trigger.task_id > task_a:
            segs = sum(actions.segments_in(ch.summary) for ch in tr.children
                       if ch.kind == qc.TASK_KIND_LOAD_SEGMENT)
            dests = sorted({ch.node_id for ch in tr.children if ch.kind == qc.TASK_KIND_LOAD_SEGMENT})
            if segs:
                tl.say(f"checker repair #{tr.trigger.task_id} ({draw.state_name(tr.trigger.state)}) "
                       f"loaded the {segs:,} segments node {dead.node_id} had held on "
                       f"node{'s' if len(dests) > 1 else ''} {', '.join(map(str, dests))} "
                       f"({_count(len(tr.children), 'child', 'children')})")
    tl.say(f"{a.name}: {await placement(c, a.collection_id, total, dead.node_id)}")


async def _load_killing_leader(c: QueryCoordClient, tl: Timeline, cluster: AllInOne, opts: argparse.Namespace,
                               b: catalog_pb2.CollectionDescription) -> tuple[str, str, float] | None:
    """Load ``b`` and SIGKILL the leading coordinator at ``--kill-leader-at`` %, then replace it by a fresh
    standby. Returns (dead leader, new leader, seconds to take over), None when the load finished first."""
    t = time.monotonic()
    task_b = await actions.load(c, b)
    tl.say(f"LoadCollection {b.name} -> task #{task_b}")
    bar = draw.ProgressBar(f"loading {b.name}", indent=" " * 10)
    takeover: list[tuple[str, str, float]] = []  # (dead leader, new leader, seconds)
    standby: list[asyncio.Task[list[Member]]] = []

    async def kill_leader_mid_load(pct: int) -> None:
        if takeover or not opts.kill_leader_at <= pct < 100:
            return
        old = cluster.coordinator
        assert old is not None
        killed_at = await cluster.kill_leader()
        bar.message(f"{tl.stamp(killed_at)}SIGKILL coordinator {old.address} (pid {old.child.pid}) at {pct}%; "
                    f"its lease lapses within {TTL:g}s")
        ev = await cluster.wait_new_leader(timeout=30.0)
        secs = ev["t"] - killed_at
        takeover.append((old.address, ev["address"], secs))
        bar.message(f"{tl.stamp(ev['t'])}coordinator {ev['address']} took over after {secs:.2f}s "
                    f"(resumed the load)")
        standby.append(asyncio.create_task(cluster.add_coordinators(1)))  # a fresh standby

    await actions.follow_load(c, b.collection_id, task_b, bar, on_progress=kill_leader_mid_load)
    bar.finish()
    tl.say(f"{b.name} loaded: 100% in {time.monotonic() - t:.1f}s")
    if not takeover:
        tl.say("(the load finished before the leader could be killed: no takeover)")
    for new in standby:
        fresh = (await new)[0]
        tl.say(f"replaced the killed coordinator with a standby at {fresh.address} (pid {fresh.child.pid})")
    await wait_idle(c)
    return takeover[0] if takeover else None


async def _print_summary(c: QueryCoordClient, b: catalog_pb2.CollectionDescription, b_segments: int,
                         dead: Member | None, takeover: tuple[str, str, float] | None) -> None:
    """Load state, segments per node, task counts and the takeover time, once ``a`` is released."""
    print("\nsummary")
    print("  collections")
    for line in draw.table(actions.COLLECTION_HEADERS, await actions.collection_rows(c), right=(0, 2, 3, 5, 6)):
        print("    " + line)
    nodes = (await c.query("ShowNodes", qc.ShowNodesRequest())).nodes
    print("  query nodes (segments per node)")
    for line in draw.table(actions.NODE_HEADERS, actions.node_rows(nodes), right=(0, 3, 4, 6)):
        print("    " + line)
    if dead is not None and all(n.node_id != dead.node_id for n in nodes):
        print(f"    (node {dead.node_id} was SIGKILLed: once its segments moved, it left the list)")
    trees = await actions.list_trees(c, include_finished=True, include_children=True)
    kinds = Counter(draw.kind_name(tr.trigger.kind) for tr in trees)
    children = sum(len(tr.children) for tr in trees)
    resched = sum(1 for tr in trees for ch in tr.children if ch.replaces_task_id)
    failed = sum(1 for tr in trees if tr.trigger.state in (qc.TASK_STATE_FAILED, qc.TASK_STATE_CANCELLED))
    known = " known to the new leader" if takeover else ""  # the old leader's finished ones died with it
    print(f"  tasks{known}: {_count(len(trees), 'trigger')} ("
          + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())) + "),\n"
          + f"         {_count(children, 'child', 'children')} ({resched} from rescheduling), {failed} failed")
    held = sum(n.segment_count for n in nodes if n.state == "online")
    print(f"  segments held by online nodes: {held:,} (= {b.name}'s {b_segments:,})")
    if takeover:
        old_addr, new_addr, secs = takeover
        print(f"  leader takeover: {secs:.2f}s ({old_addr} SIGKILLed, {new_addr} took over; "
              f"lease TTL {TTL:g}s)")


async def run_cluster(opts: argparse.Namespace, data_dir: str) -> int:
    """The cluster demo's steps (module docstring): create, load A killing a node, load B killing the leader,
    release A, the summary, then the streams."""
    tl = Timeline()
    sizes = [(opts.partitions, opts.segments), (max(1, opts.partitions * 2 // 3), max(1, opts.segments * 2 // 3))]
    cluster = _cluster(opts, data_dir)
    async with cluster:
        _say_started(tl, cluster, opts)
        async with cluster.client(deadline=30.0, call_timeout=60.0) as c:
            a, b = await _create(c, tl, ["demo_a", "demo_b"], sizes)
            task_a, dead = await _load_killing_node(c, tl, cluster, opts, a)
            if dead is not None:  # forgotten; the checker loads what it had loaded on the others
                await _say_repaired(c, tl, a, task_a, dead, sizes[0][1])
            takeover = await _load_killing_leader(c, tl, cluster, opts, b)
            t = time.monotonic()
            task_r = await actions.release(c, a)
            tl.say(f"ReleaseCollection {a.name} (task #{task_r}) done in {time.monotonic() - t:.1f}s")
            await wait_idle(c)
            await _print_summary(c, b, sizes[1][1], dead, takeover)
        if opts.streams:
            await run_streams(cluster, tl, opts)
    print(f"  elapsed: {time.time() - tl.t0:.1f}s")
    return 0


# ===== the stream part ================================================================================================
# The stream part drives the cluster with the client-side actions of ``querycoord stream`` / ``snode``
# (``querycoord.console.actions``) and draws with ``stream show``'s drawing (``querycoord.console.draw``).


def _running(info: stream_pb2.StreamStatusInfo) -> bool:
    return (info.state == stream_pb2.STREAM_RUNNING and len(info.tasks) > 0
            and all(t.status == stream_pb2.TASK_RUNNING for t in info.tasks))


def _identity(info: stream_pb2.StreamStatusInfo) -> set[tuple[int, int, int]]:
    """(task id, SID, node) of each task."""
    return {(t.task.task_id, t.task.sid, t.task.node_id) for t in info.tasks}


def print_streams(show: stream_pb2.ShowStreamsResponse) -> None:
    """``querycoord stream show --summary``: one row per stream."""
    for line in draw.stream_summary(show):
        print("    " + line)


def print_stream(show: stream_pb2.ShowStreamsResponse, stream_id: int) -> None:
    """``querycoord stream show NAME``: one stream's tasks and what the manager does about it."""
    info = next(i for i in show.streams if i.stream.id == stream_id)
    for line in draw.draw_stream(info, show, time.time()):
        print("          " + line)


async def wait_streams(c: QueryCoordClient, ok: Callable[[stream_pb2.ShowStreamsResponse], bool], what: str,
                       timeout: float = 30.0) -> stream_pb2.ShowStreamsResponse:
    deadline = time.monotonic() + timeout
    while True:
        show = await actions.show_streams(c)
        if not show.watching and ok(show):
            return show
        if time.monotonic() > deadline:
            states = Counter(stream_pb2.StreamState.Name(s.state) for s in show.streams)
            raise TimeoutError(f"streams not {what} within {timeout:.0f}s: {dict(states)}")
        await asyncio.sleep(0.2)


async def run_streams(cluster: AllInOne, tl: Timeline, opts: argparse.Namespace) -> None:
    """Snodes and streams on the stream nodes; an snode's node is SIGKILLed, then the leading coordinator."""
    print("\nstreams")
    readers, *hosts = cluster.stream_nodes
    source_vgroups = [int(v) for v in readers.ready.get("vgroups", [])]
    tl.say(f"stream nodes {', '.join(f'{n.node_id} (pid {n.child.pid})' for n in cluster.stream_nodes)} heartbeat; "
           f"node {readers.node_id} leads vgroups {', '.join(map(str, source_vgroups))}")
    async with QueryCoordClient(cluster.coordinator_addresses, deadline=20.0, call_timeout=5.0) as sm:
        snode_of: dict[int, int] = {}  # snode id -> node id
        for node in hosts:
            snode = await actions.create_snode(sm, node.node_id)
            snode_of[snode.id] = node.node_id
        tl.say("CreateSnode: " + ", ".join(f"snode {s} on node {n}" for s, n in sorted(snode_of.items()))
               + " (each the other's replica)")
        # The nodes read their snode from etcd every second, then heartbeat it: wait until both are live.
        t = time.monotonic()
        await asyncio.sleep(1.5)
        names = [f"s{i:02d}" for i in range(1, opts.streams + 1)]
        for name in names:
            await actions.create_stream_answer(sm, name, vgroups=source_vgroups, source_db="demo_db", scan_plans=1,
                                               subplans=2, runner_deploys=3)
        show = await wait_streams(sm, lambda s: len(s.streams) == len(names) and all(map(_running, s.streams)),
                                  "RUNNING")
        tasks = sum(len(s.tasks) for s in show.streams)
        tl.say(f"CreateStream x{len(names)} (each 2 trigger + 2 calc readers, a trigger, 3 runner deploys of 2): "
               f"{tasks} tasks RUNNING after {time.monotonic() - t:.1f}s")
        print_streams(show)

        # ---- SIGKILL the node of the snode with the most streams whose runners (only) are there ----
        def moved_runner_streams(snode: int) -> list[stream_pb2.StreamStatusInfo]:
            return [s for s in show.streams if s.stream.main_snode_id != snode
                    and any(d[0].snode_id == snode for d in draw.runner_deploys(s).values())]

        def main_streams(snode: int) -> int:
            return sum(1 for s in show.streams if s.stream.main_snode_id == snode)

        lost = max(snode_of, key=lambda s: (len(moved_runner_streams(s)), main_streams(s), s))
        victim = next(n for n in hosts if n.node_id == snode_of[lost])
        movers = {s.stream.id: s for s in moved_runner_streams(lost)}
        stoppers = {s.stream.id for s in show.streams if s.stream.main_snode_id == lost}
        killed_at = time.time()
        await cluster.kill_stream_node(victim)
        tl.say(f"SIGKILL stream node {victim.node_id} (pid {victim.child.pid}) hosting snode {lost}: "
               f"{len(stoppers)} triggers and runners of {len(movers)} other streams were there", killed_at)

        def handled(s: stream_pb2.ShowStreamsResponse) -> bool:
            by_id = {i.stream.id: i for i in s.streams}
            return (all(by_id[i].state == stream_pb2.STREAM_STOPPED_BY_ERROR for i in stoppers)
                    and all(_running(by_id[i]) and all(t.task.snode_id != lost for t in by_id[i].tasks)
                            for i in movers))

        show = await wait_streams(sm, handled, "handled after the snode loss", timeout=20.0)
        by_id = {i.stream.id: i for i in show.streams}
        tl.say(f"snode {lost} lost once node {victim.node_id}'s session lapsed; after {time.time() - killed_at:.1f}s:")
        for sid, before in sorted(movers.items()):
            after = draw.runner_deploys(by_id[sid])
            moved = [f"deploy {d} ({','.join(f'#{t.task_id}' for t in ts)}) snode {lost} -> {after[d][0].snode_id}, "
                     f"SID {ts[0].sid} -> {after[d][0].sid}"
                     for d, ts in sorted(draw.runner_deploys(before).items()) if ts[0].snode_id == lost]
            print(f"          {before.stream.name}: runners redeployed: {'; '.join(moved)}")
        if stoppers:
            first = by_id[min(stoppers)]
            retry = max(0.0, first.next_retry_ms / 1000 - time.time())
            print(f"          {', '.join(by_id[i].stream.name for i in sorted(stoppers))}: stopped by error "
                  f"({first.stop_reason}), retry in {retry:.0f}s")
        # One of them as `querycoord stream show NAME` draws it (what the manager does about it, then its tasks): a
        # stopped one when there is one, as its drawing is short (no tasks) and the output stays under 100 lines.
        drawn = min(stoppers) if stoppers else min(movers) if movers else 0
        if drawn:
            print(f"          $ querycoord stream show {by_id[drawn].stream.name}")
            print_stream(show, drawn)

        # ---- SIGKILL the leading coordinator: the new leader adopts the running streams ----
        before_ids = {s.stream.id: _identity(s) for s in show.streams if _running(s)}
        old = cluster.coordinator
        assert old is not None
        killed_at = await cluster.kill_leader()
        tl.say(f"SIGKILL coordinator {old.address} (pid {old.child.pid}), the leader", killed_at)
        ev = await cluster.wait_new_leader(timeout=30.0)
        tl.say(f"coordinator {ev['address']} took over after {ev['t'] - killed_at:.2f}s; it watches the stream "
               f"nodes' reports before acting", ev["t"])
        show = await wait_streams(sm, lambda s: all(_running(i) for i in s.streams if i.stream.id in before_ids),
                                  "adopted", timeout=20.0)
        by_id = {i.stream.id: i for i in show.streams}
        same = [i for i, ids in before_ids.items() if _identity(by_id[i]) == ids]
        tl.say(f"{len(same)} of {len(before_ids)} running streams adopted as they ran: same task ids, SIDs and nodes"
               f" ({sum(len(v) for v in before_ids.values())} tasks, none redeployed)")
        if stoppers:
            show = await wait_streams(sm, lambda s: all(map(_running, s.streams)), "RUNNING", timeout=20.0)
            tl.say(f"the {len(stoppers)} streams stopped by the snode loss were redeployed by the new leader on "
                   f"snode {', '.join(map(str, sorted(set(snode_of) - {lost})))} (new task ids), all RUNNING")
        print_streams(show)


async def wait_idle(c: QueryCoordClient, timeout: float = 60.0) -> None:
    """Until no trigger is queued or running (a checker repair may follow a load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not await actions.list_trees(c, include_finished=False, include_children=False):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"tasks still running after {timeout:.0f}s")


def cluster_main(opts: argparse.Namespace) -> int:
    setup_logging("WARNING")
    print(f"querycoord demo: an all-in-one query cluster (embedded etcd, two coordinators, {opts.nodes} query "
          f"nodes; each a process)\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="querycoord-demo-") as tmp:
        try:
            code = asyncio.run(run_cluster(opts, tmp))
        except (actions.Refusal, CoordinatorUnavailable, ClusterStartError, TimeoutError) as exc:
            print(f"error: {getattr(exc, 'reason', None) or exc}", file=sys.stderr)
            return 1
    print("done: every process stopped")
    return code


# ===== entry points ===============================================================================================
def run_from_args(opts: argparse.Namespace) -> int:
    """Run the demo chosen by parsed options (``querycoord demo``, ``python -m querycoord.tooling.demo``)."""
    if opts.election:
        return election_main()
    for name in ("nodes", "partitions", "segments"):
        if getattr(opts, name) < 1:
            print(f"error: --{name} must be >= 1", file=sys.stderr)
            return 2
    if opts.streams < 0:
        print("error: --streams must be >= 0", file=sys.stderr)
        return 2
    if opts.nodes < 2:
        print("error: the demo kills a query node, so it needs --nodes 2 or more", file=sys.stderr)
        return 2
    return cluster_main(opts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m querycoord.tooling.demo",
                                     description="the demo that `make demo` runs")
    add_demo_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
