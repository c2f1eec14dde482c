"""``querycoord meta repair``: apply ``verify``'s fixes, never beside a live leader.

Dry run by default: it reads, verifies and says what each fix would write.
With ``apply`` it writes only as the leader: when a coordinator leads (a key
in the coordinators' election) it refuses, because the leader's memory mirrors
these keys and a change behind its back would be undone or misread by it;
the operator stops the coordinators, or lets the leader's own reload and
checker reconcile. With no leader it takes the election itself (a session of
its own role under a fixed id, so two repairs exclude each other), verifies
again under that fence and sends each fix as one fenced txn: a coordinator
that starts meanwhile queues behind it and leads once it resigns, and if its
lease is lost etcd refuses its writes (``NotLeader``). Each fix also carries
compares on what verify saw, so a key changed since is left alone and
reported as skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from meta.election import Election, current_leader, election_prefix
from meta.errors import MetaError, NotLeader
from meta.kv import MetaKV
from meta.session import Session, SessionIdTaken, session_key
from querycoord.common.protocol import QUERYCOORD_ELECTION

from . import snapshot
from .problems import Problem
from .verify import summary, verify

# The repair's own session: a role no coordinator or node uses, and a fixed id so a second repair waits or fails.
REPAIR_ROLE = "metarepair"
REPAIR_SERVER_ID = 1
REPAIR_TTL = 10.0
# What the election shows as the leader's address while a repair holds it.
REPAIR_ADDRESS = "meta-repair"
# How long the repair waits to lead before it concludes a coordinator campaigned first.
CAMPAIGN_TIMEOUT = 3.0


class LeaderLive(Exception):
    """A coordinator leads: ``--apply`` refuses (nothing written)."""

    def __init__(self, address: str, key: str, *, meanwhile: bool = False):
        self.address, self.key = address, key
        when = "started leading while the repair campaigned" if meanwhile else "leads"
        super().__init__(
            f"a coordinator {when} (at {address}, election key {key}): meta repair never writes beside a live "
            "leader, whose memory mirrors these keys; stop every coordinator of this root and run it again "
            "(or leave it to the leader: its reload drops broken task trees and its checker reconciles query "
            "meta); nothing was written")


class RepairRefused(Exception):
    """The repair could not write: another repair holds its session, or it lost its fence mid-way."""


@dataclass
class Outcome:
    problem: Problem
    result: str  # would fix | fixed | skipped: changed since verify | no automatic fix

    def as_dict(self) -> dict[str, Any]:
        return {**self.problem.as_dict(), "result": self.result}


@dataclass
class RepairReport:
    root: str
    applied: bool
    how: str  # what the repair did about the leader and its fence
    leader: str | None
    revision: int = 0
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Nothing is left unfixed (in a dry run: everything found has a fix)."""
        good = ("fixed",) if self.applied else ("would fix",)
        return all(o.result in good for o in self.outcomes)

    def as_dict(self) -> dict[str, Any]:
        return {"root": self.root, "applied": self.applied, "how": self.how, "leader": self.leader,
                "revision": self.revision, "summary": summary([o.problem for o in self.outcomes]),
                "problems": [o.as_dict() for o in self.outcomes]}


async def _leader(kv: MetaKV) -> tuple[str, str] | None:
    info = await current_leader(kv, election_prefix(QUERYCOORD_ELECTION))
    return None if info is None else (info.value.decode(errors="replace"), info.key)


async def dry_run(kv: MetaKV) -> RepairReport:
    leader = await _leader(kv)
    snap = await snapshot.take(kv)
    how = "dry run: nothing written"
    if leader is not None:
        how += f"; a coordinator leads at {leader[0]}, so --apply would refuse"
    report = RepairReport(kv.root, False, how, leader[0] if leader else None, snap.revision)
    report.outcomes = [Outcome(p, "would fix" if p.fix else "no automatic fix") for p in verify(snap)]
    return report


async def apply(kv: MetaKV, *, campaign_timeout: float = CAMPAIGN_TIMEOUT) -> RepairReport:
    """Fix everything verify finds, under the repair's own fence; ``LeaderLive`` when a coordinator leads."""
    leader = await _leader(kv)
    if leader is not None:
        raise LeaderLive(*leader)
    session = Session(kv, REPAIR_ROLE, REPAIR_ADDRESS, ttl=REPAIR_TTL, server_id=REPAIR_SERVER_ID, private_lease=True,
                      extra={"host": socket.gethostname(), "pid": os.getpid()})
    try:
        await session.start()
    except SessionIdTaken:
        raise RepairRefused(f"another meta repair runs on root {kv.root} ({session_key(REPAIR_ROLE, REPAIR_SERVER_ID)} "
                            "is held by a live session); nothing was written") from None
    try:
        election = Election(kv, session, QUERYCOORD_ELECTION)
        try:
            fence = await asyncio.wait_for(election.campaign(REPAIR_ADDRESS), campaign_timeout)
        except TimeoutError:  # a coordinator queued first; the cancelled campaign withdrew our key
            first = await _leader(kv)
            raise LeaderLive(*(first or ("?", "?")), meanwhile=True) from None
        try:
            fenced = kv.fenced(fence)
            snap = await snapshot.take(kv)
            report = RepairReport(kv.root, True, f"wrote under its own fence: took the coordinators' election "
                                  f"({fence}) as no coordinator led, and resigned after", None, snap.revision)
            for p in verify(snap):
                if p.fix is None:
                    report.outcomes.append(Outcome(p, "no automatic fix"))
                    continue
                try:
                    result = await fenced.txn(p.fix.compares, p.fix.ops, operation=f"meta repair: {p.kind}")
                except NotLeader:
                    done = sum(o.result == "fixed" for o in report.outcomes)
                    raise RepairRefused(f"the repair lost its fence after {done} fixes (its session expired or its "
                                        "election key was deleted) and stopped; etcd refused the rest. Run `querycoord "
                                        "meta verify` to see what is left") from None
                report.outcomes.append(Outcome(p, "fixed" if result.succeeded else "skipped: changed since verify"))
            return report
        finally:
            with contextlib.suppress(MetaError):  # closing the session revokes the lease, which frees it anyway
                await election.resign()
    finally:
        await session.close()


__all__ = ["CAMPAIGN_TIMEOUT", "LeaderLive", "Outcome", "RepairRefused", "RepairReport", "apply", "dry_run"]
