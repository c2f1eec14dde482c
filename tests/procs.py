"""Find processes by command line through /proc: tests check that nothing outlives its parent."""

from __future__ import annotations

from pathlib import Path


def _cmdlines() -> list[tuple[int, str]]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((int(p.name), (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
            except OSError:
                continue
    return out


def pids_matching(fragment: str) -> list[int]:
    return [pid for pid, cmd in _cmdlines() if fragment in cmd and "pytest" not in cmd]


def etcd_pids_under(fragment: str | Path) -> list[int]:
    """Pids of etcd members whose data dir contains ``fragment``."""
    return [pid for pid, cmd in _cmdlines() if "--data-dir=" in cmd and str(fragment) in cmd]


def pids_mentioning(fragment: str) -> list[int]:
    """Pids whose command line contains ``fragment``, pytest's own included: what a script left behind."""
    return [pid for pid, cmd in _cmdlines() if fragment in cmd]


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])
