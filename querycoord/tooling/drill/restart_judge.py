"""The restart drill's judgement, over plain data: samples in, "whole", "false full" and the JSON line's counts out.

A sample is one look at the leader (ShowCollections, then GetReplicas of each collection) followed by every
query node's own GetDataDistribution. The leader is taken at its word only for which nodes form each replica;
what they hold is what they say. Kept apart from the processes so that tests can hand it any situation.

* **whole**: every collection has its replicas (as many as it was loaded with, on disjoint nodes) and the nodes of
  each replica that answered hold every segment of the catalog's target and every DM channel.
* **false full**: the leader shows a collection or a replica at 100 % while some target segment or DM channel is
  on no answering node of that replica (for a collection: of some replica, or it lacks a replica). DESIGN rule 8:
  figures come from what online nodes hold, and a lost node stops counting the moment its session is gone.
  The leader learns of a loss from the node's session in etcd, so a claim is **excused** when a node it rests on
  was lost less than ``grace`` seconds before the leader was asked, or later, counting from when the loss could be
  seen (with etcd down, not before etcd is back); and it is **inconclusive** when a node it rests on runs but did
  not answer in time (a busy machine), since what that node holds is then unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from querycoord.common.wording import plural


@dataclass(frozen=True)
class Target:
    """What one collection must hold in each replica: the catalog's segments, its DM channels."""

    segments: frozenset[int]
    channels: frozenset[str]
    replicas: int


@dataclass(frozen=True)
class Holding:
    """What one node reports: collection -> segment ids, collection -> DM channel names."""

    segments: Mapping[int, frozenset[int]] = field(default_factory=dict)
    channels: Mapping[int, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplicaShown:
    replica_id: int
    nodes: frozenset[int]
    percentage: int


@dataclass(frozen=True)
class CollectionShown:
    percentage: int
    replicas: tuple[ReplicaShown, ...]


@dataclass
class Sample:
    """One look: ``asked`` when the leader was asked, ``read`` once the last node answered (drill seconds)."""

    asked: float
    read: float
    leader: str = ""  # "" when no leader answered
    shown: dict[int, CollectionShown] = field(default_factory=dict)
    holdings: dict[int, Holding] = field(default_factory=dict)  # nodes that answered
    silent: frozenset[int] = frozenset()  # nodes running and ready that did not answer in time


@dataclass(frozen=True)
class Verdict:
    whole: bool
    false_full: tuple[str, ...] = ()
    excused: tuple[str, ...] = ()
    inconclusive: tuple[str, ...] = ()


def lacking(target: Target, cid: int, nodes: Iterable[int], holdings: Mapping[int, Holding]) -> tuple[int, int]:
    """(segments, DM channels) of ``target`` that no node of ``nodes`` reports holding."""
    segments: set[int] = set()
    channels: set[str] = set()
    for n in nodes:
        h = holdings.get(n)
        if h is not None:
            segments |= h.segments.get(cid, frozenset())
            channels |= h.channels.get(cid, frozenset())
    return len(target.segments - segments), len(target.channels - channels)


def _disjoint(replicas: Sequence[ReplicaShown]) -> bool:
    seen: set[int] = set()
    for r in replicas:
        if seen & r.nodes:
            return False
        seen |= r.nodes
    return True


def judge(sample: Sample, targets: Mapping[int, Target], died: Mapping[int, float], grace: float) -> Verdict:
    """Whether ``sample`` shows every collection whole, and which of the leader's 100 % claims it contradicts.

    ``died``: node id -> when the loss of its last process could first be seen (drill seconds; ``inf``: not yet);
    ``grace`` as in the module docstring.
    """
    if not sample.leader:
        return Verdict(whole=False)
    whole = True
    claims: list[tuple[str, frozenset[int]]] = []  # what is false, the nodes the claim rests on
    for cid, target in sorted(targets.items()):
        shown = sample.shown.get(cid)
        if shown is None:
            whole = False
            continue
        short = {r.replica_id: lacking(target, cid, r.nodes, sample.holdings) for r in shown.replicas}
        for r in shown.replicas:
            if any(short[r.replica_id]) and r.percentage == 100:
                s, c = short[r.replica_id]
                claims.append((f"collection {cid} replica {r.replica_id} shown at 100 % while nodes "
                               f"{sorted(r.nodes)} lack {plural(s, 'segment')}, {plural(c, 'DM channel')}", r.nodes))
        replicas_ok = len(shown.replicas) == target.replicas and _disjoint(shown.replicas)
        collection_whole = replicas_ok and not any(any(v) for v in short.values())
        if shown.percentage == 100 and not collection_whole:
            nodes = frozenset().union(*(r.nodes for r in shown.replicas))
            why = ({rid: v for rid, v in short.items() if any(v)} if replicas_ok
                   else f"{plural(len(shown.replicas), 'replica')} shown of {target.replicas}"
                        f"{'' if _disjoint(shown.replicas) else ', sharing nodes'}")
            claims.append((f"collection {cid} shown at 100 % while (segments, DM channels) lacking by replica: "
                           f"{why}", nodes))
        whole = whole and collection_whole
    false_full: list[str] = []
    excused: list[str] = []
    inconclusive: list[str] = []
    for text, nodes in claims:
        if nodes & sample.silent:
            inconclusive.append(f"{text} (nodes {sorted(nodes & sample.silent)} did not answer)")
        elif any(died.get(n, float("-inf")) >= sample.asked - grace for n in nodes):
            excused.append(f"{text} (a node was lost less than {grace:g}s before the leader was asked)")
        else:
            false_full.append(text)
    return Verdict(whole, tuple(false_full), tuple(excused), tuple(inconclusive))


@dataclass
class RoundTally:
    """The samples of one restart (``n`` 0: the first load, before any restart) and when it was whole again."""

    n: int
    began: float
    what: str = ""
    stopped: float | None = None  # every process down; the drill starts them again from here
    started: float | None = None  # every process started again
    whole_at: float | None = None
    samples: int = 0
    answered: int = 0  # samples the leader answered
    false_full_samples: int = 0
    excused_samples: int = 0
    inconclusive_samples: int = 0
    false_full: list[str] = field(default_factory=list)  # the first few, for the table
    notes: list[str] = field(default_factory=list)

    @property
    def back_whole_s(self) -> float | None:
        """From the moment every process was down and the drill began starting them again (etcd first) until
        whole: what the cluster takes to come back, whatever the stop took (``down_s``)."""
        return None if self.whole_at is None or self.stopped is None else self.whole_at - self.stopped

    @property
    def down_s(self) -> float | None:
        return None if self.stopped is None else self.stopped - self.began

    def add(self, sample: Sample, verdict: Verdict) -> None:
        self.samples += 1
        self.answered += bool(sample.leader)
        if verdict.false_full:
            self.false_full_samples += 1
            if len(self.false_full) < 5:
                self.false_full.append(f"at {sample.asked:.2f}s ({sample.leader}): {verdict.false_full[0]}")
        elif verdict.inconclusive:
            self.inconclusive_samples += 1
        elif verdict.excused:
            self.excused_samples += 1
        if (verdict.whole and self.whole_at is None and self.stopped is not None
                and sample.asked >= self.stopped):
            self.whole_at = sample.read


def summary(rounds: Sequence[RoundTally], *, ttl: float, collections: int, segments: int, failed_triggers: int,
            seed: int) -> dict[str, Any]:
    """The JSON line: the issue's keys first. ``rounds`` may start with the first load (``n`` 0): its samples
    count, its time does not."""
    restarts = [r for r in rounds if r.n > 0]
    back = [r.back_whole_s for r in restarts]
    downs = [d for d in (r.down_s for r in restarts) if d is not None]
    done = [b for b in back if b is not None]
    return {
        "restarts": len(restarts),
        "collections": collections,
        "segments": segments,
        "back_whole_s_max": round(max(done), 2) if done else None,
        "false_full_samples": sum(r.false_full_samples for r in rounds),
        "failed_triggers": failed_triggers,
        "never_whole": sum(b is None for b in back),
        "ttl_s": ttl,
        "back_whole_s": [None if b is None else round(b, 2) for b in back],
        "down_s_max": round(max(downs), 2) if downs else None,
        "samples": sum(r.samples for r in rounds),
        "leader_answered": sum(r.answered for r in rounds),
        "excused_samples": sum(r.excused_samples for r in rounds),
        "inconclusive_samples": sum(r.inconclusive_samples for r in rounds),
        "seed": seed,
    }


def failures(s: Mapping[str, Any], *, restarts: int) -> list[str]:
    """Why the drill failed (empty: it passed): the issue's contract over ``summary``'s line."""
    out = []
    if s["restarts"] < restarts:
        out.append(f"only {s['restarts']} of {restarts} restarts ran")
    if s["false_full_samples"]:
        out.append(f"{s['false_full_samples']} samples showed 100 % that the nodes did not hold")
    if s["failed_triggers"]:
        out.append(f"{s['failed_triggers']} triggers FAILED")
    if s["never_whole"]:
        out.append(f"{s['never_whole']} restarts never got whole again")
    bound = s["ttl_s"] + 10
    if s["back_whole_s_max"] is not None and s["back_whole_s_max"] > bound:
        out.append(f"back whole after {s['back_whole_s_max']}s, more than the session TTL + 10 s ({bound:g}s)")
    return out


__all__ = ["CollectionShown", "Holding", "ReplicaShown", "RoundTally", "Sample", "Target", "Verdict", "failures",
           "judge", "lacking", "summary"]
