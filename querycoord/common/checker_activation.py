"""Which check kinds run: the checker's kinds and the auto balancer, switched on and off at runtime, kept in etcd.

An operator turns a kind off to keep the leader's hands off something for a while (a maintenance window, a
suspected bug in one kind) and on again after; Milvus 2.4's ListCheckers/ActivateChecker/DeactivateChecker and
SuspendBalance/ResumeBalance are the model. Pausing balance is deactivating the ``balance`` kind: one switch,
whichever call flips it.

What each kind plans, and what turning it off leaves undone:

* ``segments``: loads target segments a replica lacks (a lost copy, a new segment) and corrects records naming
  the wrong node. Off, a lost copy stays lost: deactivating it succeeds with a warning.
* ``channels``: watches DM channels a replica lacks and stops a second watcher. Off, a lost watch stays lost:
  a warning too.
* ``releases``: releases copies nobody should hold (released partitions, compacted segments once their result
  is held, duplicates, collections not loaded) and forgets stale records. Safe to turn off: nothing stops being
  served, the extra copies only keep their memory.
* ``replicas``: forgets nodes query meta still refers to that are offline. Safe to turn off: the node watcher
  forgets a node when its session goes; this kind is the safety net for a forget that failed.
* ``balance``: the auto balancer (optional moves from the fullest to the emptiest node). Safe to turn off: it
  only evens out memory.

The state is one key (``ACTIVATION_KEY``) holding the kinds that are off, each with since when and by whom;
the leader writes it through its fence and reads it at takeover, so a new leader keeps what the old one was
told. A kind named in the key that this version does not know is ignored (and kept when the key is rewritten).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from meta.kv import FencedKV, MetaKV
from meta.log import logger
from proto import task_pb2
from querycoord.common.errors import NotFound

ACTIVATION_KEY = "queryCoord-checkerActivation"

SEGMENTS = "segments"
CHANNELS = "channels"
RELEASES = "releases"
REPLICAS = "replicas"
BALANCE = "balance"


@dataclass(frozen=True)
class CheckKind:
    name: str
    description: str
    repairs_lost: bool  # off, lost copies stay unrepaired: deactivating it warns


CHECK_KINDS: tuple[CheckKind, ...] = (
    CheckKind(REPLICAS, "forget offline nodes query meta still refers to", False),
    CheckKind(SEGMENTS, "load segments a replica lacks (lost copies); fix records naming the wrong node", True),
    CheckKind(RELEASES, "release copies nobody should hold (released, compacted, duplicates); forget stale records",
              False),
    CheckKind(CHANNELS, "watch DM channels a replica lacks; stop second watchers", True),
    CheckKind(BALANCE, "auto balance: move segments from the fullest to the emptiest node", False),
)
KINDS_BY_NAME = {k.name: k for k in CHECK_KINDS}


@dataclass(frozen=True)
class Off:
    """A kind turned off: since when (unix ms) and by whom."""

    since_ms: int
    by: str


def kind_of(name: str) -> CheckKind:
    """The kind called ``name``; ``NotFound`` listing the known names otherwise."""
    kind = KINDS_BY_NAME.get(name)
    if kind is None:
        raise NotFound(f"unknown checker {name!r}: the checkers are {', '.join(k.name for k in CHECK_KINDS)}")
    return kind


def warning_for(kind: CheckKind) -> str:
    """What deactivating ``kind`` leaves undone, when that is a lost copy ("" otherwise)."""
    if not kind.repairs_lost:
        return ""
    return (f"warning: checker {kind.name} is off: a copy lost with a node is not repaired until "
            f"`querycoord checkers activate {kind.name}`")


def decode(raw: bytes | None) -> dict[str, Off]:
    """The kinds a stored value says are off; an unreadable value is logged and read as every kind on (the
    leader must not stop leading over it; the next change rewrites it)."""
    if raw is None:
        return {}
    try:
        doc = json.loads(raw)
        return {str(name): Off(int(v.get("since_ms", 0)), str(v.get("by", "")))
                for name, v in doc.get("inactive", {}).items()}
    except (ValueError, AttributeError, TypeError) as exc:
        logger.error("checker activation: {} holds an unreadable value ({}); every checker runs", ACTIVATION_KEY,
                     exc)
        return {}


def encode(off: dict[str, Off]) -> bytes:
    return json.dumps({"inactive": {name: {"since_ms": o.since_ms, "by": o.by}
                                    for name, o in sorted(off.items())}}, sort_keys=True).encode()


async def read_activation(kv: MetaKV) -> dict[str, Off]:
    """The kinds that are off, as etcd has them (what a standby answers, and ``status`` shows)."""
    return decode(await kv.get(ACTIVATION_KEY))


class CheckerSwitches:
    """The leader's copy of which kinds are off; every change is written through the fence before it counts."""

    def __init__(self, off: dict[str, Off] | None = None):
        self._off: dict[str, Off] = dict(off or {})
        self._lock = asyncio.Lock()
        self.balance_rounds = 0  # auto balance rounds weighed (paused or not): a test counts them

    @classmethod
    async def load(cls, kv: MetaKV) -> CheckerSwitches:
        return cls(await read_activation(kv))

    def is_active(self, name: str) -> bool:
        return name not in self._off

    def off(self, name: str) -> Off | None:
        return self._off.get(name)

    @property
    def balance_paused(self) -> bool:
        return not self.is_active(BALANCE)

    def inactive(self) -> dict[str, Off]:
        return {k.name: self._off[k.name] for k in CHECK_KINDS if k.name in self._off}

    async def set_active(self, kv: FencedKV, name: str, active: bool, by: str) -> bool:
        """Turn kind ``name`` on or off (``NotFound`` for an unknown one); written through the fence first.
        Asking for the state it is in changes nothing (a pause keeps its first since and by). Whether it
        changed."""
        kind_of(name)
        async with self._lock:  # two callers at once: each writes the whole state it saw last
            if active == self.is_active(name):
                return False
            after = dict(self._off)
            if active:
                del after[name]
            else:
                after[name] = Off(int(time.time() * 1000), by)
            await kv.save(ACTIVATION_KEY, encode(after))
            self._off = after
        logger.info("checker {} {} by {}", name, "activated" if active else "deactivated", by or "?")
        return True

    def drop_inactive(self, req: task_pb2.RepairRequest) -> None:
        """Take out of a repair what the kinds that are off would do."""
        if not self.is_active(SEGMENTS):
            del req.missing_segments[:]
            del req.adopt[:]
        if not self.is_active(CHANNELS):
            del req.rewatch[:]
            del req.adopt_dm_channels[:]
            del req.release_dm_channels[:]
        if not self.is_active(RELEASES):
            del req.release_segments[:]
            del req.release_collection_on_nodes[:]
            del req.forget_segment_ids[:]


def activation_record(off: dict[str, Off]) -> dict[str, Any]:
    """What ``status`` shows: balance paused or not, and every kind that is off."""
    balance = off.get(BALANCE)
    return {"balance": {"paused": balance is not None, "since_ms": balance.since_ms if balance else 0,
                        "by": balance.by if balance else ""},
            "inactive_checkers": [{"name": k.name, "since_ms": off[k.name].since_ms, "by": off[k.name].by}
                                  for k in CHECK_KINDS if k.name in off]}


__all__ = ["ACTIVATION_KEY", "BALANCE", "CHANNELS", "CHECK_KINDS", "KINDS_BY_NAME", "RELEASES", "REPLICAS",
           "SEGMENTS", "CheckKind", "CheckerSwitches", "Off", "activation_record", "decode", "encode", "kind_of",
           "read_activation", "warning_for"]
