"""The failover drill's table: leader kills, pause rounds, faults, client calls and invariants."""

from __future__ import annotations

import statistics

from querycoord.tooling.drill.activity import render_activity
from querycoord.tooling.drill.failover_records import DrillResult


def render(result: DrillResult) -> str:
    """The table: kills, pauses, faults, calls, invariants (the JSON line is printed separately)."""
    o = result.options
    target = o.ttl + 1.0
    lines = ["", f"leader kills (takeover target <= TTL + 1s = {target:g}s)",
             f"  {'#':>3} {'at s':>7}  {'mode':<34} {'old leader':<24} {'new leader':<24} {'takeover':>9}  target"]
    for k in result.kills:
        took = f"{k.takeover_s:.2f}s" if k.takeover_s is not None else "-"
        verdict = "PASS" if k.takeover_s is not None and k.takeover_s <= target else "FAIL"
        lines.append(f"  {k.n:>3} {k.t:>7.1f}  {k.mode:<34} {k.old:<24} {k.new or '-':<24} {took:>9}  {verdict}"
                     f"{'  ' + k.note if k.note else ''}")
    ts = result.takeovers
    if ts:
        lines.append(f"  takeover p50 {statistics.median(ts):.2f}s, max {max(ts):.2f}s over {len(ts)} kills")
    for i, p in enumerate(result.pauses, 1):
        took = f"{p.takeover_s:.2f}s" if p.takeover_s is not None else "-"
        lines += ["", f"pause round {i} (SIGSTOP past the TTL, then windows where only the old leader runs)",
                  f"  old leader {p.old_leader}, new leader {p.new_leader or '-'}, takeover {took}",
                  f"  windows (revision ranges): {[(w.start, w.end) for w in p.windows]}",
                  f"  changes in them: {p.window_changes} (sessions/election only: "
                  f"{p.window_changes - p.stale_writes}), stale writes: {p.stale_writes} -> "
                  f"{'PASS' if not p.stale_writes else 'FAIL'}{'' if p.conclusive else ' (INCONCLUSIVE)'}",
                  f"  old leader's log: {p.refused_in_log} lines of refused writes / lost leadership"]
    lines += render_activity(result.faults, result.calls, row=lambda r: r.method, width=18,
                             example=lambda r: f"#{r.seq} {r.target}", slow=lambda r: f"#{r.seq} {r.method}")
    c = result.check
    if c is not None:
        lines += ["", "invariants"]
        for name, (ok, summary) in c.checks.items():
            lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}: {summary}")
        for d in c.details[:40]:
            lines.append(f"    {d}")
        if len(c.details) > 40:
            lines.append(f"    ... and {len(c.details) - 40} more")
    return "\n".join(lines)
