"""The distribution: what every online node reports it holds (``GetDataDistribution``, ids only), gathered in a
form that stays small at a million segments."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TypeVar, overload

from loguru import logger

from proto import data_pb2, querynode_pb2
from querycoord.cluster.client import NodeError
from querycoord.cluster.nodes import NodeManager

DM = querynode_pb2.CHANNEL_KIND_DM
T = TypeVar("T")

#: Segments the checker handles between two turns of the event loop (~20-50 ms of work).
TURN_SEGMENTS = 20_000


class Holders(MutableMapping[int, set[int]]):
    """segment -> the nodes that reported it, without a set per segment (a million segments are a million sets).

    Stored as the first node that reported each segment, the second for those held twice (a segment of a
    collection with two replicas), and a list of the others for the rare rest. Reads as a mapping of sets (each
    read builds a new set: for the few segments that differ, not for the loop over all of them).
    """

    __slots__ = ("_empty", "first", "rest", "second")

    def __init__(self) -> None:
        self.first: dict[int, int] = {}
        self.second: dict[int, int] = {}
        self.rest: dict[int, list[int]] = {}  # third and later holders
        self._empty: set[int] = set()  # set to no node (only by hand: a node's report always names one)

    def add(self, sid: int, node: int) -> None:
        if self._empty:
            self._empty.discard(sid)
        first = self.first.setdefault(sid, node)
        if first != node:
            second = self.second.setdefault(sid, node)
            if second != node:
                rest = self.rest.setdefault(sid, [])
                if node not in rest:
                    rest.append(node)

    def __getitem__(self, sid: int) -> set[int]:
        first = self.first.get(sid)
        if first is None:
            if sid in self._empty:
                return set()
            raise KeyError(sid)
        second = self.second.get(sid)
        if second is None:
            return {first}
        return {first, second, *self.rest.get(sid, ())}

    def __setitem__(self, sid: int, nodes: Iterable[int]) -> None:
        self.pop(sid, None)
        nodes = list(nodes)
        if not nodes:
            self._empty.add(sid)
        for node in nodes:
            self.add(sid, node)

    def __delitem__(self, sid: int) -> None:
        if sid in self._empty:
            self._empty.discard(sid)
            return
        del self.first[sid]
        self.second.pop(sid, None)
        self.rest.pop(sid, None)

    @overload
    def get(self, sid: int, /) -> set[int] | None: ...

    @overload
    def get(self, sid: int, /, default: set[int] | T) -> set[int] | T: ...

    def get(self, sid: int, /, default: object = None) -> object:
        """``self[sid]``, or ``default`` when no node reported it, without raising and catching a KeyError (a
        pass after a node loss asks this of every segment it held)."""
        if sid not in self.first and sid not in self._empty:
            return default
        return self[sid]

    def setdefault(self, sid: int, default: Iterable[int] | None = None) -> set[int]:
        """Refused: the set it would return is a copy, so adding to it would be lost. Use ``add``."""
        raise TypeError("Holders.setdefault would return a copy: use Holders.add(segment, node)")

    def __contains__(self, sid: object) -> bool:
        return sid in self.first or sid in self._empty

    def __iter__(self) -> Iterator[int]:
        yield from self.first
        yield from self._empty

    def __len__(self) -> int:
        return len(self.first) + len(self._empty)


@dataclass
class Held:
    """What the reachable online nodes report: segment -> nodes, (collection, channel) -> nodes."""

    segments: Holders = field(default_factory=Holders)
    segment_collection: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (collection, partition)
    channels: dict[tuple[int, str], set[int]] = field(default_factory=dict)
    # collection -> (node, partition, ids) of each group a node reported (``_Fill.groups`` adds each group's ids to
    # ``segments`` for its node too): the checker's whole-collection fast path (``checkers.whole``).
    groups: dict[int, list[tuple[int, int, set[int]]]] = field(default_factory=dict)


class _Fill:
    """Adds the nodes' reports to one ``Held``, giving the event loop a turn every ``TURN_SEGMENTS`` segments (a
    million segments: ``held`` is this pass's own, so the turns change nothing)."""

    def __init__(self, skipped: set[int]):
        self.skipped = skipped
        self.held = Held()
        self.places: dict[tuple[int, int], tuple[int, int]] = {}  # one tuple per partition, not per segment
        self.turn = TURN_SEGMENTS

    async def groups(self, node_id: int, groups: Iterable[querynode_pb2.SegmentIdGroup]) -> None:
        """Ids by partition: each step is one C-level operation over the group, not a Python statement per
        segment (a node reports a segment once, so any id already seen is another node's)."""
        holders = self.held.segments
        first, second = holders.first, holders.second
        where = self.held.segment_collection
        for g in groups:
            if g.collection_id in self.skipped:
                continue
            ids = set(g.segment_ids)
            place = (g.collection_id, g.partition_id)
            self.held.groups.setdefault(g.collection_id, []).append((node_id, g.partition_id, ids))
            where.update(dict.fromkeys(ids, place))
            seen = ids & first.keys()
            first.update(dict.fromkeys(ids - seen if seen else ids, node_id))
            if seen:
                third = seen & second.keys()
                second.update(dict.fromkeys(seen - third if third else seen, node_id))
                for sid in third:
                    holders.add(sid, node_id)  # a third holder (or more): rare
            if self._tick(len(ids)):
                await asyncio.sleep(0)

    async def segments(self, node_id: int, segments: Iterable[data_pb2.SegmentInfo]) -> None:
        """Segments one by one, from a node that predates ``segment_ids_only``."""
        holders = self.held.segments
        where = self.held.segment_collection
        for s in segments:
            if s.collection_id in self.skipped:
                continue
            sid = s.segment_id
            if holders.first.setdefault(sid, node_id) != node_id and holders.second.setdefault(sid, node_id) != node_id:
                holders.add(sid, node_id)  # a third holder (or more): rare
            place = (s.collection_id, s.partition_id)
            where[sid] = self.places.setdefault(place, place)
            if self._tick(1):
                await asyncio.sleep(0)

    def _tick(self, added: int) -> bool:
        """Count ``added`` segments; True when the event loop is due a turn (every ``TURN_SEGMENTS`` segments)."""
        self.turn -= added
        if self.turn > 0:
            return False
        self.turn = TURN_SEGMENTS
        return True

    def channels(self, node_id: int, channels: Iterable[querynode_pb2.WatchedChannel]) -> None:
        for c in channels:
            if c.kind == DM:
                self.held.channels.setdefault((c.collection_id, c.channel_name), set()).add(node_id)


@dataclass(frozen=True)
class NodeReport:
    """What one node said of its distribution besides what it holds: its incarnation (0: a node that predates
    versions), each collection's version there, and the collections whose groups it left out (unchanged)."""

    incarnation: int
    versions: dict[int, int]
    left_out: frozenset[int]


#: Per node: (its incarnation, collection -> version) a pass already has (``GetDataDistributionRequest.known``).
Known = dict[int, tuple[int, dict[int, int]]]


async def collect(nodes: NodeManager, skipped: set[int], unreachable: list[int]) -> tuple[Held, set[int]]:
    """What the online nodes hold and which of them answered, without the segments of ``skipped`` collections
    (left out of the pass); a node that did not answer is added to ``unreachable``."""
    held, reachable, _reports = await collect_reports(nodes, skipped, unreachable, {})
    return held, reachable


async def collect_reports(nodes: NodeManager, skipped: set[int], unreachable: list[int],
                          known: Known) -> tuple[Held, set[int], dict[int, NodeReport]]:
    """``collect``, telling each node the versions of ``known`` (it leaves out the groups of those unchanged), and
    what each node that answered reported of its versions. Each node is told the ``skipped`` collections too: it
    leaves out their groups (a node that predates that sends them, and they are dropped here as before)."""
    reports: dict[int, NodeReport] = {}
    skip = sorted(skipped)

    async def ask(node_id: int) -> querynode_pb2.GetDataDistributionResponse | None:
        request = querynode_pb2.GetDataDistributionRequest(segment_ids_only=True, skip_collection_ids=skip)
        mine = known.get(node_id)
        if mine is not None and mine[1]:
            request.incarnation = mine[0]
            request.known.extend(querynode_pb2.CollectionVersion(collection_id=c, version=v)
                                 for c, v in sorted(mine[1].items()))
        try:
            return await nodes.client(node_id).call("GetDataDistribution", request)
        except NodeError as exc:
            logger.info("checker: node {} did not report its distribution: {}", node_id, exc)
            unreachable.append(node_id)
            return None

    online = [n.node_id for n in nodes.online()]
    answers = await asyncio.gather(*(ask(n) for n in online))
    fill = _Fill(skipped)
    reachable: set[int] = set()
    for node_id, dist in zip(online, answers, strict=True):
        if dist is None:
            continue
        reachable.add(node_id)
        nodes.heard(node_id)
        reports[node_id] = _report_of(dist, known.get(node_id))
        await fill.groups(node_id, dist.segment_groups)
        await fill.segments(node_id, dist.segments)
        fill.channels(node_id, dist.channels)
    return fill.held, reachable, reports


def _report_of(dist: querynode_pb2.GetDataDistributionResponse, asked: tuple[int, dict[int, int]] | None
               ) -> NodeReport:
    """The node's versions, and which of the asked collections it left out: those whose version is the one asked,
    from the incarnation asked (what the node checks before it leaves a group out)."""
    versions = {v.collection_id: v.version for v in dist.versions}
    left_out: frozenset[int] = frozenset()
    if asked is not None and dist.incarnation and dist.incarnation == asked[0]:
        left_out = frozenset(c for c, v in asked[1].items() if v and versions.get(c) == v)
    return NodeReport(dist.incarnation, versions, left_out)
