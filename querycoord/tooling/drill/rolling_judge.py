"""The rolling drill's judgement, over plain data: whether each collection is served at a sample, and for how long
it was not; the JSON line and the verdict.

A sample is two rounds of every query node's own GetDataDistribution, the second sent once the first has
answered, and the leader's GetReplicas for which nodes form each replica (what they hold is what the nodes say).
A copy counts as held by a node when either round reported it. A copy that moves the right way (loaded on its
new node, then released on the old one) is then never missed: the second round reaches the new node after the
first round's answer from the old one, so one of the two saw it. A copy released before it is loaded elsewhere
is missed by every sample taken in that gap, for as long as it lasts.

* **served**: some replica of the collection (as the leader lists them) whose answering nodes hold every target
  segment and DM channel. **unknown**: not served by the answering nodes, but a node of some replica runs and did
  not answer in time (or no membership is known yet): nothing is said. **unserved** otherwise.
* an **unserved sample**: a sample in which some 2-replica collection is unserved. The drill's contract: none.
* a 1-replica collection's **unserved stretch**: from its first unserved sample to the next sample that finds it
  served (so at most one sample interval longer than the real gap); ``one_replica_unserved_s_max`` is the longest
  stretch of any of them over the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from querycoord.common.wording import plural
from querycoord.tooling.drill.restart_judge import Holding, Target, lacking

SERVED, UNSERVED, UNKNOWN = "served", "unserved", "unknown"


def merge(first: Mapping[int, Holding], second: Mapping[int, Holding]) -> dict[int, Holding]:
    """Per node, what either round reported it holding."""
    out: dict[int, Holding] = {}
    for n in set(first) | set(second):
        a, b = first.get(n, Holding()), second.get(n, Holding())
        out[n] = Holding({c: a.segments.get(c, frozenset()) | b.segments.get(c, frozenset())
                          for c in set(a.segments) | set(b.segments)},
                         {c: a.channels.get(c, frozenset()) | b.channels.get(c, frozenset())
                          for c in set(a.channels) | set(b.channels)})
    return out


def serving(cid: int, target: Target, replicas: Sequence[frozenset[int]] | None, holdings: Mapping[int, Holding],
            silent: frozenset[int]) -> tuple[str, str]:
    """(``SERVED`` / ``UNSERVED`` / ``UNKNOWN``, what each replica lacks when not served) of collection ``cid``."""
    if replicas is None:
        return UNKNOWN, "no replica membership known yet"
    lacks = []
    for nodes in replicas:
        segments, channels = lacking(target, cid, nodes, holdings)
        if not segments and not channels:
            return SERVED, ""
        lacks.append(f"nodes {sorted(nodes)} lack {plural(segments, 'segment')}, {plural(channels, 'DM channel')}")
    if any(nodes & silent for nodes in replicas):
        return UNKNOWN, "; ".join(lacks)
    return UNSERVED, "; ".join(lacks) if lacks else "no replica listed"


@dataclass
class Outage:
    """One collection's unserved stretches (module docstring)."""

    since: float | None = None
    longest: float = 0.0
    total: float = 0.0
    stretches: int = 0

    def observe(self, at: float, verdict: str) -> None:
        if verdict == UNSERVED and self.since is None:
            self.since, self.stretches = at, self.stretches + 1
        elif verdict == SERVED and self.since is not None:
            self.end(at)

    def end(self, at: float) -> None:
        """Close an open stretch at ``at`` (the last sample of the run ends one that never closed)."""
        if self.since is not None:
            took = at - self.since
            self.total += took
            self.longest = max(self.longest, took)
            self.since = None


@dataclass
class Tally:
    """Every sample's verdicts: ``two`` are the 2-replica collections (judged), ``one`` the 1-replica ones
    (measured)."""

    two: frozenset[int]
    one: frozenset[int]
    samples: int = 0
    unserved_samples: int = 0
    unknown_samples: int = 0
    unserved: list[str] = field(default_factory=list)  # the first few unserved findings, for the table
    outages: dict[int, Outage] = field(default_factory=dict)
    last_at: float = 0.0

    def add(self, at: float, verdicts: Mapping[int, tuple[str, str]]) -> list[str]:
        """Count one sample (collection -> ``serving``'s answer); returns its unserved findings of 2-replica
        collections."""
        self.samples += 1
        self.last_at = at
        for cid, (verdict, _why) in verdicts.items():
            self.outages.setdefault(cid, Outage()).observe(at, verdict)
        found = [f"collection {cid}: {why}" for cid, (verdict, why) in sorted(verdicts.items())
                 if cid in self.two and verdict == UNSERVED]
        if found:
            self.unserved_samples += 1
            if len(self.unserved) < 10:
                self.unserved.append(f"at {at:.2f}s: {found[0]}")
        elif any(verdicts[c][0] == UNKNOWN for c in self.two if c in verdicts):
            self.unknown_samples += 1
        return found

    def finish(self) -> None:
        for o in self.outages.values():
            o.end(self.last_at)

    def longest(self, cids: frozenset[int]) -> float:
        return max((self.outages[c].longest for c in cids if c in self.outages), default=0.0)


@dataclass
class NodeStep:
    """One node's turn: drill seconds at which each step ended (None: not reached)."""

    node_id: int
    began: float
    drained: float | None = None
    stopped: float | None = None
    started: float | None = None
    online: float | None = None
    whole: float | None = None
    balanced: float | None = None  # no balance or repair running once whole (bounded wait; None: still running)
    drain_left: int | None = None  # copies left when it was DRAINED (None: not drained)
    stalled: str = ""  # why the drain waited (it said so, with no progress): the node was stopped undrained
    notes: list[str] = field(default_factory=list)

    def took(self, what: float | None, since: float | None) -> str:
        return "-" if what is None or since is None else f"{what - since:.1f}s"


def summary(tally: Tally, steps: Sequence[NodeStep], moves: Mapping[str, int], *, duration_s: float,
            extra: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON line: the issue's keys first, then the extras."""
    outages = tally.outages
    out: dict[str, Any] = {
        "nodes_restarted": sum(s.online is not None for s in steps),
        "samples": tally.samples,
        "unserved_samples": tally.unserved_samples,
        "one_replica_unserved_s_max": round(tally.longest(tally.one), 2),
        "moves": moves.get("moves", 0),
        "recovery_moves": moves.get("recovery", 0),
        "balance_moves": moves.get("balance", 0),
        "duration_s": round(duration_s, 1),
        "drain_moves": moves.get("drain", 0),
        "two_replica_unserved_s_max": round(tally.longest(tally.two), 2),
        "one_replica_unserved_s_total": round(sum(outages[c].total for c in tally.one if c in outages), 2),
        "unknown_samples": tally.unknown_samples,
        "never_whole": sum(s.online is not None and s.whole is None for s in steps),
        "step_s_max": round(max((s.whole - s.began for s in steps if s.whole is not None), default=0.0), 2),
    }
    out.update(extra)
    return out


def failures(s: Mapping[str, Any], *, nodes: int) -> list[str]:
    """Why the drill failed (empty: it passed), over ``summary``'s line."""
    out = []
    if s["nodes_restarted"] < nodes:
        out.append(f"only {s['nodes_restarted']} of {nodes} query nodes were restarted and back online")
    if s["unserved_samples"]:
        out.append(f"{s['unserved_samples']} samples found a 2-replica collection with no whole replica")
    if s["never_whole"]:
        out.append(f"{s['never_whole']} node turns never got every collection whole again")
    if s.get("exited_on_their_own"):
        out.append(f"{s['exited_on_their_own']} processes exited on their own")
    if s.get("nodes_not_active"):
        out.append(f"{s['nodes_not_active']} query nodes not back online and active at the end")
    if s.get("drains_unfinished"):
        out.append(f"{s['drains_unfinished']} drains did not end DRAINED")
    return out


__all__ = ["SERVED", "UNKNOWN", "UNSERVED", "NodeStep", "Outage", "Tally", "failures", "merge", "serving", "summary"]
