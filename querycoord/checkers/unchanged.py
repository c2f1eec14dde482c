"""Collections whose comparison a pass may skip: every input of it is as when a pass last found nothing to do.

A collection's comparison (``diff``) reads the coordinator's side (its query meta records, its target, the
online, silent and gone nodes, its replicas) and the nodes' side (what every reachable node holds of it and
which DM channels they watch). A pass that compared a collection and found nothing to do (no repair, load
progress 100 % everywhere, nothing parked, no trigger on it) remembers both sides as marks:

- the coordinator's: ``QueryMeta.change_mark`` (moved by every write of its records, a reload included), the
  catalog copy's ``change_mark`` of its target, the node manager's version (moved by every node coming online,
  going offline or forgotten), the online and gone nodes, the cordoned ones, the inactive check kinds and its
  replicas' members;
- the nodes': each reachable node's incarnation and its version of the collection (``GetDataDistribution``:
  moved by every load, release and watch of the collection there; a restarted node has a new incarnation),
  which online nodes were silent, and who watches its DM channels.

The next pass takes the coordinator's marks first; for the collections whose marks are as remembered it sends
each node the version it remembers, and the node leaves out their segment groups when its version is that one.
A collection whose nodes' marks are then also as remembered is skipped: a comparison of the same inputs finds
the same nothing. Anything else is compared in full; a node that left out the groups of a collection that
must be compared after all (one node's version moved, another's did not) is asked again for everything.

A node that predates versions reports incarnation 0: a collection it answers for is never remembered.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

from querycoord.catalog.targets import CatalogTargets
from querycoord.checkers.activation import CheckerSwitches
from querycoord.checkers.distribution import Known, NodeReport
from querycoord.checkers.scan import Diff
from querycoord.task.model import TaskEnv

#: The nodes' marks of one collection: (node, incarnation, version) of every node that answered, the silent
#: online nodes, and (DM channel, its watchers).
NodeMarks = tuple[tuple[tuple[int, int, int], ...], frozenset[int], frozenset[tuple[str, frozenset[int]]]]


def coordinator_marks(env: TaskEnv, targets: CatalogTargets, switches: CheckerSwitches, gone: frozenset[int],
                      cids: Iterable[int]) -> dict[int, Hashable]:
    """The coordinator's marks of each of ``cids`` now (see module docstring): taken before the pass reads the
    nodes and the targets, so that what it reads is at least as new as what it remembers."""
    nodes, meta = env.nodes, env.meta
    shared = (nodes.version, frozenset(nodes.online_ids()), gone, tuple(sorted(nodes.cordoned.items())),
              tuple(sorted(switches.inactive())))
    out: dict[int, Hashable] = {}
    for cid in cids:
        replicas = tuple((r, tuple(sorted(meta.replica_nodes(cid, r)))) for r in meta.replica_ids(cid))
        out[cid] = (meta.change_mark(cid), targets.change_mark(cid), replicas, bool(env.parked.of(cid)), shared)
    return out


class Unchanged:
    """The remembered marks of the collections last found with nothing to do (see module docstring).

    ``enabled`` False: nothing is remembered or skipped (every pass compares everything, as the tests compare).
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._kept: dict[int, tuple[Hashable, NodeMarks]] = {}  # collection -> (coordinator's marks, nodes' marks)
        # Nodes' marks by node, of the remembered collections: node -> (incarnation, collection -> version).
        self._known: dict[int, tuple[int, dict[int, int]]] = {}
        self.skipped = 0  # collections a pass skipped, summed over passes

    def candidates(self, marks: Mapping[int, Hashable]) -> set[int]:
        """The collections whose coordinator's marks (``marks``) are as remembered."""
        if not self.enabled:
            return set()
        return {cid for cid, mark in marks.items() if (kept := self._kept.get(cid)) is not None and kept[0] == mark}

    def known(self, candidates: Iterable[int]) -> Known:
        """What each node is told it was last seen with, for ``candidates``: its incarnation and their versions."""
        wanted = set(candidates)
        out: Known = {}
        for node, (incarnation, versions) in self._known.items():
            mine = {cid: v for cid, v in versions.items() if cid in wanted and v}
            if mine:
                out[node] = (incarnation, mine)
        return out

    @staticmethod
    def node_marks(cid: int, reports: Mapping[int, NodeReport], online: Iterable[int],
                   channels: Mapping[tuple[int, str], set[int]]) -> NodeMarks | None:
        """The nodes' marks of collection ``cid`` (``reports``: of the nodes that answered; ``online``: every online
        node, silent ones included); None when a node that answered predates versions."""
        if any(not r.incarnation for r in reports.values()):
            return None
        answered = tuple(sorted((n, r.incarnation, r.versions.get(cid, 0)) for n, r in reports.items()))
        silent = frozenset(online) - set(reports)
        watches = frozenset((name, frozenset(nodes)) for (c, name), nodes in channels.items() if c == cid)
        return answered, silent, watches

    def settle(self, candidates: set[int], reports: Mapping[int, NodeReport], online: Iterable[int],
               channels: Mapping[tuple[int, str], set[int]]) -> tuple[set[int], bool]:
        """The candidates whose nodes' marks are as remembered (skipped by this pass), and whether some node left
        out the groups of a collection that is not (then every node is asked again for everything)."""
        online = frozenset(online)
        skip = {cid for cid in candidates
                if self._kept[cid][1] == self.node_marks(cid, reports, online, channels)}
        again = any(r.left_out - skip for r in reports.values())
        return skip, again

    def after(self, compared: Iterable[int], d: Diff, marks: Mapping[int, Hashable],
              reports: Mapping[int, NodeReport], online: Iterable[int],
              channels: Mapping[tuple[int, str], set[int]], quiet: set[int], loaded: Iterable[int]) -> None:
        """After a pass's comparison: remember the ``compared`` collections it found with nothing to do (and that
        are ``quiet``: no trigger, nothing parked), with the marks taken before their inputs were read; forget the
        others, and every collection no longer ``loaded``."""
        if not self.enabled:
            return
        online = frozenset(online)
        for cid in compared:
            node_marks = self.node_marks(cid, reports, online, channels)
            if cid in marks and node_marks is not None and cid in quiet and _whole(d, cid):
                self._kept[cid] = (marks[cid], node_marks)
            else:
                self._kept.pop(cid, None)
        for cid in set(self._kept) - set(loaded):
            del self._kept[cid]
        self._known = {}
        for cid, (_mark, (answered, _silent, _watches)) in self._kept.items():
            for node, incarnation, version in answered:
                entry = self._known.setdefault(node, (incarnation, {}))
                if entry[0] == incarnation:
                    entry[1][cid] = version

    def forget(self) -> None:
        """Drop every remembered collection (the next pass compares everything)."""
        self._kept.clear()
        self._known.clear()


def _whole(d: Diff, cid: int) -> bool:
    """The comparison found nothing to do for ``cid``: no repair, and every partition and replica held whole."""
    if cid in d.repairs or cid not in d.progress:
        return False
    return (all(h == t for h, t in d.progress[cid].values())
            and all(h == t for h, t in d.replica_progress.get(cid, {}).values()))
