"""Fault injection for the reference query node.

The reference node exists for the demo, drills, benchmarks and tests; the
coordinator's retry, reschedule and NodeDown paths are only exercised when
nodes misbehave, so the node can be told to:

- fail a fraction of its mutating calls (a ``Status`` error with reason
  ``injected failure``, not a transport error: the coordinator must handle a
  node that answers "no" as well as one that does not answer);
- add latency to every call (slow nodes, deadlines);
- crash after N mutating calls with ``os._exit(137)`` (the exit status of a
  SIGKILL-ed process), either right after the Nth call is answered
  (``after-reply``: the coordinator got the answer, then the node vanished)
  or when the Nth call arrives (``mid-call``: the node dies during the call,
  the caller sees a transport error and cannot tell whether it was applied).

Only the mutating calls (``protocol.MUTATING_METHODS``) count towards
``crash_after`` and can fail by ``failure_rate``; reads never fail by
injection so the coordinator can always see what a flaky node holds.

Decisions are made by a seeded RNG so that a drill run is reproducible.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from querycoord.common.protocol import MUTATING_METHODS
from querycoord.nodes.node_process import CRASH_EXIT_CODE as CRASH_EXIT_CODE  # where tests and drills look for it

INJECTED_FAILURE = "injected failure"


class CrashMode(StrEnum):
    """When the crash of ``crash_after`` happens relative to the Nth call."""

    AFTER_REPLY = "after-reply"
    MID_CALL = "mid-call"


@dataclass(frozen=True)
class FaultConfig:
    """What faults to inject; the default injects none.

    ``fail_kinds`` restricts ``failure_rate`` to some RPC kinds (empty: every
    mutating kind), e.g. ``{"LoadSegments"}`` to make loads fail while
    releases succeed, as a node with a broken disk would.
    """

    failure_rate: float = 0.0
    latency_ms: float = 0.0
    crash_after: int = 0
    seed: int = 0
    fail_kinds: frozenset[str] = field(default_factory=frozenset)
    crash_mode: CrashMode = CrashMode.AFTER_REPLY

    def __post_init__(self) -> None:
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError(f"failure rate must be between 0 and 1, got {self.failure_rate}")
        if self.latency_ms < 0:
            raise ValueError(f"latency must be >= 0 ms, got {self.latency_ms}")
        if self.crash_after < 0:
            raise ValueError(f"crash-after must be >= 0 (0 disables it), got {self.crash_after}")
        unknown = set(self.fail_kinds) - MUTATING_METHODS
        if unknown:
            raise ValueError(
                f"unknown fail kind(s) {sorted(unknown)}: choose among the mutating calls {sorted(MUTATING_METHODS)}"
            )
        object.__setattr__(self, "fail_kinds", frozenset(self.fail_kinds))
        object.__setattr__(self, "crash_mode", CrashMode(self.crash_mode))

    def describe(self) -> str:
        """A short summary for logs, e.g. ``failure rate 0.2 (LoadSegments), crash after 5 (after-reply)``."""
        parts = []
        if self.failure_rate > 0:
            kinds = f" ({','.join(sorted(self.fail_kinds))})" if self.fail_kinds else ""
            parts.append(f"failure rate {self.failure_rate:g}{kinds} seed {self.seed}")
        if self.latency_ms > 0:
            parts.append(f"latency {self.latency_ms:g} ms")
        if self.crash_after > 0:
            parts.append(f"crash after {self.crash_after} ({self.crash_mode.value})")
        return ", ".join(parts) or "none"

    @property
    def active(self) -> bool:
        return self.failure_rate > 0 or self.latency_ms > 0 or self.crash_after > 0


class CrashAction(Enum):
    """What the node must do about a crash for the current call."""

    NONE = 0
    EXIT_NOW = 1
    EXIT_AFTER_REPLY = 2


class FaultInjector:
    """Counts mutating calls and draws failures; holds no I/O so it is trivially testable.

    The node calls ``crash_action`` when a mutating call arrives (before
    anything else: a crashed process does nothing more) and ``should_fail``
    once the call has passed fencing and validation (a stale or malformed
    call is refused for its own reason, whatever the dice say).
    """

    def __init__(self, config: FaultConfig):
        self.config = config
        self._rng = random.Random(config.seed)
        self.mutating_calls = 0
        self.injected_failures = 0

    @property
    def latency_s(self) -> float:
        return self.config.latency_ms / 1000.0

    def crash_action(self) -> CrashAction:
        """Count one mutating call; say whether the process must die for it."""
        self.mutating_calls += 1
        n = self.config.crash_after
        if n <= 0 or self.mutating_calls < n:
            return CrashAction.NONE
        if self.mutating_calls > n or self.config.crash_mode is CrashMode.MID_CALL:
            # Beyond N the process is already "dead": nothing may be served while the exit is pending.
            return CrashAction.EXIT_NOW
        return CrashAction.EXIT_AFTER_REPLY

    def should_fail(self, kind: str) -> bool:
        """Draw whether this call of ``kind`` fails by injection."""
        cfg = self.config
        if cfg.failure_rate <= 0 or (cfg.fail_kinds and kind not in cfg.fail_kinds):
            return False
        # rate 1.0 must fail every call: random() is in [0, 1).
        if self._rng.random() < cfg.failure_rate:
            self.injected_failures += 1
            return True
        return False
